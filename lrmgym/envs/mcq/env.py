"""``lrmgym/MultipleChoice-v0``: four-option questions (GPQA columns) graded on exactly one letter A-D.

The options are shown in an order drawn per question from ``(shuffle_seed, SHA-256 of the question)``: the same
question gets the same order in every run, whatever its position in the file, and across questions the correct
option lands on each letter equally often in expectation (a file whose correct answer always comes first, as
GPQA's columns do, must not teach "answer A"). The prompt lists the options and never marks which is correct.
"""

from __future__ import annotations

import hashlib
import re
import threading
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, model_validator

from lrmgym.core import Completion, Component, Task, TextEnv, Verdict
from lrmgym.envs.mcq.loaders import Question, load_questions

__all__ = ["LETTERS", "MultipleChoiceConfig", "MultipleChoiceEnv", "extract_letter", "option_order"]

LETTERS = ("A", "B", "C", "D")
_LETTER_RE = re.compile(r"\(?([A-D])\)?")
INSTRUCTION = (
    "Think step by step, then give only the letter of your choice (A, B, C or D) inside <answer></answer> tags, "
    "and write nothing after the closing tag."
)  # no example letter: a fixed one in every prompt could pull answers towards it


class MultipleChoiceConfig(BaseModel):
    """Options of the multiple-choice env."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    data_path: str | None = None
    """A local file in GPQA's columns (Question, Correct Answer, Incorrect Answer 1-3): .csv, .jsonl, .json or
    .parquet. Required: nothing is bundled or downloaded."""
    shuffle_seed: int = 0
    """Seed of the option order (with each question's content hash); another seed gives other orders."""
    chat: bool = True
    """Give prompts as chat messages ([{'role': 'user', ...}]) instead of raw text."""
    split: Literal["test"] = "test"
    """The file is taken whole as an evaluation set."""
    order: Literal["random", "sequential"] = "sequential"
    """Task i is question i mod N ('sequential', for evaluation) or a random question ('random')."""

    @model_validator(mode="after")
    def _check_path(self) -> MultipleChoiceConfig:
        if self.data_path is None:
            raise ValueError(
                "data_path is required: give the path of a local file in GPQA's columns (e.g. gpqa_diamond.csv)"
            )
        path = Path(self.data_path).expanduser()
        if not path.is_file():
            what = "does not exist" if not path.exists() else "is not a regular file"
            raise ValueError(f"data_path {self.data_path!r} {what}; give the path of a .csv / .jsonl / .parquet file")
        return self


def option_order(question: str, shuffle_seed: int) -> list[int]:
    """The shown order of a question's options: a permutation of 0..3 (0 = the correct one) from its content.

    Example:
        >>> sorted(option_order("What is 1 + 1?", 0))
        [0, 1, 2, 3]
    """
    digest = hashlib.sha256(" ".join(question.split()).encode("utf-8")).digest()
    seq = np.random.SeedSequence([shuffle_seed, int.from_bytes(digest[:8], "big")])
    return [int(i) for i in np.random.default_rng(seq).permutation(len(LETTERS))]


def extract_letter(text: str) -> tuple[str | None, str]:
    """The chosen letter of a completion, strictly: ``(letter, "")`` or ``(None, "format: ...")``.

    The completion must have exactly one ``<answer>`` block, holding exactly one letter A-D (optionally in
    parentheses), and nothing but whitespace after it.
    """
    opens, closes = text.count("<answer>"), text.count("</answer>")
    if opens == 0:
        return None, "format: no <answer> tag"
    if opens != 1 or closes != 1:
        return None, f"format: {opens} <answer> and {closes} </answer> tags, expected exactly one of each"
    start = text.index("<answer>") + len("<answer>")
    end = text.find("</answer>", start)
    if end < 0:
        return None, "format: </answer> comes before <answer>"
    if text[end + len("</answer>") :].strip():
        return None, "format: text after </answer>"
    inner = text[start:end].strip()
    match = _LETTER_RE.fullmatch(inner)
    if match is None:
        return None, f"format: the answer must be exactly one letter A-D, got {inner[:40]!r}"
    return match.group(1), ""


_CACHE: dict[tuple[str, int, int], list[Question]] = {}
_LOCK = threading.Lock()


def _questions(config: MultipleChoiceConfig) -> list[Question]:
    path = Path(str(config.data_path)).expanduser()
    stat = path.stat()
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = load_questions(path)
        return _CACHE[key]


class MultipleChoiceEnv(TextEnv):
    """Four-option multiple-choice questions (GPQA-Diamond's format) from a local file.

    The prompt is the question and its options as ``A) ...`` to ``D) ...`` in a seeded per-question order
    (:func:`option_order`), then the answer format. A completion scores 1.0 when its single ``<answer>`` block holds
    exactly the letter of the correct option, 0.0 otherwise: a missing, doubled or multi-letter answer ("A or C",
    "AC") is a format failure (``format_ok=False``) and scores 0.
    """

    Config = MultipleChoiceConfig

    @classmethod
    def preflight(cls, config: MultipleChoiceConfig) -> None:
        """Read the data file when the config is resolved, so that a bad file stops a command before it starts."""
        _questions(config)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config: MultipleChoiceConfig
        self._items = _questions(self.config)

    @property
    def num_items(self) -> int:
        """How many questions the file holds."""
        return len(self._items)

    def make_task(self, index: int, rng: np.random.Generator) -> Task:
        """Question ``index mod N`` (sequential) or a random one, with its options in the seeded order."""
        n = len(self._items)
        row = index % n if self.config.order == "sequential" else int(rng.integers(n))
        item = self._items[row]
        order = option_order(item.question, self.config.shuffle_seed)
        texts = [(item.correct, *item.incorrect)[i] for i in order]
        answer = LETTERS[order.index(0)]
        options = "\n".join(f"{letter}) {text}" for letter, text in zip(LETTERS, texts, strict=True))
        text = f"{item.question}\n\n{options}\n\n{INSTRUCTION}"
        ident = item.metadata.get("Record ID", item.metadata.get("id", item.metadata["row"]))
        return Task(
            id=f"{Path(str(self.config.data_path)).stem}/{ident}",
            prompt=[{"role": "user", "content": text}] if self.config.chat else text,
            answer=answer,
            metadata={**item.metadata, "options": texts, "index": index, "difficulty": None, "source": "mcq"},
        )

    def verify(self, task: Task, completion: Completion) -> Verdict:
        """1.0 for exactly the correct letter; 0.0 for another letter or a format failure."""
        letter, reason = extract_letter(Completion.coerce(completion).text)
        if letter is None:
            return Verdict(
                score=0.0, correct=False, reason=reason, format_ok=False,
                components=(Component(name="format", score=0.0, reason=reason),),
            )  # fmt: skip
        ok = letter == task.answer
        return Verdict(score=float(ok), correct=ok, parsed=letter, reason="correct" if ok else "wrong letter",
                       format_ok=True)  # fmt: skip
