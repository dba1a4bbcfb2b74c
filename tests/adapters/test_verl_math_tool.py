"""env=math_tool and verl: refused with the reason (its reward function sees tool output as the policy's text)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from lrmgym.adapters import verl
from lrmgym.cli.main import cli
from lrmgym.configs.errors import ConfigError
from lrmgym.configs.resolve import resolve


def test_tool_envs_are_refused_with_why_verl_cannot_grade_them(tmp_path):
    with pytest.raises(ConfigError, match=r"^env: lrmgym/MathTool-v0 calls tools between policy turns; .* tool "
                       r"responses included .*`lrmgym export openrlhf`"):  # fmt: skip
        verl.export_verl(resolve(["env=math_tool"]), tmp_path / "t", n_train=2, n_test=1)
    done = CliRunner().invoke(cli, ["export", "verl", "env=math_tool", f"out={tmp_path / 'u'}"])
    assert done.exit_code == 2 and "calls tools between policy turns" in done.output
    assert list(tmp_path.iterdir()) == []
