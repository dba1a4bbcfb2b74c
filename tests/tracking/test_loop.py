"""The run loop feeds the trackers what it writes to the run directory, and closes them at the end and on Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import sys
import types

import pytest

from lrmgym.learners.engine.context import RunContext
from lrmgym.learners.engine.loop import Algorithm, Loop, LoopConfig, StepResult
from lrmgym.tracking.base import BACKENDS


class Recorder:
    """A tracker that records every call (class-level, so the test sees the instance the loop opened)."""

    fix = "none needed."
    calls: list = []

    def __init__(self, run):
        Recorder.calls.append(("open", run.resumed, run.first_step, run.config))

    def log_scalars(self, scalars, step):
        Recorder.calls.append(("scalars", step, dict(scalars)))

    def log_table(self, key, table, step):
        Recorder.calls.append(("table", key, step, table.columns, table.rows))

    def close(self, status):
        Recorder.calls.append(("close", status))


class Counting(Algorithm):
    """Reward = step / 10; one sample record a step; sends itself SIGINT at ``interrupt_at``."""

    name = "counting"

    def __init__(self, interrupt_at: int | None = None) -> None:
        self.interrupt_at = interrupt_at

    def train_step(self) -> StepResult:
        step = self.loop.step + 1
        if step == self.interrupt_at:
            os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C: the loop finishes this step, saves and stops
        sample = {"task_id": f"t{step}", "completion": "aaa", "reward": step / 10}
        return StepResult({"reward/mean": step / 10, "accuracy": None, "generations": 2}, [sample])


@pytest.fixture
def recorder(monkeypatch):
    module = types.ModuleType("recorder_tracker")
    module.Recorder = Recorder
    monkeypatch.setitem(sys.modules, "recorder_tracker", module)
    monkeypatch.setitem(BACKENDS, "recorder", "recorder_tracker:Recorder")
    monkeypatch.setattr(Recorder, "calls", [])
    return Recorder


def _loop(tmp_path, algorithm, steps=3):
    ctx = RunContext(env=None, policy=None, eval=None, seed=0, run_dir=tmp_path, report_to=("recorder",))
    cfg = LoopConfig(steps=steps, eval_before_after=False, progress=False, checkpoint_every=1)
    return Loop(ctx, cfg, algorithm)


def test_every_step_reaches_the_trackers_as_metrics_jsonl_has_it(tmp_path, recorder):
    _loop(tmp_path, Counting()).run()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    samples = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    opened, *logged, closed = recorder.calls
    assert opened[:3] == ("open", False, 1) and opened[3]["learner"]["steps"] == 3  # no RunConfig: the loop's own
    scalars = [c for c in logged if c[0] == "scalars"]
    assert [c[1] for c in scalars] == [m["step"] for m in lines] == [1, 2, 3]
    for (_, _, values), line in zip(scalars, lines, strict=True):
        assert values == {k: v for k, v in line.items() if k != "step" and v is not None}
    tables = [c for c in logged if c[0] == "table"]
    assert [(c[1], c[2]) for c in tables] == [("samples", 1), ("samples", 2), ("samples", 3)]
    assert tables[-1][3] == list(samples[-1]) and tables[-1][4] == [list(samples[-1].values())]
    assert closed == ("close", "finished")


def test_an_interrupted_run_closes_its_trackers_and_its_resume_continues_them(tmp_path, recorder):
    with pytest.raises(KeyboardInterrupt):
        _loop(tmp_path, Counting(interrupt_at=2), steps=4).run()
    assert recorder.calls[-1] == ("close", "interrupted")
    assert [c[1] for c in recorder.calls if c[0] == "scalars"] == [1, 2]
    recorder.calls.clear()
    _loop(tmp_path, Counting(), steps=4).run(resume=True)
    assert recorder.calls[0][:3] == ("open", True, 3)
    assert [c[1] for c in recorder.calls if c[0] == "scalars"] == [3, 4]
    assert recorder.calls[-1] == ("close", "finished")


def test_a_run_says_where_each_tracker_logs_and_a_resume_says_from_which_step(tmp_path, recorder, capsys,
                                                                              monkeypatch):  # fmt: skip
    monkeypatch.setattr(Recorder, "where", f"logs to {tmp_path / 'rec'} (view: rec {tmp_path / 'rec'})", raising=False)
    with pytest.raises(KeyboardInterrupt):
        _loop(tmp_path, Counting(interrupt_at=2), steps=4).run()
    first = capsys.readouterr().out
    assert f"tracking: recorder logs to {tmp_path / 'rec'} (view: rec {tmp_path / 'rec'})" in first.splitlines()
    assert "resuming" not in first
    _loop(tmp_path, Counting(), steps=4).run(resume=True)
    lines = capsys.readouterr().out.splitlines()
    assert f"resuming from step 2 ({tmp_path / 'checkpoints' / 'step_000002.pt'})" in lines
    assert lines.index(f"resuming from step 2 ({tmp_path / 'checkpoints' / 'step_000002.pt'})") < lines.index(
        f"tracking: recorder logs to {tmp_path / 'rec'} (view: rec {tmp_path / 'rec'})"
    )


def test_a_resume_without_a_checkpoint_says_it_starts_over(tmp_path, capsys):
    ctx = RunContext(env=None, policy=None, eval=None, seed=0, run_dir=tmp_path)
    cfg = LoopConfig(steps=1, eval_before_after=False, progress=False)
    Loop(ctx, cfg, Counting()).run(resume=True)
    assert f"no checkpoint in {tmp_path / 'checkpoints'}: starting over from step 0" in capsys.readouterr().out
