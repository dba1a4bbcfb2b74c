"""Steps that graded nothing: how the loop tells them (:func:`failed_step`) and stops (:class:`FailedStepsError`).

A step whose samples were all ungradeable, or whose judge failed on every sample it was given, prints a warning
with :func:`last_failure`; :class:`~lrmgym.learners.engine.loop.Loop` stops after ``max_failed_steps`` in a row.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["FailedStepsError", "failed_step", "last_failure"]


class FailedStepsError(SystemExit):
    """The run stopped after steps that graded nothing; the message is one line: what, the last error, the fix.

    A :class:`SystemExit` (status 1, the message printed without a traceback), because nothing in the program is
    broken: the judge or the env's verifier is. A library caller can catch it; the run directory is resumable.
    """


def failed_step(metrics: dict[str, Any]) -> str | None:
    """What made a step's grading fail, or ``None``: every sample ungradeable, or a judge failed on every sample.

    Reads the step's ``ungradeable_frac`` and each judge's ``judge/<name>/failures`` and ``judge/<name>/calls``
    (learners that log neither are never stopped).
    """
    if metrics.get("ungradeable_frac") == 1.0:
        return "every sample was ungradeable"
    for key, failures in metrics.items():
        name = re.fullmatch(r"judge/(.+)/failures", key)
        calls = metrics.get(f"judge/{name[1]}/calls") if name else None
        if isinstance(calls, (int, float)) and calls > 0 and isinstance(failures, (int, float)) and failures >= calls:
            return f"the {name[1]} judge failed on all {int(calls)} samples"  # type: ignore[index]
    return None


def last_failure(samples: list[dict[str, Any]], env: Any) -> str:
    """The newest failure reason on record: a failed judge component of the step's samples, else the env's."""
    from lrmgym.episodes import env_attr

    found = None
    for record in samples:
        for traj in record.get("trajectories", ()):
            verdict = traj.get("verdict") or {}
            for comp in verdict.get("components") or ():
                if comp.get("score") is None and comp.get("reason"):
                    found = f"{comp.get('name')}: {comp['reason']}"
            if found is None and verdict.get("score") is None and verdict.get("reason"):
                found = str(verdict["reason"])
    found = found or env_attr(env, "last_failure") or "none recorded (learner.log_samples=0 keeps no samples)"
    return " ".join(str(found).split())[:400]
