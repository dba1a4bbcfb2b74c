"""KL-LoRA distillation's options (``learner=kl_distill``): the teacher, its rollouts, the top-k cache, LoRA."""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field, field_validator, model_validator

from lrmgym.learners.engine.common import check_adam_betas, derived_seed
from lrmgym.learners.engine.context import RunContext
from lrmgym.learners.engine.loop import Loop, LoopConfig
from lrmgym.learners.engine.onpolicy import _INIT

__all__ = ["KLDistillConfig"]


class KLDistillConfig(LoopConfig):
    """Options of KL-LoRA distillation (ReasonMaxxer paper, arXiv 2605.06241, §4). Defaults: the paper's recipe."""

    kind: Literal["kl_distill"] = "kl_distill"
    """The learner kind."""
    teacher: str
    """The teacher (the RL-tuned model): a model folder (config.json + weights), a run directory of `lrmgym run`
    (its newest checkpoint in the run's own policy), or tiny. Its tokenizer must be the student's."""
    steps: int | None = Field(None, ge=1, le=10_000_000)
    """Optimizer steps; None: `epochs` passes over the teacher's rollouts, ceil(rollouts / batch_size) each."""
    rollouts_from: str | None = None
    """A JSONL file of rollouts to distil on instead of sampling the teacher (the format learner=reason_maxxer
    reads: `lrmgym export traces`); the teacher still gives the targets. None: the teacher samples them."""
    problems: int = Field(100, ge=1, le=10_000_000)
    """Problems from the env's training stream the teacher answers (the paper: 100 random problems)."""
    rollouts_per_problem: int = Field(1, ge=1, le=4096)
    """Teacher rollouts per problem."""
    temperature: float = Field(0.6, gt=0.0, le=10.0)
    """Sampling temperature of the teacher's rollouts (the paper: 0.6)."""
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    """Nucleus threshold of the teacher's rollouts (the paper: 0.95)."""
    max_new_tokens: int = Field(8192, ge=1, le=1_000_000)
    """Token budget of a teacher rollout."""
    sample_chunk: int = Field(16, ge=1, le=100_000)
    """Problems per generate call; the rollouts are saved after each, so an interrupted sampling continues."""
    top_k: int = Field(64, ge=1, le=1_000_000)
    """Teacher logits kept per position (the paper: 64), cached once; the teacher's distribution is renormalised
    over them (the paper leaves this open) and the KL runs over that support."""
    score_batch_size: int = Field(1, ge=1, le=65_536)
    """Rollouts per no-grad teacher forward when caching the top-k."""
    lora_r: int = Field(32, ge=1, le=65_536)
    """LoRA rank (the paper: 32; rank 8 already matches the teacher there)."""
    lora_alpha: float = Field(64.0, gt=0.0)
    """LoRA scaling numerator: the update is scaled by lora_alpha / lora_r (the paper's distillation alpha is not
    recovered; 64 is ReasonMaxxer's)."""
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout on the adapter's input."""
    lora_targets: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Modules that get an adapter (peft target_modules; the paper: q, k, v, o)."""
    merge: bool = False
    """Also write the student with the adapter merged in (full model and tokenizer) to run_dir/merged/."""
    lr: float = Field(1e-4, gt=0.0, le=1.0)
    """Peak AdamW learning rate (the paper: 1e-4)."""
    warmup_steps: int | None = Field(None, ge=0)
    """Linear warmup steps, then a linear decay to 0 at the last step; None: 10 % of the steps (the paper)."""
    adam_betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas (beta1, beta2), each in [0, 1)."""
    weight_decay: float = Field(0.01, ge=0.0, le=1.0)
    """AdamW weight decay (the paper: 1e-2)."""
    max_grad_norm: float | None = Field(1.0, gt=0.0)
    """Clip the gradient's global norm to this; None: no clipping."""
    batch_size: int = Field(16, ge=1, le=65_536)
    """Rollouts per optimizer step (the paper: 2 x grad-accum 8); the loss is the mean KL over their generated
    tokens."""
    micro_batch_size: int = Field(2, ge=1, le=65_536)
    """Rollouts per forward/backward pass; changes memory and speed, not the update."""
    epochs: int = Field(3, ge=1, le=1000)
    """Passes over the rollouts when steps is None (the paper: 3)."""
    order: Literal["shuffle"] = "shuffle"
    """Rollout order: a seeded shuffle per epoch."""

    @field_validator("adam_betas")
    @classmethod
    def _check_betas(cls, betas: tuple[float, float]) -> tuple[float, float]:
        return check_adam_betas(betas, "[0.9, 0.999]")

    @field_validator("teacher")
    @classmethod
    def _check_teacher(cls, teacher: str) -> str:
        if not teacher.strip():
            raise ValueError("give the teacher: a model folder, a run directory of `lrmgym run`, or tiny")
        return teacher

    @model_validator(mode="after")
    def _check(self) -> KLDistillConfig:
        if self.micro_batch_size > self.batch_size:
            raise ValueError(
                f"micro_batch_size={self.micro_batch_size} exceeds batch_size={self.batch_size} (rollouts per "
                "optimizer step); lower micro_batch_size."
            )
        return self

    def for_data(self, rollouts: int) -> KLDistillConfig:
        """This config with ``steps`` (``epochs`` passes over ``rollouts``) and ``warmup_steps`` (10 %) set."""
        cfg = self
        if cfg.steps is None:
            cfg = cfg.model_copy(update={"steps": cfg.epochs * math.ceil(rollouts / cfg.batch_size)})
        if cfg.warmup_steps is None:
            cfg = cfg.model_copy(update={"warmup_steps": math.ceil(0.1 * cfg.steps)})
        return cfg

    def seed_torch(self, seed: int) -> None:
        """Seed torch for the run (before the policy is built), as the on-policy learners do."""
        torch.manual_seed(derived_seed(seed, _INIT))

    def build(self, ctx: RunContext) -> Loop:
        """The run loop of this learner over ``ctx``; ``.run(resume=...)`` trains (the data is made in setup)."""
        from lrmgym.learners.algorithms.kl_distill import KLDistill

        return Loop(ctx, self, KLDistill(self))
