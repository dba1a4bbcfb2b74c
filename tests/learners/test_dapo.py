"""DAPO: dynamic sampling, overlong filtering, resume; and the reference-model refresh every N steps."""

from __future__ import annotations

import json
import re

import pytest
import torch
from learner_helpers import make_loop, register_test_env, run_config

import lrmgym.compose as compose
import lrmgym.learners.engine.onpolicy as onpolicy_module
from lrmgym.compose import train
from lrmgym.configs.resolve import ConfigError, resolve
from lrmgym.core import Verdict
from lrmgym.learners.algorithms.advantages import group_advantages
from lrmgym.learners.algorithms.dapo import DAPOConfig
from lrmgym.learners.algorithms.grpo import GRPOConfig
from lrmgym.learners.engine.loop import Loop
from lrmgym.learners.engine.rollout import tokenize_trajectory

register_test_env()
VOLATILE = ("time/", "tokens_per_s", "perf/")  # perf/*: FLOPs per second of wall time


def _common(**kw):
    base = dict(
        steps=2, prompts_per_step=4, group_size=4, max_new_tokens=8, eval_before_after=False, checkpoint_every=2,
        progress=False, lr=3e-3, torch_threads=1,
    )  # fmt: skip
    base.update(kw)
    return base


def _dapo(**kw) -> DAPOConfig:
    return DAPOConfig(**_common(log_samples=100, **kw))


def _lines(path) -> list[dict]:
    return [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]


def _stable(path) -> list[dict]:
    return [{k: v for k, v in m.items() if not k.startswith(VOLATILE)} for m in _lines(path)]


class _Scripted:
    """A stand-in judge wrapper with scores we choose: task ``i`` (its stream position) scores 0.5 for every
    sample when ``flat(i)`` (a group without signal), else 0, 1, 0, 1 ... by sample. Every sample is marked as
    finished (finish_reason "stop"), except those ``cut`` lists for its task, marked as cut off by the budget."""

    def __init__(self, env, flat, cut=None):
        self.env, self.flat, self.cut = env, flat, cut or {}

    def __getattr__(self, name):
        return getattr(self.env, name)

    def score_group(self, task, completions):
        i = int(task.id.split("/")[1])
        out = []
        for j, c in enumerate(completions):
            c.finish_reason = "length" if j in self.cut.get(i, ()) else "stop"
            score = 0.5 if self.flat(i) else float(j % 2)
            out.append(Verdict(score=score, correct=score == 1.0, reason="scripted"))
        return out


def _script(monkeypatch, flat, cut=None):
    real = compose.build_env
    monkeypatch.setattr(compose, "build_env", lambda config: _Scripted(real(config), flat, cut))


def _samples(path) -> dict[int, list[tuple[int, bool]]]:
    """Per step: (task index, trained) of every group sampled, in order (trained: some advantage is not 0)."""
    out: dict[int, list[tuple[int, bool]]] = {}
    for line in (path / "samples.jsonl").read_text().splitlines():
        rec = json.loads(line)
        trained = any(t["advantage"] != 0 for t in rec["trajectories"])
        out.setdefault(rec["step"], []).append((int(rec["task_id"].split("/")[1]), trained))
    return out


def _dapo_keys(m: dict) -> dict:
    return {k.removeprefix("dapo/"): v for k, v in m.items() if k.startswith("dapo/")}


# ------------------------------------------------------------------------------------------ dynamic sampling
def test_dynamic_sampling_drops_flat_groups_and_refills(tmp_path, monkeypatch):
    _script(monkeypatch, flat=lambda i: i in {0, 2, 5, 8})
    loop = make_loop(run_config(_dapo(steps=10, generation_budget=40)), tmp_path)
    summary = loop.run()
    first, second = _lines(tmp_path)  # 28 + 20 completions: the budget of 40 ends the run after step 2
    assert summary["status"] == "generation_budget" and summary["steps"] == 2
    assert [m["generations"] for m in (first, second)] == [28, 20]  # the refills count as sampling cost
    # Step 1: tasks 0-3 (1 and 3 have signal), refill 2 more (4, 5: only 4), refill 1 more (6): 7 tasks drawn.
    assert _dapo_keys(first) == {
        "rounds": 3, "generations": 7 * 4, "kept_groups": 4, "dropped_groups": 3, "surplus_groups": 0,
        "overlong_filtered": 0, "capped": 0,
    }  # fmt: skip
    # Step 2 starts where step 1 stopped drawing: tasks 7-10 (8 is flat), refill 1 (11).
    assert _dapo_keys(second) == {
        "rounds": 2, "generations": 5 * 4, "kept_groups": 4, "dropped_groups": 1, "surplus_groups": 0,
        "overlong_filtered": 0, "capped": 0,
    }  # fmt: skip
    assert loop.algorithm.data_pos == 12
    samples = _samples(tmp_path)
    assert samples[1] == [(0, False), (1, True), (2, False), (3, True), (4, True), (5, False), (6, True)]
    assert samples[2] == [(7, True), (8, False), (9, True), (10, True), (11, True)]
    # The metrics line describes all that was sampled, the update only the kept groups.
    assert first["zero_variance_groups"] == 3 and first["trained_frac"] == pytest.approx(16 / 28)
    assert second["zero_variance_groups"] == 1 and second["trained_frac"] == pytest.approx(16 / 20)
    assert first["accuracy"] == pytest.approx(4 * 2 / 28)  # over all 7 groups: 2 of 4 right where not flat


def test_refill_prompts_over_samples_and_trains_on_the_first_b(tmp_path, monkeypatch):
    _script(monkeypatch, flat=lambda i: i in {0, 2})
    loop = make_loop(run_config(_dapo(steps=1, refill_prompts=3)), tmp_path)
    loop.run()
    (line,) = _lines(tmp_path)
    # Tasks 0-3 (1, 3), then 3 more at once (4, 5, 6 all with signal): 4 and 5 fill the batch, 6 is surplus.
    assert _dapo_keys(line) == {
        "rounds": 2, "generations": 7 * 4, "kept_groups": 4, "dropped_groups": 2, "surplus_groups": 1,
        "overlong_filtered": 0, "capped": 0,
    }  # fmt: skip
    assert _samples(tmp_path)[1] == [(0, False), (1, True), (2, False), (3, True), (4, True), (5, True), (6, False)]
    assert loop.algorithm.data_pos == 7  # the surplus task was drawn: the stream moves past it


def test_the_round_cap_ends_the_step_with_what_it_has(tmp_path, monkeypatch, capsys):
    _script(monkeypatch, flat=lambda i: i != 5)
    loop = make_loop(run_config(_dapo(max_rounds=3)), tmp_path, setup=True)
    one = loop.train_step()
    # Tasks 0-3 (none), 4 more (4-7: only 5), 3 more (8-10: none); three rounds, so the step stops short.
    assert _dapo_keys(one) == {
        "rounds": 3, "generations": 11 * 4, "kept_groups": 1, "dropped_groups": 10, "surplus_groups": 0,
        "overlong_filtered": 0, "capped": 1,
    }  # fmt: skip
    assert one["loss"] is not None and one["trained_frac"] == pytest.approx(4 / 44)
    weights = [p.detach().clone() for p in loop.algorithm.updater.model.parameters()]
    two = loop.train_step()  # tasks 11-22: no group with signal at all
    assert _dapo_keys(two) == {
        "rounds": 3, "generations": 12 * 4, "kept_groups": 0, "dropped_groups": 12, "surplus_groups": 0,
        "overlong_filtered": 0, "capped": 1,
    }  # fmt: skip
    assert two["loss"] is None and two["trained_frac"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(weights, loop.algorithm.updater.model.parameters(), strict=True))
    assert loop.algorithm.data_pos == 23
    printed = capsys.readouterr().out
    assert printed.count("learner=dapo: step 1 ran max_rounds=3 sampling rounds and found 1 of 4 groups") == 1
    assert "step 2 ran" not in printed  # said once per run, then only in the metrics


def test_a_group_the_overlong_filter_leaves_one_sample_is_dropped(tmp_path, monkeypatch):
    # Task 1 keeps one counted sample (no variance left) and is refilled; task 3 loses one of four (0 and 1 remain).
    _script(monkeypatch, flat=lambda i: i == 0, cut={1: (0, 1, 2), 3: (1,)})
    make_loop(run_config(_dapo(steps=1, overlong_filter=True)), tmp_path).run()
    (line,) = _lines(tmp_path)
    assert _dapo_keys(line) == {
        "rounds": 2, "generations": 6 * 4, "kept_groups": 4, "dropped_groups": 2, "surplus_groups": 0,
        "overlong_filtered": 4, "capped": 0,
    }  # fmt: skip
    assert _samples(tmp_path)[1] == [(0, False), (1, False), (2, True), (3, True), (4, True), (5, True)]


# ------------------------------------------------------------------------------------------ overlong filtering
def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


def _close(a, b) -> bool:
    return all(torch.allclose(x, y, rtol=1e-4, atol=1e-7) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_overlong_filtered_trajectories_carry_no_gradient(tmp_path, monkeypatch, agg):
    captured = {}
    real = onpolicy_module.rollout  # the step's rollout is sampled through learners.onpolicy.OnPolicy.collect

    scores = [[0.1, 0.9, 0.4, 0.6], [0.3, 0.2, 0.8, 0.5], [0.7, 0.0, 1.0, 0.35]]
    cut = 1  # task 0's sample 1 is cut off: 0.9, far from its group's other rewards (mean 0.37)

    def one_cut_off(*args, **kwargs):  # our scores; every sample finished except the cut one
        ro = real(*args, **kwargs)
        for b, group in enumerate(ro.groups):
            for j, t in enumerate(group):
                t.verdict = Verdict(score=scores[b][j], reason="scripted")
                t.policy_turns[-1].completion.finish_reason = "length" if (b, j) == (0, cut) else "stop"
        captured["ro"] = ro
        return ro

    monkeypatch.setattr(onpolicy_module, "rollout", one_cut_off)
    kw = dict(steps=1, prompts_per_step=3, loss_agg=agg, max_grad_norm=None)

    def grads_of_a_step(name, **extra):
        algo = make_loop(run_config(_dapo(**kw, **extra)), tmp_path / name, setup=True).algorithm
        line = algo.loop.train_step()
        return line, _grads(algo.updater.model)

    line, filtered = grads_of_a_step("filtered", overlong_filter=True)
    assert line["dapo/overlong_filtered"] == 1 and line["dapo/kept_groups"] == 3 and line["dapo/rounds"] == 1
    ro = captured["ro"]

    def update_on(name, rows_of_group_0, stats_of_group_0):
        """The update on task 0's ``rows_of_group_0`` (advantages from ``stats_of_group_0``) and the other groups."""
        algo = make_loop(run_config(_dapo(**kw)), tmp_path / name, setup=True).algorithm
        seqs, advs = [], []
        for b, group in enumerate(ro.groups):
            stats = stats_of_group_0 if b == 0 else range(len(group))
            rewards = torch.tensor([[group[j].reward for j in stats]], dtype=torch.float64)
            counted = group_advantages(rewards, torch.ones_like(rewards, dtype=torch.bool)).advantages[0]
            adv = dict(zip(stats, counted.tolist(), strict=True))
            for j in rows_of_group_0 if b == 0 else range(len(group)):
                seqs.append(tokenize_trajectory(group[j], algo.policy.tokenizer))
                advs.append(float(adv[j]))
        algo.updater.update(seqs, advs, False, "recompute")
        return _grads(algo.updater.model)

    others = [j for j in range(4) if j != cut]
    # The same step without the cut-off sample at all: the gradient must be the same.
    assert _close(filtered, update_on("without", others, others))
    # Plausible wrong filters give other gradients: masking only its loss (its reward still in the group's mean
    # and std), or no filter at all.
    assert not _close(filtered, update_on("loss_only", others, range(4)))
    _, unfiltered = grads_of_a_step("unfiltered", overlong_filter=False)
    assert not _close(filtered, unfiltered)


# ------------------------------------------------------------------------------------------ equivalence, config
@pytest.mark.parametrize("dynamic", [False, True])
def test_dapo_without_its_changes_is_grpo(tmp_path, monkeypatch, dynamic):
    # Every group has signal, so dynamic sampling draws no more than GRPO does: the runs must agree line for line.
    _script(monkeypatch, flat=lambda i: False)
    plain = dict(clip_high=0.2, loss_agg="seq_mean_token_mean")
    train(run_config(GRPOConfig(**_common(steps=3))), tmp_path / "grpo")
    train(run_config(DAPOConfig(**_common(steps=3), dynamic_sampling=dynamic, **plain)), tmp_path / "dapo")
    grpo, dapo = _stable(tmp_path / "grpo"), _stable(tmp_path / "dapo")
    assert all(_dapo_keys(m)["rounds"] == 1 and _dapo_keys(m)["generations"] == 16 for m in dapo)
    assert [{k: v for k, v in m.items() if not k.startswith("dapo/")} for m in dapo] == grpo
    assert all(m["grad_norm"] > 0 for m in grpo) and grpo[-1]["kl_ref"] > 0  # the runs trained


def test_dapo_defaults_and_the_async_refusal():
    cfg = resolve(["env=echo", "policy=mock", "learner=dapo"]).learner
    assert isinstance(cfg, DAPOConfig) and cfg.clip_high == 0.28 and cfg.loss_agg == "token_mean"
    assert cfg.dynamic_sampling and not cfg.async_rollouts
    msg = (
        "learner: async_rollouts=true samples the next step's tasks while this step trains, but dynamic sampling "
        "knows how many tasks a step draws only once they are graded; set learner.async_rollouts=false "
        "(or learner.dynamic_sampling=false)."
    )
    with pytest.raises(ConfigError, match=f"^{re.escape(msg)}$"):
        resolve(["env=echo", "policy=mock", "learner=dapo", "learner.async_rollouts=true"])
    assert DAPOConfig(async_rollouts=True, dynamic_sampling=False).async_rollouts  # one round: GRPO's, async


# ------------------------------------------------------------------------------------------ resume
def _crash_then_resume(monkeypatch, cfg, run_dir, after: int):
    original = Loop.train_step

    def crash(self):
        out = original(self)
        if self.step == after:
            raise RuntimeError("simulated crash")
        return out

    monkeypatch.setattr(Loop, "train_step", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(cfg, run_dir, resume=False)
    monkeypatch.setattr(Loop, "train_step", original)
    train(cfg, run_dir, resume=True)


def test_dapo_resume_after_crash_matches_uninterrupted(tmp_path, monkeypatch):
    # Rounds per step: 3 (tasks 0-7), 1 (8-11), 3 (12-20), 1, 1: the stream position moves unevenly.
    _script(monkeypatch, flat=lambda i: i in {0, 1, 2, 6, 13, 14, 15, 16, 17})
    cfg = run_config(_dapo(steps=5))
    train(cfg, tmp_path / "a", resume=False)
    _crash_then_resume(monkeypatch, cfg, tmp_path / "b", after=3)  # the last checkpoint is step 2
    a, b = _stable(tmp_path / "a"), _stable(tmp_path / "b")
    assert [m["step"] for m in b] == [1, 2, 3, 4, 5]
    assert [m["dapo/rounds"] for m in a] == [3, 1, 3, 1, 1]
    assert b == a
    assert (tmp_path / "a" / "samples.jsonl").read_text() == (tmp_path / "b" / "samples.jsonl").read_text()


# ------------------------------------------------------------------------------------------ reference refresh
def _grpo(**kw) -> GRPOConfig:
    return GRPOConfig(**_common(lr=1e-2, track_kl_every=1, ref_refresh_steps=2, **kw))


def test_the_reference_is_reset_to_the_policy_every_n_steps(tmp_path, monkeypatch):
    _script(monkeypatch, flat=lambda i: False)  # every step has signal, so every step moves the policy
    loop = make_loop(run_config(_grpo(steps=5)), tmp_path, setup=True)
    updater = loop.algorithm.updater
    policy_at, kl = [], []  # the policy at the start of each step; each step's KL (measured before its update)
    for done in range(5):
        policy_at.append([p.detach().clone() for p in updater.model.parameters()])
        kl.append(loop.train_step()["kl_ref"])
        # Reset at the start of steps 3 and 5 (2 and 4 steps done) to the policy then; the initial one before.
        expected = policy_at[done // 2 * 2]
        assert all(torch.equal(a, b) for a, b in zip(updater.ref_model.parameters(), expected, strict=True)), done
        assert updater.ref_step == done // 2 * 2
    assert kl[0] == pytest.approx(0.0, abs=1e-9) and kl[2] == pytest.approx(0.0, abs=1e-9)
    assert kl[4] == pytest.approx(0.0, abs=1e-9)
    assert kl[1] > 1e-5 and kl[3] > 1e-5  # the drift since the last reset


def test_resume_restores_a_refreshed_reference(tmp_path, monkeypatch):
    _script(monkeypatch, flat=lambda i: False)
    cfg = run_config(_grpo(steps=6, checkpoint_every=3))
    train(cfg, tmp_path / "a", resume=False)
    _crash_then_resume(monkeypatch, cfg, tmp_path / "b", after=4)  # resumes from step 3, reference reset at 2
    a, b = _stable(tmp_path / "a"), _stable(tmp_path / "b")
    assert a[3]["kl_ref"] > 1e-5  # step 4 measures the drift from the step-2 reference, which the resume needs
    assert b == a
    state = torch.load(tmp_path / "a" / "checkpoints" / "step_000003.pt", weights_only=False)
    assert state["ref_step"] == 2 and "ref_model" in state


def test_ref_refresh_needs_a_reference():
    msg = "ref_refresh_steps needs a reference model: set kl_coef > 0 or track_kl=true."
    with pytest.raises(ValueError, match=re.escape(msg)):
        GRPOConfig(ref_refresh_steps=5, track_kl=False)
    assert GRPOConfig(ref_refresh_steps=5, track_kl=False, kl_coef=1e-4).ref_refresh_steps == 5
