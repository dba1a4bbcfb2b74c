"""DAPO: GRPO with dynamic sampling, clip-higher, a token-level loss and overlong filtering (``learner=dapo``).

One step::

    round 1: B tasks from the training stream -> G trajectories each -> graded          (GRPO's step so far)
      overlong_filter: a trajectory the token budget cut off leaves the loss and its group's statistics
    a group whose counted rewards are all equal (or with fewer than 2 counted) has no signal: dropped
    round 2, 3 ...: refill_prompts more tasks (default: as many as groups are missing), sampled and graded
      the same way, until B groups have signal or max_rounds rounds have run
    -> GRPO's advantages and update on the first B groups with signal (fewer when the rounds ran out)

Every task drawn moves the training stream's position, trained on or not, and round ``r`` of step ``s`` samples
with a seed derived from the run's seed, ``s`` and ``r``: a resumed run draws and samples what the uninterrupted
one did. The step's metrics line describes everything it sampled (``reward/mean``, ``zero_variance_frac`` ...
over all rounds; ``trained_frac`` is the share of those that reached the update; ``samples.jsonl`` shows the
first groups sampled, advantage 0 where not trained), plus:

- ``dapo/rounds``: sampling rounds; ``dapo/generations``: completions sampled for this optimiser step, in all
  rounds (tasks drawn x G on a single-turn env; the same count as ``generations``, which ``generation_budget``
  sums);
- ``dapo/kept_groups``: groups trained on; ``dapo/dropped_groups``: groups dropped for lack of signal;
  ``dapo/surplus_groups``: groups with signal drawn beyond B (only when ``refill_prompts`` over-samples);
- ``dapo/overlong_filtered``: trajectories the overlong filter took out; ``dapo/capped``: 1 when the rounds
  ran out before B groups had signal.

From the paper (Yu et al. 2025, https://arxiv.org/abs/2503.14476; papers.md §4.2)::

    J = E[ (1 / sum_i |o_i|) sum_i sum_t min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A) ]
        s.t. 0 < |{o_i : correct}| < G

1. Clip-Higher, eps_low 0.2 and eps_high 0.28: ``clip_low`` and ``clip_high`` (defaults here).
2. Dynamic sampling: "over-sample, drop groups that are all correct or all wrong, refill until the batch is
   full". Here a group is dropped when its rewards do not vary, which for 0/1 rewards is the paper's rule.
3. Token-level loss, "normalise by the total tokens in the group/batch": ``loss_agg=token_mean`` (default here).
4. Overlong reward shaping is a judge (``judge=overlong``, L_max / L_cache); the "optional overlong filtering
   (mask the loss of truncated samples)" is ``overlong_filter``. A filtered trajectory is masked the way an
   ungradeable one is: no gradient, no place in its group's mean and std or in the loss's normaliser. Its
   reward grades an answer the budget cut short, so it is not used at all (nor replaced by 0).

DAPO also drops the KL term: ``kl_coef`` is 0, as in GRPOConfig. Async rollouts need dynamic_sampling=false:
a refill round's tasks are known only once the rounds before it are graded, so no step can be sampled ahead.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from lrmgym.core import Trajectory
from lrmgym.learners.algorithms.advantages import GroupAdvantages, group_advantages, scores_to_tensors
from lrmgym.learners.algorithms.grpo import GRPO, Fit, GRPOConfig
from lrmgym.learners.algorithms.losses import LossAgg
from lrmgym.learners.engine.context import RunContext
from lrmgym.learners.engine.loop import Loop, StepResult
from lrmgym.learners.engine.rollout import Rollout, rollout
from lrmgym.learners.engine.update import derived_seed

__all__ = ["DAPO", "DAPOConfig"]

_REFILL = 0x7266  # seed tag of the refill rounds: "rf"


class DAPOConfig(GRPOConfig):
    """Options of the DAPO learner: GRPO's, with DAPO's defaults and its sampling options."""

    kind: Literal["dapo"] = "dapo"  # type: ignore[assignment]
    """The learner kind."""
    clip_high: float = Field(0.28, ge=0.0, le=100.0)
    """Upper clip epsilon: the ratio cap is 1 + clip_high (DAPO's clip-higher: 0.28, with clip_low 0.2)."""
    loss_agg: LossAgg = "token_mean"
    """Loss aggregation: DAPO's token-level loss (token_mean: one mean over every policy token of the batch), or
    seq_mean_token_mean (GRPO) or seq_mean_token_sum_norm (Dr. GRPO)."""
    dynamic_sampling: bool = True
    """Drop groups without reward variance and draw further tasks until prompts_per_step groups have signal (or
    max_rounds rounds ran); false trains on the first round's groups, all of them, as GRPO does."""
    refill_prompts: int | None = Field(None, ge=1, le=100_000)
    """Tasks drawn in each refill round; None draws as many as groups are still missing. More over-samples: fewer,
    larger generate calls, but groups with signal beyond prompts_per_step are sampled and not trained on."""
    max_rounds: int = Field(8, ge=1, le=1000)
    """Sampling rounds per step at most, the first included, so that a step always ends; when they run out the
    step trains on the groups with signal it has (dapo/capped is 1)."""
    overlong_filter: bool = False
    """DAPO's overlong filtering: a trajectory whose last policy turn hit the token budget (max_new_tokens) is
    masked, as an ungradeable one is: out of the loss and of its group's statistics, not scored 0."""

    @model_validator(mode="after")
    def _check_dapo(self) -> DAPOConfig:
        if self.async_rollouts and self.dynamic_sampling:
            raise ValueError(
                "async_rollouts=true samples the next step's tasks while this step trains, but dynamic sampling "
                "knows how many tasks a step draws only once they are graded; set learner.async_rollouts=false "
                "(or learner.dynamic_sampling=false)."
            )
        return self

    def build(self, ctx: RunContext) -> Loop:
        """The run loop of this learner over ``ctx``; ``.run(resume=...)`` trains."""
        return Loop(ctx, self, DAPO(self))


def cut_off(traj: Trajectory) -> bool:
    """Whether the token budget cut off the trajectory's last policy turn (the one its reward judges)."""
    turns = traj.policy_turns
    return bool(turns) and turns[-1].completion is not None and turns[-1].completion.finish_reason == "length"


class DAPO(GRPO):
    """One DAPO step (see the module docstring): GRPO's, with :meth:`collect` and :meth:`learn` overridden."""

    name = "dapo"
    cfg: DAPOConfig

    def __init__(self, cfg: DAPOConfig) -> None:
        super().__init__(cfg)
        self._valid = torch.zeros(0, cfg.group_size, dtype=torch.bool)  # of the step's groups, filter applied
        self._zero = torch.zeros(0, dtype=torch.bool)  # of the step's groups: no signal
        self._batch: list[int] = []  # the step's groups to train on
        self._stats: dict[str, int] = {}
        self._warned = False

    def train_step(self) -> StepResult:
        """GRPO's step over :meth:`collect`'s rounds, with the ``dapo/*`` metrics."""
        out = super().train_step()
        out.metrics.update(self._stats)
        return out

    def collect(self) -> tuple[Rollout, float | None]:
        """Round 1 (GRPO's, async included), then refill rounds while groups with signal are missing.

        Returns every round's groups as one rollout (the generate and score times summed), and remembers which
        of them to train on (:meth:`learn`).
        """
        cfg, step, b = self.cfg, self.loop.step, self.cfg.prompts_per_step
        ro, wait_s = super().collect()
        rounds, valids, zeros, filtered = [ro], [], [], 0
        while True:
            valid, zero, cut = self._graded(rounds[-1])
            valids.append(valid)
            zeros.append(zero)
            filtered += cut
            signal = sum(int((~z).sum()) for z in zeros)
            if not cfg.dynamic_sampling or signal >= b or len(rounds) >= cfg.max_rounds:
                break
            n = cfg.refill_prompts or b - signal
            sampling = cfg.sampling(derived_seed(self.loop.ctx.seed, _REFILL, step, len(rounds)), step)
            tasks = self._tasks(self.data_pos, n)
            rounds.append(rollout(self.env, self.policy, tasks, cfg.group_size, sampling, self.turns))
            self.data_pos += n
        merged = Rollout(
            groups=[grp for r in rounds for grp in r.groups],
            turn_verdicts=[v for r in rounds for v in r.turn_verdicts],
            generate_s=sum(r.generate_s for r in rounds),
            score_s=sum(r.score_s for r in rounds),
        )
        zero = torch.cat(zeros)
        self._valid, self._zero = torch.cat(valids), zero
        if cfg.dynamic_sampling:
            with_signal = [i for i in range(len(zero)) if not zero[i]]
            self._batch = with_signal[:b]
        else:
            with_signal, self._batch = [], list(range(len(zero)))
        capped = cfg.dynamic_sampling and signal < b
        self._stats = {
            "dapo/rounds": len(rounds),
            "dapo/generations": sum(len(t.policy_turns) for grp in merged.groups for t in grp),
            "dapo/kept_groups": len(self._batch),
            "dapo/dropped_groups": int(zero.sum()) if cfg.dynamic_sampling else 0,
            "dapo/surplus_groups": max(len(with_signal) - b, 0),
            "dapo/overlong_filtered": filtered,
            "dapo/capped": int(capped),
        }
        if capped and not self._warned:
            self._warned = True
            print(
                f"learner=dapo: step {step + 1} ran max_rounds={cfg.max_rounds} sampling rounds and found "
                f"{signal} of {b} groups with signal, so it trains on {signal} (dapo/capped marks such steps in "
                "metrics.jsonl; raise learner.max_rounds or learner.refill_prompts to fill more).",
                flush=True,
            )
        return merged, wait_s

    def learn(self, trajs: list[Any], tokenized: list[Any], rewards: torch.Tensor, valid: torch.Tensor) -> Fit:
        """GRPO's advantages and update on the groups :meth:`collect` kept; the others get advantage 0."""
        valid = valid & self._valid
        g = self.cfg.group_size
        # No group kept (the rounds ran out first): every group goes in with nothing counted, so no update.
        batch = self._batch or list(range(len(rewards)))
        counted = valid[batch] if self._batch else torch.zeros_like(valid)
        rows = [k * g + j for k in batch for j in range(g)]
        fit = super().learn([trajs[i] for i in rows], [tokenized[i] for i in rows], rewards[batch], counted)
        adv = torch.zeros(rewards.shape, dtype=torch.float32)
        adv[batch] = fit.advantages.advantages
        return fit._replace(advantages=GroupAdvantages(adv, valid, self._zero))

    def _graded(self, ro: Rollout) -> tuple[torch.Tensor, torch.Tensor, int]:
        """A round's counted samples, groups without signal, and how many trajectories the filter took out.

        ``valid [B, G]``: gradeable and, with overlong_filter, not cut off; ``zero [B]``: as the advantage
        estimator reports groups without signal over those samples.
        """
        rewards, valid = scores_to_tensors([[t.reward for t in group] for group in ro.groups])
        cut = 0
        if self.cfg.overlong_filter:
            off = torch.tensor([[cut_off(t) for t in group] for group in ro.groups], dtype=torch.bool)
            cut, valid = int((valid & off).sum()), valid & ~off
        return valid, group_advantages(rewards, valid, self.cfg.adv_estimator).zero_variance, cut
