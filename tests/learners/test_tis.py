"""Truncated importance sampling (learner.tis_cap) and the update's calls to a separate rollout engine.

vLLM is absent here, so the engine the updater talks to is :class:`RecordingEngine`, a stand-in that only
records the calls (the real engine is exercised in tests/policies/test_vllm_engine.py, where vLLM installs).
"""

from __future__ import annotations

import math

import pytest
import torch
from learner_helpers import make_loop, register_test_env, run_config, small_grpo

from lrmgym.learners.algorithms.tis import tis_weights
from lrmgym.learners.engine.rollout import collate, rollout, tokenize_trajectory

register_test_env()


def test_tis_weights_by_hand():
    old = torch.tensor([[-1.0, -0.5, -2.0, -0.3]])
    engine = torch.tensor([[-1.5, -0.5, -0.2, -3.0]])
    # exp(0.5) = 1.6487 -> capped at 1.5; exp(0) = 1; exp(-1.8) = 0.1653; exp(2.7) = 14.88 -> capped.
    expected = torch.tensor([[1.5, 1.0, math.exp(-1.8), 1.5]])
    torch.testing.assert_close(tis_weights(old, engine, cap=1.5), expected)
    # The weight is pi_old / pi_engine: the other way round, the first token would get exp(-0.5) = 0.61.
    assert tis_weights(old, engine, cap=1.5)[0, 0] > 1.0
    with pytest.raises(ValueError, match=r"^The TIS cap must be > 0, got 0\.0\.$"):
        tis_weights(old, engine, cap=0.0)


def test_tis_weights_carry_no_gradient():
    old = torch.tensor([-1.0, -2.0], requires_grad=True)
    engine = torch.tensor([-1.2, -1.0], requires_grad=True)
    assert not tis_weights(old, engine, cap=2.0).requires_grad


class RecordingEngine:
    """Stand-in for :class:`~lrmgym.policies.vllm_engine.VLLMRolloutEngine` (vLLM is not installed here): it only
    records what the updater tells it."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def begin_update(self) -> None:
        self.calls.append("begin_update")

    def mark_stale(self) -> None:
        self.calls.append("mark_stale")


def _algo(tmp_path, engine, **kw):
    algo = make_loop(run_config(small_grpo(**kw)), tmp_path, setup=False).algorithm
    algo.loop.ctx.policy.rollout_engine = engine  # as HFPolicyConfig(engine="vllm").build() attaches it
    algo.setup()
    return algo


def _seqs_with_engine_logprobs(algo, log_ratio: float):
    """A step's trajectories whose 'engine' log-probs are the trainer's minus ``log_ratio`` on every policy token."""
    tasks = [algo.env.task_at(i, seed=0) for i in range(4)]
    ro = rollout(algo.env, algo.policy, tasks, 4, algo.cfg.sampling(seed=3))
    seqs = [tokenize_trajectory(t, algo.policy.tokenizer) for g in ro.groups for t in g]
    adv = torch.linspace(-1.0, 1.0, len(seqs)).tolist()
    trainer = algo.updater.no_grad_logprobs(algo.updater.model, collate(seqs, adv, algo.updater.pad_id))
    for i, s in enumerate(seqs):
        s.sampler_logprobs = [
            float(trainer[i, k - 1]) - log_ratio if s.policy_mask[k] else 0.0 for k in range(len(s.ids))
        ]
    return seqs, adv


def _grads(algo, seqs, adv):
    stats = algo.updater.update(seqs, adv, False, "recompute", sampler_known=True)
    return [p.grad.clone() for p in algo.updater.model.parameters()], stats


@pytest.mark.parametrize(("cap", "weight"), [(2.0, 1.5), (1.2, 1.2)])
def test_the_update_weights_the_policy_loss_by_the_capped_ratio(tmp_path, cap, weight):
    # pi_old / pi_engine = 1.5 on every token: the gradient is the plain one times 1.5, or times the cap below it.
    plain = _algo(tmp_path / "plain", None, tis_cap=cap)
    seqs, adv = _seqs_with_engine_logprobs(plain, math.log(1.5))
    base, base_stats = _grads(plain, seqs, adv)
    assert "train_infer/tis_capped_frac" not in base_stats  # no separate engine: no weight
    engine = RecordingEngine()
    tis = _algo(tmp_path / "tis", engine, tis_cap=cap)
    got, stats = _grads(tis, seqs, adv)
    for g, b in zip(got, base, strict=True):
        torch.testing.assert_close(g, b * weight, rtol=1e-4, atol=1e-7)
    assert stats["train_infer/tis_capped_frac"] == pytest.approx(1.0 if weight == cap else 0.0)
    assert stats["train_infer/logp_abs_diff"] == pytest.approx(math.log(1.5), abs=1e-4)
    assert engine.calls == ["begin_update"]


def test_tis_cap_none_turns_the_weight_off(tmp_path):
    plain = _algo(tmp_path / "plain", None)
    seqs, adv = _seqs_with_engine_logprobs(plain, math.log(1.5))
    base, _ = _grads(plain, seqs, adv)
    off = _algo(tmp_path / "off", RecordingEngine(), tis_cap=None)
    got, stats = _grads(off, seqs, adv)
    for g, b in zip(got, base, strict=True):
        torch.testing.assert_close(g, b, rtol=1e-4, atol=1e-7)
    assert "train_infer/tis_capped_frac" not in stats


def test_a_loaded_checkpoint_is_pushed_to_the_engine(tmp_path):
    engine = RecordingEngine()
    algo = _algo(tmp_path, engine)
    algo.updater.load_state_dict(algo.updater.state_dict())
    assert engine.calls == ["mark_stale"]


def test_async_rollouts_are_refused_with_a_rollout_engine(tmp_path):
    with pytest.raises(ValueError, match=r"^learner\.async_rollouts=true samples in a worker process .*=false\.$"):
        _algo(tmp_path, RecordingEngine(), async_rollouts=True)
