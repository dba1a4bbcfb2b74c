"""GRPO: group-relative policy optimisation, readable top to bottom (``learner=grpo``).

One step::

    B tasks from the training stream
      -> G trajectories each (policy.generate, no grad, KV cache; multi-turn envs add feedback turns)
      -> env.score_group per task and turn (judges wrap the env transparently)
      -> group-relative advantages (ungradeable samples masked; zero-variance groups counted)
      -> epochs x minibatches of clipped policy-gradient updates on the policy's tokens only

The run around the steps (resume, budgets, evaluation, checkpoints, logs) is :mod:`lrmgym.learners.loop`; the
update is :mod:`lrmgym.learners.update`; the formulas are :mod:`lrmgym.learners.losses` and
:mod:`lrmgym.learners.advantages`. References: GRPO (DeepSeekMath, https://arxiv.org/abs/2402.03300), DAPO
(https://arxiv.org/abs/2503.14476), Dr. GRPO (https://arxiv.org/abs/2503.20783). The same code trains any
transformers causal LM that a :class:`~lrmgym.policies.base.TrainablePolicy` wraps, on CPU or GPU.
"""

from __future__ import annotations

import time
from typing import Any, Literal, NamedTuple

import torch
from pydantic import Field, model_validator

from lrmgym.learners.advantages import AdvantageName, GroupAdvantages, group_advantages, scores_to_tensors
from lrmgym.learners.common import sample_groups
from lrmgym.learners.context import RunContext
from lrmgym.learners.loop import Algorithm, Loop, StepResult
from lrmgym.learners.metrics import rollout_metrics, sample_records
from lrmgym.learners.rollout import Rollout, env_attr, tokenize_trajectory
from lrmgym.learners.update import PolicyGradientConfig, PolicyUpdater, check_trainable, derived_seed, usable_cpus
from lrmgym.policies.base import SamplingParams

__all__ = ["GRPO", "Fit", "GRPOConfig"]

_TRAIN_STREAM, _SAMPLING, _INIT = 0x7472, 0x736D, 0x696E  # tags: "tr", "sm", "in"


class GRPOConfig(PolicyGradientConfig):
    """Options of the native GRPO learner. Defaults: plain GRPO without KL, tuned for the tiny CPU model."""

    kind: Literal["grpo"] = "grpo"
    """The learner kind."""
    prompts_per_step: int = Field(16, ge=1, le=100_000)
    """Tasks per step (B)."""
    group_size: int = Field(8, ge=2, le=4096)
    """Completions per task (G); at least 2, since advantages compare samples within a group."""
    max_new_tokens: int = Field(48, ge=1, le=1_000_000)
    """Token budget per policy turn."""
    temperature: float = Field(1.0, gt=0.0, le=10.0)
    """Sampling temperature of rollouts (must be > 0: greedy groups have no variance)."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling threshold of rollouts (1 keeps the sampler and the trained policy the same)."""
    stop: list[str] = Field(default_factory=list)
    """Stop strings of rollouts."""
    max_turns: int | None = Field(None, ge=1, le=100)
    """Policy turns per episode; None uses the env's own max_turns (1 for single-turn envs)."""
    adv_estimator: AdvantageName = "grpo"
    """Group advantages, a name in lrmgym.learners.advantages: grpo ((r-mean)/std), dr_grpo (r-mean), rloo
    (leave-one-out), reinforce_pp (r whitened over the batch) or reinforce_pp_baseline (r-mean, then whitened
    over the batch)."""
    drop_zero_advantage: bool = True
    """Skip trajectories with advantage 0 in the update (they carry no policy gradient); kept when kl_coef > 0."""
    async_rollouts: bool = False
    """Sample and grade the next step's rollouts in a second process while this step trains (one step of policy
    lag; the ratio then uses the sampler's log-probs). Pays off with a spare CPU core; the env must be makeable
    by id in a fresh interpreter. See lrmgym/learners/async_rollout.py."""

    @model_validator(mode="after")
    def _check(self) -> GRPOConfig:
        if self.minibatches > self.prompts_per_step * self.group_size:
            raise ValueError(
                f"minibatches={self.minibatches} exceeds the trajectories per step "
                f"(prompts_per_step x group_size = {self.prompts_per_step * self.group_size}); lower minibatches."
            )
        sampler_is_old = self.async_rollouts or self.behavior_logprobs == "sampler"
        if sampler_is_old and (self.temperature != 1.0 or self.top_p < 1.0):
            # The sampler's log-probs are those of the tempered, truncated distribution; the trainer's are the
            # model's own, so their ratio would not be an importance weight.
            what = "async_rollouts=true" if self.async_rollouts else "behavior_logprobs='sampler'"
            raise ValueError(
                f"{what} takes the sampler's log-probs as the behaviour policy, which needs temperature=1 and "
                f"top_p=1 (got temperature={self.temperature:g}, top_p={self.top_p:g}); set them to 1 or use "
                "async_rollouts=false with behavior_logprobs='recompute'."
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
        return Loop(ctx, self, GRPO(self))


class Fit(NamedTuple):
    """What :meth:`GRPO.learn` did: the advantages, how many trajectories it trained on, the update's statistics."""

    advantages: GroupAdvantages
    trained: int
    stats: dict[str, Any]
    train_s: float


class GRPO(Algorithm):
    """One GRPO step (module docstring): :meth:`collect` groups, :meth:`learn` from them (hooks for variants)."""

    name = "grpo"

    def __init__(self, cfg: GRPOConfig) -> None:
        self.cfg = cfg
        self.data_pos = 0
        self.worker: Any = None
        self._resume_weights: bytes | None = None  # async: the weights of the rollout pending at the checkpoint

    def setup(self) -> None:
        """Check the policy, build the updater, start the rollout worker (async) or not."""
        ctx, cfg = self.loop.ctx, self.cfg
        if cfg.torch_threads is not None:
            # After the policy's build: a policy may set its own thread count (the tiny one picks 2 on an idle
            # machine), and the learner's choice must win. Set before, a run started on an idle machine trained
            # with 2 threads beside the rollout worker's one on 2 cores: 1.0-1.3 s a step instead of 0.6-0.7 s.
            torch.set_num_threads(cfg.torch_threads)
        check_trainable(ctx.policy, self.name)
        self.env, self.policy = ctx.env, ctx.policy
        self.turns = int(cfg.max_turns or env_attr(self.env, "max_turns", 1) or 1)
        self.updater = PolicyUpdater(
            cfg, self.policy, self.loop.progress, cfg.max_new_tokens * self.turns, temperature=cfg.temperature
        )
        self.train_seed = derived_seed(ctx.seed, _TRAIN_STREAM)
        if cfg.async_rollouts and usable_cpus() < 2:
            print(
                "learner.async_rollouts: this process may use only one CPU, so a rollout worker would only take "
                "turns with training; running synchronously (set learner.async_rollouts=false to silence this).",
                flush=True,
            )
            self.cfg = cfg = cfg.model_copy(update={"async_rollouts": False})
        if cfg.async_rollouts:
            from lrmgym.learners.async_rollout import RolloutWorker

            self.worker = RolloutWorker.for_context(ctx, threads=cfg.torch_threads)

    def train_step(self) -> StepResult:
        """Sample, grade, compute advantages, update."""
        self.updater.model.eval()
        ro, wait_s = self.collect()
        trajs = [t for group in ro.groups for t in group]  # [B * G], task-major
        tokenized = [tokenize_trajectory(t, self.policy.tokenizer) for t in trajs]
        fit = self.learn(trajs, tokenized, *scores_to_tensors([[t.reward for t in group] for group in ro.groups]))
        judged = self.worker.judge_metrics if self.worker is not None else None  # async: the worker's judges
        zero = fit.advantages.zero_variance
        metrics = rollout_metrics(ro, trajs, tokenized, zero, fit.trained, self.turns, self.env, judged)
        metrics.update(fit.stats)
        metrics.update({"time/generate_s": ro.generate_s, "time/score_s": ro.score_s, "time/train_s": fit.train_s})
        if wait_s is not None:  # with async rollouts: how long this step waited for the worker
            metrics["time/wait_s"] = wait_s
        return StepResult(metrics, sample_records(ro, fit.advantages.advantages, self.cfg.log_samples))

    def collect(self) -> tuple[Rollout, float | None]:
        """The step's B groups (the data position moves past them) and, async, the seconds waited for them."""
        ro, wait_s = sample_groups(self, self.loop.step)
        self.data_pos += self.cfg.prompts_per_step
        return ro, wait_s

    def learn(self, trajs: list[Any], tokenized: list[Any], rewards: torch.Tensor, valid: torch.Tensor) -> Fit:
        """Advantages of ``rewards [B, G]`` over the ``valid`` samples, and the update on ``trajs`` (task-major)."""
        cfg, step = self.cfg, self.loop.step
        adv = group_advantages(rewards, valid, cfg.adv_estimator)
        flat_adv, flat_valid = adv.advantages.reshape(-1), valid.reshape(-1)  # [B * G]
        keep_zero = cfg.kl_coef > 0 or not cfg.drop_zero_advantage
        rows = [i for i in range(len(trajs)) if flat_valid[i] and (keep_zero or flat_adv[i] != 0)]
        train_start = time.perf_counter()
        measure_kl = cfg.track_kl and step % cfg.track_kl_every == 0
        behavior = "sampler" if cfg.async_rollouts else cfg.behavior_logprobs  # async: pi_old is the sampler's
        gradeable = [i for i in range(len(trajs)) if flat_valid[i]]
        completions = [turn.completion for t in trajs for turn in t.policy_turns]
        stats = self.updater.update(
            [tokenized[i] for i in rows], [float(flat_adv[i]) for i in rows], measure_kl, behavior,
            norm_seqs=sum(1 for i in gradeable if any(tokenized[i].policy_mask)),
            norm_tokens=sum(sum(tokenized[i].policy_mask) for i in gradeable),
            sampler_known=all(c is not None and c.logprobs is not None for c in completions),
        )  # fmt: skip
        stats["lr"] = self.updater.optimizer.param_groups[0]["lr"]  # the rate this step's update used
        return Fit(adv, len(rows), stats, time.perf_counter() - train_start)

    def end_step(self) -> None:
        """Step the learning-rate schedule (once per training step, signal or not)."""
        self.updater.scheduler.step()

    def _tasks(self, position: int, count: int | None = None) -> list[Any]:
        """``count`` tasks (default B) from ``position`` in the training stream."""
        count = self.cfg.prompts_per_step if count is None else count
        return [self.env.task_at(position + i, seed=self.train_seed) for i in range(count)]

    def _sampling(self, step: int) -> SamplingParams:
        return self.cfg.sampling(derived_seed(self.loop.ctx.seed, _SAMPLING, step))

    def state_dict(self) -> dict[str, Any]:
        """The updater's state, the position in the training stream and (async) the pending rollout's weights.

        With async rollouts the next step's rollout was handed to the worker with the weights before this
        step's update; a resumed run must sample that step with those weights, not with the newer ones, so they
        are saved too (one more copy of the weights per checkpoint).
        """
        state = {**self.updater.state_dict(), "data_pos": self.data_pos}
        if self.worker is not None and self.worker.pending:
            state["async_pending_weights"] = self.worker.pending_state
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.updater.load_state_dict(state)
        self.data_pos = int(state["data_pos"])
        self._resume_weights = state.get("async_pending_weights")

    def postfix(self, metrics: dict[str, Any]) -> dict[str, str]:
        """Reward, accuracy and tokens/s for the progress bar."""
        reward, acc = metrics["reward/mean"], metrics["accuracy"]
        return {
            "reward": f"{reward:.3f}" if reward is not None else "-",
            "acc": f"{acc:.2f}" if acc is not None else "-",
            "tok_s": f"{metrics['tokens_per_s']:.0f}",
        }

    def close(self) -> None:
        """Stop the rollout worker."""
        if self.worker is not None:
            self.worker.close()
