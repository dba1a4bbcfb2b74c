"""ReasonMaxxer's data selection: problems at the edge of competence, the length trim, the advantages, tau.

Pure functions of the judged rollouts (:func:`select_rollouts`) and of the base model's entropies
(:func:`calibrate_tau`); :mod:`lrmgym.learners.algorithms.reason_maxxer` stores what they return.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from lrmgym.learners.engine.traces import JudgedRollout

__all__ = ["Selection", "calibrate_tau", "select_rollouts"]


@dataclass(frozen=True)
class Selection:
    """What :func:`select_rollouts` kept.

    Attributes:
        rows: Indices of the kept rollouts (after the trim), by problem rank, then in their order.
        advantages: Each kept rollout's clipped advantage.
        problems: The kept problems' task ids, best first.
        counts: ``problems_sampled``, ``problems_eligible`` (0 < pass rate < 1), ``problems_kept``,
            ``rollouts_ungradeable`` (no signal, left out), ``rollouts_before_trim``, ``rollouts_kept``.
    """

    rows: list[int]
    advantages: list[float]
    problems: list[str]
    counts: dict[str, int]


def select_rollouts(
    rollouts: Sequence[JudgedRollout],
    max_problems: int,
    trim_longest: float = 0.2,
    advantage: Literal["reward", "strength"] = "reward",
    adv_clip: float | None = 2.5,
) -> Selection:
    """Keep problems at the edge of competence, trim the longest rollouts, compute the advantages.

    A problem is eligible when its pass rate (over the rollouts whose ``correct`` is known) is strictly between
    0 and 1; one with no known ``correct`` at all is eligible when its signal is not constant, ranked after
    every problem with a pass rate. Eligible problems are ranked by closeness of the pass rate to 0.5, then
    fewer truncations, then shorter mean completion length, then first seen; the first ``max_problems`` are
    kept. Of their rollouts, the ``floor(trim_longest x n)`` longest are dropped (equal lengths: the later
    ones). Advantages are ``(s - mean) / max(std, 1e-8)`` over each problem's surviving rollouts (population
    std), clipped to ``+-adv_clip``. Rollouts without a signal (``reward``, or ``strength``) are left out.

    Rollouts must carry ``token_ids`` (the length is counted in tokens).
    """
    signal = [r.signal(advantage) for r in rollouts]
    by_task: dict[str, list[int]] = {}
    for i, r in enumerate(rollouts):
        if signal[i] is not None:
            by_task.setdefault(r.task_id, []).append(i)
    ranked = []
    for order, (task, rows) in enumerate(by_task.items()):
        known = [rollouts[i].correct for i in rows if rollouts[i].correct is not None]
        if known:
            rate = sum(known) / len(known)
            if not 0 < rate < 1:
                continue
            distance = abs(rate - 0.5)
        elif len({signal[i] for i in rows}) > 1:
            distance = math.inf
        else:
            continue
        truncated = sum(rollouts[i].finish_reason == "length" for i in rows)
        mean_len = sum(len(rollouts[i].token_ids or ()) for i in rows) / len(rows)
        ranked.append(((distance, truncated, mean_len, order), task, rows))
    ranked.sort(key=lambda entry: entry[0])
    kept = ranked[:max_problems]
    pool = [i for _, _, rows in kept for i in rows]
    drop = math.floor(trim_longest * len(pool) + 1e-9)
    by_length = sorted(range(len(pool)), key=lambda k: (len(rollouts[pool[k]].token_ids or ()), k))
    rows = [pool[k] for k in sorted(by_length[: len(pool) - drop])]
    advantages = {}
    for _, _, problem_rows in kept:
        alive = [i for i in problem_rows if i in set(rows)]
        values = np.array([signal[i] for i in alive], dtype=np.float64)
        adv = (values - values.mean()) / max(float(values.std()), 1e-8) if len(values) else values
        if adv_clip is not None:
            adv = np.clip(adv, -adv_clip, adv_clip)
        advantages.update(zip(alive, adv.tolist(), strict=True))
    counts = {
        "problems_sampled": len({r.task_id for r in rollouts}), "problems_eligible": len(ranked),
        "problems_kept": len(kept), "rollouts_ungradeable": sum(s is None for s in signal),
        "rollouts_before_trim": len(pool), "rollouts_kept": len(rows),
    }  # fmt: skip
    return Selection(rows, [advantages[i] for i in rows], [task for _, task, _ in kept], counts)


def calibrate_tau(entropies: Sequence[torch.Tensor], fraction: float) -> float:
    """The entropy threshold above which ``fraction`` of the given completion positions lie.

    ``tau`` is the ``(k + 1)``-th largest entropy, ``k = round(fraction x n)`` (at least 1, at most n - 1), so
    exactly the ``k`` largest are above it (fewer only where entropies tie at tau).
    """
    flat = torch.cat([e.reshape(-1).float() for e in entropies]) if entropies else torch.zeros(0)
    n = flat.numel()
    if n < 2:
        raise ValueError(f"tau calibration needs at least 2 completion tokens, got {n}; give tau explicitly.")
    k = min(max(1, round(fraction * n)), n - 1)
    return float(torch.kthvalue(flat, n - k).values)
