"""ReasonMaxxer's data: the base model's judged rollouts, their selection and the base entropies, stored.

:class:`ReasonMaxxerData` is the half of :class:`~lrmgym.learners.algorithms.reason_maxxer.ReasonMaxxer` that
makes (or, on resume, loads) ``run_dir/reason_maxxer/``: the rollouts (sampled ``sample_chunk`` problems at a
time, each chunk saved, or copied from ``rollouts_from``), the selection and tau, and the teacher-forced
entropies of the frozen base. Files made with other options are refused, never silently reused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import torch

from lrmgym.core import learner_env
from lrmgym.episodes import rollout
from lrmgym.learners.algorithms.logprobs import token_entropy
from lrmgym.learners.algorithms.reason_maxxer_config import ReasonMaxxerConfig
from lrmgym.learners.algorithms.reason_maxxer_select import Selection, calibrate_tau, select_rollouts
from lrmgym.learners.engine.common import derived_seed
from lrmgym.learners.engine.loop import Algorithm
from lrmgym.learners.engine.onpolicy import _TRAIN_STREAM
from lrmgym.learners.engine.rundir import atomic_torch_save, atomic_write_json
from lrmgym.learners.engine.traces import JudgedRollout, read_rollouts, write_rollouts
from lrmgym.policies.base import SamplingParams
from lrmgym.policies.fasttrain import causal_lm_logits

__all__ = ["ReasonMaxxerData"]

_ROLLOUTS = 0x726F  # seed tag: "ro", the rollouts' sampling


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


class ReasonMaxxerData(Algorithm):
    """The data half of ReasonMaxxer: make or load the stored rollouts, selection and base entropies.

    Its subclass sets ``cfg``, ``policy``, ``dir`` (the data folder) and ``pad_id`` before calling these.
    """

    cfg: ReasonMaxxerConfig
    policy: Any
    dir: Path
    pad_id: int
    rollouts: list[JudgedRollout]
    scoring: dict[str, Any]

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
