"""Turn a resolved :class:`~lrmgym.configs.schema.RunConfig` into live objects: the env with its judges."""

from __future__ import annotations

from typing import Any

from lrmgym.configs.schema import RunConfig


def make_env(config: RunConfig) -> Any:
    """Make the configured env and wrap it in the configured judges (none: the env's own verifier alone)."""
    env = config.env.make()
    if not config.judge:
        return env
    from lrmgym.judges.base import JudgedEnv

    return JudgedEnv(env, [judge.build() for judge in config.judge.values()])
