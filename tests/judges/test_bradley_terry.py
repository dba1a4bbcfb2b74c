"""Bradley-Terry: hand-worked small graphs, invariants, warm starts, and agreement with choix."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from lrmgym.judges import bradley_terry as bt
from lrmgym.judges.bradley_terry import bt_loss, fit_bradley_terry


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_single_win_solves_the_hand_derived_fixed_point():
    # beta_0 = -beta_1 = b by symmetry; dL/dbeta_0 = -(1 - sigmoid(2b)) + b = 0, i.e. b = sigmoid(-2b).
    fit = fit_bradley_terry(2, [(0, 1, 1.0)], l2=1.0)
    b = fit.strengths[0]
    assert fit.converged
    assert fit.strengths[1] == pytest.approx(-b, abs=1e-12)
    assert b == pytest.approx(_sigmoid(-2 * b), abs=1e-10)
    assert b == pytest.approx(0.33741581, abs=1e-7)


def test_chain_orders_items_and_middle_item_is_zero():
    # 0 beats 1, 1 beats 2: antisymmetric solution (a, 0, -a) with a = sigmoid(-a) (node 0's stationarity).
    fit = fit_bradley_terry(3, [(0, 1, 1.0), (1, 2, 1.0)], l2=1.0)
    a, mid, c = fit.strengths
    assert mid == pytest.approx(0.0, abs=1e-12)
    assert c == pytest.approx(-a, abs=1e-12)
    assert a == pytest.approx(_sigmoid(-a), abs=1e-10)
    assert a > mid > c


def _bisect(f, lo: float, hi: float) -> float:
    """The root of an increasing ``f`` on ``[lo, hi]``, by plain bisection."""
    assert f(lo) < 0 < f(hi)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return 0.5 * (lo + hi)


def _log_likelihood(beta, comps, lam):
    """The regularised soft-outcome log-likelihood, written out term by term (minus the fit's loss)."""
    total = -0.5 * lam * sum(b * b for b in beta)
    for i, j, y in comps:
        d = beta[i] - beta[j]
        total += y * math.log(_sigmoid(d)) + (1.0 - y) * math.log(_sigmoid(-d))
    return total


def _gradient_ascent(n, comps, lam, step, steps):
    """Maximise :func:`_log_likelihood` by plain gradient ascent from zero."""
    beta = [0.0] * n
    for _ in range(steps):
        grad = [-lam * b for b in beta]
        for i, j, y in comps:
            r = y - _sigmoid(beta[i] - beta[j])  # d loglik / d beta_i; minus that for beta_j
            grad[i] += r
            grad[j] -= r
        beta = [b + step * g for b, g in zip(beta, grad, strict=True)]
    return beta, max(abs(g) for g in grad)


def test_two_players_far_from_the_start_match_the_bisected_optimum():
    # 36 wins of item 0 (six of them written from item 1's side), 3 losses, 4 ties; a weak L2 pulls little.
    comps = [(0, 1, 1.0)] * 30 + [(1, 0, 0.0)] * 6 + [(1, 0, 1.0)] * 3 + [(0, 1, 0.5)] * 4
    lam, n_games, score_0 = 0.05, 43, 30 + 6 + 0 + 4 * 0.5
    # Summing the stationarity equations gives lam * (beta_0 + beta_1) = 0, so beta = (b, -b) with
    # d loss / d beta_0 = n_games * sigmoid(2 b) - score_0 + lam * b = 0 (increasing in b).
    b = _bisect(lambda x: n_games * _sigmoid(2 * x) - score_0 + lam * x, 0.0, 10.0)
    assert b > 1.0  # the start (0, 0) is far away: its gradient is n_games / 2 - score_0 = -16.5
    fit = fit_bradley_terry(2, comps, l2=lam)
    assert fit.converged and 1 <= fit.iterations <= 8  # Newton: a handful of steps, not a linear crawl
    np.testing.assert_allclose(fit.strengths, [b, -b], rtol=0, atol=1e-6)
    assert fit.loss == pytest.approx(-_log_likelihood([b, -b], comps, lam), rel=1e-9)


def test_ties_and_equal_records_give_equal_strengths_and_unseen_items_get_zero():
    # Items 0 and 1 tie each other and have the same record against 2 (two wins, one tie); 2 beats 4; 3 is
    # never seen. The optimum is far from the all-zero start; plain gradient ascent finds it independently.
    comps = [(0, 1, 0.5), (1, 0, 0.5), (0, 2, 1.0), (0, 2, 1.0), (2, 1, 0.0), (2, 1, 0.0), (0, 2, 0.5),
             (1, 2, 0.5), (2, 4, 1.0)]  # fmt: skip
    lam = 0.5
    expected, grad_norm = _gradient_ascent(5, comps, lam, step=0.2, steps=600)
    assert grad_norm < 1e-10 and min(abs(expected[k]) for k in (0, 1, 2, 4)) > 0.4
    fit = fit_bradley_terry(5, comps, l2=lam)
    assert fit.converged and 1 <= fit.iterations <= 8
    np.testing.assert_allclose(fit.strengths, expected, rtol=0, atol=1e-6)
    assert fit.strengths[0] == pytest.approx(fit.strengths[1], abs=1e-12) and fit.strengths[3] == 0.0


def test_l2_scales_the_solution_and_strengths_sum_to_zero():
    comps = [(0, 1, 1.0), (1, 2, 0.5), (2, 3, 0.0), (3, 0, 1.0), (0, 2, 1.0)]
    weak = fit_bradley_terry(4, comps, l2=0.1).strengths
    strong = fit_bradley_terry(4, comps, l2=10.0).strengths
    assert np.sum(weak) == pytest.approx(0.0, abs=1e-10)  # sum of the gradient is lam * sum(beta)
    assert np.ptp(strong) < np.ptp(weak)


def test_perfect_separation_stays_finite():
    comps = [(0, k, 1.0) for k in range(1, 6)] * 50  # item 0 wins 250 times
    fit = fit_bradley_terry(6, comps, l2=1.0)
    assert fit.converged and np.all(np.isfinite(fit.strengths))
    assert fit.strengths[0] == fit.strengths.max()


def test_symmetric_augmentation_equals_weight_two():
    comps = [(0, 1, 1.0), (1, 2, 0.5), (2, 0, 0.0)]
    augmented = comps + [(j, i, 1.0 - y) for i, j, y in comps]
    a = fit_bradley_terry(3, augmented).strengths
    b = fit_bradley_terry(3, comps, weights=[2.0, 2.0, 2.0]).strengths
    np.testing.assert_allclose(a, b, atol=1e-10)


def test_solution_is_the_minimum():
    rng = np.random.default_rng(3)
    comps = [(0, 1, 1.0), (1, 2, 0.0), (2, 3, 0.5), (0, 3, 1.0)]
    fit = fit_bradley_terry(4, comps, l2=0.5)
    for _ in range(20):
        assert bt_loss(fit.strengths + 1e-3 * rng.normal(size=4), 4, comps, l2=0.5) > fit.loss


def test_warm_start_from_the_solution_takes_no_step_and_a_bad_start_recovers():
    comps = [(0, 1, 1.0), (1, 2, 1.0), (2, 3, 0.5)]
    cold = fit_bradley_terry(4, comps)
    warm = fit_bradley_terry(4, comps, init=cold.strengths)
    assert warm.iterations == 0 and warm.converged
    far = fit_bradley_terry(4, comps, init=[50.0, -80.0, 30.0, 7.0])
    np.testing.assert_allclose(far.strengths, cold.strengths, atol=1e-8)


def test_sparse_and_dense_solvers_agree(monkeypatch):
    rng = np.random.default_rng(0)
    n, m = 150, 900
    i = rng.integers(0, n, m)
    j = (i + rng.integers(1, n, m)) % n
    comps = np.stack([i, j, rng.choice([0.0, 0.5, 1.0], m)], axis=1)
    sparse = fit_bradley_terry(n, comps).strengths
    monkeypatch.setattr(bt, "_DENSE_MAX", 10_000)
    dense = fit_bradley_terry(n, comps).strengths
    np.testing.assert_allclose(sparse, dense, atol=1e-8)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_agrees_with_choix_on_random_incomplete_graphs_with_ties(seed):
    choix = pytest.importorskip("choix")
    rng = np.random.default_rng(seed)
    n, m, lam = 12, 30, 1.0
    i = rng.integers(0, n, m)
    j = (i + rng.integers(1, n, m)) % n
    y = rng.choice([0.0, 0.5, 1.0], m)
    ours = fit_bradley_terry(n, np.stack([i, j, y], axis=1), l2=lam).strengths
    # Doubled counts: y = 1 -> two wins of i; 0.5 -> one win each; 0 -> two wins of j. Then alpha = lam.
    data = []
    for a, b, out in zip(i, j, y, strict=True):
        wins_a = int(round(2 * out))
        data += [(int(a), int(b))] * wins_a + [(int(b), int(a))] * (2 - wins_a)
    theirs = choix.opt_pairwise(n, data, alpha=lam, tol=1e-10)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_agrees_with_choix_on_hard_outcomes_with_half_alpha():
    choix = pytest.importorskip("choix")
    rng = np.random.default_rng(7)
    n, m, lam = 20, 80, 2.0
    i = rng.integers(0, n, m)
    j = (i + rng.integers(1, n, m)) % n
    ours = fit_bradley_terry(n, [(a, b, 1.0) for a, b in zip(i, j, strict=True)], l2=lam).strengths
    theirs = choix.opt_pairwise(n, [(int(a), int(b)) for a, b in zip(i, j, strict=True)], alpha=lam / 2, tol=1e-10)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_empty_graph_and_zero_items():
    assert fit_bradley_terry(3, []).strengths.tolist() == [0.0, 0.0, 0.0]
    # From a non-zero start only the L2 term acts: its minimiser is 0, and Newton on a quadratic takes one step.
    alone = fit_bradley_terry(3, [], init=[1.0, -2.0, 3.0])
    assert alone.iterations == 1 and alone.converged
    np.testing.assert_allclose(alone.strengths, 0.0, rtol=0, atol=1e-12)
    assert fit_bradley_terry(0, []).strengths.shape == (0,)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"comparisons": [(0, 3, 1.0)]}, "comparison indices must lie in [0, 2] for n_items=3."),
        ({"comparisons": [(1, 1, 1.0)]}, "an item cannot be compared with itself (found (1, 1))."),
        ({"comparisons": [(0, 1, 1.5)]}, "comparison outcomes must lie in [0, 1] (win 1, tie 0.5, loss 0)."),
        ({"comparisons": [(0, 1)]},
         "comparisons must be a sequence of (i, j, outcome) triples, got an array of shape (1, 2)."),
        ({"comparisons": [(0, 1, 1.0)], "l2": 0.0},
         "l2 must be a positive finite number (the L2 coefficient lambda), got 0.0."),
        ({"comparisons": [(0, 1, 1.0)], "init": [0.0]},
         "init must be 3 finite numbers (one strength per item), got shape (1,)."),
        ({"comparisons": [(0, 1, 1.0)], "weights": [-1.0]},
         "weights must hold one finite non-negative number per comparison (1 comparisons)."),
    ],
)  # fmt: skip
def test_bad_input_is_reported(kwargs, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        fit_bradley_terry(3, **kwargs)


def test_ten_thousand_comparisons_over_a_thousand_traces_fit_quickly():
    # The benchmark (benchmarks/bradley_terry.py) measures ~40 ms; the bound here is loose for shared CPUs
    # and only catches a regression to dense O(n^3) solves (seconds).
    import time

    rng = np.random.default_rng(0)
    n, m = 1000, 10_000
    i = rng.integers(0, n, m)
    j = (i + rng.integers(1, n, m)) % n
    comps = np.stack([i, j, rng.choice([0.0, 0.5, 1.0], m)], axis=1)
    fit_bradley_terry(n, comps)  # warm up imports and caches
    start = time.perf_counter()
    fit = fit_bradley_terry(n, comps)
    assert fit.converged and time.perf_counter() - start < 0.5
