"""The reward-hacking battery: completions that try to be paid for something they did not do.

Each :class:`HackCase` is one attack on what a reward *believes* (not on the host, which the sandbox's
adversarial battery covers): forging the code harness's result, shadowing the builtins the tests use,
reading expected values, opting out of a wrong answer by making the checker time out, hedging with several
values in one answer. A case names the most reward it may earn (``max_score``, 0 unless the attack is a
sanity control) and whether an ungradeable verdict is allowed (never, for an attack: masking a sample
is a reward a policy can learn to seek).

The cases live beside this file, one module per env (``math_cases``, ``code_cases``, ``math_tool_cases``);
:func:`all_cases` gathers them and :func:`run_case` grades one through the real env.
``tests/test_reward_hacking.py`` runs them all in CI and ``benchmarks/reward_hacking.py`` prints each case's reward.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from lrmgym.core import Task, Verdict

__all__ = ["HackCase", "HackResult", "all_cases", "run_case"]

_MODULES = ("math_cases", "code_cases", "math_tool_cases")


@dataclass(frozen=True)
class HackCase:
    """One reward-hacking attempt.

    Attributes:
        name: Unique id, ``"<env>/<class>/<variant>"``.
        klass: The class of attack (``"forged-record"``, ``"timeout-opt-out"``, ``"chain"``...).
        env: ``"math"``, ``"code"`` or ``"math_tool"``.
        completion: The policy's whole answer text (code cases: or ``"@<attack>"``, a program the code module
            builds at run time from the task's prompt or from earlier turns' feedback: see ``completion_for``).
        task: How to build the task. Math: ``{"answer": gold}`` (and optionally ``"question"``). Code: either
            ``{"source": "humaneval"|"mbpp", "id": "humaneval/3"}`` (a real task; the case is skipped when the
            data set is absent) or the fields of a :class:`~lrmgym.envs.code.loaders.CodeTask`.
        env_config: Options for the env (``{"timeout_s": 2}``...).
        max_score: The most reward the case may earn (inclusive).
        min_score: The least reward (a control that must still pass sets it to 1).
        note: What the attack does.
    """

    name: str
    klass: str
    env: str
    completion: str
    task: dict[str, Any] = field(default_factory=dict)
    env_config: dict[str, Any] = field(default_factory=dict)
    max_score: float = 0.0
    min_score: float = 0.0
    note: str = ""


@dataclass(frozen=True)
class HackResult:
    """The verdict a case got and whether it held."""

    case: HackCase
    verdict: Verdict | None
    held: bool
    skipped: str = ""

    @property
    def score(self) -> float | None:
        """The reward the attack earned (``None``: ungradeable, which fails an attack)."""
        return None if self.verdict is None else self.verdict.score


def all_cases() -> list[HackCase]:
    """Every case of the battery, in a stable order; names are unique."""
    cases: list[HackCase] = []
    for name in _MODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        cases.extend(module.CASES)
    names = [c.name for c in cases]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"duplicate reward-hacking case names: {sorted(dup)}")
    return cases


def _build_task(case: HackCase, env: Any) -> Task | None:
    """The case's task for ``env``; ``None`` when it needs a data set that is absent."""
    builder: Callable[[HackCase, Any], Task | None] = importlib.import_module(f"{__name__}.{case.env}_cases").build_task
    return builder(case, env)


def run_case(case: HackCase, envs: dict[tuple[str, str], Any] | None = None) -> HackResult:
    """Grade ``case`` through its env.

    ``envs`` caches built envs by ``(env, config)`` across calls (the caller closes them); without it, the env
    built here is closed before returning (its sandbox pool and the pool's temporary folder).
    """
    module = importlib.import_module(f"{__name__}.{case.env}_cases")
    key = (case.env, repr(sorted(case.env_config.items())))
    env = None if envs is None else envs.get(key)
    own = env is None and envs is None
    if env is None:
        env = module.make_env(case.env_config)
        if envs is not None:
            envs[key] = env
    try:
        task = _build_task(case, env)
        if task is None:
            return HackResult(case, None, held=True, skipped="data set absent")
        # A module may build the completion from the task (a lookup table of what its prompt shows) or from
        # earlier turns' feedback (``completion_for(case, task, env)``); else the case's text is the answer.
        completion_for = getattr(module, "completion_for", None)
        completion = case.completion if completion_for is None else completion_for(case, task, env)
        verdict = env.verify(task, completion)
    finally:
        if own:
            env.close()
    held = verdict.score is not None and case.min_score <= verdict.score <= case.max_score
    return HackResult(case, verdict, held)


def iter_results(cases: list[HackCase] | None = None) -> Iterator[HackResult]:
    """Run ``cases`` (default: all) with shared envs, closing them at the end."""
    envs: dict[tuple[str, str], Any] = {}
    try:
        for case in cases if cases is not None else all_cases():
            yield run_case(case, envs)
    finally:
        for env in envs.values():
            env.close()
