r"""Loaders for math data sets in their native formats, read from local files only (never downloaded).

- GSM8K (https://github.com/openai/grade-school-math): JSONL ``{"question", "answer"}``; the gold is the
  text after ``####`` with thousands commas removed.
- MATH / MATH-500 (https://github.com/hendrycks/math, https://github.com/openai/prm800k): JSONL
  ``{"problem", "solution", "answer"?, "level", "subject"|"type"}``; the gold is ``answer`` when present,
  else the last ``\boxed{}`` of the solution.
- Any local JSONL (optionally gzipped), JSON list, parquet file or Hugging Face ``datasets`` folder saved
  with ``save_to_disk``, with configurable question and answer fields.

Every item declares ``metadata["answer_form"]``, the form its question asks for
(:func:`lrmgym.envs.math.forms.infer_form`), which the verifier checks.

The default location of the bundled-by-reference copies is ``$LRMGYM_DATA_DIR``, else
``$LRMGYM_SHARED_DATA``, else ``../shared/data`` beside the checkout.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lrmgym.envs._jsonl import check_file, iter_jsonl, read_json
from lrmgym.envs.math.extract import braced
from lrmgym.envs.math.forms import infer_form

__all__ = [
    "Item",
    "DataError",
    "default_data_dir",
    "gsm8k_answer",
    "hash_split",
    "last_boxed",
    "load_gsm8k",
    "load_math",
    "load_records",
    "read_records",
    "read_rows",
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
Row = tuple[str, dict[str, Any]]
"""One record and where it is, for messages: ``"path:LINE"`` (JSONL) or ``"path row N"`` (1-based)."""


def _numbered(path: Path, rows: Any) -> list[Row]:
    out = []
    for number, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise DataError(f"{path} row {number}: expected an object (a mapping of fields), got {type(row).__name__}.")
        out.append((f"{path} row {number}", row))
    return out


def _read_parquet(path: Path) -> list[Row]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"Reading {path} needs pyarrow: pip install pyarrow") from None
    try:
        return _numbered(path, pq.read_table(path).to_pylist())
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise DataError(f"{path}: not a readable parquet file ({err}). Re-create it, or give a JSONL file.") from None


def _read_hf_folder(path: Path) -> list[Row]:
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"{path} looks like a Hugging Face dataset folder; reading it needs: pip install datasets"
        ) from None
    try:
        loaded = datasets.load_from_disk(str(path))
    except (OSError, ValueError) as err:
        raise DataError(f"{path}: not a readable dataset saved with save_to_disk ({err}).") from None
    if isinstance(loaded, datasets.DatasetDict):
        raise DataError(
            f"{path} holds several splits ({', '.join(loaded)}); point source at one of them, "
            f"e.g. {path / next(iter(loaded))}."
        )
    return _numbered(path, (dict(row) for row in loaded))


def read_rows(path: str | Path) -> list[Row]:
    """``(where, row)`` for every record of a local JSONL / JSONL.gz / JSON list / parquet file or HF folder.

    Files are read through :mod:`lrmgym.envs._jsonl` (size caps per line and per file, clear errors).
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise DataError(f"Data file {path} does not exist. Check the path (source=...).")
    if path.is_dir():
        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
            return _read_hf_folder(path)
        raise DataError(
            f"{path} is a folder but not a Hugging Face dataset saved with save_to_disk. Point source at a "
            ".jsonl, .json or .parquet file."
        )
    check_file(path, DataError)
    name = path.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz", ".ndjson")):
        return [(f"{path}:{line}", row) for line, row in iter_jsonl(path, DataError)]
    if name.endswith(".parquet"):
        return _read_parquet(path)
    if name.endswith(".json"):
        data = read_json(path, DataError)
        if not isinstance(data, list):
            raise DataError(f"{path}: expected a JSON list of objects, got {type(data).__name__}.")
        return _numbered(path, data)
    raise DataError(
        f"Unsupported data file {path}: expected .jsonl, .jsonl.gz, .json, .parquet or a HF dataset folder."
    )


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a local data file (see :func:`read_rows`), without their positions."""
    return [row for _, row in read_rows(path)]


def _text(row: dict[str, Any], name: str, where: str, fix: str) -> str:
    """Field ``name`` of a row as a non-empty string (a number is written as text); anything else is refused."""
    if name not in row:
        raise DataError(f"{where}: missing field {name!r}; it has {sorted(row)}. {fix}")
    value = row[name]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        shown = "null" if value is None else type(value).__name__
        raise DataError(f"{where}: field {name!r} is {shown}; expected text (or a number). {fix}")
    text = str(value).strip()
    if not text:
        raise DataError(f"{where}: field {name!r} is empty. {fix}")
    return text


# --------------------------------------------------------------------------------------------------- answers
_THOUSANDS_RE = re.compile(r"(?<=\d),(?=\d{3}\b)")


def gsm8k_answer(rationale: str, where: str = "GSM8K answer") -> str:
    """The gold of a GSM8K rationale: the text after the last ``####``, thousands commas removed."""
    if "####" not in rationale:
        raise DataError(f"{where}: the answer has no '####' line: {rationale[-80:]!r}.")
    gold = _THOUSANDS_RE.sub("", rationale.split("####")[-1].strip())
    if not gold:
        raise DataError(f"{where}: nothing follows the answer's '####'; write the final answer after it.")
    return gold


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
    fix = "GSM8K rows have a 'question' and an 'answer' that ends in '#### <number>'."
    for index, (where, row) in enumerate(read_rows(path)):
        question, rationale = _text(row, "question", where, fix), _text(row, "answer", where, fix)
        reference = re.sub(r"<<[^>]*>>", "", rationale.split("####")[0]).strip()
        items.append(
            Item(
                question,
                gold := gsm8k_answer(rationale, where),
                {
                    "source": "gsm8k",
                    "split": split,
                    "index": index,
                    "reference_solution": reference,
                    "answer_form": infer_form(question, gold),
                },
            )
        )
    return items


def load_math(path: str | Path, split: str, source: str = "math") -> list[Item]:
    """MATH / MATH-500 items: the ``answer`` field, else the last boxed answer of ``solution``."""
    items = []
    fix = "MATH rows have a 'problem' and an 'answer', or a 'solution' with a \\boxed{} answer."
    for index, (where, row) in enumerate(read_rows(path)):
        problem = _text(row, "problem", where, fix)
        answer = row.get("answer")
        if answer is None or (isinstance(answer, str) and not answer.strip()):
            solution = row.get("solution")
            answer = last_boxed(solution) if isinstance(solution, str) else None
            if answer is None:
                raise DataError(f"{where}: no 'answer' field and no \\boxed{{}} in 'solution'. {fix}")
        else:
            answer = _text(row, "answer", where, fix)
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
            "answer_form": infer_form(problem, str(answer).strip()),
        }
        items.append(Item(problem, str(answer).strip(), metadata))
    return items


def load_records(path: str | Path, split: str, question_field: str, answer_field: str) -> list[Item]:
    """Items of any local file with the given fields. A ``####`` answer is read GSM8K-style.

    ``split`` is only recorded in the metadata; :func:`hash_split` chooses the items of a split.
    """
    items = []
    fix = "Set question_field / answer_field (env.question_field=... on the command line) to the fields that hold them."
    for index, (where, row) in enumerate(read_rows(path)):
        missing = [f for f in (question_field, answer_field) if f not in row]
        if missing:
            raise DataError(f"{where}: missing field(s) {missing}; it has {sorted(row)}. {fix}")
        question = _text(row, question_field, where, "Give every row its question, or drop the row.")
        answer = _text(row, answer_field, where, "Give every row its gold answer, or drop the row.")
        if "####" in answer:
            answer = gsm8k_answer(answer, where)
        elif "\\boxed" in answer and (boxed := last_boxed(answer)) is not None:
            answer = boxed
        meta = {"source": str(path), "split": split, "index": index}
        meta["answer_form"] = infer_form(question, answer.strip())
        if "level" in row:
            meta["difficulty"] = row["level"]
        items.append(Item(question, answer.strip(), meta))
    return items


# --------------------------------------------------------------------------------------------------- splits
def hash_split(question: str, test_fraction: float) -> str:
    """``"test"`` or ``"train"`` for an item, from the SHA-256 of its question (whitespace-normalised).

    The item is in the test split when the first 8 bytes of the hash, read as a fraction of 2**64, are below
    ``test_fraction``; so an item's split depends on its own content only, never on its position or on the other
    items, and copies of one question fall on the same side.
    """
    digest = hashlib.sha256(" ".join(question.split()).encode("utf-8")).digest()
    return "test" if int.from_bytes(digest[:8], "big") < test_fraction * 2**64 else "train"
