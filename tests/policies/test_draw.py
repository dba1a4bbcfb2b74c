"""The sampler's draw (inverse CDF) follows the distribution it is given and never picks an excluded token."""

from __future__ import annotations

import math

import pytest
import torch

from lrmgym.policies import sampling as sampling_mod
from lrmgym.policies.sampling import draw

PROBS = torch.tensor([0.0, 0.1, 0.0, 0.2, 0.3, 0.4, 0.0])  # excluded tokens first, in between and last


def _logq(rows: int) -> torch.Tensor:
    return PROBS.log().expand(rows, -1).contiguous()  # log 0 = -inf, as filter_logits leaves excluded tokens


def test_draws_follow_the_distribution():
    n = 200_000
    tokens = draw(_logq(n), torch.Generator().manual_seed(0))
    counts = torch.bincount(tokens, minlength=len(PROBS)).double()
    assert counts[PROBS == 0].sum() == 0
    expected = PROBS.double() * n
    keep = PROBS > 0
    chi2 = float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    assert chi2 < 16.3  # chi-square, 3 degrees of freedom: p = 0.001


def test_the_same_generator_state_gives_the_same_tokens():
    a = draw(_logq(64), torch.Generator().manual_seed(5))
    b = draw(_logq(64), torch.Generator().manual_seed(5))
    assert torch.equal(a, b)


CASES = [(0.0, 1), (0.1 - 1e-5, 1), (0.1 + 1e-5, 3), (0.6, 5), (1 - 2**-53, 5), (1, 5)]  # (u, the token it maps to)


@pytest.mark.parametrize(("u", "token"), CASES)
def test_the_uniform_maps_to_the_right_interval(monkeypatch, u, token):
    # u = 0 takes the first token of positive probability; u near 1 the last one, never the excluded tail, even
    # where u * total rounds up to the total (u = 1 stands for that rounding).
    monkeypatch.setattr(sampling_mod.torch, "rand", lambda shape, **kw: torch.full(shape, u, dtype=kw["dtype"]))
    assert draw(_logq(3)).tolist() == [token] * 3


def test_a_total_below_one_is_drawn_in_proportion(monkeypatch):
    # Rows need not sum to exactly 1 (float rounding): the draw scales u by the row's own total.
    logq = (PROBS * 0.5).log()[None]
    monkeypatch.setattr(sampling_mod.torch, "rand", lambda shape, **kw: torch.full(shape, 0.5, dtype=kw["dtype"]))
    assert draw(logq).tolist() == [4]  # half the row's mass (0.25 of 0.5) ends inside token 4's interval
    assert math.isclose(float(torch.logsumexp(logq, -1)), math.log(0.5), rel_tol=1e-6)


def test_a_diverged_model_is_refused_with_a_clear_error():
    # NaN logits (diverged weights) must not become a token id past the vocabulary.
    logq = torch.stack([PROBS.log(), torch.full_like(PROBS, float("nan"))])
    with pytest.raises(ValueError, match=r"rows \[1\] are NaN or infinite.*lower the learning rate"):
        draw(logq, torch.Generator().manual_seed(0))
