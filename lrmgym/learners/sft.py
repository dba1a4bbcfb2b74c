"""Supervised fine-tuning with a masked cross-entropy, and the build of the tiny default model on it.

One implementation of "train on (prompt, target) pairs, the loss on the target tokens (and EOS) only" for
every place that needs it: ``lrmgym tiny build`` trains the embedded model on the math env's worked solutions
(:func:`build_tiny`), and Ring-Zero's self-distillation stage trains a base model on its shortest correct
traces (:func:`train_masked_ce`, with its own recipe).

The tiny model's *shape* (tokenizer, architecture, cache key, loading) is :mod:`lrmgym.policies.tiny`; this
module is what trains it, since training reads an env's tasks and a policy never imports an env.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from lrmgym.policies.tiny import (
    TinyPolicyConfig,
    TinyTrainConfig,
    _auto_threads,
    _loadavg,
    build_model,
    build_tokenizer,
)

__all__ = ["build_tiny", "env_examples", "masked_ce_batches", "train_masked_ce"]


def _lr_factor(step: int, cfg: TinyTrainConfig) -> float:
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


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


def masked_ce_batches(pairs: list[tuple[str, str]], tokenizer: Any, batch_size: int) -> Iterator[tuple[Any, Any]]:
    """Right-padded ``input_ids`` ``[B, T]`` and ``labels`` ``[B, T]`` (-100 on the prompt and padding)."""
    import torch

    prompts = tokenizer([p for p, _ in pairs], add_special_tokens=False)["input_ids"]
    targets = tokenizer([t for _, t in pairs], add_special_tokens=False)["input_ids"]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    for start in range(0, len(pairs), batch_size):
        chunk = slice(start, start + batch_size)
        rows = [(p, t + [eos]) for p, t in zip(prompts[chunk], targets[chunk], strict=True)]
        width = max(len(p) + len(t) for p, t in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        for r, (p, t) in enumerate(rows):
            ids[r, : len(p) + len(t)] = torch.tensor(p + t)
            labels[r, len(p) : len(p) + len(t)] = torch.tensor(t)
        yield ids, labels


def train_masked_ce(
    model: Any, tokenizer: Any, cfg: TinyTrainConfig, pairs: list[tuple[str, str]], progress: bool = True
) -> dict[str, Any]:
    """Supervised training on (prompt, solution) pairs; the loss covers the solution and EOS only.

    Returns:
        Measured facts: seconds, tokens/s, first and final loss (mean over the last 20 steps).
    """
    import torch
    import torch.nn.functional as F
    from tqdm.auto import tqdm

    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, cfg))
    model.train()
    losses, tokens, start = [], 0, time.perf_counter()
    bar = tqdm(total=cfg.steps, desc="training tiny model", unit="step", disable=not progress)
    for ids, labels in masked_ce_batches(pairs, tokenizer, cfg.batch_size):
        attention = (ids != tokenizer.pad_token_id).long()
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]  # [B, T-1, V]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        tokens += int(attention.sum())
        bar.update(1)
        bar.set_postfix(loss=f"{losses[-1]:.3f}", tok_s=f"{tokens / (time.perf_counter() - start):.0f}")
    bar.close()
    model.eval()
    seconds = time.perf_counter() - start
    return {"train_s": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds, "first_loss": losses[0],
            "final_loss": float(sum(losses[-20:]) / len(losses[-20:]))}  # fmt: skip


def build_tiny(
    cfg: TinyPolicyConfig,
    force: bool = False,
    progress: bool = True,
    examples: Callable[[TinyTrainConfig, int], list[tuple[str, str]]] | None = None,
) -> Path:
    """Build, train and cache the tiny model for ``cfg``; returns its folder.

    The model is written to a temporary folder beside the cache entry and renamed into place, so a crash or a
    concurrent build never leaves a half-written model. An existing entry is kept unless ``force``.

    Args:
        cfg: The tiny model's config.
        force: Rebuild even when cached.
        progress: Show a progress bar.
        examples: Where (prompt, solution) pairs come from (tests swap in a small source).
    """
    import torch

    folder = cfg.cache_dir()
    if (folder / "build.json").is_file() and not force:
        return folder
    start, cpu_start, load_before = time.perf_counter(), time.process_time(), _loadavg()
    threads_before = torch.get_num_threads()
    threads = cfg.threads or _auto_threads(load_before)
    torch.set_num_threads(threads)
    try:
        pairs = (examples or env_examples)(cfg.train, cfg.train.steps * cfg.train.batch_size)
        data_s = time.perf_counter() - start
        tokenizer = build_tokenizer()
        model = build_model(cfg.arch, len(tokenizer), cfg.seed)
        facts = train_masked_ce(model, tokenizer, cfg.train, pairs, progress=progress)
    finally:
        torch.set_num_threads(threads_before)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        _portable_tokenizer_config(tmp / "tokenizer_config.json")
        facts.update(
            key=cfg.key(), config=cfg.model_dump(mode="json", exclude={"path", "device", "batch_size"}),
            params=sum(p.numel() for p in model.parameters()), weight_bytes=(tmp / "model.safetensors").stat().st_size,
            data_s=data_s, build_s=time.perf_counter() - start, cpu_s=time.process_time() - cpu_start, threads=threads,
            torch=torch.__version__, loadavg_before=load_before, loadavg_after=_loadavg(), cpus=os.cpu_count(),
        )  # fmt: skip
        (tmp / "build.json").write_text(json.dumps(facts, indent=2) + "\n")
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _portable_tokenizer_config(path: Path) -> None:
    """Name the tokenizer class ``PreTrainedTokenizerFast``, which transformers 4.x and 5.x (and so vLLM) know.

    transformers 5 writes its new ``TokenizersBackend`` name, which older installs cannot resolve.
    """
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(config, indent=2) + "\n")
