r"""The 24-point checker: exact, eval-free grading of an expression or a step over a puzzle's numbers.

Nothing here calls ``eval`` or sympy. An answer is parsed with :func:`ast.parse` and only a whitelist of
nodes is interpreted, with :class:`fractions.Fraction` arithmetic. The notation decisions:

- **Operators**: ``+ - * /`` and parentheses. The aliases ``×``, ``·``, ``x``, ``X``, ``\times``, ``\cdot``
  (multiplication), ``÷``, ``\div`` (division) and ``−`` (U+2212 minus) are accepted because models write
  them often and they are unambiguous between numbers. Every other character is refused with its name:
  letters, ``.`` (decimals are refused: the answer must be exact), ``%``, ``^``, ``[``, ``_`` (Python would
  read ``1_0`` as 10), non-ASCII digits (``２４``), control characters, NUL.
- **Unary minus is refused** in expressions. The puzzle's numbers are positive and every operator must combine
  two sub-expressions, as in the solver; allowing it would let ``-(a-b)*c`` stand for ``(b-a)*c`` and make
  the checker accept expressions the solver does not count. In step mode negative *numbers* such as ``-5``
  (the result of ``3 - 8``) are allowed, since they are values, not operators.
- ``**``, ``//`` and ``%`` are refused with their names; ``=`` is allowed only as one trailing ``= 24``.
- The numbers used must equal the puzzle's numbers as a multiset; the value must equal the target exactly
  (``49/2`` is not 24: no truncation, no float tolerance).

Bounds (every input is rejected *before* any work that could grow with it): at most
:data:`MAX_EXPR_CHARS` characters, :data:`MAX_DEPTH` levels of parentheses, :data:`MAX_NODES` syntax nodes,
literals below :data:`MAX_LITERAL`, and intermediate values of at most :data:`MAX_VALUE_BITS` bits in numerator
and denominator. The work per call is therefore bounded by a constant; the measured worst case is under a
millisecond (``tests/envs/game24/test_checker.py``), so no timer or worker process is needed.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from lrmgym.envs.game24.solver import TARGET, apply_op, format_number, format_operand

__all__ = [
    "MAX_DEPTH",
    "MAX_EXPR_CHARS",
    "MAX_LITERAL",
    "MAX_NODES",
    "MAX_VALUE_BITS",
    "NO_SOLUTION_ANSWERS",
    "CheckError",
    "CheckResult",
    "Step",
    "apply_step",
    "check_answer",
    "check_expression",
    "evaluate",
    "parse_step",
]

MAX_EXPR_CHARS = 200
"""Longest accepted expression or step, in characters. A four-number answer needs about 25."""
MAX_DEPTH = 16
"""Deepest accepted nesting of parentheses."""
MAX_NODES = 64
"""Most syntax nodes in one expression."""
MAX_LITERAL = 10**6
"""Literals must be below this (puzzles use small integers; step mode numerators may be larger)."""
MAX_VALUE_BITS = 256
"""Largest numerator or denominator, in bits, of any intermediate value."""

NO_SOLUTION_ANSWERS = frozenset({"no solution", "no solutions", "none", "impossible", "unsolvable"})
"""Answers (case-insensitive, a trailing period ignored) that claim the puzzle cannot be solved."""

_ALIASES = {"×": "*", "·": "*", "x": "*", "X": "*", "÷": "/", "−": "-"}
_LATEX = (("\\times", "*"), ("\\cdot", "*"), ("\\div", "/"))
_ALLOWED = frozenset("0123456789+-*/() \t")
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_REFUSED_OPS = {ast.Pow: "'**'", ast.FloorDiv: "'//'", ast.Mod: "'%'", ast.MatMult: "'@'"}
_LEFT_NOTE = re.compile(r"\(\s*left\s*:[^()]*\)\s*$", re.IGNORECASE)


class CheckError(ValueError):
    """An answer the checker refuses; the message is the reason shown in the verdict."""


@dataclass(frozen=True)
class CheckResult:
    """The outcome of checking one answer.

    Attributes:
        ok: Whether the answer is right.
        reason: ``"correct"`` or why not (``"numbers used 1 1 4 6, puzzle has 1 2 3 4"``).
        value: The exact value of the expression, when it was evaluated.
        claims_no_solution: Whether the answer was a "no solution" claim.
    """

    ok: bool
    reason: str
    value: Fraction | None = None
    claims_no_solution: bool = False


@dataclass(frozen=True)
class Step:
    """One step of step mode: ``left op right = result``, all exact."""

    left: Fraction
    op: str
    right: Fraction
    result: Fraction

    def __str__(self) -> str:
        return f"{format_operand(self.left)} {self.op} {format_operand(self.right)} = {format_number(self.result)}"


# ------------------------------------------------------------------------------------------------- parsing
def _normalise(text: str) -> str:
    """Map operator aliases to ASCII and refuse any character outside the whitelist (naming it)."""
    if len(text) > MAX_EXPR_CHARS:
        raise CheckError(f"too long: {len(text)} characters, the limit is {MAX_EXPR_CHARS}")
    for macro, op in _LATEX:
        text = text.replace(macro, op)
    out = []
    for ch in text:
        ch = _ALIASES.get(ch, ch)
        if ch not in _ALLOWED:
            if ch == ".":
                raise CheckError("decimals are not allowed: use exact integers (and p/q fractions in steps)")
            if ch == "=":
                raise CheckError("'=' is only allowed as a trailing '= 24'")
            raise CheckError(f"character {ascii(ch)} is not allowed: use digits, + - * / and parentheses")
        out.append(ch)
    return "".join(out).strip()


def _parse(text: str) -> ast.expr:
    """Parse normalised text; the depth is checked on the raw brackets first, so the parser never recurses deep."""
    depth = deepest = 0
    for ch in text:
        if ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
    if deepest > MAX_DEPTH:
        raise CheckError(f"nested too deeply: {deepest} levels of parentheses, the limit is {MAX_DEPTH}")
    if not text:
        raise CheckError("empty expression")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        raise CheckError(f"not a valid expression: {text!r}") from None
    nodes = sum(1 for _ in ast.walk(tree))
    if nodes > MAX_NODES:
        raise CheckError(f"too many terms: {nodes} syntax nodes, the limit is {MAX_NODES}")
    return tree.body


def _bounded(value: Fraction) -> Fraction:
    if value.numerator.bit_length() > MAX_VALUE_BITS or value.denominator.bit_length() > MAX_VALUE_BITS:
        raise CheckError(f"an intermediate value is too large (over {MAX_VALUE_BITS} bits)")
    return value


def _literal(node: ast.expr) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        if node.value >= MAX_LITERAL:
            raise CheckError(f"number {node.value} is too large (the limit is {MAX_LITERAL - 1})")
        return node.value
    raise CheckError(f"unsupported syntax: {type(node).__name__}")


def _validate(tree: ast.expr) -> list[int]:
    """Refuse every node outside the whitelist (naming it) and return the integer literals used."""
    used = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp):
            if type(node.op) in _REFUSED_OPS:
                raise CheckError(f"operator {_REFUSED_OPS[type(node.op)]} is not allowed: use + - * /")
            if type(node.op) not in _OPS:
                raise CheckError(f"operator {type(node.op).__name__} is not allowed: use + - * /")
        elif isinstance(node, ast.UnaryOp):
            raise CheckError("unary minus/plus is not allowed: every operator must combine two numbers")
        elif isinstance(node, ast.Constant):
            used.append(_literal(node))
        elif not isinstance(node, ast.operator):
            raise CheckError(f"unsupported syntax: {type(node).__name__}")
    return used


def _eval(node: ast.expr) -> Fraction:
    """Evaluate a validated tree exactly (its size is bounded by MAX_NODES, so is the recursion)."""
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left), _eval(node.right)
        return _arith(_OPS[type(node.op)], left, right)
    return Fraction(node.value)


def _arith(op: str, left: Fraction, right: Fraction) -> Fraction:
    value = apply_op(op, left, right)
    if value is None:
        raise CheckError("division by zero")
    return _bounded(value)


def evaluate(expression: str) -> tuple[Fraction, tuple[int, ...]]:
    """The exact value of an expression and the numbers it uses (sorted).

    Raises:
        CheckError: The expression breaks a rule or a bound; the message says which.
    """
    tree = _parse(_normalise(expression))
    used = _validate(tree)
    return _eval(tree), tuple(sorted(used))


def _numbers_text(numbers: Sequence[int | Fraction]) -> str:
    return " ".join(format_number(n) for n in numbers)


# -------------------------------------------------------------------------------------------- single shot
def check_expression(expression: str, numbers: Sequence[int], target: int = TARGET) -> CheckResult:
    """Check an expression against a puzzle: allowed syntax, the exact multiset of numbers, the exact value.

    Never raises for any input string.

    Args:
        expression: The candidate expression (no ``= 24`` suffix; see :func:`check_answer`).
        numbers: The puzzle's numbers.
        target: The value to reach.
    """
    try:
        tree = _parse(_normalise(expression))
        used = _validate(tree)
        if Counter(used) != Counter(numbers):
            return CheckResult(
                False, f"numbers used {_numbers_text(sorted(used))}, puzzle has {_numbers_text(sorted(numbers))}"
            )
        value = _eval(tree)
    except CheckError as err:
        return CheckResult(False, str(err))
    if value != target:
        return CheckResult(False, f"value is {format_number(value)}, not {target}", value=value)
    return CheckResult(True, "correct", value=value)


def check_answer(answer: str, numbers: Sequence[int], solvable: bool, target: int = TARGET) -> CheckResult:
    """Check a whole answer: an expression, optionally followed by ``= 24``, or a "no solution" claim.

    Args:
        answer: The extracted answer text.
        numbers: The puzzle's numbers.
        solvable: Whether the puzzle has a solution (from the solver).
        target: The value to reach.
    """
    text = answer.strip()
    if len(text) > MAX_EXPR_CHARS:
        return CheckResult(False, f"too long: {len(text)} characters, the limit is {MAX_EXPR_CHARS}")
    if text.lower().rstrip(".").strip() in NO_SOLUTION_ANSWERS:
        if solvable:
            return CheckResult(False, "claimed no solution, but the puzzle is solvable", claims_no_solution=True)
        return CheckResult(True, "correct", claims_no_solution=True)
    if text.count("=") == 1:
        expression, claimed = text.split("=")
        if claimed.strip() != str(target):
            return CheckResult(False, f"'=' is only allowed as a trailing '= {target}', got '= {claimed.strip()[:20]}'")
        text = expression
    result = check_expression(text, numbers, target)
    if not solvable and not result.ok:
        return CheckResult(False, f"the puzzle has no solution; {result.reason}", value=result.value)
    return result


# ---------------------------------------------------------------------------------------------- step mode
def _number(node: ast.expr) -> Fraction:
    """A number of step mode: ``8``, ``-5``, ``8/3`` or ``-8/3`` (a written value, not a computation)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_number(node.operand)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        numerator, denominator = node.left, node.right
        if isinstance(numerator, ast.UnaryOp) and isinstance(numerator.op, ast.USub):
            return -_number(ast.BinOp(numerator.operand, ast.Div(), denominator))
        p, q = _literal(numerator), _literal(denominator)
        if q == 0:
            raise CheckError("division by zero")
        return Fraction(p, q)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Fraction(_literal(node))
    raise CheckError(
        f"each side of a step must be one number (8, -5 or a fraction in parentheses like (8/3)), "
        f"got {ast.unparse(node)!r}"
    )


def parse_step(text: str) -> Step:
    """Parse one step such as ``8 / 3 = 8/3`` and check its arithmetic exactly.

    The operation is the expression's top-level operator under Python precedence, so a fraction on the right of
    an operator needs parentheses: ``2 / (8/3) = 3/4``. A trailing ToT-style ``(left: ...)`` note is ignored.

    Raises:
        CheckError: The step is malformed or its result is wrong; the message says which.
    """
    if len(text) > MAX_EXPR_CHARS:
        raise CheckError(f"too long: {len(text)} characters, the limit is {MAX_EXPR_CHARS}")
    text = _LEFT_NOTE.sub("", text.strip())
    if text.count("=") != 1:
        raise CheckError("a step must look like '8 / 3 = 8/3': two numbers, one operator, '=', the result")
    lhs, rhs = text.split("=")
    lhs_tree = _parse(_normalise(lhs))
    if not isinstance(lhs_tree, ast.BinOp) or type(lhs_tree.op) not in _OPS:
        if isinstance(lhs_tree, ast.BinOp) and type(lhs_tree.op) in _REFUSED_OPS:
            raise CheckError(f"operator {_REFUSED_OPS[type(lhs_tree.op)]} is not allowed: use + - * /")
        raise CheckError("a step must combine two numbers with one of + - * /, like '8 / 3 = 8/3'")
    left, right = _number(lhs_tree.left), _number(lhs_tree.right)
    op = _OPS[type(lhs_tree.op)]
    claimed = _number(_parse(_normalise(rhs)))
    actual = _arith(op, left, right)
    step = Step(left, op, right, actual)
    if claimed != actual:
        raise CheckError(
            f"wrong arithmetic: {format_number(left)} {op} {format_number(right)} is {format_number(actual)}, "
            f"not {format_number(claimed)}"
        )
    return step


def apply_step(remaining: Sequence[Fraction], step: Step) -> tuple[Fraction, ...]:
    """The numbers left after ``step``: its two operands removed (by value), its result added.

    Raises:
        CheckError: An operand is not among ``remaining`` (the message lists what is left).
    """
    pool = list(remaining)
    for operand in (step.left, step.right):
        if operand not in pool:
            raise CheckError(
                f"{format_number(operand)} is not one of the remaining numbers ({_numbers_text(sorted(remaining))})"
            )
        pool.remove(operand)
    return tuple(sorted([*pool, step.result]))
