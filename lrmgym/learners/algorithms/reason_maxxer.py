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

Modules: the options are ``reason_maxxer_config``, the selection and tau ``reason_maxxer_select``, the loss
``reason_maxxer_loss``, the stored data ``reason_maxxer_data``; this one trains (and re-exports the rest).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lrmgym.files import replaced_dir
from lrmgym.learners.algorithms.reason_maxxer_config import ReasonMaxxerConfig
from lrmgym.learners.algorithms.reason_maxxer_data import ReasonMaxxerData, _device, _pad
from lrmgym.learners.algorithms.reason_maxxer_loss import LossParts, reason_maxxer_loss
from lrmgym.learners.algorithms.reason_maxxer_select import Selection, calibrate_tau, select_rollouts
from lrmgym.learners.engine.common import adamw, check_trainable, derived_seed
from lrmgym.learners.engine.loop import StepResult
from lrmgym.learners.engine.rundir import atomic_write_json
from lrmgym.learners.engine.traces import JudgedRollout, read_rollouts, write_rollouts
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
_SHUFFLE, _LORA = 0x7368, 0x6C6F  # seed tags: "sh" epoch order, "lo" LoRA init (reason_maxxer_data: "ro")


# --------------------------------------------------------------------------------------------------- training
@dataclass
class _Row:
    """A training rollout: its tokens, where the completion starts, the base entropies there, its advantage."""

    ids: list[int]
    prompt_len: int
    entropy: torch.Tensor  # [C] float32, C = len(ids) - prompt_len: entry j predicts completion token j
    advantage: float
    source: int  # index into the stored rollouts


class ReasonMaxxer(ReasonMaxxerData):
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
        self.model = _with_lora(self.policy, cfg, derived_seed(ctx.seed, _LORA), self.name)
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
        grad_norm, lr = self._optimizer_step(cfg.max_grad_norm)
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
    def _optimizer_step(self, max_grad_norm: float | None) -> tuple[float, float]:
        """Clip the adapter's gradients, step the optimizer and schedule, back to eval: ``(grad norm, lr used)``."""
        max_norm = max_grad_norm if max_grad_norm is not None else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
        lr = float(self.optimizer.param_groups[0]["lr"])
        self.optimizer.step()
        self.scheduler.step()
        self.model.eval()
        return grad_norm, lr


def _with_lora(policy: Any, cfg: Any, seed: int, name: str = "reason_maxxer") -> Any:
    """The policy's model wrapped in a fresh LoRA adapter (seeded init), set as ``policy.model``.

    ``cfg`` holds ``lora_r``, ``lora_alpha``, ``lora_dropout`` and ``lora_targets``; ``name`` is the learner's.
    A model that is a peft model already (``policy.lora``) is used as it is, if its adapter is still untrained:
    the base the loss anchors to is the model with its adapter disabled, which for a trained adapter
    (``policy.adapter``) would not be the model rollouts were sampled from (and a distilled student would not
    start from the base).
    """
    from peft import LoraConfig, PeftModel, get_peft_model

    model = policy.model
    if isinstance(model, PeftModel):
        if any(bool(p.abs().max() > 0) for n, p in model.named_parameters() if "lora_B" in n):
            raise ValueError(
                f"learner={name} trains a fresh adapter on the base, but the policy's adapter is already trained "
                "(policy.adapter), so the model with it disabled is not the base. Merge the adapter into the model "
                "first (e.g. a run's merged/ folder) and train a fresh one on it."
            )
        print(
            f"{name}: the policy has a fresh LoRA adapter already (policy.lora); training that one, so the "
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


def _save_pretrained(path: Path, model: Any, tokenizer: Any) -> None:
    """``save_pretrained`` of both into a temporary sibling folder, renamed over ``path`` (no half folder)."""
    with replaced_dir(path) as tmp:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
