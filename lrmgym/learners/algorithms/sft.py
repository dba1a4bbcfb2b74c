"""Supervised fine-tuning with a masked cross-entropy, and the build of the tiny default model on it.

One implementation of "train on (prompt, target) pairs, the loss on the target tokens (and EOS) only" for
every place that needs it: :class:`MaskedCE` is the optimizer step (AdamW, clipped gradient, a per-step
learning-rate schedule) over the batches :func:`masked_ce_id_batches` makes. ``lrmgym tiny build`` loops it over
the math env's worked solutions (:func:`train_masked_ce`, :func:`build_tiny`), and Ring-Zero's
self-distillation stage (:mod:`lrmgym.learners.algorithms.distill`) steps it under the run loop on a base model's
shortest correct traces.

The tiny model's *shape* (tokenizer, architecture, cache key, loading) is :mod:`lrmgym.policies.tiny`; this
module is what trains it, since training reads an env's tasks and a policy never imports an env.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from lrmgym.files import replaced_dir
from lrmgym.policies.tiny import (
    TinyPolicyConfig,
    TinyTrainConfig,
    _auto_threads,
    _loadavg,
    build_model,
    build_tokenizer,
)

__all__ = [
    "MaskedCE",
    "build_tiny",
    "collate_masked_ce",
    "cosine_lr_factor",
    "env_examples",
    "masked_ce_batches",
    "masked_ce_id_batches",
    "train_masked_ce",
    "with_eos",
]

IdPairs = Sequence[tuple[Sequence[int], Sequence[int]]]
"""(prompt token ids, target token ids) pairs."""

IGNORE = -100
"""The label of a position the loss skips (prompt and padding), as ``torch.nn.functional.cross_entropy`` reads it."""


def cosine_lr_factor(step: int, steps: int, warmup: int, min_ratio: float) -> float:
    """Multiplier of the peak learning rate for the update after ``step`` updates.

    Linear warm-up over ``warmup`` updates, then a cosine from 1 down to ``min_ratio`` at update ``steps``.
    """
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def _lr_factor(step: int, cfg: TinyTrainConfig) -> float:
    return cosine_lr_factor(step, cfg.steps, cfg.warmup, 0.1)


def env_examples(cfg: TinyTrainConfig, count: int) -> list[tuple[str, str]]:
    """``count`` (prompt, worked solution) pairs from the env's train stream ``cfg.data_seed``.

    Raises:
        ValueError: if the env's tasks carry no ``metadata["solution"]`` or have chat prompts.
    """
    import numpy as np

    from lrmgym.registry import make

    env = make(cfg.env, **cfg.env_options).unwrapped
    retries = np.random.default_rng([cfg.data_seed, 0x7279])  # "ry": which examples are second attempts
    pairs = []
    for index in range(count):
        task = env.task_at(index, seed=cfg.data_seed)
        solution = task.metadata.get("solution")
        if not isinstance(solution, str) or not isinstance(task.prompt, str):
            raise ValueError(
                f"Task {task.id!r} of {cfg.env} has no text prompt with a metadata['solution'] string; the tiny "
                "model is trained on worked solutions. Use an env whose tasks carry them (lrmgym/Math-v0)."
            )
        prompt = task.prompt
        if retries.random() < cfg.retry_share:
            prompt += _second_attempt_prefix(env, task, solution, int(retries.integers(1, 10)))
        pairs.append((prompt, solution))
    return pairs


def _second_attempt_prefix(env: Any, task: Any, solution: str, delta: int) -> str:
    """A wrong first attempt (the solution with its final result off by ``delta``) and the env's feedback to it.

    Returns ``""`` when the solution has no final number to change or the env gives no feedback.
    """
    from lrmgym.core import Completion

    answer = str(task.answer)
    if not re.fullmatch(r"-?\d+", answer):
        return ""
    wrong_answer = str(int(answer) + delta)
    # The last "=<answer>" of the working and the answer tag carry the final result: change both.
    wrong = re.sub(rf"={re.escape(answer)}(?=</think>)", f"={wrong_answer}", solution, count=1)
    wrong = wrong.replace(f"<answer>{answer}</answer>", f"<answer>{wrong_answer}</answer>")
    if wrong == solution:
        return ""
    completion = Completion(text=wrong)
    verdict = env.verify(task, completion)
    feedback = env.feedback(task, completion, verdict, 1) if verdict.correct is False else None
    return wrong + feedback if isinstance(feedback, str) else ""


def with_eos(target_ids: Sequence[int], eos_id: int) -> list[int]:
    """``target_ids`` ending in EOS: appended unless the last id already is EOS (a sampled completion's usually is)."""
    target = list(target_ids)
    return target if target and target[-1] == eos_id else [*target, eos_id]


def collate_masked_ce(pairs: IdPairs, pad_id: int, eos_id: int) -> tuple[Any, Any]:
    """One batch of (prompt ids, target ids) pairs: right-padded ``input_ids`` ``[B, T]`` and ``labels`` ``[B, T]``.

    Each row is the prompt, the target and EOS (:func:`with_eos`); ``labels`` hold the target and EOS and
    :data:`IGNORE` (-100) on the prompt and the padding, so the loss covers what the model must learn to write.
    """
    import torch

    rows = [(list(p), with_eos(t, eos_id)) for p, t in pairs]
    width = max(len(p) + len(t) for p, t in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    for r, (p, t) in enumerate(rows):
        ids[r, : len(p) + len(t)] = torch.tensor(p + t)
        labels[r, len(p) : len(p) + len(t)] = torch.tensor(t)
    return ids, labels


def masked_ce_id_batches(pairs: IdPairs, pad_id: int, eos_id: int, batch_size: int) -> Iterator[tuple[Any, Any]]:
    """:func:`collate_masked_ce` of consecutive chunks of ``batch_size`` pairs, in order (the last may be smaller)."""
    for start in range(0, len(pairs), batch_size):
        yield collate_masked_ce(pairs[start : start + batch_size], pad_id, eos_id)


def masked_ce_batches(pairs: list[tuple[str, str]], tokenizer: Any, batch_size: int) -> Iterator[tuple[Any, Any]]:
    """Right-padded ``input_ids`` ``[B, T]`` and ``labels`` ``[B, T]`` (-100 on the prompt and padding) of text pairs.

    The texts are tokenized without special tokens; then as :func:`masked_ce_id_batches`.
    """
    prompts = tokenizer([p for p, _ in pairs], add_special_tokens=False)["input_ids"]
    targets = tokenizer([t for _, t in pairs], add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    yield from masked_ce_id_batches(list(zip(prompts, targets, strict=True)), pad, eos, batch_size)


class MaskedCE:
    """The optimizer step of masked cross-entropy training: one batch, one AdamW update, one schedule step.

    The loss is the mean cross-entropy over the batch's labelled positions (the targets and their EOS). Each
    :meth:`step` runs the model in train mode and leaves it in eval mode, so whoever samples or evaluates
    between steps sees the eval-mode model. Where a batch's logits would exceed
    :data:`~lrmgym.policies.fasttrain.LOGIT_CHUNK` elements (long rows, large vocabularies), the loss comes from
    log-probs computed with the head in chunks (:func:`~lrmgym.policies.fasttrain.causal_lm_logprobs`), so no
    ``[B, T, V]`` logits are made: 310 against 1 140 MB peak for one 2 048-token row at a 32k vocabulary
    (``benchmarks/results/memory_real.md``).

    Args:
        model: A causal LM (``model(input_ids=..., attention_mask=...).logits``); its trainable parameters
            (``requires_grad``) are optimised.
        lr: Peak AdamW learning rate.
        lr_factor: Multiplier of ``lr`` for the update after ``s`` updates (a ``LambdaLR`` lambda), e.g. a
            :func:`cosine_lr_factor` partial.
        betas: AdamW betas.
        weight_decay: AdamW weight decay.
        max_grad_norm: Clip the gradient's global norm to this; ``None``: no clipping (the norm is still reported).
        fused: Use torch's fused AdamW kernel where there is one (:func:`lrmgym.learners.engine.common.adamw`). Its
            updates differ from the per-tensor loop's in the last bits, so the tiny build keeps the loop.
    """

    def __init__(
        self,
        model: Any,
        lr: float,
        lr_factor: Callable[[int], float],
        betas: tuple[float, float] = (0.9, 0.95),
        weight_decay: float = 0.0,
        max_grad_norm: float | None = 1.0,
        fused: bool = False,
    ) -> None:
        import torch

        from lrmgym.learners.engine.common import adamw

        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("The model has no trainable parameters (all requires_grad=False); nothing to train.")
        self.max_grad_norm = max_grad_norm
        self.device = self.params[0].device
        make = adamw if fused else torch.optim.AdamW
        self.optimizer = make(self.params, lr=lr, betas=betas, weight_decay=weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_factor)

    def step(self, input_ids: Any, labels: Any) -> dict[str, float]:
        """One update on a batch from :func:`collate_masked_ce` (``[B, T]`` each, right-padded).

        Returns:
            ``loss`` (the batch's mean over labelled positions, before the update), ``tokens`` (prompt and target
            tokens, padding excluded), ``target_tokens`` (labelled ones), ``grad_norm`` (before clipping) and
            ``lr`` (the rate this update used).
        """
        import torch
        import torch.nn.functional as F

        from lrmgym.policies.fasttrain import causal_lm_logits, causal_lm_logprobs

        ids, labels = input_ids.to(self.device), labels.to(self.device)
        attention = _attention_mask(labels)
        self.model.train()
        labelled = labels[:, 1:] != IGNORE
        # Long rows: log-probs with the head in chunks, never [B, T, V] logits (the same loss); else whole logits.
        logp = causal_lm_logprobs(self.model, ids, attention, torch.where(labelled, labels[:, 1:], ids[:, 1:]))
        if logp is not None:
            loss = -(logp * labelled).sum() / labelled.sum()
        else:
            logits = causal_lm_logits(self.model, ids, attention)[:, :-1]  # [B, T-1, V]; the lean forward if it applies
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=IGNORE)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        max_norm = self.max_grad_norm if self.max_grad_norm is not None else math.inf  # inf: measure, scale by 1
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
        lr = float(self.optimizer.param_groups[0]["lr"])
        self.optimizer.step()
        self.scheduler.step()
        self.model.eval()
        return {
            "loss": loss.item(),
            "tokens": int(attention.sum()),
            "target_tokens": int((labels != IGNORE).sum()),
            "grad_norm": float(grad_norm),
            "lr": lr,
        }

    def state_dict(self) -> dict[str, Any]:
        """Model, optimizer and schedule state."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])


def _attention_mask(labels: Any) -> Any:
    """``[B, T]`` 1 up to each row's last labelled position, 0 on the right padding.

    Taken from the labels, not from ``ids != pad``: a tokenizer whose pad token is its EOS (common for HF models)
    would otherwise hide the target's own EOS. Every row ends in a labelled EOS (:func:`with_eos`).
    """
    import torch

    positions = torch.arange(labels.shape[1], device=labels.device)
    last = torch.where(labels != IGNORE, positions, -1).amax(dim=1)  # [B]
    return (positions[None, :] <= last[:, None]).long()


def train_masked_ce(
    model: Any, tokenizer: Any, cfg: TinyTrainConfig, pairs: list[tuple[str, str]], progress: bool = True
) -> dict[str, Any]:
    """Supervised training on (prompt, solution) pairs; the loss covers the solution and EOS only.

    One :class:`MaskedCE` step per batch of ``cfg.batch_size`` pairs, in order: AdamW betas (0.9, 0.95), the
    gradient clipped to norm 1, linear warm-up then cosine decay to 10 % of ``cfg.lr``.

    Returns:
        Measured facts: seconds, tokens/s, first and final loss (mean over the last 20 steps).
    """
    from lrmgym.progress import progress_bar

    trainer = MaskedCE(model, cfg.lr, lambda s: _lr_factor(s, cfg), weight_decay=cfg.weight_decay)
    losses, tokens, start = [], 0, time.perf_counter()
    bar = progress_bar(cfg.steps, "training tiny model", "steps", enabled=progress)
    for ids, labels in masked_ce_batches(pairs, tokenizer, cfg.batch_size):
        out = trainer.step(ids, labels)
        losses.append(out["loss"])
        tokens += out["tokens"]
        bar.update(1)
        bar.set_postfix(loss=f"{losses[-1]:.3f}", tok_s=f"{tokens / (time.perf_counter() - start):.0f}")
    bar.close()
    seconds = time.perf_counter() - start
    return {"train_s": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds, "first_loss": losses[0],
            "final_loss": float(sum(losses[-20:]) / len(losses[-20:]))}  # fmt: skip


_NOT_WEIGHTS = {"path", "device", "batch_size", "recipe", "sample_dtype"}
"""Config fields that do not shape the weights, left out of build.json (the recipe's values are in it)."""


def build_tiny(
    cfg: TinyPolicyConfig,
    force: bool = False,
    progress: bool = True,
    examples: Callable[[TinyTrainConfig, int], list[tuple[str, str]]] | None = None,
) -> Path:
    """Build, train and cache the tiny model for ``cfg``; returns its folder.

    The model is written to a temporary folder beside the cache entry and renamed into place
    (:func:`lrmgym.files.replaced_dir`), so a crash or a concurrent build never leaves a half-written model, and a
    forced rebuild that fails keeps the old one. An existing entry is kept unless ``force``.

    Args:
        cfg: The tiny model's config.
        force: Rebuild even when cached.
        progress: Show a progress bar.
        examples: Where (prompt, solution) pairs come from (tests swap in a small source).
    """
    import torch

    from lrmgym.learners.engine.common import intra_op_threads  # torch-importing, like torch here: on first use

    folder = cfg.cache_dir()
    if (folder / "build.json").is_file() and not force:
        return folder
    start, cpu_start, load_before = time.perf_counter(), time.process_time(), _loadavg()
    threads = cfg.threads or _auto_threads(load_before)
    with intra_op_threads(threads):
        pairs = (examples or env_examples)(cfg.train, cfg.train.steps * cfg.train.batch_size)
        if cfg.train.length_batches:
            from lrmgym.policies.tiny_recipes import length_batched

            pairs = length_batched(pairs, cfg.train.batch_size, cfg.train.data_seed)
        data_s = time.perf_counter() - start
        tokenizer = build_tokenizer()
        model = build_model(cfg.arch, len(tokenizer), cfg.seed)
        if cfg.train.init_from is not None:
            from lrmgym.policies.tiny_recipes import load_recipe_weights

            load_recipe_weights(model, cfg.train.init_from)
        facts = train_masked_ce(model, tokenizer, cfg.train, pairs, progress=progress)
    with replaced_dir(folder) as tmp:  # whole or not at all; a forced rebuild keeps the old model until the swap
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        _portable_tokenizer_config(tmp / "tokenizer_config.json")
        facts.update(
            key=cfg.key(), config=cfg.model_dump(mode="json", exclude=_NOT_WEIGHTS),
            params=sum(p.numel() for p in model.parameters()), weight_bytes=(tmp / "model.safetensors").stat().st_size,
            data_s=data_s, build_s=time.perf_counter() - start, cpu_s=time.process_time() - cpu_start, threads=threads,
            torch=torch.__version__, loadavg_before=load_before, loadavg_after=_loadavg(), cpus=os.cpu_count(),
        )  # fmt: skip
        (tmp / "build.json").write_text(json.dumps(facts, indent=2) + "\n")
    return folder


def _portable_tokenizer_config(path: Path) -> None:
    """Name the tokenizer class ``PreTrainedTokenizerFast``, which transformers 4.x and 5.x (and so vLLM) know.

    transformers 5 writes its new ``TokenizersBackend`` name, which older installs cannot resolve.
    """
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(config, indent=2) + "\n")
