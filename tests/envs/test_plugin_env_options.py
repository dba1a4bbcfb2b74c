"""Plug-in envs: chosen with ``env=<id>``, and their options checked like a built-in env's."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from pydantic import BaseModel

import lrmgym
from lrmgym.configs.resolve import ConfigError, resolve
from lrmgym.core import Task, TextEnv, Verdict


class LaxConfig(BaseModel):  # pydantic's default: extra keys are ignored (dropped)
    size: int = 3
    """How big."""


class LaxEnv(TextEnv):
    """A plug-in whose Config does not forbid extra keys."""

    Config = LaxConfig

    def make_task(self, index, rng):
        return Task(id=f"lax/{index}", prompt="say 1", answer="1")

    def verify(self, task, completion):
        return Verdict(score=1.0, correct=True)


@dataclass
class PlainConfig:
    level: int = 1


class PlainEnv(LaxEnv):
    """A plug-in whose Config is a dataclass, not a pydantic model."""

    Config = PlainConfig


lrmgym.register("acmetest/Lax-v0", LaxEnv)
lrmgym.register("acmetest/Plain-v1", PlainEnv)


def test_env_equals_a_plugin_id_selects_it():
    cfg = resolve(["env=acmetest/Lax-v0", "policy=mock", "env.size=5"])
    assert cfg.env.id == "acmetest/Lax-v0" and cfg.env.options == {"size": 5}
    assert resolve(["env=Echo-v0", "policy=mock"]).env.id == "lrmgym/Echo-v0"  # a built-in id works too
    assert resolve(["env=echo", "policy=mock"]).env.id == "lrmgym/Echo-v0"  # presets win over ids


def test_an_unknown_env_token_lists_presets_and_ids():
    with pytest.raises(ConfigError) as err:
        resolve(["env=acmetest/Lox-v0", "policy=mock"])
    assert str(err.value).startswith("env: unknown preset or environment id 'acmetest/Lox-v0'; presets: code, ")
    assert str(err.value).endswith("Did you mean 'acmetest/Lax-v0'?")


def test_a_plugin_configs_unknown_key_is_refused_not_dropped():
    message = "env.sise: unknown key (value 5); allowed: size. Did you mean 'size'?"
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        resolve(["env=acmetest/Lax-v0", "policy=mock", "env.sise=5"])
    with pytest.raises(TypeError, match=re.escape("LaxEnv has no option 'sise'; its options are size.")):
        lrmgym.make("acmetest/Lax-v0", sise=5)


def test_a_non_pydantic_config_is_checked_by_constructing_it():
    assert resolve(["env=acmetest/Plain-v1", "policy=mock", "env.level=2"]).env.options == {"level": 2}
    with pytest.raises(ConfigError, match=r"^env: the options of acmetest/Plain-v1 are refused by its Config: "):
        resolve(["env=acmetest/Plain-v1", "policy=mock", "env.levle=2"])


def test_nan_in_a_plugin_option_is_refused():
    with pytest.raises(ConfigError, match=r"^env\.size: invalid value nan: must be finite"):
        resolve(["env=acmetest/Lax-v0", "policy=mock", "env.size=.nan"])
