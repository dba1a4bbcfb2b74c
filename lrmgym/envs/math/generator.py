"""Procedural math problems: infinite, seeded, five difficulty levels, exact answers (never floats).

Levels:

1. The tiny default model's level (../shared/specs/tiny-model-notes.md): 1-2 additions or subtractions of
   numbers that are 1-digit with probability 0.5, else 2-digit (``Compute 93+13+41.``), and 20 % linear
   equations like ``x-50=42. x=?``. Intermediate results are never negative.
2. Multi-step integer arithmetic with multiplication and precedence (``Compute 7*8+12.``, ``(12+7)*3``).
3. Fractions (``3/4+5/6``, ``2/3*9/4``), fractions of numbers and percentages (``15% of 240``).
4. Linear equations (``3x+7=25``, ``5x+3=2x+18``, answers may be fractions) and percentage changes.
5. Templated multi-step word problems (shopping, change, rates, shares, tanks), some with fraction answers.

Every problem declares the form of its answer (:attr:`Problem.answer_form`: a plain number, or a fraction in
lowest terms), which the verifier checks, so restating the question (``11 × 9 - 52``) earns nothing.

Every problem carries worked steps short enough for a character-level model (``93+13=106;106+41=147``);
:func:`lrmgym.envs.math.templates.render_solution` writes them in any answer template.

Train/test split: each problem is assigned to a split by a hash of its canonical text
(:func:`split_of`), and :func:`sample` redraws until the problem belongs to the requested split. So no
test problem can ever appear in the train stream, whatever the seeds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from math import lcm

import numpy as np

__all__ = ["LEVELS", "TEST_SHARE", "Problem", "format_number", "generate", "sample", "split_of"]

LEVELS: tuple[int, ...] = (1, 2, 3, 4, 5)
TEST_SHARE = 10
"""One problem in ``TEST_SHARE`` (by content hash) belongs to the held-out test split."""


@dataclass(frozen=True)
class Problem:
    """One generated problem.

    Attributes:
        level: Difficulty level, 1-5.
        kind: The problem family (``"add"``, ``"equation"``, ``"fraction"``, ``"word/change"``, ...).
        compact: The question in compact wording (``Compute 93+13+41.``).
        text: The question in plain-English wording for instruction-following models.
        answer: The exact answer.
        steps: Worked steps, each a short equation.
    """

    level: int
    kind: str
    compact: str
    text: str
    answer: Fraction
    steps: tuple[str, ...]

    @property
    def answer_text(self) -> str:
        """The answer as the verifier's gold string (``147``, ``-3``, ``19/12``)."""
        return format_number(self.answer)

    @property
    def answer_form(self) -> str:
        """The form the answer must take (:mod:`lrmgym.envs.math.forms`).

        ``"fraction"`` (lowest terms, no decimal) for the fraction arithmetic of level 3, ``"number"`` (a plain
        number, fractions in lowest terms) for every other problem. No generated question asks for a percentage.
        """
        return "fraction" if self.kind == "fraction" else "number"

    @property
    def canonical(self) -> str:
        """The content that identifies the problem (used for the split hash and the task id)."""
        return f"{self.kind}|{self.compact}"


def format_number(value: Fraction | int) -> str:
    """``147``, ``-3`` or ``19/12``: integers without a denominator, fractions in lowest terms."""
    value = Fraction(value)
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def split_of(canonical: str) -> str:
    """``"test"`` for one problem in :data:`TEST_SHARE` (by SHA-256 of ``canonical``), else ``"train"``."""
    digest = hashlib.sha256(canonical.encode("utf-8")).digest()
    return "test" if int.from_bytes(digest[:8], "big") % TEST_SHARE == 0 else "train"


# --------------------------------------------------------------------------------------------------- helpers
def _int(rng: np.random.Generator, low: int, high: int) -> int:
    """A uniform integer in ``[low, high]`` (inclusive)."""
    return int(rng.integers(low, high + 1))


def _tiny_number(rng: np.random.Generator) -> int:
    """1-digit with probability 0.5, else 2-digit (the tiny model's distribution)."""
    return _int(rng, 1, 9) if rng.random() < 0.5 else _int(rng, 10, 99)


def _n(value: Fraction | int) -> str:
    return format_number(value)


def _signed(value: int) -> str:
    """``+7`` or ``-7``, for writing ``3x+7`` and ``3x-7``."""
    return f"+{value}" if value >= 0 else f"-{-value}"


def _div_step(num: int, den: int, lhs: str = "x") -> str:
    """``x=18/3=6``, ``x=13/4`` or ``x=7``: a division step that shows the reduction only when there is one."""
    quotient = Fraction(num, den)
    if den == 1:
        return f"{lhs}={num}"
    written = f"{num}/{den}"
    return f"{lhs}={written}" if _n(quotient) == written else f"{lhs}={written}={_n(quotient)}"


def _spaced(expr: str) -> str:
    """``93+13*2`` -> ``93 + 13 × 2`` for the instruct wording."""
    return expr.replace("+", " + ").replace("-", " - ").replace("*", " × ").replace("( ", "(")


# --------------------------------------------------------------------------------------------------- level 1
def _level1(rng: np.random.Generator) -> Problem:
    if rng.random() < 0.2:
        x, a = _tiny_number(rng), _tiny_number(rng)
        if rng.random() < 0.5:
            b = x + a
            return Problem(
                1, "equation", f"x+{a}={b}. x=?", f"Solve for x: x + {a} = {b}.", Fraction(x), (f"x={b}-{a}={x}",)
            )
        x, a = max(x, a), min(x, a)
        b = x - a
        return Problem(
            1, "equation", f"x-{a}={b}. x=?", f"Solve for x: x - {a} = {b}.", Fraction(x), (f"x={b}+{a}={x}",)
        )
    n_ops = 1 if rng.random() < 0.5 else 2
    while True:
        numbers = [_tiny_number(rng) for _ in range(n_ops + 1)]
        ops = ["+" if rng.random() < 0.5 else "-" for _ in range(n_ops)]
        acc, steps, ok = numbers[0], [], True
        for op, number in zip(ops, numbers[1:], strict=True):
            new = acc + number if op == "+" else acc - number
            if new < 0:
                ok = False
                break
            steps.append(f"{acc}{op}{number}={new}")
            acc = new
        if ok:
            break
    expr = str(numbers[0]) + "".join(f"{op}{n}" for op, n in zip(ops, numbers[1:], strict=True))
    kind = "add" if set(ops) == {"+"} else "addsub"
    return Problem(1, kind, f"Compute {expr}.", f"Compute {_spaced(expr)}.", Fraction(acc), tuple(steps))


# --------------------------------------------------------------------------------------------------- level 2
def _level2(rng: np.random.Generator) -> Problem:
    a, b, c, d = _int(rng, 2, 12), _int(rng, 2, 12), _int(rng, 2, 99), _int(rng, 2, 12)
    shape = int(rng.integers(0, 6))
    if shape == 0:
        p, r = a * b, a * b + c
        expr, steps = f"{a}*{b}+{c}", (f"{a}*{b}={p}", f"{p}+{c}={r}")
    elif shape == 1:
        p, r = a * b, a * b - c
        expr, steps = f"{a}*{b}-{c}", (f"{a}*{b}={p}", f"{p}-{c}={r}")
    elif shape == 2:
        p, r = b * d, c + b * d
        expr, steps = f"{c}+{b}*{d}", (f"{b}*{d}={p}", f"{c}+{p}={r}")
    elif shape == 3:
        s, r = c + a, (c + a) * d
        expr, steps = f"({c}+{a})*{d}", (f"{c}+{a}={s}", f"{s}*{d}={r}")
    elif shape == 4:
        p, q = a * b, d * _int(rng, 2, 9)
        e = q // d
        r = p - q if rng.random() < 0.5 else p + q
        op = "-" if r == p - q else "+"
        expr, steps = f"{a}*{b}{op}{d}*{e}", (f"{a}*{b}={p}", f"{d}*{e}={q}", f"{p}{op}{q}={r}")
    else:
        e = _int(rng, 2, 9)
        p, r = a * b, a * b * e
        expr, steps = f"{a}*{b}*{e}", (f"{a}*{b}={p}", f"{p}*{e}={r}")
    return Problem(2, "arith", f"Compute {expr}.", f"Compute {_spaced(expr)}.", Fraction(r), steps)


# --------------------------------------------------------------------------------------------------- level 3
def _fraction_sum(p: Fraction, q: Fraction, op: str) -> tuple[Fraction, str]:
    """The result of ``p op q`` and its worked chain, e.g. ``3/4+5/6=9/12+10/12=19/12``."""
    chain = f"{p.numerator}/{p.denominator}{op}{q.numerator}/{q.denominator}"
    if op == "*":
        num, den = p.numerator * q.numerator, p.denominator * q.denominator
    else:
        den = lcm(p.denominator, q.denominator)
        a, b = p.numerator * den // p.denominator, q.numerator * den // q.denominator
        num = a + b if op == "+" else a - b
        if not p.denominator == q.denominator == den:
            chain += f"={a}/{den}{op}{b}/{den}"
    chain += f"={num}/{den}"
    result = Fraction(num, den)
    if result.denominator != den:  # it reduces
        chain += f"={_n(result)}"
    return result, chain


def _level3(rng: np.random.Generator) -> Problem:
    kind = int(rng.integers(0, 3))
    if kind == 0:
        q1, q2 = _int(rng, 2, 12), _int(rng, 2, 12)
        p = Fraction(_int(rng, 1, q1 - 1), q1)
        q = Fraction(_int(rng, 1, q2 - 1), q2)
        op = ("+", "-", "*")[int(rng.integers(0, 3))]
        result, chain = _fraction_sum(p, q, op)
        expr = f"{_n(p)}{op}{_n(q)}"
        return Problem(
            3,
            "fraction",
            f"Compute {expr}.",
            f"Compute {_spaced(expr)} as a fraction in lowest terms.",
            result,
            (chain,),
        )
    if kind == 1:
        den = _int(rng, 2, 9)
        num = _int(rng, 1, den - 1)
        share = Fraction(num, den)
        whole = den * _int(rng, 2, 15)
        part = whole // share.denominator
        result = share * whole
        steps = (f"{whole}/{share.denominator}={part}", f"{part}*{share.numerator}={_n(result)}")
        return Problem(
            3, "fraction_of", f"Compute {_n(share)} of {whole}.", f"What is {_n(share)} of {whole}?", result, steps
        )
    pct = 5 * _int(rng, 1, 19)
    whole = 20 * _int(rng, 1, 25)
    result = Fraction(pct * whole, 100)
    steps = (f"{pct}*{whole}/100={_n(result)}",)
    return Problem(3, "percent", f"Compute {pct}% of {whole}.", f"What is {pct}% of {whole}?", result, steps)


# --------------------------------------------------------------------------------------------------- level 4
def _level4(rng: np.random.Generator) -> Problem:
    kind = int(rng.integers(0, 3))
    if kind == 0:
        a, b = _int(rng, 2, 9), _int(rng, -30, 30) or 1
        m = _int(rng, -40, 60)  # a*x, so x = m/a may be a fraction
        c = m + b
        x = Fraction(m, a)
        moved = f"{c}-{b}" if b >= 0 else f"{c}+{-b}"
        steps = (f"{a}x={moved}={m}", _div_step(m, a))
        eq = f"{a}x{_signed(b)}={c}"
        return Problem(4, "equation", f"{eq}. x=?", f"Solve for x: {_spaced(eq)}.", x, steps)
    if kind == 1:
        a = _int(rng, 3, 9)
        c = _int(rng, 1, a - 1)
        x = _int(rng, -10, 15)
        b = _int(rng, -20, 20)
        d = a * x + b - c * x
        k = a - c
        rhs = d - b
        steps = (f"{a}x-{c}x={d}{_signed(-b)}", f"{k if k != 1 else ''}x={rhs}", _div_step(rhs, k))
        if k == 1:
            steps = steps[:2]
        eq = f"{a}x{_signed(b)}={c}x{_signed(d)}"
        return Problem(4, "equation2", f"{eq}. x=?", f"Solve for x: {_spaced(eq)}.", Fraction(x), steps)
    base = 20 * _int(rng, 1, 30)
    pct = 5 * _int(rng, 1, 19)
    change = Fraction(base * pct, 100)
    if rng.random() < 0.5:
        result, word, op = base + change, "increased", "+"
    else:
        result, word, op = base - change, "decreased", "-"
    steps = (f"{base}*{pct}/100={_n(change)}", f"{base}{op}{_n(change)}={_n(result)}")
    compact = f"{base} {word} by {pct}%. Result?"
    return Problem(
        4,
        "percent_change",
        compact,
        f"A price of {base} dollars is {word} by {pct}%. What is the new price in dollars?",
        result,
        steps,
    )


# --------------------------------------------------------------------------------------------------- level 5
_NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jade", "Kofi", "Lena")
_ITEMS = ("apple", "marble", "sticker", "card", "pencil", "stamp", "shell", "book")


def _word_packs(rng: np.random.Generator) -> Problem:
    name, item = _NAMES[int(rng.integers(len(_NAMES)))], _ITEMS[int(rng.integers(len(_ITEMS)))]
    a, packs, size = _int(rng, 5, 60), _int(rng, 2, 9), _int(rng, 3, 12)
    got = packs * size
    d = _int(rng, 1, a + got - 1)
    result = a + got - d
    text = (
        f"{name} has {a} {item}s, buys {packs} packs of {size} {item}s each, and then gives away {d} {item}s. "
        f"How many {item}s does {name} have now?"
    )
    steps = (f"{packs}*{size}={got}", f"{a}+{got}={a + got}", f"{a + got}-{d}={result}")
    return Problem(5, "word/packs", text, text, Fraction(result), steps)


def _word_change(rng: np.random.Generator) -> Problem:
    name, item = _NAMES[int(rng.integers(len(_NAMES)))], _ITEMS[int(rng.integers(len(_ITEMS)))]
    price, count = _int(rng, 2, 15), _int(rng, 2, 9)
    cost = price * count
    note = next(n for n in (20, 50, 100, 200) if n > cost)
    text = (
        f"A {item} costs {price} dollars. {name} buys {count} of them and pays with a {note}-dollar note. "
        f"How much change, in dollars, does {name} get?"
    )
    steps = (f"{price}*{count}={cost}", f"{note}-{cost}={note - cost}")
    return Problem(5, "word/change", text, text, Fraction(note - cost), steps)


def _word_reading(rng: np.random.Generator) -> Problem:
    name = _NAMES[int(rng.integers(len(_NAMES)))]
    r1, d1, r2, d2 = _int(rng, 5, 30), _int(rng, 2, 7), _int(rng, 5, 30), _int(rng, 2, 7)
    read = r1 * d1 + r2 * d2
    total = read + _int(rng, 1, 200)
    text = (
        f"A book has {total} pages. {name} reads {r1} pages a day for {d1} days, then {r2} pages a day for {d2} days. "
        "How many pages are left?"
    )
    steps = (
        f"{r1}*{d1}={r1 * d1}",
        f"{r2}*{d2}={r2 * d2}",
        f"{r1 * d1}+{r2 * d2}={read}",
        f"{total}-{read}={total - read}",
    )
    return Problem(5, "word/reading", text, text, Fraction(total - read), steps)


def _word_tank(rng: np.random.Generator) -> Problem:
    volume, pct = 10 * _int(rng, 2, 60), 5 * _int(rng, 1, 19)
    filled = Fraction(volume * pct, 100)
    left = volume - filled
    text = f"A tank holds {volume} litres and is {pct}% full. How many more litres are needed to fill it?"
    steps = (f"{volume}*{pct}/100={_n(filled)}", f"{volume}-{_n(filled)}={_n(left)}")
    return Problem(5, "word/tank", text, text, left, steps)


def _word_share(rng: np.random.Generator) -> Problem:
    name = _NAMES[int(rng.integers(len(_NAMES)))]
    people, gift = _int(rng, 2, 8), _int(rng, 5, 40)
    money = _int(rng, 20, 200)
    rest = money - gift if money > gift else money + gift
    verb = "spends" if rest < money else "earns"
    each = Fraction(rest, people)
    text = (
        f"{name} has {money} dollars, {verb} {gift} dollars, and shares the rest equally among {people} friends. "
        "How many dollars does each friend get? Give an exact fraction if needed."
    )
    op = "-" if rest < money else "+"
    steps = (f"{money}{op}{gift}={rest}", _div_step(rest, people, lhs="each"))
    return Problem(5, "word/share", text, text, each, steps)


_WORD_PROBLEMS: tuple[Callable[[np.random.Generator], Problem], ...] = (
    _word_packs, _word_change, _word_reading, _word_tank, _word_share,
)  # fmt: skip

_GENERATORS: dict[int, Callable[[np.random.Generator], Problem]] = {
    1: _level1,
    2: _level2,
    3: _level3,
    4: _level4,
    5: lambda rng: _WORD_PROBLEMS[int(rng.integers(len(_WORD_PROBLEMS)))](rng),
}


# --------------------------------------------------------------------------------------------------- public
def generate(level: int, rng: np.random.Generator) -> Problem:
    """One problem of difficulty ``level`` (1-5), drawn from ``rng``."""
    if level not in _GENERATORS:
        raise ValueError(f"Unknown difficulty level {level!r}; expected an integer from 1 to 5.")
    return _GENERATORS[level](rng)


def sample(level: int, split: str, rng: np.random.Generator, max_tries: int = 10_000) -> Problem:
    """A problem of ``level`` that belongs to ``split`` (``"train"`` or ``"test"``), redrawn until it does.

    Raises:
        RuntimeError: No problem of the split was drawn in ``max_tries`` attempts (cannot happen for the
            bundled levels, whose test share is 1 in :data:`TEST_SHARE`).
    """
    if split not in ("train", "test"):
        raise ValueError(f"Unknown split {split!r}; expected 'train' or 'test'.")
    for _ in range(max_tries):
        problem = generate(level, rng)
        if split_of(problem.canonical) == split:
            return problem
    raise RuntimeError(f"No level-{level} problem of split {split!r} in {max_tries} draws.")
