"""env=rg: reasoning-gym's generators and scorers under lrmgym's contract, bounds and answer rules."""

from __future__ import annotations

import math
import time

import pytest
from pydantic import ValidationError

pytest.importorskip("reasoning_gym")

import lrmgym  # noqa: E402
from lrmgym.core import Completion, Task  # noqa: E402
from lrmgym.envs.math.loaders import hash_split  # noqa: E402
from lrmgym.envs.rg.env import RGConfig, RGEnv, _judge, rg_pool  # noqa: E402
from lrmgym.testing import check_env  # noqa: E402

# Generators whose items take milliseconds; the eval- and sympy-based scorers are among them on purpose.
FAST_TASKS = [
    "basic_arithmetic", "chain_sum", "products", "gcd", "lcm", "leg_counting", "count_bits", "base_conversion",
    "bitwise_arithmetic", "decimal_arithmetic", "fraction_simplification", "power_function", "prime_factorization",
    "simple_equations", "complex_arithmetic", "number_sorting", "spiral_matrix", "binary_matrix", "string_insertion",
    "n_queens", "rotate_matrix", "family_relationships", "tower_of_hanoi", "countdown", "isomorphic_strings",
    "game_of_life_halting", "caesar_cipher", "sentence_reordering",
]  # fmt: skip


# A wrong answer is another item's gold, except where two items can share a valid answer.
WRONG = {"n_queens": lambda gold, other: gold.replace("Q", "_")}  # an empty board; boards of two items may both fit


def answer(text: str) -> str:
    return f"<think>working</think><answer>{text}</answer>"


def env_for(task: str, **options) -> RGEnv:
    return lrmgym.make("ReasoningGym-v0", task=task, timeout_s=3.0, **options)


@pytest.mark.parametrize("task", FAST_TASKS)
def test_check_env_gold_full_reward_and_wrong_zero(task):
    env = env_for(task)
    check_env(env, reference=lambda t: answer(t.answer), n_tasks=4)
    env.reset(seed=7)
    tasks = [env.task_at(i) for i in range(6)]
    for t in tasks:
        gold = env.verify(t, Completion(answer(t.answer)))
        assert gold.score == 1.0 and gold.correct is True, (t.id, gold.reason)
        other = next((o.answer for o in tasks if o.answer != t.answer), None)
        other = WRONG[task](t.answer, other) if task in WRONG else other
        if other is not None:
            wrong = env.verify(t, Completion(answer(other)))
            assert wrong.score == 0.0 and wrong.correct is False, (t.id, other, wrong.reason)


def test_at_least_twenty_tasks_are_checked():
    assert len(set(FAST_TASKS)) >= 20


# ------------------------------------------------------------------------------------------------ config
def test_unknown_task_is_one_line_with_close_matches():
    with pytest.raises(ValidationError) as info:
        RGConfig(task="countdwn")
    message = str(info.value.errors()[0]["msg"])
    assert "unknown reasoning-gym task 'countdwn'" in message and "countdown" in message
    assert "\n" not in message


def test_unknown_knob_names_the_knob_and_the_close_one():
    with pytest.raises(ValidationError) as info:
        RGConfig(task="countdown", min_numbrs=3)
    message = str(info.value.errors()[0]["msg"])
    assert "'min_numbrs'" in message and "min_numbers" in message
    with pytest.raises(ValidationError, match="Did you mean timeout_s"):  # a typo of an env option, not a knob
        RGConfig(task="countdown", timout_s=3)
    with pytest.raises(ValidationError, match="no config knob 'min_numbrs'"):
        RGConfig(task="countdown", config={"min_numbrs": 3})


def test_knobs_from_extra_keys_and_from_config_are_the_generators():
    for env in (
        env_for("countdown", min_numbers=3, max_numbers=3),
        env_for("countdown", config={"min_numbers": 3, "max_numbers": 3}),
    ):
        env.reset(seed=0)
        assert {len(env.task_at(i).metadata["rg_metadata"]["numbers"]) for i in range(4)} == {3}


def test_task_list_with_weights_mixes_tasks():
    env = env_for(["gcd", "lcm"], weights=[1, 3], config={"gcd": {"min_numbers": 2, "max_numbers": 2}})
    env.reset(seed=0)
    names = [env.task_at(i).metadata["rg_task"] for i in range(40)]
    assert {"gcd", "lcm"} == set(names) and names.count("lcm") > names.count("gcd")
    with pytest.raises(ValidationError):
        RGConfig(task=["gcd", "lcm"], weights=[1])
    with pytest.raises(ValidationError):
        RGConfig(task=["gcd", "lcm"], min_numbers=2)  # a knob for which task?


def test_splits_are_disjoint_by_question_hash():
    train, test = env_for("gcd"), env_for("gcd", split="test")
    train.reset(seed=1)
    test.reset(seed=1)
    train_q = {train.task_at(i).metadata["question"] for i in range(150)}
    test_q = {test.task_at(i).metadata["question"] for i in range(30)}
    assert train_q and test_q and not train_q & test_q
    assert {hash_split(q, 0.1) for q in train_q} == {"train"} and {hash_split(q, 0.1) for q in test_q} == {"test"}


def test_tasks_are_a_pure_function_of_seed_and_index():
    a, b = env_for("chain_sum"), env_for("chain_sum")
    assert a.task_at(5, seed=3) == b.task_at(5, seed=3)
    assert a.task_at(5, seed=3).prompt != a.task_at(5, seed=4).prompt


def test_curriculum_level_schedule():
    env = env_for("countdown", level=0, level_every=2)
    env.reset(seed=0)
    assert [env.task_at(i).difficulty for i in range(6)] == [0, 0, 1, 1, 2, 2]
    assert env.level_at("countdown", 10_000) == 4  # countdown's last level
    easy, hard = env_for("countdown", level=0), env_for("countdown", level=3)
    n_easy = max(len(easy.task_at(i, seed=0).metadata["rg_metadata"]["numbers"]) for i in range(4))
    n_hard = min(len(hard.task_at(i, seed=0).metadata["rg_metadata"]["numbers"]) for i in range(4))
    assert n_easy < n_hard
    with pytest.raises(ValidationError, match="out of range"):
        RGConfig(task="countdown", level=9)
    with pytest.raises(ValidationError, match="needs a starting level"):
        RGConfig(task="countdown", level_every=5)


# ------------------------------------------------------------------------------------------------ bounds
def test_a_hanging_scorer_is_cut_at_the_hard_bound_and_the_worker_is_replaced(monkeypatch):
    env = lrmgym.make("ReasoningGym-v0", task="gcd", timeout_s=1.0)
    task = env.task_at(0, seed=0)
    assert env.verify(task, Completion(answer(task.answer))).score == 1.0  # a warm worker
    plain = env.score_request
    monkeypatch.setattr(env, "score_request", lambda t, a: {**plain(t, a), "stall": 60})
    start = time.perf_counter()
    verdict = env.verify(task, Completion(answer(task.answer)))
    assert time.perf_counter() - start < 3.0
    assert verdict.score == 0.0 and "exhausted the scorer's 1 s bound" in verdict.reason
    monkeypatch.setattr(env, "score_request", plain)
    assert env.verify(task, Completion(answer(task.answer))).score == 1.0


def test_a_memory_bomb_scores_zero(monkeypatch):
    env = env_for("gcd")
    task = env.task_at(0, seed=0)
    plain = env.score_request
    monkeypatch.setattr(env, "score_request", lambda t, a: {**plain(t, a), "hog": 64 << 30})
    verdict = env.verify(task, Completion(answer(task.answer)))
    assert verdict.score == 0.0 and "memory" in verdict.reason


def test_huge_answers_are_refused_before_scoring():
    env = env_for("gcd", max_answer_chars=100)
    task = env.task_at(0, seed=0)
    start = time.perf_counter()
    verdict = env.verify(task, Completion(answer("1" * 5000)))
    assert verdict.score == 0.0 and "answer too long: 5000 characters" in verdict.reason
    assert env.verify(task, Completion(answer(task.answer) + " " * (1 << 22))).score == 1.0  # trailing space only
    assert env.verify(task, Completion("9" * (1 << 22))).score == 0.0
    assert time.perf_counter() - start < 5.0


def test_exactly_one_answer():
    env = env_for("gcd")
    task = env.task_at(0, seed=0)
    two = f"<think>a</think><answer>{task.answer}</answer><answer>{task.answer}</answer>"
    assert env.verify(task, Completion(two)).score == 0.0
    assert env.verify(task, Completion(f"The answer is {task.answer}")).format_ok is False


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        ({"status": "ok", "score": math.nan}, "not a finite number"),
        ({"status": "ok", "score": math.inf}, "not a finite number"),
        ({"status": "ok", "score": 1.5}, "outside [0, 1]"),
        ({"status": "ok", "score": -0.1}, "outside [0, 1]"),
        ({"status": "ok", "score": "1.0"}, "not a finite number"),
        ({"status": "ok", "score": True}, "not a finite number"),
        ({"status": "error", "reason": "the scorer raised KeyError"}, "KeyError"),
    ],
)
def test_bad_scores_are_failures(reply, why):
    verdict = _judge(reply, "x", RGConfig(task="gcd"))
    assert verdict.score == 0.0 and verdict.correct is False and why in verdict.reason


def test_a_task_that_is_not_reasoning_gym_is_ungradeable():
    env = env_for("gcd")
    verdict = env.verify(Task(id="x", prompt="?", answer="1"), Completion(answer("1")))
    assert verdict.score is None


def test_a_task_from_another_reasoning_gym_version_is_ungradeable():
    env = env_for("gcd")
    task = env.task_at(0, seed=0)
    meta = {**task.metadata, "question_sha": "0" * 64}
    verdict = env.verify(Task(id=task.id, prompt=task.prompt, answer=task.answer, metadata=meta), answer(task.answer))
    assert verdict.score is None and "differs" in verdict.reason


def test_hash_seed_dependent_generators_score_the_carried_item():
    env = env_for("isomorphic_strings")  # its items depend on set order: the worker's hash seed differs from ours
    for i in range(3):
        task = env.task_at(i, seed=0)
        assert env.verify(task, Completion(answer(task.answer))).score == 1.0


def test_score_group_in_parallel_keeps_order():
    env = env_for("gcd")
    task = env.task_at(0, seed=0)
    verdicts = env.score_group(task, [answer(task.answer), answer("0"), "", answer(task.answer)])
    assert [v.score for v in verdicts] == [1.0, 0.0, 0.0, 1.0]
    assert rg_pool().size >= 1


def test_one_level_per_attribute():
    env = env_for("countdown", level={"numbers": 1}, level_every=2, level_mode="upper_bound")
    env.reset(seed=0)
    first, later = env.task_at(0), env.task_at(2)
    assert first.metadata["rg_level"] == {"numbers": 1} and later.metadata["rg_level"] == {"numbers": 2}
    assert first.difficulty == 1
    # the numbers attribute's levels are 3, 6, 9, 12, 15; upper_bound at level 1 keeps the range 6-9
    assert 6 <= len(first.metadata["rg_metadata"]["numbers"]) <= 9
    with pytest.raises(ValidationError, match="no difficulty attribute 'nmbers'. Did you mean numbers"):
        RGConfig(task="countdown", level={"nmbers": 1})
    with pytest.raises(ValidationError, match=r"env.level.numbers=7 is out of range"):
        RGConfig(task="countdown", level={"numbers": 7})
