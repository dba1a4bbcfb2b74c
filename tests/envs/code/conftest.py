"""Sandbox pools shared by the code-env tests (one per backend, started once per session)."""

from __future__ import annotations

import shutil

import pytest
from code_helpers import BATTERY_TIMEOUT_S

from lrmgym.envs.code.sandbox import Limits, SandboxError, SandboxPool


def _pool(backend: str, timeout_s: float = BATTERY_TIMEOUT_S) -> SandboxPool:
    if backend == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")
    if backend == "unshare" and shutil.which("unshare") is None:
        pytest.skip("util-linux unshare is not installed")
    try:
        return SandboxPool(backend, workers=2, limits=Limits(timeout_s=timeout_s))
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


@pytest.fixture(scope="session")
def auto_pool():
    """Whatever isolation this machine has (bwrap, else the unshare fallback); skips when neither works.

    A generous timeout: reference solutions must not fail for the load of a shared 2-core machine.
    """
    pool = _pool("auto", timeout_s=20.0)
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def sandbox_available(auto_pool):
    """Skip a test when this machine can run no sandbox at all (no bwrap, no user namespaces)."""
    return auto_pool.backend


@pytest.fixture(params=["bwrap", "unshare"], scope="session")
def any_pool(request):
    """The namespaced backends: bubblewrap and the unshare fallback."""
    return request.getfixturevalue(f"{request.param}_pool")
