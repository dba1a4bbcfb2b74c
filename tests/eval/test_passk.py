"""pass@k, avg@n and intervals against hand-computed values."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from lrmgym.eval.passk import avg_at_n, bootstrap_interval, pass_at_k, pass_at_k_mean, wilson_interval


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (5, 2, 3, 0.9),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
        (8, 1, 4, 0.5),  # 1 - C(7,4)/C(8,4) = 1 - 35/70
        (10, 3, 1, 0.3),  # pass@1 = c/n
        (10, 0, 5, 0.0),
        (10, 10, 1, 1.0),
        (10, 6, 5, 1.0),  # fewer than k wrong samples: every k-subset holds a correct one
        (10, 2, 4, 1 - 70 / 210),  # 1 - C(8,4)/C(10,4)
    ],
)
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_the_binomial_formula_on_a_grid():
    for n in range(1, 21):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)


def test_pass_at_k_rejects_k_above_n_and_bad_counts():
    msg = "pass@k needs 1 <= k <= n, got k=8 with n=4 samples; draw at least k samples per task."
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        pass_at_k(4, 1, 8)
    with pytest.raises(ValueError, match=f"^{re.escape('c (correct samples) must be between 0 and n=4, got 5.')}$"):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="^pass@k over zero tasks is undefined"):
        pass_at_k_mean([], 4, 1)


def test_means_over_tasks():
    assert pass_at_k_mean([0, 1, 4], n=4, k=2) == pytest.approx((0 + 0.5 + 1) / 3)
    assert avg_at_n([0, 1, 4], n=4) == pytest.approx(5 / 12)


def test_wilson_interval_known_values():
    low, high = wilson_interval(5, 10)
    assert (low, high) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    low, high = wilson_interval(0, 20)
    assert low == 0.0 and high == pytest.approx(0.1611, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 0.0)


def test_bootstrap_interval():
    assert bootstrap_interval([0.5] * 30) == (0.5, 0.5)
    values = np.random.default_rng(0).random(400)
    low, high = bootstrap_interval(values, seed=1)
    assert low < values.mean() < high
    # The standard error of a mean of U(0,1) over 400 values is 0.0144; a 95 % interval is about 4 of them.
    assert 0.045 < high - low < 0.07
    assert bootstrap_interval(values, seed=1) == (low, high)
    with pytest.raises(ValueError, match="^A bootstrap interval needs at least one value.$"):
        bootstrap_interval([])
