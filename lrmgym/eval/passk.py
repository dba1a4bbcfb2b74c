"""pass@k, avg@n and their confidence intervals.

pass@k uses the unbiased estimator of Chen et al. 2021, "Evaluating Large Language Models Trained on Code"
(https://arxiv.org/abs/2107.03374, §2.1): with ``n`` samples of which ``c`` are correct,
``pass@k = 1 - C(n - c, k) / C(n, k)``, the probability that a random size-``k`` subset of the ``n`` samples
holds at least one correct one; averaged over tasks. It is computed as the product
``prod_{i = n - c + 1}^{n} (1 - k / i)`` to avoid huge binomials.

Intervals: tasks are the independent units (samples of one task are correlated), so the interval of a mean
over tasks is a percentile bootstrap over tasks. :func:`wilson_interval` is for a plain proportion of
independent trials (e.g. a rate over tasks).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["avg_at_n", "bootstrap_interval", "pass_at_k", "pass_at_k_mean", "wilson_interval"]


def _check_counts(n: int, c: int, k: int) -> None:
    if n < 1:
        raise ValueError(f"n (samples per task) must be >= 1, got {n}.")
    if not 0 <= c <= n:
        raise ValueError(f"c (correct samples) must be between 0 and n={n}, got {c}.")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k} with n={n} samples; draw at least k samples per task.")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task with ``c`` correct out of ``n`` samples.

    Example:
        >>> pass_at_k(n=4, c=1, k=2)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        0.5
    """
    _check_counts(n, c, k)
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def pass_at_k_mean(correct: Sequence[int], n: int, k: int) -> float:
    """Mean pass@k over tasks, given each task's number of correct samples out of ``n``."""
    if not correct:
        raise ValueError("pass@k over zero tasks is undefined; evaluate at least one task.")
    return float(np.mean([pass_at_k(n, c, k) for c in correct]))


def avg_at_n(correct: Sequence[int], n: int) -> float:
    """avg@n: the mean fraction of correct samples per task (the expected pass@1)."""
    if not correct:
        raise ValueError("avg@n over zero tasks is undefined; evaluate at least one task.")
    return float(np.mean(correct) / n)


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (Wilson 1927); ``(0, 0)`` for zero trials."""
    if trials == 0:
        return (0.0, 0.0)
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must be between 0 and trials={trials}, got {successes}.")
    z = _normal_quantile(0.5 + confidence / 2)
    p = successes / trials
    denom = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # exact bounds at the edges (no rounding residue)
    high = 1.0 if successes == trials else min(1.0, centre + half)
    return (low, high)


def bootstrap_interval(
    values: Sequence[float],
    statistic: Callable[[np.ndarray], float] = np.mean,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic`` over ``values`` (resampled with replacement, seeded)."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise ValueError("A bootstrap interval needs at least one value.")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, data.size, size=(resamples, data.size))  # [R, N]
    stats = np.apply_along_axis(statistic, 1, data[idx]) if statistic is not np.mean else data[idx].mean(axis=1)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(stats, [alpha, 1 - alpha])
    return (float(low), float(high))


def _normal_quantile(p: float) -> float:
    """The standard normal quantile, via :class:`statistics.NormalDist` (stdlib)."""
    from statistics import NormalDist

    return NormalDist().inv_cdf(p)
