"""PPO with a critic: GAE over the policy's tokens, clipped policy and value losses (``learner=ppo``).

One step::

    B tasks from the training stream
      -> G trajectories each (GRPO's rollout; no groups are needed, G = 1 is plain PPO)
      -> env.score_group per task and turn: each trajectory's reward
      -> per-token rewards: the trajectory's reward on its last policy token, minus
         kl_reward_coef * (log pi_old - log pi_ref) on every policy token (InstructGPT's KL shaping; off by default)
      -> values V_t of the critic on the same tokens (lrmgym/learners/algorithms/critic.py), read on the
      policy's tokens only
      -> GAE(gamma, lambda) over the policy's tokens (env feedback between turns is skipped, not discounted),
         advantages whitened over the batch's policy tokens
      -> epochs x minibatches of the clipped value loss (the critic), and, once critic_warmup_steps have passed,
         of the clipped policy loss with one advantage per token (the PolicyUpdater GRPO uses)

Ungradeable trajectories (reward None) have no return to learn from: neither the critic nor the policy trains
on them. The run around the steps is :mod:`lrmgym.learners.engine.loop`. References: PPO (Schulman et al. 2017,
https://arxiv.org/abs/1707.06347), GAE (Schulman et al. 2016, https://arxiv.org/abs/1506.02438), the per-token
KL reward of InstructGPT (Ouyang et al. 2022, https://arxiv.org/abs/2203.02155).
"""

from __future__ import annotations

import time
from typing import Any, Literal

import torch
from pydantic import Field

from lrmgym.learners.algorithms.advantages import gae, group_advantages, scores_to_tensors
from lrmgym.learners.algorithms.critic import Critic, CriticKind
from lrmgym.learners.engine.context import RunContext
from lrmgym.learners.engine.loop import Loop, StepResult
from lrmgym.learners.engine.metrics import rollout_metrics, sample_records
from lrmgym.learners.engine.onpolicy import OnPolicy, RolloutConfig
from lrmgym.learners.engine.rollout import collate, tokenize_trajectory
from lrmgym.learners.engine.weights import AdapterOffReference, frozen_reference

__all__ = ["PPO", "PPOConfig", "explained_variance", "token_rewards", "whiten"]


class PPOConfig(RolloutConfig):
    """Options of the native PPO learner (a critic instead of groups). Defaults: the tiny model's (as its preset)."""

    kind: Literal["ppo"] = "ppo"
    """The learner kind."""
    prompts_per_step: int = Field(128, ge=1, le=100_000)
    """Tasks per step (B)."""
    group_size: int = Field(2, ge=1, le=4096)
    """Samples per task. The critic is the baseline, so 1 is plain PPO; more share one batched generate call."""
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    """Discount per policy token (1: the outcome reaches every token undiscounted; verl's and OpenRLHF's default)."""
    lam: float = Field(1.0, ge=0.0, le=1.0)
    """GAE's lambda: 1 is the return minus V_t on every token (verl's default; unbiased whatever the critic);
    lower trades variance for the critic's bias (0.95 is the classic PPO value)."""
    critic: CriticKind = "head"
    """head: a linear value head on the policy's last hidden state, taken without gradient, so the value loss trains
    the head only and never the policy's weights; model: a separate copy of the policy's transformer with a value
    head, trained end to end (about twice the update's compute). See lrmgym/learners/algorithms/critic.py."""
    critic_lr: float = Field(1e-2, gt=0.0, le=1.0)
    """The critic's own AdamW learning rate (constant). The critic's loss has its own optimizer, so this, not a
    weight on the value loss beside the policy loss (PPO's c1), sets how fast it learns."""
    critic_epochs: int | None = Field(4, ge=1, le=64)
    """Passes of the critic over each step's rollouts (its minibatches are the policy's); None: the policy's
    epochs. The critic can take more steps than the policy without moving it further from the sampler."""
    value_clip: float | None = Field(0.2, gt=0.0)
    """PPO's value clipping: a value moves at most this far from the one the returns were computed with before its
    loss stops falling (rewards here lie in [0, 1]); None: the plain squared error."""
    critic_warmup_steps: int = Field(5, ge=0)
    """Steps at the start that train only the critic: the policy is sampled but not updated, so that the first
    policy updates are steered by values that already predict the reward."""
    kl_reward_coef: float = Field(0.0, ge=0.0, le=100.0)
    """InstructGPT's KL reward shaping: every policy token's reward gets -kl_reward_coef * (log pi_old -
    log pi_ref), the reference being the initial policy (InstructGPT 0.02). Separate from kl_coef, the KL loss
    term of the policy update (GRPO's); 0 disables it."""
    whiten_advantages: bool = True
    """Whiten the advantages over the batch's policy tokens ((A - mean) / std), as PPO implementations do."""

    def build(self, ctx: RunContext) -> Loop:
        """The run loop of this learner over ``ctx``; ``.run(resume=...)`` trains."""
        return Loop(ctx, self, PPO(self))


# ---------------------------------------------------------------------------------------------- the formulas
def token_rewards(
    outcome: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None = None, kl_coef: float = 0.0
) -> torch.Tensor:
    """Per-token rewards ``[N, T]``: ``outcome [N]`` on each row's last policy token, ``-kl_coef * kl`` on all of them.

    ``kl [N, T]`` is ``log pi_old - log pi_ref`` per token (InstructGPT's shaping), or None. 0 off the mask.
    """
    on = mask.bool()
    rewards = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    if kl is not None and kl_coef > 0:
        rewards = (-kl_coef * kl.float()).masked_fill(~on, 0.0)
    last = mask.shape[1] - 1 - on.flip(-1).int().argmax(-1)  # [N], the last policy token of each row
    rows = torch.arange(mask.shape[0], device=mask.device)
    rewards[rows, last] += outcome.to(rewards) * on.any(-1)
    return rewards


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / (std + eps)``, mean and unbiased std over the masked entries of the whole batch; 0 off them."""
    on = mask.bool()
    n = on.sum().clamp(min=1)
    mean = x[on].sum() / n
    centred = (x - mean).masked_fill(~on, 0.0)
    std = (centred.square().sum() / (n - 1).clamp(min=1)).sqrt()
    return centred / (std + eps)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float | None:
    """``1 - Var(returns - values) / Var(returns)`` over the masked tokens (1: perfect; <= 0: no better than a mean)."""
    on = mask.bool()
    y, v = returns[on].double(), values[on].double()
    if y.numel() < 2 or float(y.var()) == 0.0:
        return None
    return float(1.0 - (y - v).var() / y.var())


# ---------------------------------------------------------------------------------------------- the learner
class PPO(OnPolicy):
    """One PPO step over the context's env and policy (see the module docstring)."""

    name = "ppo"
    cfg: PPOConfig

    def __init__(self, cfg: PPOConfig) -> None:
        super().__init__(cfg)
        self._own_ref: torch.nn.Module | AdapterOffReference | None = None

    def setup(self) -> None:
        """The on-policy setup (updater, rollout worker), then the critic and, for the KL reward, a reference."""
        super().setup()
        cfg = self.cfg
        self.critic = Critic(
            cfg.critic, self.updater.model, lr=cfg.critic_lr, betas=cfg.adam_betas, weight_decay=cfg.weight_decay,
            max_grad_norm=cfg.max_grad_norm, micro_batches=self.updater.micro_batches,
        )  # fmt: skip
        if cfg.kl_reward_coef > 0 and self.updater.ref_model is None:
            self._own_ref = frozen_reference(self.updater.model)  # a LoRA run: the adapters off, not a copy
        self.critic_epochs = cfg.critic_epochs or cfg.epochs

    def train_step(self) -> StepResult:
        """Sample, grade, value, GAE, update the critic and (after the warm-up) the policy."""
        cfg, step = self.cfg, self.loop.step
        self.updater.model.eval()
        ro, wait_s = self.collect()
        trajs = [t for group in ro.groups for t in group]  # [B * G], task-major
        tokenized = [tokenize_trajectory(t, self.policy.tokenizer) for t in trajs]
        rows = [i for i, t in enumerate(trajs) if t.reward is not None and any(tokenized[i].policy_mask)]
        seqs = [tokenized[i] for i in rows]
        train_start = time.perf_counter()
        behavior = "sampler" if cfg.async_rollouts else cfg.behavior_logprobs  # async: pi_old is the sampler's
        warmup = step < cfg.critic_warmup_steps
        stats: dict[str, Any] = {"critic_warmup": warmup}
        per_token: list[list[float]] = []
        traj_adv = torch.zeros(len(trajs))  # for samples.jsonl: each trajectory's mean advantage
        if rows:
            outcome = torch.tensor([float(trajs[i].reward) for i in rows])
            adv, mask, value_stats = self._advantages(seqs, outcome, behavior)  # [n, T-1], fits the critic
            stats.update(value_stats)
            per_token = [[0.0, *adv[k, : len(s.ids) - 1].tolist()] for k, s in enumerate(seqs)]  # ids layout
            traj_adv[rows] = (adv * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        measure_kl = cfg.track_kl and step % cfg.track_kl_every == 0
        completions = [turn.completion for t in trajs for turn in t.policy_turns]
        trained = [] if warmup else seqs  # the warm-up samples and fits the critic, the policy stays as it is
        stats.update(
            self.updater.update(
                trained, per_token if trained else [], measure_kl, behavior,
                sampler_known=all(c is not None and c.logprobs is not None for c in completions),
            )
        )  # fmt: skip
        train_s = time.perf_counter() - train_start
        stats["lr"] = self.updater.optimizer.param_groups[0]["lr"]
        rewards_bg, valid = scores_to_tensors([[t.reward for t in group] for group in ro.groups])
        zero_variance = group_advantages(rewards_bg, valid).zero_variance  # logged beside GRPO's; PPO needs none
        judged = self.judge_metrics()
        metrics = rollout_metrics(
            ro, trajs, tokenized, zero_variance, len(trained), self.turns, self.env, judged, self.updater.shape
        )
        metrics.update(stats)
        metrics.update({"time/generate_s": ro.generate_s, "time/score_s": ro.score_s, "time/train_s": train_s})
        if wait_s is not None:
            metrics["time/wait_s"] = wait_s
        return StepResult(metrics, sample_records(ro, traj_adv.reshape(valid.shape), cfg.log_samples))

    def _advantages(
        self, seqs: list[Any], outcome: torch.Tensor, behavior: str
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """``(advantages, mask, stats)`` of ``seqs``, ``[n, T-1]`` on the CPU; fits the critic on the returns.

        Values, then the per-token rewards (``outcome [n]`` on each row's last policy token, the KL shaping on all of
        them), GAE over the policy's tokens, whitening; the critic's fit reads the values it gave before it.
        """
        cfg = self.cfg
        batch = collate(seqs, [0.0] * len(seqs), self.updater.pad_id)
        mask = batch.loss_mask.to(self.updater.device)  # [n, T-1], aligned to target tokens
        values = self.critic.values(batch)  # [n, T-1], 0 off the mask
        kl = self._kl(batch, behavior) if cfg.kl_reward_coef > 0 else None
        rewards = token_rewards(outcome, mask, kl, cfg.kl_reward_coef)
        adv, returns = gae(rewards, values, mask, gamma=cfg.gamma, lam=cfg.lam)  # skips non-policy tokens
        stats = self._value_stats(values, returns, adv, mask, kl)
        if cfg.whiten_advantages:
            adv = whiten(adv, mask)
        stats.update(self.critic.fit(batch, values, returns, self.critic_epochs, cfg.minibatches, cfg.value_clip))
        return adv.cpu(), mask.cpu().float(), stats

    def _kl(self, batch: Any, behavior: str) -> torch.Tensor:
        """``[n, T-1]`` log pi_old - log pi_ref of the batch's tokens (the KL reward's per-token sample)."""
        old = (
            batch.sampler_logprobs.to(self.updater.device)
            if behavior == "sampler"
            else self.updater.no_grad_logprobs(self.updater.model, batch)
        )
        if self.cfg.ref_refresh_steps:
            self.updater.refresh_ref()  # a reset due this step applies to the KL reward too (update() repeats it)
        ref_model = self.updater.ref_model if self.updater.ref_model is not None else self._own_ref
        return old - self.updater.no_grad_logprobs(ref_model, batch)

    @staticmethod
    def _value_stats(
        values: torch.Tensor, returns: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None
    ) -> dict[str, Any]:
        """The critic's statistics before its update, and GAE's advantages before whitening."""
        on = mask.bool()
        out = {
            "value/mean": float(values[on].mean()),
            "value/explained_variance": explained_variance(values, returns, mask),
            "returns/mean": float(returns[on].mean()),
            "advantage/mean": float(adv[on].mean()),
            "advantage/std": float(adv[on].std()) if int(on.sum()) > 1 else 0.0,
        }
        if kl is not None:
            out["kl_reward/mean"] = float(kl[on].mean())
        return out

    def end_step(self) -> None:
        """Step the policy's learning-rate schedule after each policy update (its warmup_steps count updates)."""
        if self.loop.step > self.cfg.critic_warmup_steps:
            self.updater.step_schedule()

    def state_dict(self) -> dict[str, Any]:
        """The on-policy state (updater, stream position, pending async weights) and the critic's."""
        return {**super().state_dict(), "critic": self.critic.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        super().load_state_dict(state)
        self.critic.load_state_dict(state["critic"])

    def postfix(self, metrics: dict[str, Any]) -> dict[str, str]:
        """The on-policy progress bar, with the critic's explained variance."""
        ev = metrics.get("value/explained_variance")
        return {**super().postfix(metrics), "ev": f"{ev:.2f}" if ev is not None else "-"}
