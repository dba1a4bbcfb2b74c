import math

import numpy as np
import pytest

import lrmgym
from lrmgym.core import Completion, Group, ResetNeeded, Task, Verdict, task_rng


def test_task_rng_is_a_pure_function_of_seed_and_index():
    assert task_rng(7, 3).integers(0, 10**9) == task_rng(7, 3).integers(0, 10**9)
    # the seed + index bug: (42, 1) and (43, 0) must not be the same stream
    assert task_rng(42, 1).integers(0, 10**9) != task_rng(43, 0).integers(0, 10**9)
    with pytest.raises(ValueError, match="non-negative"):
        task_rng(-1, 0)


def test_verdict_rejects_non_finite_scores_and_marks_ungradeable():
    with pytest.raises(ValueError, match="finite or None"):
        Verdict(score=math.nan)
    v = Verdict.ungradeable("timeout after 2.0 s")
    assert v.score is None and not v.gradeable and v.reason == "timeout after 2.0 s"
    assert Verdict(score=1.0, parsed=np.int64(3)).to_dict()["parsed"] == "3"


def test_group_zero_variance_ignores_ungradeable():
    task = Task(id="t", prompt="p")
    comps = [Completion("a"), Completion("b"), Completion("c")]
    g = Group(task, comps, [Verdict(1.0), Verdict(1.0), Verdict.ungradeable("x")])
    assert g.zero_variance and g.scores == [1.0, 1.0, None]
    g = Group(task, comps, [Verdict(1.0), Verdict(0.0), Verdict.ungradeable("x")])
    assert not g.zero_variance
    with pytest.raises(ValueError, match="one verdict per completion"):
        Group(task, comps, [Verdict(1.0)])


def test_completion_coerce():
    assert Completion.coerce("hi").text == "hi"
    with pytest.raises(TypeError, match="Expected a Completion or a str, got int"):
        Completion.coerce(3)


def test_seeding_contract_on_echo():
    env = lrmgym.make("Echo-v0")
    p0, info0 = env.reset(seed=5)
    p1, _ = env.reset()
    assert info0["index"] == 0 and p0 != p1
    assert env.reset(seed=5)[0] == p0  # same seed, same stream
    assert env.reset(options={"index": 1})[0] == p1  # pinned by index
    assert env.reset()[0] == p1  # pinning does not move the stream: next is index 1
    task = Task(id="mine", prompt="Repeat exactly: x", answer="x")
    prompt, info = env.reset(options={"task": task})
    assert prompt == task.prompt and info["task"] is task and info["index"] is None
    assert env.step("x")[1] == 1.0


def test_reset_without_seed_draws_a_stream_seed():
    env = lrmgym.make("Echo-v0")
    _, info = env.reset()
    assert isinstance(info["stream_seed"], int)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (
            {"idx": 1},
            ValueError,
            "Unknown reset option(s) ['idx']; "
            "allowed: 'index' (pin task i of the stream) or 'task' (pin a Task object).",
        ),
        ({"index": -1}, ValueError, "Task index must be a non-negative integer, got -1."),
        ({"task": "t"}, TypeError, "reset(options={'task': ...}) expects a lrmgym.Task, got str."),
    ],
)
def test_reset_bad_options(options, error, message):
    env = lrmgym.make("Echo-v0")
    with pytest.raises(error, match=f"^{__import__('re').escape(message)}$"):
        env.reset(seed=0, options=options)


def test_step_order_errors():
    env = lrmgym.make("Echo-v0")
    with pytest.raises(ResetNeeded, match="before reset"):
        env.step("x")
    env.reset(seed=0)
    env.step("x")
    with pytest.raises(ResetNeeded, match="after the episode ended"):
        env.step("x")


def test_multi_turn_feedback_and_truncation():
    env = lrmgym.make("Echo-v0", max_turns=2)
    _, info = env.reset(seed=1)
    obs, reward, terminated, truncated, step_info = env.step("wrong")
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert obs == f"Wrong. Repeat exactly: {info['task'].answer}" and step_info["turn"] == 1
    obs, reward, terminated, truncated, _ = env.step("still wrong")
    assert (terminated, truncated) == (False, True)
    env.reset(seed=1)
    env.step("wrong")
    assert env.step(info["task"].answer)[1:4] == (1.0, True, False)


def test_score_group_one_verdict_per_completion_in_order():
    env = lrmgym.make("Echo-v0")
    _, info = env.reset(seed=0)
    task = info["task"]
    verdicts = env.score_group(task, [task.answer, "nope", Completion(task.answer)])
    assert [v.score for v in verdicts] == [1.0, 0.0, 1.0]
    assert all(v.latency_s > 0 for v in verdicts)


def test_env_options_are_validated():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="words"):
        lrmgym.make("Echo-v0", words=0)
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        lrmgym.make("Echo-v0", wrds=2)
