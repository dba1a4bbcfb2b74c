"""LiveCodeBench-style stdio tasks from a local file of ``livecodebench/code_generation_lite`` records.

A record (one JSON object per line, as the release's ``test*.jsonl`` files hold them; a JSON list or parquet file
with the same fields loads too) has ``question_content`` (the statement), ``question_title``, ``question_id``,
``platform``, ``difficulty``, ``starter_code``, and two test fields:

- ``public_test_cases``: a JSON list (or a JSON string of one) of ``{"input", "output", "testtype"}``; these are
  shown in the prompt as examples and **never graded**;
- ``private_test_cases``: the graded tests, in the same form. The release stores them compressed (base64 of zlib
  of a Python pickle). lrmgym never unpickles data (a pickle can run code while it loads), so that form is refused
  with a message saying how to give plain JSON instead.

Only ``"testtype": "stdin"`` tasks are taken (the program reads stdin and writes stdout; the sandbox compares the
output with the expected one after normalising line ends and trailing whitespace, :mod:`lrmgym.envs.code.sandbox`);
LeetCode-style ``functional`` tasks (a ``starter_code`` method) are skipped, and how many were is logged.
Following the held-out rule of :mod:`lrmgym.envs.code.heldout` (grade on tests the prompt does not show), a
private test whose input is also a shown public one is dropped; a task left with no private test is dropped too.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from lrmgym.envs.code.loaders import CodeTask, DataError
from lrmgym.envs.math.loaders import DataError as RowsError
from lrmgym.envs.math.loaders import read_rows

__all__ = ["STDIO_INSTRUCTION", "load_livecodebench"]

log = logging.getLogger("lrmgym.code.livecodebench")

STDIO_INSTRUCTION = (
    "Write a Python program that reads the input from standard input and writes the answer to standard output, "
    "exactly in the format the statement asks for."
)
_BASE64_RE = re.compile(r"[A-Za-z0-9+/=\s]+")


def _cases(value: Any, field: str, where: str) -> list[dict[str, Any]]:
    """A test field as a list of ``{"input", "output", "testtype"}`` dicts (plain JSON only, never a pickle)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            if len(value) > 16 and _BASE64_RE.fullmatch(value[:4096]):
                raise DataError(
                    f"{where}: {field} is in the release's compressed form (base64 of zlib of a Python pickle). "
                    "lrmgym never unpickles data, since loading a pickle can run code. Give the tests as plain "
                    f'JSON instead: {field} as a list of {{"input": ..., "output": ..., "testtype": "stdin"}} '
                    "objects (decode the file once, with a tool you trust, and save it as JSONL)."
                ) from None
            raise DataError(f"{where}: {field} is neither a JSON list nor a JSON string of one.") from None
    if not isinstance(value, list) or not all(
        isinstance(c, dict) and isinstance(c.get("input"), str) and isinstance(c.get("output"), str) for c in value
    ):
        raise DataError(f'{where}: {field} must be a list of {{"input": str, "output": str, "testtype": ...}} objects.')
    return value


def _text(row: dict[str, Any], name: str, where: str) -> str:
    value = row.get(name)
    if not isinstance(value, str) or not value.strip():
        shown = "missing" if name not in row else "empty" if isinstance(value, str) else type(value).__name__
        raise DataError(f"{where}: field {name!r} is {shown}; expected the problem statement as text.")
    return value


def _same_input(a: str, b: str) -> bool:
    return a.split() == b.split()


def _prompt(row: dict[str, Any], statement: str, public: list[dict[str, Any]]) -> str:
    title = row.get("question_title")
    parts = [f"{title}\n\n{statement.strip()}" if isinstance(title, str) and title.strip() else statement.strip()]
    for i, case in enumerate(public, 1):
        parts.append(f"Example {i}\nInput:\n{case['input'].rstrip()}\nOutput:\n{case['output'].rstrip()}")
    parts.append(STDIO_INSTRUCTION)
    return "\n\n".join(parts)


def load_livecodebench(path: str | Path) -> list[CodeTask]:
    """The stdio tasks of a local LiveCodeBench file, graded on their private tests only (see the module doc)."""
    path = Path(path).expanduser()
    try:
        rows = read_rows(path)
    except RowsError as err:
        raise DataError(str(err)) from None
    tasks: list[CodeTask] = []
    functional = emptied = 0
    for index, (where, row) in enumerate(rows):
        statement = _text(row, "question_content", where)
        for name in ("public_test_cases", "private_test_cases"):
            if name not in row:
                raise DataError(f"{where}: missing field {name!r}; it has {sorted(row)}.")
        public = _cases(row["public_test_cases"], "public_test_cases", where)
        private = _cases(row["private_test_cases"], "private_test_cases", where)
        starter = row.get("starter_code")
        if (isinstance(starter, str) and starter.strip()) or any(
            c.get("testtype", "stdin") != "stdin" for c in (*public, *private)
        ):
            functional += 1
            continue
        graded = [c for c in private if not any(_same_input(c["input"], p["input"]) for p in public)]
        if not graded:
            emptied += 1
            continue
        ident = row.get("question_id", index)
        tasks.append(
            CodeTask(
                id=f"livecodebench/{ident}",
                text=_prompt(row, statement, public),
                cases=tuple({"stdin": c["input"], "stdout": c["output"]} for c in graded),
                source=str(path),
            )
        )
    if functional or emptied:
        log.info(
            "%s: skipped %d functional (LeetCode-style) task(s) and %d task(s) whose private tests all repeat a "
            "shown example; %d stdio task(s) kept",
            path, functional, emptied, len(tasks),
        )  # fmt: skip
    if not tasks:
        raise DataError(
            f"{path}: no stdio task to grade ({functional} functional task(s) skipped, {emptied} with no private "
            "test beyond the shown examples). Give LiveCodeBench records whose tests have testtype 'stdin'."
        )
    return tasks
