"""Evaluation: sample n completions per task, verify them, report pass@k / avg@n with intervals.

``lrmgym.eval.config`` and ``lrmgym.eval.passk`` import no torch; :func:`evaluate` needs only a policy.
"""

from lrmgym.eval.config import EvalConfig
from lrmgym.eval.passk import avg_at_n, bootstrap_interval, pass_at_k, pass_at_k_mean, wilson_interval

__all__ = [
    "EvalConfig",
    "avg_at_n",
    "bootstrap_interval",
    "evaluate",
    "pass_at_k",
    "pass_at_k_mean",
    "print_report",
    "wilson_interval",
]


def __getattr__(name: str):
    # The runner imports rich and the env machinery; load it on first use only.
    if name in ("evaluate", "print_report"):
        from lrmgym.eval import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'lrmgym.eval' has no attribute {name!r}")
