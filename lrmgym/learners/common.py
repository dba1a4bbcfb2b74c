"""Helpers every native learner shares: optimizer, seeds, CPUs, the policy check, the step's rollout."""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from lrmgym.core import task_rng
from lrmgym.episodes import Rollout, rollout

__all__ = ["adamw", "check_trainable", "derived_seed", "sample_groups", "usable_cpus"]


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
    """Raise a clear error unless ``policy`` exposes ``model``, ``tokenizer`` and ``generate``."""
    for name in ("model", "tokenizer", "generate"):
        if getattr(policy, name, None) is None:
            raise TypeError(
                f"learner={what} needs a trainable policy (with .model, .tokenizer and .generate); the "
                f"{type(policy).__name__} policy has no .{name}. Use policy=tiny or policy=hf."
            )


def sample_groups(algo: Any, step: int) -> tuple[Rollout, float | None]:
    """Step ``step``'s B groups from ``algo.data_pos``, and (async) the seconds waited for them.

    Sampled here, or collected from the async worker, which is then handed the next step's tasks with the
    weights before this step's update.

    Shared by the learners that sample B tasks x G per step (GRPO, PPO): ``algo`` has ``cfg``, ``env``,
    ``policy``, ``turns``, ``worker``, ``updater``, ``data_pos``, ``_tasks``, ``_sampling`` and ``_resume_weights``.
    """
    cfg, g = algo.cfg, algo.cfg.group_size
    if algo.worker is None:
        return rollout(algo.env, algo.policy, algo._tasks(algo.data_pos), g, algo._sampling(step), algo.turns), None
    start = time.perf_counter()
    if not algo.worker.pending:  # the first step of this process: nothing was started ahead
        tasks, weights, algo._resume_weights = algo._tasks(algo.data_pos), algo._resume_weights, None
        algo.worker.submit(algo.updater.model, tasks, g, algo._sampling(step), algo.turns, state=weights)
    ro = algo.worker.result()
    wait_s = time.perf_counter() - start
    if step + 1 < cfg.steps:  # the next step's rollout, with the weights before this update
        nxt = algo._tasks(algo.data_pos + cfg.prompts_per_step)
        algo.worker.submit(algo.updater.model, nxt, g, algo._sampling(step + 1), algo.turns)
    return ro, wait_s
