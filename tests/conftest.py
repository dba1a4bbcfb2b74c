"""Shared fixtures. Tests that need the real data sets in ../shared/data skip cleanly when it is absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    """Where the real data sets live: $LRMGYM_SHARED_DATA, else ../shared/data beside the checkout."""
    return Path(os.environ.get("LRMGYM_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared data folder; the test is skipped when it is absent (a user's fresh clone)."""
    path = shared_data_dir()
    if not path.is_dir():
        pytest.skip(f"shared data not found at {path} (set LRMGYM_SHARED_DATA to run this test)")
    return path


def pytest_collection_modifyitems(config, items):
    if config.getoption("-m"):
        return
    skip_slow = pytest.mark.skip(reason="slow: run with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)
