"""Sandbox pools shared by the code-env tests (one per backend, started once per session)."""

from __future__ import annotations

import shutil

import pytest
from code_helpers import BATTERY_TIMEOUT_S

from lrmgym.envs.code.sandbox import Limits, SandboxError, SandboxPool


def _pool(backend: str) -> SandboxPool:
    if backend == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")
    if backend == "unshare" and shutil.which("unshare") is None:
        pytest.skip("util-linux unshare is not installed")
    try:
        return SandboxPool(backend, workers=2, limits=Limits(timeout_s=BATTERY_TIMEOUT_S))
    except SandboxError as err:
        pytest.skip(f"the {backend} sandbox cannot start here: {err}")


@pytest.fixture(scope="session")
def bwrap_pool():
    pool = _pool("bwrap")
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def unshare_pool():
    pool = _pool("unshare")
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def process_pool():
    pool = _pool("process")
    yield pool
    pool.close()


@pytest.fixture(params=["bwrap", "unshare"], scope="session")
def any_pool(request):
    """The namespaced backends: bubblewrap and the unshare fallback."""
    return request.getfixturevalue(f"{request.param}_pool")
