r"""Reward integrity of the math verifier: what a policy can be paid for without answering the question.

Three classes, each reproduced against the first-wave verifier before it was fixed:

9. Opting out: a prediction that makes the checker time out, crash or fail must score 0, not ungradeable
   (a masked sample is strictly better for a policy than a wrong one). Only our failures (a gold that does
   not parse, a worker that cannot start, a stall while the *gold* is being read) stay ungradeable.
10. Several values in one answer: chains (``3=4``), steps (``3 \to 4``), line breaks, environments, hidden
    content, self-corrections. math-verify grades the last value it finds; we grade the whole answer.
11. math-verify's own leniency (base subscripts, 6-decimal rounding on small numbers) and two of its false
    negatives (``3e3``, ``e^{i\pi}``), each recorded with math-verify's raw verdict beside ours.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from math_verify import parse, verify

from lrmgym.core import Completion, Task
from lrmgym.envs.math import verify as mv
from lrmgym.envs.math.env import MathEnv
from lrmgym.envs.math.shape import base_numeral, hedge_reason, sole_block
from lrmgym.envs.math.verify import VerifierPool, verify_answer

SLACK_S = 1.0
T = 1.0  # the checker's budget in these tests


@pytest.fixture(scope="module")
def pool():
    p = VerifierPool(size=2)
    p.warm()
    yield p
    p.close()


def _v(pred, gold, pool, **kw):
    return verify_answer(pred, gold, pool=pool, use_cache=False, timeout_s=kw.pop("timeout_s", T), **kw)


def _boxed(env, answer, gold):
    task = Task(id="integrity", prompt="", answer=gold, metadata={"template": "boxed"})
    return env.verify(task, Completion(f"The answer is $\\boxed{{{answer}}}$."))


# ------------------------------------------------------------------------------------------------ 9. opt-outs
BOMBS = [
    "9^{9^{9}}",
    "10^{10^{10}}",
    "7^{123456789}",
    "10000000!",
    "(10!)!",
    "\\Gamma(10^{10})",
    "\\binom{10^9}{5\\cdot 10^8}",
    "\\int_{0}^{1} e^{x^{2}} \\sin(x^{3}) dx",
    "\\sum_{n=1}^{10^{7}} \\frac{1}{n^{2}}",
    "\\prod_{n=1}^{10^{6}} n",
    "(x+1)^{10000}",
    "\\dfrac{5^{\\left(5^{\\left(5^{\\left(5^5\\right)}\\right)} - 4\\right)} - 5}{16}",
]


@pytest.mark.parametrize("pred", BOMBS)
def test_a_prediction_that_exhausts_the_budget_scores_zero(pred, pool):
    start = time.perf_counter()
    v = _v(pred, "1", pool)
    assert time.perf_counter() - start < T + SLACK_S
    assert v.score == 0.0 and v.correct is False, v.reason
    assert v.reason in ("incorrect", f"incorrect: the answer exhausted the checker's {T:g} s budget"), v.reason


def test_budget_exhaustion_reason_names_the_budget(pool):
    v = _v("9^{9^{9}}", "1", pool)
    assert (v.score, v.reason) == (0.0, "incorrect: the answer exhausted the checker's 1 s budget")


def test_a_worker_stuck_on_the_prediction_is_killed_and_the_answer_scores_zero():
    """C code that ignores the worker's own timer (the ``stall`` hook) while the *prediction* is compared."""
    with VerifierPool(size=1) as private:
        private.warm()
        start = time.perf_counter()
        reply = private._run({"gold": "1", "pred": "1", "budget": 0.1, "stall": 30}, timeout_s=0.5)
        assert time.perf_counter() - start < 0.5 + SLACK_S
        assert reply == {"status": "hard_timeout", "equal": False, "phase": "pred"}
        outcome = mv._slow_outcome(reply, 0.5)
        assert (outcome.score, outcome.reason) == (0.0, "incorrect: the answer exhausted the checker's 0.5 s budget")


def test_a_stall_while_reading_the_gold_is_our_failure():
    with VerifierPool(size=1) as private:
        private.warm()
        reply = private._run({"gold": "1", "pred": "1", "budget": 0.1, "stall": 30, "stall_in": "gold"}, timeout_s=0.5)
        assert reply == {"status": "hard_timeout", "equal": False, "phase": "gold"}
        outcome = mv._slow_outcome(reply, 0.5)
        assert outcome.score is None and outcome.reason.startswith("ungradeable: the reference answer")


def test_a_worker_that_dies_on_the_prediction_scores_zero():
    """A crash (here SIGKILL from outside, as the OOM killer would) during the prediction's check is its fault."""
    with VerifierPool(size=1) as private:
        private.warm()
        (pid,) = private.worker_pids()
        box = []
        thread = threading.Thread(target=lambda: box.append(_v("9^{9^{9}}", "1", private, timeout_s=10.0)))
        thread.start()
        end = time.monotonic() + 5.0  # kill it once it has said it is on the prediction
        while time.monotonic() < end and not any(w.phase == "pred" for w in list(private._live)):
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)
        thread.join(15)
        (v,) = box
        assert v.score == 0.0 and v.reason == "incorrect: the checker's worker died on the answer", v.reason
        assert _v("\\sqrt{9}", "3", private).correct  # a fresh worker answers


def test_a_memory_blow_up_on_the_prediction_scores_zero():
    """An allocation past the worker's memory cap (RLIMIT_AS, 3 GiB) while the prediction is checked."""
    with VerifierPool(size=1) as private:
        private.warm()
        reply = private._run({"gold": "1", "pred": "1", "budget": 2.0, "hog": 8 << 30}, timeout_s=3.0)
        assert reply == {"status": "error", "equal": False, "error": "MemoryError", "phase": "pred"}
        outcome = mv._slow_outcome(reply, 3.0)
        assert (outcome.score, outcome.reason) == (0.0, "incorrect: the checker failed on the answer (MemoryError)")
        reply = private._run({"gold": "1", "pred": "1", "budget": 2.0, "hog": 8 << 30, "stall_in": "gold"}, 3.0)
        assert reply["phase"] == "gold" and mv._slow_outcome(reply, 3.0).score is None  # on the gold: ours
        assert _v("\\sqrt{9}", "3", private).correct  # the worker survived its MemoryError


def test_the_memory_cap_can_be_set(monkeypatch):
    monkeypatch.setenv("LRMGYM_VERIFIER_MEMORY_BYTES", str(1 << 30))
    with VerifierPool(size=1) as private:
        private.warm()
        reply = private._run({"gold": "1", "pred": "1", "budget": 2.0, "hog": 2 << 30}, timeout_s=3.0)
        assert (reply["status"], reply.get("error")) == ("error", "MemoryError")


@pytest.mark.parametrize(
    ("reply", "score", "reason"),
    [
        ({"status": "timeout", "phase": "pred"}, 0.0, "incorrect: the answer exhausted the checker's 2 s budget"),
        (
            {"status": "error", "phase": "pred", "error": "MemoryError"},
            0.0,
            "incorrect: the checker failed on the answer (MemoryError)",
        ),
        ({"status": "crashed", "phase": "pred"}, 0.0, "incorrect: the checker's worker died on the answer"),
        (
            {"status": "timeout", "phase": "gold"},
            None,
            "ungradeable: the reference answer could not be read within 2 s",
        ),
        (
            {"status": "error", "phase": "gold", "error": "ValueError"},
            None,
            "ungradeable: the reference answer could not be read (ValueError)",
        ),
        (
            {"status": "crashed", "phase": "gold"},
            None,
            "ungradeable: the verifier worker crashed before reading the answer",
        ),
        ({"status": "gold_unparsed"}, None, "ungradeable: the reference answer could not be parsed"),
        ({"status": "unavailable", "error": "no worker"}, None, "ungradeable: verifier unavailable (no worker)"),
    ],
)
def test_only_our_failures_are_ungradeable(reply, score, reason):
    outcome = mv._slow_outcome({"equal": False, **reply}, 2.0)
    assert (outcome.score, outcome.reason) == (score, reason)


def test_no_worker_at_all_is_ungradeable(monkeypatch):
    def refuse(cls, *args, **kwargs):
        raise RuntimeError("no worker")

    monkeypatch.setattr(mv._Worker, "start", classmethod(refuse))
    with VerifierPool(size=1) as private:
        v = _v("\\sqrt{2}", "1", private)
    assert v.score is None and v.reason.startswith("ungradeable: verifier unavailable"), v.reason


# ------------------------------------------------------------------------------------------------ 10. one value
HEDGES = [
    # (prediction, gold): each currently paid for its last (or first) value
    ("3=4", "4"),
    ("x=3=4", "4"),
    ("3 \\to 4", "4"),
    ("3 \\implies 4", "4"),
    ("3 | 4", "4"),
    ("3 \\\\ 4", "4"),
    ("\\begin{cases}3\\\\4\\end{cases}", "4"),
    ("\\begin{cases}3\\\\4\\end{cases}", "3"),
    ("$3$ or $4$", "4"),
    ("4. Actually no: 3", "3"),
    # siblings found while fixing those
    ("(3=4)", "4"),
    ("\\{3=4\\}", "4"),
    ("3 = 4 = 4", "4"),
    ("3 \\equiv 4", "4"),
    ("3 \\approx 4", "3"),
    ("x = 1/3 \\approx 1.3", "1/3"),
    ("\\sqrt{16} = 5", "5"),
    ("4 = 2 + 1", "3"),
    ("3\\text{ cm} = 4", "4"),
    ("\\boxed{3} = 4", "3"),
    ("3 \\Rightarrow 4", "4"),
    ("3 \\Longrightarrow 4", "4"),
    ("3 \\iff 4", "4"),
    ("3 \\mapsto 4", "4"),
    ("3 \\therefore 4", "4"),
    ("3 \\lor 4", "4"),
    ("3 \\mid 4", "4"),
    ("3 := 4", "4"),
    ("3 \\sim 4", "4"),
    ("3 \\cong 4", "4"),
    ("3 || 4", "4"),
    ("3 \\cr 4", "4"),
    ("3 \\par 4", "4"),
    ("3 \\\\[1em] 4", "4"),
    ("\\begin{aligned}x&=3\\\\x&=4\\end{aligned}", "4"),
    ("3 ~\\text{or}~ 4", "4"),
    ("3 \\text{ (or } 4)", "4"),
    ("\\cancel{3} 4", "4"),
    ("\\sout{3} 4", "4"),
    ("\\not 3 4", "4"),
    ("\\tag{3} 4", "4"),
    ("3 \\hphantom{0} 4", "4"),
    ("\\phantom{3}4", "7"),
    ("3 \\quad 4", "7"),
    ("3 \\; 4", "7"),
    ("3 \\! 4", "7"),
    ("3\n4", "7"),
    ("2 3", "5"),
    ("3, 4", "4"),
    ("3 \\text{ or } 4", "4"),
    ("x = 3, x = 4", "4"),
    ("3 \\pm 1", "4"),
    ("\\det\\begin{pmatrix} x & 1 \\\\ 1 & x \\end{pmatrix}^{1000}", "1"),
    ("3 \\text{ is wrong, the answer is } 4", "4"),
    ("4 \\text{ (the answer is correct)}", "3"),
]


@pytest.mark.parametrize(("pred", "gold"), HEDGES)
def test_an_answer_with_more_than_one_value_scores_zero(pred, gold, pool):
    v = _v(pred, gold, pool)
    assert v.score == 0.0 and v.correct is False, v.reason


def test_hedges_score_zero_through_the_env():
    env = MathEnv(template="boxed", timeout_s=T)
    for pred, gold in HEDGES:
        v = _boxed(env, pred, gold)
        assert v.score == 0.0, (pred, gold, v.reason)


def test_several_boxes_in_one_answer_tag_score_zero():
    env = MathEnv(template="r1", timeout_s=T)
    task = Task(id="integrity", prompt="", answer="4", metadata={"template": "r1"})
    for answer in ("\\boxed{3} \\boxed{4}", "\\boxed{3} or \\boxed{4}", "\\boxed{3}, \\boxed{4}"):
        v = env.verify(task, Completion(f"<think>w</think><answer>{answer}</answer>"))
        assert v.score == 0.0, (answer, v.reason)


LEGIT = [
    ("x=3", "3"),
    ("x = 3", "x=3"),
    ("\\frac{1}{2}", "0.5"),
    ("\\frac 1 2", "\\frac12"),
    ("(3, 4]", "(3,4]"),
    ("\\{1, -2\\}", "1,-2"),
    ("x = 1 \\text{ or } x = -2", "1,-2"),
    ("1, 2, 3", "\\{1,2,3\\}"),
    ("3\\text{ cm}", "3"),
    ("15\\text{ cm}^2", "15\\mbox{ cm}^2"),
    ("2+3=5", "5"),
    ("x = 2 + 3 = 5", "5"),
    ("4 = 3 + 1", "4"),
    ("\\sqrt{16} = 4", "4"),
    ("y = 2x + 3", "y = 2x + 3"),
    ("2x + 3", "y = 2x + 3"),
    ("y=-2x", "y = -2x"),
    ("5x - 7y + 11z + 4 = 0", "5x - 7y + 11z + 4 = 0"),
    ("x \\approx 11", "11"),
    ("x^2 = 4", "4"),
    ("AB = 5", "5"),
    ("f(2) = 5", "5"),
    ("1 000", "1000"),
    ("10,\\!080", "10080"),
    ("3 \\pm 2\\sqrt{2}", "3 \\pm 2 \\sqrt{2}"),
    ("x \\in [-2,7]", "x \\in [-2,7]"),
    ("\\begin{pmatrix} -1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} -1 \\\\ 2 \\end{pmatrix}"),
    ("x \\in (-2, 3)", "(-2, 3)"),
    ("3 > x", "x < 3"),
    ("\\lim_{x \\to 0} \\frac{\\sin x}{x}", "1"),
    ("|x - 1| + 2", "|x-1|+2"),
    ("3\\frac{1}{2}", "\\frac72"),
    ("12:00", "12:00"),
    ("90^\\circ", "90"),
    ("\\$32,\\!348", "32348"),
    ("\\text{(C)}", "\\text{(C)}"),
]


@pytest.mark.parametrize(("pred", "gold"), LEGIT)
def test_one_value_answers_still_score_one(pred, gold, pool):
    v = _v(pred, gold, pool, timeout_s=5.0)
    assert v.score == 1.0, v.reason


# ------------------------------------------------------------------------------------------------ 11. leniency
def _math_verify(gold: str, pred: str) -> bool:
    """math-verify's own verdict, called as its README shows (trusted strings only: this runs in-process)."""
    return bool(verify(parse(gold), parse(pred)))


INHERITED = [
    # (gold, pred, math-verify's verdict, ours)
    ("$52_8$", "$52$", True, False),  # the base subscript is dropped
    ("$204_8$", "$204_5$", True, False),  # ... on both sides
    ("$52$", "$52_8$", True, False),  # 52 in base 8 is 42
    ("$52_8$", "$52_{8}$", True, True),
    ("$52_8$", "$(52)_8$", False, True),
    ("$0.0000674$", "$0.0000672$", True, False),  # 6 decimals are 2 significant figures here
    ("$0.0000674$", "$6.72 \\times 10^{-5}$", True, False),
    ("$\\frac{\\pi}{50000}$", "$0.0000628$", True, False),
    ("$0.15$", "$0.1500004$", True, False),  # 0.15 is exact; 0.1500004 is another number
    ("$0.5$", "$0.4999996$", True, False),
    ("$1/3$", "$0.333333$", True, True),  # a correct rounding to 6 significant figures is kept
    ("$\\frac{\\sqrt{2}}{2}$", "$0.7071068$", True, True),
    ("$3000$", "$3e3$", False, True),  # math-verify reads 3e3 as 3*e*3
    ("$0.0015$", "$1.5e-3$", False, True),
    ("$-1$", "$e^{i\\pi}$", False, True),  # math-verify never reads a lower-case i as the imaginary unit
    ("$-1$", "$i^2$", False, True),
]


@pytest.mark.parametrize(("gold", "pred", "theirs", "ours"), INHERITED)
def test_inherited_leniency_against_math_verify(gold, pred, theirs, ours, pool):
    assert _math_verify(gold, pred) is theirs
    v = _v(pred, gold, pool, timeout_s=5.0)
    assert v.correct is ours and v.score == float(ours), v.reason


def test_rounding_rule_on_the_fast_path():
    assert mv._fast_verdict("0.0000672", "0.0000674") == (False, "incorrect (different numbers)")
    assert mv._fast_verdict("0.333333", "1/3")[0] is True
    assert mv._fast_verdict("0.33333", "1/3")[0] is False
    assert mv._fast_verdict("2.9999999", "3")[0] is False
    assert mv._fast_verdict("3e3", "3000") == (True, "correct (equal numbers)")
    assert mv._fast_verdict("1e999999", "1") is None  # exponent past the cap: never build the number


# ------------------------------------------------------------------------------------------------ string rules
@pytest.mark.parametrize(
    ("answer", "gold", "reason"),
    [
        ("3 \\to 4", "4", "the answer is a chain of steps or alternatives (\\to)"),
        ("3 → 4", "4", "the answer is a chain of steps or alternatives (→)"),
        ("3 -> 4", "4", "the answer is a chain of steps or alternatives (->)"),
        ("3 \\\\ 4", "4", "the answer spans several lines (\\\\)"),
        ("\\begin{cases}3\\\\4\\end{cases}", "4", "the answer uses \\begin{cases} (several lines or values)"),
        ("\\phantom{3}4", "7", "the answer has hidden or struck-out content (\\phantom)"),
        ("3 \\quad 4", "7", "the answer has several numbers side by side (3 4)"),
        ("\\boxed{3}\\boxed{4}", "4", "the answer holds 2 \\boxed{} answers"),
        # what stays allowed
        ("\\lim_{x \\to 0} \\frac{\\sin x}{x}", "1", None),  # an arrow in a subscript
        ("x \\mapsto 2x", "x \\mapsto 2x", None),  # the gold uses it
        ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", None),
        ("1 000 000", "1000000", None),  # thousands groups
        ("\\frac 1 2", "\\frac12", None),
        ("3\\frac{1}{2}", "\\frac72", None),
        ("x<-1", "(-\\infty, -1)", None),
        ("|-3|", "3", None),
        ("\\boxed{1}, \\boxed{2}", "1, 2", None),  # one box per value of a list gold
    ],
)
def test_hedge_rules(answer, gold, reason):
    assert hedge_reason(answer, gold) == reason


@pytest.mark.parametrize(
    ("answer", "block"),
    [
        ("So the final answer is $\\boxed{0.5}$.", "0.5"),
        ("$3$ cm", "3"),
        ("\\[ \\boxed{4} \\]", "4"),
        ("not $4$", "not $4$"),  # a word that changes the value
        ("$4$ minus one", "$4$ minus one"),
        ("\\boxed{3} = 4", "\\boxed{3} = 4"),  # maths outside the box
        ("$3$ or $4$", "$3$ or $4$"),  # two blocks
        ("the number is 10 which is $5$", "the number is 10 which is $5$"),  # a digit outside
    ],
)
def test_sole_block(answer, block):
    assert sole_block(answer) == block


def test_base_numerals():
    assert base_numeral("52_8") == (42, 8) and base_numeral("4210_{5}") == (555, 5)
    assert base_numeral("(52)_8") == (42, 8) and base_numeral("52_{\\text{8}}") == (42, 8)
    assert base_numeral("x_2") is None and base_numeral("a_{10}") is None and base_numeral("59_8") is None
