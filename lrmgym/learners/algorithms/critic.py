"""PPO's critic: a value function over token batches, and PPO's clipped value loss.

Values are laid out like log-probs (:mod:`lrmgym.learners.algorithms.losses`): ``values[n, t]`` is the value of
the prefix
``ids[n, :t + 1]``, the state in which the policy writes target token ``t + 1``; it is read where
``loss_mask[n, t]`` is set (the policy's tokens) and nowhere else.

Two kinds (``learner.critic``):

- ``head``: a linear value head on the policy's own last hidden state (the output of its final norm, what its LM
  head reads). The hidden states are taken without gradient, once per step, before the policy's update: the value
  loss trains the head only and never reaches the policy's weights, so the policy moves by its own loss alone
  (and a critic warm-up cannot move it). Costs one no-grad forward of the policy per step; the head's training
  is a regression on those fixed features.
- ``model``: a separate copy of the policy's transformer (its base model, without the LM head, initialised from
  the policy's weights) with a linear head, trained end to end by the value loss; the policy's weights are
  again untouched. InstructGPT, OpenRLHF and verl use a separate critic. Costs about as much as the policy's
  own update again.

Each has its own AdamW (``critic_lr``, constant) and makes ``critic_epochs`` passes a step over the minibatches.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch

from lrmgym.learners.engine.rollout import TokenBatch
from lrmgym.learners.engine.update import adamw

__all__ = ["Critic", "CriticKind", "value_loss"]

CriticKind = Literal["head", "model"]


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, clip: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped value loss per token (Schulman et al. 2017; the form of OpenAI baselines, cleanrl, verl).

    ::

        V_clip = V_old + clamp(V - V_old, -clip, clip)
        loss   = 0.5 * max((V - R)^2, (V_clip - R)^2)          (clip None: 0.5 * (V - R)^2)

    Args:
        values: ``[N, T]`` the critic's values (with grad).
        old_values: ``[N, T]`` the values the returns were computed with (before this step's critic update).
        returns: ``[N, T]`` GAE's returns, the regression targets.
        mask: ``[N, T]`` the policy's tokens.
        clip: The largest move of a value from ``old_values`` that still lowers the loss; None: no clip.

    Returns:
        ``(loss [N, T], clipped [N, T])``: the per-token loss (0 off the mask) and where the clipped branch was
        the larger one (its gradient is 0 there).
    """
    on = mask.bool()
    unclipped = (values - returns).square()
    if clip is None:
        return (0.5 * unclipped).masked_fill(~on, 0.0), torch.zeros_like(on)
    v_clip = old_values + (values - old_values).clamp(-clip, clip)
    clipped_sq = (v_clip - returns).square()
    loss = 0.5 * torch.maximum(unclipped, clipped_sq)
    return loss.masked_fill(~on, 0.0), (clipped_sq > unclipped) & on


class _ValueModel(torch.nn.Module):
    """A linear value head, on its own transformer (``model`` critic) or on features given to it (``head``)."""

    def __init__(self, hidden: int, backbone: torch.nn.Module | None) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = torch.nn.Linear(hidden, 1)
        torch.nn.init.zeros_(self.head.weight)  # V = 0 at the start: the warm-up fits it before it steers anything
        torch.nn.init.zeros_(self.head.bias)


def _hidden(backbone: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
    """``[n, T - 1, H]``: the last hidden state at every position that predicts a target token."""
    out = backbone(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
    return out.last_hidden_state[:, :-1].float()


class Critic:
    """The value function of one PPO run: values of a token batch and their clipped regression onto returns.

    Args:
        kind: ``"head"`` or ``"model"`` (see the module docstring).
        policy_model: The policy's transformers causal LM (its ``base_model`` gives the hidden states).
        lr: The critic's AdamW learning rate (constant).
        betas: AdamW betas.
        weight_decay: AdamW weight decay.
        max_grad_norm: Clip the critic's gradient norm to this; None: no clipping.
        micro_batches: Splits rows of a batch into forward passes (the policy updater's ``micro_batches``).
    """

    def __init__(
        self,
        kind: CriticKind,
        policy_model: torch.nn.Module,
        *,
        lr: float,
        betas: tuple[float, float],
        weight_decay: float,
        max_grad_norm: float | None,
        micro_batches: Callable[[TokenBatch, list[int]], list[list[int]]],
    ) -> None:
        if kind not in ("head", "model"):
            raise ValueError(f"critic must be 'head' or 'model', got {kind!r}.")
        self.kind, self.max_grad_norm, self.micro_batches = kind, max_grad_norm, micro_batches
        self.policy_backbone = policy_model.base_model
        self.device = next(policy_model.parameters()).device
        backbone = copy.deepcopy(self.policy_backbone).train() if kind == "model" else None
        self.module = _ValueModel(int(policy_model.config.hidden_size), backbone).to(self.device)
        self.optimizer = adamw(list(self.module.parameters()), lr=lr, betas=betas, weight_decay=weight_decay)
        self._features: torch.Tensor | None = None  # head: the policy's hidden states of the batch being fitted

    def state_dict(self) -> dict[str, Any]:
        """Weights and optimizer state."""
        return {"module": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])

    # ------------------------------------------------------------------------------------------ values
    def _forward(self, batch: TokenBatch, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(values [n, t], mask [n, t])`` of ``rows`` (with grad), ``t`` the rows' own width."""
        if self.kind == "head":
            if self._features is None:
                raise RuntimeError("Critic.values(batch) must run before fitting the head on that batch.")
            return self.module.head(self._features[rows]).squeeze(-1), batch.loss_mask[rows].to(self.device)
        sub = _on(batch.select(rows), self.device)
        return self.module.head(_hidden(self.module.backbone, sub)).squeeze(-1), sub.loss_mask.to(self.device)

    @torch.no_grad()
    def values(self, batch: TokenBatch) -> torch.Tensor:
        """``[N, T - 1]`` values of every row, 0 off the policy's tokens (a head keeps the features for :meth:`fit`)."""
        rows = list(range(len(batch)))
        if self.kind == "head":
            width = batch.loss_mask.shape[1]
            feats = torch.zeros(len(batch), width, self.module.head.in_features, device=self.device)
            for chunk in self.micro_batches(batch, rows):
                h = _hidden(self.policy_backbone, _on(batch.select(chunk), self.device))
                feats[chunk, : h.shape[1]] = h
            self._features = feats
        out = torch.zeros(batch.loss_mask.shape, device=self.device)
        for chunk in self.micro_batches(batch, rows):
            v, mask = self._forward(batch, chunk)
            out[chunk, : v.shape[1]] = v.float() * mask
        return out

    # ------------------------------------------------------------------------------------------ the fit
    def fit(
        self,
        batch: TokenBatch,
        old_values: torch.Tensor,
        returns: torch.Tensor,
        epochs: int,
        minibatches: int,
        clip: float | None,
    ) -> dict[str, float]:
        """Epochs x minibatches of the clipped value loss (token mean per minibatch); returns its statistics.

        Call :meth:`values` on the same batch first (``old_values`` are its output).
        """
        n = len(batch)
        mask_all = batch.loss_mask.to(self.device)
        old_values, returns = old_values.to(self.device), returns.to(self.device)
        sums = {"loss": 0.0, "clip": 0.0, "tokens": 0.0, "grad_norm": 0.0}
        steps = 0
        self.module.train()
        for _ in range(epochs):
            order = torch.randperm(n).tolist() if minibatches > 1 else list(range(n))
            for mb in np.array_split(np.array(order), minibatches):
                mb = mb.tolist()
                if not mb:
                    continue
                self.optimizer.zero_grad(set_to_none=True)
                mb_tokens = max(float(mask_all[mb].sum()), 1.0)
                for micro in self.micro_batches(batch, mb):
                    v, mask = self._forward(batch, micro)
                    t = v.shape[1]
                    loss_tok, clipped = value_loss(v, old_values[micro, :t], returns[micro, :t], mask, clip)
                    loss = loss_tok.sum() / mb_tokens
                    loss.backward()
                    sums["loss"] += float(loss.detach())
                    sums["clip"] += float(clipped.sum())
                    sums["tokens"] += float(mask.sum())
                if self.max_grad_norm is not None:
                    norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.max_grad_norm)
                    sums["grad_norm"] += float(norm)
                self.optimizer.step()
                steps += 1
        self.module.eval()
        self._features = None
        return {
            "value/loss": sums["loss"] / max(steps, 1),
            "value/clip_frac": sums["clip"] / max(sums["tokens"], 1.0),
            "value/grad_norm": sums["grad_norm"] / max(steps, 1) if self.max_grad_norm is not None else None,
        }


def _on(batch: TokenBatch, device: torch.device) -> TokenBatch:
    """The batch's token tensors on ``device`` (the rest stays where it is)."""
    batch.input_ids, batch.attention_mask = batch.input_ids.to(device), batch.attention_mask.to(device)
    return batch
