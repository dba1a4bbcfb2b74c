"""GRPO: group-relative policy optimisation, readable top to bottom (``learner=grpo``).

One step::

    B tasks from the training stream
      -> G trajectories each (policy.generate, no grad, KV cache; multi-turn envs add feedback turns)
      -> env.score_group per task and turn (judges wrap the env transparently)
      -> group-relative advantages (ungradeable samples masked; zero-variance groups counted)
      -> epochs x minibatches of clipped policy-gradient updates on the policy's tokens only
      -> metrics.jsonl line, samples.jsonl, checkpoint, periodic held-out evaluation

References: GRPO (DeepSeekMath, https://arxiv.org/abs/2402.03300), DAPO (https://arxiv.org/abs/2503.14476),
Dr. GRPO (https://arxiv.org/abs/2503.20783); see :mod:`lrmgym.learners.losses` and
:mod:`lrmgym.learners.advantages` for the formulas. The same code trains any transformers causal LM that a
:class:`~lrmgym.policies.base.TrainablePolicy` wraps, on CPU or GPU (tensors follow the model's device).
"""

from __future__ import annotations

import copy
import math
import os
import pathlib
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from lrmgym.core import Trajectory, task_rng
from lrmgym.learners.advantages import AdvantageName, group_advantages, scores_to_tensors
from lrmgym.learners.losses import KLEstimator, LossAgg, PolicyLossName, aggregate, kl_penalty, policy_loss
from lrmgym.learners.rollout import TokenBatch, collate, env_attr, rollout, tokenize_trajectory
from lrmgym.learners.rundir import (
    Checkpointer,
    JsonlLog,
    atomic_write_json,
    capture_rng,
    plot_metrics,
    restore_rng,
)
from lrmgym.learners.shared_prefix import forward_logprobs, prompt_groups
from lrmgym.policies.base import SamplingParams

__all__ = ["GRPOConfig", "GRPOTrainer"]


class GRPOConfig(BaseModel):
    """Options of the native GRPO learner. Defaults: plain GRPO without KL, tuned for the tiny CPU model."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    kind: Literal["grpo"] = "grpo"
    """The learner kind."""
    steps: int = Field(150, ge=1, le=10_000_000)
    """Training steps (each: sample, score, update)."""
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
    lr: float = Field(1e-4, gt=0.0, le=1.0)
    """Peak AdamW learning rate. Held constant, 1e-4 did best in the tiny-model prototype (6e-4 collapsed). With
    lr_decay=cosine on the tiny default model, 3e-4 (16 tasks/step) and 4e-4 (32 tasks/step) did better, while
    5e-4 (16 tasks/step) took training accuracy from 66 % to 50 % in its first 100 steps."""
    warmup_steps: int = Field(0, ge=0)
    """Linear learning-rate warmup steps."""
    lr_decay: Literal["constant", "linear", "cosine"] = "constant"
    """Learning rate after warmup: constant, or decaying to min_lr_ratio x lr over the run. The run's progress is
    the larger of step / steps and (with time_budget_s) training seconds / time_budget_s, so a run stopped by its
    time budget still ends at the low rate."""
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0)
    """Final learning rate of a decaying schedule, as a fraction of lr."""
    weight_decay: float = Field(0.0, ge=0.0, le=1.0)
    """AdamW weight decay."""
    adam_betas: tuple[float, float] = (0.9, 0.99)
    """AdamW betas."""
    max_grad_norm: float | None = Field(1.0, gt=0.0)
    """Clip the gradient's global norm to this; None disables clipping."""
    epochs: int = Field(1, ge=1, le=64)
    """Passes over each step's rollouts (PPO's mu)."""
    minibatches: int = Field(1, ge=1, le=4096)
    """Optimizer steps per epoch: the step's trajectories are split into this many shuffled minibatches."""
    micro_batch_size: int | None = Field(None, ge=1)
    """Trajectories per forward/backward pass (gradient accumulation within a minibatch); None = whole minibatch."""
    micro_batch_tokens: int | None = Field(None, ge=1)
    """Padded tokens per forward/backward pass: trajectories are sorted by length and packed greedily up to this
    many (rows x longest row), so short ones are not padded to the longest of the step. Bounds memory on a GPU;
    saves compute on a CPU. Ignored when micro_batch_size is set; None = whole minibatch."""
    shared_prefix: bool = True
    """In the update, run each group's prompt once and its G continuations on top of that prompt's (differentiable)
    KV cache, instead of running the prompt G times; same result up to float rounding. Needs a transformers
    causal LM (past_key_values and position_ids in its forward). See lrmgym/learners/shared_prefix.py."""
    adv_estimator: AdvantageName = "grpo"
    """Group advantages, a name in lrmgym.learners.advantages: grpo ((r-mean)/std), dr_grpo (r-mean), rloo
    (leave-one-out), reinforce_pp (r whitened over the batch) or reinforce_pp_baseline (r-mean, then whitened
    over the batch)."""
    pg_loss: PolicyLossName = "ppo_clip"
    """Policy loss, a name in lrmgym.learners.losses: ppo_clip (PPO/GRPO surrogate), cispo (detached IS weight
    capped at 1 + clip_high, no floor; MiniMax-M1), gspo (clipped sequence ratio) or reinforce (-A log p)."""
    clip_low: float = Field(0.2, ge=0.0, lt=1.0)
    """Lower clip epsilon: the ratio floor is 1 - clip_low."""
    clip_high: float = Field(0.2, ge=0.0, le=100.0)
    """Upper clip epsilon: the ratio cap is 1 + clip_high (DAPO's clip-higher: 0.28)."""
    loss_agg: LossAgg = "seq_mean_token_mean"
    """Loss aggregation: seq_mean_token_mean (GRPO), token_mean (DAPO) or seq_mean_token_sum_norm (Dr. GRPO)."""
    kl_coef: float = Field(0.0, ge=0.0, le=100.0)
    """Weight of the KL penalty to the initial policy (DeepSeekMath 0.04; DAPO, Dr. GRPO and TRL's default: 0)."""
    kl_estimator: KLEstimator = "k3"
    """KL estimator: k1, k2 or k3 (GRPO's)."""
    track_kl: bool = True
    """Log the KL to the initial policy even when kl_coef is 0 (costs one no-grad forward of a frozen copy)."""
    track_kl_every: int = Field(1, ge=1)
    """With kl_coef 0, measure that KL only on every this many steps (the others log kl_ref null)."""
    drop_zero_advantage: bool = True
    """Skip trajectories with advantage 0 in the update (they carry no policy gradient); kept when kl_coef > 0."""
    behavior_logprobs: Literal["recompute", "sampler"] = "recompute"
    """Log-probs of the behaviour policy in the ratio: recomputed by the trainer, or the sampler's own."""
    async_rollouts: bool = False
    """Sample and grade the next step's rollouts in a second process while this step trains (one step of policy
    lag; the ratio then uses the sampler's log-probs). Pays off with a spare CPU core; the env must be makeable
    by id in a fresh interpreter. See lrmgym/learners/async_rollout.py."""
    time_budget_s: float | None = Field(None, gt=0.0)
    """Stop after this many seconds of training (summed over resumes), even before `steps`; None: no limit.
    Keeps a run's wall time bounded on a busy machine, at the price of a load-dependent step count."""
    eval_before_after: bool = True
    """Evaluate on the held-out tasks of `eval` before training and after the last step."""
    eval_greedy: bool = True
    """Beside the `eval` settings, also report greedy (temperature 0, one sample) held-out accuracy."""
    eval_every: int = Field(0, ge=0)
    """Also evaluate every this many steps (0: only before and after)."""
    checkpoint_every: int = Field(25, ge=1)
    """Save a checkpoint every this many steps (and at the end, and on Ctrl-C)."""
    keep_checkpoints: int = Field(2, ge=1, le=1000)
    """How many of the newest checkpoints to keep."""
    log_samples: int = Field(2, ge=0)
    """Groups per step written to samples.jsonl (all their trajectories, with verdicts)."""
    torch_threads: int | None = Field(None, ge=1, le=1024)
    """torch intra-op threads; None keeps torch's default. On a busy 2-core machine 1 can be faster."""
    progress: bool = True
    """Show a progress bar with reward and tokens/s."""

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

    def run(self, config: Any, run_dir: pathlib.Path, resume: bool) -> dict:
        """Train as configured, writing into ``run_dir``; returns the summary (also in ``summary.json``).

        Args:
            config: The resolved :class:`~lrmgym.configs.schema.RunConfig` (env, policy, judges, eval, run).
            run_dir: The run directory (the CLI has created it and written ``config.yaml``).
            resume: Continue from the newest checkpoint in ``run_dir``.
        """
        return GRPOTrainer(self, config, pathlib.Path(run_dir)).train(resume=resume)


def _adamw(params: list[torch.nn.Parameter], **kwargs: Any) -> torch.optim.AdamW:
    """AdamW, fused into one kernel where torch has one for these parameters (CPU and CUDA floats).

    On the tiny model a step takes 1.2 ms fused against 7.9 ms for the per-tensor loop.
    """
    devices = {p.device.type for p in params}
    if len(devices) == 1 and devices <= {"cpu", "cuda"} and all(p.is_floating_point() for p in params):
        try:
            return torch.optim.AdamW(params, fused=True, **kwargs)
        except (RuntimeError, TypeError, ValueError):  # an older torch or an unsupported dtype
            pass
    return torch.optim.AdamW(params, **kwargs)


def _usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def derived_seed(seed: int, *tags: int) -> int:
    """A 31-bit seed that is a pure function of ``(seed, *tags)`` (SeedSequence mixing, no ``seed + k``)."""
    return int(task_rng(seed, *tags).integers(0, 2**31 - 1))


_TRAIN_STREAM, _SAMPLING, _INIT = 0x7472, 0x736D, 0x696E  # tags: "tr", "sm", "in"


class _Interrupt:
    """SIGINT handling during training: the first Ctrl-C asks to stop after the current step; the second aborts."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> _Interrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("\nCtrl-C: finishing the current step, then saving a checkpoint (Ctrl-C again to abort now).", flush=True)

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


class GRPOTrainer:
    """The GRPO loop over one run directory. Built by :meth:`GRPOConfig.run`; usable directly in code."""

    def __init__(self, cfg: GRPOConfig, config: Any, run_dir: pathlib.Path) -> None:
        self.cfg = cfg
        self.config = config
        self.run_dir = run_dir
        self.seed = int(config.run.seed)
        self.metrics_log = JsonlLog(run_dir / "metrics.jsonl")
        self.samples_log = JsonlLog(run_dir / "samples.jsonl")
        self.checkpoints = Checkpointer(run_dir / "checkpoints", keep=cfg.keep_checkpoints)
        self.step = 0
        self.data_pos = 0
        self.elapsed_s = 0.0
        self.evals: dict[str, dict] = {}

    # ------------------------------------------------------------------------------------------ set-up
    def _setup(self) -> None:
        from lrmgym.configs.build import make_env

        torch.manual_seed(derived_seed(self.seed, _INIT))
        self.env = make_env(self.config)
        self.policy = self.config.policy.build()
        if self.cfg.torch_threads is not None:
            # After the build: a policy may set its own thread count (the tiny one picks 2 on an idle machine),
            # and the learner's choice must win. Set before, a run started on an idle machine trained with 2
            # threads beside the rollout worker's one on 2 cores: 1.0-1.3 s a step instead of 0.6-0.7 s.
            torch.set_num_threads(self.cfg.torch_threads)
        for name in ("model", "tokenizer", "generate"):
            if getattr(self.policy, name, None) is None:
                raise TypeError(
                    f"learner=grpo needs a trainable policy (with .model, .tokenizer and .generate); the "
                    f"{getattr(self.config.policy, 'kind', type(self.config.policy).__name__)!r} policy has no "
                    f".{name}. Use policy=tiny or policy=hf."
                )
        self.model = self.policy.model
        self.device = next(self.model.parameters()).device
        self.ref_model = None
        if self.cfg.kl_coef > 0 or self.cfg.track_kl:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        params = [p for p in self.model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("The policy's model has no trainable parameters (all requires_grad=False).")
        self.optimizer = _adamw(params, lr=self.cfg.lr, betas=self.cfg.adam_betas, weight_decay=self.cfg.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.train_seed = derived_seed(self.seed, _TRAIN_STREAM)
        tok = self.policy.tokenizer
        pad = getattr(self.policy, "pad_token_id", None)
        self.pad_id = int(
            pad if pad is not None else (tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
        )
        self.turns = int(self.cfg.max_turns or env_attr(self.env, "max_turns", 1) or 1)
        self.worker = None
        if self.cfg.async_rollouts and _usable_cpus() < 2:
            print(
                "learner.async_rollouts: this process may use only one CPU, so a rollout worker would only take "
                "turns with training; running synchronously (set learner.async_rollouts=false to silence this).",
                flush=True,
            )
            self.cfg = self.cfg.model_copy(update={"async_rollouts": False})
        if self.cfg.async_rollouts:
            from lrmgym.learners.async_rollout import RolloutWorker

            self.worker = RolloutWorker(self.config, threads=self.cfg.torch_threads)

    def _state(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": capture_rng(),
            "data_pos": self.data_pos,
            "elapsed_s": self.elapsed_s,
            "evals": self.evals,
        }

    def _save(self) -> None:
        self.checkpoints.save(self.step, self._state())

    def _resume(self) -> None:
        state = self.checkpoints.load_latest()
        if state is None:  # killed before the first checkpoint: start over in the same directory
            self.metrics_log.truncate(0)
            self.samples_log.truncate(0)
            return
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        restore_rng(state["rng"])
        self.step, self.data_pos = int(state["step"]), int(state["data_pos"])
        self.elapsed_s = float(state.get("elapsed_s", 0.0))
        self.evals = dict(state.get("evals", {}))
        # Lines written after the checkpoint belong to steps that will run again: drop them.
        self.metrics_log.truncate(self.step)
        self.samples_log.truncate(self.step)

    # ------------------------------------------------------------------------------------------ the loop
    def train(self, resume: bool = False) -> dict:
        """Run (or continue) training; returns the summary."""
        self._setup()
        try:
            return self._train(resume)
        finally:
            if self.worker is not None:
                self.worker.close()

    def _train(self, resume: bool) -> dict:
        if resume:
            self._resume()
        elif self.metrics_log.path.exists() or self.checkpoints.steps():
            raise FileExistsError(
                f"{self.run_dir} already holds a run (metrics or checkpoints); resume it with "
                f"`lrmgym run --resume {self.run_dir}` or choose a new run.name."
            )
        if self.cfg.eval_before_after and "before" not in self.evals:
            self.evals["before"] = self._evaluate("step_0")
            self._save()  # a resume from here does not evaluate again
        bar = self._progress_bar()
        status = "finished"
        with _Interrupt() as interrupt:
            while self.step < self.cfg.steps:
                if self._over_budget():
                    status = "time_budget"
                    break
                metrics = self.train_step()
                bar.total = self.expected_steps()  # a time budget ends the run before `steps`: say when
                bar.update(1)
                bar.set_postfix(
                    reward=f"{metrics['reward/mean']:.3f}" if metrics["reward/mean"] is not None else "-",
                    acc=f"{metrics['accuracy']:.2f}" if metrics["accuracy"] is not None else "-",
                    tok_s=f"{metrics['tokens_per_s']:.0f}",
                )
                if self.cfg.eval_every and self.step % self.cfg.eval_every == 0 and self.step < self.cfg.steps:
                    self.evals[f"step_{self.step}"] = self._evaluate(f"step_{self.step}")
                if self.step % self.cfg.checkpoint_every == 0 or self.step == self.cfg.steps or self._over_budget():
                    self._save()
                if interrupt.requested:
                    status = "interrupted"
                    break
        bar.close()
        if status == "interrupted":
            self._save()
            summary = self._finish(status)
            raise KeyboardInterrupt
        if self.cfg.eval_before_after and "after" not in self.evals:
            self.evals["after"] = self._evaluate(f"step_{self.step}")
            self._save()  # so that a resume after this point does not evaluate again
        summary = self._finish(status)
        self._print_table(summary)
        return summary

    def progress(self) -> float:
        """How far the run is, in [0, 1]: the larger of its step share and its time-budget share."""
        done = self.step / self.cfg.steps
        if self.cfg.time_budget_s is not None:
            done = max(done, self.elapsed_s / self.cfg.time_budget_s)
        return min(1.0, done)

    def _lr_factor(self, step: int) -> float:
        """Multiplier of ``lr`` for the update after ``step`` scheduler steps (warmup, then the decay)."""
        cfg = self.cfg
        if cfg.warmup_steps and step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.lr_decay == "constant":
            return 1.0
        # LambdaLR calls this after self.step and self.elapsed_s have advanced, i.e. for the coming update.
        done = self.progress()
        shape = 1.0 - done if cfg.lr_decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * done))
        return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape

    def expected_steps(self) -> int:
        """The steps this run will reach: ``steps``, or fewer where the time budget runs out first.

        The time budget's share is estimated from the mean step time so far.
        """
        budget = self.cfg.time_budget_s
        if budget is None or self.step == 0 or self.elapsed_s <= 0:
            return self.cfg.steps
        left = max(0.0, budget - self.elapsed_s) / (self.elapsed_s / self.step)
        return min(self.cfg.steps, self.step + math.ceil(left))

    def _over_budget(self) -> bool:
        return self.cfg.time_budget_s is not None and self.elapsed_s >= self.cfg.time_budget_s

    def train_step(self) -> dict[str, Any]:
        """One GRPO step; appends its line to ``metrics.jsonl`` and returns it."""
        start = time.perf_counter()
        self.model.eval()
        b, g = self.cfg.prompts_per_step, self.cfg.group_size
        wait_s = None
        if self.worker is None:
            ro = rollout(self.env, self.policy, self._tasks(self.data_pos), g, self._sampling(self.step), self.turns)
        else:
            wait_start = time.perf_counter()
            if not self.worker.pending:  # the first step of this process: nothing was started ahead
                self.worker.submit(self.model, self._tasks(self.data_pos), g, self._sampling(self.step), self.turns)
            ro = self.worker.result()
            wait_s = time.perf_counter() - wait_start
            if self.step + 1 < self.cfg.steps:  # the next step's rollout, with the weights before this update
                nxt = self._tasks(self.data_pos + b)
                self.worker.submit(self.model, nxt, g, self._sampling(self.step + 1), self.turns)
        trajs = [t for group in ro.groups for t in group]  # [B * G], task-major
        rewards, valid = scores_to_tensors([[t.reward for t in group] for group in ro.groups])
        adv = group_advantages(rewards, valid, self.cfg.adv_estimator)
        flat_adv = adv.advantages.reshape(-1)  # [B * G]
        flat_valid = valid.reshape(-1)
        keep_zero = self.cfg.kl_coef > 0 or not self.cfg.drop_zero_advantage
        rows = [i for i in range(len(trajs)) if flat_valid[i] and (keep_zero or flat_adv[i] != 0)]
        tokenized = [tokenize_trajectory(t, self.policy.tokenizer) for t in trajs]
        train_start = time.perf_counter()
        stats = self._update([tokenized[i] for i in rows], [float(flat_adv[i]) for i in rows])
        train_s = time.perf_counter() - train_start
        stats["lr"] = self.optimizer.param_groups[0]["lr"]  # the rate this step's update used
        self.step += 1
        self.data_pos += b
        metrics = self._metrics(ro, trajs, tokenized, adv, rows, stats)
        metrics.update({
            "time/step_s": time.perf_counter() - start, "time/generate_s": ro.generate_s,
            "time/score_s": ro.score_s, "time/train_s": train_s,
        })  # fmt: skip
        if wait_s is not None:  # with async rollouts: how long this step waited for the worker
            metrics["time/wait_s"] = wait_s
        self.elapsed_s += metrics["time/step_s"]
        self.scheduler.step()  # once per training step (signal or not), after step and elapsed_s have advanced
        self.metrics_log.append(metrics)
        self._log_samples(ro, adv.advantages)
        return metrics

    def _tasks(self, position: int) -> list[Any]:
        """The step's B tasks, from ``position`` in the training stream."""
        return [self.env.task_at(position + i, seed=self.train_seed) for i in range(self.cfg.prompts_per_step)]

    def _sampling(self, step: int) -> SamplingParams:
        return self.cfg.sampling(derived_seed(self.seed, _SAMPLING, step))

    # ------------------------------------------------------------------------------------------ the update
    def _forward_logprobs(
        self, model: torch.nn.Module, batch: TokenBatch, entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(logp [n, T-1], entropy [n, T-1] or None)`` of a batch under ``model`` (see shared_prefix)."""
        return forward_logprobs(
            model, batch.input_ids.to(self.device), batch.attention_mask.to(self.device),
            batch.prompt_len if self.cfg.shared_prefix else None, self.pad_id, entropy=entropy,
        )  # fmt: skip

    @torch.no_grad()
    def _no_grad_logprobs(self, model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
        """Log-probs of every row, in micro-batches, without gradient: ``[N, T-1]`` on the model's device."""
        out = torch.zeros(batch.loss_mask.shape, device=self.device)
        for chunk in self._micro_batches(batch, list(range(len(batch)))):
            sub = batch.select(chunk)
            lp, _ = self._forward_logprobs(model, sub)
            out[chunk, : lp.shape[1]] = lp
        return out

    def _micro_batches(self, batch: TokenBatch, rows: list[int]) -> list[list[int]]:
        """Split ``rows`` of ``batch`` into forward/backward passes (see micro_batch_size, micro_batch_tokens).

        With shared_prefix, the rows of one prompt stay in one pass (so that the prompt runs once) and a pass
        costs its prompts once each: ``rows x longest continuation + prompts x longest prompt`` padded tokens.
        """
        size, budget = self.cfg.micro_batch_size, self.cfg.micro_batch_tokens
        if size:
            return [rows[i : i + size] for i in range(0, len(rows), size)]
        if not budget:
            return [rows]
        lengths = batch.attention_mask.sum(-1).tolist()
        shared = self.cfg.shared_prefix
        if shared:
            by_prompt: dict[int, list[int]] = {}
            owner = prompt_groups(batch.input_ids, batch.prompt_len)
            for r in rows:
                by_prompt.setdefault(owner[r], []).append(r)
            units = list(by_prompt.values())
            prompt = batch.prompt_len.tolist()
        else:
            units = [[r] for r in rows]
            prompt = [0] * len(lengths)
        units.sort(key=lambda u: -max(lengths[r] for r in u))  # longest first: similar widths share a pass

        def cost(chunk: list[list[int]]) -> int:  # padded tokens of one pass
            cont = max(lengths[r] - prompt[r] for u in chunk for r in u)
            return sum(map(len, chunk)) * cont + len(chunk) * max(prompt[r] for u in chunk for r in u)

        chunks: list[list[list[int]]] = []
        for unit in units:
            if chunks and cost([*chunks[-1], unit]) <= budget:
                chunks[-1].append(unit)
            else:
                chunks.append([unit])
        return [[r for u in chunk for r in u] for chunk in chunks]

    def _update(self, seqs: Sequence[Any], advantages: Sequence[float]) -> dict[str, float | None]:
        """Epochs x minibatches of policy-gradient steps on the kept trajectories; returns update statistics."""
        empty: dict[str, float | None] = {
            "loss": None, "clip_frac": None, "entropy": None, "kl_ref": None, "grad_norm": None, "ratio_max": None,
        }  # fmt: skip
        if not seqs:
            return empty
        cfg = self.cfg
        batch = collate(seqs, advantages, self.pad_id)
        n = len(batch)
        loss_mask = batch.loss_mask.to(self.device)
        # Reusing the first forward's detached log-probs as pi_old is exact only while the weights have not
        # moved, i.e. with one epoch of one minibatch; otherwise pi_old is recomputed up front.
        behavior = "sampler" if cfg.async_rollouts else cfg.behavior_logprobs  # async: pi_old is the sampler's
        reuse_old = behavior == "recompute" and cfg.epochs == 1 and cfg.minibatches == 1
        if behavior == "sampler":
            old_all = batch.sampler_logprobs.to(self.device)
        elif not reuse_old:
            old_all = self._no_grad_logprobs(self.model, batch)
        measure_kl = cfg.kl_coef > 0 or (cfg.track_kl and self.step % cfg.track_kl_every == 0)
        ref_all = self._no_grad_logprobs(self.ref_model, batch) if measure_kl and self.ref_model is not None else None
        norm_len = cfg.max_new_tokens * self.turns
        self.model.train()
        sums = {"loss": 0.0, "clip": 0.0, "tokens": 0.0, "entropy": 0.0, "kl": 0.0, "ratio_max": 0.0, "grad_norm": 0.0}
        optim_steps = 0
        for epoch in range(cfg.epochs):
            order = torch.randperm(n).tolist() if cfg.minibatches > 1 else list(range(n))
            for mb in np.array_split(np.array(order), cfg.minibatches):
                mb = mb.tolist()
                if not mb:
                    continue
                self.optimizer.zero_grad(set_to_none=True)
                mb_tokens = float(loss_mask[mb].sum())
                mb_seqs = float((loss_mask[mb].sum(-1) > 0).sum())
                for micro in self._micro_batches(batch, mb):
                    sub = batch.select(micro)
                    mask = sub.loss_mask.to(self.device)
                    t = mask.shape[1]
                    logp, entropy = self._forward_logprobs(self.model, sub, entropy=epoch == 0)
                    old = logp.detach() if reuse_old else old_all[micro, :t]
                    out = policy_loss(
                        logp, old, sub.advantages.to(self.device), mask, kind=cfg.pg_loss,
                        clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                    )  # fmt: skip
                    loss = aggregate(out.loss, mask, cfg.loss_agg, norm_len=norm_len)
                    if ref_all is not None:
                        kl = kl_penalty(logp, ref_all[micro, :t], cfg.kl_estimator)
                        if cfg.kl_coef > 0:
                            loss = loss + cfg.kl_coef * aggregate(kl, mask, cfg.loss_agg, norm_len=norm_len)
                    # Weight so that the micro-batches sum to the minibatch's aggregate (exact for every mode).
                    if cfg.loss_agg == "token_mean":
                        weight = float(mask.sum()) / max(mb_tokens, 1.0)
                    else:
                        weight = float((mask.sum(-1) > 0).sum()) / max(mb_seqs, 1.0)
                    (loss * weight).backward()
                    if epoch == 0:  # statistics of the policy as it was before this step's update
                        m = mask.float()
                        with torch.no_grad():
                            sums["entropy"] += float((entropy * m).sum())
                            if ref_all is not None:
                                sums["kl"] += float((kl.detach() * m).sum())
                    sums["loss"] += float(loss.detach()) * weight
                    sums["clip"] += float((out.clipped & mask).sum())
                    sums["tokens"] += float(mask.sum())
                    sums["ratio_max"] = max(sums["ratio_max"], float((out.ratio * mask).max()))
                if cfg.max_grad_norm is not None:
                    norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
                    sums["grad_norm"] += float(norm)
                self.optimizer.step()
                optim_steps += 1
        self.model.eval()
        first_epoch_tokens = float(loss_mask.sum())
        return {
            "loss": sums["loss"] / max(optim_steps, 1),
            "clip_frac": sums["clip"] / max(sums["tokens"], 1.0),
            "entropy": sums["entropy"] / max(first_epoch_tokens, 1.0),
            "kl_ref": sums["kl"] / max(first_epoch_tokens, 1.0) if ref_all is not None else None,
            "grad_norm": sums["grad_norm"] / max(optim_steps, 1) if cfg.max_grad_norm is not None else None,
            "ratio_max": sums["ratio_max"],
        }

    # ------------------------------------------------------------------------------------------ logging
    def _metrics(
        self, ro: Any, trajs: list[Trajectory], tokenized: list[Any], adv: Any, rows: list[int], stats: dict
    ) -> dict:
        rewards = [t.reward for t in trajs if t.reward is not None]
        judged = [t.verdict.correct for t in trajs if t.verdict is not None and t.verdict.correct is not None]
        policy_tokens = [sum(s.policy_mask) for s in tokenized]
        completions = [turn.completion for t in trajs for turn in t.turns if turn.role == "policy"]
        generated = sum(len(c.token_ids) if c and c.token_ids is not None else 0 for c in completions)
        first = [v[0].correct for group in ro.turn_verdicts for v in group if v and v[0].correct is not None]
        metrics: dict[str, Any] = {
            "step": self.step,
            "reward/mean": float(np.mean(rewards)) if rewards else None,
            "reward/std": float(np.std(rewards)) if rewards else None,
            "accuracy": float(np.mean(judged)) if judged else None,
            "zero_variance_frac": float(adv.zero_variance.float().mean()),
            "zero_variance_groups": int(adv.zero_variance.sum()),
            "ungradeable_frac": 1.0 - len(rewards) / max(len(trajs), 1),
            "trained_frac": len(rows) / max(len(trajs), 1),
            "length/mean": float(np.mean(policy_tokens)) if policy_tokens else 0.0,
            "length/truncated_frac": float(
                np.mean([c is not None and c.finish_reason == "length" for c in completions])
            ),
            "tokens_per_s": generated / ro.generate_s if ro.generate_s > 0 else 0.0,
            **stats,
        }
        if self.turns > 1:
            metrics["turns/mean"] = float(np.mean([len(t.policy_turns) for t in trajs]))
            metrics["first_turn_accuracy"] = float(np.mean(first)) if first else None
            metrics["retokenized_turns"] = sum(s.retokenized for s in tokenized)
        pop = env_attr(self.env, "pop_metrics")
        if callable(pop):
            metrics.update({f"judge/{k}": v for k, v in (pop() or {}).items()})
        return metrics

    def _log_samples(self, ro: Any, advantages: torch.Tensor) -> None:
        for b, group in enumerate(ro.groups[: self.cfg.log_samples]):
            task = group[0].task
            self.samples_log.append({
                "step": self.step, "task_id": task.id, "prompt": task.prompt, "answer": task.answer,
                "trajectories": [
                    {
                        "turns": [{"role": turn.role, "text": turn.text} for turn in t.turns],
                        "reward": t.reward, "advantage": float(advantages[b, g]),
                        "verdict": t.verdict.to_dict() if t.verdict is not None else None,
                    }
                    for g, t in enumerate(group)
                ],
            })  # fmt: skip

    def _progress_bar(self) -> Any:
        from tqdm.auto import tqdm

        return tqdm(
            total=self.cfg.steps, initial=self.step, desc="grpo", unit="step", disable=not self.cfg.progress,
            dynamic_ncols=True,
        )  # fmt: skip

    # ------------------------------------------------------------------------------------------ evaluation
    def _evaluate(self, tag: str) -> dict[str, Any]:
        """Held-out evaluation with ``config.eval`` (and greedy), results under ``eval/<tag>/``."""
        from lrmgym.eval import evaluate

        out: dict[str, Any] = {"step": self.step}
        cfg = self.config.eval
        report = evaluate(self.env, self.policy, cfg, self.run_dir / "eval" / tag, progress=self.cfg.progress)
        out["sampled"] = _eval_summary(report)
        if self.cfg.eval_greedy and not (cfg.temperature == 0 and cfg.n == 1):
            greedy = cfg.model_copy(update={"temperature": 0.0, "n": 1, "k": [1]})
            report = evaluate(
                self.env, self.policy, greedy, self.run_dir / "eval" / f"{tag}_greedy", progress=self.cfg.progress
            )
            out["greedy"] = _eval_summary(report)
        self.model.eval()
        return out

    def _finish(self, status: str) -> dict[str, Any]:
        metrics = list(self.metrics_log.records())
        points = [(e["step"], e["sampled"]["accuracy"]) for e in self.evals.values() if "sampled" in e]
        plot = plot_metrics(metrics, self.run_dir / "plots" / "metrics.png", evals=sorted(points))
        last = metrics[-10:]
        summary = {
            "status": status,
            "steps": self.step,
            "steps_planned": self.cfg.steps,
            "train_wall_s": self.elapsed_s,
            "evals": self.evals,
            "last10": {
                k: float(np.mean([m[k] for m in last if m.get(k) is not None]))
                for k in ("reward/mean", "accuracy", "length/mean", "tokens_per_s", "time/step_s")
                if any(m.get(k) is not None for m in last)
            },
            "run_dir": str(self.run_dir),
            "plot": str(plot),
        }
        atomic_write_json(self.run_dir / "summary.json", summary)
        return summary

    def _print_table(self, summary: dict) -> None:
        from rich.console import Console
        from rich.table import Table

        before, after = self.evals.get("before"), self.evals.get("after")
        console = Console()
        if before and after:
            table = Table(title=f"Held-out accuracy, {before['sampled']['tasks']} tasks (95% CI)")
            for col in ("", "before", "after", "change"):
                table.add_column(col)
            for key, label in (
                ("sampled", f"T={self.config.eval.temperature:g}, avg@{self.config.eval.n}"),
                ("greedy", "greedy"),
            ):
                if key in before and key in after:
                    b, a = before[key], after[key]
                    table.add_row(label, _fmt_acc(b), _fmt_acc(a), f"{100 * (a['accuracy'] - b['accuracy']):+.1f} pts")
            console.print(table)
        steps, train_s = summary["steps"], summary["train_wall_s"]
        console.print(f"run: {self.run_dir}  plot: {summary['plot']}  ({steps} steps, {train_s:.0f} s training)")


def _eval_summary(report: dict[str, Any]) -> dict[str, Any]:
    avg = report["avg@n"]
    return {
        "accuracy": avg["value"],
        "ci": avg["ci"],
        "tasks": report["tasks"],
        "n": report["n"],
        "mean_tokens": report.get("mean_tokens"),
    }


def _fmt_acc(e: dict[str, Any]) -> str:
    low, high = e["ci"]
    return f"{100 * e['accuracy']:.1f}% [{100 * low:.1f}, {100 * high:.1f}]"
