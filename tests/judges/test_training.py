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
from lrmgym.learners.algorithms.grpo import GRPOConfig  # noqa: E402

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


# ---- issue 36.10: a dead judge endpoint stops the run loudly instead of training on nothing
def _dead_policy() -> dict:
    import socket

    with socket.socket() as s:  # a closed loopback port: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {"kind": "openai", "base_url": f"http://127.0.0.1:{port}/v1", "model": "judge", "api_key_env": None,
            "timeout_s": 0.5, "max_retries": 0, "logprobs": False}  # fmt: skip


def _learner(steps: int) -> GRPOConfig:
    return GRPOConfig(steps=steps, prompts_per_step=2, group_size=4, max_new_tokens=6, eval_before_after=False,
                      checkpoint_every=100, progress=False, lr=1e-3)  # fmt: skip


def _lines(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_dead_judge_endpoint_stops_the_run_after_three_failed_steps_and_the_run_resumes(tmp_path, capsys):
    from lrmgym.learners.engine.loop import FailedStepsError

    judges = {"llm_pointwise": PointwiseJudgeConfig(policy=_dead_policy(), max_retries=0, backoff_s=0)}
    cfg = run_config(_learner(5)).model_copy(update={"judge": judges})
    with pytest.raises(FailedStepsError) as err:
        train(cfg, tmp_path, resume=False)
    message = str(err.value)
    assert err.value.code == message and "\n" not in message  # SystemExit: one line, exit status 1
    assert message.startswith("stopped at step 3: 3 steps in a row in which every sample was ungradeable; ")
    assert "last error: llm_pointwise: " in message and "PolicyRequestError: " in message
    assert "Connection refused" in message and f"lrmgym run --resume {tmp_path}" in message
    assert [(m["step"], m["ungradeable_frac"]) for m in _lines(tmp_path)] == [(1, 1.0), (2, 1.0), (3, 1.0)]
    warnings = [x for x in capsys.readouterr().out.splitlines() if x.startswith("warning: step")]
    assert len(warnings) == 2 and warnings[0].startswith("warning: step 1: every sample was ungradeable")
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "failed_steps"
    # The run directory is resumable: with the judge back, training continues from step 3.
    with JudgeServer("ok", reply="SCORE: 5") as server:
        live = {"llm_pointwise": PointwiseJudgeConfig(policy=server.policy(), max_retries=0, backoff_s=0)}
        summary = train(cfg.model_copy(update={"judge": live}), tmp_path, resume=True)
    assert summary["steps"] == 5 and [m["step"] for m in _lines(tmp_path)] == [1, 2, 3, 4, 5]
    assert [m["ungradeable_frac"] for m in _lines(tmp_path)][3:] == [0.0, 0.0]


def test_a_dead_judge_beside_the_verifier_stops_the_run_too(tmp_path):
    # The verifier grades every sample (nothing is masked), but the judge the user asked for never answers:
    # training on the verifier alone without saying so would be silent, so this stops as well.
    from lrmgym.learners.engine.loop import FailedStepsError

    judges = {
        "accuracy": AccuracyJudgeConfig(),
        "llm_pointwise": PointwiseJudgeConfig(policy=_dead_policy(), max_retries=0, backoff_s=0),
    }
    cfg = run_config(_learner(5)).model_copy(update={"judge": judges})
    with pytest.raises(FailedStepsError) as err:
        train(cfg, tmp_path, resume=False)
    assert str(err.value).startswith(
        "stopped at step 3: 3 steps in a row in which the llm_pointwise judge failed on all 8 samples; "
        "last error: llm_pointwise: "
    )
    assert "see judge.llm_pointwise.policy" in str(err.value)
    assert [m["ungradeable_frac"] for m in _lines(tmp_path)] == [0.0, 0.0, 0.0]


def test_max_failed_steps_zero_only_warns(tmp_path, capsys):
    from learner_helpers import make_loop

    judges = {"llm_pointwise": PointwiseJudgeConfig(policy=_dead_policy(), max_retries=0, backoff_s=0)}
    loop = make_loop(run_config(_learner(4)).model_copy(update={"judge": judges}), tmp_path)
    loop.max_failed_steps = 0
    assert loop.run()["steps"] == 4
    assert len([x for x in capsys.readouterr().out.splitlines() if x.startswith("warning: step")]) == 4
