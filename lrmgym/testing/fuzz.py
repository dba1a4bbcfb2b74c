"""The pieces of a verifier fuzz harness: a target, one timed call, and the timer.

Shared by the property tests of the math verifier and the 24 checker and by ``benchmarks/fuzz_verifiers.py``;
usable for a plug-in env's verifier too (with any hypothesis strategy as ``Target.strategy``).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = ["Call", "Target", "timed"]


class Call(NamedTuple):
    """One timed call: wall and thread-CPU seconds, and what kind of verdict it gave."""

    wall_s: float
    cpu_s: float
    outcome: str


@dataclass(frozen=True)
class Target:
    """A fuzz target: inputs, the check of one input (raises on a crash or a malformed verdict), its bound."""

    name: str
    strategy: Any  # a hypothesis SearchStrategy
    check: Callable[[Any], Call]
    bound_s: float
    hostile: tuple = ()


def timed(fn: Callable[[], Any], pause_gc: bool = False) -> tuple[Any, float, float]:
    """``fn()`` with its wall and thread-CPU seconds; ``pause_gc``: the collector's pauses are not the call's."""
    enabled = pause_gc and gc.isenabled()
    if enabled:
        gc.disable()
    try:
        wall, cpu = time.perf_counter(), time.thread_time()
        result = fn()
        return result, time.perf_counter() - wall, time.thread_time() - cpu
    finally:
        if enabled:
            gc.enable()
