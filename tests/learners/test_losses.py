"""Loss functions against hand-computed values."""

from __future__ import annotations

import math
import re

import pytest
import torch

from lrmgym.learners.algorithms.losses import (
    POLICY_LOSSES,
    aggregate,
    cispo,
    get_policy_loss,
    gspo,
    kl_penalty,
    policy_loss,
    ppo_clip,
    reinforce,
    token_entropy,
    token_logprobs,
)


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


# ------------------------------------------------------------------------------------------------ the registry's losses
def _logp_for(ratio: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """``logp`` (a leaf with grad) and ``old_logp = 0`` such that ``exp(logp - old) == ratio``; float64."""
    return torch.log(torch.tensor(ratio, dtype=torch.float64)).requires_grad_(), torch.zeros(
        len(ratio), len(ratio[0]), dtype=torch.float64
    )


def test_registry_holds_the_four_losses():
    assert POLICY_LOSSES.names() == ("cispo", "gspo", "ppo_clip", "reinforce")
    assert get_policy_loss("ppo_clip") is ppo_clip and get_policy_loss("gspo") is gspo


def test_ppo_clip_low_and_high_are_separate_and_the_mask_zeroes():
    # clip_low 0.2 (floor 0.8), clip_high 0.28 (cap 1.28); old_logp = 0 so rho = exp(logp)
    # A=+1: rho 1.25 < 1.28 -> unclipped, loss -1.25, dloss/dlogp = -rho*A = -1.25
    #       rho 1.5  > 1.28 -> min(1.5, 1.28) = 1.28, loss -1.28, no gradient
    # A=-1: rho 0.75 < 0.8  -> min(-0.75, -0.8) = -0.8, loss 0.8, no gradient
    #       rho 1.1         -> min(-1.1, -1.1) = -1.1, loss 1.1, gradient -rho*A = 1.1
    # column 3 is padding (rho 3.0): loss 0, not clipped, no gradient
    # Swapping clip_low/clip_high clips 1.25 (cap 1.2) and frees 0.75 (floor 0.72); a flipped A flips every sign.
    logp, old = _logp_for([[1.25, 1.5, 3.0], [0.75, 1.1, 3.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    out = ppo_clip(logp, old, torch.tensor([1.0, -1.0], dtype=torch.float64), mask, clip_low=0.2, clip_high=0.28)
    assert torch.allclose(out.loss, torch.tensor([[-1.25, -1.28, 0.0], [0.8, 1.1, 0.0]], dtype=torch.float64))
    assert out.clipped.tolist() == [[False, True, False], [True, False, False]]
    assert torch.allclose(out.ratio, torch.tensor([[1.25, 1.5, 0.0], [0.75, 1.1, 0.0]], dtype=torch.float64))
    out.loss.sum().backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1.25, 0.0, 0.0], [0.0, 1.1, 0.0]], dtype=torch.float64))


def test_ppo_dual_clip_bounds_only_negative_advantages():
    # dual_clip c = 3, clip 0.2 both sides.
    # A=+1, rho 5: min(5, 1.2) = 1.2 -> loss -1.2 (clipped); the dual clip must not touch A > 0 (it would give -3)
    # A=+1, rho 1: loss -1, gradient -1
    # A=-1, rho 5: plain PPO min(-5, -1.2) = -5 -> loss 5; dual: min(5, -c*A = 3) = 3, clipped, no gradient
    # A=-1, rho 2: min(-2, -1.2) = -2 -> loss 2 < 3, kept, gradient -rho*A = 2
    logp, old = _logp_for([[5.0, 1.0], [5.0, 2.0]])
    adv, mask = torch.tensor([1.0, -1.0], dtype=torch.float64), torch.ones(2, 2, dtype=torch.bool)
    plain = ppo_clip(logp, old, adv, mask)
    assert torch.allclose(plain.loss, torch.tensor([[-1.2, -1.0], [5.0, 2.0]], dtype=torch.float64))
    out = ppo_clip(logp, old, adv, mask, dual_clip=3.0)
    assert torch.allclose(out.loss, torch.tensor([[-1.2, -1.0], [3.0, 2.0]], dtype=torch.float64))
    assert out.clipped.tolist() == [[True, False], [True, False]]
    out.loss.sum().backward()
    assert torch.allclose(logp.grad, torch.tensor([[0.0, -1.0], [0.0, 2.0]], dtype=torch.float64))


def test_ppo_dual_clip_must_exceed_one():
    msg = "ppo_clip's dual_clip must be > 1 (Ye et al. use 3.0), got 1.0; or None to disable it."
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        ppo_clip(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1), dual_clip=1.0)


def test_cispo_has_no_floor_and_every_token_keeps_its_gradient():
    # weight w = sg(min(rho, 1 + clip_high)), clip_high 0.2 -> cap 1.2; loss = -w * A * logp, A = 1, old = 0
    # rho 0.1: no floor, w = 0.1 (a floor at 0.8 would give 0.8); loss = -0.1 * log(0.1) = 0.2302585; grad -0.1
    # rho 3.0: capped, w = 1.2, clipped; loss = -1.2 * log 3 = -1.3183347; grad -1.2 (PPO-clip would give 0)
    # rho 1.0: w = 1, loss = -1 * log 1 = 0; grad -1
    logp, old = _logp_for([[0.1, 3.0, 1.0]])
    out = cispo(logp, old, torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 3, dtype=torch.bool))
    expected = [[-0.1 * math.log(0.1), -1.2 * math.log(3.0), 0.0]]
    assert torch.allclose(out.loss, torch.tensor(expected, dtype=torch.float64))
    assert out.clipped.tolist() == [[False, True, False]]
    out.loss.sum().backward()
    assert torch.allclose(logp.grad, torch.tensor([[-0.1, -1.2, -1.0]], dtype=torch.float64))


def test_cispo_absolute_relative_cap_and_optional_floor():
    # rho 7, A = -1 so the gradient is +w: default cap 1 + clip_high = 1.2; relative is_cap 5 -> 6;
    # absolute is_cap 5 -> 5 (Ring-Zero). rho 0.1 with is_floor 0.8 -> w = 0.8.
    def grads(**kw):
        logp, old = _logp_for([[7.0, 0.1]])
        out = cispo(logp, old, torch.tensor([-1.0], dtype=torch.float64), torch.ones(1, 2, dtype=torch.bool), **kw)
        out.loss.sum().backward()
        return logp.grad.tolist()[0], out.clipped.tolist()[0]

    assert grads() == (pytest.approx([1.2, 0.1]), [True, False])
    assert grads(is_cap=5.0) == (pytest.approx([6.0, 0.1]), [True, False])
    assert grads(is_cap=5.0, is_cap_mode="absolute") == (pytest.approx([5.0, 0.1]), [True, False])
    assert grads(is_cap=8.0, is_cap_mode="absolute", is_floor=0.8) == (pytest.approx([7.0, 0.8]), [False, True])
    msg = "cispo's is_cap_mode='absolute' needs is_cap (the cap itself, e.g. 5.0 for Ring-Zero)."
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        grads(is_cap_mode="absolute")


def test_learner_wrapper_gives_cispo_no_floor():
    # The learner passes clip_low=0.2 to every loss that names it; cispo does not, so rho 0.1 keeps w = 0.1.
    logp, old = _logp_for([[0.1]])
    policy_loss(logp, old, torch.ones(1, dtype=torch.float64), kind="cispo", clip_low=0.2).loss.sum().backward()
    assert logp.grad.item() == pytest.approx(-0.1)


def test_gspo_ratio_is_the_geometric_mean_over_masked_tokens():
    # Row 0: log-ratios (0.2, -0.1) on policy tokens, 5.0 on padding -> s = exp((0.2 - 0.1) / 2) = exp(0.05)
    #        = 1.0512711 > 1 + 4e-4, A = +1: clipped to 1.0004, loss -1.0004 on each token, no gradient.
    # Row 1: log-ratios (1e-4, 3e-4), padding -1e-4 -> s = exp(2e-4) = 1.0002000 (with the padding: exp(1e-4));
    #        inside [1 - 3e-4, 1 + 4e-4], A = -2: loss -s * A = 2.0004000 on each token.
    logp = torch.tensor([[0.2, -0.1, 5.0], [1e-4, 3e-4, -1e-4]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(2, 3, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    out = gspo(logp, old, adv, mask)
    s1 = math.exp(2e-4)
    assert torch.allclose(out.ratio, torch.tensor([[math.exp(0.05)] * 2 + [0.0], [s1, s1, 0.0]], dtype=torch.float64))
    assert torch.allclose(
        out.loss, torch.tensor([[-1.0004, -1.0004, 0.0], [2 * s1, 2 * s1, 0.0]], dtype=torch.float64), atol=1e-12
    )
    assert out.clipped.tolist() == [[True, True, False], [False, False, False]]
    # seq_mean_token_mean over N = 2 sequences: d/dlogp_t = -(1/2) * (1/|o_i|) * s_i * A_i = -(1/4) * s1 * (-2)
    aggregate(out.loss, mask).backward()
    assert torch.allclose(logp.grad, torch.tensor([[0.0, 0.0, 0.0], [s1 / 2, s1 / 2, 0.0]], dtype=torch.float64))


def test_gspo_padding_does_not_change_anything():
    base = torch.tensor([[0.3, -0.2, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 0]], dtype=torch.bool)
    outs = []
    for pad in (0.0, 7.0):
        logp = base.clone()
        logp[0, 2:] = pad
        outs.append(gspo(logp, torch.zeros_like(logp), torch.tensor([1.0]), mask, clip_low=0.5, clip_high=0.5))
    assert torch.equal(outs[0].loss, outs[1].loss) and torch.equal(outs[0].ratio, outs[1].ratio)


def test_gspo_token_form_equals_the_sequence_objective():
    # GSPO's own objective, -(1/N) sum_i min(s_i A_i, clip(s_i) A_i), differentiated through s_i itself,
    # must give the same gradient as the token form aggregated by seq_mean_token_mean.
    torch.manual_seed(0)
    logp = (0.05 * torch.randn(3, 5, dtype=torch.float64)).requires_grad_()
    old = 0.05 * torch.randn(3, 5, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [0, 1, 1, 0, 0]], dtype=torch.bool)
    adv = torch.tensor([1.5, -0.5, 1.0], dtype=torch.float64)
    out = gspo(logp, old, adv, mask, clip_low=0.02, clip_high=0.02)
    assert out.clipped.any(-1).tolist() == [False, True, True]  # s = 1.010 (kept), 0.952 with A < 0, 1.036
    aggregate(out.loss, mask).backward()
    token_grad = logp.grad.clone()
    logp.grad = None
    s = torch.exp(((logp - old) * mask).sum(-1) / mask.sum(-1))
    seq_loss = -torch.minimum(s * adv, s.clamp(0.98, 1.02) * adv).mean()
    seq_loss.backward()
    assert torch.allclose(token_grad, logp.grad, atol=1e-12)
    assert token_grad[0].abs().min() > 0 and (token_grad[1:] == 0).all()


def test_reinforce_is_minus_advantage_times_logp():
    # loss = -A * logp: A = 2, logp = log 0.5 -> 2 * log 2 = 1.3862944; A = -1, logp = log 0.25 -> log 0.25
    # gradient -A per policy token, 0 on padding; no ratio in the loss (the ratio is only logged)
    logp = torch.log(torch.tensor([[0.5, 0.5], [0.25, 0.9]], dtype=torch.float64)).requires_grad_()
    old = torch.log(torch.tensor([[0.25, 0.5], [0.5, 0.9]], dtype=torch.float64))
    mask = torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    out = reinforce(logp, old, torch.tensor([2.0, -1.0], dtype=torch.float64), mask)
    expected = [[2 * math.log(2.0), 2 * math.log(2.0)], [math.log(0.25), 0.0]]
    assert torch.allclose(out.loss, torch.tensor(expected, dtype=torch.float64))
    assert not out.clipped.any()
    assert torch.allclose(out.ratio, torch.tensor([[2.0, 1.0], [0.5, 0.0]], dtype=torch.float64))
    out.loss.sum().backward()
    assert torch.allclose(logp.grad, torch.tensor([[-2.0, -2.0], [1.0, 0.0]], dtype=torch.float64))


@pytest.mark.parametrize("name", ["ppo_clip", "cispo", "gspo", "reinforce"])
def test_every_loss_at_ratio_one_has_gradient_minus_advantage(name):
    # On-policy (rho = 1) every loss reduces to the policy gradient -A * grad logp, token by token.
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.8]], dtype=torch.float64)).requires_grad_()
    out = get_policy_loss(name)(logp, logp.detach(), torch.tensor([[0.5, -2.0, 1.0]], dtype=torch.float64),
                                torch.tensor([[1, 1, 0]], dtype=torch.bool))  # fmt: skip
    out.loss.sum().backward()
    assert torch.allclose(logp.grad, torch.tensor([[-0.5, 2.0, 0.0]], dtype=torch.float64))


def test_unknown_policy_loss():
    msg = (
        "unknown policy loss 'ppo'; known: cispo, gspo, ppo_clip, reinforce. Did you mean 'ppo_clip'? Use one of "
        "these, or register a new one with @lrmgym.learners.algorithms.losses.register_policy_loss(name)."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), kind="ppo")
