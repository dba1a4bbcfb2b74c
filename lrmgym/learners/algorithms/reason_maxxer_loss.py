"""ReasonMaxxer's loss (arXiv 2605.06241, eqs. 6-7): entropy-gated, advantage-weighted CE plus a KL anchor."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from lrmgym.learners.algorithms.logprobs import token_logprobs

__all__ = ["LossParts", "reason_maxxer_loss"]


class LossParts(NamedTuple):
    """Per-sequence terms of :func:`reason_maxxer_loss`, each ``[N]``."""

    loss: torch.Tensor
    """``decision_ce + kl_coef x anchor_kl``."""
    decision_ce: torch.Tensor
    """``-(1/|D_i|) sum_{t in D_i} A_i log p_theta(x_{t+1})`` (0 where ``D_i`` is empty)."""
    anchor_kl: torch.Tensor
    """``(1/|N_i|) sum_{t in N_i} KL(p_base || p_theta)`` at the anchor positions (0 without base logits)."""


def reason_maxxer_loss(
    logits: torch.Tensor,
    base_logits: torch.Tensor | None,
    input_ids: torch.Tensor,
    advantages: torch.Tensor,
    decision: torch.Tensor,
    anchor: torch.Tensor,
    kl_coef: float,
    beta_neg: float = 1.0,
    neg_prob_floor: float = 0.0,
) -> LossParts:
    """ReasonMaxxer's loss (arXiv 2605.06241, eqs. 6-7) of each sequence.

    Args:
        logits: ``[N, T, V]`` the trained model's logits on ``input_ids``.
        base_logits: ``[N, T, V]`` the frozen base's, or ``None`` (no anchor: ``kl_coef`` 0).
        input_ids: ``[N, T]`` right-padded rows.
        advantages: ``[N]`` each sequence's advantage ``A_i``.
        decision: ``[N, T-1]`` bool, the decision positions ``D`` (entry ``t`` predicts token ``t + 1``).
        anchor: ``[N, T-1]`` bool, the anchor positions ``N`` (valid, not in ``D``).
        kl_coef: ``lambda``, the anchor's weight.
        beta_neg: scale of the negative advantages (1: the paper's loss).
        neg_prob_floor: a decision token of a negative-advantage sequence whose probability under the trained
            model is already below this stops being pushed down (no gradient; it still counts in ``|D_i|``).
            The negative term ``-A log p`` has no minimum, so without a floor it keeps driving a wrong token's
            logit down, and through the shared adapter the same token elsewhere. 0: off (the paper's loss).

    Returns:
        The per-sequence terms; log-softmax in float32. The KL is the forward ``KL(base || theta) = sum_v
        p_base (log p_base - log p_theta)``.
    """
    dec = decision.float()
    if base_logits is None:
        logp = token_logprobs(logits, input_ids)  # [N, T-1]
        kl = torch.zeros_like(advantages, dtype=torch.float32)
    else:
        lp_theta = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # [N, T-1, V]
        lp_base = torch.log_softmax(base_logits[:, :-1].float(), dim=-1)
        logp = lp_theta.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
        kl_tok = (lp_base.exp() * (lp_base - lp_theta)).sum(-1)  # [N, T-1]
        kl = (kl_tok * anchor).sum(-1) / anchor.sum(-1).clamp(min=1)
    adv = advantages.float()
    adv = torch.where(adv < 0, beta_neg * adv, adv)
    weight = adv[:, None].expand_as(logp)
    if neg_prob_floor > 0:
        below = (logp.detach() < math.log(neg_prob_floor)) & (weight < 0)
        weight = weight.masked_fill(below, 0.0)
    ce = -(weight * logp * dec).sum(-1) / dec.sum(-1).clamp(min=1)
    return LossParts(ce + kl_coef * kl, ce, kl)
