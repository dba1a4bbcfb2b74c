"""Code tasks from HumanEval, MBPP and generic JSONL files, as :class:`CodeTask` records.

A :class:`CodeTask` carries everything the sandbox needs: the prompt shown to the policy, the trusted code
prepended to a candidate (imports and helper functions of the prompt), and the tests split into units that
the harness evaluates one by one (each unit that contains an ``assert`` is one test; the others are setup).

Formats (see each data folder's README under ``$LRMGYM_SHARED_DATA``):

- HumanEval (``humaneval/HumanEval.jsonl.gz``): ``prompt`` + ``completion`` + ``test`` + ``check(entry_point)``.
  Here the asserts of ``check`` become units with ``candidate`` bound to the entry point.
- MBPP (``mbpp/mbpp.jsonl``): program order *code, then setup, then tests*: the setup of tasks 367 and 927
  uses the solution's ``Node`` class, so it runs after the candidate's names are bound.
- Generic JSONL: one object per line with ``prompt`` and either ``tests`` (assert code, a string or a list of
  strings) or ``stdio`` (``[{"stdin": ..., "stdout": ...}]``); optional ``id``, ``entry_point``, ``setup``,
  ``solution``.
"""

from __future__ import annotations

import ast
import os
import textwrap
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lrmgym.envs._jsonl import iter_jsonl

__all__ = [
    "CodeTask",
    "DataError",
    "default_data_dir",
    "load_humaneval",
    "load_jsonl",
    "load_mbpp",
    "mbpp_split",
    "split_tests",
]

MBPP_SPLITS = {"prompt": (1, 10), "test": (11, 510), "validation": (511, 600), "train": (601, 974)}


class DataError(ValueError):
    """A task file is missing or malformed; the message names the file, the line and the fix."""


@dataclass(frozen=True)
class CodeTask:
    """One programming task, ready for the sandbox.

    Attributes:
        id: Stable id, for example ``"humaneval/12"`` or ``"mbpp/601"``.
        text: The problem statement shown to the policy (without answer-format instructions).
        units: Test units in order: ``{"src": str, "test": bool}``.
        prelude: Trusted code run in the tests' namespace (prompt helpers, MBPP setup).
        bind: Aliases for the tests, for example ``{"candidate": "has_close_elements"}``.
        prefix: Trusted code prepended to the candidate program (the prompt's imports and helpers).
        stub: Code the candidate may *continue* (the HumanEval prompt) when it writes only a function body.
        entry_point: The function the tests call, when there is one.
        cases: stdin/stdout cases (``mode == "stdio"``).
        solution: A reference solution (a complete program), when the source has one.
        source: ``"humaneval"``, ``"mbpp"``, ``"procedural"`` or the JSONL path.
    """

    id: str
    text: str
    units: tuple[dict[str, Any], ...] = ()
    prelude: str = ""
    bind: dict[str, str] = field(default_factory=dict)
    prefix: str = ""
    stub: str = ""
    entry_point: str | None = None
    cases: tuple[dict[str, str], ...] = ()
    solution: str | None = None
    source: str = ""

    @property
    def mode(self) -> str:
        """``"stdio"`` when the task has stdin/stdout cases, else ``"call"``."""
        return "stdio" if self.cases else "call"

    def program(self, code: str) -> str:
        """The full program run in the sandbox for candidate ``code``.

        A candidate that defines the entry point gets the trusted prefix prepended; one that does not (it
        wrote only the body) continues the stub, as the original HumanEval harness does.
        """
        if self.stub and self.entry_point and not _defines(code, self.entry_point, self.stub):
            return self.stub + code
        return f"{self.prefix}\n\n{code}" if self.prefix else code


def parse_quietly(code: str) -> ast.Module | None:
    """``ast.parse`` without warnings; ``None`` when the code does not parse."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # invalid escapes and the like in model code are not our warnings
        try:
            return ast.parse(code)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None


def _defines(code: str, name: str, stub: str) -> bool:
    """Whether ``code`` defines ``name`` at top level; code that parses only after ``stub`` is a body."""
    tree = parse_quietly(code)
    if tree is None:
        return parse_quietly(stub + code) is None  # not a body either: run it as written, the sandbox reports why
    return any(
        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name
        for node in tree.body
    )


def default_data_dir() -> Path:
    """``$LRMGYM_SHARED_DATA`` if set, else ``<checkout>/../shared/data``."""
    env = os.environ.get("LRMGYM_SHARED_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3].parent / "shared" / "data"


# --------------------------------------------------------------------------------------------------- tests
def split_tests(test_code: str, where: str = "tests") -> list[dict[str, Any]]:
    """Split assert-based test code into units: each top-level statement containing an ``assert`` is one test.

    Raises:
        DataError: The test code does not parse.
    """
    try:
        tree = ast.parse(test_code)
    except SyntaxError as exc:
        raise DataError(f"{where}: the test code does not parse ({exc.msg}, line {exc.lineno}).") from None
    units = []
    for node in tree.body:
        src = ast.get_source_segment(test_code, node, padded=True) or ast.unparse(node)
        units.append({"src": _dedent_segment(src), "test": any(isinstance(n, ast.Assert) for n in ast.walk(node))})
    return units


def _dedent_segment(src: str) -> str:
    lines = src.splitlines()
    if not lines:
        return src
    pad = len(lines[0]) - len(lines[0].lstrip())
    if pad == 0:
        return src
    return "\n".join(line[pad:] if line[:pad].strip() == "" else line for line in lines)


# --------------------------------------------------------------------------------------------------- HumanEval
def load_humaneval(path: Path) -> list[CodeTask]:
    """Load the 164 HumanEval problems from ``HumanEval.jsonl.gz`` (or an uncompressed ``.jsonl``)."""
    tasks = []
    for lineno, row in _read_jsonl(path):
        where = f"{path}:{lineno}"
        _require(row, ("task_id", "prompt", "entry_point", "test"), where)
        tasks.append(_humaneval_task(row, where))
    return tasks


def _humaneval_task(row: dict[str, Any], where: str) -> CodeTask:
    prompt, entry = row["prompt"], row["entry_point"]
    try:
        tree = ast.parse(prompt + "    pass\n")
    except SyntaxError as exc:
        raise DataError(f"{where}: the prompt does not parse as a function stub ({exc.msg}).") from None
    helpers = [
        ast.get_source_segment(prompt + "    pass\n", node, padded=True) or ""
        for node in tree.body
        if not (isinstance(node, ast.FunctionDef) and node.name == entry)
    ]
    prefix = "\n\n".join(helpers)
    test_tree = ast.parse(row["test"])
    check = [n for n in test_tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if len(check) != 1:
        raise DataError(f"{where}: the test must define exactly one check(candidate) function.")
    other = [ast.get_source_segment(row["test"], n) or "" for n in test_tree.body if n is not check[0]]
    lines = row["test"].splitlines()[check[0].body[0].lineno - 1 : check[0].end_lineno]
    units = split_tests(textwrap.dedent("\n".join(lines)), where)
    number = row["task_id"].split("/")[-1]
    return CodeTask(
        id=f"humaneval/{number}",
        text=prompt,
        units=tuple(units),
        prelude="\n\n".join([prefix, *other]),
        bind={"candidate": entry},
        prefix=prefix,
        stub=prompt,
        entry_point=entry,
        solution=prompt + row["canonical_solution"] if "canonical_solution" in row else None,
        source="humaneval",
    )


# --------------------------------------------------------------------------------------------------- MBPP
def load_mbpp(path: Path) -> list[CodeTask]:
    """Load the 974 MBPP problems from ``mbpp.jsonl`` (all splits; filter with :func:`mbpp_split`)."""
    tasks = []
    for lineno, row in _read_jsonl(path):
        where = f"{path}:{lineno}"
        _require(row, ("task_id", "text", "code", "test_list"), where)
        tests = list(row["test_list"])
        units = []
        for i, t in enumerate(tests):
            split = split_tests(t, f"{where} test {i}")
            units.append({"src": "\n".join(u["src"] for u in split), "test": True})
        text = row["text"].strip() + "\nYour code should pass these tests:\n" + "\n".join(tests)
        tasks.append(
            CodeTask(
                id=f"mbpp/{row['task_id']}",
                text=text,
                units=tuple(units),
                prelude=row.get("test_setup_code") or "",
                solution=row["code"].replace("\r\n", "\n"),
                source="mbpp",
            )
        )
    return tasks


def mbpp_split(tasks: list[CodeTask], split: str) -> list[CodeTask]:
    """The tasks of one standard MBPP split, or all of them for ``"all"``.

    Splits: ``prompt`` 1-10, ``test`` 11-510, ``validation`` 511-600, ``train`` 601-974.
    """
    if split == "all":
        return tasks
    if split not in MBPP_SPLITS:
        raise DataError(f"Unknown MBPP split {split!r}; expected one of all, {', '.join(MBPP_SPLITS)}.")
    lo, hi = MBPP_SPLITS[split]
    return [t for t in tasks if lo <= int(t.id.split("/")[1]) <= hi]


# --------------------------------------------------------------------------------------------------- JSONL
def load_jsonl(path: Path) -> list[CodeTask]:
    """Load generic code tasks; see the module docstring for the fields."""
    tasks = []
    for lineno, row in _read_jsonl(path):
        where = f"{path}:{lineno}"
        _require(row, ("prompt",), where)
        has_tests, has_stdio = "tests" in row, "stdio" in row
        if has_tests == has_stdio:
            raise DataError(f"{where}: give exactly one of 'tests' (assert code) or 'stdio' (stdin/stdout cases).")
        units: list[dict[str, Any]] = []
        cases: list[dict[str, str]] = []
        if has_tests:
            tests = row["tests"]
            if isinstance(tests, str):
                units = split_tests(tests, where)
            elif isinstance(tests, list) and all(isinstance(t, str) for t in tests):
                for t in tests:
                    units.append({"src": "\n".join(u["src"] for u in split_tests(t, where)), "test": True})
            else:
                raise DataError(f"{where}: 'tests' must be a string of assert code or a list of such strings.")
            if not any(u["test"] for u in units):
                raise DataError(f"{where}: 'tests' contains no assert statement, so nothing could fail.")
        else:
            stdio = row["stdio"]
            if not isinstance(stdio, list) or not stdio or not all(_is_case(c) for c in stdio):
                raise DataError(
                    f'{where}: \'stdio\' must be a non-empty list of {{"stdin": str, "stdout": str}} objects.'
                )
            cases = [{"stdin": c["stdin"], "stdout": c["stdout"]} for c in stdio]
        entry = row.get("entry_point")
        tasks.append(
            CodeTask(
                id=str(row.get("id", f"{path.stem}/{lineno - 1}")),
                text=row["prompt"],
                units=tuple(units),
                prelude=row.get("setup", ""),
                bind={"candidate": entry} if entry else {},
                entry_point=entry,
                cases=tuple(cases),
                solution=row.get("solution"),
                source=str(path),
            )
        )
    if not tasks:
        raise DataError(f"{path}: the file holds no tasks.")
    return tasks


def _is_case(c: Any) -> bool:
    return isinstance(c, dict) and isinstance(c.get("stdin"), str) and isinstance(c.get("stdout"), str)


# --------------------------------------------------------------------------------------------------- helpers
def _read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    if not path.is_file():
        raise DataError(
            f"Task file not found: {path}. Set LRMGYM_SHARED_DATA to the folder holding the data sets, "
            "or pass source=<path to a .jsonl file>."
        )
    return iter_jsonl(path, DataError)


def _require(row: dict[str, Any], keys: tuple[str, ...], where: str) -> None:
    missing = [k for k in keys if k not in row]
    if missing:
        raise DataError(f"{where}: missing field(s) {', '.join(missing)}.")
