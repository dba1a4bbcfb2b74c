"""Name a model on the command line or in a config: a model folder, a run directory of ``lrmgym run``, or tiny.

``lrmgym analyze shift`` (``--base``, ``--rl``) and ``learner=kl_distill`` (``learner.teacher``, through the run
context's ``load_model``, :func:`lrmgym.compose.load_named_model`) take a model as one string; :func:`locate_model`
checks what it names without loading anything, :func:`load_located` builds the policy with the run's newest
weights. Every user mistake is a one-line :class:`ModelLocateError` (a
``ValueError``) that starts with the option's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

__all__ = ["MODEL_HELP", "LocatedModel", "ModelLocateError", "load_located", "locate_model"]

MODEL_HELP = (
    "a model folder (config.json + weights: loaded as policy=hf policy.model=PATH), a run directory of "
    "`lrmgym run` (its newest checkpoint's weights in the run's own policy), or tiny (the shipped default model)"
)


class ModelLocateError(ValueError):
    """A model name that names no usable model; the message is one line starting with the option."""


def _newest_weights(run_dir: Path) -> tuple[Path, str] | None:
    """The newest weights file of a run and what it is: ``checkpoints/step_N.pt``, else the latest stage's."""
    from lrmgym.learners.engine.rundir import Checkpointer
    from lrmgym.learners.engine.staged import FINAL_WEIGHTS, STAGES_DIR

    folders = [run_dir]
    if (run_dir / STAGES_DIR).is_dir():
        folders += sorted((p for p in (run_dir / STAGES_DIR).iterdir() if p.is_dir()), reverse=True)
    for folder in folders:
        stage = "" if folder == run_dir else f"stage {folder.name}, "
        if stage and (folder / FINAL_WEIGHTS).is_file():
            return folder / FINAL_WEIGHTS, f"the end of stage {folder.name}"
        checkpoints = Checkpointer(folder / "checkpoints")
        if checkpoints.steps():
            return checkpoints.path(checkpoints.steps()[-1]), f"{stage}step {checkpoints.steps()[-1]}"
    return None


def _load_weights(path: Path, option: str) -> dict[str, Any]:
    """The model state dict in ``path``: a checkpoint's ``state["model"]``, or a stage's ``final.pt`` itself."""
    import torch

    from lrmgym.learners.engine.staged import FINAL_WEIGHTS

    final = path.name == FINAL_WEIGHTS  # a bare state dict; a checkpoint also holds RNG states (not weights only)
    try:
        state = torch.load(path, map_location="cpu", weights_only=final)
    except Exception as err:  # noqa: BLE001 - any unreadable file is the same user-facing problem
        raise ModelLocateError(f"{option}: {path} does not load ({type(err).__name__}: {str(err)[:200]}).") from None
    weights = state if final else state.get("model") if isinstance(state, dict) else None
    if not isinstance(weights, dict):
        raise ModelLocateError(f"{option}: {path} holds no model weights (no 'model' entry).")
    return weights


@dataclass(frozen=True)
class LocatedModel:
    """A model named on the command line, checked but not loaded yet."""

    option: str
    config: Any  # the policy config
    weights: Path | None  # a run's checkpoint to load into the policy, or None
    where: str  # what it is, for the table and shift.json


def locate_model(value: str, option: str, device: str | None) -> LocatedModel:
    """What ``value`` names (see :data:`MODEL_HELP`): checked, not loaded.

    A bad value raises a one-line :class:`ModelLocateError` that starts with ``option`` and says what to give.
    """
    import yaml

    from lrmgym.configs.errors import yaml_problem
    from lrmgym.configs.resolve import ConfigError, resolve_dict, validate_component
    from lrmgym.policies.checkpoint import ModelFolderError, model_folder

    extra = {"device": device} if device else {}
    path = Path(value).expanduser()
    try:
        if value == "tiny":
            return LocatedModel(option, validate_component("policy", "policy", {"kind": "tiny", **extra}), None, value)
        if not path.exists():
            raise ModelLocateError(
                f"{option}: {value!r} does not exist; give a model folder (with config.json), a run directory of "
                "`lrmgym run` (with config.yaml), or tiny (the shipped default model)."
            )
        if (path / "config.yaml").is_file():
            try:
                tree = yaml.safe_load((path / "config.yaml").read_text(encoding="utf-8")) or {}
            except yaml.YAMLError as err:
                raise ModelLocateError(
                    f"{option}: {path / 'config.yaml'} is not valid YAML ({yaml_problem(err)}); give a run directory "
                    "of `lrmgym run` whose config.yaml loads, or a model folder."
                ) from None
            resolved = resolve_dict(tree if isinstance(tree, dict) else {})
            config = resolved.policy
            if resolved.learner.kind in _ADAPTER_LEARNERS:
                raise ModelLocateError(_adapter_hint(option, path, resolved.learner.kind))
            if config.kind not in ("tiny", "hf"):
                raise ModelLocateError(
                    f"{option}: the run {str(path)!r} trained a {config.kind!r} policy, which has no weights to "
                    "compare; give a run of a tiny or hf policy, or a model folder."
                )
            found = _newest_weights(path)
            if found is None:
                raise ModelLocateError(
                    f"{option}: the run directory {str(path)!r} holds no checkpoint yet (checkpoints/step_*.pt); let "
                    "the run save one (learner.checkpoint_every) or give a model folder."
                )
            return LocatedModel(option, config.model_copy(update=extra), found[0], f"{value} ({found[1]})")
        if (path / "config.json").is_file():
            model_folder(str(path), field=option)
            return LocatedModel(option, validate_component("policy", "policy", {"kind": "hf", "model": value, **extra}),
                          None, value)  # fmt: skip
    except (ConfigError, ModelFolderError, yaml.YAMLError) as err:
        raise ModelLocateError(f"{option}: {err}") from None
    raise ModelLocateError(
        f"{option}: {value!r} is neither a model folder (no config.json) nor a run directory of `lrmgym run` "
        "(no config.yaml); give one of those, or tiny (the shipped default model)."
    )


_ADAPTER_LEARNERS = ("reason_maxxer", "kl_distill")
"""Learners whose checkpoints hold a LoRA adapter, not a model (they write ``merged/`` with learner.merge)."""


def _adapter_hint(option: str, run: Path, kind: str) -> str:
    """A LoRA learner's checkpoints hold its adapter, not a model: name the merged model to give."""
    merged = run / "merged"  # reason_maxxer and kl_distill write it with learner.merge=true
    head = f"{option}: {str(run)!r} is a {kind} run, whose checkpoints hold only its LoRA adapter; "
    if (merged / "config.json").is_file():
        return head + f"give its merged model: {option} {merged}."
    return head + f"it has no merged model ({merged}): train it with learner.merge=true, then give {option} {merged}."


def load_located(model: LocatedModel, build_policy: Callable[[Any], Any]) -> Any:
    """Build the policy of ``model`` (its weights loaded) in eval mode.

    ``build_policy`` is the composition root's (:func:`lrmgym.compose.build_policy`: it builds a tiny recipe's
    model first if it is not cached); it is called with an object whose ``policy`` is the model's config.
    """
    from lrmgym.configs.resolve import ConfigError
    from lrmgym.policies.checkpoint import ModelFolderError

    try:
        policy = build_policy(SimpleNamespace(policy=model.config))  # it reads only the policy section
    except (ConfigError, ModelFolderError, FileNotFoundError, ValueError) as err:
        raise ModelLocateError(f"{model.option}: {err}") from None
    if model.weights is not None:
        try:
            policy.model.load_state_dict(_load_weights(model.weights, model.option))
        except RuntimeError as err:
            first = str(err).splitlines()[0][:300]
            raise ModelLocateError(
                f"{model.option}: {model.weights} does not fit the run's policy ({first})."
            ) from None
    policy.model.eval()
    return policy
