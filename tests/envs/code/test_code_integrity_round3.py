"""Reward integrity of the code env, round 3 (issue 35, items 5-7).

- A free name of the tests that is a module (mbpp/596 calls ``sys.getsizeof`` without importing ``sys``) is
  imported by the harness, never taken from the candidate (a fake ``sys`` passed 3/3 before).
- Multi-turn feedback no longer echoes the candidate's printed output by default (print the inputs in turn 1,
  read them back with the failing tests' numbers, answer a lookup table in turn 2).
- Tests shown in the prompt are not graded: a lookup table of them, or a constant, earns nothing.
"""

from __future__ import annotations

import json

import pytest

from lrmgym.envs.code.sandbox import Job, entry_points

FAKE_SYS = (
    "class _Sys:\n"
    "    @staticmethod\n"
    "    def getsizeof(x):\n"
    "        return 7\n"
    "sys = _Sys()\n"
    "def tuple_size(t):\n"
    "    return 7\n"
)


# ------------------------------------------------------------------------------ item 7: modules the tests name
def test_a_module_name_the_tests_use_is_not_an_entry_point():
    units = ["assert tuple_size((1, 2)) == sys.getsizeof((1, 2))", "assert math.floor(f(1.5)) == 1"]
    assert entry_points(units) == ("tuple_size", "f")
    job = Job(code="", units=tuple({"src": u, "test": True} for u in units))
    assert job.modules == ("sys", "math")


@pytest.mark.parametrize(
    ("fake", "test"),
    [
        (FAKE_SYS, "assert tuple_size((1, 2)) == sys.getsizeof((1, 2))"),
        (
            "import types\nmath = types.SimpleNamespace(isclose=lambda *a, **k: True)\ndef square(x):\n    return 0\n",
            "assert math.isclose(square(3), 9)",
        ),
        (
            "class _J:\n    def loads(self, s):\n        return 0\njson = _J()\ndef square(x):\n    return 0\n",
            "assert square(3) == json.loads('9')",
        ),
    ],
    ids=["sys", "math", "json"],
)
def test_a_fake_module_of_the_candidate_never_reaches_the_tests(auto_pool, fake, test):
    result = auto_pool.run(Job(code=fake, units=({"src": test, "test": True},)))
    assert (result.status, result.passed) == ("ok", 0), result


def test_the_harness_imported_module_still_lets_an_honest_solution_pass(auto_pool):
    code = "import sys\ndef tuple_size(t):\n    return sys.getsizeof(t)\n"
    unit = {"src": "assert tuple_size((1, 2)) == sys.getsizeof((1, 2))", "test": True}
    result = auto_pool.run(Job(code=code, units=(unit,)))
    assert result.all_passed, result


def test_mbpp_596_with_a_fake_sys_scores_zero(auto_pool, shared_data):
    from lrmgym.envs.code.env import job_for
    from lrmgym.envs.code.loaders import load_mbpp

    task = next(t for t in load_mbpp(shared_data / "mbpp" / "mbpp.jsonl") if t.id == "mbpp/596")
    assert auto_pool.run(job_for(task, task.solution)).all_passed
    result = auto_pool.run(job_for(task, FAKE_SYS))
    assert (result.passed, result.total) == (0, 3), result


def test_a_name_the_reference_imports_is_imported_for_the_tests_too(tmp_path, auto_pool):
    from lrmgym.envs.code.env import job_for
    from lrmgym.envs.code.loaders import load_jsonl

    path = tmp_path / "tasks.jsonl"
    path.write_text(
        '{"prompt": "count", "tests": ["assert count([1, 1]) == Counter({1: 2})"], '
        '"solution": "from collections import Counter\\ndef count(xs):\\n    return Counter(xs)\\n"}\n'
    )
    (task,) = load_jsonl(path)
    assert auto_pool.run(job_for(task, task.solution)).all_passed
    fake = "def Counter(*a):\n    return 0\ndef count(xs):\n    return 0\n"
    result = auto_pool.run(job_for(task, fake))
    assert (result.status, result.passed) == ("ok", 0), result


# ------------------------------------------------------------------------------ item 6: feedback as a channel
_PARITY_TESTS = [f"assert is_even({x}) == {x % 2 == 0}" for x in (3, 8, 11, 14, 17, 20, 23)]


def _episode(tmp_path, turns, feedback="errors_only"):
    """Play ``turns`` (each: feedback so far -> code) on a JSONL task; return the rewards per turn."""
    from lrmgym.envs.code.env import CodeEnv

    path = tmp_path / "parity.jsonl"
    row = {"id": "parity", "prompt": "Write is_even(x).", "entry_point": "is_even", "tests": _PARITY_TESTS}
    path.write_text(json.dumps(row) + "\n")
    env = CodeEnv(source=str(path), max_turns=len(turns), feedback=feedback, timeout_s=5.0, workers=1)
    try:
        obs, _ = env.reset(seed=0, options={"index": 0})
        seen, rewards = [], []
        for turn in turns:
            obs, reward, terminated, _, _ = env.step(f"```python\n{turn(seen)}\n```")
            rewards.append(reward)
            seen.append(obs)
            if terminated:
                break
        return rewards
    finally:
        env.close()


def _failed_numbers(text):
    import re

    return {int(m) for m in re.findall(r"^Test (\d+): wrong answer", text, re.M)}


def test_print_then_lookup_over_two_turns_earns_nothing_extra(tmp_path):
    """Turn 1 prints its arguments and returns True; turn 2 pairs the echoed inputs with the failing tests."""
    import re

    def turn1(seen):
        return "def is_even(x):\n    print('ARG', repr(x))\n    return True\n"

    def turn2(seen):
        args = re.findall(r"^ARG (.+)$", seen[-1], re.M)
        failed = _failed_numbers(seen[-1])
        table = {a: (i + 1) not in failed for i, a in enumerate(args)}
        return f"_T = {table!r}\ndef is_even(x):\n    return _T.get(repr(x), True)\n"

    rewards = _episode(tmp_path, [turn1, turn2])
    assert rewards[1] <= rewards[0], rewards


def test_exception_names_do_not_carry_the_inputs_back(tmp_path):
    """The sibling channel: turn 1 raises an exception class named after its argument; turn 2 returns True to
    learn which tests expect True; turn 3 answers from the table."""
    import re

    def turn1(seen):
        return "def is_even(x):\n    raise type('ARG_%d' % x, (Exception,), {})()\n"

    def turn2(seen):
        return "def is_even(x):\n    return True\n"

    def turn3(seen):
        args = {int(n): int(a) for n, a in re.findall(r"^Test (\d+): error: ARG_(\d+)", seen[0], re.M)}
        failed = _failed_numbers(seen[1])
        table = {a: n not in failed for n, a in args.items()}
        return f"_T = {table!r}\ndef is_even(x):\n    return _T.get(x, True)\n"

    rewards = _episode(tmp_path, [turn1, turn2, turn3])
    assert rewards[2] <= rewards[1], rewards


def test_full_feedback_still_shows_the_program_output(tmp_path):
    def turn1(seen):
        return "def is_even(x):\n    print('ARG', repr(x))\n    return True\n"

    def turn2(seen):
        assert "ARG 3" in seen[-1]
        return "def is_even(x):\n    return x % 2 == 0\n"

    assert _episode(tmp_path, [turn1, turn2], feedback="full")[-1] == 1.0


# ------------------------------------------------------------------------------ item 5: shown tests are not graded
@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "lrmgym" / "code_heldout"


def _attack_scores(env, tasks, fallback):
    from lrmgym.testing.reward_hacking.code_cases import lookup_program, tested_names

    scores = []
    for code_task in tasks:
        code = lookup_program(code_task.text, tested_names(code_task), fallback)
        scores.append(env.verify(env.task_from(code_task), f"```python\n{code}\n```").score)
    return scores


def test_mbpp_lookup_table_of_the_listed_tests_earns_nothing(shared_data, cache):
    from lrmgym.envs.code.env import CodeEnv

    env = CodeEnv(source="mbpp", split="prompt", data_dir=str(shared_data), timeout_s=10.0, workers=2)
    try:
        tasks = [env.code_task(env.task_at(i)) for i in range(env.num_items)]
        assert len(tasks) == 10 and all(t.units for t in tasks)
        for fallback in ("none", "shown"):
            scores = _attack_scores(env, tasks, fallback)
            assert sum(scores) / len(scores) < 0.1, (fallback, scores)
        honest = [env.verify(env.task_from(t), f"```python\n{t.solution}\n```").score for t in tasks]
        assert honest == [1.0] * 10
    finally:
        env.close()


def test_humaneval_docstring_examples_are_not_enough(shared_data, cache, auto_pool):
    from lrmgym.envs.code import heldout
    from lrmgym.envs.code.env import CodeEnv
    from lrmgym.envs.code.loaders import load_humaneval

    raw = load_humaneval(shared_data / "humaneval" / "HumanEval.jsonl.gz")[:24]
    tasks = heldout.graded_tasks(raw, lambda: heldout.SandboxPool("auto", workers=2, warm=False))
    assert len(tasks) == 24
    # No graded test calls the entry point with arguments the docstring shows.
    for task in tasks:
        shown = heldout.shown_calls(task)
        for site in heldout._sites(task, task.units):
            assert heldout._key(site.args, site.kwargs) not in shown, task.id
    env = CodeEnv(timeout_s=10.0, workers=2)
    try:
        for fallback in ("none", "shown"):
            scores = _attack_scores(env, tasks, fallback)
            assert sum(scores) / len(scores) < 0.1, (fallback, scores)
        honest = [env.verify(env.task_from(t), f"```python\n{t.solution}\n```").score for t in tasks]
        assert honest == [1.0] * 24
    finally:
        env.close()


def test_held_out_tests_are_deterministic_and_read_back_from_the_cache(shared_data, tmp_path):
    from lrmgym.envs.code import heldout
    from lrmgym.envs.code.loaders import load_mbpp

    raw = load_mbpp(shared_data / "mbpp" / "mbpp.jsonl")[10:16]

    def pool():
        return heldout.SandboxPool("auto", workers=2, warm=False)

    a = heldout.graded_tasks(raw, pool, cache=tmp_path / "a")
    b = heldout.graded_tasks(raw, pool, cache=tmp_path / "b")
    assert [t.units for t in a] == [t.units for t in b]
    assert all(sum(u["test"] for u in t.units) >= 2 for t in a)
    shown = {u["src"] for t in raw for u in t.units}
    assert not shown & {u["src"] for t in a for u in t.units}  # never a test the prompt lists

    def no_pool():
        raise AssertionError("a cached task must not start a sandbox")

    assert heldout.graded_tasks(raw, no_pool, cache=tmp_path / "a") == a


def test_a_task_with_no_hidden_test_is_dropped(tmp_path):
    from lrmgym.envs.code import heldout
    from lrmgym.envs.code.loaders import CodeTask

    def task(i, test):
        return CodeTask(
            id=f"mbpp/{i}",
            text=f"Write f.\nYour code should pass these tests:\n{test}",
            units=({"src": test, "test": True},),
            solution="def f(x):\n    return x + 1\n",
            source="mbpp",
        )

    kept, gone = task(1, "assert f(3) == 4"), task(2, "assert f(len('abc')) == 4")  # no literal argument
    out = heldout.graded_tasks([kept, gone], lambda: heldout.SandboxPool("auto", workers=1, warm=False), tmp_path)
    assert [t.id for t in out] == ["mbpp/1"]
    assert "assert f(3) == 4" not in [u["src"] for u in out[0].units]


def test_procedural_example_is_not_graded():
    import numpy as np

    from lrmgym.envs.code.procedural import make_procedural_task
    from lrmgym.testing.reward_hacking.code_cases import shown_answers

    for i in range(60):
        task = make_procedural_task(i, np.random.default_rng(i))
        example = task.text.splitlines()[-1]
        assert example.startswith("assert ") and example not in [u["src"] for u in task.units]
        assert 3 <= len(task.units) <= 5  # units join two asserts of different answers where they can
        (table,) = shown_answers(task.text).values()
        graded = {k for u in task.units for k in next(iter(shown_answers(u["src"]).values()))}
        assert not graded & set(table), task.id


def test_bundle_joins_different_answers_so_a_constant_passes_no_unit():
    from lrmgym.envs.code.heldout import bundle

    tests = [("t1", "True"), ("t2", "1"), ("t3", "False"), ("t4", "True"), ("t5", None), ("t6", "1.0")]
    units = bundle(tests)
    # True, 1 and 1.0 are one answer for ==: four tests of it, one False; t5's answer is unknown.
    assert units[0] == "t5"
    assert all("t3" in u or u == "t5" for u in units) and len(units) == 2
    assert bundle([("a", "0"), ("b", "0")]) == ["a", "b"]  # one answer only: nothing to pair


def test_held_out_inputs_from_arithmetic_literals_and_subclass_results(tmp_path):
    from lrmgym.envs.code import heldout
    from lrmgym.envs.code.loaders import CodeTask

    task = CodeTask(
        id="mbpp/hack-counter",
        text="t",
        units=(
            {"src": "assert count([1, 1, 2], 1.0/2) == {1: 2, 2: 1}", "test": True},
            {"src": "assert count([3], 2/3) == {3: 1}", "test": True},
        ),
        solution="from collections import Counter\ndef count(xs, w):\n    return Counter(xs)\n",
        source="mbpp",
    )
    (out,) = heldout.graded_tasks([task], lambda: heldout.SandboxPool("auto", workers=1, warm=False), tmp_path)
    assert sum(u["src"].count("assert ") for u in out.units) >= 4
    assert "Counter(" not in "".join(u["src"] for u in out.units)  # a Counter result is checked as its dict


def test_a_stdio_program_echoing_its_stdin_is_not_echoed_back(auto_pool):
    """The stdio sibling: a program that prints its case's stdin would read every case's input in the feedback."""
    from lrmgym.core import Completion
    from lrmgym.envs.code.env import CodeEnv, job_for
    from lrmgym.envs.code.loaders import CodeTask

    code_task = CodeTask(
        id="hack/stdio-echo",
        text="Read n and print n * n.",
        cases=({"stdin": "12345\n", "stdout": "152399025\n"}, {"stdin": "678\n", "stdout": "459684\n"}),
    )
    code = "import sys\nprint('ECHO', sys.stdin.read().strip())\n"
    result = auto_pool.run(job_for(code_task, code))
    for mode in ("errors_only", "names", "full"):
        env = CodeEnv(feedback=mode)
        try:
            task = env.task_from(code_task)
            verdict = env._verdict(task, code, result)
            text = env.feedback(task, Completion(f"```python\n{code}\n```"), verdict, 1)
        finally:
            env.close()
        assert ("ECHO 12345" in text) == (mode == "full"), (mode, text)
        assert ("12345" in text) == (mode != "errors_only"), (mode, text)  # names shows each failing stdin
