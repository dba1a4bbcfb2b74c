"""Resume verifies what it resumes: the config against the run's own, the logs against the checkpoint.

A resumed run must be the run that was interrupted. Three things can silently make it another one, and each is
refused with its reason or repaired with a message:

- **The config.** ``run.json`` in the run directory keeps the resolved config the run was started (or last
  resumed) with, and its SHA-256. On resume, ``config.yaml`` must still hold every key (one removed would
  resume on a default: refused), and only the keys of :data:`MAY_CHANGE` (budgets, checkpointing, logging) may
  differ; any other change (the env, the model's architecture, the learning rate, the evaluation the "before"
  figures were measured with) would continue the checkpoint as a different experiment: refused, naming the
  keys, old and new values.
- **The checkpoint.** The newest that loads is used; one that does not is moved aside
  (:meth:`~lrmgym.learners.engine.rundir.Checkpointer.load_latest`); temporary files of interrupted writes are deleted.
- **The metrics log.** Every step up to the checkpoint's must have exactly one line. Duplicates are dropped.
  Missing lines (a file cut short or edited) cannot be rebuilt: the run goes back to the newest checkpoint
  before the first missing step, so every step is logged once; where there is none, it continues, says so and
  records the gap in ``summary.json`` (``log_gaps``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lrmgym.files import atomic_write_text, remove_stale_temps

__all__ = [
    "MAY_CHANGE",
    "ResumeConfigError",
    "check_config",
    "checkpoint_with_log",
    "clean_temps",
    "config_sha256",
    "flatten",
    "may_change",
    "missing_steps",
    "ranges",
    "read_run_record",
    "write_run_record",
]

RUN_RECORD = "run.json"

MAY_CHANGE = (
    "learner.steps",
    "learner.time_budget_s",
    "learner.generation_budget",
    "learner.checkpoint_every",
    "learner.keep_checkpoints",
    "learner.progress",
    "learner.log_samples",
    "learner.torch_threads",
    "learner.compile",
    "learner.update_threads",
    "learner.eval_every",
    "learner.idle_steps_per_s",
    "learner.max_failed_steps",
    "learner.async_stall_s",
    "learner.stages",
    "run.name",
    "run.output_dir",
    "run.report_to",
)
"""Keys a resumed run may change: how long it runs and what it writes or logs to (``run.report_to``), never what it
trains. A staged learner's stage options may change the same way (``learner.rl1.steps``), and its stage list may
grow: the staged run refuses a list that no longer matches the stages it ran (lrmgym/learners/engine/staged.py)."""


def may_change(key: str) -> bool:
    """Whether a resumed run may change ``key`` (:data:`MAY_CHANGE`, also one level down: ``learner.rl1.steps``)."""
    if key.startswith(MAY_CHANGE):
        return True
    parts = key.split(".")
    stage_keys = {k.split(".", 1)[1] for k in MAY_CHANGE if k.startswith("learner.") and k != "learner.stages"}
    return len(parts) == 3 and parts[0] == "learner" and parts[2] in stage_keys


class ResumeConfigError(ValueError):
    """``config.yaml`` no longer describes the run being resumed."""


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b.c": leaf}`` of nested dicts (lists and scalars are leaves)."""
    if not isinstance(tree, dict) or (prefix and not tree):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def config_sha256(resolved: dict[str, Any]) -> str:
    """The SHA-256 of a resolved config (canonical JSON: sorted keys)."""
    return hashlib.sha256(json.dumps(resolved, sort_keys=True, default=str).encode()).hexdigest()


def write_run_record(run_dir: Path, resolved: dict[str, Any], version: str) -> None:
    """Record the resolved config a run starts (or resumes) with."""
    record = {"config": resolved, "config_sha256": config_sha256(resolved), "lrmgym": version}
    atomic_write_text(run_dir / RUN_RECORD, json.dumps(record, indent=1, sort_keys=True, default=str) + "\n")


def read_run_record(run_dir: Path) -> dict[str, Any] | None:
    """``run.json`` of ``run_dir``, or None for a run made before it was kept."""
    path = run_dir / RUN_RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ResumeConfigError(f"--resume: {path} cannot be read ({err}); the run cannot be verified.") from None
    if not isinstance(record, dict) or not isinstance(record.get("config"), dict):
        raise ResumeConfigError(f"--resume: {path} holds no recorded config; the run cannot be verified.")
    return record


def check_config(
    raw: dict[str, Any], resolved: dict[str, Any], recorded: dict[str, Any] | None
) -> tuple[list[str], list[str]]:
    """Refuse a ``config.yaml`` that no longer describes the run; else ``(keys changed, notes to print)``.

    ``raw`` is ``config.yaml`` as read, ``resolved`` what it resolves to now, ``recorded`` the config the run
    was started or last resumed with (``run.json``). Options this version has and the run's record lacks (a newer
    lrmgym) take their defaults, with a note; a run made before ``run.json`` was kept is checked for missing keys
    only, and those get a note rather than a refusal (its config may predate them).
    """
    now = flatten(json.loads(json.dumps(resolved, default=str)))  # as run.json holds it: tuples are lists
    have = flatten(raw)

    def written(key: str) -> bool:
        return key in have or any(h.startswith(key + ".") for h in have)

    if recorded is None:
        missing = [k for k in now if not written(k)]
        note = f"config.yaml lacks {_some(missing)}; resuming with their defaults (the run keeps no run.json)."
        return [], [note] if missing else []
    before = flatten(recorded)
    missing = [k for k in before if not written(k)]
    if missing:
        raise ResumeConfigError(
            f"--resume: config.yaml lacks {_some(missing)}; `lrmgym run` writes every key, and a resume would fill "
            "the gaps with defaults the run was not trained with. Restore the keys (run.json in the run directory "
            "holds the config the run was started with)."
        )
    changed = sorted(k for k in before if now.get(k, "<absent>") != before[k])
    refused = [k for k in changed if not may_change(k)]
    if refused:
        shown = "; ".join(f"{k}: {before[k]!r} -> {now.get(k, '<absent>')!r}" for k in refused[:6])
        more = f" (and {len(refused) - 6} more)" if len(refused) > 6 else ""
        raise ResumeConfigError(
            f"--resume: config.yaml changed what the run trains since it was started: {shown}{more}. A resume "
            f"continues the checkpoint as it was configured; only {', '.join(MAY_CHANGE)} may change. Restore "
            "those values, or start a new run with the new config."
        )
    added = [k for k in now if k not in before]
    return changed, [f"options new since the run started, at their defaults: {_some(added)}."] if added else []


def _some(keys: list[str], limit: int = 8) -> str:
    return ", ".join(keys[:limit]) + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def missing_steps(logged: list[int], upto: int) -> list[int]:
    """The steps in ``1..upto`` with no line in ``logged``."""
    have = set(logged)
    return [s for s in range(1, upto + 1) if s not in have]


def ranges(steps: list[int]) -> str:
    """``[3, 4, 5, 9]`` as ``"3-5, 9"``."""
    out, start, prev = [], None, None
    for s in [*steps, None]:
        if start is not None and (s is None or s != prev + 1):
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = None
        if s is not None and start is None:
            start = s
        prev = s
    return ", ".join(out)


def clean_temps(run_dir: Path, report: Callable[[str], None]) -> None:
    """Delete the temporary files interrupted atomic writes left in the run directory."""
    folders = [run_dir, run_dir / "checkpoints", run_dir / "plots"]
    if (run_dir / "eval").is_dir():
        folders += [p for p in (run_dir / "eval").iterdir() if p.is_dir()]
    stale = [p for folder in folders for p in remove_stale_temps(folder)]
    if stale:
        names = ", ".join(p.name for p in stale)
        report(f"removed {len(stale)} temporary file(s) that interrupted writes left: {names}")


def checkpoint_with_log(checkpoints: Any, metrics_log: Any, report: Callable[[str], None]) -> tuple[Any, str | None]:
    """The checkpoint to resume from, and the steps whose metrics lines are lost (None: none).

    The newest checkpoint that loads, unless ``metrics.jsonl`` lacks lines of steps it covers: then the newest
    checkpoint before the first missing step, or, where there is none, the newest one with the gap reported.
    """
    state = checkpoints.load_latest(report)
    while state is not None:
        logged = [r["step"] for r in metrics_log.records() if isinstance(r.get("step"), int)]
        missing = missing_steps([s for s in logged if s <= state["step"]], int(state["step"]))
        if not missing:
            return state, None
        older = checkpoints.load_latest(report, max_step=missing[0] - 1)
        where = f"steps {ranges(missing)} of the {state['step']} its newest checkpoint covers"
        if older is None:
            report(
                f"metrics.jsonl has no line for {where} (the file was cut short or edited) and no checkpoint "
                "precedes the gap; resuming from the checkpoint anyway, with those lines missing (summary.json "
                "lists them under log_gaps)."
            )
            return state, ranges(missing)
        report(
            f"metrics.jsonl has no line for {where}; going back to the checkpoint of step {older['step']}, "
            f"so every step is logged once ({state['step'] - older['step']} steps train again)."
        )
        state = older
    return None, None
