"""ReasonMaxxer's options (``learner=reason_maxxer``): data, selection, loss, LoRA and the optimizer."""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field, field_validator, model_validator

from lrmgym.learners.engine.common import check_adam_betas, derived_seed
from lrmgym.learners.engine.context import RunContext
from lrmgym.learners.engine.loop import Loop, LoopConfig
from lrmgym.learners.engine.onpolicy import _INIT

__all__ = ["ReasonMaxxerConfig"]


class ReasonMaxxerConfig(LoopConfig):
    """Options of ReasonMaxxer (arXiv 2605.06241). Defaults: the paper's recipe (Qwen2.5-1.5B scale)."""

    kind: Literal["reason_maxxer"] = "reason_maxxer"
    """The learner kind."""
    steps: int | None = Field(None, ge=1, le=10_000_000)
    """Optimizer steps; None: `epochs` passes over the training rollouts, ceil(rollouts / batch_size) each."""
    rollouts_from: str | None = None
    """A JSONL file of judged rollouts to train on instead of sampling (`lrmgym export traces` writes one): per
    line task_id, prompt, completion, prompt_token_ids, token_ids, reward, correct, strength (and optionally
    finish_reason). Null token ids are encoded with the policy's tokenizer. None: sample from the policy."""
    problems: int = Field(150, ge=1, le=10_000_000)
    """Problems sampled from the env's training stream (the paper: 150)."""
    rollouts_per_problem: int = Field(20, ge=2, le=4096)
    """Rollouts per problem, K (the paper: 20)."""
    temperature: float = Field(0.6, gt=0.0, le=10.0)
    """Sampling temperature of the rollouts (the paper: 0.6)."""
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    """Nucleus threshold of the rollouts (the paper: 0.95)."""
    max_new_tokens: int = Field(8192, ge=1, le=1_000_000)
    """Token budget of a rollout (the paper: 8192)."""
    sample_chunk: int = Field(16, ge=1, le=100_000)
    """Problems per generate call; the rollouts are saved after each, so an interrupted sampling continues."""
    max_problems: int = Field(50, ge=1, le=10_000_000)
    """Most problems kept, closest to pass rate 0.5 first (the paper: 50)."""
    trim_longest: float = Field(0.2, ge=0.0, lt=1.0)
    """Share of the kept rollouts dropped, the longest (the authors' code: 0.2)."""
    advantage: Literal["reward", "strength"] = "reward"
    """What advantages are normalised from, per problem: the reward, or an arena judge's Bradley-Terry strength
    (rollouts_from only)."""
    adv_clip: float | None = Field(2.5, gt=0.0)
    """Clip advantages to +-adv_clip (the paper: 2.5); None: no clip."""
    tau: float | None = Field(None, ge=0.0)
    """Entropy threshold in nats: decision positions have base entropy > tau (the paper: 1.4 on
    Qwen2.5-1.5B); None: calibrated so that decision_fraction of the completion tokens are decisions."""
    decision_fraction: float = Field(0.04, gt=0.0, lt=1.0)
    """Share of completion tokens gated when tau is None (the paper's tau gates 3-5 %)."""
    full_sequence: bool = False
    """Ablation: train every completion token with the advantage-weighted CE, not only decisions."""
    positive_only: bool = False
    """Ablation: train only on rollouts with A_i > 0 (entropy-gated rejection-sampling fine-tuning)."""
    beta_neg: float = Field(1.0, ge=0.0, le=100.0)
    """Scale of the negative advantages in the decision loss (the authors' code's beta_neg; 1: the paper's)."""
    neg_prob_floor: float = Field(0.0, ge=0.0, lt=1.0)
    """A negative-advantage decision token whose probability is already below this is no longer pushed down
    (the authors' code's neg_prob_floor); 0: off, the paper's loss."""
    kl_coef: float = Field(0.2, ge=0.0, le=100.0)
    """lambda, weight of the forward KL(base || theta) anchor on the non-decision positions; 0: no anchor
    (and no base forward)."""
    score_batch_size: int = Field(1, ge=1, le=65_536)
    """Rollouts per no-grad forward when scoring the base entropies."""
    lora_r: int = Field(32, ge=1, le=65_536)
    """LoRA rank (the paper: 32)."""
    lora_alpha: float = Field(64.0, gt=0.0)
    """LoRA scaling numerator: the update is scaled by lora_alpha / lora_r (the authors' code: 64)."""
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout on the adapter's input."""
    lora_targets: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Modules that get an adapter (peft target_modules)."""
    merge: bool = False
    """Also write the base with the adapter merged in (full model and tokenizer) to run_dir/merged/."""
    lr: float = Field(1e-4, gt=0.0, le=1.0)
    """Peak AdamW learning rate."""
    warmup_steps: int = Field(50, ge=0)
    """Linear warmup steps, then a linear decay to 0 at the last step."""
    adam_betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas (beta1, beta2), each in [0, 1)."""
    weight_decay: float = Field(0.0, ge=0.0, le=1.0)
    """AdamW weight decay."""
    max_grad_norm: float | None = Field(1.0, gt=0.0)
    """Clip the gradient's global norm to this; None: no clipping."""
    batch_size: int = Field(8, ge=1, le=65_536)
    """Rollouts per optimizer step; the step's loss is the mean of their losses (the paper: 1 x grad-accum 8)."""
    micro_batch_size: int = Field(1, ge=1, le=65_536)
    """Rollouts per forward/backward pass; changes memory and speed, not the update."""
    epochs: int = Field(1, ge=1, le=1000)
    """Passes over the training rollouts when steps is None (the paper: 1)."""
    order: Literal["shuffle", "clarity"] = "shuffle"
    """Rollout order: a seeded shuffle per epoch, or the authors' fixed curriculum by clarity = |A_i| x
    decisions / completion length, descending."""

    @field_validator("adam_betas")
    @classmethod
    def _check_betas(cls, betas: tuple[float, float]) -> tuple[float, float]:
        return check_adam_betas(betas, "[0.9, 0.999]")

    @model_validator(mode="after")
    def _check(self) -> ReasonMaxxerConfig:
        if self.advantage == "strength" and self.rollouts_from is None:
            raise ValueError(
                "advantage=strength needs rollouts_from: sampled rollouts carry no Bradley-Terry strength (an arena "
                "judge's exported traces do). Set rollouts_from=PATH or advantage=reward."
            )
        if self.micro_batch_size > self.batch_size:
            raise ValueError(
                f"micro_batch_size={self.micro_batch_size} exceeds batch_size={self.batch_size} (rollouts per "
                "optimizer step); lower micro_batch_size."
            )
        return self

    def for_data(self, rollouts: int) -> ReasonMaxxerConfig:
        """This config with ``steps`` set: as given, or ``epochs`` passes of ``batch_size`` over ``rollouts``."""
        if self.steps is not None:
            return self
        return self.model_copy(update={"steps": self.epochs * math.ceil(rollouts / self.batch_size)})

    def seed_torch(self, seed: int) -> None:
        """Seed torch for the run (before the policy is built), as the on-policy learners do."""
        torch.manual_seed(derived_seed(seed, _INIT))

    def build(self, ctx: RunContext) -> Loop:
        """The run loop of this learner over ``ctx``; ``.run(resume=...)`` trains (the data is made in setup)."""
        from lrmgym.learners.algorithms.reason_maxxer import ReasonMaxxer

        return Loop(ctx, self, ReasonMaxxer(self))
