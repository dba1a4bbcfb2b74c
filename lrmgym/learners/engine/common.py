"""Helpers every native learner shares: optimizer, seeds, CPUs, the policy check."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from lrmgym.core import task_rng

__all__ = [
    "adamw",
    "check_adam_betas",
    "check_trainable",
    "derived_seed",
    "intra_op_threads",
    "keep_freed_memory",
    "usable_cpus",
]

_HEAP_KEPT = False


def adamw(params: list[torch.nn.Parameter], **kwargs: Any) -> torch.optim.AdamW:
    """AdamW, fused into one kernel where torch has one for these parameters (CPU and CUDA floats).

    On the tiny model a step takes 1.2 ms fused against 7.9 ms for the per-tensor loop.
    """
    devices = {p.device.type for p in params}
    if len(devices) == 1 and devices <= {"cpu", "cuda"} and all(p.is_floating_point() for p in params):
        try:
            return torch.optim.AdamW(params, fused=True, **kwargs)
        except (RuntimeError, TypeError, ValueError):  # an older torch or an unsupported dtype
            pass
    return torch.optim.AdamW(params, **kwargs)


@contextmanager
def intra_op_threads(threads: int) -> Iterator[None]:
    """Set torch's intra-op thread count to ``threads`` inside the block, and back to what it was after."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def keep_freed_memory() -> None:
    """Have glibc's malloc keep freed blocks of up to 32 MB for reuse instead of returning them to the kernel.

    Why: a training step on a CPU allocates and frees the same few-MB activations hundreds of times. glibc
    serves blocks above its (adaptive) mmap threshold with a fresh ``mmap`` and unmaps them on free, so every
    such tensor faults its pages in again (the kernel zeroes each 4 KB page): on the tiny default model a forward
    and backward of 1 024 tokens took 2 024 minor page faults, and 120 with this setting, which made it about
    6 % faster. The heap then keeps up to 256 MB of freed memory before trimming. Once per process; a no-op where
    the C library is not glibc (``mallopt`` missing). torch's own CPU allocator has no such cache to turn on.
    """
    global _HEAP_KEPT
    if _HEAP_KEPT:
        return
    _HEAP_KEPT = True
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's <malloc.h> parameter numbers
    mallopt(m_mmap_threshold, 32 << 20)  # the largest glibc accepts (HEAP_MAX / 2 on 64-bit)
    mallopt(m_trim_threshold, 256 << 20)


def check_adam_betas(betas: tuple[float, float], example: str) -> tuple[float, float]:
    """``betas`` if each is in [0, 1), else a ValueError giving ``example`` as the fix.

    nan and inf pass here: the config resolver's finiteness check names them ("must be finite").
    """
    if not all(0.0 <= b < 1.0 for b in betas if math.isfinite(b)):
        raise ValueError(f"AdamW betas must each be in [0, 1), e.g. {example}")
    return betas


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def derived_seed(seed: int, *tags: int) -> int:
    """A 31-bit seed that is a pure function of ``(seed, *tags)`` (SeedSequence mixing, no ``seed + k``)."""
    return int(task_rng(seed, *tags).integers(0, 2**31 - 1))


def check_trainable(policy: Any, what: str) -> None:
    """Raise a clear error unless ``policy`` exposes ``model``, ``tokenizer`` and ``generate``.

    A ValueError: the run's configuration pairs a learner with a policy it cannot train (``lrmgym run`` reports it as
    the user's error and removes the new run directory).
    """
    for name in ("model", "tokenizer", "generate"):
        if getattr(policy, name, None) is None:
            raise ValueError(
                f"learner={what} needs a trainable policy (with .model, .tokenizer and .generate); the "
                f"{type(policy).__name__} policy has no .{name}. Use policy=tiny or policy=hf."
            )
