"""The contract of an experiment tracker: what it is given when a run opens it, and the three things it logs.

A tracker is opened once per run session (a fresh run, or each resume of it) with a :class:`TrackedRun` and then
receives scalars and tables until :meth:`Tracker.close`. It imports its library when it is opened, never at
import time, so choosing no tracker costs nothing. The ids a tracker needs to continue the same tracker run on a
resume (the wandb run id, the mlflow run id) are kept in ``RUN_DIR/tracking.json`` (:data:`STATE_FILE`), which the
tracker fills in through :attr:`TrackedRun.state`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, get_args

from lrmgym.files import atomic_write_text

__all__ = [
    "BACKENDS",
    "STATE_FILE",
    "TRACKERS",
    "Cell",
    "Table",
    "TrackedRun",
    "Tracker",
    "TrackerName",
    "read_state",
    "write_state",
]

TrackerName = Literal["tensorboard", "wandb", "mlflow"]
"""The trackers ``run.report_to`` may name."""
TRACKERS: tuple[str, ...] = get_args(TrackerName)
BACKENDS: dict[str, str] = {
    "tensorboard": "lrmgym.tracking.tensorboard:TensorBoardTracker",
    "wandb": "lrmgym.tracking.wandb:WandbTracker",
    "mlflow": "lrmgym.tracking.mlflow:MlflowTracker",
}
"""Each tracker's class, as a ``"module:Class"`` entry point (imported only when the tracker is chosen)."""
STATE_FILE = "tracking.json"
"""In the run directory: each tracker's ids, so that a resumed run continues the same tracker run."""

Cell = str | int | float | bool | None


@dataclass
class Table:
    """A table for a tracker: column names and rows of JSON scalars (one cell per column)."""

    columns: list[str]
    rows: list[list[Cell]]


@dataclass
class TrackedRun:
    """What a tracker is opened with.

    Attributes:
        run_dir: The run directory (trackers that write locally write inside it).
        name: The run's name (the run directory's name).
        config: The resolved run config, as plain data.
        resumed: Whether this session continues an earlier one in ``run_dir``.
        first_step: The first training step this session logs. On a resume, steps from it on were logged by the
            interrupted session after its last checkpoint and run again: a tracker that can drop them does.
        state: This tracker's entry of ``tracking.json``: what an earlier session stored (empty on a fresh run);
            the tracker stores there what a resume needs to continue its tracker run (JSON data).
    """

    run_dir: Path
    name: str
    config: dict[str, Any]
    resumed: bool = False
    first_step: int = 1
    state: dict[str, Any] = field(default_factory=dict)


class Tracker(Protocol):
    """One experiment tracker of a run, opened from a :class:`TrackedRun` (its class's ``__init__``).

    A method may raise anything: the caller (:class:`~lrmgym.tracking.trackers.Trackers`) reports the first
    failure and stops using the tracker. ``fix`` is the advice that report gives for an error that is not a
    missing library (for that one the advice is to install the ``tracking`` extra).
    """

    fix: str

    def log_scalars(self, scalars: dict[str, float], step: int) -> None:
        """Log numbers under their names at ``step``."""
        ...

    def log_table(self, key: str, table: Table, step: int) -> None:
        """Log a table under ``key`` at ``step`` (a key logged again holds the new table)."""
        ...

    def close(self, status: str) -> None:
        """Flush and end the tracker run; ``status`` is the run's (finished, interrupted, failed, ...)."""
        ...


def read_state(run_dir: Path) -> dict[str, Any]:
    """``tracking.json`` of ``run_dir`` (empty when there is none or it cannot be read)."""
    try:
        state = json.loads((run_dir / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def write_state(run_dir: Path, state: dict[str, Any]) -> None:
    """Write ``tracking.json`` atomically."""
    atomic_write_text(run_dir / STATE_FILE, json.dumps(state, indent=1, sort_keys=True) + "\n")
