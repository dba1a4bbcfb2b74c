"""Every learner module stays readable: at most 400 lines (issue 38 item 7)."""

from __future__ import annotations

from pathlib import Path

import pytest

LEARNERS = Path(__file__).resolve().parents[1] / "lrmgym" / "learners"
MAX_LINES = 400


def _learner_files() -> list[Path]:
    return sorted(LEARNERS.rglob("*.py"))


def test_the_learner_package_has_modules_to_check():
    names = {p.relative_to(LEARNERS).as_posix() for p in _learner_files()}
    assert {"algorithms/grpo.py", "algorithms/reason_maxxer.py", "engine/loop.py", "engine/update.py"} <= names


@pytest.mark.parametrize("path", _learner_files(), ids=lambda p: p.relative_to(LEARNERS).as_posix())
def test_every_learner_file_is_at_most_400_lines(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(LEARNERS)} has {lines} lines; split it (<= {MAX_LINES})."
