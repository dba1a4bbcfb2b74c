"""GRPO: group-relative policy optimisation, readable top to bottom (``learner=grpo``).

One step::

    B tasks from the training stream
      -> G trajectories each (policy.generate, no grad, KV cache; multi-turn envs add feedback turns)
      -> env.score_group per task and turn (judges wrap the env transparently)
      -> group-relative advantages (ungradeable samples masked; zero-variance groups counted)
      -> epochs x minibatches of clipped policy-gradient updates on the policy's tokens only

The run around the steps (resume, budgets, evaluation, checkpoints, logs) is :mod:`lrmgym.learners.engine.loop`; the
update is :mod:`lrmgym.learners.engine.update`; the formulas are :mod:`lrmgym.learners.algorithms.losses` and
:mod:`lrmgym.learners.algorithms.advantages`. References: GRPO (DeepSeekMath, https://arxiv.org/abs/2402.03300), DAPO
(https://arxiv.org/abs/2503.14476), Dr. GRPO (https://arxiv.org/abs/2503.20783). The same code trains any
transformers causal LM that a :class:`~lrmgym.policies.base.TrainablePolicy` wraps, on CPU or GPU.
"""

from __future__ import annotations

import time
from typing import Any, Literal, NamedTuple

import torch

from lrmgym.learners.algorithms.advantages import AdvantageName, GroupAdvantages, group_advantages, scores_to_tensors
from lrmgym.learners.engine.context import RunContext
from lrmgym.learners.engine.loop import Loop, StepResult
from lrmgym.learners.engine.metrics import rollout_metrics, sample_records
from lrmgym.learners.engine.onpolicy import OnPolicy, RolloutConfig
from lrmgym.learners.engine.rollout import tokenize_trajectory

__all__ = ["GRPO", "Fit", "GRPOConfig"]


class GRPOConfig(RolloutConfig):
    """Options of the native GRPO learner. Defaults: plain GRPO without KL, tuned for the tiny CPU model."""

    kind: Literal["grpo"] = "grpo"
    """The learner kind."""
    adv_estimator: AdvantageName = "grpo"
    """Group advantages, a name in lrmgym.learners.algorithms.advantages: grpo ((r-mean)/std), dr_grpo (r-mean), rloo
    (leave-one-out), reinforce_pp (r whitened over the batch) or reinforce_pp_baseline (r-mean, then whitened
    over the batch)."""
    drop_zero_advantage: bool = True
    """Skip trajectories with advantage 0 in the update (they carry no policy gradient); kept when kl_coef > 0."""

    def build(self, ctx: RunContext) -> Loop:
        """The run loop of this learner over ``ctx``; ``.run(resume=...)`` trains."""
        return Loop(ctx, self, GRPO(self))


class Fit(NamedTuple):
    """What :meth:`GRPO.learn` did: the advantages, how many trajectories it trained on, the update's statistics."""

    advantages: GroupAdvantages
    trained: int
    stats: dict[str, Any]
    train_s: float


class GRPO(OnPolicy):
    """One GRPO step (module docstring): :meth:`collect` groups, :meth:`learn` from them (hooks for variants)."""

    name = "grpo"
    cfg: GRPOConfig

    def train_step(self) -> StepResult:
        """Sample, grade, compute advantages, update."""
        self.updater.model.eval()
        ro, wait_s = self.collect()
        trajs = [t for group in ro.groups for t in group]  # [B * G], task-major
        tokenized = [tokenize_trajectory(t, self.policy.tokenizer) for t in trajs]
        fit = self.learn(trajs, tokenized, *scores_to_tensors([[t.reward for t in group] for group in ro.groups]))
        zero = fit.advantages.zero_variance
        metrics = rollout_metrics(
            ro, trajs, tokenized, zero, fit.trained, self.turns, self.env, self.judge_metrics(), self.updater.shape
        )
        metrics.update(fit.stats)
        metrics.update({"time/generate_s": ro.generate_s, "time/score_s": ro.score_s, "time/train_s": fit.train_s})
        if wait_s is not None:  # with async rollouts: how long this step waited for the worker
            metrics["time/wait_s"] = wait_s
        return StepResult(metrics, sample_records(ro, fit.advantages.advantages, self.cfg.log_samples))

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
        self.updater.step_schedule()
