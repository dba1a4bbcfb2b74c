"""How the update splits a batch into forward/backward passes, and runs passes on several CPU threads at once.

:func:`micro_batches` (``learner.micro_batch_size`` / ``micro_batch_tokens``, prompts kept together for
``shared_prefix``) and :func:`in_threads` (``learner.update_threads``), used by
:class:`~lrmgym.learners.engine.update.PolicyUpdater`.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch

from lrmgym.learners.engine import shared_prefix
from lrmgym.learners.engine.common import intra_op_threads
from lrmgym.learners.engine.rollout import TokenBatch

if TYPE_CHECKING:
    from lrmgym.learners.engine.pg_config import PolicyGradientConfig

__all__ = ["in_threads", "micro_batches"]


def _within_budget(unit: list[int], cost: Callable[[list[int]], int], budget: int) -> list[list[int]]:
    """``unit``'s rows in consecutive parts of at most ``budget`` cost each (a single row may exceed it alone)."""
    parts: list[list[int]] = []
    for row in unit:
        if parts and cost([*parts[-1], row]) <= budget:
            parts[-1].append(row)
        else:
            parts.append([row])
    return parts


def micro_batches(cfg: PolicyGradientConfig, batch: TokenBatch, rows: list[int], parts: int = 1) -> list[list[int]]:
    """Split ``rows`` of ``batch`` into forward/backward passes (see micro_batch_size, micro_batch_tokens).

    With shared_prefix, the rows of one prompt stay in one pass (so that the prompt runs once) and a pass
    costs its prompts once each: ``rows x longest continuation + prompts x longest prompt`` padded tokens.
    ``parts``: at least this many passes where the rows allow (one per update thread): when the options give
    fewer, the rows (or prompts) are dealt out in turn, longest first, so the passes have similar widths.
    """
    size, budget = cfg.micro_batch_size, cfg.micro_batch_tokens
    if size:
        if parts > 1 and len(rows) <= size * (parts - 1):  # fewer passes than threads
            size = -(-len(rows) // parts)
        return [rows[i : i + size] for i in range(0, len(rows), size)]
    if not budget and parts == 1:
        return [rows]
    lengths = batch.attention_mask.sum(-1).tolist()
    if cfg.shared_prefix:
        by_prompt: dict[int, list[int]] = {}
        owner = shared_prefix.prompt_groups(batch.input_ids, batch.prompt_len)
        for r in rows:
            by_prompt.setdefault(owner[r], []).append(r)
        units = list(by_prompt.values())
        prompt = batch.prompt_len.tolist()
    else:
        units = [[r] for r in rows]
        prompt = [0] * len(lengths)

    def cost(chunk: list[list[int]]) -> int:  # padded tokens of one pass
        cont = max(lengths[r] - prompt[r] for u in chunk for r in u)
        return sum(map(len, chunk)) * cont + len(chunk) * max(prompt[r] for u in chunk for r in u)

    if budget:  # a group over the budget is split: each part runs its prompt once (long real-model rollouts)
        units = [part for unit in units for part in _within_budget(unit, lambda u: cost([u]), budget)]
    units.sort(key=lambda u: -max(lengths[r] for r in u))  # longest first: similar widths share a pass

    chunks: list[list[list[int]]] = []
    for unit in units if budget else ():
        if chunks and cost([*chunks[-1], unit]) <= budget:
            chunks[-1].append(unit)
        else:
            chunks.append([unit])
    if len(chunks) < parts:
        chunks = [units[j::parts] for j in range(min(parts, len(units)))]
    return [[r for u in chunk for r in u] for chunk in chunks]


def in_threads(
    pool: ThreadPoolExecutor,
    threads: int,
    params: list[torch.nn.Parameter],
    micros: list[list[int]],
    costs: list[int],
    one_pass: Callable[[list[int], list], dict[str, float]],
) -> list[dict[str, float]]:
    """Run ``one_pass`` over ``micros`` on ``threads`` threads (``pool``'s and this one); results in ``micros``' order.

    The passes are dealt to the threads longest first, each to the least loaded (by ``costs``); each thread
    adds its gradients up in a list of its own, and those lists are added to ``.grad`` in thread order. So the
    same batch gives the same bits, where passes calling ``backward`` at once would add into ``.grad`` in
    whatever order they finish. The calling thread runs the first thread's share. Why threads and not torch's
    intra-op pool: see ``update_threads``; the kernels release the GIL, so the passes run side by side.
    """
    k = min(threads, len(micros))
    lanes: list[list[int]] = [[] for _ in range(k)]
    load = [0] * k
    for i in sorted(range(len(micros)), key=lambda i: (-costs[i], i)):
        j = load.index(min(load))
        lanes[j].append(i)
        load[j] += costs[i]
    grads: list[list] = [[None] * len(params) for _ in range(k)]

    def lane(j: int) -> list[tuple[int, dict[str, float]]]:
        return [(i, one_pass(micros[i], grads[j])) for i in sorted(lanes[j])]

    with intra_op_threads(1):
        futures = [pool.submit(lane, j) for j in range(1, k)]
        try:
            done = lane(0)
        finally:
            done_rest = [f.result() for f in futures]  # wait for every thread, also when this one failed
    results = dict(done + [pair for rest in done_rest for pair in rest])
    for j, param in enumerate(params):
        total = None
        for lane_grads in grads:
            g = lane_grads[j]
            if g is not None:
                total = g if total is None else total.add_(g)
        if total is not None:
            param.grad = total if param.grad is None else param.grad.add_(total)
    return [results[i] for i in range(len(micros))]
