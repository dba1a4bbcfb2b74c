"""Judges inside a GRPO training run: a failing LLM judge does not stop training, and the arena is logged."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "learners"))  # the learner tests' fixtures

import pytest  # noqa: E402
from judge_server import JudgeServer  # noqa: E402
from learner_helpers import register_test_env, run_config  # noqa: E402

from lrmgym.compose import train
from lrmgym.judges.arena import ArenaJudgeConfig  # noqa: E402
from lrmgym.judges.llm import PointwiseJudgeConfig  # noqa: E402
from lrmgym.judges.rule import AccuracyJudgeConfig  # noqa: E402
from lrmgym.learners.grpo import GRPOConfig  # noqa: E402

register_test_env()


def _run(tmp_path, judges):
    learner = GRPOConfig(steps=2, prompts_per_step=2, group_size=4, max_new_tokens=6, eval_before_after=False,
                         checkpoint_every=100, progress=False, lr=1e-3)  # fmt: skip
    cfg = run_config(learner).model_copy(update={"judge": judges})
    summary = train(cfg, tmp_path, resume=False)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return summary, lines


def test_training_continues_when_the_llm_judge_talks_garbage_and_counts_the_failures(tmp_path):
    judges = {
        "accuracy": AccuracyJudgeConfig(),
        # a judge model that answers random text: every reply is unparseable, retried once, then ungradeable
        "llm_pointwise": PointwiseJudgeConfig(policy={"kind": "mock", "mode": "random"}, max_retries=1, backoff_s=0),
    }
    summary, lines = _run(tmp_path, judges)
    assert summary["steps"] == 2 and [m["step"] for m in lines] == [1, 2]
    for m in lines:
        assert m["judge/llm_pointwise/llm_failures"] == 8  # 2 prompts x 4 samples per step, all failed
        assert m["judge/llm_pointwise/llm_parse_errors"] == 16


def test_training_continues_when_the_http_judge_server_answers_500(tmp_path):
    pytest.importorskip("lrmgym.policies.openai")
    with JudgeServer("500") as server:
        judges = {
            "accuracy": AccuracyJudgeConfig(),
            "llm_pointwise": PointwiseJudgeConfig(policy=server.policy(), max_retries=1, backoff_s=0, timeout_s=2),
        }
        summary, lines = _run(tmp_path, judges)
    m = lines[-1]
    assert summary["steps"] == 2
    assert [m["judge/llm_pointwise/failures"] for m in lines] == [8, 8]  # the judge failed on every sample
    # ... and the verifier graded each, so nothing was masked: the samples fell back to the verifiable score.
    assert [m["ungradeable_frac"] for m in lines] == [0.0, 0.0] and [m["judge/judge_failed"] for m in lines] == [8, 8]
    # After 5 consecutive endpoint failures one probe request fails too and the circuit breaker opens: the rest
    # fail at once, without requests.
    assert m["judge/llm_pointwise/llm_short_circuits"] == 8 and server.requests <= 8 * 2 + 1
    assert lines[0]["judge/llm_pointwise/llm_probe_failures"] == 1


def test_arena_metrics_reach_the_training_log(tmp_path):
    judges = {
        "arena": ArenaJudgeConfig(pairwise={"kind": "rule_pairwise", "criteria": ["format"]}, route_when="always")
    }
    _, lines = _run(tmp_path, judges)
    for m in lines:
        assert m["judge/arena/groups"] == 2 and m["judge/arena/frac_routed"] == 1.0
        assert m["judge/arena/judge_calls"] == 2 * 6  # 3G - 6 = 6 calls per group of 4


def test_async_rollouts_keep_the_judges_metrics(tmp_path):
    # The worker process judges; its counters must reach the trainer's log, equal to the synchronous loop's
    # under frozen weights (they used to read 0 at every step).
    judges = {
        "arena": ArenaJudgeConfig(pairwise={"kind": "rule_pairwise", "criteria": ["format"]}, route_when="always")
    }
    lines = {}
    for mode in (False, True):
        learner = GRPOConfig(
            steps=2, prompts_per_step=2, group_size=4, max_new_tokens=6, eval_before_after=False,
            checkpoint_every=100, progress=False, lr=1e-12, async_rollouts=mode, torch_threads=1,
        )  # fmt: skip
        cfg = run_config(learner).model_copy(update={"judge": judges})
        train(cfg, tmp_path / str(mode))
        lines[mode] = [json.loads(x) for x in (tmp_path / str(mode) / "metrics.jsonl").read_text().splitlines()]
    for sync, lagged in zip(lines[False], lines[True], strict=True):
        judged = {k: v for k, v in sync.items() if k.startswith("judge/") and not k.endswith(("_s", "seconds"))}
        assert judged and judged["judge/arena/judge_calls"] == 12
        assert {k: lagged[k] for k in judged} == judged
