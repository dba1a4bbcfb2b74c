"""MLflow: a run in a local file store, ``RUN_DIR/mlruns/``, unless ``MLFLOW_TRACKING_URI`` names another store.

Everything goes through :class:`mlflow.tracking.MlflowClient` (no global active run, so a library user's own
mlflow run is left alone). Metrics are metric histories; the config is the run's parameters (flattened, when
the mlflow run is created) and ``config.json``; tables are JSON artifacts in the ``{"columns", "data"}`` layout
of ``mlflow.log_table`` (``tables/eval.json``, ``tables/samples/step_NNNNNN.json``). The run id and store are
kept in ``tracking.json``: a resume logs into the same mlflow run. ``MLFLOW_EXPERIMENT_NAME`` names the
experiment (default: ``lrmgym``).

The file store: MLflow 3 keeps it in maintenance mode and refuses it unless ``MLFLOW_ALLOW_FILE_STORE=true``;
for the store in the run directory this tracker sets that variable in the process (when it is unset), so the
light ``mlflow-skinny`` wheel, which has no SQL store, works with no server and no database.
"""

from __future__ import annotations

import os
import re
import time

from lrmgym.tracking.base import Table, TrackedRun
from lrmgym.tracking.records import flatten

__all__ = ["STORE_DIR", "MlflowTracker", "metric_name"]

STORE_DIR = "mlruns"
"""The local file store's folder, inside the run directory."""
_PARAM_VALUE_MAX = 6000  # MLflow's limit on a parameter's value
_BATCH = 100  # parameters per log_batch call (MLflow's limit)
_STATUS = {"finished": "FINISHED", "interrupted": "KILLED", "failed": "FAILED"}


class MlflowTracker:
    """Logs to an mlflow run through ``MlflowClient``."""

    fix = "check MLFLOW_TRACKING_URI (unset: a file store in RUN_DIR/mlruns/) and that the store is reachable."

    def __init__(self, run: TrackedRun) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = run.state.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:  # the run directory's own store: found again from the run directory, wherever it moved
            uri = (run.run_dir / STORE_DIR).resolve().as_uri()
        else:
            run.state["tracking_uri"] = uri
        if uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = client = MlflowClient(tracking_uri=uri)
        self.run_id = run.state.get("run_id")
        if self.run_id:  # a resume: the same mlflow run, running again
            client.update_run(self.run_id, status="RUNNING")
        else:
            experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "lrmgym"
            found = client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found is not None else client.create_experiment(experiment)
            tags = {"lrmgym.run_dir": str(run.run_dir)}
            self.run_id = client.create_run(experiment_id, run_name=run.name, tags=tags).info.run_id
            run.state["run_id"] = self.run_id
            params = [Param(k, str(v)[:_PARAM_VALUE_MAX]) for k, v in flatten(run.config).items()]
            for i in range(0, len(params), _BATCH):  # parameters cannot change: logged once, when the run starts
                client.log_batch(self.run_id, params=params[i : i + _BATCH])
        client.log_dict(self.run_id, run.config, "config.json")
        view = f"mlflow ui --backend-store-uri {uri}" if uri.startswith("file:") else uri
        self.where = f"logs run {self.run_id} to {uri} (view: {view})"
        """Where the tracker logs and how to look, for the line the run prints when it opens."""

    def log_scalars(self, scalars: dict[str, float], step: int) -> None:
        """One ``log_batch`` of metrics at ``step``."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(metric_name(k), v, now, step) for k, v in scalars.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def log_table(self, key: str, table: Table, step: int) -> None:
        """A JSON artifact: ``tables/eval.json`` (the latest), ``tables/samples/step_NNNNNN.json`` (one a step)."""
        path = f"tables/{key}.json" if key == "eval" else f"tables/{key}/step_{step:06d}.json"
        self.client.log_dict(self.run_id, {"columns": table.columns, "data": table.rows}, path)

    def close(self, status: str) -> None:
        """End the run: FINISHED, KILLED (interrupted) or FAILED."""
        self.client.set_terminated(self.run_id, status=_STATUS.get(status, "FINISHED"))


def metric_name(name: str) -> str:
    """``name`` with the characters MLflow refuses in a metric name replaced by ``_``."""
    return re.sub(r"[^\w./\- ]", "_", name)
