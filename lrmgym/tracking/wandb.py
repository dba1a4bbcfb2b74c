"""Weights & Biases: a wandb run, offline by default, its files in ``RUN_DIR/wandb/``.

Offline unless ``WANDB_MODE`` says otherwise (``WANDB_MODE=online`` after ``wandb login`` logs live; an
offline run is uploaded later with ``wandb sync RUN_DIR/wandb/offline-run-*``). The run id is kept in
``tracking.json``: a resume calls ``wandb.init(id=..., resume="allow")`` and continues the same wandb run.
``WANDB_PROJECT`` and ``WANDB_ENTITY`` are honoured (project default: ``lrmgym``).
"""

from __future__ import annotations

import os
from pathlib import Path

from lrmgym.tracking.base import Table, TrackedRun

__all__ = ["WandbTracker"]


class WandbTracker:
    """Logs to a wandb run."""

    fix = "check WANDB_MODE (unset: offline, into RUN_DIR/wandb/) and `wandb login`, or drop wandb."

    def __init__(self, run: TrackedRun) -> None:
        import wandb

        self.wandb = wandb
        mode = os.environ.get("WANDB_MODE") or "offline"  # read now: wandb reads the environment once a process
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or "lrmgym", name=run.name, id=run.state.get("id"), resume="allow",
            dir=str(run.run_dir), mode=mode,
        )  # fmt: skip
        self.run.config.update(run.config, allow_val_change=True)
        run.state["id"] = self.run.id
        files = getattr(self.run, "dir", None) or str(run.run_dir / "wandb")
        url = getattr(self.run, "url", None) if mode == "online" else None
        sync = f"upload: wandb sync {Path(files).parent}"
        where = f"to {url} (files: {files})" if url else f"({mode}) to {files} ({sync})"
        self.where = f"logs run {self.run.id} {where}"
        """Where the tracker logs and how to look, for the line the run prints when it opens."""

    def log_scalars(self, scalars: dict[str, float], step: int) -> None:
        """``run.log(scalars, step=step)``."""
        self.run.log(dict(scalars), step=step)

    def log_table(self, key: str, table: Table, step: int) -> None:
        """A ``wandb.Table`` under ``key``."""
        data = self.wandb.Table(columns=table.columns, data=table.rows, allow_mixed_types=True)
        self.run.log({key: data}, step=step)

    def close(self, status: str) -> None:
        """``run.finish``; exit code 0 unless the run failed or was interrupted."""
        self.run.finish(exit_code=1 if status in ("failed", "interrupted") else 0)
