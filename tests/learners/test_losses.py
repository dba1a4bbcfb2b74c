"""Loss functions against hand-computed values."""

from __future__ import annotations

import math
import re

import pytest
import torch

from lrmgym.learners.losses import aggregate, kl_penalty, policy_loss, token_entropy, token_logprobs


def test_ratio_one_gives_minus_advantage():
    logp = torch.log(torch.tensor([[0.5, 0.25], [0.1, 0.9]]))
    adv = torch.tensor([2.0, -1.0])
    out = policy_loss(logp, logp.clone(), adv)
    assert torch.allclose(out.loss, torch.tensor([[-2.0, -2.0], [1.0, 1.0]]))
    assert not out.clipped.any()
    mask = torch.ones(2, 2)
    assert aggregate(out.loss, mask).item() == pytest.approx(-(2.0 - 1.0) / 2)


def test_ppo_clip_hand_values_with_clip_higher():
    # ratios 1.5 (A>0: capped at 1.28), 0.5 (A>0: unclipped 0.5), 0.5 (A<0: floored at 0.8), 1.5 (A<0: 1.5)
    ratio = torch.tensor([[1.5, 0.5], [0.5, 1.5]])
    old = torch.zeros(2, 2)
    logp = torch.log(ratio).requires_grad_()
    adv = torch.tensor([1.0, -1.0])
    out = policy_loss(logp, old, adv, clip_low=0.2, clip_high=0.28)
    expected = torch.tensor([[-1.28, -0.5], [0.8, 1.5]])
    assert torch.allclose(out.loss, expected)
    assert out.clipped.tolist() == [[True, False], [True, False]]
    out.loss.sum().backward()
    # d(-rho*A)/dlogp = -rho*A where unclipped, 0 where clipped
    assert torch.allclose(logp.grad, torch.tensor([[0.0, -0.5], [0.0, 1.5]]))


def test_cispo_keeps_gradient_of_clipped_tokens():
    ratio = torch.tensor([[2.0, 1.0]])
    logp = torch.log(ratio).requires_grad_()
    out = policy_loss(logp, torch.zeros(1, 2), torch.tensor([1.0]), kind="cispo", clip_low=0.2, clip_high=0.5)
    out.loss.sum().backward()
    # gradient is -sg(clip(rho)) * A: 1.5 for the capped token, 1.0 for the other
    assert torch.allclose(logp.grad, torch.tensor([[-1.5, -1.0]]))
    assert out.clipped.tolist() == [[True, False]]


def test_kl_estimators_hand_values():
    logp = torch.tensor([math.log(0.5)])
    ref = torch.tensor([math.log(0.25)])
    r = math.log(0.5)  # log(ref / pi)
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(-r)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * r * r)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(0.5 - r - 1.0)
    assert kl_penalty(logp, logp, "k3").item() == 0.0


def test_kl_k3_does_not_overflow():
    out = kl_penalty(torch.tensor([-100.0]), torch.tensor([0.0]), "k3")
    assert torch.isfinite(out).all()


def test_aggregation_modes_hand_values():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    # per-sequence means 2 and 4 (third sequence has no tokens)
    assert aggregate(loss, mask, "seq_mean_token_mean").item() == pytest.approx(3.0)
    assert aggregate(loss, mask, "token_mean").item() == pytest.approx(10.0 / 4)
    assert aggregate(loss, mask, "seq_mean_token_sum_norm", norm_len=4).item() == pytest.approx((6 / 4 + 4 / 4) / 2)


def test_aggregate_empty_mask_is_zero_and_differentiable():
    loss = torch.ones(2, 3, requires_grad=True)
    out = aggregate(loss, torch.zeros(2, 3))
    assert out.item() == 0.0
    out.backward()


def test_aggregate_errors():
    bad = "Unknown loss aggregation 'bad'; expected 'seq_mean_token_mean', 'token_mean' or 'seq_mean_token_sum_norm'."
    with pytest.raises(ValueError, match=f"^{re.escape(bad)}$"):
        aggregate(torch.ones(1, 1), torch.ones(1, 1), "bad")  # type: ignore[arg-type]
    msg = "loss aggregation 'seq_mean_token_sum_norm' needs a positive norm_len (the generation budget), got None."
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        aggregate(torch.ones(1, 1), torch.ones(1, 1), "seq_mean_token_sum_norm")


def test_token_logprobs_and_entropy():
    logits = torch.tensor([[[0.0, 0.0], [math.log(3.0), 0.0], [0.0, 0.0]]])  # [1, 3, 2]
    ids = torch.tensor([[1, 1, 0]])
    lp = token_logprobs(logits, ids)
    assert lp.shape == (1, 2)
    assert torch.allclose(lp, torch.tensor([[math.log(0.5), math.log(0.75)]]))
    ent = token_entropy(logits)
    assert ent[0, 0].item() == pytest.approx(math.log(2.0))
    assert ent[0, 1].item() == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
