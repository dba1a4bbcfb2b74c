"""The rule-based pairwise judge: exact step checking, rule order, symmetry, hostile input."""

from __future__ import annotations

import itertools
import re
import time

import pytest

from lrmgym.core import Completion, Task
from lrmgym.judges.pairwise_rule import (
    RulePairwiseJudge,
    RulePairwiseJudgeConfig,
    _evaluate,
    check_steps,
    first_error_rank,
    problem_numbers,
    verified_work,
)

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
NEAR = Completion("<think>93+13=106;106+41=147</think><answer>146</answer>")  # steps right, answer off by 1
NONE = Completion("I do not know")
APPENDED = Completion("<think>93+13=106;106+41=147</think><answer>147</answer> and more")


@pytest.mark.parametrize(
    ("first", "second", "outcome"),
    [
        (GOOD, SLIP, 1.0),  # more correct work (SLIP's first step is wrong)
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
    expected = "criteria must be a non-empty list of arithmetic, first_error, distance, format; got []."
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        RulePairwiseJudge(())


# ---- issue 35.10: a trace earns its rank with correct work, not by writing nothing
SUB = Task(id="m/1", prompt="Compute 97 - 75.", answer="22")
RIGHT = Completion("<think>97-75=22</think><answer>23</answer>")  # one correct step, answer off by one
ALL_WRONG = Completion("<think>97-75=21;21+1=23</think><answer>23</answer>")  # its first step is wrong
EMPTY = Completion("<think></think><answer>23</answer>")  # no work at all, the same answer
PADDED = Completion("<think>1+1=2;2+2=4;97-75=21</think><answer>23</answer>")  # ungrounded padding, then wrong
REPEATED = Completion("<think>" + "97-75=22;" * 5 + "22+1=24</think><answer>23</answer>")  # one step, repeated


@pytest.mark.parametrize(
    ("text", "work"),
    [
        (RIGHT.text, (1, 1, True)),
        (ALL_WRONG.text, (0, 0, False)),
        (EMPTY.text, (0, 0, False)),
        (PADDED.text, (0, 0, False)),  # 1+1 and 2+2 use no number of the problem: not work
        (REPEATED.text, (1, 1, False)),  # the same equation counts once; then 22+1=24 is wrong
        ("<think>97-75=22;22+97=119;119-75=44</think>", (3, 3, True)),  # a counted step's result is grounded
        ("<think>97-75=22;22*2=44</think>", (1, 1, True)),  # 2 is not a number of the problem
        ("<think>97-75=22;22+97=120;120-75=45;97+75=172</think>", (1, 2, False)),  # first error at step 2;
        # 120-75=45 is right but starts from the wrong step's result, so it is not counted
    ],
)
def test_verified_work_counts_grounded_distinct_steps_up_to_the_first_error(text, work):
    assert verified_work(text, problem_numbers(SUB)) == work


@pytest.mark.parametrize(
    ("first", "second", "outcome"),
    [
        (RIGHT, EMPTY, 1.0),  # correct work beats no work
        (RIGHT, ALL_WRONG, 1.0),
        (EMPTY, ALL_WRONG, 0.5),  # no correct work either way, same answer and format: a tie, not a win
        (EMPTY, PADDED, 0.5),
        (RIGHT, REPEATED, 1.0),  # the same correct work; REPEATED then errs
    ],
)
def test_an_empty_trace_does_not_beat_wrong_work_and_loses_to_right_work(first, second, outcome):
    judge = RulePairwiseJudge()
    assert judge.compare(SUB, first, second) == outcome
    assert judge.compare(SUB, second, first) == 1.0 - outcome


# ---- issue 38 item 2: the comparison by first-error position (testbed-style traces)
CHAIN = Task(id="t/0", prompt="Q:Compute 12-3+4. A:", answer="13")
CLEAN = Completion("<think>Let 12-3=9;9+4=13</think><answer>13</answer>")  # no error: 2 verified steps
DIRECT = Completion("<think>So 12-3+4=13</think><answer>13</answer>")  # no error: 1 verified step
LATE = Completion("<think>Let 12-3=9;9+4=13;13+1=15</think><answer>15</answer>")  # first error after 2 steps
MIDDLE = Completion("<think>Let 12-3=9;9+4=14</think><answer>14</answer>")  # first error after 1 step
CAUGHT = Completion("<think>Let 12-3=8;chk 8+3=11 no;12-3=9;9+4=13</think><answer>13</answer>")  # caught slip
EARLY = Completion("<think>So 12-3+4=14</think><answer>14</answer>")  # first error at once
BLANK = Completion("<think></think><answer>13</answer>")  # nothing written


@pytest.mark.parametrize(
    ("text", "rank"),
    [
        (CLEAN.text, (2, 0)),
        (DIRECT.text, (2, 0)),
        (LATE.text, (1, 2)),
        (MIDDLE.text, (1, 1)),
        (CAUGHT.text, (1, 0)),  # the slip 12-3=8 is the first step: an error at position 0, caught or not
        (EARLY.text, (1, 0)),
        (BLANK.text, (0, 0)),
        ("<think>Let 5*100=500</think>", (0, 0)),  # an ungrounded correct step is not work: nothing verified
    ],
)
def test_first_error_rank_by_hand(text, rank):
    assert first_error_rank(text, problem_numbers(CHAIN)) == rank


@pytest.mark.parametrize(
    ("first", "second", "outcome"),
    [
        (LATE, MIDDLE, 1.0),  # the later first error wins
        (MIDDLE, CAUGHT, 1.0),
        (CAUGHT, EARLY, 0.5),  # both err first at position 0: a tie on this criterion
        (CAUGHT, BLANK, 1.0),  # nothing written ranks lowest
        (EARLY, BLANK, 1.0),
        (DIRECT, LATE, 1.0),  # no error and some work beats any error, however late
        (CLEAN, DIRECT, 0.5),  # two error-free traces tie on this criterion (the next criterion decides)
    ],
)
def test_first_error_criterion_compares_first_error_positions(first, second, outcome):
    judge = RulePairwiseJudge(("first_error",))
    assert judge.compare(CHAIN, first, second) == outcome
    assert judge.compare(CHAIN, second, first) == 1.0 - outcome


def test_first_error_differs_from_arithmetic_where_a_late_error_follows_more_work():
    # arithmetic ranks by correct steps before the first error first: LATE's 2 beat DIRECT's 1.
    assert RulePairwiseJudge(("arithmetic",)).compare(CHAIN, LATE, DIRECT) == 1.0
    # first_error: DIRECT has no error at all, so it wins.
    assert RulePairwiseJudge(("first_error",)).compare(CHAIN, LATE, DIRECT) == 0.0
    # arithmetic calls no work against a first-step error a tie (issue 35.10); first_error ranks nothing lowest.
    assert RulePairwiseJudge(("arithmetic",)).compare(CHAIN, EARLY, BLANK) == 0.5
    assert RulePairwiseJudgeConfig(criteria=["first_error", "distance"]).build().compare(CHAIN, EARLY, BLANK) == 1.0


def test_first_error_then_distance_breaks_ties_among_error_free_traces():
    near = Completion("<think>So 12-3+4=13</think><answer>12</answer>")
    judge = RulePairwiseJudge(("first_error", "distance"))
    assert judge.compare(CHAIN, CLEAN, near) == 1.0
    for a, b in itertools.permutations([CLEAN, DIRECT, LATE, MIDDLE, CAUGHT, EARLY, BLANK, near], 2):
        assert judge.compare(CHAIN, a, b) == 1.0 - judge.compare(CHAIN, b, a)
