"""Run-directory primitives: atomic writes, torn-line-tolerant logs, checkpoint rotation, RNG capture."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from lrmgym.learners.rundir import Checkpointer, JsonlLog, atomic_write_json, capture_rng, restore_rng


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
