"""A trained run read back: its policy with a checkpoint's weights, and the commands that evaluate and export it.

``policy.path=RUN`` loads the policy; the run's summary prints the commands.

Between the composition root and the learners: it rebuilds a policy from a run's ``config.yaml`` (configs) and
reads its checkpoints (the learners' run directory). ``lrmgym export hf``
(:mod:`lrmgym.integrations.hf_export`) writes the policy this module loads as a transformers folder.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["HFExportError", "is_run_dir", "load_run_policy", "model_commands", "run_checkpoint"]


class HFExportError(ValueError):
    """The run cannot be exported or loaded as asked; the message is one line: what, why and the fix."""


def is_run_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is the directory of a ``lrmgym run`` (a config.yaml with checkpoints or metrics beside it)."""
    path = Path(path).expanduser()
    has_log = (path / "checkpoints").is_dir() or (path / "metrics.jsonl").is_file() or (path / "stages").is_dir()
    return (path / "config.yaml").is_file() and has_log


def run_checkpoint(run_dir: Path, step: int | None) -> tuple[Path, int]:
    """The checkpoint file of ``step`` (default: the newest) in ``run_dir``."""
    from lrmgym.learners.engine.rundir import Checkpointer

    if not run_dir.is_dir():
        raise HFExportError(f"RUN {str(run_dir)!r} is not a directory; give the directory of a `lrmgym run`.")
    if not is_run_dir(run_dir):
        raise HFExportError(
            f"RUN {str(run_dir)!r} is not a run directory (no config.yaml with checkpoints/ beside it); give the "
            "directory of a `lrmgym run`."
        )
    checkpoints = Checkpointer(run_dir / "checkpoints")
    steps = checkpoints.steps()
    if not steps:
        if (run_dir / "stages").is_dir():
            raise HFExportError(
                f"RUN {str(run_dir)!r} is a staged run; its checkpoints are per stage and its final weights are "
                "its last stage's. Evaluate it as it ran, or train a plain run to export."
            )
        raise HFExportError(
            f"RUN {str(run_dir)!r} has no checkpoint (checkpoints/step_N.pt); it stopped before its first one. "
            "Resume it (`lrmgym run --resume RUN`) or train again."
        )
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise HFExportError(
            f"--step {step}: RUN {str(run_dir)!r} has no checkpoint of that step; it has step(s) "
            f"{', '.join(map(str, steps))} (learner.keep_checkpoints keeps the newest few)."
        )
    return checkpoints.path(step), step


def _policy_config(run_dir: Path, device: str | None) -> Any:
    """The run's policy config, validated from its config.yaml (with ``device`` when given)."""
    import yaml

    from lrmgym.configs.errors import ConfigError
    from lrmgym.configs.resolve import validate_component

    config_path = run_dir / "config.yaml"
    try:
        raw = yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}
        policy = validate_component("policy", "policy", raw.get("policy") if isinstance(raw, dict) else None)
    except (yaml.YAMLError, UnicodeDecodeError, ConfigError) as err:
        first = (str(err).splitlines() or ["unreadable"])[0]
        raise HFExportError(f"{config_path}: its policy section cannot be read ({first}).") from None
    if device is not None and "device" in type(policy).model_fields:
        policy = policy.model_copy(update={"device": device})
    return policy


def load_run_policy(run_dir: str | os.PathLike, step: int | None = None, device: str | None = None) -> Any:
    """The policy of run ``run_dir`` with the weights of its checkpoint of ``step`` (default: the newest).

    The policy is rebuilt from the run's ``config.yaml`` (its base model must still be where the run found it),
    then the checkpoint's ``model`` state is loaded into it, strictly. ``device`` overrides the run's
    ``policy.device``.

    Raises:
        HFExportError: ``run_dir`` is not a run directory, has no such checkpoint, or its checkpoint holds no
            policy weights.
    """
    import torch

    run_dir = Path(run_dir).expanduser()
    path, step = run_checkpoint(run_dir, step)
    policy_cfg = _policy_config(run_dir, device)
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)  # our own file: it holds RNG states too
    except Exception as err:  # noqa: BLE001 - any failure to read is "this checkpoint does not load"
        raise HFExportError(f"{path} does not load ({type(err).__name__}); export another --step.") from None
    weights = state.get("model") if isinstance(state, dict) else None
    if not isinstance(weights, dict):
        raise HFExportError(
            f"{path} holds no policy weights (a 'model' state); this learner's checkpoints "
            f"({', '.join(sorted(state)) if isinstance(state, dict) else 'unknown'}) cannot be exported."
        )
    base = getattr(policy_cfg, "path", None)
    if getattr(policy_cfg, "kind", None) == "tiny" and base and is_run_dir(base):
        policy = load_run_policy(base, device=device)  # a run that continued another run's model
    else:
        if callable(getattr(policy_cfg, "needs_build", None)) and policy_cfg.needs_build():
            raise HFExportError(f"RUN {str(run_dir)!r}: its base tiny model is no longer cached; run the run again.")
        policy = policy_cfg.build()
    policy.model.load_state_dict(weights)
    policy.model.eval()
    return policy


def _token(key: str, value: Any) -> str:
    """``key=value`` as the resolver parses it back (YAML flow scalars and collections)."""
    import yaml

    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return f"{key}={text.removesuffix('...').strip()}"


def _section_tokens(section: str, current: dict[str, Any], default: dict[str, Any]) -> list[str]:
    return [_token(f"{section}.{k}", v) for k, v in current.items() if default.get(k, object()) != v]


def _env_tokens(env: dict[str, Any]) -> list[str]:
    """The shortest ``env=PRESET env.KEY=VALUE ...`` tokens that resolve to the env section ``env``.

    Raises:
        HFExportError: No env preset has the env's id (an env registered by a plugin or a test).
    """
    from lrmgym.configs.errors import ConfigError
    from lrmgym.configs.resolve import list_presets, resolve

    best: list[str] | None = None
    for preset in list_presets("env"):
        try:
            candidate = resolve([f"env={preset}"]).env.model_dump(mode="json")
        except (ConfigError, ValueError, OSError):
            continue  # a preset whose data is not here
        if candidate.get("id") != env.get("id"):
            continue
        tokens = [f"env={preset}", *_section_tokens("env", env, candidate)]
        if best is None or len(tokens) < len(best):
            best = tokens
    if best is None:
        raise HFExportError(f"no env preset of {env.get('id')!r}; an `lrmgym eval` command cannot name this env")
    return best


def model_commands(run_dir: str | os.PathLike, config: Any) -> dict[str, str]:
    """The exact commands that evaluate and export run ``run_dir``'s trained model (for its summary).

    ``eval``: ``lrmgym eval`` of the run's env and eval settings on ``policy.path=RUN``; ``export``: ``lrmgym export
    hf`` into ``exports/<run name>-hf``; ``eval_export``: the same evaluation of that folder under ``policy=hf``.
    Empty for a run directory without config.yaml (a stage of a staged run) or a config without env and eval; only
    ``export`` for an env no preset names (a plugin's: its eval tokens are the user's to give).
    """
    import shlex

    from lrmgym.configs.errors import ConfigError
    from lrmgym.configs.resolve import resolve

    run_dir = Path(run_dir)
    env, evaluation = getattr(config, "env", None), getattr(config, "eval", None)
    if not (run_dir / "config.yaml").is_file() or env is None or evaluation is None:
        return {}
    out = Path("exports") / f"{run_dir.name}-hf"

    def command(*tokens: str) -> str:
        return shlex.join(["lrmgym", *tokens])

    commands = {"export": command("export", "hf", str(run_dir), f"out={out}")}
    try:
        settings = _env_tokens(env.model_dump(mode="json"))
        default_eval = resolve(settings).eval.model_dump(mode="json")  # an env preset may set eval values of its own
    except (HFExportError, ConfigError):
        return commands  # no command names this env
    settings += _section_tokens("eval", evaluation.model_dump(mode="json"), default_eval)
    commands["eval"] = command("eval", *settings, f"policy.path={run_dir}")
    commands["eval_export"] = command("eval", *settings, "policy=hf", f"policy.model={out}")
    return commands
