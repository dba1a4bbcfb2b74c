"""Held-out tests: grade HumanEval and MBPP on tests the prompt does not show.

MBPP's prompt lists the very asserts the data set grades, and HumanEval's docstring shows some of its tests
as examples, so a program that looks its answers up in a table of the shown calls was paid in full (MBPP
0.996) or in part (HumanEval 0.224). :func:`graded_tasks` replaces each task's graded tests by:

- the data set's own tests that the prompt does not show: MBPP's ``challenge_test_list`` (``CodeTask.hidden``);
  HumanEval's ``check`` asserts whose call does not appear in the prompt (:func:`shown_calls`);
- up to :data:`HELDOUT_TESTS` generated tests: new inputs derived from the inputs of the task's own asserts by
  type-aware perturbation (ints moved by small deltas, strings and lists mutated, shuffled, truncated, every
  type kept), whose expected values come from running the **reference solution in the sandbox**. An input is
  dropped when the reference raises on it, runs past :data:`CALL_LIMIT_S`, returns a value that is not a plain
  literal, or returns a different value in a second run (a fresh process: set order of strings differs);
  the inputs kept are picked for distinct expected values (:func:`spread`). A last run grades the reference
  itself on the result and drops any hidden test it fails.

The tests are then joined in twos whose expected values differ (:func:`bundle`), one graded unit each, so that an
answer that ignores its input (a constant, a table of the shown tests with a default) passes none of them: on a
boolean task a constant would otherwise pass about half of the tests. ``benchmarks/code_lookup.py`` measures
what such answers earn before and after (``benchmarks/results/code_lookup.md``).

Generation is deterministic (the inputs are drawn from a generator seeded by a hash of the task) and runs
once per task: the tests are cached under ``$XDG_CACHE_HOME/lrmgym/code_heldout/`` (default ``~/.cache``), one
file per task named by a hash of the task's content and of :data:`GENERATOR`, so an env built for training
reads them back and never regenerates per reset. The data set's text is not copied there, only generated
test code.

A task left with no hidden test at all (no literal-argument assert to derive inputs from, every candidate
input rejected, and no hidden original test) cannot be graded without paying a lookup table of the shown
tests: :func:`graded_tasks` drops it from the task list (and says how many it dropped).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import hashlib
import json
import logging
import operator
import os
import re
import tempfile
import time
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from lrmgym.envs.code.loaders import CodeTask, parse_quietly
from lrmgym.envs.code.sandbox import Job, Limits, SandboxPool, entry_points

__all__ = [
    "CALL_LIMIT_S",
    "GENERATOR",
    "HELDOUT_TESTS",
    "Generated",
    "bundle",
    "cache_root",
    "graded_tasks",
    "shown_calls",
    "spread",
]

log = logging.getLogger("lrmgym.code.heldout")
T = TypeVar("T")

GENERATOR = 3
"""Version of the generation recipe; part of the cache key (bump it when the recipe changes)."""
HELDOUT_TESTS = 8
"""Most generated tests per task."""
_CANDIDATES = 24  # perturbed inputs tried per task
CALL_LIMIT_S = 0.5
"""Longest the reference may take on one generated input."""
_MAX_REPR = 4000  # longest expected value kept, in characters of its repr
_MARK = "\x00lrm-heldout "
_CLOSE = "_heldout_close"
_CLOSE_SRC = f'''
def {_CLOSE}(a, b):
    """Equality that lets floats differ in their last digits (generated tests only)."""
    if type(b) is float:
        return type(a) in (int, float) and abs(a - b) <= 1e-9 + 1e-6 * abs(b)
    if type(b) in (list, tuple):
        return type(a) is type(b) and len(a) == len(b) and all({_CLOSE}(x, y) for x, y in zip(a, b))
    if type(b) is dict:
        return type(a) is dict and a.keys() == b.keys() and all({_CLOSE}(a[k], b[k]) for k in b)
    return a == b
'''


@dataclasses.dataclass(frozen=True)
class Generated:
    """What generation produced for one task (cached as JSON).

    Attributes:
        units: The graded tests: hidden originals first, then generated asserts.
        prelude: Trusted setup to add to the task's own (the float-tolerant comparison, when used).
        generated: How many of ``units`` were generated.
        dropped: Generated or hidden tests the reference itself failed in the check run.
    """

    units: tuple[dict[str, Any], ...]
    prelude: str = ""
    generated: int = 0
    dropped: int = 0


# --------------------------------------------------------------------------------------------------- sites
@dataclasses.dataclass(frozen=True)
class _Site:
    """One assert of the task whose tested call has literal arguments: the template of new tests."""

    tested: ast.expr  # the side of ``==`` that holds the call, or the call itself (truth asserts)
    call: ast.Call
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]
    truth: bool  # ``assert f(x)`` / ``assert not f(x)`` / ``f(x) is True``: only the truth value is checked


def _solution_names(task: CodeTask) -> set[str]:
    names = set(task.bind)
    names |= set(entry_points([u["src"] for u in task.units], task.prelude, task.bind))
    return names


def _literal(node: ast.expr) -> tuple[bool, Any]:
    """``(True, value)`` for a literal, or arithmetic on number literals (``1.0/3``); else ``(False, None)``."""
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    try:
        return True, _arithmetic(node)
    except (ValueError, TypeError, ArithmeticError, RecursionError):
        return False, None


_ARITHMETIC = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def _arithmetic(node: ast.expr) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _arithmetic(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        left, right = _arithmetic(node.left), _arithmetic(node.right)
        if max(abs(left), abs(right)) > 1e18:
            raise ValueError("too large")
        return _ARITHMETIC[type(node.op)](left, right)
    raise ValueError("not arithmetic on number literals")


def _sites(task: CodeTask, units: Sequence[dict[str, Any]]) -> list[_Site]:
    names = _solution_names(task)

    def is_call(e: ast.AST) -> bool:
        return isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id in names

    def one_call(e: ast.expr) -> ast.Call | None:
        calls = [n for n in ast.walk(e) if is_call(n)]
        return calls[0] if len(calls) == 1 else None  # type: ignore[return-value]

    sites = []
    for unit in units:
        tree = parse_quietly(unit["src"])
        if tree is None or not unit.get("test"):
            continue
        for node in tree.body:
            if not isinstance(node, ast.Assert):
                continue
            test, tested, truth = node.test, None, False
            if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
                left, right = test.left, test.comparators[0]
                for side, other in ((left, right), (right, left)):
                    if one_call(side) is not None and not any(is_call(n) for n in ast.walk(other)):
                        tested = side
                        break
            elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and is_call(test.operand):
                tested, truth = test.operand, True
            elif is_call(test):
                tested, truth = test, True
            elif (
                isinstance(test, ast.Compare)
                and len(test.ops) == 1
                and isinstance(test.ops[0], ast.Is)
                and is_call(test.left)
                and isinstance(test.comparators[0], ast.Constant)
                and type(test.comparators[0].value) is bool
            ):
                tested, truth = test.left, True
            if tested is None:
                continue
            call = one_call(tested)
            assert call is not None
            if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
                continue
            values = [_literal(a) for a in call.args]
            kw_values = [(k.arg, _literal(k.value)) for k in call.keywords]
            if not all(ok for ok, _ in values) or not all(ok for _, (ok, _) in kw_values):
                continue
            sites.append(
                _Site(
                    tested=tested,
                    call=call,
                    args=tuple(v for _, v in values),
                    kwargs=tuple((k, v) for k, (_, v) in kw_values),
                    truth=truth,
                )
            )
    return sites


def _key(args: tuple[Any, ...], kwargs: tuple[tuple[str, Any], ...]) -> str:
    return repr((args, kwargs))


# --------------------------------------------------------------------------------------------------- inputs
def _perturb(v: Any, rng: np.random.Generator, depth: int = 0) -> Any:
    """A value of the same type near ``v`` (same element types for containers)."""
    t = type(v)
    if t is bool:
        return not v
    if t is int:
        if abs(v) > 20 and rng.random() < 0.5:
            step = int(rng.integers(1, max(2, abs(v) // 4)))
        else:
            step = int(rng.integers(1, 4))
        new = v + step if rng.random() < 0.5 else v - step
        return new if (v < 0) == (new < 0) or v < 0 else v + step  # a non-negative input stays non-negative
    if t is float:
        new = v + float(rng.uniform(-0.5, 0.5)) * max(1.0, abs(v))
        return round(abs(new) if v >= 0 else new, 3)
    if t is str:
        return _perturb_str(v, rng)
    if t in (list, tuple):
        return t(_perturb_seq(list(v), rng, depth))
    if t in (set, frozenset):
        items = sorted(v, key=repr)
        return t(_perturb_seq(items, rng, depth, reorder=False))
    if t is dict:
        out = dict(v)
        for k in list(out):
            if rng.random() < 0.5:
                out[k] = _perturb(out[k], rng, depth + 1)
        return out
    return v


def _perturb_str(s: str, rng: np.random.Generator) -> str:
    chars = list(s)
    if not chars:
        return "abcdefghijklmnopqrstuvwxyz"[int(rng.integers(26))]
    for _ in range(int(rng.integers(1, 3))):
        if not chars:
            break
        i = int(rng.integers(len(chars)))
        op = int(rng.integers(5))
        if op == 0:  # replace by a character of the same class
            c = chars[i]
            pool = (
                "abcdefghijklmnopqrstuvwxyz"
                if c.islower()
                else "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                if c.isupper()
                else "0123456789"
                if c.isdigit()
                else c
            )
            chars[i] = pool[int(rng.integers(len(pool)))]
        elif op == 1 and len(chars) > 1:
            del chars[i]
        elif op == 2:
            chars.insert(i, chars[i])
        elif op == 3 and len(chars) > 1:
            j = int(rng.integers(len(chars)))
            chars[i], chars[j] = chars[j], chars[i]
        else:
            words = "".join(chars).split(" ")
            if len(words) > 1:
                rng.shuffle(words)
                chars = list(" ".join(words))
            else:
                chars = chars[::-1]
    return "".join(chars)


def _perturb_seq(items: list[Any], rng: np.random.Generator, depth: int, reorder: bool = True) -> list[Any]:
    if not items:
        return items
    op = int(rng.integers(4))
    if op == 0 or depth > 2:
        items = [_perturb(x, rng, depth + 1) if rng.random() < 0.4 else x for x in items]
    elif op == 1 and reorder:
        rng.shuffle(items)
    elif op == 2 and len(items) > 1:
        del items[int(rng.integers(len(items)))]
    else:
        items.append(_perturb(items[int(rng.integers(len(items)))], rng, depth + 1))
    if rng.random() < 0.5:
        i = int(rng.integers(len(items)))
        items[i] = _perturb(items[i], rng, depth + 1)
    return items


def _candidates(task: CodeTask, sites: list[_Site], avoid: set[str]) -> list[tuple[_Site, str]]:
    """Up to ``_CANDIDATES`` new tested expressions (with the site they come from), deterministic per task."""
    seed = int.from_bytes(hashlib.sha256(f"{GENERATOR}:{task.id}:{task.solution}".encode()).digest()[:8], "big")
    rng = np.random.default_rng(seed)
    out: list[tuple[_Site, str]] = []
    seen = set(avoid)
    for attempt in range(_CANDIDATES * 3):
        if len(out) >= _CANDIDATES:
            break
        site = sites[attempt % len(sites)]
        args = list(site.args)
        kwargs = dict(site.kwargs)
        slots = [("a", i) for i in range(len(args))] + [("k", k) for k in kwargs]
        if not slots:
            break
        changed = [s for s in slots if rng.random() < 0.6] or [slots[int(rng.integers(len(slots)))]]
        for kind, where in changed:
            if kind == "a":
                args[where] = _perturb(args[where], rng)  # type: ignore[index]
            else:
                kwargs[where] = _perturb(kwargs[where], rng)  # type: ignore[index]
        key = _key(tuple(args), tuple(kwargs.items()))
        if key in seen:
            continue
        seen.add(key)
        call = copy.deepcopy(site.call)
        try:
            call.args = [ast.parse(repr(a), mode="eval").body for a in args]
            call.keywords = [ast.keyword(arg=k, value=ast.parse(repr(v), mode="eval").body) for k, v in kwargs.items()]
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        out.append((site, ast.unparse(_Replace(site.call, call).visit(copy.deepcopy(site.tested)))))
    return out


class _Replace(ast.NodeTransformer):
    """Replace the node equal (by dump) to ``old`` by ``new``."""

    def __init__(self, old: ast.Call, new: ast.Call) -> None:
        self.old, self.new = ast.dump(old), new

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if ast.dump(node) == self.old:
            return self.new
        return self.generic_visit(node)


# --------------------------------------------------------------------------------------------------- driver
_DRIVER = """

def _lrm_heldout(exprs, bind, prelude, limit, mark, max_repr):
    import ast, io, signal, sys
    g = globals()
    for alias, name in bind.items():
        if name in g:
            g[alias] = g[name]
    out = sys.stdout
    sys.stdout = io.StringIO()
    try:
        exec(prelude, g)
    except BaseException:
        pass

    def same(a, b):
        if type(a) is not type(b):
            return False
        if type(a) in (list, tuple):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        if type(a) is dict:
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if type(a) is float and a != a:
            return False
        return a == b

    def plain(v, depth=0):
        # A subclass of a builtin type (Counter, OrderedDict, defaultdict, a namedtuple, an IntEnum) as its base
        # value: the candidate's value compares equal to it exactly when it does to the subclass.
        if depth > 50 or type(v) in (bool, type(None)):
            return v
        for base in (int, float, complex, str, bytes):
            if isinstance(v, base):
                return base(v) if type(v) is not base else v
        if isinstance(v, dict):
            return {plain(k, depth + 1): plain(x, depth + 1) for k, x in v.items()}
        for base in (list, tuple, set, frozenset):
            if isinstance(v, base):
                return base(plain(x, depth + 1) for x in v)
        return v

    def alarm(*args):
        raise TimeoutError("held-out input over its time limit")

    signal.signal(signal.SIGALRM, alarm)
    for i, (src, truth) in enumerate(exprs):
        try:
            signal.setitimer(signal.ITIMER_REAL, limit)
            try:
                value = eval(src, g)
                value = bool(value) if truth else plain(value)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            text = repr(value)
            if len(text) <= max_repr and same(ast.literal_eval(text), value):
                out.write(mark + str(i) + " " + text + "\\n")
        except BaseException:
            pass
        sys.stdout = io.StringIO()
    out.flush()
"""


def _driver_program(task: CodeTask, exprs: list[tuple[str, bool]]) -> str:
    assert task.solution is not None
    program = task.solution if task.stub else task.program(task.solution)
    call = f"_lrm_heldout({exprs!r}, {dict(task.bind)!r}, {task.prelude!r}, {CALL_LIMIT_S!r}, {_MARK!r}, {_MAX_REPR})"
    return f"{program}\n{_DRIVER}\n{call}\n"


def _values(output: str) -> dict[int, str]:
    values = {}
    for line in output.split("\n"):
        if line.startswith(_MARK):
            index, _, text = line[len(_MARK) :].partition(" ")
            if index.isdigit():
                values[int(index)] = text
    return values


# --------------------------------------------------------------------------------------------------- shown tests
def shown_calls(task: CodeTask) -> set[str]:
    """The argument lists of the calls of the entry point written in the prompt (its docstring examples)."""
    if not task.entry_point:
        return set()
    shown = set()
    text = task.text
    for match in re.finditer(rf"(?<![\w.]){re.escape(task.entry_point)}\(", text):
        start = match.end()
        depth, i = 1, start
        while i < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        if depth:
            continue
        tree = parse_quietly(f"_f({text[start : i - 1]})")
        if tree is None or not isinstance(getattr(tree.body[0], "value", None), ast.Call):
            continue
        call = tree.body[0].value  # type: ignore[attr-defined]
        values = [_literal(a) for a in call.args]
        kw = [(k.arg, _literal(k.value)) for k in call.keywords]
        if all(ok for ok, _ in values) and all(ok for _, (ok, _) in kw):
            shown.add(_key(tuple(v for _, v in values), tuple((k, v) for k, (_, v) in kw)))
    return shown


def _split_shown(task: CodeTask) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(shown, hidden)`` original tests.

    MBPP's prompt shows every test of ``units``; HumanEval's shows those whose call is written in the docstring.
    Setup units stay with the hidden ones, in order.
    """
    if task.source == "mbpp":
        return list(task.units), list(task.hidden)
    calls = shown_calls(task)
    shown, hidden = [], []
    for unit in task.units:
        sites = _sites(task, [unit]) if unit["test"] else []
        if sites and all(_key(s.args, s.kwargs) in calls for s in sites):
            shown.append(unit)
        else:
            hidden.append(unit)
    return shown, [*hidden, *task.hidden]


# --------------------------------------------------------------------------------------------------- cache
def cache_root() -> Path:
    """``$XDG_CACHE_HOME/lrmgym/code_heldout`` (``~/.cache/lrmgym/code_heldout`` when unset or empty)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lrmgym" / "code_heldout"


def _cache_key(task: CodeTask) -> str:
    fields = dataclasses.asdict(task)
    blob = json.dumps({"generator": GENERATOR, "task": fields}, sort_keys=True, default=repr)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _read_cache(path: Path) -> Generated | None:
    try:
        data = json.loads(path.read_text())
        units = tuple({"src": str(u["src"]), "test": bool(u["test"])} for u in data["units"])
        return Generated(units, str(data["prelude"]), int(data["generated"]), int(data["dropped"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cache(path: Path, generated: Generated) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            json.dump(dataclasses.asdict(generated), f)
        os.replace(tmp, path)
    except OSError as exc:  # a read-only cache only costs a regeneration next time
        log.warning("could not cache held-out tests in %s: %s", path.parent, exc)


# --------------------------------------------------------------------------------------------------- generation
def _generate(tasks: list[CodeTask], pool: SandboxPool) -> list[Generated]:
    """Generate for ``tasks`` at once: two reference runs over the candidates, then one check run."""
    plans = []
    for task in tasks:
        shown, hidden = _split_shown(task)
        sites = _sites(task, [*shown, *hidden])
        avoid = {_key(s.args, s.kwargs) for s in sites} | shown_calls(task)
        cands = _candidates(task, sites, avoid) if sites and task.solution else []
        plans.append((task, hidden, cands))
    limits = Limits(timeout_s=CALL_LIMIT_S * _CANDIDATES + 5.0, memory_mb=pool.limits.memory_mb)
    jobs = [
        Job(code=_driver_program(task, [(src, site.truth) for site, src in cands]), units=(), entry=())
        for task, _, cands in plans
        if cands
    ]
    runs = [pool.run_many(jobs, limits), pool.run_many(jobs, limits)]
    outputs = iter(zip(*runs, strict=True))
    drafts = []
    for task, hidden, cands in plans:
        units = [(dict(u), _expected_key(task, u)) for u in hidden]  # each with the key of its expected value
        prelude = ""
        if cands:
            first, second = next(outputs)
            a, b = _values(first.output), _values(second.output)
            kept = [(cands[i], a[i]) for i in sorted(a) if i in b and _same_value(a[i], b[i])]
            for (site, src), value in spread(kept, HELDOUT_TESTS, lambda item: item[1]):
                if site.truth:
                    test = f"assert {src}" if value == "True" else f"assert not {src}"
                elif _has_float(ast.literal_eval(value)):
                    test = f"assert {_CLOSE}({src}, {value})"
                    prelude = _CLOSE_SRC
                else:
                    test = f"assert {src} == {value}"
                units.append(({"src": test, "test": True, "generated": True}, value))
        drafts.append((task, units, prelude))
    # The check run: the reference graded on the draft; a test it fails (a flaky value) is dropped.
    check = [
        Job(
            code=_reference_program(task),
            units=tuple({"src": u["src"], "test": u["test"]} for u, _ in units),
            prelude=task.prelude + prelude,
            bind=dict(task.bind),
        )
        for task, units, prelude in drafts
    ]
    results = iter(pool.run_many([j for j in check if j.n_tests], pool.limits))
    out = []
    for (_, units, prelude), job in zip(drafts, check, strict=True):
        if not job.n_tests:
            out.append(Generated((), "", 0, 0))
            continue
        result = next(results)
        verdicts = iter(result.results if result.status == "ok" else [(False, "")] * job.n_tests)
        kept, dropped = [], 0
        for unit, key in units:
            if unit["test"] and not next(verdicts, (False, ""))[0]:
                dropped += 1
            else:
                kept.append((unit, key))
        n_generated = sum(1 for u, _ in kept if u.get("generated"))
        bundled = _bundle(kept) if any(u["test"] for u, _ in kept) else []
        out.append(Generated(tuple(bundled), prelude if bundled else "", n_generated, dropped))
    return out


def _expected_key(task: CodeTask, unit: dict[str, Any]) -> str | None:
    """The repr of the expected value of an original test ``assert <call> == <literal>`` (or a truth assert).

    ``None`` when the unit is setup or of any other shape.
    """
    if not unit["test"]:
        return None
    tree = parse_quietly(unit["src"])
    sites = _sites(task, [unit])
    if tree is None or len(sites) != 1 or len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        return None
    test = tree.body[0].test
    if sites[0].truth:
        if isinstance(test, ast.Compare):  # f(x) is True / is False
            return repr(bool(test.comparators[0].value))  # type: ignore[attr-defined]
        return repr(not isinstance(test, ast.UnaryOp))
    assert isinstance(test, ast.Compare)
    tested = ast.dump(sites[0].tested)
    other = test.comparators[0] if ast.dump(test.left) == tested else test.left
    ok, value = _literal(other)
    return repr(value) if ok else None


def _same_value(a: str, b: str) -> bool:
    """Whether two reprs of a value are one value for ``==`` (a set of strings prints in a per-process order)."""
    return a == b or repr(_canon(ast.literal_eval(a))) == repr(_canon(ast.literal_eval(b)))


def _canon(v: Any) -> Any:
    """A form of a literal in which values that ``==`` says are equal look equal (``True``, ``1``, ``1.0``)."""
    if type(v) in (bool, int) or (type(v) is float and v.is_integer()):
        return ("number", int(v))
    if type(v) in (list, tuple):
        return (type(v).__name__, tuple(_canon(x) for x in v))
    if type(v) in (set, frozenset):
        return ("set", tuple(sorted(repr(_canon(x)) for x in v)))
    if type(v) is dict:
        return ("dict", tuple(sorted((repr(_canon(k)), repr(_canon(x))) for k, x in v.items())))
    return v


def _bundle(kept: list[tuple[dict[str, Any], str | None]]) -> list[dict[str, Any]]:
    """The graded units of a task's kept tests (see :func:`bundle`).

    With any setup unit among them the order matters and nothing is joined.
    """
    if any(not u["test"] for u, _ in kept):
        return [{"src": u["src"], "test": u["test"]} for u, _ in kept]
    return [{"src": src, "test": True} for src in bundle([(u["src"], key) for u, key in kept])]


def bundle(tests: Sequence[tuple[str, str | None]]) -> list[str]:
    """Join tests ``(source, repr of its expected value or None)`` into graded units of two different answers.

    Two tests per unit whose expected values differ (by ``==``: ``True``, ``1`` and ``1.0`` are one value), so that
    an answer that ignores its input, such as a constant, passes none of them. Tests of unknown value stay one per
    unit; the tests left over when only one value remains join the pairs in turn (or stay single when there is no
    pair).
    """
    groups: dict[str, list[str]] = {}
    singles: list[str] = []
    for src, key in tests:
        if key is None:
            singles.append(src)
        else:
            groups.setdefault(repr(_canon(ast.literal_eval(key))), []).append(src)
    pairs: list[list[str]] = []
    while sum(1 for g in groups.values() if g) >= 2:
        first, second = sorted((g for g in groups.values() if g), key=len, reverse=True)[:2]
        pairs.append([first.pop(0), second.pop(0)])
    rest = [src for g in groups.values() for src in g]  # all with one expected value
    for i, src in enumerate(rest):
        if pairs:
            pairs[i % len(pairs)].append(src)
        else:
            singles.append(src)
    return singles + ["\n".join(p) for p in pairs]


def _reference_program(task: CodeTask) -> str:
    assert task.solution is not None
    return task.solution if task.stub else task.program(task.solution)


def _has_float(v: Any) -> bool:
    if type(v) is float:
        return True
    if type(v) in (list, tuple, set, frozenset):
        return any(_has_float(x) for x in v)
    if type(v) is dict:
        return any(_has_float(x) for x in v.values())
    return False


def spread(items: Sequence[T], n: int, value: Callable[[T], Hashable]) -> list[T]:
    """Up to ``n`` of ``items``, spread over as many distinct ``value(item)`` as possible, in their original order.

    Round-robin over the values in order of first appearance: a constant answer then passes as few of them as the
    values allow.
    """
    groups: dict[Hashable, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(value(item), []).append(i)
    chosen: list[int] = []
    depth = 0
    while len(chosen) < n and any(len(g) > depth for g in groups.values()):
        for g in groups.values():
            if len(g) > depth and len(chosen) < n:
                chosen.append(g[depth])
        depth += 1
    return [items[i] for i in sorted(chosen)]


def graded_tasks(
    tasks: Sequence[CodeTask],
    pool_factory: Callable[[], SandboxPool],
    cache: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[CodeTask]:
    """``tasks`` graded on hidden tests only: hidden originals plus generated tests (see the module docstring).

    Tasks without a reference solution or in stdio mode keep their tests. Cached tasks are read back; the
    others are generated at once on a pool made by ``pool_factory`` (only when needed), then cached. Tasks left
    with no hidden test are dropped.
    """
    root = cache or cache_root()
    found: dict[int, Generated] = {}
    todo = []
    for i, task in enumerate(tasks):
        if task.mode != "call" or not task.solution:
            continue
        hit = _read_cache(root / f"{_cache_key(task)}.json")
        if hit is not None:
            found[i] = hit
        else:
            todo.append(i)
    if todo:
        start = time.monotonic()
        if len(todo) >= 50:
            log.warning("generating held-out tests for %d tasks (once: cached under %s)", len(todo), root)
        pool = pool_factory()
        try:
            for i, generated in zip(todo, _generate([tasks[i] for i in todo], pool), strict=True):
                found[i] = generated
                _write_cache(root / f"{_cache_key(tasks[i])}.json", generated)
        finally:
            pool.close()
        message = f"generated held-out tests for {len(todo)} tasks in {time.monotonic() - start:.1f} s"
        log.info(message)
        if progress is not None:
            progress(message)
    out = []
    dropped = []
    for i, task in enumerate(tasks):
        if i not in found:
            out.append(task)
        elif found[i].units:
            g = found[i]
            out.append(dataclasses.replace(task, units=g.units, prelude=task.prelude + g.prelude, hidden=()))
        else:
            dropped.append(task.id)
    if dropped:
        log.warning(
            "dropped %d task(s) with no hidden test (no held-out input could be generated): %s",
            len(dropped),
            ", ".join(dropped[:10]) + (" ..." if len(dropped) > 10 else ""),
        )
    return out
