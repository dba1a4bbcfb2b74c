"""Per-token statistics of a causal LM's logits: the log-probability of each next token and the entropy.

Both are aligned to the *target* token, as every per-token tensor of the learners is: entry ``t`` of a row
scores token ``t + 1`` given tokens ``0..t`` (see :mod:`lrmgym.learners.algorithms.losses`).
"""

from __future__ import annotations

import torch

__all__ = ["token_entropy", "token_logprobs"]


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
