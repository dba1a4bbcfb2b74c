"""Advantage estimators: pure functions of tensors, in registries.

**Group estimators** turn one scalar reward per completion into one advantage per completion. Rewards come
as a ``[B, G]`` tensor (B tasks, G completions each) with a ``[B, G]`` boolean ``valid`` mask: an
ungradeable completion (verdict score ``None``) is *masked*, never scored 0. It gets advantage 0, carries no
gradient, and enters no statistic (no group mean or std, no batch mean or std). One signature, registered by
name (``adv_estimator=...`` in a learner config)::

    fn(rewards [B, G], valid [B, G], **params) -> GroupAdvantages

Built in: ``grpo``, ``dr_grpo``, ``rloo``, ``reinforce_pp``, ``reinforce_pp_baseline``; add one with
:func:`register_advantage`.

**Token estimators** need a critic and work per token: ``gae`` (in :data:`TOKEN_ADVANTAGES`)::

    fn(rewards [N, T], values [N, T + 1] or [N, T], mask [N, T], **params) -> (advantages [N, T], returns [N, T])

References:
    - GRPO: Shao et al. 2024, DeepSeekMath, https://arxiv.org/abs/2402.03300 (``(r - mean) / std``)
    - Dr. GRPO: Liu et al. 2025, https://arxiv.org/abs/2503.20783 (``r - mean``: no difficulty bias)
    - RLOO: Ahmadian et al. 2024, https://arxiv.org/abs/2402.14740 (leave-one-out baseline)
    - REINFORCE++: Hu et al. 2025, https://arxiv.org/abs/2501.03262 (global batch whitening)
    - GAE: Schulman et al. 2016, https://arxiv.org/abs/1506.02438
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

import torch

from lrmgym.learners.engine.registry import FunctionRegistry, accepted_options

__all__ = [
    "GROUP_ADVANTAGES",
    "TOKEN_ADVANTAGES",
    "AdvEstimator",
    "AdvantageName",
    "GroupAdvantages",
    "dr_grpo",
    "gae",
    "get_advantage",
    "group_advantages",
    "grpo",
    "register_advantage",
    "register_token_advantage",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "rloo",
    "scores_to_tensors",
]

AdvEstimator = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"]
"""The built-in group estimators (a typing aid; :data:`GROUP_ADVANTAGES` is the authority)."""

_FLAT = 1e-9
"""Centred rewards below this count as no signal, so that float noise (0.1 + 0.2 vs 0.3) is not a direction."""


@dataclass
class GroupAdvantages:
    """Advantages of a batch of groups and what the learner logs about them.

    Attributes:
        advantages: ``[B, G]`` float32; 0 where the sample is ungradeable (and, for the group-relative
            estimators, where its group has no signal).
        valid: ``[B, G]`` bool, the gradeable samples.
        zero_variance: ``[B]`` bool, groups whose gradeable rewards are all equal (or fewer than 2 gradeable).
    """

    advantages: torch.Tensor
    valid: torch.Tensor
    zero_variance: torch.Tensor


GroupAdvantageFn = Callable[..., GroupAdvantages]
"""``fn(rewards [B, G], valid [B, G], **params) -> GroupAdvantages``."""
TokenAdvantageFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
"""``fn(rewards [N, T], values [N, T + 1] or [N, T], mask [N, T], **params) -> (advantages, returns)``."""

GROUP_ADVANTAGES: FunctionRegistry[GroupAdvantageFn] = FunctionRegistry(
    "group advantage estimator", "lrmgym.learners.algorithms.advantages.register_advantage"
)
"""The registered group advantage estimators by name."""
TOKEN_ADVANTAGES: FunctionRegistry[TokenAdvantageFn] = FunctionRegistry(
    "token advantage estimator", "lrmgym.learners.algorithms.advantages.register_token_advantage"
)
"""The registered per-token (critic-based) advantage estimators by name."""
register_advantage = GROUP_ADVANTAGES.register
register_token_advantage = TOKEN_ADVANTAGES.register
get_advantage = GROUP_ADVANTAGES.lookup
AdvantageName = Annotated[str, GROUP_ADVANTAGES]
"""A config field type: the name of a registered group advantage estimator (checked at validation)."""


def scores_to_tensors(scores: Sequence[Sequence[float | None]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn per-group score lists (``None`` = ungradeable) into ``rewards [B, G]`` and ``valid [B, G]``."""
    sizes = {len(g) for g in scores}
    if len(sizes) > 1:
        raise ValueError(f"Every group must have the same number of completions, got sizes {sorted(sizes)}.")
    valid = torch.tensor([[s is not None for s in g] for g in scores], dtype=torch.bool)
    rewards = torch.tensor([[0.0 if s is None else float(s) for s in g] for g in scores], dtype=torch.float64)
    return rewards, valid


@dataclass
class _Groups:
    """Per-group statistics over the gradeable samples (float64): ``n``, ``mean`` and ``std`` are ``[B, 1]``."""

    valid: torch.Tensor  # [B, G] bool
    n: torch.Tensor  # [B, 1] gradeable samples per group
    centred: torch.Tensor  # [B, G] r - mean, 0 where ungradeable
    std: torch.Tensor  # [B, 1] unbiased (n - 1), like torch.std
    zero_variance: torch.Tensor  # [B] bool

    @classmethod
    def of(cls, rewards: torch.Tensor, valid: torch.Tensor) -> _Groups:
        if rewards.shape != valid.shape or rewards.dim() != 2:
            raise ValueError(
                f"rewards and valid must both be [B, G]; got {tuple(rewards.shape)} and {tuple(valid.shape)}."
            )
        valid = valid.bool()
        r = rewards.double() * valid  # [B, G], zero where masked
        n = valid.sum(-1, keepdim=True).double()  # [B, 1]
        mean = r.sum(-1, keepdim=True) / n.clamp(min=1.0)  # [B, 1]
        centred = (r - mean) * valid  # [B, G]
        var = centred.square().sum(-1, keepdim=True) / (n - 1.0).clamp(min=1.0)
        zero_variance = (n.squeeze(-1) < 2) | (centred.abs().amax(-1) < _FLAT)  # [B]
        return cls(valid=valid, n=n, centred=centred, std=var.sqrt(), zero_variance=zero_variance)

    def finish(self, adv: torch.Tensor) -> GroupAdvantages:
        """Group-relative advantages: 0 for groups without signal and for ungradeable samples."""
        adv = torch.where(self.zero_variance.unsqueeze(-1), torch.zeros_like(adv), adv) * self.valid
        return GroupAdvantages(advantages=adv.float(), valid=self.valid, zero_variance=self.zero_variance)


def _whiten(x: torch.Tensor, valid: torch.Tensor, eps: float) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` with the mean and unbiased std over the ``valid`` entries of the whole batch."""
    if x.numel() == 0:  # a batch without groups (a DAPO step whose round cap left none)
        return torch.zeros_like(x)
    n = valid.sum().double()
    mean = (x * valid).sum() / n.clamp(min=1.0)
    centred = (x - mean) * valid
    if centred.abs().max() < _FLAT:  # every gradeable value equal (or none): no direction, not noise / eps
        return torch.zeros_like(x)
    std = (centred.square().sum() / (n - 1.0).clamp(min=1.0)).sqrt()
    return centred / (std + eps)


@register_advantage("grpo")
def grpo(rewards: torch.Tensor, valid: torch.Tensor, *, eps: float = 1e-6) -> GroupAdvantages:
    """GRPO (DeepSeekMath): ``A_i = (r_i - mean) / (std + eps)`` within each group.

    ``mean`` and the unbiased ``std`` (divisor ``n - 1``, as ``torch.std`` and verl) run over the group's
    ``n`` gradeable samples.

    Args:
        rewards: ``[B, G]`` rewards (values under ``~valid`` are ignored).
        valid: ``[B, G]`` bool, gradeable samples.
        eps: Added to the standard deviation (verl's 1e-6).
    """
    g = _Groups.of(rewards, valid)
    return g.finish(g.centred / (g.std + eps))


@register_advantage("dr_grpo")
def dr_grpo(rewards: torch.Tensor, valid: torch.Tensor) -> GroupAdvantages:
    """Dr. GRPO: ``A_i = r_i - mean`` within each group (no std: no question-difficulty bias).

    Args:
        rewards: ``[B, G]`` rewards (values under ``~valid`` are ignored).
        valid: ``[B, G]`` bool, gradeable samples.
    """
    g = _Groups.of(rewards, valid)
    return g.finish(g.centred)


@register_advantage("rloo")
def rloo(rewards: torch.Tensor, valid: torch.Tensor) -> GroupAdvantages:
    """RLOO: ``A_i = r_i - mean_{j != i} r_j = n / (n - 1) * (r_i - mean)`` over the group's gradeable samples.

    Args:
        rewards: ``[B, G]`` rewards (values under ``~valid`` are ignored).
        valid: ``[B, G]`` bool, gradeable samples.
    """
    g = _Groups.of(rewards, valid)
    return g.finish(g.centred * g.n / (g.n - 1.0).clamp(min=1.0))


@register_advantage("reinforce_pp")
def reinforce_pp(rewards: torch.Tensor, valid: torch.Tensor, *, eps: float = 1e-6) -> GroupAdvantages:
    """REINFORCE++ (Hu et al. 2025): no group baseline, the rewards whitened over the whole batch.

    ``A_i = (r_i - mean_batch) / (std_batch + eps)``, with the mean and unbiased std over every gradeable
    sample of the ``[B, G]`` batch. Unlike the group-relative estimators, an all-correct group gets positive
    advantages when the batch average is lower (``zero_variance`` is still reported, for the metrics).

    The paper's per-token reward also carries a KL penalty, ``A_t = R - beta * sum_{s >= t} KL_s``, whitened
    over all tokens. A group estimator sees one reward per sample, so this is the ``beta = 0`` form whitened
    over samples: each sample counts once, not once per token (the two agree when lengths are equal).

    Args:
        rewards: ``[B, G]`` rewards (values under ``~valid`` are ignored).
        valid: ``[B, G]`` bool, gradeable samples.
        eps: Added to the batch standard deviation.
    """
    g = _Groups.of(rewards, valid)
    adv = _whiten(rewards.double(), g.valid, eps)
    return GroupAdvantages(advantages=adv.float(), valid=g.valid, zero_variance=g.zero_variance)


@register_advantage("reinforce_pp_baseline")
def reinforce_pp_baseline(rewards: torch.Tensor, valid: torch.Tensor, *, eps: float = 1e-6) -> GroupAdvantages:
    """REINFORCE++-baseline (Hu et al. 2025; verl's ``reinforce_plus_plus_baseline``).

    ``A_i = r_i - mean_group``, then whitened over the batch: ``(A - mean_batch(A)) / (std_batch(A) + eps)``,
    the mean and unbiased std over every gradeable sample of the batch (zero-variance groups' zeros included,
    ungradeable samples not). The group mean removes the prompt's difficulty; the batch std, unlike GRPO's
    per-group std, does not rescale hard and easy prompts differently. Each sample counts once (see
    :func:`reinforce_pp`). Zero-variance groups keep advantage 0: their centred rewards are 0 and the batch
    mean of group-centred rewards is 0, up to rounding that is not let through.

    Args:
        rewards: ``[B, G]`` rewards (values under ``~valid`` are ignored).
        valid: ``[B, G]`` bool, gradeable samples.
        eps: Added to the batch standard deviation.
    """
    g = _Groups.of(rewards, valid)
    centred = torch.where(g.zero_variance.unsqueeze(-1), torch.zeros_like(g.centred), g.centred)
    return g.finish(_whiten(centred, g.valid, eps))


def group_advantages(
    rewards: torch.Tensor, valid: torch.Tensor, estimator: str = "grpo", *, eps: float = 1e-6
) -> GroupAdvantages:
    """The registered group estimator ``estimator`` (what the GRPO learner calls).

    ``eps`` reaches the estimators that name it (grpo and the REINFORCE++ pair).

    Args:
        rewards: ``[B, G]`` rewards (values under ``~valid`` are ignored).
        valid: ``[B, G]`` bool, gradeable samples.
        estimator: A name in :data:`GROUP_ADVANTAGES`.
        eps: Added to the standard deviation.

    Returns:
        The advantages, the mask and the zero-variance flags.
    """
    fn = get_advantage(estimator)
    return fn(rewards, valid, **accepted_options(fn, eps=eps))


@register_token_advantage("gae")
def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, *, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) over the policy's tokens.

    ::

        delta_t = r_t + gamma * V_next(t) - V_t
        A_t     = delta_t + gamma * lam * A_next(t)          returns_t = A_t + V_t

    The recursion runs over the tokens where ``mask`` is set and *skips* the others: ``next(t)`` is the
    row's next policy token, so env-feedback tokens between two policy turns cost no discount step and
    their rewards and values are ignored (put a turn's reward on a policy token). After a row's last policy
    token, ``V_next`` is ``values[:, T]`` when ``values`` has ``T + 1`` columns (the bootstrap value, 0 for a
    finished episode) and 0 when it has ``T``; values at padding are never read, so nothing bootstraps
    across padding. This is verl's masked GAE.

    Args:
        rewards: ``[N, T]`` per-token rewards (e.g. the outcome on the last policy token, minus a KL penalty).
        values: ``[N, T + 1]`` or ``[N, T]`` the critic's values (detached here).
        mask: ``[N, T]`` the policy's tokens.
        gamma: Discount per policy token.
        lam: GAE's lambda (1: Monte-Carlo returns minus V; 0: one-step TD).

    Returns:
        ``(advantages [N, T], returns [N, T])``, both 0 where ``mask`` is 0, detached.
    """
    n, t_len = rewards.shape
    if mask.shape != rewards.shape or values.shape not in ((n, t_len), (n, t_len + 1)):
        raise ValueError(
            f"gae needs rewards and mask [N, T] and values [N, T + 1] or [N, T]; got rewards "
            f"{tuple(rewards.shape)}, mask {tuple(mask.shape)}, values {tuple(values.shape)}."
        )
    on = mask.bool()
    rewards, values = rewards.detach(), values.detach()
    next_value = values[:, t_len] if values.shape[1] == t_len + 1 else torch.zeros_like(values[:, 0])  # [N]
    next_adv = torch.zeros_like(next_value)  # [N]
    adv = torch.zeros_like(rewards)
    for t in reversed(range(t_len)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        a = delta + gamma * lam * next_adv
        adv[:, t] = torch.where(on[:, t], a, 0.0)
        next_adv = torch.where(on[:, t], a, next_adv)  # a skipped token passes its successor's values on
        next_value = torch.where(on[:, t], values[:, t], next_value)
    returns = (adv + values[:, :t_len]).masked_fill(~on, 0.0)
    return adv, returns
