"""Policy-gradient losses for group-relative learners: pure functions of tensors.

Shapes: ``N`` sequences (trajectories) by ``T`` positions. Every per-token tensor is aligned to the *target*
token: ``logp[n, t]`` is the log-probability of token ``t + 1`` of sequence ``n`` given tokens ``0..t`` (what
:func:`token_logprobs` returns), and ``mask[n, t]`` says whether that target token was written by the policy
(prompt, padding and env-feedback tokens are 0).

References:
    - GRPO: Shao et al. 2024, DeepSeekMath, https://arxiv.org/abs/2402.03300
    - PPO clipped surrogate: Schulman et al. 2017, https://arxiv.org/abs/1707.06347
    - DAPO (clip-higher, token-level loss): Yu et al. 2025, https://arxiv.org/abs/2503.14476
    - Dr. GRPO (no length normalisation): Liu et al. 2025, https://arxiv.org/abs/2503.20783
    - CISPO (clipped importance-sampling weights): MiniMax-M1, https://arxiv.org/abs/2506.13585
    - KL estimators k1/k2/k3: J. Schulman, "Approximating KL divergence", http://joschu.net/blog/kl-approx.html
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

__all__ = [
    "KLEstimator",
    "LossAgg",
    "PGLoss",
    "PolicyLossOutput",
    "aggregate",
    "kl_penalty",
    "policy_loss",
    "token_entropy",
    "token_logprobs",
]

PGLoss = Literal["ppo_clip", "cispo"]
LossAgg = Literal["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"]
KLEstimator = Literal["k1", "k2", "k3"]


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Log-probability of each next token.

    Args:
        logits: ``[N, T, V]`` model outputs for ``input_ids``.
        input_ids: ``[N, T]`` the token sequences.

    Returns:
        ``[N, T - 1]``: entry ``t`` is ``log p(input_ids[:, t + 1] | input_ids[:, :t + 1])``.
    """
    logits = logits[:, :-1].float()  # [N, T-1, V]
    targets = input_ids[:, 1:].unsqueeze(-1)  # [N, T-1, 1]
    # log_softmax then gather; logsumexp is the numerically safe normaliser.
    picked = torch.gather(logits, -1, targets).squeeze(-1)  # [N, T-1]
    return picked - torch.logsumexp(logits, dim=-1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution at each position, ``[N, T, V] -> [N, T - 1]`` (nats)."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # [N, T-1, V]
    return -(logp.exp() * logp).sum(-1)


@dataclass
class PolicyLossOutput:
    """Per-token policy-gradient loss and the statistics the learner logs.

    Attributes:
        loss: ``[N, T]`` per-token loss (to be aggregated with :func:`aggregate`).
        clipped: ``[N, T]`` bool, where the clip was active (the gradient of that token is cut or capped).
        ratio: ``[N, T]`` the importance ratio ``pi_theta / pi_old`` (detached).
    """

    loss: torch.Tensor
    clipped: torch.Tensor
    ratio: torch.Tensor


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    *,
    kind: PGLoss = "ppo_clip",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
) -> PolicyLossOutput:
    """The per-token policy-gradient loss (to minimise).

    ``ppo_clip`` is PPO's pessimistic clipped surrogate with separate bounds (DAPO's clip-higher)::

        loss = -min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A),   rho = exp(logp - old_logp)

    ``cispo`` keeps every token's gradient but clips and detaches the importance weight (MiniMax-M1)::

        loss = -sg(clip(rho, 1 - clip_low, 1 + clip_high)) * A * logp

    At ``rho = 1`` both give ``loss = -A`` in value (``ppo_clip``) or in gradient (``cispo``).

    Args:
        logp: ``[N, T]`` log-probs of the sampled tokens under the current policy (with grad).
        old_logp: ``[N, T]`` log-probs under the behaviour policy that sampled them (no grad).
        advantages: ``[N]`` one advantage per sequence (broadcast over its tokens) or ``[N, T]``.
        kind: ``"ppo_clip"`` or ``"cispo"``.
        clip_low: Lower clip ``epsilon_low`` (ratio floor ``1 - clip_low``).
        clip_high: Upper clip ``epsilon_high`` (ratio cap ``1 + clip_high``); DAPO uses 0.28.

    Returns:
        The per-token loss with clip statistics.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)  # [N, 1], broadcasts over T
    log_ratio = logp - old_logp.detach()
    ratio = torch.exp(log_ratio)  # [N, T]
    clipped_ratio = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    if kind == "ppo_clip":
        unclipped_obj = ratio * advantages
        clipped_obj = clipped_ratio * advantages
        loss = -torch.minimum(unclipped_obj, clipped_obj)
        clipped = clipped_obj < unclipped_obj  # the min picked the clipped branch: no gradient there
    elif kind == "cispo":
        loss = -clipped_ratio.detach() * advantages * logp
        clipped = (ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)
    else:
        raise ValueError(f"Unknown policy loss kind {kind!r}; expected 'ppo_clip' or 'cispo'.")
    return PolicyLossOutput(loss=loss, clipped=clipped.detach(), ratio=ratio.detach())


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
