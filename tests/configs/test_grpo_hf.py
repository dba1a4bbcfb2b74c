"""learner=grpo_hf holds real-model values, and tiny-model values meeting policy=hf draw a one-line warning."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from lrmgym.cli.main import cli
from lrmgym.configs.resolve import resolve, tiny_tuned_warning

HF = ("policy=hf", "policy.model=Qwen/Qwen2.5-1.5B")


def test_grpo_hf_has_real_model_defaults_and_a_small_evaluation():
    cfg = resolve(("learner=grpo_hf", *HF))
    learner = cfg.learner
    assert (learner.kind, learner.lr, learner.max_new_tokens) == ("grpo", 1e-6, 1024)
    assert learner.time_budget_s is None and not learner.async_rollouts and not learner.track_kl
    assert learner.micro_batch_tokens == 8192 and not learner.eval_greedy
    assert (cfg.eval.tasks, cfg.eval.n, cfg.eval.max_new_tokens) == (100, 1, 1024)
    again = resolve(("learner=grpo_hf", *HF, "eval.tasks=7", "learner.lr=2e-6"))  # overrides win over the preset
    assert (again.eval.tasks, again.eval.n, again.learner.lr) == (7, 1, 2e-6)
    assert resolve(("learner=grpo", *HF)).eval.tasks == 500  # other presets keep the eval defaults


def test_tiny_tuned_values_with_policy_hf_draw_one_line():
    line = tiny_tuned_warning(resolve(("learner=grpo", *HF)))
    assert line is not None and "\n" not in line and "learner=grpo_hf" in line
    for key in ("learner.lr=0.0004", "learner.max_new_tokens=48", "async_rollouts=True"):
        assert key in line
    assert "time_budget_s" not in line  # the default preset trains a fixed number of steps, with no time budget
    budget = tiny_tuned_warning(resolve(("learner=grpo", *HF, "learner.time_budget_s=530")))
    assert budget is not None and "learner.time_budget_s=530" in budget
    assert tiny_tuned_warning(resolve(("learner=grpo_hf", *HF))) is None
    assert tiny_tuned_warning(resolve(("learner=grpo",))) is None  # the tiny model: these values are its own
    fixed = ("learner.lr=1e-6", "learner.max_new_tokens=1024", "learner.time_budget_s=null")
    fixed += ("learner.async_rollouts=false",)
    assert tiny_tuned_warning(resolve(("learner=grpo", *HF, *fixed))) is None
    only_lr = tiny_tuned_warning(resolve(("learner=grpo", *HF, *fixed[1:])))
    assert only_lr is not None and "learner.lr=0.0004" in only_lr and "max_new_tokens" not in only_lr


@pytest.mark.parametrize(("learner", "warned", "code"), [("grpo_hf", False, 0), ("grpo", True, 2)])
def test_the_readme_export_needs_no_overrides_with_grpo_hf(tmp_path, learner, warned, code):
    out = tmp_path / "orl"
    args = ["export", "openrlhf", "env=math", "judge=[accuracy,format_strict]", f"learner={learner}", *HF,
            "backend.gpus_per_node=8", "env.source=procedural", f"out={out}"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == code, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: policy=hf")]
    assert len(warnings) == int(warned)
    assert (out / "launch.sh").is_file() == (code == 0)  # grpo.yaml's budget and async rollouts are refused


def test_dapo_hf_is_grpo_hf_with_dapos_keys():
    from lrmgym.configs.resolve import load_preset

    grpo, dapo = load_preset("learner", "grpo_hf"), load_preset("learner", "dapo_hf")
    changed = {k: v for k, v in dapo.items() if grpo.get(k) != v}
    assert changed == {"kind": "dapo", "loss_agg": "token_mean", "dynamic_sampling": True}
    cfg = resolve(("learner=dapo_hf", *HF))
    assert cfg.learner.kind == "dapo" and cfg.eval.tasks == 100 and tiny_tuned_warning(cfg) is None
