"""KL-LoRA distillation's loss (ReasonMaxxer paper, arXiv 2605.06241, eq. 4) over the teacher's cached top-k."""

from __future__ import annotations

import torch

__all__ = ["forward_kl_topk", "teacher_topk"]


def teacher_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's ``k`` most likely tokens at each position and their log-probabilities renormalised over them.

    Args:
        logits: ``[..., V]`` the teacher's next-token logits (temperature 1).
        k: How many to keep (at most ``V``).

    Returns:
        ``ids [..., k]`` (descending) and ``log q [..., k]`` with ``sum exp(log q) = 1`` over the ``k`` kept: the
        top-k logits' own log-softmax, so the mass outside the top k is dropped, not lumped into a bucket.
    """
    values, ids = logits.float().topk(min(k, logits.shape[-1]), dim=-1)
    return ids, torch.log_softmax(values, dim=-1)


def forward_kl_topk(
    student_logits: torch.Tensor, ids: torch.Tensor, logq: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Token-level forward ``KL(teacher || student)`` over the teacher's top-k support, 0 where ``mask`` is off.

    ``KL_t = sum_{v in topk_t} q(v) (log q(v) - log p_theta(v))``, where ``q`` is the teacher's renormalised
    top-k distribution (:func:`teacher_topk`) and ``p_theta`` the student's full softmax (float32 log-softmax
    over the whole vocabulary, so the student's mass outside the top k raises the loss; it is >= 0 and 0 only
    when the student puts exactly ``q`` on the top k). The direction is the paper's eq. 4: the expectation is
    under the teacher, so it is mass-covering (the student is pushed up wherever the teacher has mass).

    Args:
        student_logits: ``[N, T, V]`` the student's logits at the prediction positions.
        ids: ``[N, T, k]`` the teacher's top-k token ids there.
        logq: ``[N, T, k]`` their renormalised log-probabilities.
        mask: ``[N, T]`` bool, the positions that count (generated tokens only: never a prompt or padding).

    Returns:
        ``[N, T]`` the KL of each position (float32), 0 where ``mask`` is False.
    """
    logp = torch.log_softmax(student_logits.float(), dim=-1).gather(-1, ids)  # [N, T, k]
    kl = (logq.exp() * (logq - logp)).sum(-1)  # [N, T]
    return torch.where(mask, kl, torch.zeros_like(kl))
