"""Multiple-choice questions from local files in GPQA's published columns (CSV, JSONL, JSON list or parquet).

GPQA (Rein et al. 2023, https://arxiv.org/abs/2311.12022) ships ``gpqa_diamond.csv`` with the columns
``Question``, ``Correct Answer``, ``Incorrect Answer 1``, ``Incorrect Answer 2``, ``Incorrect Answer 3`` (and
``Record ID``, ``High-level domain``, ``Subdomain`` ... which are kept as metadata when present). The same columns
in a JSONL / JSON / parquet file load too. Nothing is downloaded: the user points at the file they have.

Every row is checked: the question and every option must be non-empty text, and the options must differ after
whitespace is normalised (two equal options would make the graded letter ambiguous).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lrmgym.envs._jsonl import read_bytes
from lrmgym.envs.math.loaders import DataError, read_rows

__all__ = ["GPQA_FIELDS", "Question", "load_questions"]

GPQA_FIELDS = ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
"""The GPQA columns a row must have (question, correct option, three incorrect options)."""
_KEPT = ("Record ID", "High-level domain", "Subdomain", "id")


@dataclass(frozen=True)
class Question:
    """One question: its text, the correct option, the incorrect ones (file order) and provenance."""

    question: str
    correct: str
    incorrect: tuple[str, ...]
    metadata: dict[str, Any] = field(default_factory=dict)


def _read_csv(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """Rows of a CSV file (quoted fields may span lines, as GPQA's questions do), read up to the file limit."""
    data = read_bytes(path, DataError)
    if b"\x00" in data:
        raise DataError(f"{path}: contains a NUL byte: this is a binary file, not a CSV text file.")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text (byte 0x{data[err.start]:02x}). Save the file as UTF-8.") from None
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        rows = [(f"{path} row {i}", dict(row)) for i, row in enumerate(reader, 1)]
    except csv.Error as err:
        raise DataError(f"{path}: not a readable CSV file ({err}).") from None
    if not rows:
        raise DataError(f"{path}: the file holds no rows (a header line and one row per question are expected).")
    return rows


def _text(row: dict[str, Any], name: str, where: str) -> str:
    value = row.get(name)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)) or not str(value).strip():
        shown = "missing" if name not in row else "empty" if value is not None else "null"
        raise DataError(
            f"{where}: field {name!r} is {shown}; a row needs non-empty {', '.join(map(repr, GPQA_FIELDS))} "
            "(GPQA's columns)."
        )
    return str(value).strip()


def load_questions(path: str | Path) -> list[Question]:
    """The questions of a local GPQA-format file (``.csv``, ``.csv.gz``; else any file :func:`read_rows` reads)."""
    path = Path(path).expanduser()
    rows = _read_csv(path) if path.name.lower().endswith((".csv", ".csv.gz")) else read_rows(path)
    questions = []
    for where, row in rows:
        missing = [f for f in GPQA_FIELDS if f not in row]
        if missing:
            raise DataError(
                f"{where}: missing column(s) {missing}; it has {sorted(row)}. Expected GPQA's columns "
                f"{', '.join(map(repr, GPQA_FIELDS))}."
            )
        question, correct, *incorrect = (_text(row, f, where) for f in GPQA_FIELDS)
        normalised = [" ".join(o.split()).casefold() for o in (correct, *incorrect)]
        if len(set(normalised)) != len(normalised):
            raise DataError(
                f"{where}: two options have the same text, so the letter of the correct one would be ambiguous; "
                "fix or drop this row."
            )
        metadata = {k: row[k] for k in _KEPT if isinstance(row.get(k), (str, int)) and str(row[k]).strip()}
        metadata["row"] = len(questions)
        questions.append(Question(question, correct, tuple(incorrect), metadata))
    return questions
