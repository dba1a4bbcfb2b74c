"""The rule pointwise judge: one trace scored alone on the rule pairwise judge's facts (hand-computed scores)."""

from __future__ import annotations

import time

import pydantic
import pytest

import lrmgym
from lrmgym.core import Completion, Task, Verdict
from lrmgym.judges.base import JudgedEnv
from lrmgym.judges.pointwise_rule import RulePointwiseJudge, RulePointwiseJudgeConfig

CHAIN = Task(id="t/0", prompt="Q:Compute 12-3+4. A:", answer="13")


@pytest.mark.parametrize(
    ("text", "score"),
    [
        # 0.6 * first-error score + 0.3 * closeness + 0.1 * strict format
        ("<think>Let 12-3=9;9+4=13</think><answer>13</answer>", 1.0),  # error-free work 1, exact 1, format 1
        ("<think>Let 12-3=9;9+4=14</think><answer>14</answer>", 0.6 * 0.5 + 0.3 * 0.5 + 0.1),  # error after 1
        ("<think>Let 12-3=9;9+4=13;13+1=15</think><answer>15</answer>", 0.6 * (0.25 + 0.5 * 2 / 3) + 0.3 / 3 + 0.1),
        ("<think>Let 12-3=8;chk 8+3=11 no;12-3=9;9+4=13</think><answer>13</answer>", 0.6 * 0.25 + 0.3 + 0.1),
        ("<think></think><answer>13</answer>", 0.3 + 0.1),  # nothing written: first-error score 0
        ("I do not know", 0.0),
        ("<think>So 12-3+4=13</think><answer>13</answer> and more", 0.6 + 0.3),  # text after the answer
    ],
)
def test_scores_by_hand(text, score):
    comp = RulePointwiseJudge().score(CHAIN, Completion(text), Verdict(score=0.0))
    assert comp.score == pytest.approx(score)
    assert 0.0 <= comp.score <= 1.0 and comp.reason.startswith("first error")


def test_the_score_orders_traces_as_the_first_error_criterion_does():
    judge = RulePointwiseJudge()
    texts = ["", "<think>So 12-3+4=14</think>", "<think>Let 12-3=9;9+4=14</think>", "<think>Let 12-3=9;9+4=13</think>"]
    scores = [judge.score(CHAIN, Completion(t), Verdict(score=0.0)).score for t in texts]
    assert scores == sorted(scores) and len(set(scores)) == 4


def test_it_is_a_judge_kind_and_replaces_the_reward_on_every_group():
    env = JudgedEnv(lrmgym.make("lrmgym/Testbed-v0"), [RulePointwiseJudgeConfig(kind="rule_pointwise").build()])
    task = env.task_at(0, seed=0)
    verdicts = env.score_group(task, [task.metadata["solution"], "nothing"])
    assert verdicts[0].score == pytest.approx(1.0) and verdicts[1].score == 0.0
    with pytest.raises(pydantic.ValidationError, match="extra"):
        RulePointwiseJudgeConfig(criteria=["first_error"])


@pytest.mark.parametrize(
    "text",
    ["1+" * 200_000 + "1=2", "=" * 500_000, "9" * 100_000 + "+1=1", "<answer>" + "9" * 5000 + "</answer>",
     "<think>12-3=9;" * 20_000 + "</think><answer>1e999</answer>"],
)  # fmt: skip
def test_hostile_traces_get_a_bounded_score_quickly(text):
    start = time.perf_counter()
    comp = RulePointwiseJudge().score(CHAIN, Completion(text), Verdict(score=0.0))
    assert 0.0 <= comp.score <= 1.0
    assert time.perf_counter() - start < 2.0
