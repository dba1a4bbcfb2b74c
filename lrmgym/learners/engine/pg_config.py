"""The options of the policy-gradient update every native learner shares (:class:`PolicyGradientConfig`).

:class:`~lrmgym.learners.engine.update.PolicyUpdater` runs the update these options describe.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from lrmgym.learners.algorithms.losses import KLEstimator, LossAgg, PolicyLossName
from lrmgym.learners.engine.algorithm import LoopConfig
from lrmgym.learners.engine.common import check_adam_betas
from lrmgym.policies.fasttrain import compile_unavailable

__all__ = ["PolicyGradientConfig"]


class PolicyGradientConfig(LoopConfig):
    """Options of a policy-gradient update (loss, clipping, KL, optimizer, batching), shared by the learners."""

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
    """AdamW betas (beta1, beta2), each in [0, 1)."""
    max_grad_norm: float | None = Field(1.0, gt=0.0)
    """Clip the gradient's global norm to this; None disables clipping."""
    fp32_master: bool = True
    """With bfloat16/float16 trainable weights (policy.dtype=bfloat16), keep float32 master copies: the optimizer
    (and its state) steps those and writes them back rounded, so updates below bfloat16's resolution (lr 1e-6
    on weights of size 1: a step of 1e-6 against a spacing of 8e-3) accumulate instead of vanishing. Costs 4
    bytes per trainable parameter (plus Adam's state in float32). No effect on float32 weights."""
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
    causal LM (past_key_values and position_ids in its forward). See lrmgym/learners/engine/shared_prefix.py."""
    lean_forward: bool = True
    """Run the update's forward passes through lrmgym.policies.fasttrain (the lean training forward of Llama-family
    models: the same parameters and gradients, less overhead) where the model qualifies; other models, and false
    here, take model.forward."""
    compile: bool = False
    """Run the lean forward's layers through torch.compile (Inductor, dynamic shapes). On the tiny default model's
    update 1.26x faster alone (less beside the async rollout worker), but compiling takes minutes on 2 CPU cores
    (80-220 s for the first step, then 5-30 s when a new kind of input shape comes; Inductor's on-disk cache
    shortens later runs) and needs a C++ compiler on a CPU: worth it for runs of an hour or more, not for the
    default 530-s run. Needs lean_forward=true."""
    update_threads: int = Field(1, ge=1, le=64)
    """On a CPU, run this many of the update's forward/backward passes at once, each on its own thread (torch's
    intra-op threads set to 1 while they run), and add their gradients in a fixed order, so a run gives the same
    bits each time. A small model's passes multiply small matrices, which torch's own threads barely speed up: on
    the tiny default model's update batches, 2 intra-op threads took 674 ms against 650 for one, while 2 passes
    at once took 400 ms against 678 (1.70x; benchmarks/roofline.py, 2 cores). For synchronous runs
    (async_rollouts=false) with cores to spare: beside the async rollout worker on 2 cores it only moves time
    from sampling to the update (same step time). A step with fewer passes than threads gets one pass per thread."""
    pg_loss: PolicyLossName = "ppo_clip"
    """Policy loss (a name in lrmgym.learners.algorithms.losses.POLICY_LOSSES): ppo_clip (PPO/GRPO surrogate), cispo
    (detached IS weight capped at 1 + clip_high, no floor; MiniMax-M1), gspo (sequence-level ratio; GSPO) or
    reinforce (no ratio)."""
    clip_low: float = Field(0.2, ge=0.0, lt=1.0)
    """Lower clip epsilon of ppo_clip and gspo: the ratio floor is 1 - clip_low (cispo has no floor)."""
    clip_high: float = Field(0.2, ge=0.0, le=100.0)
    """Upper clip epsilon: the ratio cap is 1 + clip_high (DAPO's clip-higher: 0.28)."""
    is_cap: float | None = Field(None, gt=0.0, le=1000.0)
    """pg_loss=cispo only: the importance-weight cap, read as is_cap_mode says; None: 1 + clip_high."""
    is_cap_mode: Literal["relative", "absolute"] = "relative"
    """How cispo reads is_cap: relative (the cap is 1 + is_cap) or absolute (the cap is is_cap; Ring-Zero's 5.0,
    papers.md 3.2: its sources leave open which reading "5.0" means, the two modes cover both)."""
    loss_agg: LossAgg = "seq_mean_token_mean"
    """Loss aggregation: seq_mean_token_mean (GRPO), token_mean (DAPO) or seq_mean_token_sum_norm (Dr. GRPO)."""
    kl_coef: float = Field(0.0, ge=0.0, le=100.0)
    """Weight of the KL penalty to the reference policy: the initial one, or the policy at the last reset when
    ref_refresh_steps is set (DeepSeekMath 0.04; DAPO, Dr. GRPO and TRL's default: 0)."""
    kl_estimator: KLEstimator = "k3"
    """KL estimator: k1, k2 or k3 (GRPO's)."""
    track_kl: bool = True
    """Log the KL to the reference policy even when kl_coef is 0 (costs one no-grad forward of a frozen copy)."""
    track_kl_every: int = Field(1, ge=1)
    """With kl_coef 0, measure that KL only on every this many steps (the others log kl_ref null)."""
    ref_refresh_steps: int | None = Field(None, ge=1)
    """Every this many steps, reset the reference model to the current policy (Ring-Zero's stage 1: 400), so that
    the KL measures the drift since the last reset; None keeps the initial policy as the reference."""
    behavior_logprobs: Literal["recompute", "sampler"] = "recompute"
    """Log-probs of the behaviour policy in the ratio: recomputed by the trainer, or the sampler's own."""
    tis_cap: float | None = Field(2.0, gt=0.0, le=100.0)
    """With a separate rollout engine (policy.engine=vllm) and behavior_logprobs=recompute: weight each token's
    policy loss by min(pi_old / pi_engine, tis_cap), truncated importance sampling for the train/infer gap
    (lrmgym.learners.algorithms.tis; 2.0 as in Yao et al. 2025); None disables it. The lean sampler runs the
    trainer's own weights, so it gets no weight."""

    @field_validator("adam_betas")
    @classmethod
    def _check_betas(cls, betas: tuple[float, float]) -> tuple[float, float]:
        return check_adam_betas(betas, "[0.9, 0.99]")

    @model_validator(mode="after")
    def _check_is_cap(self) -> PolicyGradientConfig:
        if self.pg_loss != "cispo" and (self.is_cap is not None or self.is_cap_mode != "relative"):
            raise ValueError(
                f"is_cap / is_cap_mode set the importance-weight cap of pg_loss=cispo; pg_loss={self.pg_loss!r} has "
                "none. Use pg_loss=cispo or leave them unset."
            )
        if self.is_cap_mode == "absolute" and self.is_cap is None:
            raise ValueError("is_cap_mode=absolute needs is_cap (the cap itself, e.g. 5.0).")
        return self

    @model_validator(mode="after")
    def _check_compile(self) -> PolicyGradientConfig:
        if not self.compile:
            return self
        if not self.lean_forward:
            raise ValueError(
                "compile=true compiles the lean training forward, which lean_forward=false turns off; set "
                "lean_forward=true or compile=false."
            )
        missing = compile_unavailable()
        if missing is not None:
            raise ValueError(
                f"compile=true needs a C++ compiler for torch.compile's CPU code, and here {missing}. Install one "
                "(Debian/Ubuntu: apt-get install g++) or set compile=false."
            )
        return self

    @model_validator(mode="after")
    def _check_ref_refresh(self) -> PolicyGradientConfig:
        if self.ref_refresh_steps is not None and self.kl_coef == 0 and not self.track_kl:
            raise ValueError("ref_refresh_steps needs a reference model: set kl_coef > 0 or track_kl=true.")
        return self
