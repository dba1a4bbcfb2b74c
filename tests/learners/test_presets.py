"""The learner presets: each resolves, each variant is grpo.yaml with only its algorithm's keys changed, each trains."""

from __future__ import annotations

import json

import pytest
from learner_helpers import register_test_env, run_config

import lrmgym.compose as compose
from lrmgym.compose import train
from lrmgym.configs.resolve import ConfigError, list_presets, load_preset, resolve
from lrmgym.core import Verdict

register_test_env()
BASE = ("env=echo", "policy=mock")
_MISSING = object()

VARIANTS = {
    "dapo": {"kind": "dapo", "clip_high": 0.28, "loss_agg": "token_mean", "dynamic_sampling": True,
             "async_rollouts": False},
    "dr_grpo": {"adv_estimator": "dr_grpo", "loss_agg": "seq_mean_token_sum_norm"},
    "rloo": {"adv_estimator": "rloo", "loss_agg": "seq_mean_token_sum_norm"},
    "gspo": {"pg_loss": "gspo", "clip_low": 3e-4, "clip_high": 4e-4},
    "cispo": {"pg_loss": "cispo", "clip_high": 4.0, "loss_agg": "token_mean"},
    "reinforce_pp": {"adv_estimator": "reinforce_pp"},
}  # fmt: skip
"""Per variant, the keys whose values differ from grpo.yaml (papers.md §4), and those values."""


REQUIRED = {"kl_distill": ("learner.teacher=tiny",)}
"""Presets that leave a key to the user (the model to distil from): resolved with it given."""


@pytest.mark.parametrize("name", list_presets("learner"))
def test_every_learner_preset_resolves(name):
    given = REQUIRED.get(name, ())
    if given:  # without it, the error names the key to set
        with pytest.raises(ConfigError, match=rf"^{given[0].split('=')[0]}: missing required key"):
            resolve((*BASE, f"learner={name}"))
    cfg = resolve((*BASE, f"learner={name}", *given))
    assert cfg.learner.kind == load_preset("learner", name)["kind"]
    if cfg.learner.kind == "ring_zero":  # a staged learner: the steps are each stage's
        again = resolve((*BASE, f"learner={name}", "learner.rl1.steps=7"))
        assert again.learner.rl1.steps == 7
        return
    again = resolve((*BASE, f"learner={name}", *given, "learner.steps=7"))  # and takes overrides like any preset
    assert again.learner.steps == 7


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_variant_is_grpo_yaml_with_its_algorithm_keys_changed(name):
    grpo, preset = load_preset("learner", "grpo"), load_preset("learner", name)
    assert "idle_steps_per_s" not in preset  # the default run's measured speed is grpo.yaml's own
    grpo.pop("idle_steps_per_s")
    changed = {k: v for k, v in preset.items() if grpo.get(k, _MISSING) != v}
    assert changed == VARIANTS[name]
    assert set(grpo) <= set(preset)  # the budget, batch and model settings are all there, unchanged
    # The resolved config agrees (a typo in a key would fail validation; a key left at its default is checked).
    learner = resolve((*BASE, f"learner={name}")).learner
    assert {k: getattr(learner, k) for k in VARIANTS[name]} == VARIANTS[name]


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_variant_says_what_it_is(name):
    text = (_preset_dir() / f"{name}.yaml").read_text()
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    assert text.startswith("# ") and "arxiv.org/abs/" in header and "grpo.yaml" in header
    for key in VARIANTS[name]:
        assert f"{key}:" in header, f"{name}.yaml's header does not say it changes {key}"


def _preset_dir():
    from importlib import resources

    return resources.files("lrmgym.configs") / "presets" / "learner"


class _Graded:
    """A judge-wrapper stand-in: sample j of a group scores j / (G - 1), except task 0's samples, all 0 (the
    random test model rarely writes an 'a', so the test env's own rewards would leave most groups flat)."""

    def __init__(self, env):
        self.env = env

    def __getattr__(self, name):
        return getattr(self.env, name)

    def score_group(self, task, completions):
        flat = task.id == "counta/0"
        return [Verdict(score=0.0 if flat else j / (len(completions) - 1)) for j in range(len(completions))]


@pytest.mark.parametrize("name", ["grpo", *sorted(VARIANTS)])
def test_a_preset_trains_two_steps_on_the_test_env(tmp_path, monkeypatch, name):
    real = compose.build_env
    monkeypatch.setattr(compose, "build_env", lambda config: _Graded(real(config)))
    learner = resolve((*BASE, f"learner={name}")).learner
    small = dict(
        steps=2, prompts_per_step=3, group_size=4, max_new_tokens=8, time_budget_s=None, async_rollouts=False,
        eval_before_after=False, progress=False, checkpoint_every=2, track_kl_every=1,
    )  # fmt: skip
    learner = type(learner).model_validate({**learner.model_dump(), **small})
    summary = train(run_config(learner), tmp_path)
    assert summary["status"] == "finished" and summary["learner"] == ("dapo" if name == "dapo" else "grpo")
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    assert all(m["grad_norm"] is not None and m["grad_norm"] > 0 for m in lines)
    assert lines[1]["kl_ref"] > 0  # the first update moved the policy


def test_the_default_run_trains_a_fixed_number_of_steps():
    # `lrmgym run env=math learner=grpo`: the same steps at any load (the time budget is an option), with the
    # idle machine's speed to print the expected finish time and compare the run's speed against.
    learner = resolve(("env=math", "learner=grpo")).learner
    assert learner.time_budget_s is None and learner.steps == 1000 and learner.idle_steps_per_s == 1.9
    assert resolve(("env=math", "learner=grpo", "learner.time_budget_s=530")).learner.time_budget_s == 530


@pytest.mark.parametrize(
    ("extra", "idle"),
    [
        ((), 1.9),
        (("learner.steps=60", "learner.time_budget_s=530", "eval.tasks=100", "run.seed=1", "learner.lr=1e-4"), 1.9),
        (("policy=hf", "policy.model=/path/to/model"), None),  # another model: 1.9 steps/s would be fiction
        (("judge=arena",), None),
        (("env=code",), None),
        (("learner.group_size=16",), None),
        (("policy.path=/elsewhere",), None),
        (("policy=hf", "policy.model=/path/to/model", "learner.idle_steps_per_s=0.1"), 0.1),  # the user's own
    ],
)
def test_the_idle_speed_holds_only_for_the_run_it_was_measured_on(extra, idle):
    assert resolve(("env=math", "learner=grpo", *extra)).learner.idle_steps_per_s == idle
