"""The "nothing left behind" checks of the code-env tests can fail, for root and for anyone else.

Each test leaves something behind itself, outside any sandbox but placed as an escape would be, and checks that
:func:`code_helpers.leftovers` or :func:`code_helpers.files_left` reports it, and that what a pool keeps by design
(its idle spares and their work dirs, the caller's own children) is not reported. The ``caller_uid`` mode, what
a caller who is not root gets, is forced here so that a root run exercises it too: it looks at the caller's own
uid, which is what this test's planted processes and files belong to. (As root the machine's other root
processes and files may show up as well, so these tests check membership, not an empty list.)
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from code_helpers import all_spare_pids, files_left, leftovers, proc_table, scratch_snapshot, uid_mode

from lrmgym.envs.code.sandbox import Job

TOKEN = uuid.uuid4().hex[:10]
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="dedicated slot uids exist only when the caller is root")
DETACH = (
    "import subprocess, sys\n"
    "p = subprocess.Popen(sys.argv[1:], start_new_session=True, stdin=subprocess.DEVNULL,\n"
    "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
    "print(p.pid)\n"
)


def _job() -> Job:
    return Job(code="x = 1\n", units=({"src": "assert x == 1", "test": True},))


def _escapee(*argv: str) -> int:
    """Start ``argv`` as an escapee ends up: in a session of its own, its parent gone (reparented away)."""
    return int(subprocess.run([sys.executable, "-c", DETACH, *argv], capture_output=True, check=True).stdout)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _until_absent(pid: int, find, wait_s: float = 5.0) -> bool:
    """Whether ``pid`` drops out of ``find()`` within ``wait_s`` (it was killed: reaped by whoever adopted it)."""
    deadline = time.monotonic() + wait_s
    while pid in find():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_the_mode_follows_the_caller(auto_pool):
    assert uid_mode(auto_pool) == ("slot_uids" if os.geteuid() == 0 else "caller_uid")


def test_caller_uid_mode_reports_a_process_that_outlived_its_parents(auto_pool):
    pid = _escapee("sleep", "60")
    try:
        assert proc_table()[pid].ppid != os.getpid()  # not ours any more: only history and cgroup tell
        assert pid in leftovers(auto_pool, wait_s=0.2, mode="caller_uid")
    finally:
        _kill(pid)
    assert _until_absent(pid, lambda: leftovers(auto_pool, wait_s=0, mode="caller_uid"))


def test_caller_uid_mode_reports_a_session_still_in_the_callers_tree_but_not_a_spare(auto_pool):
    auto_pool.run(_job())  # the pool keeps an idle spare: a session of the caller's uid in its tree, by design
    plain = subprocess.Popen(["sleep", "60"])  # the caller's own child, in its session: not a sandbox
    undisposed = subprocess.Popen(["sleep", "60"], start_new_session=True)  # as a sandbox nobody killed
    try:
        found = leftovers(auto_pool, wait_s=0.2, mode="caller_uid")
        assert undisposed.pid in found
        assert plain.pid not in found
        assert not set(found) & all_spare_pids()
    finally:
        for p in (plain, undisposed):
            p.kill()
            p.wait()
    assert undisposed.pid not in leftovers(auto_pool, wait_s=0, mode="caller_uid")


@ROOT_ONLY
def test_slot_uid_mode_reports_a_process_of_a_slot_uid(auto_pool):
    uid = auto_pool.slot_uids()[0]
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("util-linux setpriv is not installed")
    pid = _escapee(setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sleep", "60")
    try:
        assert pid in leftovers(auto_pool, wait_s=0.2, mode="slot_uids")
    finally:
        _kill(pid)
    assert _until_absent(pid, lambda: leftovers(auto_pool, wait_s=0, mode="slot_uids"))


def test_caller_uid_mode_reports_new_files_but_not_a_spares_work_dir(unshare_pool):
    before = scratch_snapshot()
    unshare_pool.run(_job())  # starts the slot's next spare, with a fresh host work dir
    planted = [Path(f"/tmp/lrm_left_{TOKEN}"), Path(f"/dev/shm/lrm_left_{TOKEN}")]
    folder = Path(f"/var/tmp/lrm_left_dir_{TOKEN}")
    try:
        for path in planted:
            path.write_text("x")
        folder.mkdir()
        (folder / "inner").write_text("x")
        found = files_left(unshare_pool, before, mode="caller_uid")
        assert {*map(str, planted), str(folder), str(folder / "inner")} <= set(found)
        assert not [p for p in found if "lrmgym-sbx" in p], found  # the spares' work dirs are expected
    finally:
        for path in planted:
            path.unlink(missing_ok=True)
        shutil.rmtree(folder, ignore_errors=True)
    assert not set(files_left(unshare_pool, before, mode="caller_uid")) & {*map(str, planted), str(folder)}


@ROOT_ONLY
def test_slot_uid_mode_reports_a_file_of_a_slot_uid_only(auto_pool):
    before = scratch_snapshot()
    theirs, ours = Path(f"/tmp/lrm_left_slot_{TOKEN}"), Path(f"/tmp/lrm_left_root_{TOKEN}")
    try:
        theirs.write_text("x")
        os.chown(theirs, auto_pool.slot_uids()[-1], auto_pool.slot_uids()[-1])
        ours.write_text("x")
        found = files_left(auto_pool, before, mode="slot_uids")
        assert str(theirs) in found and str(ours) not in found
    finally:
        theirs.unlink(missing_ok=True)
        ours.unlink(missing_ok=True)
