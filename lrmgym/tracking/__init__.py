"""Experiment tracking: ``run.report_to=[tensorboard,wandb,mlflow]`` (any subset; default none).

The run loop (:mod:`lrmgym.learners.engine.loop`) hands each chosen tracker what it writes to the run directory:
every number of each ``metrics.jsonl`` line under the same name and step, the evaluations (before, periodic,
after) as scalars and as a table, each step's ``samples.jsonl`` records as a table (verdicts and judge
components), and the resolved config. A resumed run continues the same tracker runs (their ids are kept in
``RUN_DIR/tracking.json``). A tracker that fails is reported once and dropped; training goes on.

Each tracker's library is imported only when it is chosen: ``pip install "lrmgym[tracking]"``.
"""

from lrmgym.tracking.base import TRACKERS, Table, TrackedRun, Tracker, TrackerName
from lrmgym.tracking.trackers import Trackers

__all__ = ["TRACKERS", "Table", "TrackedRun", "Tracker", "TrackerName", "Trackers"]
