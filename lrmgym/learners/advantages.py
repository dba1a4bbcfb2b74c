"""Group-relative advantages: one scalar per completion from the rewards of its group.

Rewards come as a ``[B, G]`` tensor (B tasks, G completions each) with a ``[B, G]`` boolean ``valid`` mask:
an ungradeable completion (verdict score ``None``) is *masked*, never scored 0. It gets advantage 0, carries
no gradient, and does not enter its group's mean or standard deviation.

References:
    - GRPO: Shao et al. 2024, DeepSeekMath, https://arxiv.org/abs/2402.03300 (``(r - mean) / std``)
    - Dr. GRPO: Liu et al. 2025, https://arxiv.org/abs/2503.20783 (``r - mean``: no difficulty bias)
    - RLOO: Ahmadian et al. 2024, https://arxiv.org/abs/2402.14740 (leave-one-out baseline)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

__all__ = ["AdvEstimator", "GroupAdvantages", "group_advantages", "scores_to_tensors"]

AdvEstimator = Literal["grpo", "dr_grpo", "rloo"]


@dataclass
class GroupAdvantages:
    """Advantages of a batch of groups and what the learner logs about them.

    Attributes:
        advantages: ``[B, G]``; 0 where the sample is ungradeable or its group has no signal.
        valid: ``[B, G]`` bool, the gradeable samples.
        zero_variance: ``[B]`` bool, groups whose gradeable rewards are all equal (or fewer than 2 gradeable).
    """

    advantages: torch.Tensor
    valid: torch.Tensor
    zero_variance: torch.Tensor


def scores_to_tensors(scores: Sequence[Sequence[float | None]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn per-group score lists (``None`` = ungradeable) into ``rewards [B, G]`` and ``valid [B, G]``."""
    sizes = {len(g) for g in scores}
    if len(sizes) > 1:
        raise ValueError(f"Every group must have the same number of completions, got sizes {sorted(sizes)}.")
    valid = torch.tensor([[s is not None for s in g] for g in scores], dtype=torch.bool)
    rewards = torch.tensor([[0.0 if s is None else float(s) for s in g] for g in scores], dtype=torch.float64)
    return rewards, valid


def group_advantages(
    rewards: torch.Tensor, valid: torch.Tensor, estimator: AdvEstimator = "grpo", *, eps: float = 1e-6
) -> GroupAdvantages:
    """Group-relative advantages.

    With ``n`` gradeable samples in a group, mean ``m`` and unbiased standard deviation ``s`` of their rewards:

    - ``grpo``: ``(r_i - m) / (s + eps)``
    - ``dr_grpo``: ``r_i - m``
    - ``rloo``: ``r_i - mean_{j != i} r_j = n / (n - 1) * (r_i - m)``

    Args:
        rewards: ``[B, G]`` rewards (values under ``~valid`` are ignored).
        valid: ``[B, G]`` bool, gradeable samples.
        estimator: ``"grpo"``, ``"dr_grpo"`` or ``"rloo"``.
        eps: Added to the standard deviation (verl's value).

    Returns:
        The advantages, the mask and the zero-variance flags.
    """
    if rewards.shape != valid.shape or rewards.dim() != 2:
        raise ValueError(f"rewards and valid must both be [B, G]; got {tuple(rewards.shape)} and {tuple(valid.shape)}.")
    r = rewards.double() * valid  # [B, G], zero where masked
    n = valid.sum(-1, keepdim=True).double()  # [B, 1]
    mean = r.sum(-1, keepdim=True) / n.clamp(min=1.0)  # [B, 1]
    centred = (r - mean) * valid  # [B, G]
    var = centred.square().sum(-1, keepdim=True) / (n - 1.0).clamp(min=1.0)  # unbiased, like torch.std
    std = var.sqrt()
    # A tolerance, not == 0, so that float noise (0.1 + 0.2 vs 0.3) does not count as signal.
    zero_variance = (n.squeeze(-1) < 2) | (centred.abs().amax(-1) < 1e-9)  # [B]
    if estimator == "grpo":
        adv = centred / (std + eps)
    elif estimator == "dr_grpo":
        adv = centred
    elif estimator == "rloo":
        adv = centred * n / (n - 1.0).clamp(min=1.0)
    else:
        raise ValueError(f"Unknown advantage estimator {estimator!r}; expected 'grpo', 'dr_grpo' or 'rloo'.")
    adv = torch.where(zero_variance.unsqueeze(-1), torch.zeros_like(adv), adv) * valid
    return GroupAdvantages(advantages=adv.float(), valid=valid, zero_variance=zero_variance)
