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


def _pool_fixture(backend: str, timeout_s: float = BATTERY_TIMEOUT_S):
    @pytest.fixture(scope="session", name=f"{backend}_pool")
    def fixture():
        pool = _pool(backend, timeout_s)
        yield pool
        pool.close()

    return fixture


bwrap_pool = _pool_fixture("bwrap")
unshare_pool = _pool_fixture("unshare")
process_pool = _pool_fixture("process")
auto_pool = _pool_fixture("auto", timeout_s=20.0)
"""Whatever isolation this machine has (bwrap, else the unshare fallback); skips when neither works. A generous
timeout: reference solutions must not fail for the load of a shared 2-core machine."""


@pytest.fixture(scope="session")
def sandbox_available(auto_pool):
    """Skip a test when this machine can run no sandbox at all (no bwrap, no user namespaces)."""
    return auto_pool.backend
