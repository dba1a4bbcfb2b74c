"""Options the Ring-Zero stages brought to every learner: the absolute IS cap, the response window, the all-failed and
format-pass metrics, format B's EOS rule, evaluation of rewritten tasks, stage keys a resume may change."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from lrmgym.core import Completion, Task, Trajectory, Turn, Verdict
from lrmgym.episodes import Rollout
from lrmgym.judges.rule import FormatJudge
from lrmgym.learners.algorithms.grpo import GRPOConfig
from lrmgym.learners.algorithms.losses import policy_loss
from lrmgym.learners.engine.metrics import rollout_metrics
from lrmgym.learners.engine.resume import may_change


def test_an_absolute_is_cap_reaches_cispo_through_policy_loss():
    # rho = e^2 = 7.39 on token 0 (capped at 5.0 absolute: weight 5; relative 1 + 5.0 would be 6), 1.0 on token 1.
    logp = torch.tensor([[0.0, -1.0]], requires_grad=True)
    old = torch.tensor([[-2.0, -1.0]])
    out = policy_loss(logp, old, torch.tensor([1.0]), kind="cispo", is_cap=5.0, is_cap_mode="absolute")
    out.loss.sum().backward()
    assert logp.grad.tolist() == [[-5.0, -1.0]]  # -sg(w) * A, every token keeps its gradient
    assert out.clipped.tolist() == [[True, False]]
    rel = policy_loss(logp.detach(), old, torch.tensor([1.0]), kind="cispo", is_cap=5.0, is_cap_mode="relative")
    assert math.isclose(float(rel.loss[0, 0]), -6.0 * 0.0) and bool(rel.clipped[0, 0])
    with pytest.raises(ValueError, match="no importance-weight cap"):
        policy_loss(logp, old, torch.tensor([1.0]), kind="ppo_clip", is_cap=5.0)


def test_the_cap_options_are_checked_in_the_config():
    assert GRPOConfig(pg_loss="cispo", is_cap=5.0, is_cap_mode="absolute").is_cap == 5.0
    with pytest.raises(ValueError, match="pg_loss='ppo_clip' has none"):
        GRPOConfig(is_cap=5.0)
    with pytest.raises(ValueError, match="needs is_cap"):
        GRPOConfig(pg_loss="cispo", is_cap_mode="absolute")


def test_the_response_window_is_an_option_of_every_on_policy_learner():
    cfg = GRPOConfig(window_start=8, window_every_steps=5, max_new_tokens=20)
    assert [cfg.sampling(None, s).max_new_tokens for s in (0, 4, 5, 10, 15)] == [8, 8, 16, 20, 20]
    assert GRPOConfig(max_new_tokens=20).sampling(None, 99).max_new_tokens == 20
    with pytest.raises(ValueError, match="window_start=30 exceeds max_new_tokens=20"):
        GRPOConfig(window_start=30, max_new_tokens=20)


def _traj(correct: bool | None, fmt: bool | None) -> Trajectory:
    c = Completion(text="x", token_ids=[1], finish_reason="stop")
    return Trajectory(Task("t", "p"), [Turn("policy", "x", c)], Verdict(score=1.0, correct=correct, format_ok=fmt))


def test_all_failed_groups_and_format_pass_rate_are_logged():
    groups = [[_traj(False, True), _traj(False, False)], [_traj(True, True), _traj(False, True)],
              [_traj(False, None), _traj(False, None)]]  # fmt: skip
    ro = Rollout(groups=groups, turn_verdicts=[[[t.verdict] for t in g] for g in groups])
    trajs = [t for g in groups for t in g]
    tokenized = [type("T", (), {"policy_mask": [1]})() for _ in trajs]
    m = rollout_metrics(ro, trajs, tokenized, torch.zeros(3, dtype=torch.bool), 6, 1, env=object())
    assert m["all_failed_frac"] == pytest.approx(2 / 3)  # groups 0 and 2 have no correct trajectory
    assert m["format_ok_frac"] == pytest.approx(3 / 4)  # of the 4 whose format was checked
    unknown = [[_traj(None, None)]]
    ro = Rollout(groups=unknown, turn_verdicts=[[[unknown[0][0].verdict]]])
    m = rollout_metrics(ro, unknown[0], tokenized[:1], torch.zeros(1, dtype=torch.bool), 1, 1, env=object())
    assert m["all_failed_frac"] is None and m["format_ok_frac"] is None


def test_format_b_needs_a_response_that_ended_at_eos():
    text = "<think>1+1=2</think><answer>2</answer>"
    strict, loose = FormatJudge("strict"), FormatJudge("loose")
    assert strict.format_ok(Completion(text=text, finish_reason="stop"))
    assert strict.format_ok(Completion(text=text))  # finish reason unknown: the text decides
    cut = Completion(text=text, finish_reason="length")
    assert not strict.format_ok(cut) and "EOS" in strict.check_completion(cut)[1]
    assert loose.format_ok(cut)  # format A does not ask for it


def test_evaluate_grades_the_rewritten_tasks():
    from lrmgym.envs.echo import EchoEnv
    from lrmgym.eval import evaluate
    from lrmgym.eval.config import EvalConfig
    from lrmgym.testing.mock import ScriptedPolicy

    policy = ScriptedPolicy({}, default="x")
    report = evaluate(
        EchoEnv(words=1), policy, EvalConfig(tasks=3, n=1, split=None), progress=False,
        transform=lambda t: dataclasses.replace(t, prompt="[tier]" + t.prompt),
    )  # fmt: skip
    seen = [p for prompts, _ in policy.calls for p in prompts]
    assert report["tasks"] == 3 and len(seen) == 3 and all(p.startswith("[tier]") for p in seen)


@pytest.mark.parametrize(
    ("key", "ok"),
    [
        ("learner.steps", True), ("learner.rl1.steps", True), ("learner.rl2.time_budget_s", True),
        ("learner.stages", True), ("learner.rl1.lr", False), ("learner.rl1.sub.steps", False),
        ("env.steps", False), ("learner.lr", False),
    ],
)  # fmt: skip
def test_a_resume_may_change_a_stages_budget_but_not_what_it_trains(key, ok):
    assert may_change(key) is ok
