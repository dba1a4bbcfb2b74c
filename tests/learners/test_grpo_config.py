"""GRPOConfig validation and the learner preset."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from lrmgym.learners.algorithms.grpo import GRPOConfig


def test_preset_resolves_to_grpo_config():
    from lrmgym.configs.resolve import resolve

    cfg = resolve(["env=echo", "policy=mock", "learner=grpo", "learner.lr=5e-5"])
    assert isinstance(cfg.learner, GRPOConfig)
    assert cfg.learner.lr == 5e-5 and cfg.learner.group_size == 8 and cfg.learner.torch_threads == 1


def test_every_field_has_help():
    for name, field in GRPOConfig.model_fields.items():
        assert field.description, name


@pytest.mark.parametrize(
    ("kwargs", "where"),
    [({"group_size": 1}, "group_size"), ({"temperature": 0.0}, "temperature"), ({"lr": -1.0}, "lr"),
     ({"loss_agg": "sum"}, "loss_agg"), ({"typo": 1}, "typo")],
)  # fmt: skip
def test_bad_values_are_rejected(kwargs, where):
    with pytest.raises(ValidationError, match=where):
        GRPOConfig(**kwargs)


def test_minibatches_cannot_exceed_trajectories():
    msg = "minibatches=9 exceeds the trajectories per step (prompts_per_step x group_size = 8); lower minibatches."
    with pytest.raises(ValidationError, match=re.escape(msg)):
        GRPOConfig(prompts_per_step=4, group_size=2, minibatches=9)


def test_adam_betas_outside_0_1_are_refused_with_the_range():
    import re

    from lrmgym.configs.resolve import ConfigError, resolve

    message = "learner.adam_betas: invalid value [1.5, 0.9]: AdamW betas must each be in [0, 1), e.g. [0.9, 0.99]."
    with pytest.raises(ConfigError, match=re.escape(message)):
        resolve(["env=echo", "policy=mock", "learner.adam_betas=[1.5,0.9]"])
