"""``lrmgym/Math-v0``: math problems (procedural, GSM8K, MATH-500 or a local file) with a strict, bounded verifier."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lrmgym.core import Completion, Component, Task, TextEnv, Verdict
from lrmgym.envs.math import forms, generator, loaders
from lrmgym.envs.math.extract import extract_answer
from lrmgym.envs.math.templates import INSTRUCTIONS, render_prompt, render_solution
from lrmgym.envs.math.verify import default_pool, verify_answer

__all__ = ["MathConfig", "MathEnv", "task_form"]

_NAMED_SOURCES = ("procedural", "gsm8k", "math500")


class MathConfig(BaseModel):
    """Options of the math env."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    source: str = "procedural"
    """'procedural' (infinite generator), 'gsm8k', 'math500', or a local JSONL/JSON/parquet file or HF dataset
    folder."""
    split: Literal["train", "test"] = "train"
    """'train' or 'test': procedural = a hash partition (1 in 10 is test); gsm8k / math500 = their own split
    files; a local file = the items whose content hash puts them on that side (see test_fraction)."""
    test_fraction: float = Field(0.1, ge=0.0, le=1.0)
    """For a local file source: the share of its items held out as the test split, chosen by the SHA-256 of each
    item's question (whitespace-normalised), never by position, so a held-out item is never trained on and copies
    of a question stay together. 1.0 puts the whole file in 'test' (an evaluation file), 0.0 in 'train'."""
    difficulty: int | list[int] = 1
    """Procedural difficulty level 1-5, or a list of levels drawn uniformly per task (e.g. [1, 2, 3])."""
    template: Literal["plain", "boxed", "r1"] = "r1"
    """Answer format asked for and checked: 'r1' (<think>…</think><answer>…</answer>), 'boxed' or 'plain'."""
    style: Literal["compact", "instruct"] = "instruct"
    """'compact' ('Q:... A:', for the tiny model) or 'instruct' (question + format instruction, for LLMs)."""
    chat: bool = False
    """Give prompts as chat messages ([{'role': 'user', ...}]) instead of raw text."""
    strict: bool = True
    """Require exactly one answer in exactly the requested format; a missing or doubled answer scores 0."""
    max_turns: int = Field(1, ge=1, le=5)
    """Policy turns per episode; 2 gives one retry after the feedback 'your answer X is not correct'."""
    timeout_s: float = Field(2.0, gt=0, le=60)
    """Hard wall-clock bound of one answer check, in seconds; an answer that exhausts it scores 0."""
    max_answer_chars: int = Field(1000, ge=1, le=100_000)
    """Extracted answers longer than this are incorrect without being parsed."""
    question_field: str = "question"
    """For a local file source: the field that holds the question."""
    answer_field: str = "answer"
    """For a local file source: the field that holds the gold answer ('#### x' and boxed answers are unwrapped)."""
    data_dir: str | None = None
    """Folder with gsm8k/ and math500/; default $LRMGYM_DATA_DIR, else $LRMGYM_SHARED_DATA, else ../shared/data."""
    order: Literal["random", "sequential"] = "random"
    """Data sets only: task i is a random item ('random') or item i mod N ('sequential', for evaluation)."""

    @field_validator("difficulty")
    @classmethod
    def _check_levels(cls, value: int | list[int]) -> int | list[int]:
        levels = [value] if isinstance(value, int) else value
        bad = [v for v in levels if v not in generator.LEVELS]
        if not levels or bad:
            raise ValueError(f"difficulty must be a level from 1 to 5 or a non-empty list of them, got {value!r}")
        return value

    @model_validator(mode="after")
    def _check_source(self) -> MathConfig:
        source = Path(self.source).expanduser()
        if self.source not in _NAMED_SOURCES and not source.exists():
            raise ValueError(
                f"source {self.source!r} is neither one of {', '.join(_NAMED_SOURCES)} nor an existing file or "
                "folder; give a named source or the path to a JSONL / parquet / HF dataset"
            )
        if self.source not in _NAMED_SOURCES and not (source.is_file() or source.is_dir()):
            raise ValueError(
                f"source {self.source!r} is not a regular file (a device or pipe such as /dev/null holds no data); "
                "give the path to a JSONL / JSON / parquet file or a HF dataset folder"
            )
        if self.source == "math500" and self.split != "test":
            raise ValueError("source 'math500' has only the 'test' split; set split: test")
        return self

    @property
    def levels(self) -> list[int]:
        """The difficulty levels as a list."""
        return [self.difficulty] if isinstance(self.difficulty, int) else list(self.difficulty)


_DATA_CACHE: dict[tuple, list[loaders.Item]] = {}
_DATA_LOCK = threading.Lock()


def _load_items(config: MathConfig) -> list[loaders.Item]:
    """The data-set items of a non-procedural config (a local file: those of its split), read once per file."""
    if config.source in ("gsm8k", "math500"):
        path = loaders.resolve_builtin(config.source, config.split, config.data_dir)
    else:
        path = Path(config.source).expanduser()
    stat = os.stat(path)
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size, config.source, config.question_field,
           config.answer_field, config.split, config.test_fraction)  # fmt: skip
    with _DATA_LOCK:
        if key not in _DATA_CACHE:
            if config.source == "gsm8k":
                items = loaders.load_gsm8k(path, config.split)
            elif config.source == "math500":
                items = loaders.load_math(path, config.split, source="math500")
            else:
                items = _local_split(path, config)
            if not items:
                raise loaders.DataError(f"{path} holds no items.")
            _DATA_CACHE[key] = items
        return _DATA_CACHE[key]


def _local_split(path: Path, config: MathConfig) -> list[loaders.Item]:
    everything = loaders.load_records(path, config.split, config.question_field, config.answer_field)
    items = [i for i in everything if loaders.hash_split(i.question, config.test_fraction) == config.split]
    if everything and not items:
        other = "raise" if config.split == "test" else "lower"
        raise loaders.DataError(
            f"{path}: none of its {len(everything)} items falls in the {config.split!r} split (test_fraction="
            f"{config.test_fraction} of a content hash); {other} env.test_fraction, or give that split its own "
            f"file (test_fraction=1.0 makes a whole file the test split)."
        )
    return items


def task_form(task: Task) -> tuple[str, str]:
    """``(question, answer form)`` of a math task: the form it declares, else the one its question asks for.

    Generated and data-set tasks declare ``metadata["answer_form"]``; a task built elsewhere (a judge file's
    record, a test) gets :func:`lrmgym.envs.math.forms.infer_form` of its ``metadata["question"]`` (else its
    prompt text) and gold, so a rebuilt task is graded in the same form.
    """
    question = task.metadata.get("question")
    if not isinstance(question, str):
        prompt = task.prompt
        if isinstance(prompt, list):
            prompt = " ".join(str(m.get("content", "")) for m in prompt if isinstance(m, dict))
        question = prompt if isinstance(prompt, str) else ""
    form = task.metadata.get("answer_form")
    if form not in forms.FORMS:
        form = forms.infer_form(question, "" if task.answer is None else str(task.answer))
    return question, form


class MathEnv(TextEnv):
    """Math problems with verifiable answers: procedural (5 levels), GSM8K, MATH-500 or a local file.

    The prompt states the answer format (``template``); the completion must follow it exactly (strict
    extraction), and the extracted answer is checked against the gold one by
    :func:`lrmgym.envs.math.verify.verify_answer`: exact numbers first, then math-verify in killable worker
    processes under a hard ``timeout_s``. Reward 1.0 for a correct answer that states one value, 0.0 for a
    wrong one, a format failure, an answer with several values or a false equation in it, or an answer that
    makes the checker time out, crash or fail; ungradeable (``score=None``) only for our own failures (an
    unparseable reference, no verifier worker). With ``max_turns=2`` a wrong answer gets one retry with
    feedback.

    Procedural tasks carry ``metadata["solution"]``, a short worked solution in the env's template, for
    supervised warm-up (:func:`lrmgym.envs.math.templates.render_solution` renders it in any template).
    """

    Config = MathConfig

    @classmethod
    def preflight(cls, config: MathConfig) -> None:
        """Read a local data file when the config is resolved, so that a bad file stops a run before it starts.

        The items are cached for the env. Named data sets are read only when the env is made.
        """
        if config.source not in _NAMED_SOURCES:
            _load_items(config)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config: MathConfig
        self.max_turns = self.config.max_turns
        self._items = None if self.config.source == "procedural" else _load_items(self.config)

    @property
    def num_items(self) -> int | None:
        """How many distinct items a data-set source has; ``None`` for the infinite generator."""
        return None if self._items is None else len(self._items)

    # ---- tasks
    def make_task(self, index: int, rng: np.random.Generator) -> Task:
        """Task ``index``: a generated problem, or a data-set item (random or ``index mod N``)."""
        if self._items is None:
            return self._procedural_task(index, rng)
        return self._dataset_task(index, rng)

    def _procedural_task(self, index: int, rng: np.random.Generator) -> Task:
        cfg = self.config
        levels = cfg.levels
        level = levels[int(rng.integers(len(levels)))] if len(levels) > 1 else levels[0]
        problem = generator.sample(level, cfg.split, rng)
        question = problem.compact if cfg.style == "compact" else problem.text
        digest = hashlib.sha256(problem.canonical.encode()).hexdigest()[:12]
        return Task(
            id=f"math/gen/{level}/{cfg.split}/{digest}",
            prompt=render_prompt(question, template=cfg.template, style=cfg.style, chat=cfg.chat),
            answer=problem.answer_text,
            metadata={
                "source": "procedural",
                "split": cfg.split,
                "difficulty": level,
                "kind": problem.kind,
                "question": question,
                "answer_form": problem.answer_form,
                "steps": problem.steps,
                "solution": render_solution(problem.steps, problem.answer_text, cfg.template),
                "template": cfg.template,
                "index": index,
            },
        )

    def _dataset_task(self, index: int, rng: np.random.Generator) -> Task:
        cfg = self.config
        assert self._items is not None
        n = len(self._items)
        item = self._items[index % n if cfg.order == "sequential" else int(rng.integers(n))]
        name = cfg.source if cfg.source in _NAMED_SOURCES else Path(cfg.source).name
        metadata = dict(item.metadata, template=cfg.template, question=item.question)
        metadata.setdefault("difficulty", None)
        return Task(
            id=f"{name}/{cfg.split}/{item.metadata['index']}",
            prompt=render_prompt(item.question, template=cfg.template, style=cfg.style, chat=cfg.chat),
            answer=item.answer,
            metadata=metadata,
        )

    def solution(self, task: Task, template: str | None = None) -> str:
        """The worked solution of a procedural ``task`` in ``template`` (default: the env's)."""
        steps = task.metadata.get("steps")
        if steps is None:
            raise ValueError(f"Task {task.id!r} has no worked steps; only procedural math tasks carry them.")
        return render_solution(steps, str(task.answer), template or self.config.template)

    # ---- grading
    def _extract(self, task: Task, completion: Completion) -> tuple[str | None, Verdict | None]:
        template = task.metadata.get("template", self.config.template)
        extraction = extract_answer(
            completion.text, template, strict=self.config.strict, max_answer_chars=self.config.max_answer_chars
        )
        if extraction.ok:
            return extraction.answer, None
        component = Component(name="format", score=0.0, reason=extraction.reason)
        return None, Verdict(
            score=0.0, correct=False, reason=extraction.reason, components=(component,), format_ok=False
        )

    def verify(self, task: Task, completion: Completion) -> Verdict:
        """Extract the answer in the task's format, then grade it with :func:`.verify.verify_answer`.

        The answer must be in the task's declared form (``metadata["answer_form"]``, else inferred from its
        question and gold: :func:`task_form`). A format failure scores 0. ``score=None`` (ungradeable) only for
        our failures (see the class docstring).
        """
        answer, failed = self._extract(task, Completion.coerce(completion))
        if failed is not None:
            return failed
        question, form = task_form(task)
        verdict = verify_answer(
            answer,
            task.answer,
            timeout_s=self.config.timeout_s,
            max_answer_chars=self.config.max_answer_chars,
            form=form,
            question=question,
        )
        return verdict.replace(format_ok=True)

    def score_group(self, task: Task, completions: Sequence[Completion | str]) -> list[Verdict]:
        """Grade G completions of one task; slow-path checks run in parallel on the verifier pool."""
        completions = [Completion.coerce(c) for c in completions]
        if len(completions) <= 1:
            return [self.verify(task, c) for c in completions]
        with ThreadPoolExecutor(max_workers=default_pool().size, thread_name_prefix="lrmgym-math") as executor:
            return list(executor.map(lambda c: self.verify(task, c), completions))

    def feedback(self, task: Task, completion: Completion, verdict: Verdict, turn: int) -> str | None:
        """After a wrong or badly formatted answer: say so and restate the format; ``None`` if ungradeable."""
        if verdict.score is None:
            return None
        template = task.metadata.get("template", self.config.template)
        if self.config.style == "compact":  # short, and ending in the answer cue, for small-context models
            if verdict.format_ok is False:
                return "\nBad format. Try again. A:"
            return f"\nNot {str(verdict.parsed)[:24]}. Try again. A:"
        if verdict.format_ok is False:
            problem = verdict.reason.removeprefix("format: ")
            return f"Your response did not follow the required format ({problem}). {INSTRUCTIONS[template]}"
        return f"Your answer {verdict.parsed} is not correct. Try again. {INSTRUCTIONS[template]}"
