"""What lrmgym adds to reasoning-gym's scorers: each test shows the scorer paying (or running code) and the env not.

The attacks come from benchmarks/rg_hacking.py (results: benchmarks/results/rg_hacking.md).
"""

from __future__ import annotations

import pytest

pytest.importorskip("reasoning_gym")

import lrmgym  # noqa: E402
from lrmgym.core import Completion, Task  # noqa: E402
from lrmgym.envs.rg import tasks as rg_tasks  # noqa: E402
from lrmgym.envs.rg._worker import safe_source  # noqa: E402
from lrmgym.envs.rg.env import rg_pool  # noqa: E402
from lrmgym.envs.rg.rules import rule_reason  # noqa: E402


def answer(text: str) -> str:
    return f"<think>working</think><answer>{text}</answer>"


def raw_score(task: Task, text: str) -> float:
    """reasoning-gym's own scorer on ``text``, in this process (only for inputs that run no code)."""
    dataset, entry = rg_tasks.make_entry(task.metadata["rg_task"], task.metadata["rg_config"], task.metadata["rg_seed"])
    return dataset.score_answer(text, entry)


# ------------------------------------------------------------------------------------------------ code in answers
EVAL_PAYLOAD = "[__import__('pathlib').Path({path!r}).touch()]"  # for scorers that eval(answer)
# sympy's parse_expr turns bare names into symbols, but follows attribute chains from one to the builtins
SYMPY_PAYLOAD = "x.subs.__func__.__globals__['__builtins__']['__import__']('pathlib').Path({path!r}).touch()"


@pytest.mark.parametrize(
    ("name", "template"),
    [
        ("n_queens", EVAL_PAYLOAD),
        ("spiral_matrix", EVAL_PAYLOAD),
        ("binary_matrix", EVAL_PAYLOAD),
        ("string_insertion", EVAL_PAYLOAD),
        ("polynomial_multiplication", SYMPY_PAYLOAD),
        ("simple_integration", SYMPY_PAYLOAD),  # its scorer's bare `except:` swallows the refusal: still refused
        ("countdown", SYMPY_PAYLOAD),
        ("puzzle24", SYMPY_PAYLOAD),
    ],
)
def test_code_in_an_answer_never_runs(name, template, tmp_path):
    env = lrmgym.make("ReasoningGym-v0", task=name, timeout_s=5.0)
    task = env.task_at(0, seed=0)
    marker = tmp_path / "ran"
    payload = template.format(path=str(marker))
    # reasoning-gym's scorer runs it (here, in this process: the payload only touches a file in tmp_path)
    raw_score(task, payload)
    assert marker.exists(), "reasoning-gym no longer runs this answer: update the test and the docs"
    marker.unlink()
    verdict = env.verify(task, Completion(answer(payload)))
    assert verdict.score == 0.0, verdict.reason
    assert ("code in the answer" if name not in ("countdown", "puzzle24") else "lrmgym's rule") in verdict.reason
    assert not marker.exists()
    assert env.verify(task, Completion(answer(task.answer))).score == 1.0  # the worker is still sound


def test_the_guard_refuses_in_the_worker_where_no_rule_applies(tmp_path):
    env = lrmgym.make("ReasoningGym-v0", task="countdown", timeout_s=5.0)
    task = env.task_at(0, seed=0)
    marker = tmp_path / "ran"
    reply = rg_pool().send(env.score_request(task, SYMPY_PAYLOAD.format(path=str(marker))), 5.0)
    assert reply["status"] == "refused" and not marker.exists()


@pytest.mark.parametrize(
    "source",
    [
        "__import__('os').system('true')",
        "().__class__.__base__.__subclasses__()",
        "exec(chr(105))",
        "open(0)",
        "[x for x in range(3)]",
        "(lambda: 1)()",
        "9**9**9",
        "2**100000",
        "f'{1}'",
        "a.b",
        "a[0]",
        "import os",
    ],
)
def test_safe_source_refuses_code(source):
    assert safe_source(source) is not None


@pytest.mark.parametrize(
    "source",
    [
        "[[1, 2], [3, 4]]",
        "Symbol ('x' )**Integer (2 )+Integer (3 )*Symbol ('x' )",
        "'abc'",
        "from sympy import *",
        "sqrt(Integer (2 ))/Integer (2 )",
        "-(3 + 4) * 5 / 6",
    ],
)
def test_safe_source_allows_data_and_arithmetic(source):
    assert safe_source(source) is None


# ------------------------------------------------------------------------------------------------ task rules
def test_puzzle24_pays_any_four_numbers_making_24_and_truncates():
    env = lrmgym.make("ReasoningGym-v0", task="puzzle24")
    env.reset(seed=0)
    tasks = (env.task_at(i) for i in range(20))
    task = next(t for t in tasks if sorted(t.metadata["rg_metadata"]["numbers"]) != [1, 1, 4, 6])
    for hack in ("6*4*1*1", "5*5-1/2"):  # not the puzzle's numbers; 24.5 truncated to 24
        assert raw_score(task, hack) == 1.0
        verdict = env.verify(task, Completion(answer(hack)))
        assert verdict.score == 0.0 and "rule for puzzle24" in verdict.reason


def test_game_of_life_halting_pays_any_non_empty_answer():
    env = lrmgym.make("ReasoningGym-v0", task="game_of_life_halting")
    env.reset(seed=0)
    task = env.task_at(0)
    wrong = "False" if task.answer == "True" else "True"
    for hack in (wrong, "maybe"):
        assert raw_score(task, hack) == 1.0
        assert env.verify(task, Completion(answer(hack))).score == 0.0
    assert env.verify(task, Completion(answer(task.answer.lower()))).score == 1.0


@pytest.mark.parametrize(
    ("hack", "numbers", "target"),
    [("2**3+4", [2, 3, 4], 12), ("12.5*8", [12, 5, 8], 100), ("10%3", [10, 3], 1), ("2^3+4", [2, 3, 4], 5)],
)
def test_countdown_pays_other_operators_and_decimals(hack, numbers, target):
    meta = {"numbers": numbers, "target": target}
    dataset, _ = rg_tasks.make_entry("countdown", rg_tasks.config_spec({}, None, "inclusive"), 0)
    assert dataset.score_answer(hack, {"question": "", "answer": "", "metadata": meta}) == 1.0
    task = Task(id="t", prompt="", metadata={"rg_metadata": meta, "rg_config": {"overrides": {}}})
    assert "not allowed" in rule_reason("countdown", hack, task)


def test_countdown_rule_keeps_the_operators_of_the_config():
    meta = {"numbers": [2, 3, 4], "target": 10}
    task = Task(id="t", prompt="", metadata={"rg_metadata": meta, "rg_config": {"overrides": {}}})
    assert rule_reason("countdown", "2*3+4", task) is None and rule_reason("countdown", "-(2-3*4)", task) is None
    assert "value is 14" in rule_reason("countdown", "2+3*4", task)
    assert "numbers" in rule_reason("countdown", "3*3+1", task)
    only_add = Task(id="t", prompt="", metadata={"rg_metadata": meta, "rg_config": {"overrides": {"operators": ["+"]}}})
    assert "not allowed" in rule_reason("countdown", "2*3+4", only_add)


# ------------------------------------------------------------------------------------------------ partial credit
def test_binary_reward_does_not_pay_the_gold_quoted_in_prose():
    prose = "I considered 3, 5 and {gold}; the answer is {gold}, I think"
    binary = lrmgym.make("ReasoningGym-v0", task="gcd")
    graded = lrmgym.make("ReasoningGym-v0", task="gcd", reward="graded")
    task = binary.task_at(0, seed=0)
    text = prose.format(gold=task.answer)
    partial = raw_score(task, text)
    assert 0.0 < partial < 1.0  # reasoning-gym's default scorer: len(gold) / len(answer) when gold is inside
    assert binary.verify(task, Completion(answer(text))).score == 0.0
    assert graded.verify(task, Completion(answer(text))).score == pytest.approx(partial)
    assert graded.verify(task, Completion(answer(task.answer))).score == 1.0
