"""The function registries: lookup errors, registration, config validation of registered names."""

from __future__ import annotations

import re
from typing import Annotated

import pytest
import torch
from pydantic import BaseModel, ValidationError

from lrmgym.compose import train
from lrmgym.learners.algorithms.advantages import GROUP_ADVANTAGES
from lrmgym.learners.algorithms.grpo import GRPOConfig
from lrmgym.learners.algorithms.losses import POLICY_LOSSES, PolicyLossOutput, policy_loss, register_policy_loss
from lrmgym.learners.engine.registry import FunctionRegistry, accepted_options


def _registry() -> FunctionRegistry:
    reg: FunctionRegistry = FunctionRegistry("widget", "my.register_widget")

    @reg.register("alpha")
    def alpha() -> int:
        return 1

    @reg.register("beta_two")
    def beta_two() -> int:
        return 2

    return reg


def test_lookup_register_and_mapping():
    reg = _registry()
    assert reg.lookup("alpha")() == 1 and reg["beta_two"]() == 2
    assert list(reg) == ["alpha", "beta_two"] and len(reg) == 2 and "alpha" in reg and "gamma" not in reg
    assert repr(reg) == "FunctionRegistry('widget': alpha, beta_two)"


@pytest.mark.parametrize(
    ("name", "hint"),
    [("alpah", " Did you mean 'alpha'?"), ("beta", " Did you mean 'beta_two'?"), ("zzz", ""), (3, "")],
)
def test_unknown_name_names_it_the_known_ones_and_the_fix(name, hint):
    msg = (
        f"unknown widget {name!r}; known: alpha, beta_two.{hint} "
        "Use one of these, or register a new one with @my.register_widget(name)."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        _registry().lookup(name)


def test_a_name_is_taken_once():
    reg = _registry()
    with pytest.raises(ValueError, match=r"^widget 'alpha' is already registered \(.*alpha\); register the new one"):
        reg.register("alpha")(lambda: 3)
    assert reg.lookup("alpha")() == 1


def test_registry_as_pydantic_metadata():
    class Cfg(BaseModel):
        widget: Annotated[str, _registry()] = "alpha"

    assert Cfg(widget="beta_two").widget == "beta_two"
    with pytest.raises(ValidationError, match=re.escape("unknown widget 'gamma'; known: alpha, beta_two.")):
        Cfg(widget="gamma")


def test_accepted_options_passes_only_named_keywords():
    def fixed(a, *, clip_high=0.2):
        return clip_high

    def anything(a, **kw):
        return kw

    assert accepted_options(fixed, clip_low=0.1, clip_high=0.3) == {"clip_high": 0.3}
    assert accepted_options(anything, clip_low=0.1) == {"clip_low": 0.1}


# ------------------------------------------------------------------------------------------------ the GRPO learner
@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_grpo_config_takes_every_policy_loss(name):
    assert GRPOConfig(pg_loss=name).pg_loss == name


@pytest.mark.parametrize("name", GROUP_ADVANTAGES.names())
def test_grpo_config_takes_every_group_estimator(name):
    assert GRPOConfig(adv_estimator=name).adv_estimator == name


def test_grpo_config_refuses_unknown_names_on_the_command_line():
    from lrmgym.configs.resolve import ConfigError, resolve

    msg = (
        "learner.adv_estimator: invalid value 'gae': unknown group advantage estimator 'gae'; known: dr_grpo, grpo, "
        "reinforce_pp, reinforce_pp_baseline, rloo. Use one of these, or register a new one with "
        "@lrmgym.learners.algorithms.advantages.register_advantage(name)."
    )
    with pytest.raises(ConfigError, match=f"^{re.escape(msg)}$"):
        resolve(["env=echo", "policy=mock", "learner.adv_estimator=gae"])
    msg = (
        "learner.pg_loss: invalid value 'ppo': unknown policy loss 'ppo'; known: cispo, gspo, ppo_clip, reinforce. "
        "Did you mean 'ppo_clip'? Use one of these, or register a new one with "
        "@lrmgym.learners.algorithms.losses.register_policy_loss(name)."
    )
    with pytest.raises(ConfigError, match=f"^{re.escape(msg)}$"):
        resolve(["env=echo", "policy=mock", "learner.pg_loss=ppo"])


def test_a_registered_loss_is_a_config_value_and_gets_the_clip_knobs_it_names():
    seen = {}

    def halved(logp, old_logp, advantages, mask, *, clip_high):
        seen["clip_high"] = clip_high
        loss = -0.5 * advantages.unsqueeze(-1) * logp
        return PolicyLossOutput(loss=loss, clipped=torch.zeros_like(mask), ratio=torch.ones_like(logp))

    register_policy_loss("test_halved")(halved)
    try:
        assert GRPOConfig(pg_loss="test_halved").pg_loss == "test_halved"
        out = policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1), kind="test_halved", clip_high=0.3)
        assert seen == {"clip_high": 0.3} and out.loss.shape == (1, 2)
    finally:
        POLICY_LOSSES._functions.pop("test_halved")


@pytest.mark.parametrize(("pg_loss", "adv"), [("gspo", "reinforce_pp"), ("reinforce", "reinforce_pp_baseline")])
def test_the_learner_trains_with_the_new_entries(tmp_path, pg_loss, adv):
    import json
    import math

    from learner_helpers import register_test_env, run_config

    register_test_env()
    cfg = run_config(GRPOConfig(
        steps=1, prompts_per_step=3, group_size=4, max_new_tokens=6, eval_before_after=False, progress=False,
        pg_loss=pg_loss, adv_estimator=adv, clip_low=3e-4, clip_high=4e-4, epochs=2,
    ))  # fmt: skip
    train(cfg, tmp_path, resume=False)
    line = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert math.isfinite(line["loss"]) and math.isfinite(line["grad_norm"]) and line["grad_norm"] > 0
