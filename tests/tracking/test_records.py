"""What the trackers are given (scalars, sample and eval tables) and how a failing tracker is fenced off.

No tracker library is needed here: a recording tracker stands in for them.
"""

from __future__ import annotations

import json
import sys
import types

import pytest

from lrmgym.tracking import Table, Trackers
from lrmgym.tracking.base import BACKENDS, STATE_FILE
from lrmgym.tracking.records import eval_scalars, eval_table, sample_table, scalars
from lrmgym.tracking.tensorboard import markdown

VERDICT = {
    "score": 0.5, "correct": False, "parsed": "4", "reason": "half", "latency_s": 0.01, "format_ok": True,
    "components": [
        {"name": "accuracy", "score": 0.0, "weight": 1.0, "latency_s": 0.0, "cached": False, "reason": "",
         "raw_score": None},
        {"name": "format_strict", "score": 1.0, "weight": 0.5, "latency_s": 0.0, "cached": False, "reason": "",
         "raw_score": None},
    ],
}  # fmt: skip
GROUP = {
    "step": 3, "task_id": "math/7", "prompt": [{"role": "user", "content": "2+2?"}], "answer": "4",
    "trajectories": [
        {"turns": [{"role": "policy", "text": "<answer>4</answer>"}], "reward": 0.5, "advantage": 1.0,
         "verdict": VERDICT},
        {"turns": [{"role": "policy", "text": "5"}, {"role": "env", "text": "try again"},
                   {"role": "policy", "text": "4"}],
         "reward": None, "advantage": 0.0, "verdict": None},
    ],
}  # fmt: skip
EVALS = {
    "before": {"step": 0, "sampled": {"accuracy": 0.25, "ci": [0.1, 0.4], "tasks": 8, "n": 2, "mean_tokens": 7.5},
               "greedy": {"accuracy": 0.5, "ci": [0.2, 0.8], "tasks": 8, "n": 1, "mean_tokens": 6.0}},
    "after": {"step": 4, "sampled": {"accuracy": 0.75, "ci": [0.5, 0.9], "tasks": 8, "n": 2, "mean_tokens": None}},
    "step_2": {"step": 2, "sampled": {"accuracy": 0.5, "ci": [0.3, 0.7], "tasks": 8, "n": 2, "mean_tokens": 7.0}},
}  # fmt: skip


def test_scalars_are_every_number_of_the_metrics_line_but_the_step():
    line = {"step": 3, "reward/mean": 0.5, "generations": 8, "accuracy": None, "note": "x", "flag": True, "kl": 0.0}
    assert scalars(line) == {"reward/mean": 0.5, "generations": 8.0, "kl": 0.0}


def test_sample_table_has_a_row_per_trajectory_with_its_verdict_and_judge_components():
    table = sample_table([GROUP])
    assert table.columns == [
        "step", "task_id", "prompt", "answer", "sample", "reward", "advantage", "completion", "score", "correct",
        "parsed", "reason", "format_ok", "judge/accuracy", "judge/format_strict",
    ]  # fmt: skip
    first, second = (dict(zip(table.columns, row, strict=True)) for row in table.rows)
    assert first == {
        "step": 3, "task_id": "math/7", "prompt": '[{"role": "user", "content": "2+2?"}]', "answer": "4", "sample": 0,
        "reward": 0.5, "advantage": 1.0, "completion": "<answer>4</answer>", "score": 0.5, "correct": False,
        "parsed": "4", "reason": "half", "format_ok": True, "judge/accuracy": 0.0, "judge/format_strict": 1.0,
    }  # fmt: skip
    assert second["completion"] == "[policy] 5\n[env] try again\n[policy] 4"  # the env's reply marked
    assert second["score"] is None and second["judge/accuracy"] is None  # ungradeable: no verdict


def test_sample_table_keeps_records_without_trajectories_as_rows_and_is_none_when_empty():
    table = sample_table([{"step": 1, "task_id": "t", "decisions": [[0, "a", 0.7]], "reward": 1.0}])
    assert table.columns == ["step", "task_id", "decisions", "reward"]
    assert table.rows == [[1, "t", '[[0, "a", 0.7]]', 1.0]]
    assert sample_table([]) is None


def test_eval_table_and_scalars_follow_the_steps():
    table = eval_table(EVALS)
    assert table.columns == ["eval", "step", "mode", "accuracy", "ci_low", "ci_high", "tasks", "n", "mean_tokens"]
    assert table.rows == [
        ["before", 0, "sampled", 0.25, 0.1, 0.4, 8, 2, 7.5],
        ["before", 0, "greedy", 0.5, 0.2, 0.8, 8, 1, 6.0],
        ["step_2", 2, "sampled", 0.5, 0.3, 0.7, 8, 2, 7.0],
        ["after", 4, "sampled", 0.75, 0.5, 0.9, 8, 2, None],
    ]
    assert eval_scalars(EVALS["before"]) == {
        "eval/sampled/accuracy": 0.25, "eval/sampled/mean_tokens": 7.5,
        "eval/greedy/accuracy": 0.5, "eval/greedy/mean_tokens": 6.0,
    }  # fmt: skip


def test_markdown_escapes_pipes_and_line_breaks():
    text = markdown(Table(["a", "b"], [["x|y", "1\n2"], [None, 3]]))
    assert text.splitlines() == ["| a | b |", "| --- | --- |", "| x\\|y | 1<br>2 |", "|  | 3 |"]


# ------------------------------------------------------------------------------------------------ fencing
class Recorder:
    """A tracker that records its calls; ``fail_on`` names the call that raises."""

    fix = "restart the recorder."
    fail_on: str | None = None
    opened: list = []

    def __init__(self, run):
        Recorder.opened.append(run)
        self.calls = []
        run.state["id"] = run.state.get("id") or "rec-1"
        self._maybe_fail("open")

    def _maybe_fail(self, call):
        self.calls.append(call)
        if call == self.fail_on:
            raise OSError(28, "No space left on device")

    def log_scalars(self, scalars, step):
        self._maybe_fail("log_scalars")

    def log_table(self, key, table, step):
        self._maybe_fail("log_table")

    def close(self, status):
        self._maybe_fail("close")


@pytest.fixture
def recorder(monkeypatch):
    module = types.ModuleType("recorder_tracker")
    module.Recorder = Recorder
    monkeypatch.setitem(sys.modules, "recorder_tracker", module)
    monkeypatch.setitem(BACKENDS, "recorder", "recorder_tracker:Recorder")
    monkeypatch.setattr(Recorder, "opened", [])
    return Recorder


@pytest.mark.parametrize("fail_on", ["open", "log_scalars", "log_table", "close"])
def test_a_failing_tracker_is_reported_once_and_gets_no_further_call(tmp_path, recorder, monkeypatch, fail_on):
    monkeypatch.setattr(recorder, "fail_on", fail_on)
    said = []
    trackers = Trackers.open(["recorder"], tmp_path, {"a": 1}, report=said.append)
    for step in (1, 2, 3):
        trackers.log_step({"step": step, "reward/mean": 0.5}, [GROUP])
    trackers.log_eval(EVALS, "after")
    trackers.close("finished")
    assert said == [
        "report_to: recorder failed (OSError: [Errno 28] No space left on device); the run goes on without it. "
        "Fix: restart the recorder."
    ]
    assert list(trackers.failed) == ["recorder"] and trackers.active == {}


def test_a_missing_library_gets_the_install_hint(tmp_path, recorder, monkeypatch):
    def missing(self, run):
        raise ModuleNotFoundError("No module named 'recorder_lib'")

    monkeypatch.setattr(recorder, "__init__", missing)
    said = []
    Trackers.open(["recorder"], tmp_path, {}, report=said.append)
    assert said == [
        "report_to: recorder failed (ModuleNotFoundError: No module named 'recorder_lib'); the run goes on without "
        'it. Fix: pip install "lrmgym[tracking]"'
    ]


def test_the_tracker_ids_are_kept_for_a_resume(tmp_path, recorder):
    Trackers.open(["recorder"], tmp_path, {"a": 1}).close("interrupted")
    assert json.loads((tmp_path / STATE_FILE).read_text()) == {"recorder": {"id": "rec-1"}}
    (tmp_path / STATE_FILE).write_text(json.dumps({"recorder": {"id": "kept"}}))
    Trackers.open(["recorder"], tmp_path, {"a": 1}, resumed=True, first_step=5).close("finished")
    run = recorder.opened[-1]
    assert (run.resumed, run.first_step, run.state, run.name) == (True, 5, {"id": "kept"}, tmp_path.name)


def test_no_trackers_writes_nothing(tmp_path):
    trackers = Trackers.open([], tmp_path, {})
    trackers.log_step({"step": 1, "reward/mean": 0.5}, [])
    trackers.close("finished")
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_tracker_name_is_refused(tmp_path):
    with pytest.raises(
        ValueError, match=r"^report_to: unknown tracker 'neptune'; allowed: tensorboard, wandb, mlflow\.$"
    ):
        Trackers.open(["neptune"], tmp_path, {})
