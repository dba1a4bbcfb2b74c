"""The evaluation runner on Echo-v0 and Math-v0 with scripted, adversarial and tiny-model policies."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

import lrmgym
from lrmgym.core import Verdict
from lrmgym.envs.echo import EchoEnv
from lrmgym.eval import EvalConfig, evaluate, print_report
from lrmgym.eval.runner import select_tasks
from lrmgym.testing import AdversarialPolicy, ScriptedPolicy


def _echo_half_right(prompt, j):
    # Samples 0 and 2 repeat the words, 1 and 3 do not: every task has c = 2 of n = 4.
    return prompt.removeprefix("Repeat exactly: ") if j % 2 == 0 else "nope"


def test_report_values_and_files(tmp_path):
    env = lrmgym.make("Echo-v0", words=2)
    cfg = EvalConfig(n=4, k=[1, 2, 4], tasks=6)
    report = evaluate(env, ScriptedPolicy(_echo_half_right), cfg, tmp_path, progress=False)
    assert report["tasks"] == 6 and report["samples"] == 24
    assert report["avg@n"]["value"] == 0.5 and report["avg@n"]["ci"] == [0.5, 0.5]
    assert report["pass@k"]["pass@1"]["value"] == 0.5
    assert report["pass@k"]["pass@2"]["value"] == pytest.approx(5 / 6)  # 1 - C(2,2)/C(4,2)
    assert report["pass@k"]["pass@4"]["value"] == 1.0
    assert report["by_difficulty"] == {"2": {"tasks": 6, "avg@n": 0.5, "pass@1": 0.5, "pass@2": pytest.approx(5 / 6),
                                             "pass@4": 1.0}}  # fmt: skip
    assert report["ungradeable_rate"]["value"] == 0.0 and report["format_failure_rate"]["value"] is None
    assert json.loads((tmp_path / "eval.json").read_text()) == json.loads(json.dumps(report))
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 24
    assert [r["passed"] for r in rows[:4]] == [True, False, True, False]
    assert rows[0]["prompt"].startswith("Repeat exactly: ") and rows[1]["prompt"] is None
    assert rows[1]["verdict"]["reason"] == "mismatch"


def test_same_seed_same_tasks_and_table_prints(tmp_path):
    env = lrmgym.make("Echo-v0")
    cfg = EvalConfig(n=2, k=[1, 2], tasks=5, seed=3)
    a = evaluate(env, ScriptedPolicy(_echo_half_right), cfg, tmp_path / "a", progress=False)
    b = evaluate(env, ScriptedPolicy(_echo_half_right), cfg, tmp_path / "b", progress=False)
    rows = [[json.loads(line) for line in (tmp_path / d / "samples.jsonl").read_text().splitlines()] for d in "ab"]
    for row in rows[0] + rows[1]:
        row["verdict"].pop("latency_s")  # wall-clock time, the only field that may differ
    assert rows[0] == rows[1]
    console = Console(record=True, width=120)
    print_report(a, console)
    text = console.export_text()
    assert "pass@2" in text and "100.0%" in text and "avg@n" in text and "50.0%" in text
    assert a["avg@n"] == b["avg@n"]


class _CrashingEcho(EchoEnv):
    def verify(self, task, completion):
        if completion.text == "boom":
            raise RuntimeError("verifier bug")
        return super().verify(task, completion)


def test_a_crashing_verifier_makes_the_group_ungradeable_not_the_run():
    env = _CrashingEcho()
    policy = ScriptedPolicy(lambda p, j: "boom" if "apple" in p else p.removeprefix("Repeat exactly: "))
    report = evaluate(env, policy, EvalConfig(n=2, tasks=20), progress=False)
    rate = report["ungradeable_rate"]
    assert 0 < rate["count"] < 40 and rate["count"] % 2 == 0
    assert report["avg@n"]["value"] == pytest.approx(1 - rate["count"] / 40)


def test_adversarial_outputs_are_graded_on_math():
    env = lrmgym.make("Math-v0", difficulty=1, style="compact", template="r1")
    report = evaluate(env, AdversarialPolicy(), EvalConfig(n=3, k=[1, 3], tasks=2), progress=False)
    assert report["samples"] == 6 and report["pass@k"]["pass@3"]["value"] == 0.0
    assert report["env"] == "lrmgym/Math-v0" and report["split"] == "test"


def test_split_option_picks_the_test_split():
    env = lrmgym.make("Math-v0", difficulty=1, style="compact", template="r1", split="train")
    grader, tasks = select_tasks(env, EvalConfig(tasks=5, split="test"))
    assert grader.config.split == "test"
    test_env = lrmgym.make("Math-v0", difficulty=1, style="compact", template="r1", split="test").unwrapped
    assert [t.prompt for t in tasks] == [test_env.task_at(i, seed=0).prompt for i in range(5)]
    _, same = select_tasks(env, EvalConfig(tasks=5, split=None))
    assert [t.prompt for t in same] == [env.unwrapped.task_at(i, seed=0).prompt for i in range(5)]


def test_math_format_failures_and_passes_are_counted():
    env = lrmgym.make("Math-v0", difficulty=1, style="compact", template="r1")
    solutions = {}

    def answer(prompt, j):
        task = solutions[prompt]
        return [task.metadata["solution"], f"the answer is {task.answer}"][j]

    _, tasks = select_tasks(env, EvalConfig(tasks=4))
    solutions.update({t.prompt: t for t in tasks})
    report = evaluate(env, ScriptedPolicy(answer), EvalConfig(n=2, k=[1, 2], tasks=4), progress=False)
    assert report["avg@n"]["value"] == 0.5 and report["pass@k"]["pass@2"]["value"] == 1.0
    assert report["format_failure_rate"]["value"] == 0.5


def test_a_tiny_hf_model_reports_tokens():
    import torch

    from lrmgym.policies.hf import HFPolicy
    from lrmgym.policies.tiny import TinyArch, build_model, build_tokenizer

    tok = build_tokenizer()
    policy = HFPolicy(build_model(TinyArch(hidden=64, layers=1, heads=2, mlp=64), len(tok), 0), tok)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the CPU is shared; a tiny model gains nothing from more
    try:
        report = evaluate(lrmgym.make("Echo-v0"), policy, EvalConfig(n=2, tasks=3, max_new_tokens=5), progress=False)
    finally:
        torch.set_num_threads(threads)
    assert report["mean_tokens"] <= 5 and report["tokens_per_s"] > 0
    assert report["truncated_rate"]["total"] == 6


def test_verdict_without_correct_flag_uses_the_threshold():
    class Scored(EchoEnv):
        def verify(self, task, completion):
            return Verdict(score=0.7)

    env = Scored()
    assert evaluate(env, ScriptedPolicy(["x"]), EvalConfig(n=1, tasks=2), progress=False)["avg@n"]["value"] == 0.0
    cfg = EvalConfig(n=1, tasks=2, pass_threshold=0.5)
    assert evaluate(env, ScriptedPolicy(["x"]), cfg, progress=False)["avg@n"]["value"] == 1.0


def test_multi_turn_envs_are_evaluated_as_whole_episodes(tmp_path):
    # Echo with 2 turns: half the first answers are wrong; every second try (after the feedback) is right.
    env = lrmgym.make("Echo-v0", words=2, max_turns=2)

    def policy(prompt, j):
        target = prompt.rsplit("Repeat exactly: ", 1)[1].split("\n")[0].strip()
        first_turn = "Wrong" not in prompt
        return "nope" if first_turn and j % 2 == 0 else target

    cfg = EvalConfig(n=4, k=[1, 4], tasks=5)
    report = evaluate(env, ScriptedPolicy(policy), cfg, tmp_path, progress=False)
    assert report["first_turn_avg@n"] == 0.5 and report["avg@n"]["value"] == 1.0
    assert report["max_turns"] == 2 and report["mean_turns"] == 1.5
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [r["turns"] for r in rows[:4]] == [2, 1, 2, 1]
    assert [t["role"] for t in rows[0]["transcript"]] == ["policy", "env", "policy"]
    assert all(r["passed"] for r in rows)
    print_report(report, Console(file=open(tmp_path / "table.txt", "w")))
    assert "first turn avg@n (of 2)" in (tmp_path / "table.txt").read_text()
