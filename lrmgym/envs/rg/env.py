"""``lrmgym/ReasoningGym-v0`` (``env=rg``): reasoning-gym's procedural tasks under lrmgym's answer rules and bounds.

reasoning-gym generates the task and its own ``score_answer`` grades it; lrmgym adds what a reward for RL needs
on top (see :class:`RGEnv`): one answer in the requested format, size bounds, a hard wall-clock and memory bound
on the scorer in a killable worker process, no code execution from the answer, a finite score in [0, 1], and by
default a binary reward (reasoning-gym's partial credit pays for the gold quoted inside prose).
"""

from __future__ import annotations

import difflib
import hashlib
import math
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from lrmgym.core import Completion, Component, Task, TextEnv, Verdict
from lrmgym.envs.math.extract import extract_answer
from lrmgym.envs.math.loaders import hash_split
from lrmgym.envs.math.templates import render_prompt
from lrmgym.envs.math.verify import VerifierPool
from lrmgym.envs.rg import tasks as rg_tasks
from lrmgym.envs.rg.rules import rule_reason

__all__ = ["RGConfig", "RGEnv", "rg_pool"]

MAX_DRAWS = 1000
"""How many item seeds one task may try before its split is declared empty (the test split keeps ~test_fraction)."""
MAX_GENERATOR_FAILURES = 20
"""A generator that raises on this many item seeds in a row (reasoning-gym's countdown gives up on some) is broken."""
_WORKER_SCRIPT = Path(__file__).with_name("_worker.py")
_ITEM_SEEDS = 2**31 - 1


class RGConfig(BaseModel):
    """Options of the reasoning-gym env. Any other key (``env.min_numbers=3``) is a knob of the task's generator."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)

    task: str | list[str] = "basic_arithmetic"
    """The reasoning-gym generator ('countdown', 'basic_arithmetic', ...), or a list of them mixed per task."""
    weights: list[float] | None = None
    """With a list of tasks: their sampling weights (default: equal)."""
    config: dict[str, Any] = Field(default_factory=dict)
    """The generator's config knobs ({'min_numbers': 3}); with a list of tasks, one mapping per task name."""
    level: int | dict[str, int] | None = None
    """A curriculum level of reasoning-gym's difficulty attributes (0 = easiest) for all of them, or one per
    attribute ({numbers: 2, target: 0}; the others stay at 0); None keeps the generator's defaults. Explicit knobs
    in config override the level's values."""
    level_every: int | None = Field(None, ge=1)
    """With level: raise the level by one every this many tasks of the stream, up to the task's last level (a
    training run's task index is step x prompts_per_step + i, so level_every = prompts_per_step x steps per level)."""
    level_mode: Literal["inclusive", "upper_bound"] = "inclusive"
    """How a level becomes a range: 'inclusive' (values of levels 0..L, reasoning-gym's default) or 'upper_bound'
    (only the top of the range)."""
    split: Literal["train", "test"] = "train"
    """'train' or 'test': an item is in the test split when the SHA-256 of its question falls in test_fraction, so
    the splits never share a question."""
    test_fraction: float = Field(0.1, ge=0.01, le=0.99)
    """The share of items (by question hash) held out as the test split."""
    template: Literal["plain", "boxed", "r1"] = "r1"
    """Answer format asked for and checked strictly: 'r1' (<think>…</think><answer>…</answer>), 'boxed' or 'plain'."""
    style: Literal["compact", "instruct"] = "instruct"
    """'instruct' (question + format instruction) or 'compact' ('Q:... A:', for the tiny model)."""
    chat: bool = False
    """Give prompts as chat messages ([{'role': 'user', ...}]) instead of raw text."""
    reward: Literal["binary", "graded"] = "binary"
    """'binary': 1.0 when reasoning-gym's scorer gives full marks, else 0.0; 'graded': its score in [0, 1] as is
    (its partial credit pays a fraction for the gold answer quoted inside other text)."""
    timeout_s: float = Field(5.0, gt=0, le=60)
    """Hard wall-clock bound of one scoring call, in seconds (the worker is killed past it; the answer scores 0)."""
    max_answer_chars: int = Field(16_384, ge=1, le=100_000)
    """Extracted answers longer than this score 0 without being scored."""

    @model_validator(mode="after")
    def _check_tasks(self) -> RGConfig:
        names = [self.task] if isinstance(self.task, str) else list(self.task)
        if not names:
            raise ValueError("task is an empty list; name at least one reasoning-gym task, e.g. task=countdown")
        resolved = [rg_tasks.resolve_name(n) for n in names]
        if len(set(resolved)) != len(resolved):
            raise ValueError(f"task lists {names} with repeats; give each task once and use weights")
        if self.weights is not None:
            if isinstance(self.task, str) or len(self.weights) != len(names):
                raise ValueError(f"weights={self.weights} needs one weight per task of a task list, got tasks {names}")
            if any(not math.isfinite(w) or w < 0 for w in self.weights) or sum(self.weights) <= 0:
                raise ValueError(f"weights={self.weights} must be finite, non-negative and not all 0")
        levels = self.level.values() if isinstance(self.level, dict) else [self.level]
        if any(v is not None and v < 0 for v in levels):
            raise ValueError(f"level={self.level} must be non-negative (0 is the easiest level)")
        if self.level_every is not None and self.level is None:
            raise ValueError(f"level_every={self.level_every} needs a starting level; set level=0")
        extra = dict(self.model_extra or {})
        if extra and not isinstance(self.task, str):
            raise ValueError(
                f"knobs {sorted(extra)} given for a task list; put them under config.<task> (config={{task: {{...}}}})"
            )
        if isinstance(self.task, str):
            knobs = rg_tasks.config_fields(resolved[0])
            for key in extra:
                if key not in knobs:
                    close = difflib.get_close_matches(key, [*type(self).model_fields, *knobs], n=2, cutoff=0.6)
                    hint = f" Did you mean {', '.join(close)}?" if close else ""
                    raise ValueError(
                        f"{key!r} is neither an option of env=rg nor a knob of reasoning-gym task "
                        f"{resolved[0]!r}.{hint} Its knobs: {', '.join(knobs)}."
                    )
        else:
            unknown = sorted(set(self.config) - set(names))
            if unknown:
                raise ValueError(f"config keys {unknown} are not in the task list {names}; key config by task name")
        for name in names:
            rg_tasks.resolve_config(name, self.overrides(name), self.level, self.level_mode)
        return self

    @property
    def names(self) -> list[str]:
        """The task names as a list."""
        return [self.task] if isinstance(self.task, str) else list(self.task)

    def overrides(self, name: str) -> dict[str, Any]:
        """The explicit knobs of task ``name``: ``config`` (or ``config[name]``) plus ``env.<knob>`` keys."""
        if isinstance(self.task, str):
            return {**self.config, **(self.model_extra or {})}
        return dict(self.config.get(name) or {})


_POOL: VerifierPool | None = None
_POOL_LOCK = threading.Lock()


def rg_pool() -> VerifierPool:
    """The process's pool of reasoning-gym scoring workers (started lazily; ``$LRMGYM_RG_WORKERS``, default 2)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL._closed or _POOL._pid != os.getpid():
            raw = os.environ.get("LRMGYM_RG_WORKERS", "")
            size = int(raw) if raw.isdigit() and int(raw) > 0 else max(1, min(2, os.cpu_count() or 1))
            _POOL = VerifierPool(size, worker_script=_WORKER_SCRIPT)
        return _POOL


class RGEnv(TextEnv):
    """reasoning-gym's 100+ procedural tasks, each graded by its own scorer under lrmgym's bounds and answer rules.

    ``task`` names the generator (``env.task=countdown``); its knobs are ``env.config={...}`` or ``env.<knob>=``;
    ``level`` (and ``level_every`` for a schedule) picks reasoning-gym's curriculum levels. Task ``index`` of a
    stream is a pure function of ``(seed, index)``: an item seed drawn from the task's generator, redrawn until
    the question's hash falls in the split. Grading:

    1. Exactly one answer in the requested format (strict, as in the math env), at most ``max_answer_chars``.
    2. reasoning-gym's ``score_answer`` on it in a worker process (killed at ``timeout_s``, 2 GiB address
       space), where an audit hook refuses any code the scorer would compile from the answer (several scorers
       ``eval`` it) and any process, socket or file-writing event.
    3. The task's extra rule, where reasoning-gym's scorer pays for forbidden answers (:mod:`.rules`).
    4. A non-number, non-finite or out-of-[0, 1] score, a refusal, a timeout or a crash scores 0 with the
       reason; only our own failures (the worker cannot start, the task does not rebuild) are ungradeable.
    5. ``reward='binary'`` (default) pays 1.0 for full marks only.
    """

    Config = RGConfig

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config: RGConfig
        names = self.config.names
        weights = np.asarray(self.config.weights or [1.0] * len(names), dtype=float)
        self._names, self._p = names, weights / weights.sum()

    # ---- tasks
    def level_at(self, name: str, index: int) -> int | dict[str, int] | None:
        """The curriculum level of task ``index``: ``level + index // level_every``, capped at the last level.

        With one level per attribute, each rises by the same step, capped at that attribute's last level.
        """
        cfg = self.config
        if cfg.level is None:
            return None
        step = index // cfg.level_every if cfg.level_every else 0
        if isinstance(cfg.level, dict):
            tops = rg_tasks.attribute_levels(name)
            return {a: min(v + step, tops.get(a, v)) for a, v in cfg.level.items()}
        return min(cfg.level + step, rg_tasks.max_level(name))

    def make_task(self, index: int, rng: np.random.Generator) -> Task:
        """Task ``index``: a generator (by weight), its level, then the first item seed whose question is in split."""
        cfg = self.config
        name = self._names[int(rng.choice(len(self._names), p=self._p))] if len(self._names) > 1 else self._names[0]
        level = self.level_at(name, index)
        spec = rg_tasks.config_spec(cfg.overrides(name), level, cfg.level_mode)
        failures = 0
        for _ in range(MAX_DRAWS):
            item_seed = int(rng.integers(_ITEM_SEEDS))
            try:
                _, entry = rg_tasks.make_entry(name, spec, item_seed)
            except rg_tasks.RGError:
                raise
            except Exception as err:  # noqa: BLE001 - some generators give up on some seeds: draw another
                failures += 1
                if failures >= MAX_GENERATOR_FAILURES:
                    raise ValueError(
                        f"reasoning-gym task {name!r} failed to generate {failures} items in a row with its config "
                        f"(last: {type(err).__name__}: {err}); ease its config or level."[:400]
                    ) from None
                continue
            question = str(entry["question"])
            if hash_split(question, cfg.test_fraction) == cfg.split:
                break
        else:
            raise ValueError(
                f"reasoning-gym task {name!r} drew no {cfg.split!r} item in {MAX_DRAWS} tries: its question space is "
                f"too small for test_fraction={cfg.test_fraction}; widen its config or change test_fraction."
            )
        digest = hashlib.sha256(question.encode()).hexdigest()
        answer = entry.get("answer")
        return Task(
            id=f"rg/{name}/{cfg.split}/{digest[:12]}",
            prompt=render_prompt(question, template=cfg.template, style=cfg.style, chat=cfg.chat),
            answer=None if answer is None else str(answer),
            metadata={
                "source": "reasoning_gym",
                "rg_task": name,
                "rg_config": spec,
                "rg_seed": item_seed,
                "question_sha": digest,
                "question": question,
                "split": cfg.split,
                "difficulty": max(level.values(), default=0) if isinstance(level, dict) else level,
                "rg_level": level,
                "template": cfg.template,
                "index": index,
                "rg_metadata": entry.get("metadata", {}),
            },
        )

    # ---- grading
    def score_request(self, task: Task, answer: str) -> dict[str, Any]:
        """The worker request that scores ``answer`` for ``task`` (tests add their hooks here)."""
        meta = task.metadata
        return {
            "task": meta["rg_task"],
            "config": meta["rg_config"],
            "seed": int(meta["rg_seed"]),
            "question_sha": meta["question_sha"],
            "answer": answer,
            "budget": 0.8 * self.config.timeout_s,
            # the item as the task carries it, for the few generators whose items depend on the hash seed
            "entry": {"question": meta.get("question"), "answer": task.answer, "metadata": meta.get("rg_metadata")},
        }

    def verify(self, task: Task, completion: Completion) -> Verdict:
        """Extract one answer, bound it, score it with reasoning-gym's scorer in a worker; never raises."""
        meta = task.metadata
        if not all(k in meta for k in ("rg_task", "rg_config", "rg_seed", "question_sha")):
            return Verdict.ungradeable(f"task {task.id!r} is not a reasoning-gym task (no rg_task/rg_seed metadata)")
        template = meta.get("template", self.config.template)
        extracted = extract_answer(Completion.coerce(completion).text, template, strict=True, raw=True)
        if extracted.answer is None:
            return _verdict(0.0, None, extracted.reason, format_ok=False)
        answer = extracted.answer
        limit = self.config.max_answer_chars
        if len(answer) > limit:
            return _verdict(0.0, answer, f"answer too long: {len(answer)} characters, the limit is {limit}")
        refused = rule_reason(meta["rg_task"], answer, task)
        if refused is not None:
            return _verdict(0.0, answer, f"incorrect: lrmgym's rule for {meta['rg_task']}: {refused}")
        try:
            reply = rg_pool().send(self.score_request(task, answer), self.config.timeout_s)
        except (RuntimeError, OSError) as err:
            return Verdict.ungradeable(f"reasoning-gym scorer unavailable: {err}"[:300])
        return _judge(reply, answer, self.config)

    def score_group(self, task: Task, completions: Sequence[Completion | str]) -> list[Verdict]:
        """Grade G completions of one task; the scoring calls run in parallel on the worker pool."""
        completions = [Completion.coerce(c) for c in completions]
        if len(completions) <= 1:
            return [self.verify(task, c) for c in completions]
        with ThreadPoolExecutor(max_workers=rg_pool().size, thread_name_prefix="lrmgym-rg") as executor:
            return list(executor.map(lambda c: self.verify(task, c), completions))


def _judge(reply: dict[str, Any], answer: str, cfg: RGConfig) -> Verdict:
    """The verdict for a worker's reply (see :class:`RGEnv` for the rules)."""
    status = reply.get("status")
    if status == "stale":
        return Verdict.ungradeable(f"reasoning-gym: {reply.get('reason', 'the task does not rebuild')}")
    if status == "hard_timeout":
        return _verdict(0.0, answer, f"incorrect: the answer exhausted the scorer's {cfg.timeout_s:g} s bound")
    if status == "crashed":
        return _verdict(0.0, answer, "incorrect: the answer crashed the scorer (memory or a fault)")
    if status != "ok":
        return _verdict(0.0, answer, f"incorrect: {status}: {str(reply.get('reason', ''))[:200]}")
    value = reply.get("score")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return _verdict(0.0, answer, f"incorrect: the scorer returned {value!r}, not a finite number")
    if not 0.0 <= value <= 1.0:
        return _verdict(0.0, answer, f"incorrect: the scorer returned {value!r}, outside [0, 1]")
    full = value >= 1.0
    score = (1.0 if full else 0.0) if cfg.reward == "binary" else float(value)
    reason = "correct" if full else f"incorrect: reasoning-gym scored {value:.3g}"
    return Verdict(
        score=score,
        correct=full,
        parsed=answer[:200],
        reason=reason,
        components=(Component("accuracy", score, reason=reason),),
        format_ok=True,
    )


def _verdict(score: float, parsed: str | None, reason: str, format_ok: bool = True) -> Verdict:
    return Verdict(
        score=score,
        correct=False,
        parsed=None if parsed is None else parsed[:200],
        reason=reason,
        components=(Component("format" if not format_ok else "accuracy", score, reason=reason),),
        format_ok=format_ok,
    )
