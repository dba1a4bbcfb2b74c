"""Helpers shared by the code-env tests (a module, not conftest, so that imports are unambiguous)."""

from __future__ import annotations

import os
import time

from lrmgym.envs.code.sandbox import SandboxPool, processes_of_uid

BATTERY_TIMEOUT_S = 1.5
"""The wall-clock limit the adversarial cases run under (small, to keep the suite fast)."""


def leftovers(pool: SandboxPool, wait_s: float = 1.0) -> list[int]:
    """Processes still alive under the pool's sandbox uids after ``wait_s`` (root only: dedicated uids).

    The pool's idle pre-started sandboxes (one per slot, not yet given a job) are not leftovers.
    """
    if os.geteuid() != 0:
        return []
    deadline = time.monotonic() + wait_s
    while True:
        pids = [p for uid in pool.slot_uids() for p in processes_of_uid(uid)]
        spares = set(pool.spare_pids())  # read after the scan: a spare's process seen there is listed here
        pids = [p for p in pids if p not in spares]
        if not pids or time.monotonic() > deadline:
            return pids
        time.sleep(0.02)
