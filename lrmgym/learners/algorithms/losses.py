"""Policy-gradient losses for group-relative learners: pure functions of tensors, in a registry.

Shapes: ``N`` sequences (trajectories) by ``T`` positions. Every per-token tensor is aligned to the *target*
token: ``logp[n, t]`` is the log-probability of token ``t + 1`` of sequence ``n`` given tokens ``0..t`` (what
:func:`~lrmgym.learners.algorithms.logprobs.token_logprobs` returns; re-exported here), and ``mask[n, t]`` says
whether that target token was written by the policy (prompt, padding and env-feedback tokens are 0).

Every policy loss has one signature and is registered by name (``pg_loss=...`` in a learner config)::

    fn(logp [N, T], old_logp [N, T], advantages [N] or [N, T], mask [N, T], **params) -> PolicyLossOutput

with a per-token loss to *minimise*, zero outside the mask (reduce it with :func:`aggregate`). Built in:
``ppo_clip``, ``cispo``, ``gspo`` and ``reinforce``; add one with :func:`register_policy_loss`.

References:
    - GRPO: Shao et al. 2024, DeepSeekMath, https://arxiv.org/abs/2402.03300
    - PPO clipped surrogate: Schulman et al. 2017, https://arxiv.org/abs/1707.06347
    - Dual-clip PPO: Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep RL",
      https://arxiv.org/abs/1912.09729
    - DAPO (clip-higher, token-level loss): Yu et al. 2025, https://arxiv.org/abs/2503.14476
    - Dr. GRPO (no length normalisation): Liu et al. 2025, https://arxiv.org/abs/2503.20783
    - CISPO (clipped importance-sampling weights): MiniMax-M1, https://arxiv.org/abs/2506.13585
    - Ring-Zero (CISPO-form loss with an absolute IS cap of 5.0): https://arxiv.org/abs/2607.12395
    - GSPO (sequence-level ratio): Zheng et al. 2025, https://arxiv.org/abs/2507.18071
    - REINFORCE: Williams 1992, "Simple statistical gradient-following algorithms for connectionist RL"
    - KL estimators k1/k2/k3: J. Schulman, "Approximating KL divergence", http://joschu.net/blog/kl-approx.html
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Literal

import torch

from lrmgym.learners.algorithms.logprobs import token_entropy, token_logprobs
from lrmgym.learners.engine.registry import FunctionRegistry, accepted_options

__all__ = [
    "POLICY_LOSSES",
    "KLEstimator",
    "LossAgg",
    "PGLoss",
    "PolicyLossName",
    "PolicyLossOutput",
    "aggregate",
    "cispo",
    "get_policy_loss",
    "gspo",
    "kl_penalty",
    "policy_loss",
    "ppo_clip",
    "register_policy_loss",
    "reinforce",
    "token_entropy",
    "token_logprobs",
]

PGLoss = Literal["ppo_clip", "cispo", "gspo", "reinforce"]
"""The built-in policy losses (a typing aid; :data:`POLICY_LOSSES` is the authority)."""
LossAgg = Literal["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"]
KLEstimator = Literal["k1", "k2", "k3"]


@dataclass
class PolicyLossOutput:
    """Per-token policy-gradient loss and the statistics the learner logs.

    Attributes:
        loss: ``[N, T]`` per-token loss (to be aggregated with :func:`aggregate`); 0 where the mask is 0.
        clipped: ``[N, T]`` bool, where a clip was active (the gradient of that token is cut or capped).
        ratio: ``[N, T]`` the importance ratio ``pi_theta / pi_old`` (detached; for ``gspo`` the sequence's
            ratio on each of its tokens); 0 where the mask is 0.
    """

    loss: torch.Tensor
    clipped: torch.Tensor
    ratio: torch.Tensor


PolicyLossFn = Callable[..., PolicyLossOutput]
"""``fn(logp [N, T], old_logp [N, T], advantages [N] or [N, T], mask [N, T], **params) -> PolicyLossOutput``."""

POLICY_LOSSES: FunctionRegistry[PolicyLossFn] = FunctionRegistry(
    "policy loss", "lrmgym.learners.algorithms.losses.register_policy_loss"
)
"""The registered policy losses by name."""
register_policy_loss = POLICY_LOSSES.register
get_policy_loss = POLICY_LOSSES.lookup
PolicyLossName = Annotated[str, POLICY_LOSSES]
"""A config field type: the name of a registered policy loss (checked at validation)."""


def _per_token(advantages: torch.Tensor) -> torch.Tensor:
    """``[N]`` (one advantage per sequence) -> ``[N, 1]``, which broadcasts over ``T``; ``[N, T]`` unchanged."""
    return advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages


def _output(loss: torch.Tensor, clipped: torch.Tensor, ratio: torch.Tensor, mask: torch.Tensor) -> PolicyLossOutput:
    """Zero the outputs outside the mask (prompt, padding and env feedback), where their values mean nothing."""
    off = ~mask.bool()
    return PolicyLossOutput(
        loss=loss.masked_fill(off, 0.0),
        clipped=clipped.detach() & ~off,
        ratio=ratio.detach().masked_fill(off, 0.0),
    )


@register_policy_loss("ppo_clip")
def ppo_clip(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
) -> PolicyLossOutput:
    """PPO's pessimistic clipped surrogate with separate bounds (PPO; DAPO's clip-higher).

    ::

        loss = -min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A),   rho = exp(logp - old_logp)

    With ``dual_clip = c > 1`` (Ye et al. 2020), tokens with ``A < 0`` also have their loss bounded by
    ``-c * A``: ``loss = min(loss, -c * A)``. Without it a negative-advantage token whose ratio has run far
    above ``1 + clip_high`` contributes ``-rho * A``, unbounded in ``rho``. Positive advantages are untouched.

    Args:
        logp: ``[N, T]`` log-probs of the sampled tokens under the current policy (with grad).
        old_logp: ``[N, T]`` log-probs under the behaviour policy that sampled them (no grad).
        advantages: ``[N]`` one advantage per sequence (broadcast over its tokens) or ``[N, T]``.
        mask: ``[N, T]`` the policy's tokens.
        clip_low: ``epsilon_low``: the ratio floor is ``1 - clip_low`` (GRPO/PPO 0.2).
        clip_high: ``epsilon_high``: the ratio cap is ``1 + clip_high`` (PPO 0.2, DAPO 0.28).
        dual_clip: The dual-clip constant ``c`` (> 1; verl's default 3.0), or None for plain PPO.

    Returns:
        The per-token loss; ``clipped`` marks tokens whose gradient a clip cut.
    """
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(
            f"ppo_clip's dual_clip must be > 1 (Ye et al. use 3.0), got {dual_clip!r}; or None to disable it."
        )
    adv = _per_token(advantages)
    ratio = torch.exp(logp - old_logp.detach())  # [N, T]
    unclipped_obj = ratio * adv
    clipped_obj = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    loss = -torch.minimum(unclipped_obj, clipped_obj)
    clipped = clipped_obj < unclipped_obj  # the min picked the clipped branch: no gradient there
    if dual_clip is not None:
        bound = -dual_clip * adv  # [N, 1] or [N, T]; positive where A < 0
        dual = (adv < 0) & (loss > bound)  # the dual clip binds: a constant, so no gradient either
        loss = torch.where(dual, bound, loss)
        clipped = clipped | dual
    return _output(loss, clipped, ratio, mask)


@register_policy_loss("cispo")
def cispo(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_high: float = 0.2,
    is_cap: float | None = None,
    is_cap_mode: Literal["relative", "absolute"] = "relative",
    is_floor: float | None = None,
) -> PolicyLossOutput:
    """REINFORCE weighted by a capped, stop-gradient importance weight (CISPO, MiniMax-M1).

    ::

        loss = -sg(w) * A * logp,   w = min(rho, cap),   rho = exp(logp - old_logp)

    Unlike PPO-clip, no token loses its gradient: a capped token still contributes ``-cap * A * grad logp``.
    MiniMax-M1 writes the weight as ``clip(rho, 1 - eps_low, 1 + eps_high)`` but removes the lower bound (a
    very large ``eps_low``) and tunes only ``eps_high``; Ring-Zero's stage-1 loss is this form with no lower
    bound and a cap of 5.0. So there is no floor unless ``is_floor`` asks for one.

    The cap: ``1 + clip_high`` by default; ``1 + is_cap`` with ``is_cap`` in ``"relative"`` mode; ``is_cap``
    itself in ``"absolute"`` mode (Ring-Zero's ``is_ratio_cap = 5.0``; its sources leave open whether 5.0 is
    the cap or ``eps_high``, the two modes cover both readings).

    Args:
        logp: ``[N, T]`` log-probs of the sampled tokens under the current policy (with grad).
        old_logp: ``[N, T]`` log-probs under the behaviour policy (no grad).
        advantages: ``[N]`` or ``[N, T]``.
        mask: ``[N, T]`` the policy's tokens.
        clip_high: ``eps_high`` of the relative cap ``1 + clip_high``, when ``is_cap`` is None.
        is_cap: The cap's ``eps_high`` (relative mode) or the cap itself (absolute mode).
        is_cap_mode: ``"relative"`` (cap ``1 + eps``) or ``"absolute"`` (cap ``is_cap``, which is then required).
        is_floor: A lower bound of the weight itself (e.g. 0.8 for ``eps_low = 0.2``); None: no floor.

    Returns:
        The per-token loss; ``clipped`` marks tokens whose weight was capped (or floored).
    """
    if is_cap_mode == "absolute":
        if is_cap is None:
            raise ValueError("cispo's is_cap_mode='absolute' needs is_cap (the cap itself, e.g. 5.0 for Ring-Zero).")
        cap = float(is_cap)
    elif is_cap_mode == "relative":
        cap = 1.0 + (clip_high if is_cap is None else is_cap)
    else:
        raise ValueError(f"cispo's is_cap_mode must be 'relative' or 'absolute', got {is_cap_mode!r}.")
    if not cap > 0.0 or (is_floor is not None and not 0.0 <= is_floor <= cap):
        raise ValueError(
            f"cispo needs 0 <= is_floor <= cap and cap > 0, got cap={cap!r}, is_floor={is_floor!r}; "
            "raise the cap or lower the floor."
        )
    adv = _per_token(advantages)
    ratio = torch.exp(logp - old_logp.detach())  # [N, T]
    weight = ratio.clamp(min=is_floor, max=cap)
    loss = -weight.detach() * adv * logp
    clipped = ratio > cap
    if is_floor is not None:
        clipped = clipped | (ratio < is_floor)
    return _output(loss, clipped, ratio, mask)


@register_policy_loss("gspo")
def gspo(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
) -> PolicyLossOutput:
    """PPO's clipped surrogate on a length-normalised *sequence* ratio (GSPO, Zheng et al. 2025).

    ::

        s_i = exp( (1 / |o_i|) * sum_{t in o_i} (logp_t - old_logp_t) )     (the policy's tokens only)
        loss_i = -min(s_i * A_i, clip(s_i, 1 - clip_low, 1 + clip_high) * A_i)

    In the paper's token form, ``s_{i,t} = sg(s_i) * pi(y_t) / sg(pi(y_t))``: every token of sequence ``i``
    has the value ``s_i`` and ``d s_{i,t} / d logp_t = s_i``. Averaged over each sequence's tokens
    (``loss_agg = seq_mean_token_mean``) this is exactly GSPO's objective and gradient,
    ``s_i * A_i * mean_t grad logp_t``; the clip then drops or keeps whole sequences. Token advantages
    ``[N, T]`` are allowed by the token form.

    Args:
        logp: ``[N, T]`` log-probs of the sampled tokens under the current policy (with grad).
        old_logp: ``[N, T]`` log-probs under the behaviour policy (no grad).
        advantages: ``[N]`` or ``[N, T]``.
        mask: ``[N, T]`` the policy's tokens: only they enter ``s_i`` (padding and env feedback do not).
        clip_low: ``eps_low`` of the sequence ratio; the paper's 3e-4 (ratios of whole sequences sit much
            closer to 1 than token ratios do).
        clip_high: ``eps_high``; the paper's 4e-4.

    Returns:
        The per-token loss; ``ratio`` holds each sequence's ``s_i`` on its tokens.
    """
    on = mask.bool()
    adv = _per_token(advantages)
    log_ratio = (logp - old_logp.detach()).masked_fill(~on, 0.0)  # [N, T]
    seq_log_ratio = log_ratio.sum(-1) / on.sum(-1).clamp(min=1)  # [N], log of the geometric mean
    ratio = torch.exp(seq_log_ratio.detach().unsqueeze(-1) + logp - logp.detach())  # [N, T], value s_i
    unclipped_obj = ratio * adv
    clipped_obj = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    loss = -torch.minimum(unclipped_obj, clipped_obj)
    return _output(loss, clipped_obj < unclipped_obj, ratio, mask)


@register_policy_loss("reinforce")
def reinforce(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
) -> PolicyLossOutput:
    """Plain REINFORCE (Williams 1992; RLOO's on-policy loss): ``loss = -A * logp``, no ratio, no clip.

    ``old_logp`` only feeds the logged ``ratio``; the loss ignores it, so it is on-policy only.

    Args:
        logp: ``[N, T]`` log-probs of the sampled tokens under the current policy (with grad).
        old_logp: ``[N, T]`` log-probs under the behaviour policy (for the logged ratio).
        advantages: ``[N]`` or ``[N, T]``.
        mask: ``[N, T]`` the policy's tokens.
    """
    ratio = torch.exp(logp - old_logp.detach())
    loss = -_per_token(advantages) * logp
    return _output(loss, torch.zeros_like(mask, dtype=torch.bool), ratio, mask)


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    kind: str = "ppo_clip",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    is_cap: float | None = None,
    is_cap_mode: str = "relative",
) -> PolicyLossOutput:
    """The registered policy loss ``kind`` with a learner's clip knobs (what the GRPO learner calls).

    A loss receives a knob when its signature names it: ``ppo_clip`` and ``gspo`` take ``clip_low`` and
    ``clip_high``, ``cispo`` ``clip_high``, ``is_cap`` and ``is_cap_mode`` (its cap: ``1 + clip_high``, or
    ``is_cap`` itself in ``"absolute"`` mode, Ring-Zero's 5.0; it has no floor), ``reinforce`` none.

    Args:
        logp: ``[N, T]`` log-probs of the sampled tokens under the current policy (with grad).
        old_logp: ``[N, T]`` log-probs under the behaviour policy that sampled them (no grad).
        advantages: ``[N]`` one advantage per sequence (broadcast over its tokens) or ``[N, T]``.
        mask: ``[N, T]`` the policy's tokens; None counts every position.
        kind: A name in :data:`POLICY_LOSSES`.
        clip_low: Lower clip ``epsilon_low`` (ratio floor ``1 - clip_low``).
        clip_high: Upper clip ``epsilon_high`` (ratio cap ``1 + clip_high``); DAPO uses 0.28.
        is_cap: The importance-weight cap of a capped-IS loss (``cispo``): its ``eps_high`` in ``"relative"``
            mode, the cap itself in ``"absolute"`` mode; None: ``1 + clip_high``.
        is_cap_mode: ``"relative"`` or ``"absolute"``.

    Returns:
        The per-token loss with clip statistics.
    """
    fn = get_policy_loss(kind)
    if mask is None:
        mask = torch.ones(logp.shape, dtype=torch.bool, device=logp.device)
    options = accepted_options(fn, clip_low=clip_low, clip_high=clip_high, is_cap=is_cap, is_cap_mode=is_cap_mode)
    if (is_cap is not None or is_cap_mode != "relative") and "is_cap" not in options:
        raise ValueError(
            f"policy loss {kind!r} has no importance-weight cap (is_cap={is_cap!r}, is_cap_mode={is_cap_mode!r}); "
            "leave is_cap unset or use pg_loss=cispo."
        )
    return fn(logp, old_logp, advantages, mask, **options)


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: KLEstimator = "k3") -> torch.Tensor:
    """Per-token estimate of ``KL(pi_theta || pi_ref)`` from samples of ``pi_theta``, ``[N, T]``.

    With ``r = ref_logp - logp`` (log of ``pi_ref / pi_theta``): ``k1 = -r`` (unbiased, can be negative),
    ``k2 = r**2 / 2`` (biased, low variance), ``k3 = exp(r) - r - 1`` (unbiased, always >= 0; GRPO's choice).
    """
    r = ref_logp.detach() - logp
    if estimator == "k1":
        return -r
    if estimator == "k2":
        return 0.5 * r.square()
    if estimator == "k3":
        # Clamp r before exp so that a token the reference finds far likelier cannot overflow to inf.
        r = r.clamp(-20.0, 20.0)
        return torch.exp(r) - r - 1.0
    raise ValueError(f"Unknown KL estimator {estimator!r}; expected 'k1', 'k2' or 'k3'.")


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, mode: LossAgg = "seq_mean_token_mean", *, norm_len: int | None = None
) -> torch.Tensor:
    """Reduce a per-token loss ``[N, T]`` to a scalar over the tokens where ``mask`` is set.

    - ``seq_mean_token_mean`` (GRPO): average each sequence over its own tokens, then average the sequences.
    - ``token_mean`` (DAPO): one average over every token of the batch, so long sequences weigh more.
    - ``seq_mean_token_sum_norm`` (Dr. GRPO): sum each sequence's tokens, divide by the constant
      ``norm_len`` (e.g. the generation budget), average the sequences; no length bias.

    Sequences without any masked-in token are left out of the sequence means. An all-zero mask gives 0
    (still connected to the graph, so ``backward()`` works).
    """
    mask = mask.to(per_token.dtype)
    masked = per_token * mask  # [N, T]
    if mode == "token_mean":
        return masked.sum() / mask.sum().clamp(min=1.0)
    tokens = mask.sum(-1)  # [N]
    has_tokens = (tokens > 0).to(per_token.dtype)  # [N]
    n_seq = has_tokens.sum().clamp(min=1.0)
    if mode == "seq_mean_token_mean":
        per_seq = masked.sum(-1) / tokens.clamp(min=1.0)  # [N]
    elif mode == "seq_mean_token_sum_norm":
        if norm_len is None or norm_len <= 0:
            raise ValueError(
                f"loss aggregation 'seq_mean_token_sum_norm' needs a positive norm_len (the generation budget), "
                f"got {norm_len!r}."
            )
        per_seq = masked.sum(-1) / float(norm_len)
    else:
        raise ValueError(
            f"Unknown loss aggregation {mode!r}; expected 'seq_mean_token_mean', 'token_mean' or "
            "'seq_mean_token_sum_norm'."
        )
    return (per_seq * has_tokens).sum() / n_seq
