"""Progress in a log file: plain periodic lines, never a live bar's carriage-return frames (`lrmgym.progress`)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lrmgym import progress
from lrmgym.progress import LogProgress, progress_bar


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(progress.time, "monotonic", fake)
    return fake


def test_a_stream_that_is_not_a_terminal_gets_plain_lines(clock):
    out = io.StringIO()
    bar = progress_bar(150, "grpo", "steps", stream=out)
    assert isinstance(bar, LogProgress)
    for _ in range(150):
        clock.now += 1.0  # a step a second: a line every 30 steps
        bar.update(1)
        bar.set_postfix(reward="0.61", acc="0.80")
    bar.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert len(lines) == 5, lines  # at 30, 60, 90, 120 and 150 s (the last one is the close)
    assert lines[0] == "grpo: 30/150 steps (20%), 1 steps/s, 120 s left, 30 s, reward=0.61, acc=0.80"
    assert lines[-1].startswith("grpo: 150/150 steps (100%), 1 steps/s, 150 s")


def test_a_short_inner_loop_prints_nothing_and_a_disabled_one_nothing_ever(clock):
    out = io.StringIO()
    bar = progress_bar(6, "eval", "tasks", leave=False, stream=out)
    for _ in range(6):
        bar.update(1)
    bar.close()
    quiet = progress_bar(6, "eval", "tasks", enabled=False, stream=out)
    quiet.update(6)
    quiet.close()
    assert out.getvalue() == ""


def test_a_resumed_run_counts_from_its_step_and_a_total_may_change(clock):
    out = io.StringIO()
    bar = progress_bar(100, "grpo", "steps", initial=40, stream=out)
    bar.total = 80  # a time budget ends the run early
    clock.now += 30.0
    bar.update(10)
    bar.close()
    assert out.getvalue().splitlines()[0].startswith("grpo: 50/80 steps (62%), 0.333 steps/s, 90 s left")


def test_lrmgym_run_into_a_log_file_has_no_frames_and_no_long_lines(tmp_path):
    """The whole command's output, stdout and stderr, redirected to a file as a batch job's would be."""
    log = tmp_path / "run.log"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "COLUMNS": "120"}
    with open(log, "wb") as f:
        code = subprocess.call(
            [sys.executable, "-m", "lrmgym.cli.main", "run", "env=math", "learner=grpo", "learner.steps=2",
             "learner.prompts_per_step=4", "learner.group_size=4", "learner.async_rollouts=false", "eval.tasks=4",
             "eval.n=1", "eval.max_new_tokens=32", f"run.output_dir={tmp_path}", "run.name=r"],
            stdout=f, stderr=subprocess.STDOUT, env=env, timeout=600,
        )  # fmt: skip
    text = log.read_bytes().decode()
    assert code == 0, text
    assert "\r" not in text
    assert max(map(len, text.splitlines())) < 500, text
    assert "Loading weights" not in text  # transformers' own bar is off too
    assert "grpo: 2/2 steps (100%)" in text  # the run's own progress, as one closing line
