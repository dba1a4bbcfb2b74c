"""The procedural generator: levels, exact answers, worked steps that check out, and a disjoint split."""

from __future__ import annotations

import ast
import operator
import re
from fractions import Fraction

import numpy as np
import pytest

from lrmgym.core import task_rng
from lrmgym.envs.math.generator import LEVELS, TEST_SHARE, format_number, generate, sample, split_of

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _exact(expr: str) -> Fraction:
    """Evaluate an arithmetic step side with Fractions (only + - * / and integers are allowed)."""

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return Fraction(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError(f"not arithmetic: {ast.dump(node)}")

    return walk(ast.parse(expr, mode="eval"))


def _problems(level: int, n: int, seed: int = 0):
    return [generate(level, task_rng(seed, i)) for i in range(n)]


@pytest.mark.parametrize("level", LEVELS)
def test_answers_are_exact_fractions_and_steps_end_in_the_answer(level):
    for p in _problems(level, 300):
        assert isinstance(p.answer, Fraction)
        assert p.level == level and p.steps and p.compact and p.text
        last = p.steps[-1].split("=")[-1]
        assert Fraction(last) == p.answer, (p.compact, p.steps)
        assert p.answer_text == format_number(p.answer)


@pytest.mark.parametrize("level", LEVELS)
def test_every_arithmetic_step_is_true(level):
    """Each ``a=b=c`` chain in the worked solution holds exactly (the SFT data must not teach errors)."""
    checked = 0
    for p in _problems(level, 300, seed=3):
        for step in p.steps:
            sides = step.split("=")
            if any(re.search(r"[a-z]", s) for s in sides[1:]):
                continue
            values = [_exact(s) for s in sides if not re.search(r"[a-z%]", s)]
            assert len(set(values)) == 1, (p.compact, step)
            checked += 1
    assert checked > 200


def test_equation_answers_solve_the_equation():
    for level in (1, 4):
        for p in _problems(level, 400, seed=5):
            if "x=?" not in p.compact:
                continue
            lhs, rhs = p.compact.split(".")[0].split("=")

            def value(side: str, answer: Fraction = p.answer) -> Fraction:
                side = re.sub(r"(\d)x", r"\1*X", side).replace("x", "X")
                return _exact(side.replace("X", f"({answer.numerator}/{answer.denominator})"))

            assert value(lhs) == value(rhs), p.compact


def test_level1_matches_the_tiny_model_distribution():
    problems = _problems(1, 4000, seed=11)
    equations = [p for p in problems if p.kind == "equation"]
    assert 0.17 < len(equations) / len(problems) < 0.23
    numbers = [int(n) for p in problems if p.kind != "equation" for n in re.findall(r"\d+", p.compact)]
    one_digit = sum(n < 10 for n in numbers) / len(numbers)
    assert 0.4 < one_digit < 0.6  # 0.5 by design, minus the resampling of negative results
    assert all(max(map(int, re.findall(r"\d+", p.compact))) < 200 for p in problems)
    ops = [len(re.findall(r"[+-]", p.compact.removeprefix("Compute "))) for p in problems if p.kind != "equation"]
    assert set(ops) == {1, 2}
    assert all(p.answer >= 0 for p in problems)
    first = problems[0]
    assert re.fullmatch(r"Compute \d+([+-]\d+){1,2}\.|x[+-]\d+=\d+\. x=\?", first.compact)


def test_levels_cover_the_promised_families():
    kinds = {p.kind for level in LEVELS for p in _problems(level, 300, seed=2)}
    assert {"add", "equation", "arith", "fraction", "percent", "fraction_of", "equation2", "percent_change"} <= kinds
    assert {k for k in kinds if k.startswith("word/")} == {
        "word/packs",
        "word/change",
        "word/reading",
        "word/tank",
        "word/share",
    }
    assert any(p.answer.denominator > 1 for p in _problems(3, 100)), "fractions must appear"


def test_same_rng_same_problem_and_streams_differ():
    assert generate(2, task_rng(7, 3)) == generate(2, task_rng(7, 3))
    firsts = {generate(1, task_rng(seed, 0)).compact for seed in range(20)}
    assert len(firsts) >= 15


def test_split_is_a_disjoint_hash_partition():
    """No problem drawn for 'test' can ever be drawn for 'train' (checked on 15 000 + 2 000 problems)."""
    train = {sample(1, "train", task_rng(0, i)).canonical for i in range(15_000)}
    test = {sample(1, "test", task_rng(1, i)).canonical for i in range(2_000)}
    assert not train & test
    assert all(split_of(c) == "train" for c in train) and all(split_of(c) == "test" for c in test)
    assert len(test) > 800, "the test split must not collapse to a handful of problems"
    rng = np.random.default_rng(0)
    share = np.mean([split_of(generate(3, rng).canonical) == "test" for _ in range(5000)])
    assert abs(share - 1 / TEST_SHARE) < 0.02


@pytest.mark.parametrize("level", (2, 3, 4, 5))
def test_split_holds_at_every_level(level):
    train = {sample(level, "train", task_rng(0, i)).canonical for i in range(2000)}
    test = {sample(level, "test", task_rng(0, i)).canonical for i in range(500)}
    assert not train & test


def test_bad_level_and_split_are_clear_errors():
    with pytest.raises(
        ValueError, match=f"^{re.escape('Unknown difficulty level 6; expected an integer from 1 to 5.')}$"
    ):
        generate(6, task_rng(0, 0))
    msg = "Unknown split 'dev'; expected 'train' or 'test'."
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        sample(1, "dev", task_rng(0, 0))


def test_format_number():
    assert [format_number(v) for v in (Fraction(147), Fraction(-3), Fraction(38, 24), 0)] == ["147", "-3", "19/12", "0"]
