"""ReasonMaxxer: sparse, entropy-gated policy selection from offline rollouts (``learner=reason_maxxer``).

Akgül et al. (arXiv 2605.06241) find that RL changes a base model's greedy choice at only a few percent of
positions, the high-entropy ones, and only to tokens the base already ranks high. So instead of RL they train
a LoRA adapter offline, once, on the base model's own rollouts::

    K rollouts per problem from the frozen base (T 0.6, top-p 0.95), graded by the env and its judges
      -> keep problems at the edge of competence (0 < pass rate < 1, closest to 0.5 first), drop the longest
         20 % of their rollouts
      -> teacher-forced base entropy H_t at every completion position; decisions D = {t : H_t > tau}
      -> A_i = (r_i - mean) / max(std, 1e-8) per problem, clipped to +-2.5
      -> L = -(1/|D|) sum_{t in D} A_i log p_theta(x_t)  +  lambda (1/|N|) sum_{t in N} KL(p_base || p_theta)
         (N: every other valid prediction position, prompt included), through LoRA on the frozen base

The data (rollouts, selection, entropies, tau) is made in :meth:`ReasonMaxxer.setup` and stored in
``run_dir/reason_maxxer/``, so a resumed run reuses it and never samples again; sampling itself is saved
every ``sample_chunk`` problems and continues where it stopped. The rollouts can also come from exported
judged traces (``rollouts_from``, :class:`JudgedRollout` per line), with Bradley-Terry strengths as the
signal (``advantage=strength``). The frozen base is the policy's own model with the adapter disabled
(``peft``'s ``disable_adapter``): no second copy of the weights. At the end the adapter is saved to
``run_dir/adapter/`` (and with ``merge``, the merged model to ``run_dir/merged/``). The run around the steps
(evaluation before/after, checkpoints, resume, SIGTERM) is :mod:`lrmgym.learners.engine.loop`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import torch
from pydantic import Field, field_validator, model_validator

from lrmgym.core import learner_env
from lrmgym.episodes import rollout
from lrmgym.learners.algorithms.logprobs import token_entropy, token_logprobs
from lrmgym.learners.engine.common import adamw, check_adam_betas, check_trainable, derived_seed
from lrmgym.learners.engine.context import RunContext
from lrmgym.learners.engine.loop import Algorithm, Loop, LoopConfig, StepResult
from lrmgym.learners.engine.onpolicy import _INIT, _TRAIN_STREAM
from lrmgym.learners.engine.rundir import atomic_torch_save, atomic_write_json
from lrmgym.learners.engine.traces import JudgedRollout, read_rollouts, write_rollouts
from lrmgym.policies.base import SamplingParams
from lrmgym.policies.fasttrain import causal_lm_logits

__all__ = [
    "JudgedRollout",
    "LossParts",
    "ReasonMaxxer",
    "ReasonMaxxerConfig",
    "Selection",
    "calibrate_tau",
    "read_rollouts",
    "reason_maxxer_loss",
    "select_rollouts",
    "write_rollouts",
]

DATA_DIR = "reason_maxxer"
"""The run directory's sub-folder with the stored rollouts, selection and report."""
_DATA_COUNTS = (
    "problems_sampled", "problems_eligible", "problems_kept", "rollouts_ungradeable", "rollouts_before_trim",
    "rollouts_kept", "rollouts_trained", "tau", "decision_frac",
)  # fmt: skip
"""What the first step's metrics line reports of the data, as ``data/<name>``."""
_ROLLOUTS, _SHUFFLE, _LORA = 0x726F, 0x7368, 0x6C6F  # seed tags: "ro" sampling, "sh" epoch order, "lo" LoRA init


# --------------------------------------------------------------------------------------------------- rollouts
def _with_token_ids(rollouts: list[JudgedRollout], policy: Any) -> tuple[list[JudgedRollout], int]:
    """``rollouts`` with missing token ids encoded by the policy (prompts as it samples them); how many were."""
    tok = policy.tokenizer
    encode_prompt = getattr(policy, "encode_prompt", None)
    out, encoded = [], 0
    for r in rollouts:
        if r.prompt_token_ids is not None and r.token_ids is not None:
            out.append(r)
            continue
        encoded += 1
        prompt_ids = r.prompt_token_ids
        if prompt_ids is None:
            if callable(encode_prompt):
                prompt_ids = list(encode_prompt(r.prompt))
            elif isinstance(r.prompt, str):
                prompt_ids = list(tok(r.prompt)["input_ids"])
            else:
                prompt_ids = list(tok.apply_chat_template(r.prompt, add_generation_prompt=True, tokenize=True))
            if not prompt_ids:
                raise ValueError(f"The prompt of task {r.task_id!r} encodes to zero tokens; it needs at least one.")
        ids = r.token_ids
        if ids is None:
            ids = list(tok(r.completion, add_special_tokens=False)["input_ids"])
            if r.finish_reason != "length":
                ids.append(int(tok.eos_token_id))
        out.append(dataclasses.replace(r, prompt_token_ids=prompt_ids, token_ids=ids))
    return out, encoded


# --------------------------------------------------------------------------------------------------- selection
@dataclass(frozen=True)
class Selection:
    """What :func:`select_rollouts` kept.

    Attributes:
        rows: Indices of the kept rollouts (after the trim), by problem rank, then in their order.
        advantages: Each kept rollout's clipped advantage.
        problems: The kept problems' task ids, best first.
        counts: ``problems_sampled``, ``problems_eligible`` (0 < pass rate < 1), ``problems_kept``,
            ``rollouts_ungradeable`` (no signal, left out), ``rollouts_before_trim``, ``rollouts_kept``.
    """

    rows: list[int]
    advantages: list[float]
    problems: list[str]
    counts: dict[str, int]


def select_rollouts(
    rollouts: Sequence[JudgedRollout],
    max_problems: int,
    trim_longest: float = 0.2,
    advantage: Literal["reward", "strength"] = "reward",
    adv_clip: float | None = 2.5,
) -> Selection:
    """Keep problems at the edge of competence, trim the longest rollouts, compute the advantages.

    A problem is eligible when its pass rate (over the rollouts whose ``correct`` is known) is strictly between
    0 and 1; one with no known ``correct`` at all is eligible when its signal is not constant, ranked after
    every problem with a pass rate. Eligible problems are ranked by closeness of the pass rate to 0.5, then
    fewer truncations, then shorter mean completion length, then first seen; the first ``max_problems`` are
    kept. Of their rollouts, the ``floor(trim_longest x n)`` longest are dropped (equal lengths: the later
    ones). Advantages are ``(s - mean) / max(std, 1e-8)`` over each problem's surviving rollouts (population
    std), clipped to ``+-adv_clip``. Rollouts without a signal (``reward``, or ``strength``) are left out.

    Rollouts must carry ``token_ids`` (the length is counted in tokens).
    """
    signal = [r.signal(advantage) for r in rollouts]
    by_task: dict[str, list[int]] = {}
    for i, r in enumerate(rollouts):
        if signal[i] is not None:
            by_task.setdefault(r.task_id, []).append(i)
    ranked = []
    for order, (task, rows) in enumerate(by_task.items()):
        known = [rollouts[i].correct for i in rows if rollouts[i].correct is not None]
        if known:
            rate = sum(known) / len(known)
            if not 0 < rate < 1:
                continue
            distance = abs(rate - 0.5)
        elif len({signal[i] for i in rows}) > 1:
            distance = math.inf
        else:
            continue
        truncated = sum(rollouts[i].finish_reason == "length" for i in rows)
        mean_len = sum(len(rollouts[i].token_ids or ()) for i in rows) / len(rows)
        ranked.append(((distance, truncated, mean_len, order), task, rows))
    ranked.sort(key=lambda entry: entry[0])
    kept = ranked[:max_problems]
    pool = [i for _, _, rows in kept for i in rows]
    drop = math.floor(trim_longest * len(pool) + 1e-9)
    by_length = sorted(range(len(pool)), key=lambda k: (len(rollouts[pool[k]].token_ids or ()), k))
    rows = [pool[k] for k in sorted(by_length[: len(pool) - drop])]
    advantages = {}
    for _, _, problem_rows in kept:
        alive = [i for i in problem_rows if i in set(rows)]
        values = np.array([signal[i] for i in alive], dtype=np.float64)
        adv = (values - values.mean()) / max(float(values.std()), 1e-8) if len(values) else values
        if adv_clip is not None:
            adv = np.clip(adv, -adv_clip, adv_clip)
        advantages.update(zip(alive, adv.tolist(), strict=True))
    counts = {
        "problems_sampled": len({r.task_id for r in rollouts}), "problems_eligible": len(ranked),
        "problems_kept": len(kept), "rollouts_ungradeable": sum(s is None for s in signal),
        "rollouts_before_trim": len(pool), "rollouts_kept": len(rows),
    }  # fmt: skip
    return Selection(rows, [advantages[i] for i in rows], [task for _, task, _ in kept], counts)


def calibrate_tau(entropies: Sequence[torch.Tensor], fraction: float) -> float:
    """The entropy threshold above which ``fraction`` of the given completion positions lie.

    ``tau`` is the ``(k + 1)``-th largest entropy, ``k = round(fraction x n)`` (at least 1, at most n - 1), so
    exactly the ``k`` largest are above it (fewer only where entropies tie at tau).
    """
    flat = torch.cat([e.reshape(-1).float() for e in entropies]) if entropies else torch.zeros(0)
    n = flat.numel()
    if n < 2:
        raise ValueError(f"tau calibration needs at least 2 completion tokens, got {n}; give tau explicitly.")
    k = min(max(1, round(fraction * n)), n - 1)
    return float(torch.kthvalue(flat, n - k).values)


# --------------------------------------------------------------------------------------------------- loss
class LossParts(NamedTuple):
    """Per-sequence terms of :func:`reason_maxxer_loss`, each ``[N]``."""

    loss: torch.Tensor
    """``decision_ce + kl_coef x anchor_kl``."""
    decision_ce: torch.Tensor
    """``-(1/|D_i|) sum_{t in D_i} A_i log p_theta(x_{t+1})`` (0 where ``D_i`` is empty)."""
    anchor_kl: torch.Tensor
    """``(1/|N_i|) sum_{t in N_i} KL(p_base || p_theta)`` at the anchor positions (0 without base logits)."""


def reason_maxxer_loss(
    logits: torch.Tensor,
    base_logits: torch.Tensor | None,
    input_ids: torch.Tensor,
    advantages: torch.Tensor,
    decision: torch.Tensor,
    anchor: torch.Tensor,
    kl_coef: float,
    beta_neg: float = 1.0,
    neg_prob_floor: float = 0.0,
) -> LossParts:
    """ReasonMaxxer's loss (arXiv 2605.06241, eqs. 6-7) of each sequence.

    Args:
        logits: ``[N, T, V]`` the trained model's logits on ``input_ids``.
        base_logits: ``[N, T, V]`` the frozen base's, or ``None`` (no anchor: ``kl_coef`` 0).
        input_ids: ``[N, T]`` right-padded rows.
        advantages: ``[N]`` each sequence's advantage ``A_i``.
        decision: ``[N, T-1]`` bool, the decision positions ``D`` (entry ``t`` predicts token ``t + 1``).
        anchor: ``[N, T-1]`` bool, the anchor positions ``N`` (valid, not in ``D``).
        kl_coef: ``lambda``, the anchor's weight.
        beta_neg: scale of the negative advantages (1: the paper's loss).
        neg_prob_floor: a decision token of a negative-advantage sequence whose probability under the trained
            model is already below this stops being pushed down (no gradient; it still counts in ``|D_i|``).
            The negative term ``-A log p`` has no minimum, so without a floor it keeps driving a wrong token's
            logit down, and through the shared adapter the same token elsewhere. 0: off (the paper's loss).

    Returns:
        The per-sequence terms; log-softmax in float32. The KL is the forward ``KL(base || theta) = sum_v
        p_base (log p_base - log p_theta)``.
    """
    dec = decision.float()
    if base_logits is None:
        logp = token_logprobs(logits, input_ids)  # [N, T-1]
        kl = torch.zeros_like(advantages, dtype=torch.float32)
    else:
        lp_theta = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # [N, T-1, V]
        lp_base = torch.log_softmax(base_logits[:, :-1].float(), dim=-1)
        logp = lp_theta.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
        kl_tok = (lp_base.exp() * (lp_base - lp_theta)).sum(-1)  # [N, T-1]
        kl = (kl_tok * anchor).sum(-1) / anchor.sum(-1).clamp(min=1)
    adv = advantages.float()
    adv = torch.where(adv < 0, beta_neg * adv, adv)
    weight = adv[:, None].expand_as(logp)
    if neg_prob_floor > 0:
        below = (logp.detach() < math.log(neg_prob_floor)) & (weight < 0)
        weight = weight.masked_fill(below, 0.0)
    ce = -(weight * logp * dec).sum(-1) / dec.sum(-1).clamp(min=1)
    return LossParts(ce + kl_coef * kl, ce, kl)


# --------------------------------------------------------------------------------------------------- config
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
        return Loop(ctx, self, ReasonMaxxer(self))


# --------------------------------------------------------------------------------------------------- training
@dataclass
class _Row:
    """A training rollout: its tokens, where the completion starts, the base entropies there, its advantage."""

    ids: list[int]
    prompt_len: int
    entropy: torch.Tensor  # [C] float32, C = len(ids) - prompt_len: entry j predicts completion token j
    advantage: float
    source: int  # index into the stored rollouts


class ReasonMaxxer(Algorithm):
    """ReasonMaxxer under the run loop: data in :meth:`setup`, one optimizer step per :meth:`train_step`.

    Step ``s`` trains on batch ``s mod B`` of epoch ``s // B`` (``B`` batches per epoch), so the data position
    is a function of the step and a resumed run sees exactly the batches an uninterrupted one would.
    """

    name = "reason_maxxer"

    def __init__(self, cfg: ReasonMaxxerConfig) -> None:
        self.cfg = cfg
        self._order: tuple[int, list[int]] | None = None  # (epoch, its order of self.rows)
        self._final_adapter: dict[str, torch.Tensor] | None = None  # the adapter once merged into the model
        self.report: dict[str, Any] = {}

    # ------------------------------------------------------------------------------------------ data
    def setup(self) -> None:
        """Make or load the data, wrap the policy's model in a LoRA adapter, build the optimizer."""
        ctx, cfg = self.loop.ctx, self.cfg
        if cfg.torch_threads is not None:
            torch.set_num_threads(cfg.torch_threads)
        check_trainable(ctx.policy, self.name)
        self.policy, self.dir = ctx.policy, ctx.run_dir / DATA_DIR
        tok = self.policy.tokenizer
        self.pad_id = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
        self.rollouts, made = self._rollouts()
        self.selection, self.tau, scored = self._selection()
        self.rows = []
        for i, adv, entropy in zip(self.selection.rows, self.selection.advantages, scored, strict=True):
            r = self.rollouts[i]
            if adv > 0 or not cfg.positive_only:
                self.rows.append(_Row([*r.prompt_token_ids, *r.token_ids], len(r.prompt_token_ids), entropy, adv, i))
        if not self.rows:
            raise ValueError(
                f"ReasonMaxxer has no rollout to train on ({self.selection.counts}): no problem has both correct and "
                "wrong rollouts"
                + (" with a positive advantage (positive_only)" if cfg.positive_only else "")
                + ". Sample more problems or rollouts per problem, or use an env the model solves sometimes."
            )
        self.loop.cfg = cfg = self.cfg = cfg.for_data(len(self.rows))
        self.batches_per_epoch = math.ceil(len(self.rows) / cfg.batch_size)
        self.model = _with_lora(self.policy, cfg, derived_seed(ctx.seed, _LORA))
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = adamw(self.params, lr=cfg.lr, betas=cfg.adam_betas, weight_decay=cfg.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.lr_factor)
        gated = sum(int((r.entropy > self.tau).sum()) for r in self.rows)
        completion = sum(r.entropy.numel() for r in self.rows)
        report = self.dir / "report.json"
        before = json.loads(report.read_text()) if report.is_file() else {}  # a resume keeps what was exported
        exported = {k: v for k, v in before.items() if k in ("adapter", "merged")}
        self.report = {
            **made, **self.selection.counts, "rollouts_trained": len(self.rows), "tau": self.tau,
            "decision_frac": 1.0 if cfg.full_sequence else gated / max(completion, 1), "steps": cfg.steps,
            "trainable_params": sum(p.numel() for p in self.params), **exported,
        }  # fmt: skip
        atomic_write_json(report, self.report)
        print(
            f"reason_maxxer: {self.report['problems_sampled']} problems, {self.report['problems_kept']} kept, "
            f"{len(self.rows)} rollouts to train on; tau {self.tau:.3f} nats gates "
            f"{100 * self.report['decision_frac']:.1f} % of completion tokens; {cfg.steps} steps.",
            flush=True,
        )

    def _rollouts(self) -> tuple[list[JudgedRollout], dict[str, Any]]:
        """The stored rollouts, made first (sampled, or copied from rollouts_from) where missing or unfinished."""
        cfg, ctx = self.cfg, self.loop.ctx
        path, meta_path = self.dir / "rollouts.jsonl", self.dir / "rollouts.json"
        if cfg.rollouts_from is not None:
            settings: dict[str, Any] = {"rollouts_from": str(cfg.rollouts_from)}
        else:
            settings = {k: getattr(cfg, k) for k in ("problems", "rollouts_per_problem", "temperature", "top_p",
                                                     "max_new_tokens", "sample_chunk")}  # fmt: skip
            settings["seed"] = ctx.seed
        meta = {"settings": settings, "done": 0, "complete": False, "generated_tokens": 0, "sample_s": 0.0}
        stored: list[JudgedRollout] = []
        if meta_path.is_file():
            meta = json.loads(meta_path.read_text())
            _same_settings(meta_path, meta["settings"], settings)
            stored = read_rollouts(path) if path.is_file() else []
        if cfg.rollouts_from is not None and not meta["complete"]:
            vocab = _vocab_size(self.policy)
            stored, encoded = _with_token_ids(read_rollouts(cfg.rollouts_from, vocab), self.policy)
            write_rollouts(path, stored)
            meta.update(complete=True, encoded=encoded)
            atomic_write_json(meta_path, meta)
        elif not meta["complete"]:
            stored = self._sample(stored[: meta["done"] * cfg.rollouts_per_problem], meta, path, meta_path)
        made = {"source": "file" if cfg.rollouts_from else "sampled", "rollouts": len(stored)}
        made.update({k: meta[k] for k in ("generated_tokens", "sample_s", "encoded") if k in meta})
        return stored, made

    def _sample(
        self, stored: list[JudgedRollout], meta: dict[str, Any], path: Path, meta_path: Path
    ) -> list[JudgedRollout]:
        """Sample the problems not yet in ``stored`` from the frozen base, ``sample_chunk`` at a time, saving each."""
        cfg, ctx = self.cfg, self.loop.ctx
        env, k = learner_env(ctx.env), cfg.rollouts_per_problem
        stream = derived_seed(ctx.seed, _TRAIN_STREAM)  # the on-policy learners' task stream
        atomic_write_json(meta_path, meta)
        for start in range(meta["done"], cfg.problems, cfg.sample_chunk):
            began = time.perf_counter()
            tasks = [env.task_at(i, seed=stream) for i in range(start, min(start + cfg.sample_chunk, cfg.problems))]
            sampling = SamplingParams(
                temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
                seed=derived_seed(ctx.seed, _ROLLOUTS, start // cfg.sample_chunk),
            )  # fmt: skip
            ro = rollout(env, self.policy, tasks, k, sampling, max_turns=1)
            new = []
            for task, group in zip(tasks, ro.groups, strict=True):
                for traj in group:
                    c, v = traj.turns[0].completion, traj.verdict
                    new.append(JudgedRollout(
                        task.id, task.prompt, c.text, c.prompt_token_ids, c.token_ids, v.score, v.correct,
                        None, c.finish_reason,
                    ))  # fmt: skip
            new, _ = _with_token_ids(new, self.policy)  # a policy that reports no token ids
            stored += new
            write_rollouts(path, stored)
            meta["done"] += len(tasks)
            meta["generated_tokens"] += sum(len(r.token_ids or ()) for r in new)
            meta["sample_s"] += time.perf_counter() - began
            meta["complete"] = meta["done"] >= cfg.problems
            atomic_write_json(meta_path, meta)
        return stored

    def _selection(self) -> tuple[Selection, float, list[torch.Tensor]]:
        """The stored selection, entropies and tau; made first (selected, then scored by the base) if missing."""
        cfg, path = self.cfg, self.dir / "selection.pt"
        settings = {k: getattr(cfg, k) for k in ("max_problems", "trim_longest", "advantage", "adv_clip", "tau",
                                                 "decision_fraction")}  # fmt: skip
        settings["rollouts"] = len(self.rollouts)
        if path.is_file():
            state = torch.load(path, map_location="cpu", weights_only=False)
            _same_settings(path, state["settings"], settings)
        else:
            sel = select_rollouts(self.rollouts, cfg.max_problems, cfg.trim_longest, cfg.advantage, cfg.adv_clip)
            began = time.perf_counter()
            entropies = self._score([self.rollouts[i] for i in sel.rows])
            tau = cfg.tau if cfg.tau is not None else calibrate_tau(entropies, cfg.decision_fraction)
            scoring = sum(len(self.rollouts[i].prompt_token_ids) + len(self.rollouts[i].token_ids) for i in sel.rows)
            state = {
                "settings": settings, "selection": dataclasses.asdict(sel), "entropies": entropies, "tau": tau,
                "scoring_tokens": scoring, "score_s": time.perf_counter() - began,
            }  # fmt: skip
            atomic_torch_save(state, path)
        self.scoring = {"scoring_tokens": state["scoring_tokens"], "score_s": state["score_s"]}
        return Selection(**state["selection"]), float(state["tau"]), state["entropies"]

    @torch.no_grad()
    def _score(self, rollouts: list[JudgedRollout]) -> list[torch.Tensor]:
        """Teacher-forced base entropy (nats, float32 log-softmax) at each completion position of each rollout."""
        from peft import PeftModel

        model = self.policy.model
        base = model.disable_adapter() if isinstance(model, PeftModel) else contextlib.nullcontext()
        was_training = model.training
        model.eval()
        out = []
        with base:
            for start in range(0, len(rollouts), self.cfg.score_batch_size):
                chunk = rollouts[start : start + self.cfg.score_batch_size]
                rows = [[*r.prompt_token_ids, *r.token_ids] for r in chunk]
                ids, attention = _pad(rows, self.pad_id, _device(model))
                entropy = token_entropy(causal_lm_logits(model, ids, attention))  # [n, T-1]
                for i, r in enumerate(chunk):
                    p = len(r.prompt_token_ids)
                    out.append(entropy[i, p - 1 : len(rows[i]) - 1].float().cpu())
        model.train(was_training)
        return out

    # ------------------------------------------------------------------------------------------ training
    def lr_factor(self, step: int) -> float:
        """Multiplier of ``lr`` for the update after ``step`` updates: linear warmup, then linear decay to 0."""
        warmup, steps = self.cfg.warmup_steps, self.cfg.steps
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (steps - step) / max(1, steps - warmup))

    def batch(self, step: int) -> list[int]:
        """Indices into ``self.rows`` that step ``step`` (0-based) trains on."""
        epoch, index = divmod(step, self.batches_per_epoch)
        if self._order is None or self._order[0] != epoch:
            if self.cfg.order == "clarity":
                order = sorted(range(len(self.rows)), key=lambda i: -self._clarity(self.rows[i]))
            else:
                rng = np.random.default_rng(derived_seed(self.loop.ctx.seed, _SHUFFLE, epoch))
                order = rng.permutation(len(self.rows)).tolist()
            self._order = (epoch, order)
        size = self.cfg.batch_size
        return self._order[1][index * size : (index + 1) * size]

    def _clarity(self, row: _Row) -> float:
        return abs(row.advantage) * float(self._gate(row).float().mean()) if row.entropy.numel() else 0.0

    def _gate(self, row: _Row) -> torch.Tensor:
        return torch.ones_like(row.entropy, dtype=torch.bool) if self.cfg.full_sequence else row.entropy > self.tau

    def collate(self, rows: Sequence[_Row]) -> tuple[torch.Tensor, ...]:
        """``ids, attention [n, T]``, ``decision, anchor [n, T-1]`` (bool) and ``advantages [n]`` of ``rows``."""
        ids, attention = _pad([r.ids for r in rows], self.pad_id, _device(self.model))
        width = ids.shape[1] - 1
        decision = torch.zeros(len(rows), width, dtype=torch.bool)
        anchor = torch.zeros(len(rows), width, dtype=torch.bool)
        for i, r in enumerate(rows):
            end = len(r.ids) - 1  # prediction positions 0 .. end-1; the completion's are prompt_len-1 .. end-1
            anchor[i, :end] = True
            decision[i, r.prompt_len - 1 : end] = self._gate(r)
        anchor &= ~decision
        advantages = torch.tensor([r.advantage for r in rows], dtype=torch.float32)
        device = ids.device
        return ids, attention, decision.to(device), anchor.to(device), advantages.to(device)

    def train_step(self) -> StepResult:
        """One optimizer step over a batch of rollouts, in micro-batches."""
        cfg, step, start = self.cfg, self.loop.step, time.perf_counter()
        batch = [self.rows[i] for i in self.batch(step)]
        sums = dict.fromkeys(("loss", "ce", "kl", "decisions", "anchors", "forward", "base", "length"), 0.0)
        self.optimizer.zero_grad(set_to_none=True)
        self.model.train()
        for first in range(0, len(batch), cfg.micro_batch_size):
            micro = batch[first : first + cfg.micro_batch_size]
            ids, attention, decision, anchor, adv = self.collate(micro)
            base = None
            if cfg.kl_coef > 0:
                with torch.no_grad(), self.model.disable_adapter():
                    base = causal_lm_logits(self.model, ids, attention)
                sums["base"] += float(attention.sum())
            logits = causal_lm_logits(self.model, ids, attention)
            parts = reason_maxxer_loss(
                logits, base, ids, adv, decision, anchor, cfg.kl_coef, cfg.beta_neg, cfg.neg_prob_floor
            )
            (parts.loss.sum() / len(batch)).backward()
            sums["loss"] += float(parts.loss.detach().sum())
            sums["ce"] += float(parts.decision_ce.detach().sum())
            sums["kl"] += float(parts.anchor_kl.detach().sum())
            sums["decisions"] += float(decision.sum())
            sums["anchors"] += float(anchor.sum())
            sums["forward"] += float(attention.sum())
            sums["length"] += sum(len(r.ids) - r.prompt_len for r in micro)
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
        lr = float(self.optimizer.param_groups[0]["lr"])
        self.optimizer.step()
        self.scheduler.step()
        self.model.eval()
        train_s = time.perf_counter() - start
        n = len(batch)
        metrics: dict[str, Any] = {
            "loss": sums["loss"] / n, "loss/decision_ce": sums["ce"] / n, "loss/anchor_kl": sums["kl"] / n,
            "kl_ref": sums["kl"] / n, "adv/mean": float(np.mean([r.advantage for r in batch])),
            "decision_tokens": int(sums["decisions"]), "anchor_tokens": int(sums["anchors"]),
            "length/mean": sums["length"] / n, "grad_norm": grad_norm, "lr": lr,
            "epoch": (step + 1) / self.batches_per_epoch, "compute/forward_tokens": int(sums["forward"]),
            "compute/base_forward_tokens": int(sums["base"]), "compute/backward_tokens": int(sums["forward"]),
            "tokens_per_s": (sums["forward"] + sums["base"]) / train_s, "time/train_s": train_s,
        }  # fmt: skip
        if step == 0:  # the data's cost and counts, once: the first step's line carries them
            metrics["generations"] = self.report["rollouts"] if self.report["source"] == "sampled" else 0
            metrics.update({f"data/{k}": self.report[k] for k in _DATA_COUNTS})
            metrics["compute/generated_tokens"] = self.report.get("generated_tokens", 0)
            metrics["compute/scoring_tokens"] = self.scoring["scoring_tokens"]
            metrics["time/sample_s"] = self.report.get("sample_s", 0.0)
            metrics["time/score_s"] = self.scoring["score_s"]
        return StepResult(metrics, self._samples(batch[: self.loop.cfg.log_samples]))

    def _samples(self, rows: list[_Row]) -> list[dict[str, Any]]:
        """``samples.jsonl`` records: the rollout, its advantage and its decision tokens with their entropies."""
        tok, out = self.policy.tokenizer, []
        for r in rows:
            src = self.rollouts[r.source]
            where = torch.nonzero(self._gate(r)).flatten().tolist()
            decisions = [[j, tok.decode([r.ids[r.prompt_len + j]]), round(float(r.entropy[j]), 4)] for j in where]
            out.append({
                "task_id": src.task_id, "completion": src.completion, "reward": src.reward, "correct": src.correct,
                "advantage": r.advantage, "decisions": decisions,
            })  # fmt: skip
        return out

    def end_step(self) -> None:
        """After the last step (or when a budget ends the run): save the adapter, and merge it if asked."""
        if self.loop.step >= self.loop.cfg.steps or self.loop.over_budget():
            self.export()

    def export(self) -> None:
        """Write ``run_dir/adapter/`` (peft ``save_pretrained``) and, with ``merge``, ``run_dir/merged/``.

        Merging replaces the policy's model by the merged one (the same function, sampled by the fast decoder),
        so the evaluation after training runs on it; the checkpoint keeps the adapter's weights.
        """
        run_dir = self.loop.ctx.run_dir
        _save_pretrained(run_dir / "adapter", self.model, self.policy.tokenizer)
        self.report["adapter"] = str(run_dir / "adapter")
        if self.cfg.merge:
            self._final_adapter = self._adapter_state()
            self.policy.model = self.model = self.model.merge_and_unload()
            _save_pretrained(run_dir / "merged", self.model, self.policy.tokenizer)
            self.report["merged"] = str(run_dir / "merged")
        atomic_write_json(self.dir / "report.json", self.report)

    # ------------------------------------------------------------------------------------------ state
    def _adapter_state(self) -> dict[str, torch.Tensor]:
        if self._final_adapter is not None:
            return self._final_adapter
        return {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}

    def state_dict(self) -> dict[str, Any]:
        """The adapter's weights, the optimizer and the schedule (the data is in ``run_dir/reason_maxxer/``)."""
        return {
            "adapter": self._adapter_state(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        params = dict(self.model.named_parameters())
        unknown = sorted(set(state["adapter"]) - {n for n, p in params.items() if p.requires_grad})
        if unknown:
            raise ValueError(f"The checkpoint's adapter has parameters this model lacks: {unknown[:3]}...")
        with torch.no_grad():
            for name, value in state["adapter"].items():
                params[name].copy_(value)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def summary(self) -> dict[str, Any]:
        """The data counts, tau and the compute of making the data (also in ``reason_maxxer/report.json``)."""
        return dict(self.report)

    def postfix(self, metrics: dict[str, Any]) -> dict[str, str]:
        """Loss, anchor KL, learning rate and epoch."""
        return {
            "loss": f"{metrics['loss']:.3f}", "kl": f"{metrics['loss/anchor_kl']:.4f}", "lr": f"{metrics['lr']:.1e}",
            "epoch": f"{metrics['epoch']:.2f}",
        }  # fmt: skip


# --------------------------------------------------------------------------------------------------- helpers
def _with_lora(policy: Any, cfg: ReasonMaxxerConfig, seed: int) -> Any:
    """The policy's model wrapped in a fresh LoRA adapter (seeded init), set as ``policy.model``.

    A model that is a peft model already (``policy.lora``) is used as it is, if its adapter is still untrained:
    the base the loss anchors to is the model with its adapter disabled, which for a trained adapter
    (``policy.adapter``) would not be the model rollouts were sampled from.
    """
    from peft import LoraConfig, PeftModel, get_peft_model

    model = policy.model
    if isinstance(model, PeftModel):
        if any(bool(p.abs().max() > 0) for n, p in model.named_parameters() if "lora_B" in n):
            raise ValueError(
                "learner=reason_maxxer anchors to the model with its adapter disabled, but the policy's adapter is "
                "already trained (policy.adapter), so that is not the model the rollouts come from. Merge the "
                "adapter into the model first (e.g. a run's merged/ folder) and train a fresh one on it."
            )
        print(
            "reason_maxxer: the policy has a fresh LoRA adapter already (policy.lora); training that one, so the "
            "learner's lora_* options are not used.",
            flush=True,
        )
        return model
    spec = LoraConfig(
        r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
        target_modules=list(cfg.lora_targets), task_type="CAUSAL_LM",
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        policy.model = get_peft_model(model, spec)
    return policy.model


def _same_settings(path: Path, stored: dict[str, Any], current: dict[str, Any]) -> None:
    current = json.loads(json.dumps(current))  # tuples and numbers as the stored JSON has them
    differ = {k: (stored.get(k), v) for k, v in current.items() if stored.get(k) != v}
    if differ:
        what = ", ".join(f"{k}={old!r} there, {new!r} now" for k, (old, new) in differ.items())
        raise ValueError(
            f"{path} was made with other options ({what}). Resume with the options it was made with, or start a "
            "new run (or delete that file to make it again)."
        )


def _vocab_size(policy: Any) -> int:
    config = getattr(policy.model, "config", None)
    return int(getattr(config, "vocab_size", 0) or len(policy.tokenizer))


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device


def _pad(rows: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``ids`` and ``attention`` ``[n, T]``."""
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        attention[i, : len(row)] = 1
    return ids.to(device), attention.to(device)


def _save_pretrained(path: Path, model: Any, tokenizer: Any) -> None:
    """``save_pretrained`` of both into a temporary sibling folder, renamed over ``path`` (no half folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
