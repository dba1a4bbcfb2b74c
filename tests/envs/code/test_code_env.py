"""CodeEnv: config errors, the env contract, rewards, multi-turn feedback, concurrency, async, fallbacks."""

from __future__ import annotations

import asyncio
import time

import pytest
from pydantic import ValidationError

import lrmgym
from lrmgym.core import Completion, Task
from lrmgym.envs.code.env import CodeEnv
from lrmgym.envs.code.sandbox import ExecResult, Job
from lrmgym.testing import check_env

pytestmark = pytest.mark.usefixtures("sandbox_available")


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\n"


@pytest.fixture(scope="module")
def env():
    e = lrmgym.make("lrmgym/Code-v0", timeout_s=2.0)
    yield e
    e.close()


def _validation_message(kwargs) -> str:
    with pytest.raises(ValidationError) as info:
        CodeEnv(**kwargs)
    return info.value.errors()[0]["msg"]


def test_config_errors_name_the_value_and_the_fix(tmp_path):
    assert _validation_message({"source": "apps"}) == (
        "Value error, source 'apps' is neither one of procedural, humaneval, mbpp nor an existing file; "
        "give a named source or the path to a JSONL file of code tasks"
    )
    assert _validation_message({"source": "humaneval", "split": "train"}) == (
        "Value error, source 'humaneval' has only the 'test' split, got split 'train'; set split: test"
    )
    assert _validation_message({"source": "mbpp", "split": "dev"}) == (
        "Value error, unknown MBPP split 'dev'; expected one of all, prompt, test, validation, train"
    )
    assert _validation_message({"timeout": 3}) == "Extra inputs are not permitted"
    assert _validation_message({"sandbox": "docker"}).startswith("Input should be 'auto', 'bwrap', 'unshare' or")


def test_every_config_field_has_a_docstring():
    for name, info in CodeEnv.Config.model_fields.items():
        assert info.description, name


def test_env_contract_with_reference_solutions(env):
    check_env(env, reference=lambda task: fenced(task.answer), step_timeout_s=10.0)


def test_rewards_fraction_and_all_or_nothing(env):
    task = env.task_at(0, seed=3)
    name = task.metadata["entry_point"]
    half = f"def {name}(*a):\n    raise ValueError('nope')\n"
    v = env.verify(task, Completion(fenced(half)))
    assert (v.score, v.correct, v.format_ok, v.reason) == (0.0, False, True, "0/5 tests passed")
    strict = CodeEnv(reward="all_or_nothing", timeout_s=2.0)
    try:
        good = strict.verify(task, Completion(fenced(task.answer)))
        assert (good.score, good.correct, good.components[0].reason) == (1.0, True, "ok")
    finally:
        strict.close()


def test_fraction_counts_individual_tests(env):
    code_task = Task(
        id="t",
        prompt="p",
        metadata={
            "id": "t",
            "text": "p",
            "units": [{"src": "assert f(1) == 1", "test": True}, {"src": "assert f(2) == 4", "test": True}],
        },
    )
    v = env.verify(code_task, Completion(fenced("def f(x):\n    return x")))
    assert (v.score, v.reason) == (0.5, "1/2 tests passed")


def test_format_failure_scores_zero_without_running(env):
    task = env.task_at(0, seed=1)
    v = env.verify(task, Completion("def f(): pass"))
    assert (v.score, v.format_ok, v.reason) == (0.0, False, "format: no closed ```python code block")


def test_timeout_is_reported_in_the_verdict(env):
    task = env.task_at(0, seed=1)
    name = task.metadata["entry_point"]
    start = time.monotonic()
    v = env.verify(task, Completion(fenced(f"def {name}(*a):\n    while True:\n        pass\n")))
    assert time.monotonic() - start < 2.0 + 1.0
    assert (v.score, v.reason, v.components[0].reason) == (0.0, "timeout after 2 s (0/5 tests passed)", "timeout")


def test_sandbox_failure_is_ungradeable(env):
    job = Job(code="x = 1", units=({"src": "assert x", "test": True},))
    result = env.pool._parse(job, b"", b"bwrap: Creating new namespace failed", False, 0.1)
    assert (result.status, result.total) == ("infra", 1)
    v = env._verdict(env.task_at(0, seed=1), "x = 1", result)
    assert v.score is None and v.reason.startswith("sandbox failure: sandbox did not start: bwrap: Creating")


def test_multi_turn_feedback_by_default_names_only_the_kind_of_each_failure():
    e = CodeEnv(max_turns=2, timeout_s=2.0)
    try:
        obs, info = e.reset(seed=5)
        name = info["task"].metadata["entry_point"]
        obs, reward, terminated, truncated, info = e.step(
            fenced(f"def {name}(*a):\n    print('debug line')\n    return None")
        )
        assert (reward, terminated, truncated) == (0.0, False, False)
        assert obs.startswith(
            "Your code did not pass all tests: 0/5 tests passed.\n5 of 5 tests failed:\nTest 1: wrong answer\n"
        )
        assert "assert" not in obs and "==" not in obs and "debug line" not in obs  # no echo of the output
        obs, reward, terminated, truncated, info = e.step(fenced(info_task_answer(e)))
        assert (reward, terminated, truncated) == (1.0, True, False)
    finally:
        e.close()


def test_multi_turn_full_feedback_shows_failing_tests():
    e = CodeEnv(max_turns=2, timeout_s=2.0, feedback="full")
    try:
        obs, info = e.reset(seed=5)
        name = info["task"].metadata["entry_point"]
        obs, reward, terminated, truncated, info = e.step(
            fenced(f"def {name}(*a):\n    print('debug line')\n    return None")
        )
        assert (reward, terminated, truncated) == (0.0, False, False)
        assert obs.startswith("Your code did not pass all tests: 0/5 tests passed.\nFailed: assert ")
        assert "AssertionError" in obs and "Program output:\ndebug line" in obs
        obs, reward, terminated, truncated, info = e.step(fenced(info_task_answer(e)))
        assert (reward, terminated, truncated) == (1.0, True, False)
    finally:
        e.close()


def info_task_answer(e: CodeEnv) -> str:
    assert e.task is not None
    return e.task.answer


def test_score_group_runs_candidates_concurrently():
    e = CodeEnv(workers=2, timeout_s=3.0)
    try:
        task = e.task_at(0, seed=2)
        name = task.metadata["entry_point"]
        slow = fenced(f"import time\ntime.sleep(0.8)\n{task.answer}")
        start = time.monotonic()
        verdicts = e.score_group(task, [slow] * 4 + ["no code", fenced(f"def {name}(*a):\n    return None")])
        wall = time.monotonic() - start
        assert [v.score for v in verdicts] == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
        assert wall < 4 * 0.8, f"4 sleeps of 0.8 s on 2 workers took {wall:.2f} s"
    finally:
        e.close()


def test_async_api(env):
    task = env.task_at(1, seed=2)

    async def main():
        return await env.ascore_group(task, [fenced(task.answer), "nothing", fenced("x = (")])

    verdicts = asyncio.run(main())
    assert [v.score for v in verdicts] == [1.0, 0.0, 0.0]
    assert verdicts[2].reason.startswith("the program raised SyntaxError")


def test_humaneval_env_accepts_full_functions_and_bodies(shared_data):
    # The data set's own tests: this is about body/function forms, not held-out grading (test_code_integrity_round3).
    e = CodeEnv(source="humaneval", timeout_s=5.0, data_dir=str(shared_data), tests="original")
    try:
        task = e.task_at(0)
        body = task.answer[len(task.metadata["stub"]) :]
        full = "def has_close_elements(numbers, threshold):\n" + body
        assert [v.score for v in e.score_group(task, [fenced(full), fenced(body), fenced("def f(): pass")])] == [
            1.0,
            1.0,
            0.0,
        ]
    finally:
        e.close()


def test_forced_unshare_fallback_grades_the_same(env):
    import shutil

    if shutil.which("unshare") is None:
        pytest.skip("util-linux unshare is not installed")
    e = CodeEnv(sandbox="unshare", timeout_s=2.0)
    try:
        task = e.task_at(0, seed=4)
        assert e.verify(task, Completion(fenced(task.answer))).score == 1.0
        assert e.describe()["sandbox"]["backend"] == "unshare"
    finally:
        e.close()


def test_exec_result_fraction():
    assert ExecResult("ok", 1, 4).fraction == 0.25
    assert ExecResult("ok", 0, 0).fraction == 0.0 and not ExecResult("ok", 0, 0).all_passed


def test_chat_prompts():
    e = CodeEnv(chat=True)
    prompt, _ = e.reset(seed=0)
    assert isinstance(prompt, list) and prompt[0]["role"] == "user" and "```python" in prompt[0]["content"]
