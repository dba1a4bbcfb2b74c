"""TensorBoard: event files in ``RUN_DIR/tensorboard/``, written by ``torch.utils.tensorboard.SummaryWriter``.

Scalars are scalars; tables and the config are text (Markdown tables, which TensorBoard's text tab renders). A
resume writes into the same folder with ``purge_step`` = the first step it logs, so readers drop what the
interrupted session logged after its last checkpoint (those steps run again).
"""

from __future__ import annotations

import json
from typing import Any

from lrmgym.tracking.base import Table, TrackedRun

__all__ = ["LOG_DIR", "TensorBoardTracker", "markdown"]

LOG_DIR = "tensorboard"
"""The event files' folder, inside the run directory."""


class TensorBoardTracker:
    """Logs to TensorBoard event files in the run directory."""

    fix = "check that RUN_DIR/tensorboard/ can be created and written (space, permissions), or drop tensorboard."

    def __init__(self, run: TrackedRun) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        run.state["log_dir"] = LOG_DIR
        self.log_dir = run.run_dir / LOG_DIR
        self.writer = SummaryWriter(str(self.log_dir), purge_step=run.first_step if run.resumed else None)
        self.where = f"logs to {self.log_dir} (view: tensorboard --logdir {self.log_dir})"
        """Where the tracker logs and how to look, for the line the run prints when it opens."""
        config = json.dumps(run.config, indent=1, ensure_ascii=False, default=str)
        self.writer.add_text("config", "```\n" + config + "\n```", run.first_step - 1)

    def log_scalars(self, scalars: dict[str, float], step: int) -> None:
        """``add_scalar`` for each."""
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)

    def log_table(self, key: str, table: Table, step: int) -> None:
        """The table as Markdown text."""
        self.writer.add_text(key, markdown(table), step)

    def close(self, status: str) -> None:
        """Flush and close the event file."""
        self.writer.close()


def markdown(table: Table) -> str:
    """A Markdown table (cells' ``|`` escaped, line breaks as ``<br>``)."""

    def text(value: Any) -> str:
        return "" if value is None else str(value).replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(map(text, table.columns)) + " |", "|" + " --- |" * len(table.columns)]
    lines += ["| " + " | ".join(map(text, row)) + " |" for row in table.rows]
    return "\n".join(lines)
