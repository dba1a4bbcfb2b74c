"""Sandbox pools shared by the code-env tests (one per backend, started once per session).

Which backend ``auto`` gets is whatever this machine has: bubblewrap, else the unshare fallback. With
``LRMGYM_TEST_NO_BWRAP=1`` in the environment, bubblewrap is taken off ``PATH`` for the whole test process (as
on a machine without it), so that ``auto`` and every env built with ``sandbox="auto"`` run on the unshare
fallback and the bwrap-only tests skip: CI runs ``tests/envs/code`` once each way.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from code_helpers import BATTERY_TIMEOUT_S

from lrmgym.envs.code.sandbox import Limits, SandboxError, SandboxPool

NO_BWRAP = os.environ.get("LRMGYM_TEST_NO_BWRAP", "") not in ("", "0")


def hide_from_path(tool: str) -> None:
    """Replace each ``PATH`` folder that holds ``tool`` by a folder of links to everything else in it."""
    mirrors = Path(tempfile.mkdtemp(prefix=f"lrmgym-no-{tool}-"))
    atexit.register(shutil.rmtree, mirrors, ignore_errors=True)
    folders = []
    for i, folder in enumerate(os.environ.get("PATH", "").split(os.pathsep)):
        if folder and (Path(folder) / tool).exists():
            mirror = mirrors / str(i)
            mirror.mkdir()
            for entry in Path(folder).iterdir():
                if entry.name != tool:
                    (mirror / entry.name).symlink_to(entry)
            folder = str(mirror)
        folders.append(folder)
    os.environ["PATH"] = os.pathsep.join(folders)
    if shutil.which(tool) is not None:
        raise RuntimeError(f"{tool} is still on PATH: {shutil.which(tool)}")


if NO_BWRAP:
    hide_from_path("bwrap")


def _pool(backend: str, timeout_s: float = BATTERY_TIMEOUT_S) -> SandboxPool:
    if backend == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")
    if backend == "unshare" and shutil.which("unshare") is None:
        pytest.skip("util-linux unshare is not installed")
    try:
        pool = SandboxPool(backend, workers=2, limits=Limits(timeout_s=timeout_s))
    except SandboxError as err:
        pytest.skip(f"the {backend} sandbox cannot start here: {err}")
    if NO_BWRAP and pool.backend == "bwrap":
        pool.close()
        pytest.fail("LRMGYM_TEST_NO_BWRAP is set but the pool got bubblewrap")
    return pool


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
