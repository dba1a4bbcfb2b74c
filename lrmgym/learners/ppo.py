"""PPO with a critic: GAE over the policy's tokens, clipped policy and value losses (``learner=ppo``).

One step::

    B tasks from the training stream
      -> G trajectories each (GRPO's rollout; no groups are needed, G = 1 is plain PPO)
      -> env.score_group per task and turn: each trajectory's reward
      -> per-token rewards: the trajectory's reward on its last policy token, minus
         kl_reward_coef * (log pi_old - log pi_ref) on every policy token (InstructGPT's KL shaping; off by default)
      -> values V_t of the critic on the same tokens (lrmgym/learners/critic.py), read on the policy's tokens only
      -> GAE(gamma, lambda) over the policy's tokens (env feedback between turns is skipped, not discounted),
         advantages whitened over the batch's policy tokens
      -> epochs x minibatches of the clipped value loss (the critic), and, once critic_warmup_steps have passed,
         of the clipped policy loss with one advantage per token (the PolicyUpdater GRPO uses)

Ungradeable trajectories (reward None) have no return to learn from: neither the critic nor the policy trains
on them. The run around the steps is :mod:`lrmgym.learners.loop`. References: PPO (Schulman et al. 2017,
https://arxiv.org/abs/1707.06347), GAE (Schulman et al. 2016, https://arxiv.org/abs/1506.02438), the per-token
KL reward of InstructGPT (Ouyang et al. 2022, https://arxiv.org/abs/2203.02155).
"""

from __future__ import annotations

import copy
import time
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from lrmgym.learners.advantages import gae, group_advantages, scores_to_tensors
from lrmgym.learners.common import sample_groups
from lrmgym.learners.context import RunContext
from lrmgym.learners.critic import Critic, CriticKind
from lrmgym.learners.loop import Algorithm, Loop, StepResult
from lrmgym.learners.metrics import rollout_metrics, sample_records
from lrmgym.learners.rollout import collate, env_attr, tokenize_trajectory
from lrmgym.learners.update import PolicyGradientConfig, PolicyUpdater, check_trainable, derived_seed, usable_cpus
from lrmgym.policies.base import SamplingParams

__all__ = ["PPO", "PPOConfig", "explained_variance", "token_rewards", "whiten"]

# The same stream tags as GRPO's: for one seed, the two learners draw from the same task stream and sampling seeds.
_TRAIN_STREAM, _SAMPLING, _INIT = 0x7472, 0x736D, 0x696E


class PPOConfig(PolicyGradientConfig):
    """Options of the native PPO learner (a critic instead of groups). Defaults: the tiny model's (as its preset)."""

    kind: Literal["ppo"] = "ppo"
    """The learner kind."""
    prompts_per_step: int = Field(128, ge=1, le=100_000)
    """Tasks per step (B)."""
    group_size: int = Field(2, ge=1, le=4096)
    """Samples per task. The critic is the baseline, so 1 is plain PPO; more share one batched generate call."""
    max_new_tokens: int = Field(48, ge=1, le=1_000_000)
    """Token budget per policy turn."""
    temperature: float = Field(1.0, gt=0.0, le=10.0)
    """Sampling temperature of rollouts."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling threshold of rollouts (1 keeps the sampler and the trained policy the same)."""
    stop: list[str] = Field(default_factory=list)
    """Stop strings of rollouts."""
    max_turns: int | None = Field(None, ge=1, le=100)
    """Policy turns per episode; None uses the env's own max_turns (1 for single-turn envs)."""
    async_rollouts: bool = False
    """Sample the next step's rollouts in a second process while this step trains (one step of policy lag; the
    ratio then uses the sampler's log-probs), as GRPO's option. See lrmgym/learners/async_rollout.py."""
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    """Discount per policy token (1: the outcome reaches every token undiscounted; verl's and OpenRLHF's default)."""
    lam: float = Field(1.0, ge=0.0, le=1.0)
    """GAE's lambda: 1 is the return minus V_t on every token (verl's default; unbiased whatever the critic);
    lower trades variance for the critic's bias (0.95 is the classic PPO value)."""
    critic: CriticKind = "head"
    """head: a linear value head on the policy's last hidden state, taken without gradient, so the value loss trains
    the head only and never the policy's weights; model: a separate copy of the policy's transformer with a value
    head, trained end to end (about twice the update's compute). See lrmgym/learners/critic.py."""
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

    @model_validator(mode="after")
    def _check(self) -> PPOConfig:
        if self.minibatches > self.prompts_per_step * self.group_size:
            raise ValueError(
                f"minibatches={self.minibatches} exceeds the trajectories per step "
                f"(prompts_per_step x group_size = {self.prompts_per_step * self.group_size}); lower minibatches."
            )
        if (self.async_rollouts or self.behavior_logprobs == "sampler") and (self.temperature != 1 or self.top_p < 1):
            raise ValueError(
                "async_rollouts=true and behavior_logprobs='sampler' take the sampler's log-probs as the behaviour "
                f"policy, which needs temperature=1 and top_p=1 (got temperature={self.temperature:g}, "
                f"top_p={self.top_p:g})."
            )
        return self

    def sampling(self, seed: int | None) -> SamplingParams:
        """The rollout sampling parameters."""
        return SamplingParams(
            temperature=self.temperature, top_p=self.top_p, max_new_tokens=self.max_new_tokens,
            stop=tuple(self.stop), seed=seed,
        )  # fmt: skip

    def seed_torch(self, seed: int) -> None:
        """Seed torch for the run (before the policy is built: a fresh model's initialisation draws from it)."""
        torch.manual_seed(derived_seed(seed, _INIT))

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
class PPO(Algorithm):
    """One PPO step over the context's env and policy (see the module docstring)."""

    name = "ppo"

    def __init__(self, cfg: PPOConfig) -> None:
        self.cfg = cfg
        self.data_pos = 0
        self.worker: Any = None
        self._resume_weights: bytes | None = None  # async: the weights of the rollout pending at the checkpoint
        self._own_ref: torch.nn.Module | None = None

    def setup(self) -> None:
        """Check the policy, build the updater and the critic, start the rollout worker (async) or not."""
        ctx, cfg = self.loop.ctx, self.cfg
        if cfg.torch_threads is not None:  # after the policy's build, which may set its own (see GRPO.setup)
            torch.set_num_threads(cfg.torch_threads)
        check_trainable(ctx.policy, self.name)
        self.env, self.policy = ctx.env, ctx.policy
        self.turns = int(cfg.max_turns or env_attr(self.env, "max_turns", 1) or 1)
        self.updater = PolicyUpdater(
            cfg, self.policy, self.loop.progress, cfg.max_new_tokens * self.turns, temperature=cfg.temperature
        )
        self.critic = Critic(
            cfg.critic, self.updater.model, lr=cfg.critic_lr, betas=cfg.adam_betas, weight_decay=cfg.weight_decay,
            max_grad_norm=cfg.max_grad_norm, micro_batches=self.updater.micro_batches,
        )  # fmt: skip
        if cfg.kl_reward_coef > 0 and self.updater.ref_model is None:
            self._own_ref = copy.deepcopy(self.updater.model).eval().requires_grad_(False)
        self.critic_epochs = cfg.critic_epochs or cfg.epochs
        self.train_seed = derived_seed(ctx.seed, _TRAIN_STREAM)
        if cfg.async_rollouts and usable_cpus() < 2:
            print("learner.async_rollouts: only one usable CPU; running synchronously.", flush=True)
            self.cfg = cfg = cfg.model_copy(update={"async_rollouts": False})
        if cfg.async_rollouts:
            from lrmgym.learners.async_rollout import RolloutWorker

            self.worker = RolloutWorker.for_context(ctx, threads=cfg.torch_threads)

    def train_step(self) -> StepResult:
        """Sample, grade, value, GAE, update the critic and (after the warm-up) the policy."""
        cfg, step = self.cfg, self.loop.step
        self.updater.model.eval()
        ro, wait_s = self._rollout(step)
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
        self.data_pos += cfg.prompts_per_step
        rewards_bg, valid = scores_to_tensors([[t.reward for t in group] for group in ro.groups])
        zero_variance = group_advantages(rewards_bg, valid).zero_variance  # logged beside GRPO's; PPO needs none
        judged = self.worker.judge_metrics if self.worker is not None else None
        metrics = rollout_metrics(ro, trajs, tokenized, zero_variance, len(trained), self.turns, self.env, judged)
        metrics.update(stats)
        metrics.update({"time/generate_s": ro.generate_s, "time/score_s": ro.score_s, "time/train_s": train_s})
        if wait_s is not None:
            metrics["time/wait_s"] = wait_s
        return StepResult(metrics, sample_records(ro, traj_adv.reshape(valid.shape), cfg.log_samples))

    def _rollout(self, step: int) -> tuple[Any, float | None]:
        """This step's rollout (and, async, how long it was waited for; the next one is handed to the worker)."""
        return sample_groups(self, step)

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
            self.updater.scheduler.step()

    def _tasks(self, position: int) -> list[Any]:
        return [self.env.task_at(position + i, seed=self.train_seed) for i in range(self.cfg.prompts_per_step)]

    def _sampling(self, step: int) -> SamplingParams:
        return self.cfg.sampling(derived_seed(self.loop.ctx.seed, _SAMPLING, step))

    def state_dict(self) -> dict[str, Any]:
        """The updater's and the critic's state, the stream position and (async) the pending rollout's weights."""
        state = {**self.updater.state_dict(), "critic": self.critic.state_dict(), "data_pos": self.data_pos}
        if self.worker is not None and self.worker.pending:
            state["async_pending_weights"] = self.worker.pending_state
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.updater.load_state_dict(state)
        self.critic.load_state_dict(state["critic"])
        self.data_pos = int(state["data_pos"])
        self._resume_weights = state.get("async_pending_weights")

    def postfix(self, metrics: dict[str, Any]) -> dict[str, str]:
        """Reward, accuracy, explained variance and tokens/s for the progress bar."""
        reward, acc, ev = metrics["reward/mean"], metrics["accuracy"], metrics.get("value/explained_variance")
        return {
            "reward": f"{reward:.3f}" if reward is not None else "-",
            "acc": f"{acc:.2f}" if acc is not None else "-",
            "ev": f"{ev:.2f}" if ev is not None else "-",
            "tok_s": f"{metrics['tokens_per_s']:.0f}",
        }

    def close(self) -> None:
        """Stop the rollout worker."""
        if self.worker is not None:
            self.worker.close()
