"""KL-LoRA distillation of an RL-tuned teacher into its base (``learner=kl_distill``).

The ReasonMaxxer paper (arXiv 2605.06241, §4 and App. A-B) asks how little of the base model must change to
carry an RL model's gain. It attaches LoRA to the base (q, k, v, o) and minimises the token-level forward KL to
the RL "teacher" on the teacher's own rollouts (eq. 4)::

    L = (1 / #generated tokens) sum_t KL( q_teacher(.|x_<t) || p_{base+LoRA}(.|x_<t) )

- The teacher samples ``rollouts_per_problem`` rollouts for each of ``problems`` problems of the env's training
  stream (T 0.6, top-p 0.95: the paper's), stored in ``run_dir/kl_distill/`` like ReasonMaxxer's (each chunk
  saved, so an interrupted sampling continues; a resumed run never samples again).
- One teacher-forced pass caches the teacher's top-k logits (k = 64) at every generated position, as token ids
  and log-probabilities **renormalised over the top k** (the paper does not say how; ours: the top-k logits'
  own softmax, mass outside dropped). The teacher is then released: training needs only the cache.
- The loss is averaged over generated tokens only (prompt and padding positions never count), the student's
  log-probabilities are its full-vocabulary log-softmax (:func:`forward_kl_topk`).
- AdamW lr 1e-4, weight decay 1e-2, 10 % warmup then a linear decay, batch 16 (2 x 8), 3 epochs, rank 32.

It reuses ReasonMaxxer's machinery: the rollout store and sampler (:class:`ReasonMaxxerData`, run with the
teacher as the policy), the LoRA wrapping, the epoch order, the schedule, the checkpoints (the adapter only),
the export (``run_dir/adapter/``, with ``merge`` ``run_dir/merged/``). The run loop around it evaluates the
student before and after. ``learner.teacher`` is a model folder, a run directory of ``lrmgym run`` or tiny,
loaded by the run context's ``load_model`` (:func:`lrmgym.compose.load_named_model`); a bad one is a one-line
error before anything is sampled.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lrmgym.learners.algorithms.kl_distill_config import KLDistillConfig
from lrmgym.learners.algorithms.kl_distill_loss import forward_kl_topk, teacher_topk
from lrmgym.learners.algorithms.reason_maxxer import _LORA, ReasonMaxxer, _with_lora
from lrmgym.learners.algorithms.reason_maxxer_data import _device, _pad, _same_settings, _vocab_size
from lrmgym.learners.engine.common import adamw, check_trainable, derived_seed
from lrmgym.learners.engine.loop import StepResult
from lrmgym.learners.engine.rundir import atomic_torch_save, atomic_write_json
from lrmgym.policies.fasttrain import causal_lm_logits
from lrmgym.policies.vocab import check_same_vocabulary

__all__ = ["KLDistill", "KLDistillConfig", "forward_kl_topk", "teacher_topk"]

DATA_DIR = "kl_distill"
"""The run directory's sub-folder with the teacher's rollouts, its top-k cache and the report."""
TARGETS = "topk.pt"
"""The teacher's cached top-k (ids and renormalised log-probabilities per generated position)."""


@dataclass
class _Target:
    """A rollout to distil on: its tokens, where the completion starts, the teacher's top-k at each of its tokens."""

    ids: list[int]
    prompt_len: int
    top_ids: torch.Tensor  # [C, k] int64: entry j is the teacher's top-k for completion token j
    top_logq: torch.Tensor  # [C, k] float32, renormalised over the k


class KLDistill(ReasonMaxxer):
    """KL-LoRA distillation under the run loop: data in :meth:`setup`, one optimizer step per :meth:`train_step`."""

    name = "kl_distill"
    cfg: KLDistillConfig  # type: ignore[assignment]

    def setup(self) -> None:
        """Sample the teacher's rollouts and cache its top-k (or load them), wrap the student in LoRA."""
        ctx, cfg = self.loop.ctx, self.cfg
        if cfg.torch_threads is not None:
            torch.set_num_threads(cfg.torch_threads)
        check_trainable(ctx.policy, self.name)
        student, self.dir = ctx.policy, ctx.run_dir / DATA_DIR
        tok = student.tokenizer
        self.pad_id = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
        teacher, where = self._teacher(student) if not (self.dir / TARGETS).is_file() else (None, None)
        self.policy = teacher if teacher is not None else student  # ReasonMaxxerData samples with self.policy
        self.rollouts, made = self._rollouts()
        cache = self._targets(teacher, _vocab_size(student))
        self.policy = student
        del teacher
        self.rows = [
            _Target([*r.prompt_token_ids, *r.token_ids], len(r.prompt_token_ids), ids.long(), logq.float())
            for r, ids, logq in zip(self.rollouts, cache["ids"], cache["logq"], strict=True)
            if r.token_ids
        ]
        if not self.rows:
            raise ValueError("The teacher's rollouts have no generated token to distil on; raise max_new_tokens.")
        self.loop.cfg = cfg = self.cfg = cfg.for_data(len(self.rows))
        self.batches_per_epoch = math.ceil(len(self.rows) / cfg.batch_size)
        total = sum(p.numel() for p in student.model.parameters())
        self.model = _with_lora(student, cfg, derived_seed(ctx.seed, _LORA), self.name)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = adamw(self.params, lr=cfg.lr, betas=cfg.adam_betas, weight_decay=cfg.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.lr_factor)
        report = self.dir / "report.json"
        before = json.loads(report.read_text()) if report.is_file() else {}  # a resume keeps what it recorded
        trainable = sum(p.numel() for p in self.params)
        self.report = {
            **made, "teacher": before.get("teacher", where), "top_k": cache["k"], "rollouts_trained": len(self.rows),
            "generated_tokens_trained": sum(len(r.ids) - r.prompt_len for r in self.rows), "steps": cfg.steps,
            "trainable_params": trainable, "base_params": total, "lora_param_share": trainable / total,
            "teacher_rollout_accuracy": rollout_accuracy(self.rollouts),
            **{k: v for k, v in before.items() if k in ("adapter", "merged")},
        }  # fmt: skip
        atomic_write_json(report, self.report)
        print(
            f"kl_distill: {len(self.rows)} teacher rollouts ({self.report['generated_tokens_trained']} generated "
            f"tokens), top-{cache['k']} cached; LoRA {trainable} parameters ({100 * trainable / total:.2f} % of "
            f"the base's {total}); {cfg.steps} steps.",
            flush=True,
        )

    def _teacher(self, student: Any) -> tuple[Any, str]:
        """The teacher policy (the run context's ``load_model``), with the student's tokenizer; and what it is."""
        load = self.loop.ctx.load_model
        if load is None:
            raise ValueError(
                "learner=kl_distill needs a run context that can load its teacher (RunContext.load_model); "
                "`lrmgym run` and lrmgym.compose.train give one."
            )
        teacher = load(self.cfg.teacher, "learner.teacher")
        check_same_vocabulary(teacher, student, "learner.teacher", "the policy")
        return teacher, self.cfg.teacher

    @torch.no_grad()
    def _targets(self, teacher: Any, vocab: int) -> dict[str, Any]:
        """The stored top-k cache; made first (one teacher-forced pass over every rollout) if missing."""
        cfg, path = self.cfg, self.dir / TARGETS
        settings = {"teacher": cfg.teacher, "top_k": cfg.top_k, "rollouts": len(self.rollouts)}
        if path.is_file():
            state = torch.load(path, map_location="cpu", weights_only=False)
            _same_settings(path, state["settings"], settings)
        else:
            began, model = time.perf_counter(), teacher.model
            model.eval()
            ids_out, logq_out, k = [], [], min(cfg.top_k, vocab)
            for start in range(0, len(self.rollouts), cfg.score_batch_size):
                chunk = self.rollouts[start : start + cfg.score_batch_size]
                rows = [[*r.prompt_token_ids, *r.token_ids] for r in chunk]
                ids, attention = _pad(rows, self.pad_id, _device(model))
                logits = causal_lm_logits(model, ids, attention)  # [n, T, V]
                if logits.shape[-1] != vocab:
                    raise ValueError(
                        f"learner.teacher scores {logits.shape[-1]} tokens and the policy {vocab}; distillation "
                        "matches next-token distributions id by id, so both need one vocabulary."
                    )
                top_ids, top_logq = teacher_topk(logits, k)
                for i, r in enumerate(chunk):
                    p = len(r.prompt_token_ids)
                    ids_out.append(top_ids[i, p - 1 : len(rows[i]) - 1].to(torch.int32).cpu())
                    logq_out.append(top_logq[i, p - 1 : len(rows[i]) - 1].cpu())
            scoring = sum(len(r.prompt_token_ids) + len(r.token_ids) for r in self.rollouts)
            state = {
                "settings": settings, "k": k, "ids": ids_out, "logq": logq_out, "scoring_tokens": scoring,
                "score_s": time.perf_counter() - began,
            }  # fmt: skip
            atomic_torch_save(state, path)
        self.scoring = {"scoring_tokens": state["scoring_tokens"], "score_s": state["score_s"]}
        return state

    # ------------------------------------------------------------------------------------------ training
    def collate_targets(self, rows: list[_Target]) -> tuple[torch.Tensor, ...]:
        """``ids, attention [n, T]``, the teacher's ``top_ids, top_logq [n, T-1, k]`` and ``mask [n, T-1]``.

        Entry ``t`` predicts token ``t + 1``; ``mask`` is on at the generated tokens' prediction positions only.
        """
        ids, attention = _pad([r.ids for r in rows], self.pad_id, _device(self.model))
        width, k = ids.shape[1] - 1, rows[0].top_ids.shape[-1]
        top_ids = torch.zeros(len(rows), width, k, dtype=torch.long)
        top_logq = torch.zeros(len(rows), width, k, dtype=torch.float32)
        mask = torch.zeros(len(rows), width, dtype=torch.bool)
        for i, r in enumerate(rows):
            first, end = r.prompt_len - 1, len(r.ids) - 1
            top_ids[i, first:end], top_logq[i, first:end], mask[i, first:end] = r.top_ids, r.top_logq, True
        device = ids.device
        return ids, attention, top_ids.to(device), top_logq.to(device), mask.to(device)

    def train_step(self) -> StepResult:
        """One optimizer step: the mean KL over the batch's generated tokens, in micro-batches."""
        cfg, step, start = self.cfg, self.loop.step, time.perf_counter()
        batch = [self.rows[i] for i in self.batch(step)]
        generated = sum(len(r.ids) - r.prompt_len for r in batch)
        loss, forward = 0.0, 0
        self.optimizer.zero_grad(set_to_none=True)
        self.model.train()
        for first in range(0, len(batch), cfg.micro_batch_size):
            ids, attention, top_ids, top_logq, mask = self.collate_targets(batch[first : first + cfg.micro_batch_size])
            logits = causal_lm_logits(self.model, ids, attention)
            kl = forward_kl_topk(logits[:, :-1], top_ids, top_logq, mask)  # [n, T-1]
            part = kl.sum() / generated  # this micro-batch's share of the step's mean over generated tokens
            part.backward()
            loss += float(part.detach())
            forward += int(attention.sum())
        grad_norm, lr = self._optimizer_step(cfg.max_grad_norm)
        train_s = time.perf_counter() - start
        metrics: dict[str, Any] = {
            "loss": loss, "loss/kl_teacher": loss, "kl_ref": loss,
            "length/mean": generated / len(batch), "grad_norm": grad_norm, "lr": lr,
            "epoch": (step + 1) / self.batches_per_epoch, "compute/forward_tokens": forward,
            "compute/backward_tokens": forward, "tokens_per_s": forward / train_s, "time/train_s": train_s,
        }  # fmt: skip
        if step == 0:  # the data's cost, once: the first step's line carries it
            metrics["generations"] = self.report["rollouts"] if self.report["source"] == "sampled" else 0
            metrics["compute/generated_tokens"] = self.report.get("generated_tokens", 0)
            metrics["compute/scoring_tokens"] = self.scoring["scoring_tokens"]
            metrics["time/sample_s"] = self.report.get("sample_s", 0.0)
            metrics["time/score_s"] = self.scoring["score_s"]
            metrics["data/rollouts_trained"] = len(self.rows)
            metrics["data/lora_param_share"] = self.report["lora_param_share"]
        return StepResult(metrics)

    def postfix(self, metrics: dict[str, Any]) -> dict[str, str]:
        """KL to the teacher, learning rate and epoch."""
        return {"kl": f"{metrics['loss']:.4f}", "lr": f"{metrics['lr']:.1e}", "epoch": f"{metrics['epoch']:.2f}"}


def rollout_accuracy(rollouts: list[Any]) -> float | None:
    """Share of ``rollouts`` graded correct (None when none is graded)."""
    graded = [bool(r.correct) for r in rollouts if r.correct is not None]
    return float(np.mean(graded)) if graded else None
