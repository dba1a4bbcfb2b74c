"""Helpers shared by the code-env tests (a module, not conftest, so that imports are unambiguous).

"Nothing left behind": :func:`leftovers` finds the processes and :func:`files_left` the files that a finished
sandbox job left on the host. Both work for any caller, in one of two modes (:func:`uid_mode` picks it from
the pool; a test may force one):

- ``"slot_uids"`` (the caller is root, so every slot of the pool runs as a dedicated uid): anything owned by
  a slot uid is the sandbox's, wherever it is; only the pool's idle spare sandboxes are expected.
- ``"caller_uid"`` (anyone else: the sandboxes run as the caller's own uid, among the caller's own processes
  and files): told apart by history and ancestry instead. A process of the caller's uid that started during
  this test session, in the caller's cgroup, but is no longer in the caller's process tree has outlived its
  sandbox (when a sandbox is killed, whatever escaped it is reparented away from the caller); one still in the
  caller's tree but in a session other than the caller's is a sandbox nobody tore down, unless it is a live
  pool's idle spare. A file is one that appeared in the shared scratch folders since a snapshot taken before
  the job.

Call them when no job is in flight (a running sandbox is a process the caller did not expect).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lrmgym.envs.code import sandbox
from lrmgym.envs.code.sandbox import SandboxPool, processes_of_uid

BATTERY_TIMEOUT_S = 1.5
"""The wall-clock limit the adversarial cases run under (small, to keep the suite fast)."""

Mode = Literal["slot_uids", "caller_uid"]

SCRATCH_DIRS = tuple(dict.fromkeys(("/tmp", "/var/tmp", "/dev/shm", str(Path.cwd()))))
"""The world-writable folders, and the caller's working directory, where an escape would leave files."""


def uid_mode(pool: SandboxPool) -> Mode:
    """``"slot_uids"`` when the pool's sandboxes run as uids of their own (a root caller), else ``"caller_uid"``."""
    return "caller_uid" if pool.slot_uids() == [os.getuid()] else "slot_uids"


# ---------------------------------------------------------------------------------------------- processes
@dataclass(frozen=True)
class Proc:
    """One process as ``/proc`` shows it."""

    pid: int
    ppid: int
    sid: int
    uid: int  # real uid (``/proc/<pid>`` itself belongs to root for a non-dumpable process)
    start: int  # clock ticks after boot
    zombie: bool
    cgroup: bytes


def proc_table() -> dict[int, Proc]:
    """Every process that can be read from ``/proc`` now, by pid."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/{entry}/status", "rb") as f:
                uid_line = next(line for line in f if line.startswith(b"Uid:"))
            with open(f"/proc/{entry}/cgroup", "rb") as f:
                cgroup = f.read()
        except (OSError, StopIteration):
            continue  # exited meanwhile
        fields = stat[stat.rindex(b")") + 2 :].split()  # fields[0] is field 3 of proc(5): the state
        table[int(entry)] = Proc(
            pid=int(entry),
            ppid=int(fields[1]),
            sid=int(fields[3]),
            uid=int(uid_line.split()[1]),
            start=int(fields[19]),
            zombie=fields[0] == b"Z",
            cgroup=cgroup,
        )
    return table


def subtree(table: dict[int, Proc], root: int) -> set[int]:
    """``root`` and all its descendants in ``table``."""
    children: dict[int, list[int]] = {}
    for p in table.values():
        children.setdefault(p.ppid, []).append(p.pid)
    out, todo = set(), [root]
    while todo:
        pid = todo.pop()
        out.add(pid)
        todo += children.get(pid, [])
    return out


_BEFORE_TESTS = frozenset((p.pid, p.start) for p in proc_table().values())
"""The processes that existed when the tests began: never a leftover of theirs."""


def live_pools() -> list[SandboxPool]:
    """Every open sandbox pool of this process (the sandbox module's own registry, which ``close`` leaves)."""
    return list(sandbox._POOLS)


def all_spare_pids() -> set[int]:
    """The processes of every open pool's idle pre-started sandboxes."""
    return {pid for pool in live_pools() for pid in pool.spare_pids()}


def _slot_uid_processes(pool: SandboxPool) -> list[int]:
    pids = [p for uid in pool.slot_uids() for p in processes_of_uid(uid)]
    spares = set(pool.spare_pids())  # read after the scan: a spare's process seen there is listed here
    return [p for p in pids if p not in spares]


def _caller_uid_processes() -> list[int]:
    table = proc_table()
    spares = all_spare_pids()  # read after the scan, as above
    me = table[os.getpid()]
    ours = subtree(table, me.pid)
    found = []
    for p in table.values():
        if p.uid != os.getuid() or p.zombie or p.pid in spares:
            continue
        if p.pid in ours:
            if p.sid != me.sid:  # a sandbox session (each starts one) that is nobody's spare
                found.append(p.pid)
        elif (p.pid, p.start) not in _BEFORE_TESTS and p.cgroup == me.cgroup:
            found.append(p.pid)  # started during the tests, reparented away: it outlived its parents
    return sorted(found)


def leftovers(pool: SandboxPool, wait_s: float = 1.0, mode: Mode | None = None) -> list[int]:
    """Sandbox processes still alive after ``wait_s`` (see the module docstring for ``mode``).

    The idle pre-started sandboxes (one per slot, not yet given a job) are not leftovers: in ``"slot_uids"``
    mode those of ``pool``, in ``"caller_uid"`` mode those of every open pool (they share the caller's uid).
    """
    mode = mode or uid_mode(pool)
    deadline = time.monotonic() + wait_s
    while True:
        pids = _slot_uid_processes(pool) if mode == "slot_uids" else _caller_uid_processes()
        if not pids or time.monotonic() > deadline:
            return pids
        time.sleep(0.02)


# -------------------------------------------------------------------------------------------------- files
def scratch_snapshot(tops: Iterable[str] = SCRATCH_DIRS) -> dict[str, int]:
    """The entries of the scratch folders and of their first 200 subfolders: path -> owner uid."""
    found: dict[str, int] = {}
    for top in tops:
        for root, dirs, files in os.walk(top):
            if root == top:
                dirs[:] = dirs[:200]
                names = dirs + files
            else:
                names, dirs[:] = dirs + files, []
            for name in names:
                path = os.path.join(root, name)
                try:
                    found[path] = os.lstat(path).st_uid
                except OSError:
                    pass
    return found


def _spare_workdirs() -> list[str]:
    """Host work dirs of every open pool's idle spares (the namespaced fallback and process backends)."""
    return [box.workdir for pool in live_pools() for box in list(pool._spares.values()) if box.workdir]


def files_left(pool: SandboxPool, before: dict[str, int], mode: Mode | None = None) -> list[str]:
    """Scratch-folder entries that appeared since ``before`` (:func:`scratch_snapshot`) and are the sandbox's.

    The sandbox's: owned by a slot uid (``"slot_uids"``) or by the caller (``"caller_uid"``). The idle spares'
    own work dirs, and what is in them, are not leftovers.
    """
    mode = mode or uid_mode(pool)
    owners = set(pool.slot_uids()) if mode == "slot_uids" else {os.getuid()}
    spares = tuple(_spare_workdirs())
    return sorted(
        path
        for path, uid in scratch_snapshot().items()
        if uid in owners and path not in before and not any(path == d or path.startswith(d + os.sep) for d in spares)
    )


# A candidate that forks until RLIMIT_NPROC stops it; "ok" when the limit bound below 64 processes.
NPROC_PROBE = """
import os, time
def probe():
    kids = []
    try:
        for _ in range(500):
            pid = os.fork()
            if pid == 0:
                time.sleep(30)
                os._exit(0)
            kids.append(pid)
    except OSError:
        pass
    n = len(kids)
    for pid in kids:
        os.kill(pid, 9)
    return 'ok' if n < 64 else 'forked %d' % n
"""
