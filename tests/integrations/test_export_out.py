"""`lrmgym export openrlhf|verl out=DIR`: any relative DIR works; the folder a shell stands in, a run folder or a
folder of runs is never replaced, --force or not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from lrmgym.cli.main import cli

TOKENS = ("env=math", "learner=grpo_hf", "policy=hf", "policy.model=Qwen/Qwen2.5-1.5B-Instruct", "learner.steps=2",
          "learner.prompts_per_step=4", "eval.tasks=3", "backend.gpus_per_node=2")  # fmt: skip


def _export(*args: str):
    return CliRunner().invoke(cli, ["export", "openrlhf", *TOKENS, *args])


def _one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


@pytest.mark.parametrize("out", ["orl/", "orl", "exports/orl", "./orl"])
def test_the_readmes_relative_out_works(tmp_path, monkeypatch, out):
    monkeypatch.chdir(tmp_path)
    result = _export(f"out={out}")
    assert result.exit_code == 0, result.output
    folder = tmp_path / out
    assert len((folder / "train.jsonl").read_text().splitlines()) == 8
    record = json.loads((folder / "export.json").read_text())
    assert record["cwd"] == str(folder.resolve())
    assert f"--data.prompt_dataset {folder.resolve() / 'train.jsonl'}" in " ".join(record["command"])
    left = [p.name for p in folder.resolve().parent.iterdir() if p.name.startswith(".")]
    assert left == []  # no temporary sibling


@pytest.mark.parametrize("out", [".", "./", "..", "/"])
@pytest.mark.parametrize("force", [[], ["--force"]])
def test_the_current_folder_or_one_above_it_is_never_the_export_folder(tmp_path, monkeypatch, out, force):
    work = tmp_path / "project"
    work.mkdir()
    (work / "notes.txt").write_text("mine")
    monkeypatch.chdir(work)
    line = _one_error_line(_export(f"out={out}", *force))
    assert "is the current folder or holds it" in line and "give a new folder, e.g. out=exports/" in line
    assert sorted(p.name for p in work.iterdir()) == ["notes.txt"] and (work / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project"]


def _run(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("env: {id: lrmgym/Math-v0}\n")
    (folder / "metrics.jsonl").write_text('{"step": 1}\n')
    (folder / "run.json").write_text("{}\n")
    return folder


@pytest.mark.parametrize("kind", ["openrlhf", "verl"])
def test_force_never_replaces_a_run_or_a_folder_of_runs(tmp_path, kind):
    runs = tmp_path / "runs"
    run = _run(runs / "math-grpo")
    for out, says in ((run, f"'{run}' is a run folder"), (runs, f"'{runs}' holds the run folder '{run}'")):
        args = ["export", kind, "env=math", f"out={out}", "--force"]
        line = _one_error_line(CliRunner().invoke(cli, [*args] if kind == "verl" else [*args[:2], *TOKENS, *args[3:]]))
        assert says in line and "never replaced, --force or not" in line, line
        assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n'
    # A new export folder inside a run folder: only with --force.
    line = _one_error_line(_export(f"out={run / 'orl'}"))
    assert f"lies in the run folder '{run}'" in line
    assert not (run / "orl").exists()


def test_force_still_replaces_an_earlier_export(tmp_path):
    out = tmp_path / "orl"
    assert _export(f"out={out}").exit_code == 0
    assert "exists and is not empty" in _one_error_line(_export(f"out={out}"))
    again = _export(f"out={out}", "--force")
    assert again.exit_code == 0, again.output
