"""The LLM judge against a real local HTTP server (the `openai` policy): answers, 500s, garbage and hangs."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner
from judge_server import JudgeServer  # the same directory; pytest puts it on sys.path

from lrmgym.cli.judge_cmd import command
from lrmgym.core import Completion, Task, Verdict
from lrmgym.judges.llm import PairwiseJudgeConfig, PointwiseJudgeConfig

pytest.importorskip("lrmgym.policies.openai")

TASK = Task(id="t/0", prompt="What is 2+2?", answer="4")
RIGHT = Completion("<think>2+2=4</think><answer>4</answer>")


def _judge(server, **kw):
    options = {"max_retries": 1, "backoff_s": 0.0, "timeout_s": 2.0, **kw}
    return PointwiseJudgeConfig(policy=server.policy(), **options).build()


def test_a_healthy_server_is_parsed_and_timed():
    with JudgeServer("ok", reply="Reasoning is sound.\nSCORE: 9") as server:
        judge = _judge(server)
        comp = judge.score(TASK, RIGHT, Verdict(score=1.0))
        assert comp.score == 0.9 and comp.latency_s > 0
        sent = server.bodies[0]
        assert sent["temperature"] == 0.0 and sent["messages"][0]["role"] == "user"
        assert "<<<BEGIN CANDIDATE" in sent["messages"][0]["content"]


@pytest.mark.parametrize(
    ("mode", "reply", "counter", "reason"),
    [
        ("500", "", "llm_errors", "failed after 2 attempt(s): PolicyRequestError: "),
        ("garbage", "", "llm_errors", "failed after 2 attempt(s): PolicyRequestError: "),
        ("ok", "I would say it is quite good.", "llm_parse_errors",
         "failed after 2 attempt(s): unparseable judge reply: 'I would say it is quite good.'"),
    ],
)  # fmt: skip
def test_failing_servers_give_ungradeable_counted_verdicts(mode, reply, counter, reason):
    with JudgeServer(mode, reply=reply) as server:
        judge = _judge(server)
        comp = judge.score(TASK, RIGHT, Verdict(score=1.0))
        assert comp.score is None and comp.reason.startswith(reason)
        stats = judge.stats()
        assert stats[counter] == 2 and stats["llm_failures"] == 1 and server.requests == 2


def test_a_hanging_server_is_cut_off_by_the_judge_timeout():
    with JudgeServer("hang", hang_s=3.0) as server:
        judge = PointwiseJudgeConfig(policy=server.policy(timeout_s=10.0), timeout_s=0.3, max_retries=1,
                                     backoff_s=0.0).build()  # fmt: skip
        start = time.perf_counter()
        comp = judge.score(TASK, RIGHT, Verdict(score=1.0))
        assert time.perf_counter() - start < 1.5
        assert comp.score is None and comp.reason == "failed after 2 attempt(s): timeout after 0.3 s"
        assert judge.stats()["llm_timeouts"] == 2


def test_the_policy_transport_timeout_also_ends_in_an_ungradeable_verdict():
    with JudgeServer("hang", hang_s=3.0) as server:
        judge = _judge(server, max_retries=0)  # the policy's own 0.5 s deadline fires first
        comp = judge.score(TASK, RIGHT, Verdict(score=1.0))
        assert comp.score is None and "timed out after 0.5 s" in comp.reason


def test_pairwise_judge_over_http_in_both_orders():
    with JudgeServer("ok", reply="VERDICT: A") as server:  # a judge with pure position bias
        judge = PairwiseJudgeConfig(policy=server.policy(), both_orders=True, backoff_s=0.0).build()
        assert judge.compare(TASK, RIGHT, Completion("<answer>5</answer>")) == 0.5
        assert server.requests == 2


@pytest.mark.parametrize("mode", ["500", "garbage", "hang"])
def test_lrmgym_judge_finishes_and_counts_failures_when_the_server_fails(tmp_path, mode):
    rows = [{"task_id": "t", "prompt": "What is 2+2?", "answer": "4", "completions": ["<answer>4</answer>", "5"]}]
    src = tmp_path / "c.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with JudgeServer(mode, hang_s=2.0) as server:
        policy = json.dumps(server.policy(timeout_s=0.3))
        result = CliRunner().invoke(command, [
            "--input", str(src), "judge=llm_pointwise", f"judge.llm_pointwise.policy={policy}",
            "judge.llm_pointwise.max_retries=1", "judge.llm_pointwise.backoff_s=0", "judge.llm_pointwise.timeout_s=1",
        ])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "0 gradeable, 2 ungradeable" in result.output and "llm_failures=2" in result.output
    rows = [json.loads(x) for x in (tmp_path / "c.verdicts.jsonl").read_text().splitlines()]
    assert [r["verdict"]["score"] for r in rows] == [None, None]


# ---- issue 35.9: a judge failure must not mask a verifiable verdict, nor one completion another's
def test_over_long_completions_neither_mask_wrong_answers_nor_open_the_circuit_for_the_others():
    from lrmgym.envs.echo import EchoEnv
    from lrmgym.judges.base import JudgedEnv
    from lrmgym.judges.rule import AccuracyJudge

    with JudgeServer("context", reply="SCORE: 7", context_chars=4000) as server:
        llm = _judge(server, breaker_after=5, breaker_cooldown_s=30.0, cache_size=0)
        env = JudgedEnv(EchoEnv(words=1), [AccuracyJudge(), llm])
        env.reset(seed=0)
        task = env.task
        long_wrong = ["x" * 10_000 + str(k) for k in range(6)]  # too long for the judge model's context
        verdicts = env.score_group(task, long_wrong)
        assert [v.score for v in verdicts] == [0.0] * 6  # wrong answers score 0, never masked
        assert all(v.components[1].score is None and "HTTP 400" in v.components[1].reason for v in verdicts)
        assert server.requests == 6  # a refused request is not retried: it would be refused again
        ok = env.score_group(task, [task.answer, "wrong"])  # the endpoint is fine: later completions are judged
        assert [v.score for v in ok] == [pytest.approx(1.7), pytest.approx(0.7)]
        stats = llm.stats()
        assert stats.get("llm_short_circuits", 0) == 0 and stats["llm_refused"] == 6
        assert env.pop_metrics()["judge_failed"] == 6


def test_a_dead_endpoint_still_opens_the_circuit_and_wrong_answers_still_score_zero():
    import socket

    from lrmgym.envs.echo import EchoEnv
    from lrmgym.judges.base import JudgedEnv
    from lrmgym.judges.rule import AccuracyJudge

    with socket.socket() as s:  # a closed loopback port: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    policy = {"kind": "openai", "base_url": f"http://127.0.0.1:{port}/v1", "model": "judge", "api_key_env": None,
              "timeout_s": 0.5, "max_retries": 0, "logprobs": False}  # fmt: skip
    llm = PointwiseJudgeConfig(policy=policy, max_retries=0, backoff_s=0.0, breaker_after=2, workers=1).build()
    env = JudgedEnv(EchoEnv(words=1), [AccuracyJudge(), llm])
    env.reset(seed=0)
    verdicts = env.score_group(env.task, [env.task.answer, "wrong", "wrong again", env.task.answer])
    assert [v.score for v in verdicts] == [1.0, 0.0, 0.0, 1.0]  # the verifier's scores: nothing masked
    stats = llm.stats()
    # two connection errors, then a probe that fails too: the circuit opens and the last two fail at once
    assert (stats["llm_errors"], stats["llm_probes"], stats["llm_probe_failures"]) == (2, 1, 1)
    assert stats["llm_short_circuits"] == 2
