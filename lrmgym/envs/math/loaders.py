r"""Loaders for math data sets in their native formats, read from local files only (never downloaded).

- GSM8K (https://github.com/openai/grade-school-math): JSONL ``{"question", "answer"}``; the gold is the
  text after ``####`` with thousands commas removed.
- MATH / MATH-500 (https://github.com/hendrycks/math, https://github.com/openai/prm800k): JSONL
  ``{"problem", "solution", "answer"?, "level", "subject"|"type"}``; the gold is ``answer`` when present,
  else the last ``\boxed{}`` of the solution.
- Any local JSONL (optionally gzipped), JSON list, parquet file or Hugging Face ``datasets`` folder saved
  with ``save_to_disk``, with configurable question and answer fields.

The default location of the bundled-by-reference copies is ``$LRMGYM_DATA_DIR``, else
``$LRMGYM_SHARED_DATA``, else ``../shared/data`` beside the checkout.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lrmgym.envs._jsonl import iter_jsonl
from lrmgym.envs.math.extract import braced

__all__ = [
    "Item",
    "DataError",
    "default_data_dir",
    "gsm8k_answer",
    "last_boxed",
    "load_gsm8k",
    "load_math",
    "load_records",
    "read_records",
    "resolve_builtin",
]


class DataError(ValueError):
    """A data file is missing or malformed; the message says which file, which row and how to fix it."""


@dataclass(frozen=True)
class Item:
    """One data-set problem: its question, its gold answer string and provenance."""

    question: str
    answer: str
    metadata: dict[str, Any] = field(default_factory=dict)


def default_data_dir() -> Path:
    """Where the real data sets are looked for by default (see the module docstring)."""
    for var in ("LRMGYM_DATA_DIR", "LRMGYM_SHARED_DATA"):
        if os.environ.get(var):
            return Path(os.environ[var])
    return Path(__file__).resolve().parents[3].parent / "shared" / "data"


_BUILTIN_FILES = {
    ("gsm8k", "test"): ("gsm8k", "test.jsonl", "https://github.com/openai/grade-school-math"),
    ("gsm8k", "train"): ("gsm8k", "train.jsonl.gz", "https://github.com/openai/grade-school-math"),
    ("math500", "test"): ("math500", "test.jsonl", "https://github.com/openai/prm800k"),
}


def resolve_builtin(source: str, split: str, data_dir: str | Path | None = None) -> Path:
    """The file of a named data set's split, with a clear error when it is not there.

    Raises:
        DataError: The split does not exist (MATH-500 is test-only) or the file is missing.
    """
    if (source, split) not in _BUILTIN_FILES:
        if source == "math500":
            raise DataError(
                "MATH-500 has only a 'test' split (500 problems). Use split='test', or train on a MATH train "
                "file with source='/path/to/math_train.jsonl'."
            )
        raise DataError(f"Unknown data set {source!r} (split {split!r}); expected 'gsm8k' or 'math500'.")
    folder, name, url = _BUILTIN_FILES[(source, split)]
    base = Path(data_dir) if data_dir is not None else default_data_dir()
    path = base / folder / name
    if not path.exists():
        alternatives = [p for p in (path.with_suffix(""), path.with_name(name + ".gz")) if p.exists()]
        if alternatives:
            return alternatives[0]
        raise DataError(
            f"{source} {split} split not found at {path}. Put a copy there (from {url}), set "
            "LRMGYM_DATA_DIR to the folder that holds it, or pass data_dir=... / source='/path/to/file'."
        )
    return path


# --------------------------------------------------------------------------------------------------- readers
def _read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    return (row for _, row in iter_jsonl(path, DataError))


def _read_parquet(path: Path) -> Iterator[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"Reading {path} needs pyarrow: pip install pyarrow") from None
    yield from pq.read_table(path).to_pylist()


def _read_hf_folder(path: Path) -> Iterator[dict[str, Any]]:
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"{path} looks like a Hugging Face dataset folder; reading it needs: pip install datasets"
        ) from None
    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        raise DataError(
            f"{path} holds several splits ({', '.join(loaded)}); point source at one of them, "
            f"e.g. {path / next(iter(loaded))}."
        )
    for row in loaded:
        yield dict(row)


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a local JSONL / JSONL.gz / JSON list / parquet file or HF ``save_to_disk`` folder."""
    path = Path(path).expanduser()
    if not path.exists():
        raise DataError(f"Data file {path} does not exist. Check the path (source=...).")
    if path.is_dir():
        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
            return list(_read_hf_folder(path))
        raise DataError(f"{path} is a folder but not a Hugging Face dataset saved with save_to_disk.")
    name = path.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz", ".ndjson")):
        return list(_read_jsonl(path))
    if name.endswith(".parquet"):
        return list(_read_parquet(path))
    if name.endswith(".json"):
        with open(path, encoding="utf-8") as handle:
            try:
                data = json.load(handle)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}: not valid JSON ({exc.msg}).") from None
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise DataError(f"{path}: expected a JSON list of objects.")
        return data
    raise DataError(
        f"Unsupported data file {path}: expected .jsonl, .jsonl.gz, .json, .parquet or a HF dataset folder."
    )


# --------------------------------------------------------------------------------------------------- answers
_THOUSANDS_RE = re.compile(r"(?<=\d),(?=\d{3}\b)")


def gsm8k_answer(rationale: str) -> str:
    """The gold of a GSM8K rationale: the text after the last ``####``, thousands commas removed."""
    if "####" not in rationale:
        raise DataError(f"GSM8K answer has no '####' line: {rationale[-80:]!r}")
    return _THOUSANDS_RE.sub("", rationale.split("####")[-1].strip())


def last_boxed(text: str) -> str | None:
    r"""The content of the last ``\boxed{...}`` (or ``\fbox{...}``) in ``text``, braces balanced."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    brace = text.find("{", start) if start >= 0 else -1
    if brace < 0:
        return None
    inner = braced(text, brace, len(text))
    return None if inner is None else inner.strip()


# --------------------------------------------------------------------------------------------------- loaders
def load_gsm8k(path: str | Path, split: str) -> list[Item]:
    """GSM8K items of one file; metadata keeps the worked rationale with the ``<<...>>`` annotations removed."""
    items = []
    for index, row in enumerate(read_records(path)):
        try:
            question, rationale = str(row["question"]), str(row["answer"])
        except KeyError as exc:
            raise DataError(
                f"{path} row {index}: missing field {exc.args[0]!r} (GSM8K rows have 'question' and 'answer')."
            ) from None
        reference = re.sub(r"<<[^>]*>>", "", rationale.split("####")[0]).strip()
        items.append(
            Item(
                question,
                gsm8k_answer(rationale),
                {"source": "gsm8k", "split": split, "index": index, "reference_solution": reference},
            )
        )
    return items


def load_math(path: str | Path, split: str, source: str = "math") -> list[Item]:
    """MATH / MATH-500 items: the ``answer`` field, else the last boxed answer of ``solution``."""
    items = []
    for index, row in enumerate(read_records(path)):
        if "problem" not in row:
            raise DataError(f"{path} row {index}: missing field 'problem' (MATH rows have 'problem' and 'solution').")
        answer = row.get("answer")
        if answer is None or str(answer).strip() == "":
            answer = last_boxed(str(row.get("solution", "")))
        if answer is None:
            raise DataError(f"{path} row {index}: no 'answer' field and no \\boxed{{}} in 'solution'.")
        level = row.get("level")
        if isinstance(level, str) and level.startswith("Level "):
            level = level.removeprefix("Level ")
        metadata = {
            "source": source,
            "split": split,
            "index": index,
            "difficulty": int(level) if str(level).isdigit() else level,
            "subject": row.get("subject", row.get("type")),
            "unique_id": row.get("unique_id"),
            "reference_solution": row.get("solution"),
        }
        items.append(Item(str(row["problem"]), str(answer).strip(), metadata))
    return items


def load_records(path: str | Path, split: str, question_field: str, answer_field: str) -> list[Item]:
    """Items of any local file with the given fields. A ``####`` answer is read GSM8K-style."""
    items = []
    for index, row in enumerate(read_records(path)):
        missing = [f for f in (question_field, answer_field) if f not in row]
        if missing:
            raise DataError(
                f"{path} row {index}: missing field(s) {missing}; it has {sorted(row)}. "
                "Set question_field / answer_field to the right names."
            )
        answer = str(row[answer_field])
        if "####" in answer:
            answer = gsm8k_answer(answer)
        elif "\\boxed" in answer and (boxed := last_boxed(answer)) is not None:
            answer = boxed
        meta = {"source": str(path), "split": split, "index": index}
        if "level" in row:
            meta["difficulty"] = row["level"]
        items.append(Item(str(row[question_field]), answer.strip(), meta))
    return items
