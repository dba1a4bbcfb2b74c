"""A small procedural family of programming tasks, so ``Code-v0`` works with no data file at all.

Each template is a short function specification with random parameters (a divisor, a shift, a bound...)
and a reference implementation written here. Task ``i`` draws a template and its parameters from the
task's generator, then draws test inputs; the expected outputs come from running the reference on them in
this (trusted) process, and each becomes one ``assert name(args) == expected`` test.

The prompt shows one example assert, which is **not graded**: the graded tests use other inputs (a lookup
table of the example earns nothing). ``2 * n_tests`` asserts are drawn from ``8 * n_tests`` candidates for
distinct expected values, then joined in twos of different expected values (:func:`~lrmgym.envs.code.heldout.bundle`),
so that a task has ``n_tests`` graded units (fewer when the template's answers allow fewer pairs) and an answer
that ignores its input, such as a constant, passes none of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from lrmgym.envs.code.heldout import bundle, spread
from lrmgym.envs.code.loaders import CodeTask

__all__ = ["TEMPLATES", "Template", "make_procedural_task"]


@dataclass(frozen=True)
class Template:
    """One task family.

    Attributes:
        name: The function the policy must write.
        spec: The statement, formatted with the parameters.
        params: Draws the parameters from a generator.
        reference: Source of a correct solution, formatted with the parameters.
        inputs: Draws one argument tuple from a generator.
    """

    name: str
    spec: str
    params: Callable[[np.random.Generator], dict[str, Any]]
    reference: str
    inputs: Callable[[np.random.Generator, dict[str, Any]], tuple[Any, ...]]


def _ints(rng: np.random.Generator, lo: int = -20, hi: int = 20, max_len: int = 8) -> list[int]:
    return [int(x) for x in rng.integers(lo, hi + 1, size=int(rng.integers(0, max_len + 1)))]


def _word(rng: np.random.Generator, max_len: int = 10) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return "".join(letters[int(i)] for i in rng.integers(0, 26, size=int(rng.integers(0, max_len + 1))))


TEMPLATES: tuple[Template, ...] = (
    Template(
        "sum_multiples",
        "Write a function `sum_multiples(xs)` that returns the sum of the integers in the list `xs` that are "
        "divisible by {k}.",
        lambda rng: {"k": int(rng.integers(2, 8))},
        "def sum_multiples(xs):\n    return sum(x for x in xs if x % {k} == 0)\n",
        lambda rng, p: (_ints(rng),),
    ),
    Template(
        "rotate_left",
        "Write a function `rotate_left(xs)` that returns a new list: the list `xs` rotated left by {k} "
        "positions (wrapping around; an empty list stays empty).",
        lambda rng: {"k": int(rng.integers(1, 6))},
        "def rotate_left(xs):\n    if not xs:\n        return []\n    k = {k} % len(xs)\n    return xs[k:] + xs[:k]\n",
        lambda rng, p: (_ints(rng),),
    ),
    Template(
        "clip_all",
        "Write a function `clip_all(xs)` that returns a new list where every integer of `xs` below {lo} is "
        "replaced by {lo} and every integer above {hi} by {hi}.",
        lambda rng: (lambda lo: {"lo": lo, "hi": lo + int(rng.integers(1, 15))})(int(rng.integers(-10, 5))),
        "def clip_all(xs):\n    return [min(max(x, {lo}), {hi}) for x in xs]\n",
        lambda rng, p: (_ints(rng),),
    ),
    Template(
        "count_letter",
        "Write a function `count_letter(s)` that returns how many times the letter '{c}' occurs in the "
        "lowercase string `s`.",
        lambda rng: {"c": "aeiourst"[int(rng.integers(0, 8))]},
        "def count_letter(s):\n    return s.count('{c}')\n",
        lambda rng, p: (_word(rng, 14),),
    ),
    Template(
        "caesar",
        "Write a function `caesar(s)` that shifts every letter of the lowercase string `s` forward by {k} "
        "places in the alphabet, wrapping from 'z' to 'a'.",
        lambda rng: {"k": int(rng.integers(1, 26))},
        "def caesar(s):\n    return ''.join(chr((ord(ch) - 97 + {k}) % 26 + 97) for ch in s)\n",
        lambda rng, p: (_word(rng),),
    ),
    Template(
        "poly_value",
        "Write a function `poly_value(x)` that returns {a}*x**2 + {b}*x + {c} for an integer `x`.",
        lambda rng: {"a": int(rng.integers(-5, 6)), "b": int(rng.integers(-9, 10)), "c": int(rng.integers(-9, 10))},
        "def poly_value(x):\n    return {a} * x ** 2 + {b} * x + {c}\n",
        lambda rng, p: (int(rng.integers(-50, 51)),),
    ),
    Template(
        "running_max",
        "Write a function `running_max(xs)` that returns the list whose i-th element is the largest of "
        "`xs[0..i]`, plus {k} (so the first element is `xs[0] + {k}`).",
        lambda rng: {"k": int(rng.integers(0, 4))},
        "def running_max(xs):\n    out, best = [], None\n    for x in xs:\n        best = x if best is None else "
        "max(best, x)\n        out.append(best + {k})\n    return out\n",
        lambda rng, p: (_ints(rng),),
    ),
    Template(
        "nth_digit_sum",
        "Write a function `nth_digit_sum(n)` that returns the sum of the decimal digits of the non-negative "
        "integer `n`, taken modulo {m}.",
        lambda rng: {"m": int(rng.integers(2, 12))},
        "def nth_digit_sum(n):\n    return sum(int(d) for d in str(n)) % {m}\n",
        lambda rng, p: (int(rng.integers(0, 10**9)),),
    ),
)


def make_procedural_task(index: int, rng: np.random.Generator, n_tests: int = 5) -> CodeTask:
    """Task ``index``: a template, its parameters and ``n_tests`` asserts, all drawn from ``rng`` (pure)."""
    template = TEMPLATES[int(rng.integers(len(TEMPLATES)))]
    params = template.params(rng)
    reference = template.reference.format(**params)
    namespace: dict[str, Any] = {}
    exec(compile(reference, f"<reference {template.name}>", "exec"), namespace)  # noqa: S102 - our own code
    fn = namespace[template.name]

    def test(args: tuple[Any, ...]) -> tuple[str, str]:
        expected = repr(fn(*args))
        return f"assert {template.name}({', '.join(repr(a) for a in args)}) == {expected}", expected

    example, _ = test(template.inputs(rng, params))
    drawn: dict[str, str] = {}  # test source -> expected value, in order of drawing; the example left out
    for _ in range(8 * n_tests):
        src, expected = test(template.inputs(rng, params))
        if src != example:
            drawn.setdefault(src, expected)
    chosen = spread(list(drawn), 2 * n_tests, drawn.__getitem__)
    units = [{"src": src, "test": True} for src in bundle([(src, drawn[src]) for src in chosen])]
    return CodeTask(
        id=f"code/gen/{index}/{template.name}",
        text=template.spec.format(**params) + "\nFor example, this test must pass:\n" + example,
        units=tuple(units),
        bind={"candidate": template.name},
        entry_point=template.name,
        solution=reference,
        source="procedural",
    )
