"""env=rg from the command line: `lrmgym envs sample rg ...`, `lrmgym run env=rg ...` and the README's block."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("reasoning_gym")

from lrmgym.cli.main import cli  # noqa: E402

README = Path(__file__).resolve().parents[3] / "README.md"
SMALL_RUN = (
    "learner.steps=2", "learner.prompts_per_step=2", "learner.group_size=2", "learner.max_new_tokens=8",
    "learner.progress=false", "learner.eval_before_after=false", "learner.async_rollouts=false",
)  # fmt: skip


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_envs_sample_rg():
    done = invoke("envs", "sample", "rg", "task=countdown", "min_numbers=3", "max_numbers=3", "-n", "2", "--json")
    assert done.exit_code == 0, done.output
    rows = [json.loads(line) for line in done.output.splitlines()]
    assert len(rows) == 2 and all(r["id"].startswith("rg/countdown/train/") for r in rows)
    assert all(len(r["metadata"]["rg_metadata"]["numbers"]) == 3 for r in rows)
    assert all("<answer>" in r["prompt"] for r in rows)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("envs", "sample", "rg", "task=countdwn"), "unknown reasoning-gym task 'countdwn'. Did you mean countdown"),
        (("envs", "sample", "rg", "task=countdown", "min_numbrs=3"), "'min_numbrs' is neither an option of env=rg"),
        (
            ("config", "show", "env=rg", "env.timout_s=3"),
            "a knob of reasoning-gym task 'basic_arithmetic'. Did you mean",
        ),
        (("envs", "sample", "rg", "task=countdown", "level=99"), "env.level=99 is out of range for 'countdown'"),
        (("config", "show", "env=rg", "env.task=countdwn"), "unknown reasoning-gym task 'countdwn'. Did you mean"),
    ],
)
def test_user_mistakes_are_one_line_and_exit_2(args, expected):
    done = invoke(*args)
    assert done.exit_code == 2, done.output
    lines = done.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and expected in lines[0], done.output


def _readme_block() -> list[str]:
    blocks = re.findall(r"^```\w*\n(.*?)^```$", README.read_text(encoding="utf-8"), re.M | re.S)
    found = [b for b in blocks if b.strip().startswith("lrmgym envs sample rg ")]
    assert len(found) == 1
    return [line for line in found[0].strip().splitlines() if line.strip()]


@pytest.mark.timeout(300)
def test_readme_rg_block(tmp_path):
    """The README's block: `envs sample rg`, then `lrmgym run env=rg ...` on the tiny model with two small steps."""
    sample, run = (shlex.split(line, comments=True) for line in _readme_block())
    assert sample[:3] == ["lrmgym", "envs", "sample"] and run[:2] == ["lrmgym", "run"]
    done = invoke(*sample[1:])
    assert done.exit_code == 0 and done.output.startswith("--- rg/countdown/train/"), done.output
    assert "(difficulty: 2)" in done.output.splitlines()[0]
    # The run as written trains for minutes: the same command, two small steps.
    done = invoke(*run[1:], *SMALL_RUN, f"run.output_dir={tmp_path}", "run.name=x")
    assert done.exit_code == 0, done.output
    config = (tmp_path / "x" / "config.yaml").read_text()
    assert "level_every: 64" in config and "task: chain_sum" in config
