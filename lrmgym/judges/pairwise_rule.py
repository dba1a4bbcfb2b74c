"""A rule-based pairwise judge for arithmetic traces: a CPU stand-in for an LLM judge.

The Reasoning Arena uses an LLM judge (DeepSeekMath-V2 in the paper). For the tiny model on a CPU there is
no such judge, so this one compares two traces with checkable rules, in order, the first rule that
separates them deciding:

1. ``arithmetic``: the trace with more verified work wins. A step is a written equation such as ``93+13=106``
   or ``12*(3+4)=84``; its left side is evaluated with exact fractions and compared with the right side. A
   correct step counts as work only when it is *grounded* (every number on its left side is a number of the
   problem or the result of an earlier counted step) and new (an equation written again counts once). Traces
   are ranked by the correct steps written before their first wrong step (a later first error is better),
   then by all their correct steps, then a trace with work and no wrong step beats one with a wrong step.
   Writing nothing earns nothing: an empty or step-free trace ranks with the traces that have no correct
   work (level with an all-wrong trace, below any trace with one correct step), and the later rules decide.
   ``first_error`` (an alternative to ``arithmetic``, selectable by ``criteria``) compares only where the first
   wrong step comes: its position is the number of verified steps written before it, and a later first error
   wins; a trace with some verified work and no wrong step beats any trace with one, however late; a trace that
   wrote no verified work and no wrong step ranks lowest (so here, unlike ``arithmetic``, a first-step error beats
   nothing). Two error-free traces tie on it, as do two traces whose first errors sit at the same position. A
   slip the trace caught itself (the testbed's ``12-3=8;chk 8+3=11 no;12-3=9``) is still an error at its
   position: the rule does not take the model's own ``no`` on trust, so a trace that never slipped ranks above
   one that slipped and recovered.
2. ``distance``: the trace whose final ``<answer>`` is numerically nearer the reference wins (a numeric
   answer beats a missing or non-numeric one).
3. ``format``: the trace with the strict answer format (one ``<think>`` then one ``<answer>``, nothing after)
   wins.

Otherwise it is a tie. It is a stand-in, not a model of reasoning quality: it sees only arithmetic work,
closeness and format (a step that needs a constant the problem does not state, such as ``x 100`` for a
percentage, is not counted). It never raises: texts are scanned in linear time, numbers are capped at 30 digits,
and at most 200 equations are checked per trace.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from fractions import Fraction
from typing import Literal, NamedTuple

from pydantic import Field

from lrmgym.core import Completion, Task
from lrmgym.judges.base import JudgeConfigBase, PairwiseAsJudge, prompt_text
from lrmgym.judges.rule import FormatJudge

__all__ = [
    "RulePairwiseJudge",
    "RulePairwiseJudgeConfig",
    "TraceFacts",
    "check_steps",
    "first_error_rank",
    "problem_numbers",
    "trace_facts",
    "verified_work",
]

Criterion = Literal["arithmetic", "first_error", "distance", "format"]
CRITERIA: tuple[str, ...] = ("arithmetic", "first_error", "distance", "format")

_NUM = r"\d{1,30}(?:\.\d{1,30})?"
_RHS = re.compile(rf"\s*(-?{_NUM})(?![\d.])")
_LHS_CHARS = frozenset("0123456789.+-*/×÷() ")
_MAX_LHS = 200
_TOKEN = re.compile(rf"\s*(?:({_NUM})|(.))")
_MAX_TEXT = 50_000
_MAX_STEPS = 200
_OPS = {"+": 1, "-": 1, "*": 2, "/": 2, "×": 2, "÷": 2}


def _evaluate(expr: str) -> Fraction | None:
    """Evaluate ``+ - * / ( )`` over decimals exactly (shunting-yard); ``None`` if malformed.

    Raises :class:`ZeroDivisionError` for a well-formed division by zero (a wrong step, not a malformed one).

    Hand-written rather than ``eval``/sympy: the text is hostile, and only these operators are wanted.
    """
    out: list[Fraction] = []
    ops: list[str] = []
    expect_operand = True

    def apply() -> bool:
        op = ops.pop()
        if op == "neg":
            if not out:
                return False
            out.append(-out.pop())
            return True
        if len(out) < 2:
            return False
        b, a = out.pop(), out.pop()
        if op in "/÷" and b == 0:
            raise ZeroDivisionError("division by zero in a written step")
        out.append(a + b if op == "+" else a - b if op == "-" else a * b if op in "*×" else a / b)
        return True

    for number, sym in _TOKEN.findall(expr):
        if number:
            if not expect_operand:
                return None
            out.append(Fraction(number))
            expect_operand = False
        elif sym == "(":
            if not expect_operand:
                return None
            ops.append("(")
        elif sym == ")":
            while ops and ops[-1] != "(":
                if not apply():
                    return None
            if not ops or expect_operand:
                return None
            ops.pop()
        elif sym in _OPS:
            if expect_operand:
                if sym != "-":
                    return None
                ops.append("neg")
                continue
            while ops and ops[-1] != "(" and (ops[-1] == "neg" or _OPS[ops[-1]] >= _OPS[sym]):
                if not apply():
                    return None
            ops.append(sym)
            expect_operand = True
        elif sym.strip():
            return None
    if expect_operand:
        return None
    while ops:
        if ops[-1] == "(" or not apply():
            return None
    return out[0] if len(out) == 1 else None


def _equations(text: str):
    """Yield ``(left side, right side)`` of each ``... = number`` in ``text``, scanning left from each ``=``.

    The left side is the longest run (up to 200 characters) of digits, operators, parentheses and spaces
    just before the ``=``. Linear in the text: no regex backtracking.
    """
    pos = text.find("=")
    while pos >= 0:
        rhs = _RHS.match(text, pos + 1)
        if rhs is not None:
            start = pos
            while start > 0 and pos - start < _MAX_LHS and text[start - 1] in _LHS_CHARS:
                start -= 1
            lhs = text[start:pos].strip()
            if lhs:
                yield lhs, rhs.group(1)
        pos = text.find("=", pos + 1)


def _steps(text: str) -> Iterator[tuple[str, Fraction, bool]]:
    """Yield ``(left side, right side, correct)`` of each arithmetic step in ``text``, in order (at most 200).

    ``x = 5`` or a bare number is not an arithmetic step, nor is a left side that does not parse.
    """
    checked = 0
    for lhs, rhs in _equations(text[:_MAX_TEXT]):
        if not re.search(r"\d\s*[-+*/×÷]", lhs):
            continue
        try:
            value = _evaluate(lhs)
        except ZeroDivisionError:
            value, ok = None, False
        else:
            if value is None:
                continue
            ok = value == Fraction(rhs)
        yield lhs, Fraction(rhs), ok
        checked += 1
        if checked >= _MAX_STEPS:
            return


def check_steps(text: str) -> tuple[int, int]:
    """``(right, wrong)`` counts of the equations written in ``text`` (at most 200 checked)."""
    right = wrong = 0
    for _, _, ok in _steps(text):
        right, wrong = right + ok, wrong + (not ok)
    return right, wrong


def _numbers(text: str) -> set[Fraction]:
    return {Fraction(n) for n in re.findall(_NUM, text)}


def problem_numbers(task: Task) -> frozenset[Fraction]:
    """The numbers written in the task's prompt: what a grounded step may start from."""
    return frozenset(_numbers(prompt_text(task.prompt)[:_MAX_TEXT]))


def verified_work(text: str, given: frozenset[Fraction] | set[Fraction]) -> tuple[int, int, bool]:
    """``(correct steps before the first wrong one, correct steps in all, no wrong step and some work)``.

    Only grounded, new steps count as correct work: every number on the left side is in ``given`` or is the
    result of an earlier counted step, and an equation already counted is not counted again. A wrong step
    counts wherever its numbers come from.
    """
    before, total, wrong = _work(text, given)
    return before, total, wrong == 0 and total > 0


def _first_error(before: int, total: int, wrong: int) -> tuple[int, int]:
    if wrong:
        return 1, before
    return (2, 0) if total else (0, 0)


def first_error_rank(text: str, given: frozenset[Fraction] | set[Fraction]) -> tuple[int, int]:
    """The ``first_error`` criterion's rank of a trace (a larger tuple is better).

    ``(2, 0)``: verified work and no wrong step; ``(1, k)``: the first wrong step comes after ``k`` verified
    steps (a caught slip included); ``(0, 0)``: no verified work and no wrong step (nothing written). Steps are
    counted as in :func:`verified_work`.
    """
    return _first_error(*_work(text, given))


def _work(text: str, given: frozenset[Fraction] | set[Fraction]) -> tuple[int, int, int]:
    """``(verified steps before the first wrong one, verified steps in all, wrong steps)`` (see verified_work)."""
    known = set(given)
    seen: set[tuple[str, Fraction]] = set()
    before = total = wrong = 0
    for lhs, rhs, ok in _steps(text):
        if not ok:
            wrong += 1
            continue
        key = (re.sub(r"\s+", "", lhs), rhs)
        if key in seen or not _numbers(lhs) <= known:
            continue
        seen.add(key)
        known.add(rhs)
        total += 1
        before += not wrong
    return before, total, wrong


def _final_answer(text: str) -> Fraction | None:
    end = text.rfind("</answer>")
    start = text.rfind("<answer>", 0, end if end >= 0 else None)
    if start < 0 or end < 0 or end - start > 200:
        return None
    body = text[start + len("<answer>") : end].strip().replace(",", "")
    m = re.fullmatch(r"(-?\d{1,30}(?:\.\d{1,30})?)(?:/(\d{1,30}))?", body)
    if m is None:
        return None
    value = Fraction(m.group(1))
    if m.group(2):
        denominator = Fraction(m.group(2))
        return None if denominator == 0 else value / denominator
    return value


class TraceFacts(NamedTuple):
    """What the rules know of one trace."""

    work: tuple[int, int, bool]
    """:func:`verified_work`: steps before the first error, steps in all, error-free with work."""
    answer: Fraction | None
    """The final numeric ``<answer>`` (None: missing or not a number)."""
    strict_format: bool
    """One ``<think>`` then one ``<answer>``, nothing after."""
    first_error: tuple[int, int]
    """:func:`first_error_rank`."""


def trace_facts(
    text: str, given: frozenset[Fraction] | set[Fraction] = frozenset(), strict: FormatJudge | None = None
) -> TraceFacts:
    """The facts the rules compare: the verified work, the final numeric answer, the strict format, the first error.

    The work is :func:`verified_work` against ``given``, the problem's numbers (:func:`problem_numbers`).
    """
    fmt = (strict or FormatJudge("strict")).check(text)[0]
    before, total, wrong = _work(text, given)
    work = (before, total, wrong == 0 and total > 0)
    return TraceFacts(work, _final_answer(text[-_MAX_TEXT:]), fmt, _first_error(before, total, wrong))


def _reference(task: Task) -> Fraction | None:
    return _final_answer(f"<answer>{task.answer}</answer>") if task.answer is not None else None


class RulePairwiseJudge(PairwiseAsJudge):
    """Compares two arithmetic traces by rules (see the module docstring); a CPU stand-in for an LLM judge.

    Args:
        criteria: The rules to apply, in order.
        name: The component's name when used as a stand-alone judge.
        weight: Its weight then.
    """

    name = "rule_pairwise"

    def __init__(
        self, criteria: tuple[Criterion, ...] = ("arithmetic", "distance", "format"),
        name: str | None = None, weight: float = 1.0,
    ) -> None:  # fmt: skip
        super().__init__(name, weight)
        unknown = [c for c in criteria if c not in CRITERIA]
        if unknown or not criteria:
            raise ValueError(f"criteria must be a non-empty list of {', '.join(CRITERIA)}; got {list(criteria)}.")
        self.criteria = tuple(criteria)
        self._strict = FormatJudge("strict")

    def _compare_once(self, task: Task, first: Completion, second: Completion) -> float | None:
        try:
            given = problem_numbers(task)
            a = trace_facts(first.text, given, self._strict)
            b = trace_facts(second.text, given, self._strict)
        except (ValueError, ZeroDivisionError, OverflowError):  # defensive: the rules above avoid these
            return None
        ref = _reference(task)
        for criterion in self.criteria:
            if criterion == "arithmetic" and a.work != b.work:
                return 1.0 if a.work > b.work else 0.0
            if criterion == "first_error" and a.first_error != b.first_error:
                return 1.0 if a.first_error > b.first_error else 0.0
            if criterion == "distance" and ref is not None:
                da = None if a.answer is None else abs(a.answer - ref)
                db = None if b.answer is None else abs(b.answer - ref)
                if da != db:
                    if da is None or db is None:
                        return 1.0 if db is None else 0.0
                    return 1.0 if da < db else 0.0
            if criterion == "format" and a.strict_format != b.strict_format:
                return 1.0 if a.strict_format else 0.0
        return 0.5

    def compare(self, task: Task, first: Completion, second: Completion) -> float | None:
        """1.0 when ``first`` is better, 0.0 when ``second`` is, 0.5 for a tie (never ``None``: rules cannot fail)."""
        self._stats.add(comparisons=1)
        return self._compare_once(task, first, second)


class RulePairwiseJudgeConfig(JudgeConfigBase):
    """Rule-based pairwise judge for arithmetic traces (``judge=rule_pairwise``; usually inside ``judge=arena``)."""

    kind: Literal["rule_pairwise"] = "rule_pairwise"
    """Selects this judge."""
    criteria: list[Criterion] = Field(default_factory=lambda: ["arithmetic", "distance", "format"], min_length=1)
    """Rules applied in order (arithmetic, first_error, distance, format; see the module docstring); the first that
    separates the two traces decides, else a tie."""

    def build(self) -> RulePairwiseJudge:
        """Make the judge."""
        return RulePairwiseJudge(tuple(self.criteria), self.name, self.weight)
