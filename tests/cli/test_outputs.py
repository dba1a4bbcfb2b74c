"""No command loses data: outputs never overwrite their input, a device or another run; names never collide."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from lrmgym.cli import main as cli_main
from lrmgym.cli.main import cli
from lrmgym.files import OutputPathError, atomic_write, atomic_write_text, check_output_file, fresh_dir

ROW = json.dumps({"prompt": "Q:1+1. A:", "completion": "<think>2</think><answer>2</answer>"}) + "\n"


def _judge(src: Path, out: Path | str) -> object:
    return CliRunner().invoke(cli, ["judge", "--input", str(src), "--output", str(out), "judge=format_strict"])


def _one_error_line(result, exit_code: int = 2) -> str:
    assert result.exit_code == exit_code, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert lines[-1].startswith("Error: "), result.output
    return lines[-1]


def test_judge_refuses_to_write_over_its_input(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(ROW)
    line = _one_error_line(_judge(src, src))
    assert "is the input file" in line
    assert src.read_text() == ROW  # untouched
    (tmp_path / "link.jsonl").symlink_to(src)  # the same file under another name
    assert "is the input file" in _one_error_line(_judge(src, tmp_path / "link.jsonl"))
    assert "is the input file" in _one_error_line(_judge(src, tmp_path / "." / "in.jsonl"))
    assert src.read_text() == ROW


def test_judge_refuses_outputs_that_are_not_regular_files(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(ROW)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert "not a regular file" in _one_error_line(_judge(src, fifo))
    assert fifo.is_fifo()  # still a FIFO: not replaced by a regular file
    folder = tmp_path / "folder"
    folder.mkdir()
    assert "is a directory" in _one_error_line(_judge(src, folder))
    # A new path and an existing regular file (not the input) are fine.
    assert _judge(src, tmp_path / "new" / "out.jsonl").exit_code == 0
    assert _judge(src, tmp_path / "new" / "out.jsonl").exit_code == 0


@pytest.mark.parametrize("path", ["/dev/null", "/dev/full", "/proc/self/environ", "/proc/x.jsonl", "/sys/kernel/x"])
def test_device_and_kernel_paths_are_never_outputs(path):
    with pytest.raises(OutputPathError, match="lies under"):
        check_output_file(path)


def test_judge_output_under_proc_is_one_error_line(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(ROW)
    assert "lies under /dev" in _one_error_line(_judge(src, "/dev/null"))


def test_atomic_writers_of_one_path_never_share_a_temporary_file(tmp_path):
    """Two writers at once (two commands in the same second): each its own temporary file, both complete."""
    target = tmp_path / "eval.json"
    inside, release = threading.Event(), threading.Event()

    def slow(f):
        f.write(b"A" * 1000)
        inside.set()
        release.wait(10)

    first = threading.Thread(target=atomic_write, args=(target, slow))
    first.start()
    assert inside.wait(10)
    atomic_write_text(target, "B")  # while the first writer's temporary file is open
    assert target.read_text() == "B"
    release.set()
    first.join(10)
    assert target.read_bytes() == b"A" * 1000
    assert [p.name for p in tmp_path.iterdir()] == ["eval.json"]  # no temporary file left


def test_fresh_dir_makes_generated_names_unique_and_refuses_chosen_ones(tmp_path):
    a = fresh_dir(tmp_path, "eval-echo-20261201-101010", unique=True)
    b = fresh_dir(tmp_path, "eval-echo-20261201-101010", unique=True)
    assert a != b and a.is_dir() and b.is_dir() and b.name == "eval-echo-20261201-101010-2"
    with pytest.raises(OutputPathError, match="already exists"):
        fresh_dir(tmp_path, "eval-echo-20261201-101010")
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputPathError, match="is a file, not a directory"):
        fresh_dir(tmp_path / "file", "run")


def _eval_args(tmp_path: Path, *extra: str) -> list[str]:
    return ["eval", "env=echo", "policy=mock", "eval.tasks=3", f"run.output_dir={tmp_path}", *extra]


def test_eval_never_writes_into_an_existing_run(tmp_path):
    run = tmp_path / "math-run"
    run.mkdir()
    (run / "config.yaml").write_text("env: {id: lrmgym/Math-v0}\n")
    (run / "samples.jsonl").write_text('{"step": 1}\n')
    line = _one_error_line(CliRunner().invoke(cli, _eval_args(tmp_path, "run.name=math-run")))
    assert "already exists" in line and "math-run" in line
    assert (run / "config.yaml").read_text() == "env: {id: lrmgym/Math-v0}\n"
    assert (run / "samples.jsonl").read_text() == '{"step": 1}\n'


def test_two_evals_in_the_same_second_get_two_folders(tmp_path, monkeypatch):
    monkeypatch.setattr(cli_main, "_default_name", lambda cfg, command: "eval-echo-20261201-101010")
    for _ in range(2):
        result = CliRunner().invoke(cli, _eval_args(tmp_path))
        assert result.exit_code == 0, result.output
    folders = sorted(p.name for p in tmp_path.iterdir())
    assert folders == ["eval-echo-20261201-101010", "eval-echo-20261201-101010-2"]
    assert all((tmp_path / f / "eval.json").is_file() for f in folders)  # both results kept


def test_output_dir_that_is_a_file_is_one_error_line_and_creates_nothing(tmp_path):
    target = tmp_path / "runs"
    target.write_text("not a directory")
    for command in (["run", "env=echo", "policy=mock"], ["eval", "env=echo", "policy=mock"]):
        line = _one_error_line(CliRunner().invoke(cli, [*command, f"run.output_dir={target}"]))
        assert f"run.output_dir '{target}' is a file" in line
    assert target.read_text() == "not a directory"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
