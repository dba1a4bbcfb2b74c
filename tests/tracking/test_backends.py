"""A GRPO run with run.report_to=[tensorboard,wandb,mlflow], read back with each tracker's own reader.

Each tracker must hold what metrics.jsonl holds (the same steps, the same final reward), the evaluations, the
sample table and the config; a resume continues the same tracker runs; a broken tracker is reported once and
the run finishes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from tracking_helpers import (
    metrics,
    mlflow_run,
    run_cli,
    save_tiny_hf,
    tensorboard_scalars,
    tensorboard_texts,
    wandb_runs,
    write_config,
)

from lrmgym.learners.engine.rundir import Checkpointer
from lrmgym.tracking import Trackers

REWARD = "reward/mean"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return save_tiny_hf(tmp_path_factory.mktemp("model") / "m", seed=1)


def _isolate(mp: pytest.MonkeyPatch, home: Path) -> None:
    """No tracker settings from the machine, wandb's caches under ``home``, and what a tracker sets undone after."""
    for name in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME",
                 "MLFLOW_ALLOW_FILE_STORE"):  # fmt: skip
        mp.setenv(name, "")  # recorded first, so that undo also removes a value the tracker sets (the mlflow opt-in)
        mp.delenv(name)
    for name in ("WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
        mp.setenv(name, str(home / name.lower()))


@pytest.fixture(autouse=True)
def tracker_env(tmp_path, monkeypatch):
    _isolate(monkeypatch, tmp_path / "wandb-home")


@pytest.fixture(scope="module")
def finished(tmp_path_factory, model):
    """A finished 3-step run reporting to all three trackers (any not installed fails once and is left out)."""
    run_dir = tmp_path_factory.mktemp("runs") / "r"
    with pytest.MonkeyPatch.context() as mp:
        _isolate(mp, run_dir.parent / "wandb-home")
        write_config(run_dir, model, steps=3, eval_every=2)
        result = run_cli(run_dir)
    return run_dir, metrics(run_dir), result.output


def _rewards(lines: list[dict]) -> list[tuple[int, float]]:
    return [(m["step"], m[REWARD]) for m in lines]


def test_metrics_log_is_what_the_trackers_must_match(finished):
    for library in ("tensorboard", "wandb", "mlflow"):
        pytest.importorskip(library)
    run_dir, lines, output = finished
    assert [m["step"] for m in lines] == [1, 2, 3] and all(m[REWARD] is not None for m in lines)
    assert "report_to:" not in output, output  # no tracker failed
    lines = output.splitlines()
    board = run_dir / "tensorboard"
    assert f"tracking: tensorboard logs to {board} (view: tensorboard --logdir {board})" in lines
    store = (run_dir / "mlruns").resolve().as_uri()
    assert any(re.fullmatch(rf"tracking: mlflow logs run \w+ to {re.escape(store)} \(view: mlflow ui "
                            rf"--backend-store-uri {re.escape(store)}\)", line) for line in lines), output  # fmt: skip
    assert any(line.startswith("tracking: wandb logs run ") and f"(offline) to {run_dir / 'wandb'}" in line
               for line in lines), output  # fmt: skip
    state = json.loads((run_dir / "tracking.json").read_text())
    assert set(state) == {"tensorboard", "wandb", "mlflow"}


def test_tensorboard_event_file_holds_every_step_and_the_final_reward(finished):
    pytest.importorskip("tensorboard")
    run_dir, lines, _ = finished
    scalars = tensorboard_scalars(run_dir / "tensorboard")
    numeric = {k for m in lines for k, v in m.items() if isinstance(v, (int, float)) and k != "step"}
    assert numeric <= set(scalars)  # every number of the metrics line, under its own name
    got = scalars[REWARD]
    assert [s for s, _ in got] == [1, 2, 3]
    assert got[-1][1] == pytest.approx(lines[-1][REWARD], rel=1e-6)  # float32 in the event file
    assert [s for s, _ in scalars["eval/sampled/accuracy"]] == [0, 2, 3]  # before, eval_every=2, after
    texts = tensorboard_texts(run_dir / "tensorboard")
    assert [s for s, _ in texts["samples/text_summary"]] == [1, 2, 3]
    header = texts["samples/text_summary"][0][1].splitlines()[0]
    for column in ("task_id", "completion", "reward", "advantage", "score", "correct", "reason"):
        assert f" {column} |" in header
    assert "| after | 3 | sampled |" in texts["eval/text_summary"][-1][1]
    assert '"learner"' in texts["config/text_summary"][0][1]


def test_wandb_offline_run_holds_every_step_and_the_final_reward(finished):
    pytest.importorskip("wandb")
    run_dir, lines, _ = finished
    (session,) = wandb_runs(run_dir)
    assert session["id"] == json.loads((run_dir / "tracking.json").read_text())["wandb"]["id"]
    rows = session["history"]
    assert [(s, r[REWARD]) for s, r in sorted(rows.items()) if REWARD in r] == _rewards(lines)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert rows[3]["eval/sampled/accuracy"] == summary["evals"]["after"]["sampled"]["accuracy"]
    assert rows[1]["samples/_type"] == "table-file" and rows[3]["eval/_type"] == "table-file"
    assert rows[1]["samples/nrows"] == 2  # log_samples=1 group of group_size=2
    assert session["config"]["learner"]["kind"] == "grpo"
    assert session["config"]["run"]["report_to"] == ["tensorboard", "wandb", "mlflow"]


def test_mlflow_store_holds_every_step_and_the_final_reward(finished):
    pytest.importorskip("mlflow")
    run_dir, lines, _ = finished
    client, run = mlflow_run(run_dir)
    assert run.info.status == "FINISHED" and run.info.run_name == run_dir.name
    history = client.get_metric_history(run.info.run_id, REWARD)
    assert [(m.step, m.value) for m in history] == _rewards(lines)
    assert run.data.metrics[REWARD] == lines[-1][REWARD]
    assert run.data.params["learner.kind"] == "grpo" and run.data.params["run.seed"] == "3"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.json", "tables"} <= artifacts
    evals = json.loads(Path(client.download_artifacts(run.info.run_id, "tables/eval.json")).read_text())
    assert [row[:3] for row in evals["data"]] == [["before", 0, "sampled"], ["step_2", 2, "sampled"],
                                                   ["after", 3, "sampled"]]  # fmt: skip
    summary = json.loads((run_dir / "summary.json").read_text())
    assert evals["data"][-1][3] == summary["evals"]["after"]["sampled"]["accuracy"]
    samples = Path(client.download_artifacts(run.info.run_id, "tables/samples/step_000003.json"))
    samples = json.loads(samples.read_text())
    assert len(samples["data"]) == 2 and "judge/accuracy" not in samples["columns"]  # the env's own verifier only


def test_a_resumed_run_continues_the_same_tracker_runs(tmp_path, model):
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    run_dir = tmp_path / "r"
    write_config(run_dir, model, steps=2, eval_before_after=False)
    run_cli(run_dir)
    first = json.loads((run_dir / "tracking.json").read_text())
    write_config(run_dir, model, steps=4, eval_before_after=False)  # learner.steps may change on a resume
    output = run_cli(run_dir).output
    assert "resuming with changed learner.steps" in output and "report_to:" not in output
    assert json.loads((run_dir / "tracking.json").read_text()) == first  # the same tracker runs
    lines = metrics(run_dir)
    assert [m["step"] for m in lines] == [1, 2, 3, 4]

    got = tensorboard_scalars(run_dir / "tensorboard")[REWARD]
    assert [s for s, _ in got] == [1, 2, 3, 4]
    assert [v for _, v in got] == pytest.approx([v for _, v in _rewards(lines)], rel=1e-6)  # float32 in the file
    sessions = wandb_runs(run_dir)
    assert [s["id"] for s in sessions] == [first["wandb"]["id"]] * 2
    assert [sorted(s["history"]) for s in sessions] == [[1, 2], [3, 4]]  # the resume continues at step 3
    client, run = mlflow_run(run_dir)
    assert run.info.run_id == first["mlflow"]["run_id"] and run.info.status == "FINISHED"
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, REWARD)] == _rewards(lines)
    assert len(client.search_runs([run.info.experiment_id])) == 1


def test_steps_run_again_after_a_resume_replace_the_lost_ones_in_tensorboard(tmp_path, model):
    pytest.importorskip("tensorboard")
    run_dir = tmp_path / "r"
    write_config(run_dir, model, steps=3, report_to=["tensorboard"], eval_before_after=False)
    run_cli(run_dir)
    lost = metrics(run_dir)[-1]
    (run_dir / "checkpoints" / "step_000003.pt").unlink()  # killed after step 3 was logged, before its checkpoint
    assert Checkpointer(run_dir / "checkpoints").steps() == [2]
    run_cli(run_dir)
    lines = metrics(run_dir)
    assert [m["step"] for m in lines] == [1, 2, 3] and lines[-1]["time/step_s"] != lost["time/step_s"]
    got = tensorboard_scalars(run_dir / "tensorboard")["time/step_s"]
    assert [s for s, _ in got] == [1, 2, 3]  # purge_step dropped the lost step 3; the new one replaced it
    assert got[-1][1] == pytest.approx(lines[-1]["time/step_s"], rel=1e-6)


def test_a_missing_library_is_reported_once_and_the_run_finishes(tmp_path, model, monkeypatch, capfd):
    monkeypatch.setitem(__import__("sys").modules, "wandb", None)  # `import wandb` raises ImportError
    run_dir = tmp_path / "r"
    write_config(run_dir, model, steps=2, report_to=["wandb"])
    result = run_cli(run_dir)
    err = capfd.readouterr().err + result.output
    lines = [line for line in err.splitlines() if line.startswith("report_to:")]
    assert lines == [
        "report_to: wandb failed (ModuleNotFoundError: import of wandb halted; None in sys.modules); the run goes on "
        'without it. Fix: pip install "lrmgym[tracking]"'
    ]
    assert [m["step"] for m in metrics(run_dir)] == [1, 2]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "finished"


def test_an_unwritable_tracker_folder_is_reported_once_and_the_run_finishes(tmp_path, model, capfd):
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    run_dir = tmp_path / "r"
    write_config(run_dir, model, steps=2, report_to=["tensorboard", "mlflow"])
    (run_dir / "tensorboard").write_text("a file where the event folder goes")  # root ignores permissions
    result = run_cli(run_dir)
    err = capfd.readouterr().err + result.output
    lines = [line for line in err.splitlines() if line.startswith("report_to:")]
    assert len(lines) == 1 and lines[0].startswith("report_to: tensorboard failed (")
    assert re.search(r"Fix: check that RUN_DIR/tensorboard/ can be created and written", lines[0])
    client, run = mlflow_run(run_dir)  # the other tracker went on
    assert [m.step for m in client.get_metric_history(run.info.run_id, REWARD)] == [1, 2]
    assert [m["step"] for m in metrics(run_dir)] == [1, 2]


def test_a_tracker_whose_log_call_raises_is_reported_once_and_dropped(tmp_path, model, monkeypatch, capfd):
    pytest.importorskip("tensorboard")
    from lrmgym.tracking.tensorboard import TensorBoardTracker

    calls = []

    def broken(self, scalars, step):
        calls.append(step)
        raise RuntimeError("the disk said no")

    monkeypatch.setattr(TensorBoardTracker, "log_scalars", broken)
    run_dir = tmp_path / "r"
    write_config(run_dir, model, steps=3, report_to=["tensorboard"], eval_before_after=False)
    result = run_cli(run_dir)
    err = capfd.readouterr().err + result.output
    lines = [line for line in err.splitlines() if line.startswith("report_to:")]
    assert lines == [
        "report_to: tensorboard failed (RuntimeError: the disk said no); the run goes on without it. Fix: check "
        "that RUN_DIR/tensorboard/ can be created and written (space, permissions), or drop tensorboard."
    ]
    assert calls == [1]  # never called again
    assert [m["step"] for m in metrics(run_dir)] == [1, 2, 3]


def test_wandb_mode_from_the_environment_wins_over_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    trackers = Trackers.open(["wandb"], tmp_path, {"learner": {"kind": "grpo"}})
    trackers.log_step({"step": 1, REWARD: 0.5}, [])
    trackers.close("finished")
    assert not trackers.failed and not list((tmp_path / "wandb").glob("offline-run-*"))


def test_mlflow_tracking_uri_from_the_environment_is_used_and_kept_for_the_resume(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    store = (tmp_path / "elsewhere").resolve().as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    trackers = Trackers.open(["mlflow"], tmp_path / "run", {"learner": {"kind": "grpo"}})
    trackers.log_step({"step": 1, REWARD: 0.5}, [])
    trackers.close("finished")
    state = json.loads((tmp_path / "run" / "tracking.json").read_text())["mlflow"]
    assert state["tracking_uri"] == store and not (tmp_path / "run" / "mlruns").exists()
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    resumed = Trackers.open(["mlflow"], tmp_path / "run", {}, resumed=True, first_step=2)
    resumed.log_step({"step": 2, REWARD: 0.25}, [])
    resumed.close("interrupted")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store)
    assert [(m.step, m.value) for m in client.get_metric_history(state["run_id"], REWARD)] == [(1, 0.5), (2, 0.25)]
    assert client.get_run(state["run_id"]).info.status == "KILLED"
