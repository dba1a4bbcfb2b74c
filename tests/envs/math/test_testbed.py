"""lrmgym/Testbed-v0: the reasoning testbed's chained-arithmetic family (README: "Test an RL idea on a laptop")."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest
from pydantic import ValidationError

import lrmgym
from lrmgym.envs.math.testbed import STYLES, Chain, TestbedConfig, TestbedEnv, chain_solution
from lrmgym.testing import check_env


def _tasks(n: int = 200, seed: int = 0, **options):
    env = TestbedEnv(**options)
    return env, [env.task_at(i, seed=seed) for i in range(n)]


@pytest.mark.parametrize("options", [{}, {"recheck_share": 1.0}, {"template": "boxed"}, {"max_turns": 2}])
def test_check_env_and_reference_solutions(options):
    check_env(lrmgym.make("Testbed-v0", **options), reference=lambda task: task.metadata["solution"])


def test_every_worked_solution_is_graded_correct_and_a_wrong_result_is_not():
    env, tasks = _tasks(300, recheck_share=1.0, slip_share=0.5)
    assert any("no;" in t.metadata["solution"] for t in tasks), "the test needs solutions with caught slips"
    for task in tasks:
        assert env.verify(task, task.metadata["solution"]).correct, task.metadata["solution"]
        wrong = str(int(task.answer) + 1)
        assert env.verify(task, f"<think>x</think><answer>{wrong}</answer>").correct is False
    # the math env's answer forms apply: one plain number, no restated expression, no second answer
    task = tasks[0]
    question = task.metadata["question"].removeprefix("Compute ").rstrip(".")
    assert env.verify(task, f"<think></think><answer>{question}</answer>").score == 0.0
    assert env.verify(task, f"<think></think><answer>{task.answer}, {task.answer}1</answer>").score == 0.0


def test_chain_lengths_follow_the_knobs_and_never_go_negative():
    _, tasks = _tasks(300, min_ops=3, max_ops=5)
    assert {t.metadata["ops"] for t in tasks} == {3, 4, 5}
    for t in tasks:
        assert t.prompt.startswith("Q:Compute ") and t.prompt.endswith(". A:")
        numbers = [int(x) for x in re.findall(r"\d+", t.metadata["question"])]
        assert len(numbers) == t.metadata["ops"] + 1 and int(t.answer) >= 0
    _, one = _tasks(50, min_ops=1, max_ops=1, two_digit_share=0.0)
    assert all(t.metadata["ops"] == 1 and max(map(int, re.findall(r"\d+", t.metadata["question"]))) <= 9 for t in one)


def test_stepwise_solutions_grow_with_the_chain_and_direct_ones_skip_the_steps():
    chain = Chain(numbers=(7, 5, 3, 12), ops=("+", "-", "+"))
    assert chain.partials == (12, 9, 21) and chain.answer == 21
    assert chain_solution(chain, "stepwise") == "<think>Let 7+5=12;12-3=9;9+12=21</think><answer>21</answer>"
    assert chain_solution(chain, "direct") == "<think>So 7+5-3+12=21</think><answer>21</answer>"
    checked = chain_solution(chain, "stepwise", checks=(False, True, True), slips=(0, 2, 0))
    assert checked == (
        "<think>Let 7+5=12;12-3=11;chk 11+3=14 no;12-3=9;chk 9+3=12 ok;9+12=21;chk 21-12=9 ok</think>"
        "<answer>21</answer>"
    )
    _, tasks = _tasks(300, stepwise_share=1.0)
    lengths = {t.metadata["ops"]: len(t.metadata["solution"]) for t in tasks}
    assert lengths[8] > lengths[1] + 40


def test_the_style_fork_is_problem_independent():
    # The style is drawn per task after the problem: both styles occur at every chain length, in the set share,
    # and the first token after <think> names the style.
    _, tasks = _tasks(600, stepwise_share=0.5)
    counts = Counter((t.metadata["ops"], t.metadata["solution_style"]) for t in tasks)
    assert all(counts[(n, s)] >= 15 for n in range(1, 9) for s in STYLES)
    share = sum(t.metadata["solution_style"] == "stepwise" for t in tasks) / len(tasks)
    assert 0.42 < share < 0.58
    for t in tasks:
        assert t.metadata["solution"].startswith(f"<think>{STYLES[t.metadata['solution_style']]} ")
    assert {s[0] for s in STYLES.values()} == {"L", "S"}  # one character apart: a single fork token
    _, all_direct = _tasks(50, stepwise_share=0.0)
    assert {t.metadata["solution_style"] for t in all_direct} == {"direct"}


def test_rechecks_only_with_their_share_and_only_in_stepwise_solutions():
    _, none = _tasks(200)
    assert not any("chk" in t.metadata["solution"] for t in none)
    _, some = _tasks(400, recheck_share=0.5)
    checked = [t for t in some if "chk" in t.metadata["solution"]]
    assert checked and all(t.metadata["solution_style"] == "stepwise" for t in checked)
    assert all(t.metadata["checks"] == t.metadata["solution"].count("chk") - t.metadata["solution"].count("no;")
               for t in checked)  # fmt: skip


def test_splits_are_disjoint_and_tasks_are_seeded():
    _, train = _tasks(400)
    _, test = _tasks(400, split="test")
    assert not {t.metadata["question"] for t in train} & {t.metadata["question"] for t in test}
    assert [t.id for t in _tasks(20, seed=3)[1]] == [t.id for t in _tasks(20, seed=3)[1]]
    assert [t.id for t in _tasks(20, seed=3)[1]] != [t.id for t in _tasks(20, seed=4)[1]]


def test_bad_options_are_one_line_errors():
    with pytest.raises(ValidationError, match=re.escape("min_ops (5) must be <= max_ops (3); raise max_ops or lower")):
        TestbedConfig(min_ops=5, max_ops=3)
    with pytest.raises(ValidationError, match="extra"):
        TestbedConfig(source="gsm8k")
    env = TestbedEnv()
    with pytest.raises(ValueError, match=re.escape("set env.template='boxed' instead")):
        env.solution(env.task_at(0, seed=0), template="boxed")


def test_the_training_mixture_has_all_lengths_and_both_styles():
    from lrmgym.policies.tiny import TinyPolicyConfig

    train = TinyPolicyConfig(recipe="testbed").train
    env = lrmgym.make(train.env, **train.env_options).unwrapped
    tasks = [env.task_at(i, seed=train.data_seed) for i in range(400)]
    assert {t.metadata["ops"] for t in tasks} == set(range(1, 9))
    styles = Counter(t.metadata["solution_style"] for t in tasks)
    assert min(styles.values()) > 150 and any("chk" in t.metadata["solution"] for t in tasks)
    assert np.percentile([len(t.metadata["solution"]) for t in tasks], 90) > 2 * np.percentile(
        [len(t.metadata["solution"]) for t in tasks], 10
    )


def test_num_problems_makes_a_finite_set_whose_prompts_recur():
    bounded = TestbedEnv(num_problems=3)
    unbounded = TestbedEnv()
    ids = [bounded.task_at(i, seed=5).id for i in range(9)]
    assert ids[:3] == ids[3:6] == ids[6:9]  # task i is task i mod 3: each prompt recurs every 3 positions
    assert len(set(ids)) == 3
    # The first num_problems tasks are the unbounded stream's, so a held-out evaluation of at most that many
    # tasks is unchanged.
    assert ids[:3] == [unbounded.task_at(i, seed=5).id for i in range(3)]
    assert bounded.task_at(4, seed=5).metadata == bounded.task_at(1, seed=5).metadata
    assert TestbedEnv(num_problems=1).task_at(7, seed=0).id == TestbedEnv().task_at(0, seed=0).id


def test_num_problems_must_be_positive():
    with pytest.raises(ValidationError, match="num_problems"):
        TestbedConfig(num_problems=0)
    assert TestbedConfig().num_problems is None


def test_num_problems_bounds_the_training_split_only():
    # An evaluation rebuilds the env with split=test and every other option kept: its tasks must stay distinct
    # however many it asks for, so held-out figures never count a problem twice.
    held_out = TestbedEnv(num_problems=3, split="test")
    ids = [held_out.task_at(i, seed=0).id for i in range(12)]
    assert len(set(ids)) == 12
    assert ids == [TestbedEnv(split="test").task_at(i, seed=0).id for i in range(12)]
