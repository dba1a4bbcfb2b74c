"""The policy-gradient update every native learner shares: optimizer, schedule, reference, and the update itself.

:class:`PolicyUpdater` owns the optimizer, the learning-rate schedule and the frozen reference model, and runs epochs
x minibatches x micro-batches of one loss (:mod:`lrmgym.learners.algorithms.losses`) over a list of tokenized
trajectories with their advantages, as :class:`~lrmgym.learners.engine.pg_config.PolicyGradientConfig` says
(micro-batches and update threads: :mod:`lrmgym.learners.engine.microbatch`; the weight copies:
:mod:`lrmgym.learners.engine.weights`). Algorithms (:mod:`lrmgym.learners.algorithms.grpo`...) decide which
trajectories and which advantages.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from lrmgym.learners.algorithms.losses import aggregate, kl_penalty, policy_loss
from lrmgym.learners.algorithms.tis import tis_weights
from lrmgym.learners.engine import shared_prefix
from lrmgym.learners.engine.common import adamw, check_trainable, derived_seed, usable_cpus
from lrmgym.learners.engine.flops import LlamaShape, forward_flops
from lrmgym.learners.engine.microbatch import in_threads, micro_batches
from lrmgym.learners.engine.pg_config import PolicyGradientConfig
from lrmgym.learners.engine.rollout import TokenBatch, collate_advantages
from lrmgym.learners.engine.weights import AdapterOffReference, Float32Master, Scorer, UpdaterState, frozen_reference

# PolicyGradientConfig (engine/pg_config.py), adamw, check_trainable, derived_seed, usable_cpus and collate_advantages
# are re-exported for the learners; so are the weight copies of engine/weights.py.
__all__ = [
    "AdapterOffReference",
    "PolicyGradientConfig",
    "PolicyUpdater",
    "adamw",
    "check_trainable",
    "collate_advantages",
    "derived_seed",
    "frozen_reference",
    "usable_cpus",
]


class PolicyUpdater(UpdaterState):
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
        """``rows`` of ``batch`` as forward/backward passes (see microbatch.micro_batches)."""
        return micro_batches(self.cfg, batch, rows, parts)

    def _in_threads(
        self, micros: list[list[int]], costs: list[int], one_pass: Callable[[list[int], list], dict[str, float]]
    ) -> list[dict[str, float]]:
        """:func:`~lrmgym.learners.engine.microbatch.in_threads` on this updater's pool (made on first use)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.cfg.update_threads - 1, thread_name_prefix="lrmgym-update")
        return in_threads(self._pool, self.cfg.update_threads, self.params, micros, costs, one_pass)

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
                    trainable parameter (an update thread's own, see microbatch.in_threads).
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
