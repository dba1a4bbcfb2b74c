"""Real run directories for the report's tests: small `lrmgym run` runs of each learner, made once per session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from report_helpers import RUNS, SMALL

from lrmgym.cli.main import cli


@pytest.fixture(scope="session")
def make_run(tmp_path_factory) -> Callable[[str], Path]:
    """``make_run(learner)``: the directory of a real `lrmgym run` of that learner (made on first use, then reused).

    Treat it as read-only; copy it (``copy_run``) to change it.
    """
    root = tmp_path_factory.mktemp("runs")
    made: dict[str, Path] = {}

    def make(learner: str) -> Path:
        if learner not in made:
            args = ["run", "env=math", "policy=tiny", *SMALL, *RUNS[learner], f"run.output_dir={root}",
                    f"run.name={learner}"]  # fmt: skip
            result = CliRunner().invoke(cli, args)
            assert result.exit_code == 0, result.output
            made[learner] = root / learner
        return made[learner]

    return make
