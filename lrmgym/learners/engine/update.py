"""The policy-gradient update every native learner shares: options, optimizer, schedule, and the update itself.

:class:`PolicyGradientConfig` holds the options (loss, clipping, aggregation, KL, optimizer, schedule,
batching); :class:`PolicyUpdater` owns the optimizer, the learning-rate schedule and the frozen reference
model, and runs epochs x minibatches x micro-batches of one loss (:mod:`lrmgym.learners.algorithms.losses`) over a
list of tokenized trajectories with their advantages. Algorithms (:mod:`lrmgym.learners.algorithms.grpo`...) decide
which trajectories and which advantages.
"""

from __future__ import annotations

import contextlib
import copy
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, field_validator, model_validator

from lrmgym.learners.algorithms.losses import KLEstimator, LossAgg, PolicyLossName, aggregate, kl_penalty, policy_loss
from lrmgym.learners.algorithms.tis import tis_weights
from lrmgym.learners.engine import shared_prefix
from lrmgym.learners.engine.common import (
    adamw,
    check_adam_betas,
    check_trainable,
    derived_seed,
    intra_op_threads,
    usable_cpus,
)
from lrmgym.learners.engine.flops import LlamaShape, forward_flops
from lrmgym.learners.engine.loop import LoopConfig
from lrmgym.learners.engine.rollout import TokenBatch, collate_advantages
from lrmgym.policies.fasttrain import compile_unavailable

# adamw, check_trainable, derived_seed, usable_cpus and collate_advantages are re-exported for the learners.
__all__ = [
    "PolicyGradientConfig",
    "PolicyUpdater",
    "adamw",
    "check_trainable",
    "collate_advantages",
    "derived_seed",
    "usable_cpus",
]


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


def _within_budget(unit: list[int], cost: Callable[[list[int]], int], budget: int) -> list[list[int]]:
    """``unit``'s rows in consecutive parts of at most ``budget`` cost each (a single row may exceed it alone)."""
    parts: list[list[int]] = []
    for row in unit:
        if parts and cost([*parts[-1], row]) <= budget:
            parts[-1].append(row)
        else:
            parts.append([row])
    return parts


class Float32Master:
    """float32 copies of low-precision trainable parameters, which the optimizer steps (``learner.fp32_master``).

    Per optimizer step: :meth:`take_grads` moves the parameters' gradients onto the copies (in float32), the
    optimizer steps the copies, :meth:`write_back` rounds them into the parameters.
    """

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        self.params = params
        self.weights = [torch.nn.Parameter(p.detach().float().clone()) for p in params]

    def take_grads(self) -> None:
        """Each parameter's gradient, in float32, onto its copy (and off the parameter)."""
        for p, w in zip(self.params, self.weights, strict=True):
            w.grad = None if p.grad is None else p.grad.float()
            p.grad = None

    @torch.no_grad()
    def write_back(self) -> None:
        """The stepped copies, rounded, into the parameters."""
        for p, w in zip(self.params, self.weights, strict=True):
            p.copy_(w)

    @torch.no_grad()
    def load(self, saved: list[torch.Tensor] | None) -> None:
        """The copies from a checkpoint's ``saved`` float32 weights, or from the parameters when it has none."""
        sources = saved if saved is not None else [p.float() for p in self.params]
        for w, source in zip(self.weights, sources, strict=True):
            w.copy_(source)


class AdapterOffReference:
    """The reference policy of a LoRA run: the policy's own model with its adapters switched off.

    peft's ``disable_adapter()`` runs the base weights alone, which is the initial policy where the adapters
    start as the identity (every ``lora_B`` zero: peft's default initialisation), so no second copy of the model
    is kept (a 7B model's copy is 14 GB in bf16). :func:`frozen_reference` decides which reference a run gets.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    @contextlib.contextmanager
    def scoring(self) -> Iterator[torch.nn.Module]:
        """The model with its adapters off and in eval mode (no dropout), restored on exit."""
        training = self.model.training
        self.model.eval()
        try:
            with self.model.disable_adapter():  # type: ignore[operator]  # a peft PeftModel
                yield self.model
        finally:
            self.model.train(training)


Scorer = torch.nn.Module | AdapterOffReference
"""What the update's no-grad passes score with: a model, or the policy with its adapters off."""


def frozen_reference(model: torch.nn.Module, refreshed: bool = False) -> Scorer:
    """The frozen reference of ``model``'s policy as it is now: adapters off where that is the same, else a copy.

    :class:`AdapterOffReference` for a peft model whose LoRA adapters are all the identity now (a fresh
    adapter) and whose reference is never ``refreshed`` (reset to the current policy, which the base weights
    alone are not); a frozen ``deepcopy`` otherwise (a plain model, a loaded adapter, ``ref_refresh_steps``).
    """
    if not refreshed and callable(getattr(model, "disable_adapter", None)):
        lora_b = [p for name, p in model.named_parameters() if "lora_B" in name]
        if lora_b and all(not bool(p.detach().any()) for p in lora_b):
            return AdapterOffReference(model)
    return copy.deepcopy(model).eval().requires_grad_(False)


class PolicyUpdater:
    """The optimizer, schedule and reference model of one policy, and the policy-gradient update.

    Args:
        cfg: The update options.
        policy: A trainable policy (``model``, ``tokenizer``).
        progress: The run's progress in [0, 1] (drives decaying learning-rate schedules).
        norm_len: Dr. GRPO's constant length normaliser (the generation budget of a trajectory).
        temperature: The rollouts' sampling temperature: every log-prob the update computes is taken under
            ``softmax(logits / temperature)``, the distribution the sampler drew from.
    """

    def __init__(
        self, cfg: PolicyGradientConfig, policy: Any, progress: Any, norm_len: int, temperature: float = 1.0
    ) -> None:
        self.cfg, self.policy, self.progress, self.norm_len = cfg, policy, progress, norm_len
        self.temperature = temperature
        self.model = policy.model
        self.engine = getattr(policy, "rollout_engine", None)  # a separate sampler sent the weights (vllm_engine)
        self.shape = LlamaShape.of_model(self.model)  # None: a model lrmgym.learners.engine.flops does not count
        self.device = next(self.model.parameters()).device
        if cfg.update_threads > 1 and self.device.type != "cpu":
            raise ValueError(
                f"learner.update_threads={cfg.update_threads} runs the update's passes on CPU threads, but the "
                f"policy is on {self.device}, where they would only queue on one device. Set "
                "learner.update_threads=1."
            )
        self.ref_model: Scorer | None = None
        if cfg.kl_coef > 0 or cfg.track_kl:
            self.ref_model = frozen_reference(self.model, refreshed=cfg.ref_refresh_steps is not None)
        self.ref_step = 0  # the training steps done when the reference was last reset to the policy (0: initial)
        params = [p for p in self.model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("The policy's model has no trainable parameters (all requires_grad=False).")
        self.params = params
        self._pool: ThreadPoolExecutor | None = None  # update_threads - 1 workers, made on first use
        low = any(p.dtype in (torch.bfloat16, torch.float16) for p in params)
        self.master = Float32Master(params) if cfg.fp32_master and low else None
        stepped = self.master.weights if self.master is not None else params
        self.optimizer = adamw(stepped, lr=cfg.lr, betas=cfg.adam_betas, weight_decay=cfg.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.lr_factor)
        tok = policy.tokenizer
        pad = getattr(policy, "pad_token_id", None)
        self.pad_id = int(
            pad if pad is not None else (tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
        )

    def lr_factor(self, step: int) -> float:
        """Multiplier of ``lr`` for the update after ``step`` scheduler steps (warmup, then the decay)."""
        cfg = self.cfg
        if cfg.warmup_steps and step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.lr_decay == "constant":
            return 1.0
        # LambdaLR calls this after the loop's step and elapsed time have advanced, i.e. for the coming update.
        done = self.progress()
        shape = 1.0 - done if cfg.lr_decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * done))
        return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape

    def step_schedule(self) -> None:
        """Advance the learning-rate schedule by one training step.

        Also on a step that did not update (no group carried signal): the schedule counts steps, not updates.
        torch warns when a scheduler steps before its optimizer ever has; that is intended here, so not shown.
        """
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
            self.scheduler.step()

    def state_dict(self) -> dict[str, Any]:
        """Model, optimizer and schedule state; and the reference's weights once a reset replaced the initial ones."""
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }
        if self.master is not None:
            state["fp32_master"] = [w.detach().clone() for w in self.master.weights]
        if self.ref_step > 0 and isinstance(self.ref_model, torch.nn.Module):  # a refreshed reference is a copy
            state.update(ref_step=self.ref_step, ref_model=self.ref_model.state_dict())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.model.load_state_dict(state["model"])
        if self.engine is not None:
            self.engine.mark_stale()
        if self.master is not None:  # the float32 weights as saved, else the loaded (rounded) ones
            self.master.load(state.get("fp32_master"))
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.ref_step = int(state.get("ref_step", 0))
        if "ref_model" in state and isinstance(self.ref_model, torch.nn.Module):
            self.ref_model.load_state_dict(state["ref_model"])

    def refresh_ref(self) -> None:
        """Reset the reference to the policy when ``ref_refresh_steps`` says so (:meth:`update` calls this first).

        Due at the start of each step whose count of steps done (the schedule's) is a multiple of it: that step's
        KL is 0. A step without an update moves no weights, so a reset left to the next update copies the same
        policy. A resumed run rebuilds the initial reference as before; a reset one is in the checkpoint.
        """
        due = self.scheduler.last_epoch // self.cfg.ref_refresh_steps * self.cfg.ref_refresh_steps
        if isinstance(self.ref_model, torch.nn.Module) and due > self.ref_step:  # (a copy: frozen_reference)
            self.ref_model.load_state_dict(self.model.state_dict())
            self.ref_step = due

    # ------------------------------------------------------------------------------------------ forwards
    def forward_logprobs(
        self, model: torch.nn.Module, batch: TokenBatch, entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        """``(logp [n, T-1], entropy [n, T-1] or None, executed)`` of a batch under ``model`` (see shared_prefix).

        ``executed``: the pass's forward matmul FLOPs as its kernels ran them (shared_prefix.executed_flops; 0 for
        a model lrmgym.learners.engine.flops does not count).
        """
        ids, mask = batch.input_ids.to(self.device), batch.attention_mask.to(self.device)
        prompt_len = batch.prompt_len if self.cfg.shared_prefix else None
        owner = shared_prefix.sharing(ids, mask, prompt_len)  # decided once for the pass and its count
        logp, ent = shared_prefix.forward_logprobs(
            model, ids, mask, prompt_len, self.pad_id, entropy=entropy, temperature=self.temperature,
            lean=self.cfg.lean_forward, compiled=self.cfg.compile, owner=owner,
        )  # fmt: skip
        executed = (
            shared_prefix.executed_flops(self.shape, ids, mask, prompt_len, owner) if self.shape is not None else 0
        )
        return logp, ent, executed

    @torch.no_grad()
    def no_grad_logprobs(self, model: Scorer, batch: TokenBatch) -> torch.Tensor:
        """Log-probs of every row, in micro-batches, without gradient: ``[N, T-1]`` on the model's device."""
        return self._no_grad_pass(model, batch)[0]

    @torch.no_grad()
    def _no_grad_pass(self, model: Scorer, batch: TokenBatch) -> tuple[torch.Tensor, int]:
        """:meth:`no_grad_logprobs` and the forward matmul FLOPs its passes executed."""
        if isinstance(model, AdapterOffReference):
            with model.scoring() as base:
                return self._no_grad_pass(base, batch)
        out = torch.zeros(batch.loss_mask.shape, device=self.device)
        executed = 0
        for chunk in self.micro_batches(batch, list(range(len(batch)))):
            lp, _, flops = self.forward_logprobs(model, batch.select(chunk))
            out[chunk, : lp.shape[1]] = lp
            executed += flops
        return out, executed

    def micro_batches(self, batch: TokenBatch, rows: list[int], parts: int = 1) -> list[list[int]]:
        """Split ``rows`` of ``batch`` into forward/backward passes (see micro_batch_size, micro_batch_tokens).

        With shared_prefix, the rows of one prompt stay in one pass (so that the prompt runs once) and a pass
        costs its prompts once each: ``rows x longest continuation + prompts x longest prompt`` padded tokens.
        ``parts``: at least this many passes where the rows allow (one per update thread): when the options give
        fewer, the rows (or prompts) are dealt out in turn, longest first, so the passes have similar widths.
        """
        size, budget = self.cfg.micro_batch_size, self.cfg.micro_batch_tokens
        if size:
            if parts > 1 and len(rows) <= size * (parts - 1):  # fewer passes than threads
                size = -(-len(rows) // parts)
            return [rows[i : i + size] for i in range(0, len(rows), size)]
        if not budget and parts == 1:
            return [rows]
        lengths = batch.attention_mask.sum(-1).tolist()
        if self.cfg.shared_prefix:
            by_prompt: dict[int, list[int]] = {}
            owner = shared_prefix.prompt_groups(batch.input_ids, batch.prompt_len)
            for r in rows:
                by_prompt.setdefault(owner[r], []).append(r)
            units = list(by_prompt.values())
            prompt = batch.prompt_len.tolist()
        else:
            units = [[r] for r in rows]
            prompt = [0] * len(lengths)

        def cost(chunk: list[list[int]]) -> int:  # padded tokens of one pass
            cont = max(lengths[r] - prompt[r] for u in chunk for r in u)
            return sum(map(len, chunk)) * cont + len(chunk) * max(prompt[r] for u in chunk for r in u)

        if budget:  # a group over the budget is split: each part runs its prompt once (long real-model rollouts)
            units = [part for unit in units for part in _within_budget(unit, lambda u: cost([u]), budget)]
        units.sort(key=lambda u: -max(lengths[r] for r in u))  # longest first: similar widths share a pass

        chunks: list[list[list[int]]] = []
        for unit in units if budget else ():
            if chunks and cost([*chunks[-1], unit]) <= budget:
                chunks[-1].append(unit)
            else:
                chunks.append([unit])
        if len(chunks) < parts:
            chunks = [units[j::parts] for j in range(min(parts, len(units)))]
        return [[r for u in chunk for r in u] for chunk in chunks]

    def _in_threads(
        self, micros: list[list[int]], costs: list[int], one_pass: Callable[[list[int], list], dict[str, float]]
    ) -> list[dict[str, float]]:
        """Run ``one_pass`` over ``micros`` on ``update_threads`` threads; their results in ``micros``' order.

        The passes are dealt to the threads longest first, each to the least loaded (by ``costs``); each thread
        adds its gradients up in a list of its own, and those lists are added to ``.grad`` in thread order. So the
        same batch gives the same bits, where passes calling ``backward`` at once would add into ``.grad`` in
        whatever order they finish. The calling thread runs the first thread's share. Why threads and not torch's
        intra-op pool: see ``update_threads``; the kernels release the GIL, so the passes run side by side.
        """
        k = min(self.cfg.update_threads, len(micros))
        lanes: list[list[int]] = [[] for _ in range(k)]
        load = [0] * k
        for i in sorted(range(len(micros)), key=lambda i: (-costs[i], i)):
            j = load.index(min(load))
            lanes[j].append(i)
            load[j] += costs[i]
        grads: list[list] = [[None] * len(self.params) for _ in range(k)]

        def lane(j: int) -> list[tuple[int, dict[str, float]]]:
            return [(i, one_pass(micros[i], grads[j])) for i in sorted(lanes[j])]

        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.cfg.update_threads - 1, thread_name_prefix="lrmgym-update")
        with intra_op_threads(1):
            futures = [self._pool.submit(lane, j) for j in range(1, k)]
            try:
                done = lane(0)
            finally:
                done_rest = [f.result() for f in futures]  # wait for every thread, also when this one failed
        results = dict(done + [pair for rest in done_rest for pair in rest])
        for j, param in enumerate(self.params):
            total = None
            for lane_grads in grads:
                g = lane_grads[j]
                if g is not None:
                    total = g if total is None else total.add_(g)
            if total is not None:
                param.grad = total if param.grad is None else param.grad.add_(total)
        return [results[i] for i in range(len(micros))]

    def close(self) -> None:
        """Stop the update threads (if any ran); the updater still works after, starting them again."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # ------------------------------------------------------------------------------------------ the update
    def update(
        self,
        seqs: Sequence[Any],
        advantages: Sequence[float] | Sequence[Sequence[float]],
        measure_kl: bool,
        behavior: str,
        *,
        norm_seqs: int | None = None,
        norm_tokens: int | None = None,
        sampler_known: bool = False,
    ) -> dict[str, float | None]:
        """Epochs x minibatches of policy-gradient steps on ``seqs``; returns update statistics.

        Args:
            seqs: Tokenized trajectories (:class:`~lrmgym.learners.engine.rollout.TokenizedTrajectory`).
            advantages: One advantage per trajectory, or one per token of each trajectory (a list as long as its
                ``ids``, aligned with its ``policy_mask``; only the policy's tokens are read), as PPO's GAE gives.
            measure_kl: Compute the KL to the reference model this step (always when ``kl_coef > 0``).
            behavior: Where pi_old comes from: ``"recompute"`` (the trainer) or ``"sampler"`` (its log-probs).
            norm_seqs: The trajectories the loss's normaliser counts (GRPO's 1/G counts every gradeable
                sample); default ``len(seqs)``. A learner that leaves out zero-advantage trajectories (they carry
                no policy gradient) passes the count with them, so that leaving them out changes no gradient.
            norm_tokens: The same for ``loss_agg=token_mean``: the policy tokens the normaliser counts.
            sampler_known: Every policy token of ``seqs`` carries the sampler's log-prob: measure the
                train/infer gap (``train_infer/*``) between the sampler's and this model's log-probs.
        """
        empty: dict[str, float | None] = {
            "loss": None, "clip_frac": None, "entropy": None, "kl_ref": None, "grad_norm": None, "ratio_max": None,
            "compute/forward_tokens": 0, "compute/backward_tokens": 0, "compute/nograd_forward_tokens": 0,
        }  # fmt: skip
        if sampler_known:
            empty.update({"train_infer/logp_abs_diff": None, "train_infer/kl": None})
        # Truncated importance sampling: the rollouts came from a separate engine and pi_old is the trainer's.
        tis = self.cfg.tis_cap is not None and self.engine is not None and sampler_known and behavior != "sampler"
        if tis:
            empty["train_infer/tis_capped_frac"] = None
        if self.engine is not None:
            self.engine.begin_update()  # the weights change: the engine sleeps (GPU) and is sent them before sampling
        if self.shape is not None:
            empty.update({"compute/flops_forward": 0, "compute/flops_backward": 0})
            empty.update({"compute/executed_flops_forward": 0, "compute/executed_flops_backward": 0})
        if self.cfg.ref_refresh_steps:
            self.refresh_ref()  # before anything reads the reference, also on a step with nothing to train
        if not seqs:
            return empty
        cfg = self.cfg
        batch = collate_advantages(seqs, advantages, self.pad_id)
        n = len(batch)
        loss_mask = batch.loss_mask.to(self.device)
        # The share of the normaliser's samples (or tokens) that are here: each minibatch's mean is scaled by it.
        if cfg.loss_agg == "token_mean":
            here = float(loss_mask.sum())
            scale = here / max(float(norm_tokens), here, 1.0) if norm_tokens is not None else 1.0
        else:
            here = float((loss_mask.sum(-1) > 0).sum())
            scale = here / max(float(norm_seqs), here, 1.0) if norm_seqs is not None else 1.0
        sampler_lp = batch.sampler_logprobs.to(self.device) if sampler_known else None
        # Reusing the first forward's detached log-probs as pi_old is exact only while the weights have not
        # moved, i.e. with one epoch of one minibatch; otherwise pi_old is recomputed up front.
        reuse_old = behavior == "recompute" and cfg.epochs == 1 and cfg.minibatches == 1
        nograd_executed = 0  # forward FLOPs the no-grad passes ran (compute/executed_flops_forward)
        if behavior == "sampler":
            old_all = batch.sampler_logprobs.to(self.device)
        elif not reuse_old:
            old_all, nograd_executed = self._no_grad_pass(self.model, batch)
        measure_kl = measure_kl or cfg.kl_coef > 0
        ref_all = None
        if measure_kl and self.ref_model is not None:
            ref_all, flops = self._no_grad_pass(self.ref_model, batch)
            nograd_executed += flops
        norm_len = self.norm_len
        self.model.train()
        sums = {"loss": 0.0, "clip": 0.0, "tokens": 0.0, "entropy": 0.0, "kl": 0.0, "ratio_max": 0.0, "grad_norm": 0.0}
        sums.update(gap=0.0, gap_kl=0.0, tis_capped=0.0)
        # Compute, as tokens through a model (prompt + completion, padding excluded; a prompt shared by a group is
        # counted once per row, as a trainer without prefix sharing computes it): with gradient, and without.
        batch_tokens = float(batch.attention_mask.sum())
        nograd_passes = (not reuse_old and behavior != "sampler") + (ref_all is not None)
        nograd = batch_tokens * nograd_passes
        grad_tokens = 0.0
        # The same passes in matmul FLOPs (lrmgym.learners.engine.flops; backward = 2x), counted like the
        # tokens (per row,
        # padding excluded, a shared prompt once per row: shared_prefix computes less), for models that module
        # counts. compute/flops_forward adds the no-grad forwards to the ones with gradient.
        shape = self.shape
        lengths = batch.attention_mask.sum(-1).tolist()
        nograd_flops = nograd_passes * forward_flops(shape, lengths) if shape is not None else 0
        # What the kernels ran instead (compute/executed_flops_*: a prompt once per group where shared_prefix
        # shares, padding included) comes back from each pass.
        grad_flops = grad_executed = 0
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

                def one_pass(
                    micro: list[int],
                    grads: list | None,
                    epoch: int = epoch,
                    mb_tokens: float = mb_tokens,
                    mb_seqs: float = mb_seqs,
                ) -> dict[str, float]:
                    """Forward, loss and backward of one micro-batch; its share of the sums.

                    The gradient goes to ``.grad`` (``grads`` None) or is added to ``grads``, one slot per
                    trainable parameter (an update thread's own, see :meth:`_in_threads`).
                    """
                    sub = batch.select(micro)
                    mask = sub.loss_mask.to(self.device)
                    t = mask.shape[1]
                    logp, entropy, executed = self.forward_logprobs(self.model, sub, entropy=epoch == 0)
                    part = dict.fromkeys(("entropy", "kl", "gap", "gap_kl", "tis_capped"), 0.0)
                    part["grad_tokens"] = float(sub.attention_mask.sum())
                    part["grad_flops"] = forward_flops(shape, [lengths[r] for r in micro]) if shape is not None else 0
                    part["grad_executed"] = executed
                    old = logp.detach() if reuse_old else old_all[micro, :t]
                    adv = sub.advantages if sub.advantages.dim() == 1 else sub.advantages[:, :t]  # [n] or [n, t]
                    out = policy_loss(
                        logp, old, adv.to(self.device), mask, kind=cfg.pg_loss,
                        clip_low=cfg.clip_low, clip_high=cfg.clip_high, is_cap=cfg.is_cap,
                        is_cap_mode=cfg.is_cap_mode,
                    )  # fmt: skip
                    token_loss = out.loss
                    if tis:
                        w = tis_weights(old, sampler_lp[micro, :t], cfg.tis_cap)
                        token_loss = token_loss * w
                        part["tis_capped"] = float(((w >= cfg.tis_cap) & mask).sum()) if epoch == 0 else 0.0
                    loss = aggregate(token_loss, mask, cfg.loss_agg, norm_len=norm_len)
                    if ref_all is not None:
                        kl = kl_penalty(logp, ref_all[micro, :t], cfg.kl_estimator)
                        if cfg.kl_coef > 0:
                            loss = loss + cfg.kl_coef * aggregate(kl, mask, cfg.loss_agg, norm_len=norm_len)
                    # Weight so that the micro-batches sum to the minibatch's aggregate (exact for every mode),
                    # scaled to the normaliser's count.
                    if cfg.loss_agg == "token_mean":
                        weight = scale * float(mask.sum()) / max(mb_tokens, 1.0)
                    else:
                        weight = scale * float((mask.sum(-1) > 0).sum()) / max(mb_seqs, 1.0)
                    if grads is None:
                        (loss * weight).backward()
                    else:
                        found = torch.autograd.grad(loss * weight, self.params, allow_unused=True)
                        for j, g in enumerate(found):
                            if g is not None:
                                grads[j] = g if grads[j] is None else grads[j].add_(g)
                    if epoch == 0:  # statistics of the policy as it was before this step's update
                        m = mask.float()
                        with torch.no_grad():
                            part["entropy"] = float((entropy * m).sum())
                            if ref_all is not None:
                                part["kl"] = float((kl.detach() * m).sum())
                            if sampler_lp is not None:
                                # r = log pi_trainer - log pi_sampler on the sampler's tokens: |r| and k3, an
                                # unbiased, non-negative estimate of KL(sampler || trainer).
                                r = (logp.detach() - sampler_lp[micro, :t]).clamp(-20.0, 20.0)
                                part["gap"] = float((r.abs() * m).sum())
                                part["gap_kl"] = float(((torch.exp(r) - r - 1.0) * m).sum())
                    part["loss"] = float(loss.detach()) * weight
                    part["clip"] = float((out.clipped & mask).sum())
                    part["tokens"] = float(mask.sum())
                    part["ratio_max"] = float((out.ratio * mask).max())
                    return part

                micros = self.micro_batches(batch, mb, parts=cfg.update_threads)
                if cfg.update_threads > 1 and len(micros) > 1:
                    parts = self._in_threads(micros, [sum(lengths[r] for r in m) for m in micros], one_pass)
                else:
                    parts = [one_pass(micro, None) for micro in micros]
                for part in parts:  # in micro-batch order, whichever thread ran it
                    grad_tokens += part.pop("grad_tokens")
                    grad_flops += int(part.pop("grad_flops"))
                    grad_executed += int(part.pop("grad_executed"))
                    sums["ratio_max"] = max(sums["ratio_max"], part.pop("ratio_max"))
                    for key, value in part.items():
                        sums[key] += value
                if self.master is not None:
                    self.master.take_grads()
                if cfg.max_grad_norm is not None:
                    clipped = self.master.weights if self.master is not None else self.model.parameters()
                    norm = torch.nn.utils.clip_grad_norm_(clipped, cfg.max_grad_norm)
                    sums["grad_norm"] += float(norm)
                self.optimizer.step()
                if self.master is not None:
                    self.master.write_back()
                optim_steps += 1
        self.model.eval()
        first_epoch_tokens = float(loss_mask.sum())
        gap = {}
        if sampler_lp is not None:
            gap = {
                "train_infer/logp_abs_diff": sums["gap"] / max(first_epoch_tokens, 1.0),
                "train_infer/kl": sums["gap_kl"] / max(first_epoch_tokens, 1.0),
            }
            if tis:  # the share of policy tokens whose weight hit the cap
                gap["train_infer/tis_capped_frac"] = sums["tis_capped"] / max(first_epoch_tokens, 1.0)
        flops = {}
        if shape is not None:
            flops = {
                "compute/flops_forward": int(grad_flops + nograd_flops), "compute/flops_backward": 2 * grad_flops,
                "compute/executed_flops_forward": int(grad_executed + nograd_executed),
                "compute/executed_flops_backward": 2 * grad_executed,
            }  # fmt: skip
        return {
            "loss": sums["loss"] / max(optim_steps, 1),
            "clip_frac": sums["clip"] / max(sums["tokens"], 1.0),
            "entropy": sums["entropy"] / max(first_epoch_tokens, 1.0),
            "kl_ref": sums["kl"] / max(first_epoch_tokens, 1.0) if ref_all is not None else None,
            "grad_norm": sums["grad_norm"] / max(optim_steps, 1) if cfg.max_grad_norm is not None else None,
            "ratio_max": sums["ratio_max"],
            "compute/forward_tokens": int(grad_tokens),
            "compute/backward_tokens": int(grad_tokens),
            "compute/nograd_forward_tokens": int(nograd),
            **gap,
            **flops,
        }
