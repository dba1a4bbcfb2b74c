"""PPO with a critic: the loss by hand, GAE over policy tokens only, the critic warm-up, resume, learning."""

from __future__ import annotations

import json
import statistics

import pytest
import torch
from learner_helpers import make_loop, register_test_env, run_config
from pydantic import ValidationError

import lrmgym.learners.algorithms.ppo as ppo_module
from lrmgym.compose import train
from lrmgym.learners.algorithms.advantages import gae
from lrmgym.learners.algorithms.critic import value_loss
from lrmgym.learners.algorithms.losses import aggregate, policy_loss
from lrmgym.learners.algorithms.ppo import PPOConfig, explained_variance, token_rewards, whiten
from lrmgym.learners.engine.loop import Loop
from lrmgym.learners.engine.rollout import collate, rollout, tokenize_trajectory

register_test_env()
VOLATILE = ("time/", "tokens_per_s", "perf/")  # perf/*: FLOPs per second of wall time


def _learner(**kw) -> PPOConfig:
    base = dict(
        steps=3, prompts_per_step=4, group_size=2, max_new_tokens=8, eval_before_after=False, checkpoint_every=100,
        progress=False, lr=3e-3, critic_lr=1e-2, critic_epochs=1, critic_warmup_steps=0, torch_threads=1,
    )  # fmt: skip
    base.update(kw)
    return PPOConfig(**base)


def _lines(run_dir) -> list[dict]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in m.items() if not k.startswith(VOLATILE)} for m in lines]


# --------------------------------------------------------------------------------------------- the loss by hand
def test_ppo_loss_by_hand_on_two_rows():
    # Row 0: prompt target, 3 policy tokens, padding. Row 1: two policy turns around an env token (column 2).
    mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 0, 1, 1]], dtype=torch.bool)
    outcome = torch.tensor([1.0, 0.0])
    kl = torch.tensor([[0.0, 0.5, -0.2, 1.0, 7.0], [0.3, 0.0, 2.0, 0.4, -0.1]])  # 7.0 and 2.0 sit off the mask
    values = torch.tensor([[9.0, 0.5, 0.6, 0.8, 9.0], [0.2, 0.4, 9.0, 0.1, 0.3]])  # 9.0: never read
    rewards = token_rewards(outcome, mask, kl, kl_coef=0.1)
    # r = -0.1 kl on policy tokens, the outcome added on each row's last policy token, 0 elsewhere.
    expected_r = [[0.0, -0.05, 0.02, 0.9, 0.0], [-0.03, 0.0, 0.0, -0.04, 0.01]]
    torch.testing.assert_close(rewards, torch.tensor(expected_r), rtol=0, atol=1e-7)

    adv, returns = gae(rewards, values, mask, gamma=0.9, lam=0.8)  # gamma * lam = 0.72
    # Row 0: d3 = 0.9 - 0.8 = 0.1; d2 = 0.02 + 0.9*0.8 - 0.6 = 0.14, A2 = 0.14 + 0.72*0.1 = 0.212;
    #        d1 = -0.05 + 0.9*0.6 - 0.5 = -0.01, A1 = -0.01 + 0.72*0.212 = 0.14264.
    # Row 1 (column 2 skipped: its successor's values pass through it, no discount step):
    #        d4 = 0.01 - 0.3 = -0.29; d3 = -0.04 + 0.9*0.3 - 0.1 = 0.13, A3 = 0.13 - 0.72*0.29 = -0.0788;
    #        d1 = 0.9*0.1 - 0.4 = -0.31, A1 = -0.31 - 0.72*0.0788 = -0.366736;
    #        d0 = -0.03 + 0.9*0.4 - 0.2 = 0.13, A0 = 0.13 - 0.72*0.366736 = -0.13404992.
    expected_a = [[0.0, 0.14264, 0.212, 0.1, 0.0], [-0.13404992, -0.366736, 0.0, -0.0788, -0.29]]
    torch.testing.assert_close(adv, torch.tensor(expected_a), rtol=0, atol=1e-6)
    expected_ret = [[0.0, 0.64264, 0.812, 0.9, 0.0], [0.06595008, 0.033264, 0.0, 0.0212, 0.01]]  # A + V
    torch.testing.assert_close(returns, torch.tensor(expected_ret), rtol=0, atol=1e-6)

    # Whitening over the 7 policy tokens of the batch (unbiased std, as statistics.stdev).
    white = whiten(adv, mask)
    on = mask.tolist()
    flat = [expected_a[r][t] for r in range(2) for t in range(5) if on[r][t]]
    mu, sd = statistics.mean(flat), statistics.stdev(flat)
    hand_white = [[(expected_a[r][t] - mu) / sd if on[r][t] else 0.0 for t in range(5)] for r in range(2)]
    torch.testing.assert_close(white, torch.tensor(hand_white), rtol=0, atol=1e-5)

    # Policy part: -min(rho A, clip(rho, 0.8, 1.2) A), averaged per row over its tokens, then over the rows.
    rho = [[1.0, 1.5, 0.7, 1.0, 1.0], [1.3, 0.9, 1.0, 1.1, 0.6]]
    old = torch.full((2, 5), -1.0)
    logp = old + torch.tensor(rho).log()
    out = policy_loss(logp, old, white, mask, kind="ppo_clip", clip_low=0.2, clip_high=0.2)
    per_row = []
    for r in range(2):
        terms = [(rho[r][t], hand_white[r][t]) for t in range(5) if on[r][t]]
        per_row.append(sum(-min(p * a, min(max(p, 0.8), 1.2) * a) for p, a in terms) / len(terms))
    policy_part = aggregate(out.loss, mask, "seq_mean_token_mean")
    assert float(policy_part) == pytest.approx(sum(per_row) / 2, abs=1e-6)
    assert hand_white[0][1] > 0 and rho[0][1] > 1.2 and bool(out.clipped[0, 1])  # a clipped token is in the sum

    # Value part: 0.5 * max((V - R)^2, (V_old + clamp(V - V_old, +-0.2) - R)^2), token mean.
    v_old = torch.tensor([[0.0, 0.5, 0.5, 0.5, 0.0], [0.5, 0.5, 0.0, 0.5, 0.5]])
    v_new = torch.tensor([[0.0, 0.9, 0.9, 0.6, 0.0], [0.1, 0.5, 3.0, 0.45, 0.8]], requires_grad=True)
    target = torch.tensor([[0.0, 1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.2, 1.0]])
    # Tokens: (0,1) clipped branch 0.5*(0.7-1)^2 = 0.045 beats 0.5*(0.9-1)^2; (0,2) unclipped 0.5*0.81 = 0.405;
    # (0,3) inside the clip 0.5*0.16 = 0.08; (1,0) V moved down 0.4: clipped 0.5*0.3^2 = 0.045 vs 0.5*0.01;
    # (1,1) 0.5*0.25 = 0.125; (1,3) 0.5*0.0625 = 0.03125; (1,4) moved up 0.3: clipped 0.5*0.3^2 = 0.045 vs 0.5*0.2^2.
    clipped_hand = [0.045, 0.405, 0.08, 0.045, 0.125, 0.03125, 0.045]
    loss_tok, clipped = value_loss(v_new, v_old, target, mask, clip=0.2)
    assert float(loss_tok.detach().sum() / mask.sum()) == pytest.approx(sum(clipped_hand) / 7, abs=1e-6)
    assert clipped.tolist() == [[False, True, False, False, False], [True, False, False, False, True]]
    loss_tok.sum().backward()
    assert float(v_new.grad[0, 1]) == 0.0 and float(v_new.grad[1, 0]) == 0.0  # the clip stops the gradient there
    assert float(v_new.grad[0, 2]) == pytest.approx(0.9) and float(v_new.grad[1, 2]) == 0.0  # V - R; off-mask: 0
    unclipped_hand = [0.005, 0.405, 0.08, 0.005, 0.125, 0.03125, 0.02]
    plain, none_clipped = value_loss(v_new, v_old, target, mask, clip=None)
    assert float(plain.detach().sum() / mask.sum()) == pytest.approx(sum(unclipped_hand) / 7, abs=1e-6)
    assert not none_clipped.any()


def test_explained_variance():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    returns = torch.tensor([[1.0, 2.0, 50.0], [3.0, 4.0, 5.0]])
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(returns, 3.0), returns, mask) == pytest.approx(0.0)
    # residual (1, -1, 1, -1, 1): Var 1.2 against Var(returns) 2.5
    off = returns + torch.tensor([[1.0, -1.0, 0.0], [1.0, -1.0, 1.0]])
    assert explained_variance(off, returns, mask) == pytest.approx(1 - 1.2 / 2.5)


# --------------------------------------------------------------------------------------------- the update
def _seqs(algo, n_tasks=2, g=2):
    tasks = [algo.env.task_at(i, seed=0) for i in range(n_tasks)]
    ro = rollout(algo.env, algo.policy, tasks, g, algo.cfg.sampling(seed=5))
    return [tokenize_trajectory(t, algo.policy.tokenizer) for grp in ro.groups for t in grp]


def _grads(model):
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


def test_per_token_advantages_reach_their_tokens_in_the_update(tmp_path):
    kw = dict(max_grad_norm=None, track_kl=False, max_new_tokens=10)
    algo = make_loop(run_config(_learner(**kw)), tmp_path / "a", setup=True).algorithm
    seqs = _seqs(algo)
    gen = torch.Generator().manual_seed(0)
    per_token = [(torch.randn(len(s.ids), generator=gen)).tolist() for s in seqs]
    stats = algo.updater.update(seqs, per_token, False, "recompute")
    got = _grads(algo.updater.model)
    # By hand on a fresh copy: the ratio is 1 at the first pass, so the loss is -mean_rows(mean_tokens(A_t logp_t))
    # in value, with A_t the advantage of target token t + 1 (the ids layout shifted by one).
    ref = make_loop(run_config(_learner(**kw)), tmp_path / "b", setup=True).algorithm
    model = ref.updater.model
    model.zero_grad()
    rows = []
    for s, a in zip(seqs, per_token, strict=True):
        ids = torch.tensor([s.ids])
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
        m = torch.tensor(s.policy_mask[1:], dtype=torch.float32)
        adv = torch.tensor(a[1:])
        rows.append(-(adv * torch.exp(logp - logp.detach()) * m).sum() / m.sum())
    hand = torch.stack(rows).mean()
    hand.backward()
    assert stats["loss"] == pytest.approx(float(hand.detach()), abs=1e-5)
    for a, b in zip(got, _grads(model), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    # One advantage per trajectory, given per token, is the scalar path exactly.
    scalar = make_loop(run_config(_learner(**kw)), tmp_path / "c", setup=True).algorithm
    token = make_loop(run_config(_learner(**kw)), tmp_path / "d", setup=True).algorithm
    values = [0.7, -1.2, 0.3, 1.1]
    scalar.updater.update(seqs, values, False, "recompute")
    token.updater.update(seqs, [[v] * len(s.ids) for v, s in zip(values, seqs, strict=True)], False, "recompute")
    for a, b in zip(_grads(scalar.updater.model), _grads(token.updater.model), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# --------------------------------------------------------------------------------------------- the step
def test_gae_runs_over_the_policy_tokens_of_multi_turn_trajectories(tmp_path, monkeypatch):
    cfg = run_config(
        _learner(whiten_advantages=False, gamma=0.9, lam=0.8, prompts_per_step=3, group_size=3), max_turns=2
    )
    algo = make_loop(cfg, tmp_path, setup=True).algorithm
    torch.nn.init.normal_(algo.critic.module.head.weight, std=0.3)  # values that differ from token to token
    torch.nn.init.constant_(algo.critic.module.head.bias, 0.2)
    seen: dict = {}

    def record(name, fn):
        def wrapped(*args, **kwargs):
            out = fn(*args, **kwargs)
            seen[name] = (args, out)
            return out

        return wrapped

    monkeypatch.setattr(algo.critic, "values", record("values", algo.critic.values))
    monkeypatch.setattr(algo.updater, "update", record("update", algo.updater.update))
    monkeypatch.setattr(ppo_module, "token_rewards", record("rewards", ppo_module.token_rewards))
    metrics = algo.loop.train_step()
    seqs, per_token = seen["update"][0][:2]
    values = seen["values"][1]
    outcome = seen["rewards"][0][0]
    gaps = 0
    squared = []
    for k, (s, a) in enumerate(zip(seqs, per_token, strict=True)):
        on = [j for j, m in enumerate(s.policy_mask) if m]  # ids positions the policy wrote
        gaps += on[-1] - on[0] + 1 > len(on)  # env tokens between two policy turns
        assert all(a[j] == 0.0 for j in range(len(s.ids)) if not s.policy_mask[j])
        # GAE by hand over the policy's tokens only: token j is target j - 1, its value V[j - 1].
        v = [float(values[k, j - 1]) for j in on]
        expected, nxt_v, nxt_a = [], 0.0, 0.0
        for i in reversed(range(len(on))):
            r = float(outcome[k]) if i == len(on) - 1 else 0.0
            nxt_a = r + 0.9 * nxt_v - v[i] + 0.72 * nxt_a
            nxt_v = v[i]
            expected.append(nxt_a)
        assert [a[j] for j in on] == pytest.approx(expected[::-1], abs=1e-5)
        squared += [(e - 0.0) ** 2 for e in expected]  # returns - V_old = A, and V = V_old on the first pass
    assert gaps > 0, "the test needs trajectories with env feedback between two policy turns"
    assert metrics["turns/mean"] > 1
    assert metrics["value/loss"] == pytest.approx(0.5 * sum(squared) / len(squared), rel=1e-4)


@pytest.mark.parametrize("critic", ["head", "model"])
def test_critic_warmup_moves_only_the_critic(tmp_path, critic):
    algo = make_loop(run_config(_learner(critic=critic, critic_warmup_steps=2)), tmp_path, setup=True).algorithm
    policy0 = [p.detach().clone() for p in algo.updater.model.parameters()]
    critic0 = [p.detach().clone() for p in algo.critic.module.parameters()]

    def same(now, then):
        return all(torch.equal(a, b) for a, b in zip(now, then, strict=True))

    for step in (1, 2):
        metrics = algo.loop.train_step()
        assert metrics["critic_warmup"] and metrics["trained_frac"] == 0.0 and metrics["loss"] is None
        assert same(algo.updater.model.parameters(), policy0), f"the policy moved in warm-up step {step}"
    assert not same(algo.critic.module.parameters(), critic0)
    metrics = algo.loop.train_step()
    assert not metrics["critic_warmup"] and metrics["trained_frac"] > 0 and metrics["loss"] is not None
    assert not same(algo.updater.model.parameters(), policy0)


@pytest.mark.parametrize(
    ("critic", "async_rollouts"),
    [("head", False), ("model", False), pytest.param("head", True, marks=pytest.mark.slow)],  # async: ~35 s
)
def test_resume_after_crash_matches_uninterrupted(tmp_path, monkeypatch, critic, async_rollouts):
    learner = _learner(
        steps=5, checkpoint_every=2, critic=critic, critic_warmup_steps=1, async_rollouts=async_rollouts,
        kl_reward_coef=0.05,
    )  # fmt: skip
    cfg = run_config(learner)
    train(cfg, tmp_path / "a")
    original = Loop.train_step

    def crash_after_step_3(self):
        out = original(self)
        if self.step == 3:  # metrics line 3 is written, the last checkpoint is step 2
            raise RuntimeError("simulated crash")
        return out

    monkeypatch.setattr(Loop, "train_step", crash_after_step_3)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(cfg, tmp_path / "b")
    monkeypatch.setattr(Loop, "train_step", original)
    train(cfg, tmp_path / "b", resume=True)
    a, b = _lines(tmp_path / "a"), _lines(tmp_path / "b")
    assert [m["step"] for m in b] == [1, 2, 3, 4, 5]
    for key in ("value/loss", "value/explained_variance", "value/clip_frac", "value/mean", "returns/mean"):
        assert key in a[0], key
    assert a[-1]["value/mean"] != a[0]["value/mean"] and a[-1]["kl_reward/mean"] != 0.0  # critic and policy moved
    assert b == a


def test_short_run_raises_the_reward(tmp_path):
    cfg = run_config(_learner(steps=15, prompts_per_step=8, group_size=4, lr=1e-2, critic_warmup_steps=1))
    train(cfg, tmp_path)
    rewards = [m["reward/mean"] for m in _lines(tmp_path)]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.1, rewards


# --------------------------------------------------------------------------------------------- config
def test_preset_resolves_to_ppo_config():
    from lrmgym.configs.resolve import resolve

    cfg = resolve(["env=echo", "policy=mock", "learner=ppo", "learner.critic=model"])
    assert isinstance(cfg.learner, PPOConfig)
    assert cfg.learner.critic == "model" and cfg.learner.time_budget_s is not None
    for name, field in PPOConfig.model_fields.items():
        assert field.description, name


def test_config_checks():
    assert PPOConfig(group_size=1).group_size == 1  # no groups needed
    with pytest.raises(ValidationError, match=r"minibatches=9 exceeds the trajectories per step"):
        PPOConfig(prompts_per_step=4, group_size=2, minibatches=9)
    with pytest.raises(ValidationError, match=r"needs temperature=1 and top_p=1"):
        PPOConfig(async_rollouts=True, temperature=0.7)
    with pytest.raises(ValidationError, match="critic"):
        PPOConfig(critic="shared")


# --------------------------------------------------------------------------------------------- mutants
def _ppo(tmp_path, **kw):
    return make_loop(run_config(_learner(**kw)), tmp_path, setup=True).algorithm


def _ppo_seqs(algo, tasks=4, group=2):
    ro = rollout(algo.env, algo.policy, [algo.env.task_at(i, seed=0) for i in range(tasks)], group,
                 algo.cfg.sampling(seed=3))  # fmt: skip
    return [tokenize_trajectory(t, algo.policy.tokenizer) for g in ro.groups for t in g]


def _drift(model, scale=0.05):
    torch.manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)


def test_the_kl_reward_is_minus_its_coefficient_times_log_old_over_ref():
    # Kills: the KL shaping's sign flipped (+kl_coef * kl rewards drifting away from the reference).
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 0, 0]])
    kl = torch.tensor([[9.0, 0.5, -0.25, 1.0], [2.0, 0.1, 9.0, 9.0]])
    rewards = token_rewards(torch.tensor([1.0, 0.0]), mask, kl, kl_coef=0.2)
    expected = torch.tensor([[0.0, -0.1, 0.05, 1.0 - 0.2], [-0.4, -0.02, 0.0, 0.0]])
    torch.testing.assert_close(rewards, expected)


def test_the_kl_rewards_sample_is_log_pi_old_minus_log_pi_ref(tmp_path):
    # Kills: the KL reward's per-token sample taken as log pi_ref - log pi_old (or against the policy itself).
    algo = _ppo(tmp_path, kl_reward_coef=0.1)
    seqs = _ppo_seqs(algo)
    ref = algo._own_ref if algo.updater.ref_model is None else algo.updater.ref_model
    before = algo.updater.no_grad_logprobs(ref, collate(seqs, [0.0] * len(seqs), algo.updater.pad_id))
    _drift(algo.updater.model)
    batch = collate(seqs, [0.0] * len(seqs), algo.updater.pad_id)
    mask = batch.loss_mask.bool()
    now = algo.updater.no_grad_logprobs(algo.updater.model, batch)
    got = algo._kl(batch, "recompute")
    assert float((now - before)[mask].abs().max()) > 1e-2, "the test needs a policy that has drifted"
    torch.testing.assert_close(got[mask], (now - before)[mask], rtol=1e-4, atol=1e-5)


def test_the_ppo_ratio_is_against_pi_old_not_the_reference(tmp_path, monkeypatch):
    # Kills: the ratio's denominator taken from the reference's log-probs instead of pi_old's.
    import lrmgym.learners.engine.update as update_mod

    ratios, real = [], update_mod.policy_loss

    def spy(logp, old, adv, mask, **kw):
        out = real(logp, old, adv, mask, **kw)
        ratios.append(out.ratio[mask.bool()].detach().clone())
        return out

    algo = _ppo(tmp_path, epochs=2, track_kl=True)
    assert algo.updater.ref_model is not None
    seqs = _ppo_seqs(algo)
    _drift(algo.updater.model)  # the policy (pi_old of this step) is no longer the reference
    monkeypatch.setattr(update_mod, "policy_loss", spy)
    adv = [[0.5] * len(s.ids) for s in seqs]
    stats = algo.updater.update(seqs, adv, True, "recompute")
    assert stats["kl_ref"] > 1e-3
    assert float((ratios[0] - 1.0).abs().max()) < 1e-4  # the first pass: pi_theta is pi_old


def test_the_lr_schedule_starts_after_the_critic_warmup(tmp_path):
    # Kills: the schedule stepped during the warm-up (`>=` for `>`, or no condition): the policy's first update
    # would then not run at the first warm-up factor.
    lr = 3e-3
    algo = _ppo(tmp_path, critic_warmup_steps=2, warmup_steps=3, lr=lr, lr_decay="constant", steps=4)
    seen = [algo.loop.train_step()["lr"] for _ in range(4)]
    assert seen == pytest.approx([lr / 3, lr / 3, lr / 3, 2 * lr / 3])


def test_the_value_fit_is_the_same_with_and_without_micro_batches(tmp_path):
    # Kills: each micro-batch's value loss averaged over its own tokens instead of the minibatch's.
    fits = {}
    for micro in (None, 1):
        algo = _ppo(tmp_path / str(micro), micro_batch_size=micro, critic="head", value_clip=None, max_new_tokens=24)
        seqs = _ppo_seqs(algo)
        batch = collate(seqs, [0.0] * len(seqs), algo.updater.pad_id)
        values = algo.critic.values(batch)
        torch.manual_seed(0)
        returns = torch.randn(values.shape) * batch.loss_mask.to(values)
        stats = algo.critic.fit(batch, values, returns, epochs=1, minibatches=1, clip=None)
        fits[micro] = (stats["value/loss"], [p.detach().clone() for p in algo.critic.module.parameters()])
    lengths = {sum(s.policy_mask) for s in seqs}
    assert len(lengths) > 1, "the test needs rows of different lengths"
    assert fits[1][0] == pytest.approx(fits[None][0], rel=1e-5)
    for a, b in zip(fits[1][1], fits[None][1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
