"""Tests that kill the learner mutants the rest of the suite let live (issue 16, item 8).

Each test names the single-point mutation it was shown to fail on:

- gradient clipping switched off (the ``clip_grad_norm_`` call removed, or ``max_grad_norm`` ignored);
- the KL term subtracted instead of added (``loss - kl_coef * kl``);
- pi_old reused across the minibatches of one epoch (``reuse_old`` without ``cfg.minibatches == 1``);
- ungradeable rows trained (no ``flat_valid[i]`` in GRPO's row selection, or ``None`` rewards scored 0).
"""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch
from learner_helpers import make_loop, register_test_env, run_config, small_grpo

import lrmgym.learners.engine.update as update_mod
from lrmgym.learners.algorithms.advantages import group_advantages, scores_to_tensors
from lrmgym.learners.algorithms.losses import kl_penalty
from lrmgym.learners.engine.rollout import rollout, tokenize_trajectory

register_test_env()


def _learner(**kw):
    return small_grpo(**{"max_new_tokens": 12, **kw})  # longer completions than the shared default


def _algo(tmp_path, env_options=None, **kw):
    return make_loop(run_config(_learner(**kw), **(env_options or {})), tmp_path, setup=True).algorithm


def _step_tokens(algo, tasks=4, group=4, seed=3):
    """Tokenized rollouts of ``tasks`` x ``group`` samples and their GRPO advantages (flat, task-major)."""
    ro = rollout(algo.env, algo.policy, [algo.env.task_at(i, seed=0) for i in range(tasks)], group,
                 algo.cfg.sampling(seed=seed))  # fmt: skip
    adv = group_advantages(*scores_to_tensors([[t.reward for t in g] for g in ro.groups])).advantages
    seqs = [tokenize_trajectory(t, algo.policy.tokenizer) for g in ro.groups for t in g]
    return seqs, adv.reshape(-1).tolist()


def _grads(model):
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def _global_norm(tensors):
    return math.sqrt(sum(float(t.double().square().sum()) for t in tensors))


# ------------------------------------------------------------------------------------------------ clipping
def test_gradient_is_clipped_to_max_grad_norm_and_the_pre_clip_norm_is_logged(tmp_path):
    # Kills: clipping switched off (clip_grad_norm_ call removed, or called with max_norm=inf).
    max_norm = 1e-2
    clipped = _algo(tmp_path / "clip", max_grad_norm=max_norm)
    free = _algo(tmp_path / "free", max_grad_norm=None)  # the same initial weights, no clipping
    seqs, adv = _step_tokens(clipped)
    assert any(a != 0 for a in adv)
    stats = clipped.updater.update(seqs, adv, False, "recompute")
    free.updater.update(seqs, adv, False, "recompute")
    raw = _grads(free.updater.model)
    raw_norm = _global_norm(raw)
    assert raw_norm > 10 * max_norm, "the test needs a gradient well above the clip"
    # The gradient the optimizer applied (left in .grad after the step) has the clip's norm ...
    after = _grads(clipped.updater.model)
    assert _global_norm(after) == pytest.approx(max_norm, abs=1e-5, rel=1e-4)
    # ... and the raw gradient's direction; the logged grad_norm is the norm before clipping.
    for a, r in zip(after, raw, strict=True):
        torch.testing.assert_close(a, r * (max_norm / raw_norm), rtol=1e-3, atol=1e-9)
    assert stats["grad_norm"] == pytest.approx(raw_norm, rel=1e-4)


# ------------------------------------------------------------------------------------------------ KL penalty
def _seq_logprobs(model, seqs):
    """Per trajectory, ``(log-probs of its policy tokens, 1-D)`` by a plain forward pass of that row alone."""
    out = []
    for s in seqs:
        ids = torch.tensor([s.ids])
        logits = model(input_ids=ids).logits[0, :-1].float()  # [L-1, V]
        logp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        out.append(logp[torch.tensor(s.policy_mask[1:], dtype=torch.bool)])
    return out


def _mean_kl(model, ref, seqs):
    """GRPO's aggregate (mean over trajectories of the mean over their tokens) of k3 KL(model || ref)."""
    with torch.no_grad():
        ref_lp = _seq_logprobs(ref, seqs)
    per_seq = [kl_penalty(lp, r, "k3").mean() for lp, r in zip(_seq_logprobs(model, seqs), ref_lp, strict=True)]
    return torch.stack(per_seq).mean()


def test_the_kl_penalty_pulls_the_policy_back_to_the_reference(tmp_path):
    # Kills: the KL term subtracted instead of added (loss - kl_coef * kl).
    kl_coef = 0.5
    algo = _algo(tmp_path, kl_coef=kl_coef, lr=1e-3, shared_prefix=False)
    seqs, _ = _step_tokens(algo)
    model = algo.updater.model
    ref = copy.deepcopy(model).eval()  # the reference is the initial policy
    torch.manual_seed(5)
    with torch.no_grad():  # the policy drifts away from its reference
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.eval()
    with torch.no_grad():
        before = _mean_kl(model, ref, seqs)
    assert float(before) > 1e-3, "the test needs a policy that has drifted"
    # The gradient the update must take: kl_coef x the gradient of the aggregated KL, by autograd here.
    probe = copy.deepcopy(model)
    (kl_coef * _mean_kl(probe, ref, seqs)).backward()
    expected = _grads(probe)
    stats = algo.updater.update(seqs, [0.0] * len(seqs), True, "recompute")  # advantages 0: only the KL acts
    assert stats["kl_ref"] > 0
    for got, want in zip(_grads(model), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-8)
    with torch.no_grad():
        after = _mean_kl(model, ref, seqs)
    assert float(after) < 0.98 * float(before), (float(before), float(after))


# ------------------------------------------------------------------------------------------------ pi_old
def test_pi_old_is_the_pre_update_policy_in_every_minibatch_of_the_epoch(tmp_path, monkeypatch):
    # Kills: pi_old reused across the minibatches of one epoch (reuse_old = recompute and epochs == 1).
    ratios = []
    real = update_mod.policy_loss

    def spy(logp, old, adv, mask, **kw):
        out = real(logp, old, adv, mask, **kw)
        ratios.append(out.ratio[mask.bool()].detach().clone())
        return out

    algo = _algo(tmp_path, epochs=1, minibatches=2, lr=3e-2)
    seqs, adv = _step_tokens(algo)
    assert sum(a != 0 for a in adv) >= 4
    monkeypatch.setattr(update_mod, "policy_loss", spy)
    algo.updater.update(seqs, adv, False, "recompute")
    assert len(ratios) == 2  # one forward per minibatch
    first, second = (float((r - 1.0).abs().max()) for r in ratios)
    assert first < 1e-4  # the weights have not moved yet: pi_theta == pi_old
    # after the first minibatch's step, pi_theta is not the pi_old that sampled the second minibatch
    assert second > 0.1, second


# ------------------------------------------------------------------------------------------------ ungradeable
@pytest.mark.parametrize("drop_zero", [True, False])
def test_ungradeable_samples_are_never_trained_nor_counted(tmp_path, monkeypatch, drop_zero):
    # Kills: the flat_valid[i] check dropped from GRPO's row selection (with drop_zero_advantage=False, where
    # the zero advantage of an ungradeable sample does not hide it), and None rewards scored 0 (both).
    algo = _algo(
        tmp_path, env_options={"ungradeable_marker": "<"}, steps=1, prompts_per_step=6, max_new_tokens=16,
        drop_zero_advantage=drop_zero,
    )  # fmt: skip
    seen = {}
    learn, update = algo.learn, algo.updater.update

    def learn_spy(trajs, tokenized, *rest):
        seen.update(trajs=trajs, tokenized=tokenized)
        return learn(trajs, tokenized, *rest)

    def update_spy(seqs, advantages, *args, **kw):
        seen.update(seqs=list(seqs), advantages=list(advantages), **kw)
        return update(seqs, advantages, *args, **kw)

    monkeypatch.setattr(algo, "learn", learn_spy)
    monkeypatch.setattr(algo.updater, "update", update_spy)
    algo.loop.train_step()
    trajs, tokenized, g = seen["trajs"], seen["tokenized"], algo.cfg.group_size
    rewards = [t.reward for t in trajs]
    gradeable = [i for i, r in enumerate(rewards) if r is not None]
    assert 0 < len(gradeable) < len(trajs) - 2, "the test needs some ungradeable samples"
    # The rows with signal, from the gradeable rewards alone: those off their group's gradeable mean.
    signal = []
    for b in range(len(trajs) // g):
        group = [i for i in range(b * g, (b + 1) * g) if rewards[i] is not None]
        mean = sum(rewards[i] for i in group) / max(len(group), 1)
        signal += [i for i in group if len(group) >= 2 and abs(rewards[i] - mean) > 1e-9]
    assert signal, "the test needs a group with signal among the gradeable samples"
    expected = signal if drop_zero else gradeable
    index = {id(s): i for i, s in enumerate(tokenized)}
    trained = [index[id(s)] for s in seen["seqs"]]
    ungradeable_trained = [i for i in trained if rewards[i] is None]
    assert not ungradeable_trained, f"ungradeable samples trained: {ungradeable_trained}"
    assert trained == expected
    assert seen["norm_seqs"] == sum(1 for i in gradeable if any(tokenized[i].policy_mask))
    assert seen["norm_tokens"] == sum(sum(tokenized[i].policy_mask) for i in gradeable)


# ------------------------------------------------------------------------------------------------ zero advantage
@pytest.mark.parametrize(("kl_coef", "kept"), [(0.1, 16), (0.0, 8)])
def test_zero_advantage_rows_are_kept_while_a_kl_term_acts_on_them(tmp_path, monkeypatch, kl_coef, kept):
    # Kills: zero-advantage rows dropped although kl_coef > 0 (their KL gradient would be lost).
    algo = _algo(tmp_path, kl_coef=kl_coef, drop_zero_advantage=True)
    seqs, _ = _step_tokens(algo)  # 4 tasks x 4 samples
    rewards = torch.tensor([[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0], [0.0] * 4])
    seen = []
    monkeypatch.setattr(algo.updater, "update", lambda rows, adv, *a, **k: seen.append((rows, adv)) or {})
    trajs = [SimpleNamespace(policy_turns=[]) for _ in range(16)]
    fit = algo.learn(trajs, seqs, rewards, torch.ones(4, 4, dtype=torch.bool))
    rows, adv = seen[0]
    assert fit.trained == len(rows) == kept
    assert sum(a == 0 for a in adv) == kept - 8  # groups 2 and 4 have no signal: kept only for the KL term


# ------------------------------------------------------------------------------------------------ periodic eval
def test_the_final_step_is_evaluated_once_as_after_not_also_as_a_periodic_eval(tmp_path, monkeypatch):
    # Kills: the periodic evaluation run at the final step too (`<=` for `<`, or the bound dropped): the same
    # held-out tasks evaluated twice on the same weights.
    from lrmgym.learners.engine.loop import Loop

    tags, real = [], Loop.evaluate

    def spy(self, tag, *args, **kw):
        tags.append(tag)
        return real(self, tag, *args, **kw)

    monkeypatch.setattr(Loop, "evaluate", spy)
    loop = make_loop(run_config(_learner(steps=2, eval_every=1, eval_before_after=True, eval_greedy=False),
                                eval_tasks=2), tmp_path)  # fmt: skip
    summary = loop.run()
    assert tags == ["step_0", "step_1", "step_2"]
    assert summary["evals"]["after"]["step"] == 2
