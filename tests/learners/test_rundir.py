"""Run-directory primitives: atomic writes, torn-line-tolerant logs, checkpoint rotation, RNG capture."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from lrmgym.learners.engine.rundir import (
    RUN_LOCK,
    Checkpointer,
    JsonlLog,
    RunDirLocked,
    atomic_write_json,
    capture_rng,
    lock_run_dir,
    restore_rng,
)


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path):
    path = tmp_path / "sub" / "s.json"
    atomic_write_json(path, {"a": 1})
    atomic_write_json(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    assert [p.name for p in path.parent.iterdir()] == ["s.json"]


def test_atomic_write_failure_keeps_the_old_file(tmp_path):
    path = tmp_path / "s.json"
    atomic_write_json(path, {"a": 1})
    with pytest.raises(TypeError):
        atomic_write_json(path, {1j: 1})  # complex keys cannot be JSON keys
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]


def test_jsonl_skips_torn_line_and_truncates(tmp_path):
    log = JsonlLog(tmp_path / "m.jsonl")
    for step in (1, 2, 3):
        log.append({"step": step})
    with open(log.path, "a") as f:
        f.write('{"step": 4, "rew')  # a SIGKILL mid-write
    assert [r["step"] for r in log.records()] == [1, 2, 3]
    assert log.truncate(2) == 2
    assert log.path.read_text() == '{"step": 1}\n{"step": 2}\n'
    log.append({"step": 3})
    assert [r["step"] for r in log.records()] == [1, 2, 3]


def test_checkpointer_keeps_newest(tmp_path):
    ck = Checkpointer(tmp_path / "ck", keep=2)
    assert ck.load_latest() is None
    for step in (5, 10, 15):
        ck.save(step, {"x": torch.tensor([step])})
    assert ck.steps() == [10, 15]
    state = ck.load_latest()
    assert state["step"] == 15 and state["x"].item() == 15
    (tmp_path / "ck" / ".step_000020.pt.123.tmp").write_bytes(b"partial")  # a crash mid-save is ignored
    assert ck.steps() == [10, 15]


def test_rng_roundtrip():
    state = capture_rng()
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    restore_rng(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == a


_HOLD = (
    "import sys; from lrmgym.learners.engine.rundir import lock_run_dir\n"
    "with lock_run_dir(sys.argv[1]):\n"
    "    print('locked', flush=True); sys.stdin.read()\n"
)


def _holder(run_dir) -> subprocess.Popen:
    """A second process holding ``run_dir``'s lock until its stdin closes (or it is killed)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(run_dir)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env, text=True)  # fmt: skip
    assert proc.stdout.readline() == "locked\n"
    return proc


def test_run_dir_lock_refuses_a_second_process_names_its_pid_and_is_released_by_sigkill(tmp_path):
    run_dir = tmp_path / "run"
    holder = _holder(run_dir)
    try:
        assert (run_dir / RUN_LOCK).read_text().strip() == str(holder.pid)
        with pytest.raises(RunDirLocked, match=rf"^'{run_dir}' is in use: process {holder.pid} is training in it"):
            with lock_run_dir(run_dir):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    assert (run_dir / RUN_LOCK).exists()  # a killed holder leaves its file; the kernel dropped the lock
    with lock_run_dir(run_dir):  # free again
        assert (run_dir / RUN_LOCK).read_text().strip() == str(os.getpid())
    assert not (run_dir / RUN_LOCK).exists()  # a clean release removes it


def test_run_dir_lock_is_reentrant_and_covers_the_folders_below(tmp_path):
    run_dir = tmp_path / "run"
    with lock_run_dir(run_dir):
        with lock_run_dir(run_dir), lock_run_dir(run_dir / "stages" / "01-rl1"):  # a staged run's stage loop
            assert not (run_dir / "stages" / "01-rl1" / RUN_LOCK).exists()
        assert (run_dir / RUN_LOCK).read_text().strip() == str(os.getpid())  # still held by the outer block
        out = subprocess.run(
            [sys.executable, "-c", _HOLD, str(run_dir)], input="", capture_output=True, text=True, timeout=60,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )  # fmt: skip
        assert out.returncode != 0 and f"process {os.getpid()} is training in it" in out.stderr
    assert not (run_dir / RUN_LOCK).exists()
