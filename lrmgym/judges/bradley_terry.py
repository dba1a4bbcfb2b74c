"""Bradley-Terry strengths from an incomplete graph of soft pairwise outcomes, by Newton's method.

Model: ``P(i beats j) = sigmoid(beta_i - beta_j)``. Given comparisons ``(i, j, y)`` with a soft outcome
``y`` in [0, 1] (win 1, tie 0.5, loss 0) and an optional weight ``w``, the fit minimises the convex loss

    L(beta) = sum_k w_k * [ -y_k log sigmoid(d_k) - (1 - y_k) log sigmoid(-d_k) ] + (lam / 2) * ||beta||^2,
    d_k = beta_{i_k} - beta_{j_k}

(Reasoning Arena, arXiv 2606.09380, spec in ``../shared/specs/papers.md`` §1.3). The L2 term fixes the
gauge (BT is shift-invariant) and keeps strengths finite on sparse or perfectly separated graphs, so the
minimiser is unique and exists for every graph, connected or not.

Why hand-written rather than ``choix``: ``choix`` takes hard outcomes only (a list of ``(winner, loser)``),
evaluates its objective in a Python loop (about a second for 10 000 comparisons), and is a test and
benchmark dependency of this project only. Newton's method on this loss needs a gradient and a Hessian
that are a few ``numpy.bincount`` calls, and converges in a handful of steps.

Convention mapping to ``choix.opt_pairwise(n, data, alpha)``: choix minimises
``sum_{(w, l)} -log sigmoid(beta_w - beta_l) + alpha * ||beta||^2``. A soft outcome ``y`` on ``(i, j)`` is
``y`` wins of ``i`` plus ``1 - y`` wins of ``j``; with outcomes in {0, 0.5, 1}, doubling every comparison
makes the counts integers, and the doubled loss ``2 L`` equals choix's objective with ``alpha = lam``. For
hard outcomes only (no ties) and no doubling, ``alpha = lam / 2``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.linalg

__all__ = ["BTFit", "fit_bradley_terry", "bt_loss"]

_DENSE_MAX = 32
"""Up to this many items the Newton system is solved densely (Cholesky); above it, sparse conjugate gradient."""


@dataclass(frozen=True)
class BTFit:
    """The result of a Bradley-Terry fit.

    Attributes:
        strengths: The fitted ``beta``, shape ``(n_items,)``.
        iterations: Newton steps taken.
        converged: Whether the gradient's max-norm fell below the tolerance.
        grad_norm: The final gradient's max-norm.
        loss: The final value of the regularised loss.
    """

    strengths: np.ndarray
    iterations: int
    converged: bool
    grad_norm: float
    loss: float


def _as_arrays(
    n_items: int,
    comparisons: Sequence[tuple[int, int, float]] | np.ndarray,
    weights: Sequence[float] | np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Validate the comparisons and split them into index, outcome and weight arrays."""
    if not isinstance(n_items, (int, np.integer)) or n_items < 0:
        raise ValueError(f"n_items must be a non-negative integer, got {n_items!r}.")
    arr = np.asarray(comparisons, dtype=float)
    if arr.size == 0:
        arr = arr.reshape(0, 3)
    if arr.ndim != 2 or arr.shape[1] != 3:
        raise ValueError(
            f"comparisons must be a sequence of (i, j, outcome) triples, got an array of shape {arr.shape}."
        )
    i, j, y = arr[:, 0], arr[:, 1], arr[:, 2]  # each (m,)
    if not (np.all(i == np.round(i)) and np.all(j == np.round(j))):
        raise ValueError("comparison indices must be integers.")
    i, j = i.astype(np.int64), j.astype(np.int64)
    if len(i) and (min(i.min(), j.min()) < 0 or max(i.max(), j.max()) >= n_items):
        raise ValueError(f"comparison indices must lie in [0, {n_items - 1}] for n_items={n_items}.")
    if np.any(i == j):
        raise ValueError(f"an item cannot be compared with itself (found ({i[i == j][0]}, {i[i == j][0]})).")
    if not np.all((y >= 0.0) & (y <= 1.0)):
        raise ValueError("comparison outcomes must lie in [0, 1] (win 1, tie 0.5, loss 0).")
    w = np.ones_like(y) if weights is None else np.asarray(weights, dtype=float)
    if w.shape != y.shape or not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError(f"weights must hold one finite non-negative number per comparison ({len(y)} comparisons).")
    return i, j, y, w


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # overflow-free form of 1 / (1 + exp(-x))


def bt_loss(
    beta: np.ndarray,
    n_items: int,
    comparisons: Sequence[tuple[int, int, float]] | np.ndarray,
    l2: float = 1.0,
    weights: Sequence[float] | np.ndarray | None = None,
) -> float:
    """The regularised soft-outcome loss ``L(beta)`` of the module docstring."""
    i, j, y, w = _as_arrays(n_items, comparisons, weights)
    return _loss(np.asarray(beta, dtype=float), i, j, y, w, l2)


def _loss(beta: np.ndarray, i: np.ndarray, j: np.ndarray, y: np.ndarray, w: np.ndarray, l2: float) -> float:
    d = beta[i] - beta[j]  # (m,)
    # y * softplus(-d) + (1 - y) * softplus(d) = softplus(d) - y * d, with softplus(d) = logaddexp(0, d)
    nll = np.logaddexp(0.0, d) - y * d
    return float(np.dot(w, nll) + 0.5 * l2 * np.dot(beta, beta))


def _newton_direction(
    grad: np.ndarray, i: np.ndarray, j: np.ndarray, h: np.ndarray, l2: float, n: int, rtol: float
) -> np.ndarray:
    """Solve ``H step = grad`` where ``H = lam I + sum_k h_k (e_i - e_j)(e_i - e_j)^T`` (a weighted Laplacian).

    Small problems are solved densely (Cholesky). Large ones use preconditioned conjugate gradient written
    here rather than ``scipy.sparse.linalg.cg``: the Hessian-vector product is two gathers and two
    ``bincount`` calls over the edge list, so no sparse matrix is built per Newton step (that build and
    scipy's operator wrapping cost more than the solve). ``H`` is symmetric positive definite with
    eigenvalues in ``[lam, lam + max weighted degree / 2]``, so Jacobi-preconditioned CG converges fast;
    ``rtol`` is the inexact-Newton forcing term (tight near the optimum, so convergence stays superlinear).
    """
    diag = l2 + np.bincount(i, h, n) + np.bincount(j, h, n)  # (n,)
    if n <= _DENSE_MAX:
        hess = np.zeros((n, n))
        np.add.at(hess, (i, j), -h)
        np.add.at(hess, (j, i), -h)
        hess[np.diag_indices(n)] += diag
        return scipy.linalg.cho_solve(scipy.linalg.cho_factor(hess), grad)

    def hess_vec(v: np.ndarray) -> np.ndarray:
        hv = h * (v[i] - v[j])  # (m,)
        return l2 * v + np.bincount(i, hv, n) - np.bincount(j, hv, n)

    x = np.zeros(n)
    r = grad.copy()
    z = r / diag
    p = z.copy()
    rz = float(r @ z)
    stop = rtol * float(np.linalg.norm(grad))
    for _ in range(10 * n):
        if float(np.linalg.norm(r)) <= stop:
            break
        hp = hess_vec(p)
        alpha = rz / float(p @ hp)
        x += alpha * p
        r -= alpha * hp
        z = r / diag
        rz, rz_old = float(r @ z), rz
        p = z + (rz / rz_old) * p
    return x


def fit_bradley_terry(
    n_items: int,
    comparisons: Sequence[tuple[int, int, float]] | np.ndarray,
    l2: float = 1.0,
    *,
    weights: Sequence[float] | np.ndarray | None = None,
    init: Sequence[float] | np.ndarray | None = None,
    max_iter: int = 50,
    tol: float = 1e-8,
) -> BTFit:
    """Fit Bradley-Terry strengths by damped Newton's method.

    Args:
        n_items: Number of items; items that appear in no comparison get strength 0.
        comparisons: ``(i, j, y)`` triples: item ``i`` met item ``j`` and scored ``y`` (1 win, 0.5 tie,
            0 loss; any value in [0, 1] is accepted). Pass both ``(i, j, y)`` and ``(j, i, 1 - y)`` for the
            symmetric augmentation the arena uses; the fit is the same as with the triple weighted 2.
        l2: The L2 coefficient ``lam`` (> 0) of ``(lam / 2) ||beta||^2``.
        weights: Optional non-negative weight per comparison.
        init: Warm start: strengths to start from (for example the previous fit, padded with zeros).
        max_iter: Maximum Newton steps.
        tol: Stop when the gradient's max-norm is below this.

    Returns:
        The fit; ``strengths`` has shape ``(n_items,)``.

    Example:
        >>> fit = fit_bradley_terry(2, [(0, 1, 1.0)], l2=1.0)
        >>> round(float(fit.strengths[0]), 4), round(float(fit.strengths[1]), 4)
        (0.3374, -0.3374)
    """
    if not (isinstance(l2, (int, float)) and l2 > 0 and np.isfinite(l2)):
        raise ValueError(f"l2 must be a positive finite number (the L2 coefficient lambda), got {l2!r}.")
    i, j, y, w = _as_arrays(n_items, comparisons, weights)
    beta = np.zeros(n_items) if init is None else np.array(init, dtype=float)
    if beta.shape != (n_items,) or not np.all(np.isfinite(beta)):
        raise ValueError(f"init must be {n_items} finite numbers (one strength per item), got shape {beta.shape}.")
    loss = _loss(beta, i, j, y, w, l2)
    grad_norm, it = np.inf, 0
    for it in range(max_iter + 1):
        p = _sigmoid(beta[i] - beta[j])  # (m,) model probability that i beats j
        g = w * (p - y)  # (m,) dL/dd
        grad = l2 * beta + np.bincount(i, g, n_items) - np.bincount(j, g, n_items)  # (n,)
        grad_norm = float(np.max(np.abs(grad))) if n_items else 0.0
        if grad_norm < tol or it == max_iter:
            break
        rtol = min(0.1, grad_norm) ** 1.5  # forcing term: loose far from the optimum, tight near it
        step = _newton_direction(grad, i, j, w * p * (1.0 - p), l2, n_items, max(rtol, 1e-14))
        # Backtracking (Armijo) line search: a full Newton step is accepted near the optimum; far from it
        # (a bad warm start) halving keeps every iterate a descent step.
        t, slope = 1.0, float(np.dot(grad, step))
        while True:
            cand = beta - t * step
            cand_loss = _loss(cand, i, j, y, w, l2)
            if cand_loss <= loss - 1e-4 * t * slope or t < 1e-10:
                break
            t *= 0.5
        beta, loss = cand, cand_loss
    return BTFit(strengths=beta, iterations=it, converged=grad_norm < tol, grad_norm=grad_norm, loss=loss)
