"""Which processes a command left behind, read from ``/proc`` (Linux): for tests and benchmarks of servers.

A process is named by ``(pid, start time)`` so that a pid the kernel reused for a new process is not mistaken
for the old one.
"""

from __future__ import annotations

import os

__all__ = ["alive", "descendants", "proc_table"]


def proc_table() -> dict[int, tuple[int, int, bool]]:
    """``pid -> (parent pid, start time in clock ticks, zombie)`` of every readable process."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        table[int(entry)] = (int(fields[1]), int(fields[19]), fields[0] == b"Z")
    return table


def descendants(root: int) -> set[tuple[int, int]]:
    """``(pid, start)`` of every live descendant of ``root`` (not ``root`` itself)."""
    table = proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = set(), list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid in table and not table[pid][2]:
            out.add((pid, table[pid][1]))
        todo += children.get(pid, [])
    return out


def alive(procs: set[tuple[int, int]]) -> set[tuple[int, int]]:
    """The processes of ``procs`` that still run (same pid and start time, not a zombie)."""
    table = proc_table()
    return {(pid, start) for pid, start in procs if pid in table and table[pid][1] == start and not table[pid][2]}
