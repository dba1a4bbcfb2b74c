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


def _judge(src: Path, out: Path | str, *extra: str) -> object:
    return CliRunner().invoke(cli, ["judge", "--input", str(src), "--output", str(out), *extra, "judge=format_strict"])


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
    # A new path is fine, and an existing regular file (not the input) with --force.
    assert _judge(src, tmp_path / "new" / "out.jsonl").exit_code == 0
    assert _judge(src, tmp_path / "new" / "out.jsonl", "--force").exit_code == 0


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


# ------------------------------------------------------------------------------ outputs over results, into runs
def _group(step: int) -> dict:
    verdict = {"score": 1.0, "correct": True, "parsed": "2", "reason": "r", "components": [], "latency_s": 0.0}
    traj = {"turns": [{"role": "policy", "text": "2"}], "reward": 1.0, "advantage": 0.0, "verdict": verdict}
    return {"step": step, "task_id": "t/1", "prompt": "Q:1+1. A:", "answer": "2", "trajectories": [traj, traj]}


RUN_FILES = {
    "config.yaml": "env: {id: lrmgym/Math-v0}\n",
    "run.json": '{"config": {}}\n',
    "metrics.jsonl": '{"step": 1}\n',
    "samples.jsonl": json.dumps(_group(1)) + "\n",
    "summary.json": '{"status": "finished"}\n',
}


def _run_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    for name, text in RUN_FILES.items():
        (path / name).write_text(text)
    (path / "checkpoints").mkdir()
    (path / "checkpoints" / "step_000001.pt").write_bytes(b"weights")
    return path


def _unchanged(run: Path) -> None:
    for name, text in RUN_FILES.items():
        assert (run / name).read_text() == text, name
    assert (run / "checkpoints" / "step_000001.pt").read_bytes() == b"weights"


def _export(run: Path, *args: str):
    return CliRunner().invoke(cli, ["export", "traces", str(run), *args])


@pytest.mark.parametrize("force", [[], ["--force"]])
@pytest.mark.parametrize(
    "flag, name", [("--out", "metrics.jsonl"), ("--pairs", "config.yaml"), ("--out", "run.json"),
                   ("--pairs", "summary.json"), ("--out", "checkpoints/step_000001.pt")],
)  # fmt: skip
def test_export_traces_never_writes_over_a_runs_own_files(tmp_path, flag, name, force):
    run = _run_folder(tmp_path / "run")
    line = _one_error_line(_export(run, flag, str(run / name), *force))
    assert line == (
        f"Error: {flag} '{run / name}' is a file of the run in '{run}'; no command writes over a run's own files, "
        "--force or not: give a path outside that folder."
    )
    _unchanged(run)


def test_writing_into_a_run_folder_needs_force_and_existing_results_are_kept_without_it(tmp_path):
    run = _run_folder(tmp_path / "run")
    # The default output, RUN/traces.jsonl, is export's own file in the run folder: written once ...
    assert _export(run).exit_code == 0
    first = (run / "traces.jsonl").read_text()
    # ... and not again over itself without --force.
    line = _one_error_line(_export(run))
    assert (
        line == f"Error: --out '{run / 'traces.jsonl'}' already exists; pass --force to replace it, or give a new path."
    )
    assert _export(run, "--force").exit_code == 0 and (run / "traces.jsonl").read_text() == first
    # Another file into the run folder (here the pairs): only with --force.
    line = _one_error_line(_export(run, "--out", str(tmp_path / "t.jsonl"), "--pairs", str(run / "pairs.jsonl")))
    assert line == (
        f"Error: --pairs '{run / 'pairs.jsonl'}' lies in the run folder '{run}', whose files are the run's; give a "
        "path outside it, or pass --force to add this file there."
    )
    assert not (run / "pairs.jsonl").exists() and not (tmp_path / "t.jsonl").exists()  # nothing written
    forced = _export(run, "--out", str(tmp_path / "t.jsonl"), "--pairs", str(run / "pairs.jsonl"), "--force")
    assert forced.exit_code == 0, forced.output
    assert (run / "pairs.jsonl").exists()
    _unchanged(run)


def test_judge_keeps_an_existing_output_unless_forced(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(ROW)
    out = tmp_path / "verdicts.jsonl"
    out.write_text("earlier verdicts\n")
    line = _one_error_line(_judge(src, out))
    assert line == f"Error: --output '{out}' already exists; pass --force to replace it, or give a new path."
    assert out.read_text() == "earlier verdicts\n"
    forced = _judge(src, out, "--force")
    assert forced.exit_code == 0, forced.output
    assert json.loads(out.read_text().splitlines()[0])["verdict"]["score"] == 1.0
    run = _run_folder(tmp_path / "run")
    assert "is a file of the run" in _one_error_line(_judge(src, run / "samples.jsonl"))
    _unchanged(run)


def test_report_keeps_an_existing_page_unless_forced_and_never_replaces_a_run_file(tmp_path):
    from lrmgym.learners.engine.rundir import JsonlLog

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("env: {id: lrmgym/Math-v0}\nlearner: {kind: grpo}\n")
    JsonlLog(run / "metrics.jsonl").append({"step": 1, "reward/mean": 0.5})
    first = CliRunner().invoke(cli, ["report", str(run)])
    assert first.exit_code == 0, first.output
    page = (run / "report.html").read_bytes()
    line = _one_error_line(CliRunner().invoke(cli, ["report", str(run)]))
    assert (
        line == f"Error: --out '{run / 'report.html'}' already exists; pass --force to replace it, or give a new path."
    )
    assert CliRunner().invoke(cli, ["report", str(run), "--force"]).exit_code == 0
    assert (run / "report.html").read_bytes() == page
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "step_000001.pt").write_bytes(b"weights")
    for name in ("config.yaml", "metrics.jsonl", "checkpoints/step_000001.pt"):
        before = (run / name).read_bytes()
        line = _one_error_line(CliRunner().invoke(cli, ["report", str(run), "--out", str(run / name), "--force"]))
        assert "is a file of the run" in line or "is the input file" in line
        assert (run / name).read_bytes() == before


def test_analyze_shift_keeps_an_existing_result_and_stays_out_of_run_folders(tmp_path):
    def shift(out: Path, *extra: str):
        args = ["analyze", "shift", "--base", "tiny", "--rl", "tiny", "--tasks", "1", "--out", str(out), *extra]
        return CliRunner().invoke(cli, [*args, "env=math"])

    done = tmp_path / "shift"
    done.mkdir()
    (done / "shift.json").write_text('{"earlier": true}\n')
    line = _one_error_line(shift(done))
    assert line == (f"Error: --out '{done / 'shift.json'}' already exists; pass --force to replace it, or give a "
                    "new path.")  # fmt: skip
    assert (done / "shift.json").read_text() == '{"earlier": true}\n'
    run = _run_folder(tmp_path / "run")
    line = _one_error_line(shift(run))
    assert line.startswith(f"Error: --out '{run / 'shift.json'}' lies in the run folder '{run}'")
    assert not (run / "shift.json").exists()
    _unchanged(run)


def test_read_only_commands_work_on_a_run_another_process_trains_in(tmp_path):
    """`report` and `export traces` read a live run (locked by its trainer) and write only their own files."""
    import subprocess
    import sys

    run = _run_folder(tmp_path / "run")
    hold = (
        "import sys; from lrmgym.learners.engine.rundir import lock_run_dir\n"
        "with lock_run_dir(sys.argv[1]):\n    print('locked', flush=True); sys.stdin.read()\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    trainer = subprocess.Popen([sys.executable, "-c", hold, str(run)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               env=env, text=True)  # fmt: skip
    try:
        assert trainer.stdout.readline() == "locked\n"
        exported = _export(run)
        assert exported.exit_code == 0, exported.output
        reported = CliRunner().invoke(cli, ["report", str(run)])
        assert reported.exit_code == 0, reported.output
        assert (run / "traces.jsonl").is_file() and (run / "report.html").is_file()
        assert (run / "run.lock").read_text().strip() == str(trainer.pid)  # the trainer still holds its run
    finally:
        trainer.stdin.close()
        trainer.wait(timeout=30)
    _unchanged(run)


@pytest.mark.parametrize("command", ["run", "eval"])
def test_run_and_eval_never_make_their_folder_inside_a_run_folder(tmp_path, command):
    run = _run_folder(tmp_path / "run")
    for output_dir in (run, run / "evals"):
        result = CliRunner().invoke(cli, [command, "env=echo", "policy=mock", f"run.output_dir={output_dir}"])
        line = _one_error_line(result)
        assert line == (
            f"Error: run.output_dir {str(output_dir)!r} lies in the run folder '{run}', whose files are the run's; "
            "give an output folder outside it."
        )
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", *sorted(RUN_FILES)]
    _unchanged(run)
