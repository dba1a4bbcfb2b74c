"""Code tasks from HumanEval, MBPP and generic JSONL files, as :class:`CodeTask` records.

A :class:`CodeTask` carries everything the sandbox needs: the prompt shown to the policy, the trusted code
prepended to a candidate (imports and helper functions of the prompt), and the tests split into units that
the harness evaluates one by one (each unit that contains an ``assert`` that can fail is one test; the others,
including a unit whose only asserts are tautologies such as HumanEval's ``assert True, "..."``, are setup).
A task without any test is refused (:class:`DataError`).

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
import builtins
import copy
import operator
import os
import re
import sys
import textwrap
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lrmgym.envs._jsonl import iter_jsonl

__all__ = [
    "CodeTask",
    "DataError",
    "default_data_dir",
    "defined_names",
    "failure_kind",
    "is_tautology",
    "load_humaneval",
    "load_jsonl",
    "load_mbpp",
    "mbpp_split",
    "shorten",
    "split_tests",
    "unit_inputs",
]

_STDLIB_MODULES = frozenset(n for n in sys.stdlib_module_names if not n.startswith("_"))
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
        hidden: Tests of the data set that the prompt does not show and ``units`` does not hold (MBPP's
            ``challenge_test_list``); :mod:`lrmgym.envs.code.heldout` grades on them.
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
    hidden: tuple[dict[str, Any], ...] = ()

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
    """Split assert-based test code into units, one per top-level statement.

    A unit is a test when it contains an ``assert`` that can fail; every other unit is setup. An assert that
    cannot fail (:func:`is_tautology`: ``assert True, "..."``, ``assert 1``, ``assert (f(x), "msg")``...)
    tests nothing: a unit whose asserts are all such is setup, like a unit without any assert (it is
    equivalent to one), so that a do-nothing solution does not earn it. Such a unit still runs; if
    evaluating it raises (``assert (candidate(1) or True)`` with a candidate that raises), the tests
    after it fail as after any failing setup.

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
        units.append({"src": _dedent_segment(src), "test": _can_fail(node)})
    return units


def _can_fail(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Assert) and not is_tautology(n.test) for n in ast.walk(node))


def is_tautology(expr: ast.expr) -> bool:
    """Whether ``expr`` is truthy whenever evaluating it finishes, as decided from its syntax alone.

    Covered (anything else counts as a real check):

    - a constant of a truthy value: ``True``, ``1``, ``"x"``, ``...``; ``-1``, ``+2`` (sign of a number);
    - a non-empty display: ``(x, "msg")`` (the classic parenthesized-assert bug), ``[x]``, ``{x}``,
      ``{k: v}`` (one element that is not ``*``/``**`` unpacking is enough);
    - a comparison of constants only, evaluated here: ``1 == 1``, ``"a" < "b"`` (not ``is``);
    - ``not`` of a known falsy expression: ``not 0``, ``not None``, ``not ()``, ``not []``;
    - ``a or b``: some operand is a tautology (``candidate(1) or True``); ``a and b``: all are;
    - ``x if c else y`` whose branches are both tautologies (or ``c`` is known and its branch is).

    An expression that references names or calls is covered only through these forms: it may still
    raise, but it cannot fail as an assert.
    """
    return _truth(expr) is True


_COMPARE = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_PLAIN = (bool, int, float, complex, str, bytes, type(None))


def _truth(expr: ast.expr) -> bool | None:
    """The truth value of ``expr`` when syntax alone decides it, else ``None``."""
    if isinstance(expr, ast.Constant):
        return bool(expr.value)
    if isinstance(expr, (ast.Tuple, ast.List, ast.Set)):
        if any(not isinstance(e, ast.Starred) for e in expr.elts):
            return True
        return False if not expr.elts else None
    if isinstance(expr, ast.Dict):
        if any(k is not None for k in expr.keys):  # a None key is ``**mapping`` unpacking
            return True
        return False if not expr.keys else None
    if isinstance(expr, ast.UnaryOp):
        if isinstance(expr.op, ast.Not):
            inner = _truth(expr.operand)
            return None if inner is None else not inner
        if isinstance(expr.op, (ast.USub, ast.UAdd)) and isinstance(expr.operand, ast.Constant):
            value = expr.operand.value
            return bool(value) if type(value) in (bool, int, float, complex) else None
        return None
    if isinstance(expr, ast.BoolOp):
        truths = [_truth(v) for v in expr.values]
        decisive = isinstance(expr.op, ast.Or)  # ``or``: one truthy operand decides; ``and``: one falsy one
        if decisive in truths:
            return decisive
        return (not decisive) if all(t is (not decisive) for t in truths) else None
    if isinstance(expr, ast.IfExp):
        test, body, orelse = _truth(expr.test), _truth(expr.body), _truth(expr.orelse)
        if test is not None:
            return body if test else orelse
        return body if body is not None and body == orelse else None
    if isinstance(expr, ast.Compare):
        operands = [expr.left, *expr.comparators]
        if not all(isinstance(o, ast.Constant) and type(o.value) in _PLAIN for o in operands):
            return None
        if not all(type(op) in _COMPARE for op in expr.ops):
            return None
        try:
            values = [o.value for o in operands]  # type: ignore[attr-defined]
            return all(_COMPARE[type(op)](a, b) for op, a, b in zip(expr.ops, values[:-1], values[1:], strict=True))
        except TypeError:  # "a" < 1 raises when run, so the assert can fail that way: a real check
            return None
    return None


def _dedent_segment(src: str) -> str:
    lines = src.splitlines()
    if not lines:
        return src
    pad = len(lines[0]) - len(lines[0].lstrip())
    if pad == 0:
        return src
    return "\n".join(line[pad:] if line[:pad].strip() == "" else line for line in lines)


# --------------------------------------------------------------------------------------------------- feedback
_WRAPPERS = frozenset(
    {"set", "frozenset", "sorted", "list", "tuple", "dict", "str", "int", "float", "bool", "len", "abs"}
)
"""Builtins that may wrap the tested call on the shown side of ``==`` (one argument: nothing else is shown)."""
_SHOWN_CHARS = 300  # longest input text shown for one call


def unit_inputs(
    src: str, bind: Mapping[str, str] | None = None, trusted: Iterable[str] = ()
) -> tuple[list[str], list[str]]:
    """What ``feedback="names"`` shows of one test unit: ``(checked, called)``, computed with ``ast``.

    ``checked``: for every ``assert <call> == <expected>`` (either side) whose tested side is a call of a
    solution function (a name that is neither a builtin, nor in ``trusted``, nor assigned by the unit), bare
    or inside one of ``set(...)``, ``sorted(...)``, ``len(...)``... (one argument), that side as source:
    the function and the arguments the test passes in, which the solution receives anyway. The other side
    (the expected value) is never included; neither is an ``==`` whose both sides call solution functions.
    ``called``: the non-builtin names the unit calls (``math.fabs``, ``poly``, ``has_close_elements``), for
    the other assert shapes, whose literals may be expected values (``abs(f(x) - 2.5) < 1e-6``,
    ``assert not f(x)``). In both, the aliases of ``bind`` are replaced (``candidate`` by the entry point).

    Args:
        src: The unit's source.
        bind: Aliases of the tests (``{"candidate": "has_close_elements"}``).
        trusted: Names the tests' setup defines (helpers, imports): calling them is not calling the solution.
    """
    bind = dict(bind or {})
    tree = parse_quietly(src)
    if tree is None:
        return [], []
    assigned = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    assigned |= {
        a.asname or a.name.partition(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    }
    trusted = (set(trusted) | assigned) - set(bind)

    def solution_call(e: ast.expr) -> bool:
        return (
            isinstance(e, ast.Call)
            and isinstance(e.func, ast.Name)
            and (e.func.id in bind or (e.func.id not in trusted and not hasattr(builtins, e.func.id)))
        )

    def calls_solution(e: ast.expr) -> bool:
        return any(solution_call(n) for n in ast.walk(e))  # type: ignore[arg-type]

    def tested(e: ast.expr) -> bool:
        while (
            isinstance(e, ast.Call)
            and isinstance(e.func, ast.Name)
            and e.func.id in _WRAPPERS
            and e.func.id not in trusted
            and len(e.args) == 1
            and not e.keywords
            and not solution_call(e)
        ):
            e = e.args[0]
        return solution_call(e)

    checked: list[str] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare)):
            continue
        test = node.test
        if len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
            continue
        left, right = test.left, test.comparators[0]
        for shown, other in ((left, right), (right, left)):
            if tested(shown) and not calls_solution(other):
                checked.append(shorten(ast.unparse(_Rename(bind).visit(copy.deepcopy(shown)))))
                break
    called: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name and not (hasattr(builtins, name) and name not in bind):
                name = bind.get(name, name)
                if name not in called:
                    called.append(name)
    return checked, called


class _Rename(ast.NodeTransformer):
    def __init__(self, names: Mapping[str, str]) -> None:
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.Name(id=self.names.get(node.id, node.id), ctx=node.ctx)


def _dotted(e: ast.expr) -> str | None:
    parts = []
    while isinstance(e, ast.Attribute):
        parts.append(e.attr)
        e = e.value
    if not isinstance(e, ast.Name):
        return None
    return ".".join([e.id, *reversed(parts)])


def shorten(text: str) -> str:
    """``text`` cut to the most characters feedback shows of one input."""
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def defined_names(code: str) -> set[str]:
    """Names that top-level ``code`` (a prelude) binds: functions, classes, imports, assignments."""
    tree = parse_quietly(code)
    if tree is None:
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(a.asname or a.name.partition(".")[0] for a in node.names)
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
    return names


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,59}")


def failure_kind(message: str) -> str:
    """The kind of a failed test from the harness's ``(passed, message)``, without any of the message's text.

    ``"AssertionError: ..."`` is ``"wrong answer"``; another exception is ``"error: ValueError"`` (a
    ``CandidateError`` wrapping a control-flow builtin the solution raised: ``"error: StopIteration (raised by
    your code)"``; one of the solution's own exception classes: ``"error: an exception (raised by your
    code)"``, never its name, which the solution chooses: a class named after the input it got would carry
    that input back); ``"setup failed: ..."`` and ``"not run (timeout)"`` keep their kind; ``"wrong output"``
    (stdio) stays. Only the part before the first ``:`` is read, and only a builtin exception's name is ever
    shown.
    """
    head, _, rest = (message or "").partition(":")
    head = head.strip()
    if head == "AssertionError":
        return "wrong answer"
    if head == "setup failed":
        return f"not run: the test setup failed ({failure_kind(rest.strip())})"
    status = re.fullmatch(r"not run \((\w{1,30})\)", head)
    if status:
        return f"not run ({status.group(1)})"
    if head == "wrong output":
        return head
    if head == "CandidateError":
        inner = rest.strip().partition(":")[0].strip()
        return f"error: {inner if _builtin_exception(inner) else 'an exception'} (raised by your code)"
    if _builtin_exception(head):
        return f"error: {head}"
    return "failed"


def _builtin_exception(name: str) -> bool:
    value = getattr(builtins, name, None) if _IDENTIFIER.fullmatch(name) else None
    return isinstance(value, type) and issubclass(value, BaseException)


# --------------------------------------------------------------------------------------------------- HumanEval
def load_humaneval(path: Path) -> list[CodeTask]:
    """Load the 164 HumanEval problems from ``HumanEval.jsonl.gz`` (or an uncompressed ``.jsonl``)."""
    tasks = []
    for lineno, row in _read_jsonl(path):
        where = f"{path}:{lineno}"
        _require(row, ("task_id", "prompt", "entry_point", "test"), where)
        _require_text(row, ("prompt", "entry_point", "test"), where)
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
    _require_a_test(units, where, "check(candidate)")
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
        _require_text(row, ("text", "code"), where)
        tests = row["test_list"]
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
            raise DataError(f"{where}: 'test_list' must be a non-empty list of assert strings.")
        units = [_joined(split_tests(t, f"{where} test {i}")) for i, t in enumerate(tests, 1)]
        _require_a_test(units, where, "test_list")
        challenge = row.get("challenge_test_list") or []
        if not isinstance(challenge, list) or not all(isinstance(t, str) for t in challenge):
            raise DataError(f"{where}: 'challenge_test_list' must be a list of assert strings.")
        hidden = [_joined(split_tests(t, f"{where} challenge test {i}")) for i, t in enumerate(challenge, 1)]
        text = row["text"].strip() + "\nYour code should pass these tests:\n" + "\n".join(tests)
        tasks.append(
            CodeTask(
                id=f"mbpp/{row['task_id']}",
                text=text,
                units=tuple(units),
                prelude=_reference_imports(row["code"], units, row.get("test_setup_code") or "")
                + (row.get("test_setup_code") or ""),
                bind=_builtin_named_entries(row["code"], units),
                solution=row["code"].replace("\r\n", "\n"),
                source="mbpp",
                hidden=tuple(hidden),
            )
        )
    return tasks


def _builtin_named_entries(reference: str, units: list[dict[str, Any]]) -> dict[str, str]:
    """Entry points named like a builtin (MBPP 126 defines ``sum``) or a module, bound explicitly for the tests.

    The harness gives the tests the real builtins, imports the standard-library modules they name, and takes
    from the candidate only the other names the tests use; a task whose function under test *is* named like
    a builtin or a module says so here, from its reference solution, never from the candidate's code.
    """
    tree = parse_quietly(reference.replace("\r\n", "\n"))
    if tree is None:
        return {}
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    used = _loaded_names(units)
    return {name: name for name in sorted(defined & used) if hasattr(builtins, name) or name in _STDLIB_MODULES}


def _reference_imports(reference: str | None, units: Iterable[dict[str, Any]], setup: str = "") -> str:
    """The reference's top-level imports of names the tests use (``Counter``, ``np``), as trusted setup code.

    Without it such a name is free in the tests and would be taken from the candidate (a ``Counter`` that
    returns what the solution returns makes ``f(x) == Counter(...)`` always true). The imports run in the
    harness, before the task's own setup.
    """
    tree = parse_quietly((reference or "").replace("\r\n", "\n"))
    if tree is None:
        return ""
    used = _loaded_names(units) - defined_names(setup)
    lines = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not (isinstance(node, ast.ImportFrom) and node.level):
            names = [a for a in node.names if a.name != "*" and (a.asname or a.name.partition(".")[0]) in used]
            if names:
                node = copy.copy(node)
                node.names = names
                lines.append(ast.unparse(node))
    return "".join(line + "\n" for line in lines)


def _loaded_names(units: Iterable[dict[str, Any]]) -> set[str]:
    used: set[str] = set()
    for unit in units:
        unit_tree = parse_quietly(unit["src"])
        if unit_tree is not None:
            used |= {n.id for n in ast.walk(unit_tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return used


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
        _require_text(row, ("prompt",), where)
        for name in ("id", "entry_point", "setup", "solution"):
            if row.get(name) is not None and not isinstance(row[name], (str, int) if name == "id" else str):
                raise DataError(f"{where}: '{name}' must be {'a string or a number' if name == 'id' else 'a string'}.")
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
                units = [_joined(split_tests(t, where)) for t in tests]
            else:
                raise DataError(f"{where}: 'tests' must be a string of assert code or a list of such strings.")
            _require_a_test(units, where, "'tests'")
        else:
            stdio = row["stdio"]
            if not isinstance(stdio, list) or not stdio or not all(_is_case(c) for c in stdio):
                raise DataError(
                    f'{where}: \'stdio\' must be a non-empty list of {{"stdin": str, "stdout": str}} objects.'
                )
            cases = [{"stdin": c["stdin"], "stdout": c["stdout"]} for c in stdio]
        entry = row.get("entry_point")
        bind = _builtin_named_entries(row.get("solution") or "", units)
        tasks.append(
            CodeTask(
                id=str(row.get("id", f"{path.stem}/{lineno - 1}")),
                text=row["prompt"],
                units=tuple(units),
                prelude=_reference_imports(row.get("solution"), units, row.get("setup") or "")
                + (row.get("setup") or ""),
                bind={**bind, "candidate": entry} if entry else bind,
                entry_point=entry,
                cases=tuple(cases),
                solution=row.get("solution"),
                source=str(path),
            )
        )
    return tasks


def _joined(split: list[dict[str, Any]]) -> dict[str, Any]:
    """One unit from one test string (MBPP, a JSONL list item): a test when any of its statements is."""
    return {"src": "\n".join(u["src"] for u in split), "test": any(u["test"] for u in split)}


def _require_a_test(units: list[dict[str, Any]], where: str, what: str) -> None:
    """Refuse a task whose tests cannot fail: it would pay any answer."""
    if any(u["test"] for u in units):
        return
    if not any(isinstance(n, ast.Assert) for u in units for n in ast.walk(ast.parse(u["src"]))):
        raise DataError(f"{where}: {what} contains no assert statement, so nothing could fail.")
    raise DataError(
        f"{where}: {what} contains only asserts that cannot fail (such as `assert True`), so nothing could "
        "fail; give at least one assert that checks the solution."
    )


def _is_case(c: Any) -> bool:
    return isinstance(c, dict) and isinstance(c.get("stdin"), str) and isinstance(c.get("stdout"), str)


# --------------------------------------------------------------------------------------------------- helpers
def _read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    if not path.exists():
        raise DataError(
            f"Task file not found: {path}. Set LRMGYM_SHARED_DATA to the folder holding the data sets, "
            "or pass source=<path to a .jsonl file>."
        )
    return iter_jsonl(path, DataError)


def _require(row: dict[str, Any], keys: tuple[str, ...], where: str) -> None:
    missing = [k for k in keys if k not in row]
    if missing:
        raise DataError(f"{where}: missing field(s) {', '.join(missing)}; it has {', '.join(sorted(row)) or 'none'}.")


def _require_text(row: dict[str, Any], keys: tuple[str, ...], where: str) -> None:
    """Refuse a field that is not a non-empty string (``null``, a number, a list...)."""
    for key in keys:
        value = row[key]
        if not isinstance(value, str) or not value.strip():
            shown = "null" if value is None else "empty" if isinstance(value, str) else type(value).__name__
            raise DataError(f"{where}: field {key!r} is {shown}; expected a non-empty string.")
