"""Ring-Zero (learner=ring_zero): stage configs, tiers, the response window, and the staged run with its resume."""

from __future__ import annotations

import json

import pytest
import torch

from lrmgym.compose import build_context
from lrmgym.configs.resolve import ConfigError, resolve
from lrmgym.core import Completion, Task, Trajectory, Turn, Verdict
from lrmgym.episodes import Rollout
from lrmgym.learners.algorithms.ring_zero import RingZeroConfig, RingZeroRL, RL1Config, RL3Config, TierConfig, with_tier
from lrmgym.learners.engine import loop as loop_module

BASE = ("env=math", "policy=tiny", "learner=ring_zero", "eval.tasks=6", "eval.n=1", "eval.max_new_tokens=48")
SMALL_RL = dict(
    steps=2, prompts_per_step=4, group_size=4, time_budget_s=None, async_rollouts=False, progress=False,
    checkpoint_every=1, eval_greedy=False, log_samples=0, torch_threads=1,
)  # fmt: skip


# --------------------------------------------------------------------------------------------------- configs
def test_each_stage_has_its_papers_defaults():
    cfg = RingZeroConfig()
    assert cfg.stages == ["rl1", "sd", "rl2", "rl3"]
    r1, r2, r3 = cfg.rl1, cfg.rl2, cfg.rl3
    assert (r1.pg_loss, r1.is_cap, r1.is_cap_mode, r1.behavior_logprobs) == ("cispo", 5.0, "absolute", "sampler")
    assert (r1.loss_agg, r1.kl_coef, r1.kl_estimator, r1.format_reward) == ("token_mean", 1e-4, "k3", "strict")
    assert r1.ref_refresh_steps is not None and r1.window_start is not None
    assert (r2.loss_agg, r2.kl_coef, r2.ref_refresh_steps, r2.pg_loss, r2.is_cap) == (
        "seq_mean_token_mean", 0.0, None, "cispo", 5.0,
    )  # fmt: skip
    assert r3.loss_agg == "seq_mean_token_mean" and [t.name for t in r3.tiers] == ["low", "medium", "high"]


def test_the_preset_resolves_and_takes_per_stage_overrides():
    cfg = resolve((*BASE, "learner.stages=[rl1,sd]", "learner.rl1.steps=7", "learner.sd.epochs=2"))
    assert cfg.learner.stages == ["rl1", "sd"] and cfg.learner.rl1.steps == 7 and cfg.learner.sd.epochs == 2
    assert "kind" not in cfg.to_dict()["learner"]["rl1"]  # every RL stage is GRPO: not a choice to write


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("learner.stages=[sd,rl1]", "put rl1"),
        ("learner.stages=[rl1,rl1]", "once"),
        ("learner.stages=[rl4]", "rl4"),
        ("learner.rl3.async_rollouts=true", "async_rollouts=false"),
        ("learner.rl1.window_start=100", "window_start=100"),
        ("learner.rl1.window_start=0", "expected a token count from 1 to 1000000, 'auto'"),
        ("learner.rl1.window_start=abc", "expected a token count from 1 to 1000000, 'auto'"),
        ("learner.rl1.steps=0", "steps"),
    ],
)
def test_bad_stage_options_are_refused_by_name(override, says):
    with pytest.raises(ConfigError) as err:
        resolve((*BASE, override))
    assert says in str(err.value)


def test_ppo_clip_in_rl1_drops_the_cap_but_an_explicit_cap_is_refused():
    assert RL1Config(pg_loss="ppo_clip").is_cap is None
    assert resolve((*BASE, "learner.rl1.pg_loss=ppo_clip")).learner.rl1.is_cap is None  # also over the preset
    with pytest.raises(ValueError, match="is_cap"):
        RL1Config(pg_loss="ppo_clip", is_cap=5.0)


def test_tiers_must_grow_and_fit_the_budget():
    with pytest.raises(ValueError, match="increase"):
        RL3Config(tiers=[TierConfig(name="a", max_new_tokens=20), TierConfig(name="b", max_new_tokens=10)])
    with pytest.raises(ValueError, match="exceeds max_new_tokens"):
        RL3Config(max_new_tokens=16, tiers=[TierConfig(name="a", max_new_tokens=20)])
    with pytest.raises(ValueError, match="unique"):
        RL3Config(tiers=[TierConfig(name="a", max_new_tokens=8), TierConfig(name="a", max_new_tokens=9)])


# --------------------------------------------------------------------------------------------------- pieces
def test_the_response_window_doubles_every_m_steps_up_to_the_budget():
    cfg = RL1Config(window_start=12, window_every_steps=10, max_new_tokens=40)
    assert [cfg.window(s) for s in (0, 9, 10, 19, 20, 29, 30, 10_000)] == [12, 12, 24, 24, 40, 40, 40, 40]
    assert RL1Config(window_start=None, max_new_tokens=40).window(999) == 40


def test_with_tier_puts_the_prompt_first_for_text_and_chat():
    tier = TierConfig(name="low", max_new_tokens=16, prompt="[{name}:{max_new_tokens}]")
    assert with_tier(Task("t", "Q:1+1. A:"), tier).prompt == "[low:16]Q:1+1. A:"
    chat = with_tier(Task("t", [{"role": "user", "content": "hi"}]), tier).prompt
    assert chat == [{"role": "system", "content": "[low:16]"}, {"role": "user", "content": "hi"}]
    sys_first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert with_tier(Task("t", sys_first), tier).prompt[0]["content"] == "[low:16]be brief"


def test_a_task_goes_to_the_lowest_tier_that_holds_its_shortest_solution():
    cfg = RL3Config(async_rollouts=False)  # caps 18 / 28 / 48
    algo = RingZeroRL(cfg, "rl3", known={"a": 10, "b": 18, "c": 19, "d": 28, "e": 29, "f": 400})
    assert [algo.tier_of(t) for t in "abcdefg"] == [0, 0, 1, 1, 2, 2, 2]  # g: never solved -> the last tier


def _traj(task: Task, text: str, ids: list[int], correct: bool, fmt: bool | None = True) -> Trajectory:
    c = Completion(text=text, token_ids=ids, prompt_token_ids=[7, 7])
    return Trajectory(task, [Turn("policy", text, c)], Verdict(score=float(correct), correct=correct, format_ok=fmt))


def test_the_store_keeps_each_tasks_shortest_correct_trace_with_its_stream_position():
    algo = RingZeroRL(RL1Config(), "rl1")
    algo.train_seed = 99
    a, b = Task("a", "Qa"), Task("b", "Qb")
    ro = Rollout(
        groups=[
            [_traj(a, "long", [1, 2, 3, 4], True), _traj(a, "short", [1, 2], True), _traj(a, "x", [1], False)],
            [_traj(b, "nofmt", [5], True, fmt=False), _traj(b, "ok", [5, 6, 7], True)],
        ],
        turn_verdicts=[[], []],
    )
    algo._record(ro, start=40)
    assert {k: (t.text, t.tokens, t.position, t.stream_seed) for k, t in algo.traces.items()} == {
        "a": ("short", 2, 40, 99), "b": ("ok", 3, 41, 99),
    }  # fmt: skip
    assert algo.known == {"a": 2, "b": 3}
    later = Rollout(groups=[[_traj(a, "longer", [1, 2, 3], True)]], turn_verdicts=[[]])
    algo._record(later, start=50)
    assert algo.traces["a"].text == "short"  # a longer correct trace does not replace it


def test_the_store_refuses_a_trace_of_unknown_correctness():
    # Kills: the store's check `correct is not True` weakened to `correct is False` (None recorded as correct).
    algo = RingZeroRL(RL1Config(), "rl1")
    algo.train_seed = 99
    a = Task("a", "Qa")
    unknown = _traj(a, "short", [1], True)
    unknown.verdict = Verdict(score=1.0, correct=None, format_ok=True)
    algo._record(Rollout(groups=[[unknown, _traj(a, "longer", [1, 2, 3], True)]], turn_verdicts=[[]]), start=0)
    assert {k: t.text for k, t in algo.traces.items()} == {"a": "longer"}
    assert algo.known == {"a": 3}


def test_known_lengths_keep_each_tasks_shortest_over_the_earlier_stages(tmp_path):
    # Kills: known_lengths keeping the longest (max for min) or the last stage's length.
    from types import SimpleNamespace

    from lrmgym.learners.algorithms.distill import Trace, write_traces
    from lrmgym.learners.algorithms.ring_zero import known_lengths

    def trace(task, n):
        return Trace(task, 0, 1, [7], list(range(n)), "t", n)

    records = []
    for k, traces in enumerate([[trace("a", 5), trace("b", 2)], [trace("a", 3), trace("b", 4)], [trace("a", 4)]]):
        folder = tmp_path / str(k)
        folder.mkdir()
        write_traces(folder / "traces.jsonl", traces)
        records.append(SimpleNamespace(folder=folder))
    assert known_lengths(SimpleNamespace(earlier=lambda: records)) == {"a": 3, "b": 2}


# --------------------------------------------------------------------------------------------------- the staged run
def _config(stages: str, **per_stage):
    cfg = resolve((*BASE, f"learner.stages={stages}"))
    learner = cfg.learner
    updates = {}
    for name in ("rl1", "rl2", "rl3"):
        stage = getattr(learner, name)
        updates[name] = type(stage).model_validate({**stage.model_dump(), **SMALL_RL, **per_stage.get(name, {})})
    sd = learner.sd.model_validate(
        {
            **learner.sd.model_dump(),
            "progress": False,
            "eval_greedy": False,
            "batch_size": 8,
            "epochs": 1,
            "checkpoint_every": 1,
            **per_stage.get("sd", {}),
        }
    )
    updates["sd"] = sd
    return cfg.model_copy(update={"learner": learner.model_copy(update=updates)})


def _run(cfg, run_dir, resume=False):
    cfg.learner.seed_torch(int(cfg.run.seed))
    return cfg.learner.build(build_context(cfg, run_dir)).run(resume=resume)


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_all_four_stages_run_in_one_directory_each_from_the_last_ones_weights(tmp_path, monkeypatch):
    from lrmgym.learners.algorithms.distill import SelfDistill

    cfg = _config("[rl1,sd,rl2,rl3]")
    base = build_context(cfg, tmp_path / "base").policy.model.state_dict()  # the policy as the run builds it
    sd_start, real_setup = {}, SelfDistill.setup

    def setup_and_look(self):
        sd_start.update({k: v.detach().clone() for k, v in self.loop.ctx.policy.model.state_dict().items()})
        return real_setup(self)

    monkeypatch.setattr(SelfDistill, "setup", setup_and_look)
    summary = _run(cfg, tmp_path / "run")
    tmp_path = tmp_path / "run"
    folders = sorted(p.name for p in (tmp_path / "stages").iterdir())
    assert folders == ["01-rl1", "02-sd", "03-rl2", "04-rl3"]
    assert [s["stage"] for s in summary["stages"]] == ["rl1", "sd", "rl2", "rl3"]
    assert [s["start"] for s in summary["stages"]] == ["base", "base", "02-sd", "03-rl2"]
    for folder in folders:
        assert (tmp_path / "stages" / folder / "stage.json").is_file()
        assert (tmp_path / "stages" / folder / "final.pt").is_file()
    rl1 = _lines(tmp_path / "stages/01-rl1/metrics.jsonl")
    assert [m["step"] for m in rl1] == [1, 2]
    for key in ("train_infer/logp_abs_diff", "entropy", "length/mean", "format_ok_frac", "all_failed_frac",
                "clip_frac", "kl_ref", "window"):  # fmt: skip
        assert key in rl1[0], key
    assert rl1[0]["window"] == 28  # the first window ("auto"): the longest reference of env=math, not 24
    traces = (tmp_path / "stages/01-rl1/traces.jsonl").read_text().splitlines()
    assert traces and summary["stages"][0]["outputs"]["traces"] == len(traces)
    rl3 = _lines(tmp_path / "stages/04-rl3/metrics.jsonl")
    assert sum(rl3[0][f"tier/{n}/tasks"] for n in ("low", "medium", "high")) == 4
    # RL-3 revisits RL-1's task stream, so the tasks RL-1 solved are tiered by their shortest solution.
    assert rl3[0]["tier/high/tasks"] < 4
    seeds = {json.loads(x)["stream_seed"] for f in ("01-rl1", "04-rl3")
             for x in (tmp_path / "stages" / f / "traces.jsonl").read_text().splitlines()}  # fmt: skip
    assert len(seeds) == 1
    tiers = summary["stages"][3]["outputs"]["tiers"]
    assert set(tiers) == {"low", "medium", "high"}
    assert (tmp_path / "stages/04-rl3/eval/tier_low/eval.json").is_file()
    # The SD stage trained the base model: it started from the base weights, not from RL-1's ...
    rl1_final = torch.load(tmp_path / "stages/01-rl1/final.pt", weights_only=True)
    assert sd_start.keys() == base.keys()
    assert all(torch.equal(sd_start[k], v) for k, v in base.items())
    assert not all(torch.equal(rl1_final[k], v) for k, v in base.items())  # (RL-1 did move the weights)
    # ... and its "before" is the base model's evaluation, handed on from RL-1's "before".
    assert summary["stages"][1]["before"] == summary["stages"][0]["before"]
    assert summary["evals"]["after"] == summary["stages"][3]["after"]
    assert json.loads((tmp_path / "summary.json").read_text())["learner"] == "ring_zero"


def test_a_kill_in_stage_three_resumes_stage_three_not_stage_one(tmp_path, monkeypatch):
    cfg = _config("[rl1,sd,rl2,rl3]", rl2={"steps": 3})
    real = loop_module.Loop.train_step

    def dies_in_rl2_step_3(self):
        if self.run_dir.name == "03-rl2" and self.step == 2:
            raise RuntimeError("killed")  # as a SIGKILL would, after step 2's checkpoint
        return real(self)

    monkeypatch.setattr(loop_module.Loop, "train_step", dies_in_rl2_step_3)
    with pytest.raises(RuntimeError, match="killed"):
        _run(cfg, tmp_path)
    assert not (tmp_path / "stages/03-rl2/stage.json").exists()
    assert not (tmp_path / "stages/04-rl3").exists()
    before = {name: (tmp_path / "stages" / name / "metrics.jsonl").read_bytes() for name in ("01-rl1", "02-sd")}
    sd_weights = torch.load(tmp_path / "stages/02-sd/final.pt", weights_only=True)

    monkeypatch.setattr(loop_module.Loop, "train_step", real)
    started = []
    real_run = loop_module.Loop.run
    monkeypatch.setattr(loop_module.Loop, "run", lambda self, resume=False: started.append(
        (self.run_dir.name, resume)) or real_run(self, resume))  # fmt: skip
    summary = _run(cfg, tmp_path, resume=True)
    assert started == [("03-rl2", True), ("04-rl3", False)]  # stages 1 and 2 are not run again
    for name, data in before.items():
        assert (tmp_path / "stages" / name / "metrics.jsonl").read_bytes() == data
    assert [m["step"] for m in _lines(tmp_path / "stages/03-rl2/metrics.jsonl")] == [1, 2, 3]
    assert [s["stage"] for s in summary["stages"]] == ["rl1", "sd", "rl2", "rl3"]
    assert summary["stages"][2]["steps"] == 3 and summary["stages"][2]["start"] == "02-sd"
    again = torch.load(tmp_path / "stages/02-sd/final.pt", weights_only=True)
    assert all(torch.equal(again[k], v) for k, v in sd_weights.items())  # the finished stage was left alone


def test_a_resume_may_append_stages_but_not_reorder_them(tmp_path):
    _run(_config("[rl1]"), tmp_path)
    rl1_metrics = (tmp_path / "stages/01-rl1/metrics.jsonl").read_bytes()
    (tmp_path / "stages/01-rl1/stage.json").unlink()  # killed after its last step, before the stage was recorded
    summary = _run(_config("[rl1,sd]"), tmp_path, resume=True)
    assert [s["stage"] for s in summary["stages"]] == ["rl1", "sd"]
    assert (tmp_path / "stages/01-rl1/metrics.jsonl").read_bytes() == rl1_metrics  # no step trained again
    with pytest.raises(ValueError, match="02-sd"):
        _run(_config("[rl1,rl2]"), tmp_path, resume=True)


def test_a_staged_run_holds_its_directory_lock_through_every_stage(tmp_path, monkeypatch):
    import os

    from learner_helpers import lock_seen_from_another_process

    seen, real = {}, loop_module.Loop.train_step

    def step_and_look(self):
        if self.step == 0:
            seen[self.run_dir.name] = (lock_seen_from_another_process(tmp_path), (self.run_dir / "run.lock").exists())
        return real(self)

    monkeypatch.setattr(loop_module.Loop, "train_step", step_and_look)
    _run(_config("[rl1,rl2]", rl1={"steps": 1}, rl2={"steps": 1}), tmp_path)
    refused = f"'{tmp_path}' is in use: process {os.getpid()} is training in it"
    assert {k: (v[0].startswith(refused), v[1]) for k, v in seen.items()} == {
        "01-rl1": (True, False),
        "02-rl2": (True, False),  # one lock, the run directory's; none in a stage folder
    }
    assert not (tmp_path / "run.lock").exists()


# --------------------------------------------------------------------------------------------------- tier markers
def _tier_rollouts(marker, monkeypatch):
    """The (prompt, cap) of every task one RL-3 step samples, with tier_marker=``marker``."""
    from types import SimpleNamespace

    from lrmgym.learners.algorithms import ring_zero_rl

    seen = []

    def fake_rollout(env, policy, tasks, g, sampling, turns):
        seen.extend((t.prompt, sampling.max_new_tokens) for t in tasks)
        return Rollout([[] for _ in tasks], [[] for _ in tasks], 0.0, 0.0)

    monkeypatch.setattr(ring_zero_rl, "rollout", fake_rollout)
    algo = RingZeroRL(RL3Config(async_rollouts=False, tier_marker=marker), "rl3", known={"a": 10, "b": 25})
    algo.loop = SimpleNamespace(step=0, ctx=SimpleNamespace(seed=1))
    algo.env = algo.policy = None
    algo.turns, algo.data_pos = 1, 0
    algo._tasks = lambda pos: [Task("a", "Q:1+1. A:"), Task("b", "Q:9+9. A:"), Task("c", "Q:3+4. A:")]
    algo._collect_tiers()
    return sorted(seen, key=lambda x: x[0][-9:])


def test_cap_tiers_keep_the_models_own_prompt_and_set_only_the_cap(monkeypatch):
    assert RL3Config(async_rollouts=False).tier_marker == "cap"  # in distribution by default
    assert _tier_rollouts("cap", monkeypatch) == [("Q:1+1. A:", 18), ("Q:3+4. A:", 48), ("Q:9+9. A:", 28)]
    algo = RingZeroRL(RL3Config(async_rollouts=False), "rl3")
    assert algo.tiered(Task("a", "Q:1. A:"), algo.tiers[0]).prompt == "Q:1. A:"  # the per-tier evaluation too


def test_prompt_tiers_still_put_the_tier_prompt_first(monkeypatch):
    low, medium, high = (t.text() for t in RL3Config(async_rollouts=False).tiers)
    assert _tier_rollouts("prompt", monkeypatch) == [
        (low + "Q:1+1. A:", 18), (high + "Q:3+4. A:", 48), (medium + "Q:9+9. A:", 28),
    ]  # fmt: skip


def test_the_preset_tiers_by_cap_and_takes_the_old_marker():
    assert resolve(BASE).learner.rl3.tier_marker == "cap"
    assert resolve((*BASE, "learner.rl3.tier_marker=prompt")).learner.rl3.tier_marker == "prompt"
    with pytest.raises(ConfigError, match="tier_marker"):
        resolve((*BASE, "learner.rl3.tier_marker=style"))
