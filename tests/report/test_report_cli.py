"""`lrmgym report`: where the page goes, and one clear error line for every input it cannot read."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from report_helpers import copy_run

from lrmgym.cli.main import cli

_EXPECTED = "a run directory made by `lrmgym run` (metrics.jsonl, summary.json, config.yaml)"


def _report(*args: str):
    return CliRunner().invoke(cli, ["report", *args])


def _error(result, exit_code: int = 2) -> str:
    assert result.exit_code == exit_code, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


def test_the_page_goes_into_the_run_directory_or_where_out_says(make_run, tmp_path):
    run_dir = copy_run(make_run("grpo"), tmp_path / "run")
    result = _report(str(run_dir))
    assert result.exit_code == 0, result.output
    page = run_dir / "report.html"
    assert result.output.startswith(f"report: {page} (") and "24 of 24 logged trajectories embedded" in result.output
    assert page.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    out = tmp_path / "elsewhere" / "page.html"
    assert _report(str(run_dir), "--out", str(out), "--max-samples", "4").exit_code == 0
    assert "4 of 24 logged trajectories" in out.read_text(encoding="utf-8")
    assert "report" in CliRunner().invoke(cli, ["--help"]).output


def test_out_never_overwrites_the_runs_own_files(make_run, tmp_path):
    run_dir = copy_run(make_run("grpo"), tmp_path / "run")
    before = (run_dir / "summary.json").read_bytes()
    line = _error(_report(str(run_dir), "--out", str(run_dir / "summary.json")))
    assert line == (
        f"Error: --out {str(run_dir / 'summary.json')!r} is the input file {str(run_dir / 'summary.json')!r}; "
        "writing it would destroy the input. Give another output path."
    )
    assert (run_dir / "summary.json").read_bytes() == before
    assert "is a directory" in _error(_report(str(run_dir), "--out", str(run_dir)))


def _torn(run_dir, name: str):
    """Cut the last line of ``run_dir/name`` in half (no newline): a SIGKILL mid-write."""
    path = run_dir / name
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1 - len(data.splitlines()[-1]) // 2])
    return run_dir, path


_TORN = (
    "Error: {path}: line {line} is incomplete (no newline at its end: cut off by a crash, or still being written); "
    "expected complete JSON lines. Wait for the run to finish, or resume it with `lrmgym run --resume`, which drops "
    "a torn last line."
)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: (d / "nope",) * 2, "Error: {path}: no such directory; expected " + _EXPECTED + "."),
        (lambda d: (d / "summary.json",) * 2, "Error: {path} is a file; expected " + _EXPECTED + "."),
        (
            lambda d: (d / "eval" / "step_0",) * 2,
            "Error: {path} holds an evaluation (eval.json, made by `lrmgym eval`), not a training run; expected "
            + _EXPECTED
            + ".",
        ),
        (
            lambda d: (d / "plots",) * 2,
            "Error: {path} is not a run directory: it has no metrics.jsonl (nor stages/); expected " + _EXPECTED + ".",
        ),
        (lambda d: _torn(d, "metrics.jsonl"), _TORN.replace("{line}", "3")),
        (lambda d: _torn(d, "samples.jsonl"), _TORN.replace("{line}", "6")),
    ],
    ids=["missing", "a-file", "an-eval", "no-metrics", "torn-metrics", "torn-samples"],
)
def test_bad_input_is_one_line_naming_the_path_and_what_was_expected(make_run, tmp_path, damage, message):
    run_dir = copy_run(make_run("grpo"), tmp_path / "run")
    arg, named = damage(run_dir)
    assert _error(_report(str(arg))) == message.format(path=named)
    assert not (run_dir / "report.html").exists()


def test_garbled_files_name_the_file_and_the_line(make_run, tmp_path):
    run_dir = copy_run(make_run("grpo"), tmp_path / "run")
    metrics = run_dir / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    metrics.write_text(lines[0] + "{oops\n" + "".join(lines[2:]))
    assert _error(_report(str(run_dir))) == (
        f"Error: {metrics}: line 2 is not JSON (Expecting property name enclosed in double quotes); expected one "
        "JSON object per line."
    )
    metrics.write_text(lines[0] + "[1, 2]\n")
    assert _error(_report(str(run_dir))) == f"Error: {metrics}: line 2 is a JSON list, expected a JSON object per line."
    metrics.write_text("".join(lines))
    (run_dir / "summary.json").write_text("{")
    assert _error(_report(str(run_dir))) == (
        f"Error: {run_dir / 'summary.json'}: not valid JSON (Expecting property name enclosed in double quotes, "
        "line 1); expected the summary a run writes when it ends."
    )
    (run_dir / "summary.json").unlink()
    (run_dir / "config.yaml").write_text("env: [unclosed\n")
    line = _error(_report(str(run_dir)))
    assert line.startswith(f"Error: {run_dir / 'config.yaml'}: not valid YAML (") and line.endswith(
        "); expected the resolved config `lrmgym run` saves."
    )


def test_a_stages_folder_without_stages_is_named(tmp_path):
    (tmp_path / "stages").mkdir()
    assert _error(_report(str(tmp_path))) == (
        f"Error: {tmp_path / 'stages'} holds no stage folders; expected stages/NN-name/ folders of a staged run."
    )
