"""The shared policy-gradient update: normaliser, sampling temperature, the train/infer gap."""

from __future__ import annotations

import json

import pytest
import torch
from learner_helpers import make_loop, register_test_env, run_config, small_grpo

from lrmgym.compose import train
from lrmgym.learners.algorithms.advantages import group_advantages, scores_to_tensors
from lrmgym.learners.engine.rollout import collate, collate_advantages, rollout, tokenize_trajectory
from lrmgym.learners.engine.shared_prefix import prompt_groups

register_test_env()


def _learner(**kw):
    return small_grpo(**kw)


def _algo(tmp_path, **kw):
    return make_loop(run_config(_learner(**kw)), tmp_path, setup=True).algorithm


def _step_tokens(algo, temperature=1.0):
    tasks = [algo.env.task_at(i, seed=0) for i in range(4)]
    sampling = algo.cfg.sampling(seed=3).model_copy(update={"temperature": temperature})
    ro = rollout(algo.env, algo.policy, tasks, 4, sampling)
    adv = group_advantages(*scores_to_tensors([[t.reward for t in g] for g in ro.groups])).advantages
    seqs = [tokenize_trajectory(t, algo.policy.tokenizer) for g in ro.groups for t in g]
    return seqs, adv


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("agg", ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"])
def test_leaving_out_zero_advantage_rows_changes_no_gradient(tmp_path, agg):
    # GRPO's normaliser is 1/G over every gradeable sample: rows with advantage 0 add nothing to the policy
    # gradient, so dropping them must leave the gradient as it was (it used to scale it by all/kept).
    keep = _algo(tmp_path / "keep", loss_agg=agg)
    drop = _algo(tmp_path / "drop", loss_agg=agg)
    seqs, _ = _step_tokens(keep)
    adv = torch.linspace(-1.5, 1.5, 16).reshape(4, 4)
    adv[0] = 0.0  # two groups without signal, as a zero-variance group has
    adv[2] = 0.0
    flat = adv.reshape(-1).tolist()
    assert sum(a != 0 for a in flat) not in (0, len(flat))
    keep.updater.update(seqs, flat, False, "recompute")
    rows = [i for i, a in enumerate(flat) if a != 0]
    drop.updater.update(
        [seqs[i] for i in rows], [flat[i] for i in rows], False, "recompute",
        norm_seqs=len(seqs), norm_tokens=sum(sum(s.policy_mask) for s in seqs),
    )  # fmt: skip
    for a, b in zip(_grads(keep.updater.model), _grads(drop.updater.model), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    # Without the normaliser's count the dropped run's gradient is the kept share larger: the old bug.
    wrong = _algo(tmp_path / "wrong", loss_agg=agg)
    wrong.updater.update([seqs[i] for i in rows], [flat[i] for i in rows], False, "recompute")
    pairs = zip(_grads(wrong.updater.model), _grads(keep.updater.model), strict=True)
    ratio = [float(w.norm() / k.norm()) for w, k in pairs]
    assert max(ratio) > 1.2


def test_grpo_step_passes_the_gradeable_count(tmp_path):
    # End to end: one step with drop_zero_advantage on and off leaves the same gradient.
    grads = {}
    for drop in (True, False):
        algo = _algo(tmp_path / str(drop), drop_zero_advantage=drop, steps=1, prompts_per_step=6, max_new_tokens=20)
        out = algo.loop.train_step()
        assert 0 < out["zero_variance_groups"] < 6, "the test needs some groups with and some without signal"
        grads[drop] = _grads(algo.updater.model)
    for a, b in zip(grads[True], grads[False], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.5])
def test_trainer_logprobs_are_taken_at_the_sampling_temperature(tmp_path, temperature):
    algo = _algo(tmp_path, temperature=temperature)
    seqs, adv = _step_tokens(algo, temperature=temperature)
    batch = collate(seqs, adv.reshape(-1).tolist(), algo.updater.pad_id)
    trainer = algo.updater.no_grad_logprobs(algo.updater.model, batch)
    mask = batch.loss_mask
    assert mask.sum() > 20
    torch.testing.assert_close(trainer[mask], batch.sampler_logprobs[mask], rtol=0, atol=1e-4)


@pytest.mark.parametrize("lean", [True, False])
def test_the_plain_unshared_pass_takes_logprobs_at_the_sampling_temperature(tmp_path, lean):
    # Kills: the temperature left out of the plain (unshared) forward pass, lean or model.forward.
    algo = _algo(tmp_path, temperature=0.7, shared_prefix=False, lean_forward=lean)
    seqs, adv = _step_tokens(algo, temperature=0.7)
    batch = collate(seqs, adv.reshape(-1).tolist(), algo.updater.pad_id)
    trainer = algo.updater.no_grad_logprobs(algo.updater.model, batch)
    mask = batch.loss_mask
    assert mask.sum() > 20
    torch.testing.assert_close(trainer[mask], batch.sampler_logprobs[mask], rtol=0, atol=1e-4)


def test_the_train_infer_gap_is_logged_every_step(tmp_path):
    cfg = run_config(_learner(steps=2))
    train(cfg, tmp_path)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for m in lines:
        assert m["train_infer/logp_abs_diff"] == pytest.approx(0.0, abs=1e-4)  # same weights, same tokens
        assert m["train_infer/kl"] == pytest.approx(0.0, abs=1e-6)


def test_the_gap_sees_a_sampler_that_differs_from_the_trainer(tmp_path):
    algo = _algo(tmp_path)
    seqs, adv = _step_tokens(algo)
    with torch.no_grad():  # the trainer's weights move away from the sampler's
        for p in algo.updater.model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    stats = algo.updater.update(seqs, adv.reshape(-1).tolist(), False, "recompute", sampler_known=True)
    assert stats["train_infer/logp_abs_diff"] > 1e-2 and stats["train_infer/kl"] > 1e-4


def test_a_generation_budget_ends_the_run_at_equal_sampling_cost(tmp_path):
    # 4 tasks x 4 samples = 16 generations a step: a budget of 40 is spent after 3 steps (48 >= 40).
    cfg = run_config(_learner(steps=50, generation_budget=40, checkpoint_every=2))
    summary = train(cfg, tmp_path)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["generations"] for m in lines] == [16, 16, 16]
    assert summary["status"] == "generation_budget" and summary["generations"] == 48
    again = train(cfg, tmp_path, resume=True)  # the count survives a resume: no further training
    assert again["steps"] == 3


def test_a_step_without_signal_advances_the_schedule_without_a_torch_warning(tmp_path):
    import warnings

    algo = _algo(tmp_path)
    algo.updater.update([], [], False, "recompute")  # every group without signal: nothing to train
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "lr_scheduler.step() before optimizer.step()" would raise
        algo.end_step()
    assert algo.updater.scheduler.last_epoch == 1


@pytest.mark.parametrize(
    ("options", "nograd_passes", "grad_passes"),
    [
        ({}, 0, 1),  # one epoch of one minibatch: the first forward's log-probs are pi_old, no reference
        ({"track_kl": True}, 1, 1),  # the reference model's forward
        ({"epochs": 2, "minibatches": 2}, 1, 2),  # pi_old recomputed up front; every row twice with gradient
        ({"behavior_logprobs": "sampler", "kl_coef": 0.1}, 1, 1),  # pi_old from the sampler; the reference's
    ],
)
def test_compute_counts_the_tokens_each_pass_runs(tmp_path, options, nograd_passes, grad_passes):
    algo = _algo(tmp_path, **options)
    seqs, adv = _step_tokens(algo)
    tokens = sum(len(s.ids) for s in seqs)  # prompt + completion of every row, no padding
    stats = algo.updater.update(
        seqs, adv.reshape(-1).tolist(), measure_kl=algo.cfg.track_kl, behavior=algo.cfg.behavior_logprobs
    )
    assert stats["compute/forward_tokens"] == stats["compute/backward_tokens"] == grad_passes * tokens
    assert stats["compute/nograd_forward_tokens"] == nograd_passes * tokens


def test_each_step_logs_the_tokens_it_generated(tmp_path):
    train(run_config(_learner(steps=2)), tmp_path)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for m in lines:
        # Single-turn: every generated token is a policy token, so the count is 16 x the mean completion length.
        assert m["compute/generated_tokens"] == round(16 * m["length/mean"])
        assert 0 < m["compute/generated_tokens"] <= 4 * 4 * 8  # B x G x max_new_tokens
        assert m["tokens_per_s"] > 0


# ------------------------------------------------------------------------------------------ update_threads
def _params(model):
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(
    "options",
    [{"micro_batch_tokens": 48}, {"micro_batch_size": 3}, {}, {"micro_batch_tokens": 48, "shared_prefix": False}],
)
def test_update_threads_take_the_same_step_as_one_thread(tmp_path, options):
    # Passes on 2 threads, gradients added in a fixed order: the same update as one thread up to float rounding,
    # and the same statistics. Losing or doubling one thread's gradients moves the parameters far off.
    one = _algo(tmp_path / "one", **options)
    two = _algo(tmp_path / "two", update_threads=2, **options)
    seqs, _ = _step_tokens(one)
    flat = torch.linspace(-1.5, 1.5, len(seqs)).tolist()  # every row with signal
    batch = collate_advantages(seqs, flat, one.updater.pad_id)
    assert len(two.updater.micro_batches(batch, list(range(len(seqs))), parts=2)) >= 2
    ran = []
    in_threads = two.updater._in_threads
    two.updater._in_threads = lambda *a: ran.append(len(a[0])) or in_threads(*a)
    before = _params(one.updater.model)
    stats_one = one.updater.update(seqs, flat, False, "recompute")
    stats_two = two.updater.update(seqs, flat, False, "recompute")
    assert ran and min(ran) >= 2, "the update did not run its passes on threads"
    for a, b in zip(_grads(one.updater.model), _grads(two.updater.model), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-7)  # Adam's first step hides the size: compare grads
    after = _params(one.updater.model)
    for a, b, g in zip(after, _params(two.updater.model), _grads(one.updater.model), strict=True):
        # Adam's first step is lr * g / (|g| + 1e-8): where |g| is near 1e-8 it turns rounding-level gradient
        # differences into a step of any size, so the parameters are compared where the gradient is clear of it.
        clear = g.abs() > 1e-5
        torch.testing.assert_close(b[clear], a[clear], rtol=1e-5, atol=1e-7)
    assert sum(not torch.equal(a, c) for a, c in zip(after, before, strict=True)) > len(before) // 2  # it stepped
    for key in ("loss", "clip_frac", "entropy", "ratio_max", "compute/forward_tokens", "compute/flops_forward"):
        # abs: a loss that cancels to about 0 (a sum of +- advantage terms) differs in its rounding alone
        assert stats_two[key] == pytest.approx(stats_one[key], rel=1e-5, abs=1e-6), key
    one.close()
    two.close()


def test_update_threads_give_the_same_bits_each_time(tmp_path):
    runs = [_algo(tmp_path / str(i), update_threads=2, micro_batch_tokens=40) for i in range(2)]
    seqs, _ = _step_tokens(runs[0])
    for algo in runs:
        algo.updater.update(seqs, torch.linspace(-1.5, 1.5, len(seqs)).tolist(), False, "recompute")
        algo.close()
    for a, b in zip(_params(runs[0].updater.model), _params(runs[1].updater.model), strict=True):
        assert torch.equal(a, b)


def test_fewer_passes_than_threads_are_split_one_per_thread(tmp_path):
    algo = _algo(tmp_path, update_threads=3)
    seqs, adv = _step_tokens(algo)  # 4 tasks x 4 samples
    batch = collate_advantages(seqs, adv.reshape(-1).tolist(), algo.updater.pad_id)
    rows = list(range(len(seqs)))
    assert algo.updater.micro_batches(batch, rows) == [rows]  # no budget: one pass
    passes = algo.updater.micro_batches(batch, rows, parts=3)
    assert len(passes) == 3 and sorted(r for p in passes for r in p) == rows
    owner = prompt_groups(batch.input_ids, batch.prompt_len)  # shared_prefix: a prompt's rows stay in one pass
    assert len({frozenset(owner[r] for r in p) for p in passes}) == 3
    for p in passes:
        assert all(owner.count(owner[r]) == sum(owner[q] == owner[r] for q in p) for r in p)
    sized = algo.updater.cfg.model_copy(update={"micro_batch_size": 16, "shared_prefix": False})
    algo.updater.cfg = sized
    assert [len(p) for p in algo.updater.micro_batches(batch, rows, parts=2)] == [8, 8]


def test_an_error_in_an_update_thread_surfaces_and_restores_torch_threads(tmp_path):
    algo = _algo(tmp_path, update_threads=2, micro_batch_tokens=40)
    seqs, adv = _step_tokens(algo)
    calls = []
    forward = algo.updater.forward_logprobs

    def failing(model, sub, entropy=False):
        calls.append(len(sub))
        if len(calls) == 2:
            raise RuntimeError("pass failed")
        return forward(model, sub, entropy=entropy)

    algo.updater.forward_logprobs = failing
    threads = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="pass failed"):
        algo.updater.update(seqs, adv.reshape(-1).tolist(), False, "recompute")
    assert torch.get_num_threads() == threads
    algo.close()


def test_update_threads_refuse_a_policy_off_the_cpu():
    from learner_helpers import tiny_hf_policy

    from lrmgym.learners.engine.update import PolicyUpdater

    policy = tiny_hf_policy()
    policy.model.to("meta")  # any device that is not the CPU
    with pytest.raises(ValueError, match=r"update_threads=2 .* policy is on meta.*update_threads=1"):
        PolicyUpdater(_learner(update_threads=2), policy, lambda: 0.0, 8)
