r"""Reward integrity, round 3: what the question itself, a name in a chain, a bracket or a percent sign earned.

Each class was reproduced against the verifier before this change, where it was paid:

1. The question's own expression as the answer (``11 \times 9 - 52`` for "Compute 11 × 9 - 52.",
   ``\sqrt{242}`` for "Simplify √242", ``4/6`` for 2/3). Every task now declares an answer form
   (:mod:`lrmgym.envs.math.forms`) and the verifier checks it.
2. A false chain with a name in the middle (``\sqrt{16} = x = 5``).
3. A decimal in brackets skipping the rounding rule (``(0.0000667)`` for 1/15000).
4. Percent read two ways (``50\%`` paid for 50 and for 1/2).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from lrmgym.core import Task
from lrmgym.envs.math import forms, generator, loaders
from lrmgym.envs.math.env import MathEnv
from lrmgym.envs.math.templates import render_solution
from lrmgym.envs.math.verify import verify_answer


def _score(prediction: str, gold: str, **kw) -> float | None:
    return verify_answer(prediction, gold, use_cache=False, **kw).score


# --------------------------------------------------------------------------------------------------- 1. forms
COPIES = [  # (question, gold, the copy, form the task is inferred to have)
    ("Compute 11 × 9 - 52.", "47", r"11 \times 9 - 52", "number"),
    ("Compute 11 × 9 - 52.", "47", "11*9-52", "number"),
    ("Compute 11 × 9 - 52.", "47", "x = 11 \\times 9 - 52", "number"),
    ("Compute $\\dbinom{31}{28}$.", "4495", r"\dbinom{31}{28}", "number"),
    ("Compute $\\dbinom{31}{28}$.", "4495", r"\binom{31}{28}", "number"),
    ("Simplify $\\sqrt{242}$.", r"11\sqrt2", r"\sqrt{242}", "radical"),
    ("Simplify $\\sqrt{242}$.", r"11\sqrt2", r"242^{1/2}", "radical"),
    ("Simplify $\\sqrt{242}$.", r"11\sqrt2", r"\sqrt{2 \cdot 121}", "radical"),
    ("Factor $x^2 - 16$.", "(x-4)(x+4)", "x^2 - 16", "factored"),
    ("Factor $x^2 - 16$.", "(x-4)(x+4)", "x^2-4^2", "factored"),
    ("Factor $x^2 - 16$.", "(x-4)(x+4)", r"1 \cdot (x^2 - 16)", "factored"),
    ("Factor $x^2 - 16$.", "(x-4)(x+4)", "(x^2-16)^1", "factored"),
    ("Express $0.\\overline{6}$ as a common fraction.", r"\frac{2}{3}", r"\frac{4}{6}", "fraction"),
    ("Express $0.\\overline{6}$ as a common fraction.", r"\frac{2}{3}", "0.666667", "fraction"),
    ("Write $\\frac{3}{20}$ as a decimal.", "0.15", r"\frac{3}{20}", "number"),
    ("Compute $\\arcsin \\left( -\\frac{1}{2} \\right).$", r"-\frac{\pi}{6}", r"-\arcsin \frac{1}{2}", "expression"),
    ("Find $\\sum_{k=1}^{n} k$ in terms of $n$.", r"\frac{n(n+1)}{2}", r"\sum_{j=1}^{n} j", "expression"),
    ("What is $\\frac{2}{3}$ of 1?", r"\frac{2}{3}", "4/6", "number"),
    ("Simplify $\\frac{1}{x}+\\frac{1}{x}$.", r"\frac{2}{x}", r"\frac{1}{x}+\frac{1}{x}", "expression"),
    ("Simplify $\\frac{1}{x}+\\frac{1}{x}$.", r"\frac{2}{x}", r"\left(\frac{1}{x} + \frac{1}{x}\right)", "expression"),
]


@pytest.mark.parametrize(("question", "gold", "copy", "form"), COPIES)
def test_copying_the_question_earns_nothing(question, gold, copy, form):
    assert forms.infer_form(question, gold) == form
    assert _score(copy, gold, form=form, question=question) == 0.0
    assert _score(gold, gold, form=form, question=question) == 1.0  # the gold is in its own form


HONEST = [  # (question, gold, an honest answer in the form asked)
    ("Compute 11 × 9 - 52.", "47", "47"),
    ("Compute 11 × 9 - 52.", "47", "x = 47"),
    ("Compute 11 × 9 - 52.", "47", r"11 \times 9 - 52 = 47"),
    ("Compute 11 × 9 - 52.", "47", r"47 \text{ apples}"),
    ("How much does she pay?", "18", r"\$18"),
    ("Simplify $\\sqrt{242}$.", r"11\sqrt2", r"11\sqrt{2}"),
    ("Simplify $\\sqrt{242}$.", r"11\sqrt2", r"\sqrt{242} = 11\sqrt{2}"),
    ("Factor $x^2 - 16$.", "(x-4)(x+4)", "(x+4)(x-4)"),
    ("Express $0.\\overline{6}$ as a common fraction.", r"\frac{2}{3}", "2/3"),
    ("What is $\\frac{2}{3}$ of 1?", r"\frac{2}{3}", "0.666667"),
    ("What is $\\frac{2}{3}$ of 1?", r"\frac{2}{3}", r"\dfrac{2}{3}"),
    ("What is $-\\frac{3}{4}$ of 1?", r"-\frac{3}{4}", r"\frac{-3}{4}"),
    ("What is the angle?", r"90^\circ", "90"),
    ("Express $a+b$ in terms of $k$.", "2k", "2k"),
    ("Enter the equation of the line.", "y = -2x", "y=-2x"),
    ("Simplify $\\frac{1}{x}+\\frac{1}{x}$.", r"\frac{2}{x}", r"\frac{2}{x}"),
]


@pytest.mark.parametrize(("question", "gold", "answer"), HONEST)
def test_answers_in_the_declared_form_still_earn_one(question, gold, answer):
    form = forms.infer_form(question, gold)
    assert _score(answer, gold, form=form, question=question) == 1.0


def test_procedural_copy_attack_earns_nothing_on_every_level():
    env = MathEnv(difficulty=[1, 2, 3, 4, 5])
    rng = np.random.default_rng(0)
    for level in generator.LEVELS:
        for _ in range(40):
            problem = generator.sample(level, "train", rng)
            for copy in forms.question_expressions(problem.text):
                task = Task(
                    id="t",
                    prompt=problem.text,
                    answer=problem.answer_text,
                    metadata={"question": problem.text, "answer_form": problem.answer_form, "template": "plain"},
                )
                verdict = env.verify(task, f"Answer: {copy}")
                assert verdict.score == 0.0, (level, problem.text, copy, verdict.reason)
    env.close()


@pytest.mark.parametrize("level", generator.LEVELS)
def test_procedural_golds_are_in_their_declared_form(level):
    rng = np.random.default_rng(level)
    env = MathEnv(difficulty=level)
    for index in range(30):
        task = env.task_at(index, seed=level)
        assert task.metadata["answer_form"] in forms.FORMS
        question = task.metadata["question"]
        assert forms.form_reason(str(task.answer), task.metadata["answer_form"], question, str(task.answer)) is None
        assert env.verify(task, render_solution(task.metadata["steps"], str(task.answer), "r1")).score == 1.0
    problem = generator.sample(level, "test", rng)
    assert problem.answer_form in forms.FORMS
    env.close()


def test_level3_fractions_declare_lowest_terms():
    rng = np.random.default_rng(3)
    kinds = {}
    for _ in range(200):
        problem = generator.generate(3, rng)
        kinds[problem.kind] = problem.answer_form
    assert kinds == {"fraction": "fraction", "fraction_of": "number", "percent": "number"}


def test_a_rebuilt_task_carries_the_same_form(shared_data):
    for source, split in (("procedural", "train"), ("gsm8k", "test"), ("math500", "test")):
        env = MathEnv(source=source, split=split, data_dir=str(shared_data), difficulty=3)
        first, again = env.task_at(7, seed=11), env.task_at(7, seed=11)
        assert first.metadata["answer_form"] == again.metadata["answer_form"]
        assert first.metadata["answer_form"] == forms.infer_form(first.metadata["question"], str(first.answer)) or (
            source == "procedural"
        )
        env.close()


def test_a_task_without_a_declared_form_gets_one_from_its_question():
    env = MathEnv(template="plain")
    task = Task(id="t", prompt="p", answer="47", metadata={"question": "Compute 11 × 9 - 52.", "template": "plain"})
    assert env.verify(task, r"Answer: 11 \times 9 - 52").score == 0.0
    assert env.verify(task, "Answer: 47").score == 1.0
    env.close()


def test_data_set_golds_verify_against_themselves_in_their_declared_form(shared_data):
    for items in (
        loaders.load_gsm8k(shared_data / "gsm8k" / "test.jsonl", "test"),
        loaders.load_math(shared_data / "math500" / "test.jsonl", "test", source="math500"),
    ):
        for item in items:
            form = item.metadata["answer_form"]
            assert form in forms.FORMS
            why = forms.form_reason(item.answer, form, item.question, item.answer)
            assert why is None, (item.question, item.answer, why)


def test_math500_block_copies_earn_nothing(shared_data):
    rows = [json.loads(line) for line in (shared_data / "math500" / "test.jsonl").read_text().splitlines()]
    paid = []
    for row in rows[:120]:  # the whole set is benchmarks/answer_forms.py's job; a slice keeps this fast
        question, gold = row["problem"], row["answer"]
        form = forms.infer_form(question, gold)
        for block in forms.question_expressions(question):
            if _score(block, gold, form=form, question=question):
                paid.append((question[:60], block, gold))
    assert paid == []


# --------------------------------------------------------------------------------------------------- 2. chains
@pytest.mark.parametrize(
    "answer, gold",
    [
        (r"\sqrt{16} = x = 5", "5"),
        ("3 = x = 4", "4"),
        ("2 + 2 = x = 5", "5"),
        ("3 = x = y = 4", "4"),
        ("3 = f(2) = 4", "4"),
        (r"3 = x^2 = 4", "4"),
        (r"3 = \text{ans} = 4", "4"),
        ("x = 3 = y = 4", "4"),
        ("4 = x = 3", "3"),
    ],
)
def test_a_name_in_the_middle_of_a_false_chain_does_not_hide_it(answer, gold):
    assert _score(answer, gold) == 0.0


@pytest.mark.parametrize("answer, gold", [("x = y = 5", "5"), (r"\sqrt{16} = x = 4", "4"), ("2 + 2 = x = 4", "4")])
def test_a_true_chain_with_names_is_still_correct(answer, gold):
    assert _score(answer, gold) == 1.0


# --------------------------------------------------------------------------------------------------- 3. brackets
@pytest.mark.parametrize(
    "answer",
    [
        "(0.0000667)",
        "{0.0000667}",
        "[0.0000667]",
        r"\{0.0000667\}",
        r"\left(0.0000667\right)",
        "((0.0000667))",
        "-(-0.0000667)",
        "x = (0.0000667)",
        r"\boxed{(0.0000667)}",
    ],
)
def test_brackets_do_not_skip_the_rounding_rule(answer):
    assert _score(answer, "1/15000") == 0.0


@pytest.mark.parametrize(
    "answer",
    [
        "0.0000667.",
        r"\displaystyle 0.0000667",
        r"0.0000667\text{ }",
        r"0.0000667 \text{ m}",
        r"0.0000667 \, \mathrm{m}",
        r"x \approx 0.0000667",
        r"0.0000667^\circ",
        r"\lbrace 0.0000667 \rbrace",
        "- -0.0000667",
    ],
)
def test_no_other_wrapper_skips_the_rounding_rule(answer):
    """Siblings of the bracket class: units, \\approx, a final period... were read by math-verify at 6 places."""
    assert _score(answer, "1/15000") == 0.0
    assert _score(answer.replace("0.0000667", "0.0000666667"), "1/15000") == 1.0


@pytest.mark.parametrize("answer", ["(0.0)", "{0.0}", "[0]", "(0.000000)"])
def test_a_bracketed_zero_is_not_paid_for_a_small_gold(answer):
    assert _score(answer, "1/3000000") == 0.0


@pytest.mark.parametrize("answer", ["(0.0000666667)", "{0.0000666667}", "(1/15000)"])
def test_bracketed_numbers_at_the_right_precision_are_correct(answer):
    assert _score(answer, "1/15000") == 1.0


def test_bracketed_decimal_against_an_expression_gold_is_rounded_too():
    assert _score("(0.0000628)", r"\frac{\pi}{50000}") == 0.0


# --------------------------------------------------------------------------------------------------- 4. percent
def test_percent_means_one_hundredth_unless_the_question_asks_for_a_percent():
    plain = "What fraction of the cake is left?"
    asks = "What percent of the cake is left?"
    assert forms.infer_form(asks, "50") == "percent"
    assert forms.infer_form(plain, "1/2") == "number"
    # a question that does not ask for a percent: 50% is 1/2, never 50
    assert _score(r"50\%", "1/2", form="number", question=plain) == 1.0
    assert _score(r"50\%", "50", form="number", question=plain) == 0.0
    # a question that asks for a percent: the number of percent is the answer
    assert _score(r"50\%", "50", form="percent", question=asks) == 1.0
    assert _score("50", "50", form="percent", question=asks) == 1.0
    assert _score(r"50\%", "1/2", form="percent", question=asks) == 0.0
    assert _score("0.5", "50", form="percent", question=asks) == 0.0


@pytest.mark.parametrize(
    "answer, gold, score",
    [
        (r"50\%", "50", 0.0),
        (r"50\%", "1/2", 1.0),
        ("50%", "50", 0.0),
        (r"50 \text{ percent}", "50", 0.0),
        (r"50\,\%", "50", 0.0),
        (r"x = 50\%", "50", 0.0),
        (r"12.5\%", "1/8", 1.0),
        (r"\frac{1}{2}\%", "1/200", 1.0),
        (r"10\%", r"10\%", 1.0),
        ("10", r"10\%", 1.0),
        ("0.1", r"10\%", 0.0),
    ],
)
def test_percent_has_one_reading_per_pair(answer, gold, score):
    assert _score(answer, gold) == score


def test_the_form_check_never_raises_on_a_huge_numeral():
    huge = "\\frac{" + "4" * 5000 + "}{" + "6" * 5000 + "}\\sqrt{2}"
    for form in ("number", "radical"):
        question = "Simplify $\\sqrt{8}$."
        verdict = verify_answer(huge, r"2\sqrt{2}", form=form, question=question, max_answer_chars=20_000)
        assert verdict.score == 0.0
