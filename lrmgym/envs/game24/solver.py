"""Exact solver for the 24-point game (and any target) over rationals.

A puzzle is a multiset of numbers; a solution combines all of them with ``+ - * /`` (binary operators only)
and parentheses into an expression worth the target. Everything here is exact (:class:`fractions.Fraction`),
so ``8/(3-8/3)`` is 24, not 23.999...

The solver splits a multiset into two non-empty parts in every way, computes the set of values each part can
reach (memoised per sorted sub-multiset, so the sub-puzzles shared by many puzzles are solved once), and
combines them. Solvability does not even enumerate the full value set of the whole puzzle: for each split it
asks which values of one part would meet each value of the other part at the target (at most six set
look-ups per value). That is what makes all 1 362 held-out puzzles solvable in well under a second.

The same search with integer-only intermediate values (exact division only) tells whether *every*
solution needs a fractional intermediate value, as ``3 3 8 8`` does.

Distinct solutions are counted up to commutativity and associativity: sums are flattened into a multiset of
added and a multiset of subtracted terms, products into a multiset of numerator and of denominator factors,
so ``(a+b)+c``, ``c+(b+a)`` and ``a-(-b-c)``-style regroupings collapse to one form, as do ``a*b/c``,
``a/c*b`` and ``a/(c/b)``. No other algebra is applied: ``a*1`` and ``a/1`` stay distinct.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cache

__all__ = [
    "TARGET",
    "Analysis",
    "analyse",
    "apply_op",
    "format_number",
    "format_operand",
    "reachable",
    "solutions",
    "solvable",
    "step_solution",
]

TARGET = 24
"""The default target of the game."""

Number = int | Fraction

# A canonical expression form (see the module docstring), as nested tuples so it hashes and sorts:
#   ("n", value)                         a puzzle number
#   ("+", added_terms, subtracted_terms) a flattened sum; terms are "n" or "*" forms, each tuple sorted
#   ("*", numerator, denominator)        a flattened product; factors are "n" or "+" forms, each tuple sorted
Form = tuple


# --------------------------------------------------------------------------------------------- value search
def _splits(ms: tuple[int, ...]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every way to cut the sorted multiset ``ms`` into two non-empty parts, each unordered pair once."""
    n = len(ms)
    seen: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    out = []
    for mask in range(1, (1 << n) - 1):
        left = tuple(ms[i] for i in range(n) if mask >> i & 1)
        right = tuple(ms[i] for i in range(n) if not mask >> i & 1)
        key = (left, right) if left <= right else (right, left)
        if key not in seen:
            seen.add(key)
            out.append(key)
    return out


def _combine(x: Number, y: Number, integral: bool) -> Iterator[Number]:
    """All values of ``x op y`` and ``y op x``; with ``integral`` only exact integer divisions."""
    yield x + y
    yield x - y
    yield y - x
    yield x * y
    if y != 0 and (not integral or x % y == 0):
        yield x // y if integral else x / y
    if x != 0 and (not integral or y % x == 0):
        yield y // x if integral else y / x


@cache
def _reachable(ms: tuple[int, ...], integral: bool) -> frozenset:
    if len(ms) == 1:
        return frozenset((ms[0] if integral else Fraction(ms[0]),))
    values: set = set()
    for left, right in _splits(ms):
        right_values = _reachable(right, integral)
        for x in _reachable(left, integral):
            for y in right_values:
                values.update(_combine(x, y, integral))
    return frozenset(values)


def reachable(numbers: Iterable[int], integral: bool = False) -> frozenset:
    """Every value an expression over all of ``numbers`` (each once) can take.

    Args:
        numbers: The puzzle's numbers (non-negative integers).
        integral: Only allow integer intermediate values (divisions must be exact); values are then ``int``.

    Returns:
        The set of reachable values (``Fraction`` or, with ``integral``, ``int``).
    """
    return _reachable(_key(numbers), integral)


def _partners(y: Number, target: Number, integral: bool) -> Iterator[Number]:
    """The values ``x`` for which some ``x op y`` or ``y op x`` equals ``target`` (``target`` is non-zero)."""
    yield target - y  # x + y
    yield target + y  # x - y
    yield y - target  # y - x
    if y != 0:
        if not integral or target % y == 0:
            yield target // y if integral else target / y  # x * y
        yield target * y  # x / y
        if not integral or y % target == 0:
            yield y // target if integral else y / target  # y / x (x is then non-zero)


@cache
def _solvable(ms: tuple[int, ...], target: Number, integral: bool) -> bool:
    if len(ms) == 1:
        return ms[0] == target
    for left, right in _splits(ms):
        left_values = _reachable(left, integral)
        right_values = _reachable(right, integral)
        small, large = (
            (left_values, right_values) if len(left_values) <= len(right_values) else (right_values, left_values)
        )
        for y in small:
            if any(x in large for x in _partners(y, target, integral)):
                return True
    return False


def solvable(numbers: Iterable[int], target: int = TARGET, integral: bool = False) -> bool:
    """Whether ``numbers`` can make ``target`` with ``+ - * /`` and parentheses, each number used once.

    Args:
        numbers: The puzzle's numbers.
        target: The value to reach; must be non-zero.
        integral: Only allow integer intermediate values.
    """
    if target == 0:
        raise ValueError("solvable() needs a non-zero target (0 is reachable from almost anything via x - x).")
    return _solvable(_key(numbers), target, integral)


@dataclass(frozen=True)
class Analysis:
    """What the fast search knows about a puzzle.

    Attributes:
        numbers: The puzzle, sorted.
        solvable: Whether some expression reaches the target.
        needs_fractions: Whether every solution has a non-integer intermediate value (``False`` when unsolvable).
    """

    numbers: tuple[int, ...]
    solvable: bool
    needs_fractions: bool


def analyse(numbers: Iterable[int], target: int = TARGET) -> Analysis:
    """Solvability and the need for fractions, without enumerating solutions (microseconds once warm)."""
    ms = _key(numbers)
    # The integer search runs on plain ints and settles most puzzles; only the rest need Fraction arithmetic.
    if solvable(ms, target, integral=True):
        return Analysis(numbers=ms, solvable=True, needs_fractions=False)
    ok = solvable(ms, target)
    return Analysis(numbers=ms, solvable=ok, needs_fractions=ok)


def _key(numbers: Iterable[int]) -> tuple[int, ...]:
    ms = tuple(sorted(int(n) for n in numbers))
    if not ms:
        raise ValueError("A puzzle needs at least one number, got none.")
    if ms[0] < 0:
        raise ValueError(f"Puzzle numbers must be non-negative integers, got {list(ms)}.")
    return ms


# --------------------------------------------------------------------------------------------- enumeration
def _terms(form: Form, kind: str) -> tuple[tuple, tuple]:
    """The (positive, negative) parts of ``form`` seen as a flattened ``kind`` ("+" or "*") node."""
    if form[0] == kind:
        return form[1], form[2]
    return (form,), ()


def _join(kind: str, a: Form, b: Form, invert_b: bool) -> Form:
    a_pos, a_neg = _terms(a, kind)
    b_pos, b_neg = _terms(b, kind)
    if invert_b:
        b_pos, b_neg = b_neg, b_pos
    return (kind, tuple(sorted(a_pos + b_pos)), tuple(sorted(a_neg + b_neg)))


def _apply(op: str, a: Form, b: Form) -> Form:
    """The canonical form of ``a op b``."""
    if op == "+":
        return _join("+", a, b, False)
    if op == "-":
        return _join("+", a, b, True)
    if op == "*":
        return _join("*", a, b, False)
    return _join("*", a, b, True)


def apply_op(op: str, x: Fraction, y: Fraction) -> Fraction | None:
    """``x op y`` exactly for ``op`` in ``+ - * /``; ``None`` for a division by zero."""
    if op == "+":
        return x + y
    if op == "-":
        return x - y
    if op == "*":
        return x * y
    return None if y == 0 else x / y


@cache
def _forms(ms: tuple[int, ...]) -> dict[Fraction, frozenset]:
    """Value -> the canonical forms of all expressions over ``ms`` with that value."""
    if len(ms) == 1:
        return {Fraction(ms[0]): frozenset({("n", ms[0])})}
    by_value: dict[Fraction, set] = {}
    for left, right in _splits(ms):
        right_forms = _forms(right)
        for x, x_forms in _forms(left).items():
            for y, y_forms in right_forms.items():
                for op, swap in (("+", False), ("-", False), ("-", True), ("*", False), ("/", False), ("/", True)):
                    value = apply_op(op, y, x) if swap else apply_op(op, x, y)
                    if value is None:
                        continue
                    bucket = by_value.setdefault(value, set())
                    for fx in x_forms:
                        for fy in y_forms:
                            bucket.add(_apply(op, fy, fx) if swap else _apply(op, fx, fy))
    return {v: frozenset(f) for v, f in by_value.items()}


def _target_forms(ms: tuple[int, ...], target: Fraction) -> set:
    """The canonical forms worth ``target``; at the top level only the matching value pairs are combined."""
    if len(ms) == 1:
        return {("n", ms[0])} if ms[0] == target else set()
    found: set = set()
    for left, right in _splits(ms):
        left_forms, right_forms = _forms(left), _forms(right)
        for y, y_forms in right_forms.items():
            for op, swap in (("+", False), ("-", False), ("-", True), ("*", False), ("/", False), ("/", True)):
                for _, x_forms in _matching(left_forms, op, swap, y, target):
                    for fx in x_forms:
                        for fy in y_forms:
                            found.add(_apply(op, fy, fx) if swap else _apply(op, fx, fy))
    return found


def _matching(forms: dict, op: str, swap: bool, y: Fraction, target: Fraction) -> Iterator[tuple]:
    """The (x, forms) entries with ``x op y == target`` (``y op x`` when ``swap``)."""
    if op == "+":
        x = target - y
    elif op == "-":
        x = y - target if swap else target + y
    elif op == "*":
        if y == 0:
            return
        x = target / y
    elif swap:  # y / x
        if y == 0:
            return
        x = y / target
    else:  # x / y
        if y == 0:
            return
        x = target * y
    if x in forms:
        yield x, forms[x]


def _render(form: Form, inside_product: bool = False) -> str:
    kind = form[0]
    if kind == "n":
        return str(form[1])
    if kind == "+":
        text = " + ".join(_render(t) for t in form[1]) + "".join(f" - {_render(t)}" for t in form[2])
        return f"({text})" if inside_product else text
    return " * ".join(_render(f, True) for f in form[1]) + "".join(f" / {_render(f, True)}" for f in form[2])


def solutions(numbers: Sequence[int], target: int = TARGET) -> tuple[str, ...]:
    """The distinct solutions, up to commutativity and associativity, as expressions (sorted, deterministic).

    Each returned string parses with Python's operator precedence and is accepted by
    :func:`lrmgym.envs.game24.checker.check_expression`.

    Args:
        numbers: The puzzle's numbers.
        target: The value to reach; must be non-zero.
    """
    if target == 0:
        raise ValueError("solutions() needs a non-zero target.")
    ms = _key(numbers)
    return tuple(sorted(_render(f) for f in _target_forms(ms, Fraction(target))))


def format_number(value: Number) -> str:
    """``8`` for integers, ``8/3`` for fractions, ``-5`` for negatives: the notation of step mode."""
    value = Fraction(value)
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def step_solution(numbers: Sequence[int], target: int = TARGET) -> tuple[str, ...] | None:
    """One solution as the steps of step mode (``("8 / 3 = 8/3", "3 - 8/3 = 1/3", "8 / (1/3) = 24")``), or ``None``.

    A depth-first search over pairs of the remaining numbers; fine for the game's four numbers (at most a few
    thousand partial states), not meant for large multisets.
    """
    if not solvable(numbers, target):
        return None
    found = _step_search(tuple(Fraction(n) for n in numbers), Fraction(target))
    return None if found is None else tuple(found)


def format_operand(value: Number) -> str:
    """A step operand: :func:`format_number` with fractions and negatives in parentheses (``(8/3)``, ``(-5)``).

    Written this way, a step re-parses to the same operands.
    """
    value = Fraction(value)
    text = format_number(value)
    return text if value.denominator == 1 and value >= 0 else f"({text})"


def _step_search(pool: tuple[Fraction, ...], target: Fraction) -> list[str] | None:
    if len(pool) == 1:
        return [] if pool[0] == target else None
    for i in range(len(pool)):
        for j in range(len(pool)):
            if i == j:
                continue
            rest = tuple(v for k, v in enumerate(pool) if k not in (i, j))
            for op in ("+", "-", "*", "/"):
                value = apply_op(op, pool[i], pool[j])
                if value is None:
                    continue
                tail = _step_search((*rest, value), target)
                if tail is not None:
                    return [f"{format_operand(pool[i])} {op} {format_operand(pool[j])} = {format_number(value)}", *tail]
    return None
