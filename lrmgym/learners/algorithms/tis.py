r"""Truncated importance sampling (TIS) between a separate rollout engine and the trainer.

When rollouts come from another engine (``policy.engine=vllm``: other kernels, other numerics), the tokens were
drawn from :math:`\pi_{engine}`, not from the trainer's :math:`\pi_{old}` that the policy loss's ratio is taken
against. TIS reweights each policy token's loss by

.. math:: w_t = \min\left(\frac{\pi_{old}(y_t)}{\pi_{engine}(y_t)},\ C\right)
          = \min\left(e^{\log\pi_{old}(y_t) - \log\pi_{engine}(y_t)},\ C\right),

detached (a weight, not a path for gradient), capped at ``C`` (``learner.tis_cap``) to bound the variance
(Yao et al., 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"; C = 2 there).
Where the engine and the trainer agree exactly the weight is 1 and the loss is unchanged.
"""

from __future__ import annotations

import torch

__all__ = ["tis_weights"]


def tis_weights(old_logp: torch.Tensor, engine_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """Per-token TIS weights ``min(exp(old_logp - engine_logp), cap)``, detached, same shape as the inputs.

    Args:
        old_logp: ``[N, T]`` the trainer's log-probs of the sampled tokens before the update (pi_old).
        engine_logp: ``[N, T]`` the rollout engine's log-probs of the same tokens (the behaviour policy).
        cap: ``C`` > 0, the most a token's weight may be.

    Off the loss mask both inputs are 0 there, so the weight is 1; the loss mask removes those tokens anyway.
    """
    if cap <= 0:
        raise ValueError(f"The TIS cap must be > 0, got {cap}.")
    log_ratio = (old_logp.detach() - engine_logp.detach()).clamp(max=20.0)  # exp stays finite; capped below anyway
    return torch.exp(log_ratio).clamp(max=cap)
