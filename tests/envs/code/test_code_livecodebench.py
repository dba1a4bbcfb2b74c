"""LiveCodeBench-style stdio tasks: the loader (private tests graded, shown public ones never), the refusal of the
release's pickled tests, and hostile stdio programs bounded by the sandbox (CI runs this folder with and without
bubblewrap: ``LRMGYM_TEST_NO_BWRAP=1``)."""

from __future__ import annotations

import base64
import json
import pickle
import time
import zlib
from pathlib import Path

import pytest

import lrmgym
from lrmgym.envs.code.livecodebench import STDIO_INSTRUCTION, load_livecodebench
from lrmgym.envs.code.loaders import DataError
from lrmgym.eval.config import EvalConfig
from lrmgym.eval.runner import evaluate
from lrmgym.testing.mock import ScriptedPolicy

LCB = Path(__file__).resolve().parents[2] / "fixtures" / "evals" / "livecodebench.jsonl"
SOLUTIONS = {
    "livecodebench/fake001": "a, b = map(int, input().split())\nprint(a + b)",
    "livecodebench/fake002": "print(input()[::-1])",
    "livecodebench/fake003": "print(sum(c in 'aeiou' for c in input()))",
}


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


def _prompt_text(task) -> str:
    return task.prompt[-1]["content"] if isinstance(task.prompt, list) else task.prompt


@pytest.fixture(scope="module")
def env(sandbox_available):
    e = lrmgym.make("lrmgym/Code-v0", source=str(LCB), data_format="livecodebench", reward="all_or_nothing",
                    timeout_s=2.0, output_bytes=1 << 16, chat=True)  # fmt: skip
    yield e
    e.close()


def _task(env, task_id: str):
    return next(t for t in (env.unwrapped.task_at(i, seed=0) for i in range(3)) if t.id == task_id)


def test_loader_takes_stdio_tasks_and_grades_private_tests_only():
    tasks = load_livecodebench(LCB)
    assert [t.id for t in tasks] == list(SOLUTIONS)  # the functional (LeetCode) record is skipped
    add = tasks[0]
    assert [c["stdin"] for c in add.cases] == ["5 7\n", "100 -3\n"]  # the private "1 2" repeats the shown example
    assert "Example 1\nInput:\n1 2\nOutput:\n3" in add.text and add.text.endswith(STDIO_INSTRUCTION)
    for task in tasks:
        assert all(f"Input:\n{c['stdin'].rstrip()}\nOutput" not in task.text for c in task.cases)  # none shown


def test_private_tests_given_as_a_json_list_load_too(tmp_path):
    row = json.loads(LCB.read_text().splitlines()[1])
    row["private_test_cases"] = json.loads(row["private_test_cases"])
    row["public_test_cases"] = json.loads(row["public_test_cases"])
    path = tmp_path / "lcb.jsonl"
    path.write_text(json.dumps(row) + "\n")
    assert [c["stdout"] for c in load_livecodebench(path)[0].cases] == ["olleh\n", "x\n"]


def test_the_releases_pickled_tests_are_refused_and_never_unpickled(tmp_path, monkeypatch):
    row = json.loads(LCB.read_text().splitlines()[0])
    blob = pickle.dumps(row["private_test_cases"])  # what the release stores: base64(zlib(pickle(json text)))
    row["private_test_cases"] = base64.b64encode(zlib.compress(blob)).decode("ascii")
    path = tmp_path / "lcb.jsonl"
    path.write_text(json.dumps(row) + "\n")

    def forbidden(*args, **kwargs):
        raise AssertionError("the loader unpickled data")

    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "Unpickler", forbidden)
    with pytest.raises(DataError) as info:
        load_livecodebench(path)
    assert str(info.value).startswith(
        f"{path}:1: private_test_cases is in the release's compressed form (base64 of zlib of a Python pickle). "
        "lrmgym never unpickles data, since loading a pickle can run code. Give the tests as plain JSON instead"
    )


def test_a_file_of_functional_tasks_only_is_one_clear_error(tmp_path):
    path = tmp_path / "lcb.jsonl"
    path.write_text(LCB.read_text().splitlines()[3] + "\n")
    with pytest.raises(DataError, match=r"no stdio task to grade \(1 functional task\(s\) skipped"):
        load_livecodebench(path)


def test_correct_programs_pass_and_a_table_of_the_shown_examples_earns_nothing(env):
    for task_id, code in SOLUTIONS.items():
        verdict = env.unwrapped.verify(_task(env, task_id), fenced(code))
        assert (verdict.score, verdict.correct) == (1.0, True), verdict.reason
    add = _task(env, "livecodebench/fake001")
    table = "line = input()\nprint({'1 2': 3}.get(line.strip(), 0))"  # right on the shown example, a default elsewhere
    verdict = env.unwrapped.verify(add, fenced(table))
    assert (verdict.score, verdict.reason) == (0.0, "0/2 tests passed")
    half = "a, b = map(int, input().split())\nprint(a + b if a > 0 and b > 0 else 0)"  # right on 5 7 only
    assert env.unwrapped.verify(add, fenced(half)).score == 0.0  # all or nothing, as LiveCodeBench scores


@pytest.mark.parametrize(
    ("name", "code", "status"),
    [
        ("loop", "while True:\n    pass", "timeout"),
        ("sleep", "import time\ntime.sleep(60)", "timeout"),
        ("huge_output", "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", "output_limit"),
        ("huge_stderr", "import sys\nsys.stderr.write('e' * (1 << 24))", "output_limit"),
    ],
)
def test_hostile_stdio_programs_are_bounded_and_score_0(env, name, code, status):
    task = _task(env, "livecodebench/fake002")
    start = time.monotonic()
    verdict = env.unwrapped.verify(task, fenced(code))
    wall = time.monotonic() - start
    assert verdict.score == 0.0 and verdict.correct is False
    assert verdict.components[0].reason == status, verdict.reason
    assert wall < 2.0 + 6.0  # timeout_s plus the kill and a loaded machine's slack
    after = env.unwrapped.verify(task, fenced(SOLUTIONS["livecodebench/fake002"]))
    assert after.score == 1.0  # the env still grades afterwards


def test_evaluation_under_a_scripted_policy(env):
    right = {_prompt_text(_task(env, t)): fenced(c) for t, c in SOLUTIONS.items() if t != "livecodebench/fake003"}
    policy = ScriptedPolicy(lambda p, i: right.get(p[-1]["content"], fenced("print(0)")))
    report = evaluate(env, policy, EvalConfig(n=2, k=[1, 2], tasks=50, split="test"), progress=False)
    assert report["tasks"] == 3
    assert report["avg@n"]["value"] == pytest.approx(2 / 3)
    assert report["pass@k"]["pass@2"]["value"] == pytest.approx(2 / 3)
    low, high = report["avg@n"]["ci"]
    assert 0.0 <= low < 2 / 3 < high <= 1.0
