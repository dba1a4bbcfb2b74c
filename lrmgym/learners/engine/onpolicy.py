"""What every learner that samples B tasks x G completions a step shares (GRPO, DAPO, PPO).

:class:`RolloutConfig` holds the rollout's options (tasks and samples per step, the token budget, sampling,
turns, async rollouts) and their checks; :class:`OnPolicy` is the algorithm's frame around them: the setup
(threads, the policy check, the :class:`~lrmgym.learners.engine.update.PolicyUpdater`, the rollout worker), the step's
groups from the training stream (sampled here, or collected from the async worker), the checkpointed state,
the progress bar and shutdown. A learner subclasses both and writes its ``train_step``.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from pydantic import Field, model_validator

from lrmgym.episodes import Rollout, rollout
from lrmgym.learners.engine.common import check_trainable, derived_seed, usable_cpus
from lrmgym.learners.engine.loop import Algorithm
from lrmgym.learners.engine.pg_config import PolicyGradientConfig
from lrmgym.learners.engine.rollout import env_attr
from lrmgym.learners.engine.update import PolicyUpdater
from lrmgym.policies.base import SamplingParams

__all__ = ["OnPolicy", "RolloutConfig"]

# Seed-stream tags ("tr", "sm", "in"): for one run seed, every on-policy learner draws the same task stream, the
# same sampling seeds and the same initial weights.
_TRAIN_STREAM, _SAMPLING, _INIT = 0x7472, 0x736D, 0x696E


class RolloutConfig(PolicyGradientConfig):
    """The rollout options of the on-policy learners (their defaults are GRPO's)."""

    prompts_per_step: int = Field(16, ge=1, le=100_000)
    """Tasks per step (B)."""
    group_size: int = Field(8, ge=2, le=4096)
    """Completions per task (G); at least 2, since advantages compare samples within a group."""
    max_new_tokens: int = Field(48, ge=1, le=1_000_000)
    """Token budget per policy turn (with window_start: the largest the response window grows to)."""
    window_start: int | None = Field(None, ge=1, le=1_000_000)
    """Response-window curriculum (Ring-Zero's stage 1: 4k -> 64k, doubled every 800 steps): rollouts start
    with this token budget, doubled every window_every_steps steps up to max_new_tokens; None: max_new_tokens
    throughout."""
    window_every_steps: int = Field(800, ge=1)
    """Steps between doublings of the response window (with window_start)."""
    temperature: float = Field(1.0, gt=0.0, le=10.0)
    """Sampling temperature of rollouts (must be > 0: greedy groups have no variance)."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling threshold of rollouts (1 keeps the sampler and the trained policy the same)."""
    stop: list[str] = Field(default_factory=list)
    """Stop strings of rollouts."""
    max_turns: int | None = Field(None, ge=1, le=100)
    """Policy turns per episode; None uses the env's own max_turns (1 for single-turn envs)."""
    async_rollouts: bool = False
    """Sample and grade the next step's rollouts in a second process while this step trains (one step of policy
    lag; the ratio then uses the sampler's log-probs). Pays off with a spare CPU core; the env must be makeable
    by id in a fresh interpreter. See lrmgym/learners/engine/async_rollout.py."""
    async_stall_s: float = Field(60.0, gt=0.0, le=86_400.0)
    """With async_rollouts: give up on a rollout worker that shows no sign of life (its heartbeat) for this many
    seconds, e.g. stopped by SIGSTOP or Ctrl-Z; the run then stops with the resume command. Counts heartbeats, not
    the rollout's length, so a long rollout never trips it."""

    @model_validator(mode="after")
    def _check_rollout(self) -> RolloutConfig:
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
        if isinstance(self.window_start, int) and self.window_start > self.max_new_tokens:
            raise ValueError(
                f"window_start={self.window_start} exceeds max_new_tokens={self.max_new_tokens}, the largest the "
                "response window grows to; lower window_start or raise max_new_tokens."
            )
        return self

    def window(self, step: int) -> int:
        """The token budget of rollouts after ``step`` steps (the response-window curriculum, else max_new_tokens)."""
        if self.window_start is None:
            return self.max_new_tokens
        if not isinstance(self.window_start, int):  # e.g. Ring-Zero's "auto", which its stage resolves first
            raise ValueError(f"window_start={self.window_start!r} is not resolved to a token count yet.")
        doublings = min(step // self.window_every_steps, 40)  # 2**40 tokens exceeds any budget
        return min(self.max_new_tokens, self.window_start << doublings)

    def sampling(self, seed: int | None, step: int = 0) -> SamplingParams:
        """The rollout sampling parameters of the step after ``step`` steps."""
        return SamplingParams(
            temperature=self.temperature, top_p=self.top_p, max_new_tokens=self.window(step),
            stop=tuple(self.stop), seed=seed,
        )  # fmt: skip

    def seed_torch(self, seed: int) -> None:
        """Seed torch for the run (before the policy is built: a fresh model's initialisation draws from it)."""
        torch.manual_seed(derived_seed(seed, _INIT))


class OnPolicy(Algorithm):
    """The frame of an on-policy learner; subclasses write ``train_step`` (and extend the hooks they need)."""

    cfg: RolloutConfig

    def __init__(self, cfg: RolloutConfig) -> None:
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
        if cfg.async_rollouts and self.updater.device.type != "cpu":
            raise ValueError(
                f"learner.async_rollouts=true: the rollout worker builds its own copy of the policy's model (and is "
                f"sent the weights every step), a second model on {self.updater.device} beside the trained one; set "
                "learner.async_rollouts=false (learner=grpo_hf does), so that sampling and training take turns."
            )
        if cfg.async_rollouts and getattr(self.policy, "rollout_engine", None) is not None:
            raise ValueError(
                "learner.async_rollouts=true samples in a worker process with the lean sampler, while "
                "policy.engine=vllm samples in this process's vLLM engine; set learner.async_rollouts=false."
            )
        missing = ctx.worker_builders_missing() if cfg.async_rollouts else None
        if missing is not None:
            # The worker would build its own env and policy: with a replaced env (a custom judge, say) it would
            # sample and grade with the old one, and the run would silently train on the wrong reward.
            print(
                f"learner.async_rollouts: {missing}, so a rollout worker could not build what this learner was "
                "handed; sampling in this process instead (assign ctx.make_env / ctx.make_policy, picklable "
                "builders of the new objects, to keep async rollouts, or set learner.async_rollouts=false to "
                "silence this).",
                flush=True,
            )
            self.cfg = cfg = cfg.model_copy(update={"async_rollouts": False})
        if cfg.async_rollouts and usable_cpus() < 2:
            print(
                "learner.async_rollouts: this process may use only one CPU, so a rollout worker would only take "
                "turns with training; running synchronously (set learner.async_rollouts=false to silence this).",
                flush=True,
            )
            self.cfg = cfg = cfg.model_copy(update={"async_rollouts": False})
        if cfg.async_rollouts:
            from lrmgym.learners.engine.async_rollout import RolloutWorker

            self.worker = RolloutWorker.for_context(ctx, threads=cfg.torch_threads, stall_s=cfg.async_stall_s)

    def collect(self) -> tuple[Rollout, float | None]:
        """This step's B groups from the data position (which moves past them) and, async, the seconds waited.

        Sampled here, or collected from the async worker, which is then handed the next step's tasks with the
        weights before this step's update.
        """
        cfg, step, g = self.cfg, self.loop.step, self.cfg.group_size
        if self.worker is None:
            ro, wait_s = (
                rollout(self.env, self.policy, self._tasks(self.data_pos), g, self._sampling(step), self.turns),
                None,
            )
        else:
            start = time.perf_counter()
            if not self.worker.pending:  # the first step of this process: nothing was started ahead
                tasks, weights, self._resume_weights = self._tasks(self.data_pos), self._resume_weights, None
                self.worker.submit(self.updater.model, tasks, g, self._sampling(step), self.turns, state=weights)
            ro = self.worker.result()
            wait_s = time.perf_counter() - start
            if step + 1 < cfg.steps:  # the next step's rollout, with the weights before this update
                nxt = self._tasks(self.data_pos + cfg.prompts_per_step)
                self.worker.submit(self.updater.model, nxt, g, self._sampling(step + 1), self.turns)
        self.data_pos += cfg.prompts_per_step
        return ro, wait_s

    def _tasks(self, position: int, count: int | None = None) -> list[Any]:
        """``count`` tasks (default B) from ``position`` in the training stream."""
        count = self.cfg.prompts_per_step if count is None else count
        return [self.env.task_at(position + i, seed=self.train_seed) for i in range(count)]

    def _sampling(self, step: int) -> SamplingParams:
        return self.cfg.sampling(derived_seed(self.loop.ctx.seed, _SAMPLING, step), step)

    def judge_metrics(self) -> dict[str, Any] | None:
        """With async rollouts, the worker's judges' metrics for the step just collected (None: the env's own)."""
        return self.worker.judge_metrics if self.worker is not None else None

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
        """Stop the rollout worker and the update threads."""
        if self.worker is not None:
            self.worker.close()
        if getattr(self, "updater", None) is not None:
            self.updater.close()
        engine = getattr(getattr(self, "policy", None), "rollout_engine", None)
        if engine is not None:
            engine.close()
