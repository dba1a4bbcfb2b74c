"""A single local file is split into train and test by a content hash of each item's question."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from lrmgym.cli.main import cli
from lrmgym.configs.resolve import ConfigError, resolve
from lrmgym.envs.math.env import MathEnv
from lrmgym.envs.math.loaders import hash_split


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _questions(env):
    return {item.question for item in env._items}


ROWS = [{"question": f"What is {n} + {n}?", "answer": str(2 * n)} for n in range(200)]


def test_train_and_test_are_disjoint_and_cover_the_file(tmp_path):
    path = _write(tmp_path / "d.jsonl", ROWS)
    train, test = (_questions(MathEnv(source=str(path), split=s)) for s in ("train", "test"))
    assert not train & test
    assert train | test == {r["question"] for r in ROWS}
    assert 5 <= len(test) <= 40  # about 10 %


def test_the_split_follows_content_not_position(tmp_path):
    forward = _write(tmp_path / "f.jsonl", ROWS)
    backward = _write(tmp_path / "b.jsonl", ROWS[::-1] + [{"question": "new one?", "answer": "1"}])
    a = _questions(MathEnv(source=str(forward), split="test"))
    b = _questions(MathEnv(source=str(backward), split="test"))
    assert a == b - {"new one?"}
    assert hash_split("What  is 1 +\n1?", 0.5) == hash_split("What is 1 + 1?", 0.5)  # whitespace-normalised


def test_task_ids_keep_the_row_index_of_the_file(tmp_path):
    path = _write(tmp_path / "d.jsonl", ROWS)
    env = MathEnv(source=str(path), split="test", order="sequential")
    task = env.task_at(0, seed=0)
    row = int(task.id.rsplit("/", 1)[1])
    assert task.id == f"d.jsonl/test/{row}" and task.metadata["question"] == ROWS[row]["question"]


def test_test_fraction_one_and_zero(tmp_path):
    path = _write(tmp_path / "d.jsonl", ROWS[:20])
    assert MathEnv(source=str(path), split="test", test_fraction=1.0).num_items == 20
    assert MathEnv(source=str(path), split="train", test_fraction=0.0).num_items == 20
    message = (
        f"{path}: none of its 20 items falls in the 'train' split (test_fraction=1.0 of a content hash); lower "
        "env.test_fraction, or give that split its own file (test_fraction=1.0 makes a whole file the test split)."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        MathEnv(source=str(path), split="train", test_fraction=1.0)


def test_an_empty_eval_split_is_refused_when_the_config_is_resolved(tmp_path):
    path = _write(tmp_path / "two.jsonl", ROWS[:2])
    assert all(hash_split(r["question"], 0.1) == "train" for r in ROWS[:2])
    with pytest.raises(ConfigError, match=re.escape("env (with eval.split='test'): ") + ".*none of its 2 items"):
        resolve(["env=math", "policy=mock", f"env.source={path}"])
    resolve(["env=math", "policy=mock", f"env.source={path}", "eval.split=null"])  # no evaluation split: fine


def test_a_bad_local_file_stops_lrmgym_run_with_one_line_and_writes_nothing(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "a", "answer": "1"}\n{"question": "b", "answer": null}\n')
    out = tmp_path / "runs"
    result = CliRunner().invoke(cli, ["run", "env=math", f"env.source={bad}", "policy=mock", f"run.output_dir={out}"])
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"Error: env: {bad}:2: field 'answer' is null; expected text (or a number). "
        "Give every row its gold answer, or drop the row.\n"
    )
    assert not out.exists()
