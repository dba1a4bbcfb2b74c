"""The rule-based pairwise judge: exact step checking, rule order, symmetry, hostile input."""

from __future__ import annotations

import itertools
import re
import time

import pytest

from lrmgym.core import Completion, Task
from lrmgym.judges.pairwise_rule import RulePairwiseJudge, RulePairwiseJudgeConfig, _evaluate, check_steps

TASK = Task(id="m/0", prompt="Q:Compute 93+13+41. A:", answer="147")


@pytest.mark.parametrize(
    ("expr", "value"),
    [("1+2*3", 7), ("(1+2)*3", 9), ("-3+5", 2), ("7/2", 3.5), ("2.5*4", 10), ("10-2-3", 5), ("8/4/2", 1),
     ("6×7", 42), ("9÷3", 3), ("-(2+3)", -5), ("2*-3", -6)],
)  # fmt: skip
def test_evaluate_is_exact_with_precedence(expr, value):
    assert _evaluate(expr) == value


def test_division_by_zero_is_a_wrong_step():
    with pytest.raises(ZeroDivisionError):
        _evaluate("1/(2-2)")
    assert check_steps("1/0=3, 2+2=4") == (1, 1)


@pytest.mark.parametrize("expr", ["2**3", "1+", "(1+2", "1+2)", "()", "1 2", "abc", "", "+"])
def test_evaluate_rejects_malformed_input(expr):
    assert _evaluate(expr) is None


@pytest.mark.parametrize(
    ("text", "counts"),
    [
        ("<think>93+13=106;106+41=147</think><answer>147</answer>", (2, 0)),
        ("<think>93+13=105;105+41=146</think>", (1, 1)),
        ("12*(3+4)=84, then 7/2 = 3.5 and 84-3.5=80", (2, 1)),
        ("x-50=42 so x=92", (0, 0)),  # not arithmetic steps: a variable, a bare assignment
        ("no equations here", (0, 0)),
    ],
)
def test_check_steps(text, counts):
    assert check_steps(text) == counts


@pytest.mark.parametrize(
    "text", ["1+" * 500_000, "=" * 1_000_000, "(" * 100_000 + "1=1", "9" * 10**6 + "=9", "1+1=2" * 200_000]
)
def test_hostile_traces_are_scanned_quickly(text):
    start = time.perf_counter()
    check_steps(text)
    RulePairwiseJudge().compare(TASK, Completion(text), Completion("<answer>147</answer>"))
    assert time.perf_counter() - start < 2.0


GOOD = Completion("<think>93+13=106;106+41=147</think><answer>147</answer>")
SLIP = Completion("<think>93+13=107;107+41=148</think><answer>148</answer>")  # one wrong step, answer off by 1
FAR = Completion("<think>93+13=106;106+41=147</think><answer>200</answer>")  # steps right, answer far
NEAR = Completion("<think>93+13=106;106+40=146</think><answer>146</answer>")  # steps right, answer off by 1
NONE = Completion("I do not know")
APPENDED = Completion("<think>93+13=106;106+41=147</think><answer>147</answer> and more")


@pytest.mark.parametrize(
    ("first", "second", "outcome"),
    [
        (GOOD, SLIP, 1.0),  # fewer wrong steps
        (SLIP, FAR, 0.0),  # arithmetic decides before distance
        (NEAR, FAR, 1.0),  # same steps: nearer answer
        (FAR, NONE, 1.0),  # a numeric answer beats none
        (GOOD, APPENDED, 1.0),  # same steps and answer: strict format decides
        (GOOD, Completion(GOOD.text), 0.5),
    ],
)
def test_rules_apply_in_order(first, second, outcome):
    judge = RulePairwiseJudge()
    assert judge.compare(TASK, first, second) == outcome
    assert judge.compare(TASK, second, first) == 1.0 - outcome


def test_outcomes_are_antisymmetric_over_all_pairs():
    judge = RulePairwiseJudge()
    for a, b in itertools.permutations([GOOD, SLIP, FAR, NEAR, NONE, APPENDED], 2):
        assert judge.compare(TASK, a, b) == 1.0 - judge.compare(TASK, b, a)


def test_criteria_can_be_chosen():
    assert RulePairwiseJudge(("format",)).compare(TASK, SLIP, FAR) == 0.5
    assert RulePairwiseJudgeConfig(criteria=["distance"]).build().compare(TASK, SLIP, FAR) == 1.0
    with pytest.raises(
        ValueError, match=f"^{re.escape('criteria must be a non-empty list of arithmetic, distance, format; got [].')}$"
    ):
        RulePairwiseJudge(())
