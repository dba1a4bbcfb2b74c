"""The GRPO loop end to end on a tiny random Llama and a dense-reward test env."""

from __future__ import annotations

import json
import math
import re

import pytest
from learner_helpers import make_loop, register_test_env, run_config

from lrmgym.compose import train
from lrmgym.learners.algorithms.grpo import GRPOConfig
from lrmgym.learners.engine.rollout import collate

register_test_env()


def _learner(**kw):
    base = dict(
        steps=3,
        prompts_per_step=4,
        group_size=4,
        max_new_tokens=8,
        eval_before_after=False,
        checkpoint_every=2,
        progress=False,
        lr=1e-3,
    )
    base.update(kw)
    return GRPOConfig(**base)


def test_run_writes_the_run_directory(tmp_path):
    cfg = run_config(_learner())
    summary = train(cfg, tmp_path, resume=False)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3]
    for key in (
        "reward/mean",
        "accuracy",
        "zero_variance_frac",
        "entropy",
        "length/mean",
        "kl_ref",
        "clip_frac",
        "tokens_per_s",
        "loss",
        "grad_norm",
    ):
        assert key in lines[0], key
    assert lines[0]["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # the policy equals the reference before step 1
    assert lines[-1]["kl_ref"] > 0  # and has moved after two updates
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000002.pt", "step_000003.pt"]
    assert (tmp_path / "plots" / "metrics.png").stat().st_size > 1000
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "finished"
    assert summary["steps"] == 3
    samples = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 3 * 2 and len(samples[0]["trajectories"]) == 4


def test_run_refuses_to_overwrite(tmp_path):
    cfg = run_config(_learner(steps=1))
    train(cfg, tmp_path, resume=False)
    msg = (
        f"{tmp_path} already holds a run (metrics or checkpoints); resume it with "
        f"`lrmgym run --resume {tmp_path}` or choose a new run.name."
    )
    with pytest.raises(FileExistsError, match=f"^{re.escape(msg)}$"):
        train(cfg, tmp_path, resume=False)


def _trainer(tmp_path, **kw):
    """The GRPO algorithm of a run loop, set up (its ``loop`` attribute is the loop)."""
    cfg = run_config(_learner(**kw))
    return make_loop(cfg, tmp_path, setup=True).algorithm


def _rollout_tokens(trainer):
    from lrmgym.learners.algorithms.advantages import group_advantages, scores_to_tensors
    from lrmgym.learners.engine.rollout import rollout, tokenize_trajectory
    from lrmgym.policies.base import SamplingParams

    tasks = [trainer.env.task_at(i, seed=0) for i in range(3)]
    ro = rollout(trainer.env, trainer.policy, tasks, 4, SamplingParams(max_new_tokens=8, seed=1))
    adv = group_advantages(*scores_to_tensors([[t.reward for t in g] for g in ro.groups])).advantages.reshape(-1)
    seqs = [tokenize_trajectory(t, trainer.policy.tokenizer) for g in ro.groups for t in g]
    return seqs, adv.tolist()


@pytest.mark.parametrize("agg", ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize(
    "split",
    [
        {"micro_batch_size": 5},
        {"micro_batch_tokens": 40, "shared_prefix": False},
        {"micro_batch_tokens": 40},
        {"micro_batch_tokens": 20},  # under some groups' cost: they are split across passes
    ],
)
def test_micro_batches_accumulate_to_the_same_update(tmp_path, agg, split):
    import torch

    whole = _trainer(tmp_path / "a", loss_agg=agg, max_grad_norm=None)
    micro = _trainer(tmp_path / "b", loss_agg=agg, max_grad_norm=None, **split)
    seqs, adv = _rollout_tokens(whole)
    batch = collate(seqs, adv, micro.updater.pad_id)
    chunks = micro.updater.micro_batches(batch, list(range(len(batch))))
    assert len(chunks) > 1 and sorted(r for c in chunks for r in c) == list(range(len(batch)))
    width = batch.attention_mask.sum(-1)
    if split.get("shared_prefix") is False:  # each pass holds at most 40 padded tokens (or a single longer row)
        assert all(len(c) == 1 or len(c) * int(width[c].max()) <= 40 for c in chunks)
    elif "micro_batch_tokens" in split:  # a pass counts its prompts once each; a group over the budget is split
        owner = [tuple(seqs[r].ids[: batch.prompt_len[r]]) for r in range(len(batch))]
        cont = width - batch.prompt_len

        def cost(rows: list[int]) -> int:
            return len(rows) * int(cont[rows].max()) + len({owner[r] for r in rows}) * int(batch.prompt_len[rows].max())

        for c in chunks:
            assert len(c) == 1 or cost(c) <= split["micro_batch_tokens"]
        split_groups = 0
        for prompt in set(owner):
            rows = [r for r in range(len(batch)) if owner[r] == prompt]
            holding = [c for c in chunks if set(rows) & set(c)]
            if cost(rows) <= split["micro_batch_tokens"]:  # a group that fits stays in one pass (its prompt once)
                assert len(holding) == 1
            split_groups += len(holding) > 1
        assert (split_groups > 0) == (split["micro_batch_tokens"] == 20)  # the update below still matches
    assert any(a != 0 for a in adv)
    whole.updater.update(seqs, adv, True, "recompute")
    micro.updater.update(seqs, adv, True, "recompute")
    # Compare the accumulated gradients (left in .grad after the step): Adam's update divides by the
    # gradient's scale, which would magnify float noise in near-zero components.
    for p, q in zip(whole.updater.model.parameters(), micro.updater.model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-7)


def test_several_epochs_and_minibatches_recompute_old_logprobs(tmp_path):
    trainer = _trainer(tmp_path / "many", epochs=2, minibatches=3, lr=1e-2)
    seqs, adv = _rollout_tokens(trainer)
    stats = trainer.updater.update(seqs, adv, True, "recompute")
    # after the first of 6 optimizer steps the policy has moved, so some ratio differs from 1 and some (not
    # all) tokens leave the clip range
    assert stats["ratio_max"] > 1.0
    assert stats["loss"] is not None and 0.0 < stats["clip_frac"] < 1.0, stats["clip_frac"]
    # One epoch of one minibatch: pi_old is the forward's own detached log-probs, the ratio exactly 1, no clip.
    once = _trainer(tmp_path / "once", epochs=1, minibatches=1, lr=1e-2)
    stats = once.updater.update(seqs, adv, True, "recompute")
    assert stats["ratio_max"] == 1.0 and stats["clip_frac"] == 0.0


def test_multi_turn_run_on_tiny_model(tmp_path):
    cfg = run_config(_learner(steps=2, group_size=3, prompts_per_step=2), max_turns=2)
    train(cfg, tmp_path, resume=False)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(1.0 < m["turns/mean"] <= 2.0 for m in lines)
    assert all(m["retokenized_turns"] == 0 for m in lines)  # env tokens came from the policy's own encoding
    sample = json.loads((tmp_path / "samples.jsonl").read_text().splitlines()[0])
    roles = {tuple(t["role"] for t in traj["turns"]) for traj in sample["trajectories"]}
    assert ("policy", "env", "policy") in roles


class _MetricsEnv:
    """A stand-in judge wrapper: forwards to the env and reports group metrics through pop_metrics()."""

    def __init__(self, env):
        self.env, self.calls = env, 0

    def __getattr__(self, name):
        return getattr(self.env, name)

    def score_group(self, task, completions):
        self.calls += 1
        return self.env.score_group(task, completions)

    def pop_metrics(self):
        out, self.calls = {"groups_scored": self.calls}, 0
        return out


def test_judge_metrics_are_merged(tmp_path, monkeypatch):
    import lrmgym.compose as compose

    real = compose.build_env
    monkeypatch.setattr(compose, "build_env", lambda config: _MetricsEnv(real(config)))
    cfg = run_config(_learner(steps=2))
    train(cfg, tmp_path, resume=False)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["judge/groups_scored"] for m in lines] == [4, 4]


def test_time_budget_stops_early_and_still_finishes(tmp_path):
    cfg = run_config(_learner(steps=50, time_budget_s=1e-3, checkpoint_every=10))
    summary = train(cfg, tmp_path, resume=False)
    assert summary["status"] == "time_budget" and summary["steps"] == 1
    assert (tmp_path / "checkpoints" / "step_000001.pt").exists()
    again = train(cfg, tmp_path, resume=True)  # resuming an over-budget run trains no further
    assert again["steps"] == 1


def test_warmup_counts_training_steps(tmp_path):
    cfg = run_config(_learner(steps=3, warmup_steps=2, lr=1e-3))
    train(cfg, tmp_path, resume=False)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["lr"] for m in lines] == pytest.approx([5e-4, 1e-3, 1e-3])


def test_cosine_decay_over_steps(tmp_path):
    cfg = run_config(_learner(steps=5, lr=1e-3, lr_decay="cosine", min_lr_ratio=0.2))
    train(cfg, tmp_path, resume=False)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # progress k/5 before update k+1: lr = 1e-3 * (0.2 + 0.8 * (1 + cos(pi * k / 5)) / 2)
    expected = [1e-3 * (0.2 + 0.4 * (1 + math.cos(math.pi * k / 5))) for k in range(5)]
    assert [m["lr"] for m in lines] == pytest.approx(expected)


def test_linear_decay_follows_the_time_budget(tmp_path):
    trainer = _trainer(tmp_path, steps=1000, lr=1e-3, lr_decay="linear", min_lr_ratio=0.0, time_budget_s=100.0)
    trainer.loop.train_step()
    trainer.loop.elapsed_s = 75.0  # as if the budget were three quarters spent
    trainer.updater.scheduler.step()
    assert trainer.updater.optimizer.param_groups[0]["lr"] == pytest.approx(0.25e-3)  # time, not step 2/1000, leads


def test_expected_steps_follow_the_time_budget(tmp_path):
    loop = _trainer(tmp_path, steps=1000, time_budget_s=100.0).loop
    assert loop.expected_steps() == 1000  # nothing measured yet
    loop.step, loop.elapsed_s = 40, 20.0  # 0.5 s a step, 80 s left
    assert loop.expected_steps() == 200
    loop.cfg = loop.cfg.model_copy(update={"steps": 150})
    assert loop.expected_steps() == 150
    loop.cfg = loop.cfg.model_copy(update={"time_budget_s": None})
    assert loop.expected_steps() == 150


def test_kl_is_measured_on_every_nth_step(tmp_path):
    trainer = _trainer(tmp_path, track_kl_every=2, drop_zero_advantage=False)
    kls = [trainer.loop.train_step()["kl_ref"] for _ in range(3)]
    assert kls[0] is not None and kls[2] is not None and kls[1] is None


def test_learner_thread_count_wins_over_the_policy_build(tmp_path, monkeypatch):
    import torch
    from learner_helpers import TinyTestPolicyConfig

    original = TinyTestPolicyConfig.build

    def build_and_set_threads(self):  # what the tiny policy's build does on an idle machine
        torch.set_num_threads(2)
        return original(self)

    monkeypatch.setattr(TinyTestPolicyConfig, "build", build_and_set_threads)
    before = torch.get_num_threads()
    try:
        _trainer(tmp_path, torch_threads=1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_a_run_states_its_expected_finish_and_its_speed_against_the_idle_machine(tmp_path, capsys):
    # 1e-6 steps/s: any machine is faster than that "idle" figure, so no slower-than-expected sentence.
    summary = train(run_config(_learner(steps=2, idle_steps_per_s=1e-6, eval_before_after=True)), tmp_path / "a")
    out = capsys.readouterr().out
    announce = next(line for line in out.splitlines() if line.startswith("Training 2 steps: "))
    assert re.fullmatch(
        r"Training 2 steps: about \d+ min \d+ s at the 1e-06 steps/s of an idle 2-core machine, done at about "
        r"\d\d:\d\d, then the final evaluation\.",
        announce,
    )
    speed = summary["speed"]
    assert speed["steps_per_s"] == pytest.approx(2 / summary["train_wall_s"]) and speed["idle_steps_per_s"] == 1e-6
    assert "note" not in speed and "slower" not in out
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["speed"] == speed
    assert re.search(r"^speed: \d+\.\d\d steps/s \(an idle 2-core machine: 1e-06\)$", out, re.M)


def test_a_run_slower_than_the_idle_machine_says_so(tmp_path, capsys):
    # 1e6 steps/s: every machine is slower; the same steps were trained, so the sentence says the result holds.
    summary = train(run_config(_learner(steps=2, idle_steps_per_s=1e6, eval_before_after=True)), tmp_path / "a")
    note = summary["speed"]["note"]
    assert re.fullmatch(
        r"This machine trained at \d+\.\d\d steps/s, [\d.]+x slower than the 1e\+06 steps/s of an idle 2-core machine "
        r"\(other processes, fewer or slower cores\), so the run took longer; it trained the same 2 steps, and a fixed "
        r"number of steps with a fixed seed gives the same result at any speed\.",
        note,
    )
    assert note in " ".join(capsys.readouterr().out.split())
    # Stopped by an opt-in time budget, the run says that its step count fell short.
    cut = train(run_config(_learner(steps=50, time_budget_s=1e-3, idle_steps_per_s=1e6)), tmp_path / "b")
    assert cut["status"] == "time_budget" and cut["steps"] == 1
    assert "ended training after 1 of 50 steps" in cut["speed"]["note"]


def test_a_run_without_an_idle_figure_states_no_expectation(tmp_path, capsys):
    summary = train(run_config(_learner(steps=1, eval_before_after=True)), tmp_path)
    assert summary["speed"]["idle_steps_per_s"] is None and "note" not in summary["speed"]
    out = capsys.readouterr().out
    assert "Training 1 steps" not in out and "speed:" not in out
