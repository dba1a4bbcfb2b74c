"""Resolve ``GROUP=PRESET`` and ``dotted.key=value`` tokens into a validated :class:`RunConfig`.

The grammar, in the order it is applied:

1. Defaults: ``env=math policy=tiny learner=grpo backend=native`` and no judges; ``backend=openrlhf`` implies
   ``policy=hf`` (OpenRLHF trains a Hugging Face model), so ``policy.model=...`` alone names it.
2. Every ``GROUP=PRESET`` token (groups: env, policy, learner, judge, backend) replaces that group with the
   preset's YAML from ``lrmgym/configs/presets/<group>/<preset>.yaml``. ``judge`` takes one preset, a list
   (``judge=[accuracy,format_strict]``), or ``none``; each judge is then addressed by its preset name. The
   ``accuracy`` judge is added first when no accuracy or arena judge is chosen, so judges add to the
   verifiable reward (``judge.accuracy.weight=0`` takes it out of the total).
3. Every ``dotted.key=value`` token sets one key, in order; values are parsed as YAML scalars or flow
   collections (``1e-6``, ``true``, ``[1,4,8]``), then validated against the field's type.

Group tokens apply before dotted ones wherever they stand, so ``learner.lr=1e-6 learner=grpo`` keeps the
learning rate. Every mistake ends in one :class:`ConfigError` naming the dotted path, the bad value, what is
allowed and, where it can guess, what was meant.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from lrmgym.configs.components import COMPONENTS
from lrmgym.configs.errors import (
    ConfigError,
    allowed,
    did_you_mean,
    fields_at,
    format_error,
    non_finite,
    show,
)
from lrmgym.configs.schema import EnvConfig, RunConfig, RunSection

__all__ = [
    "DEFAULTS",
    "GROUPS",
    "ConfigError",
    "format_error",
    "list_presets",
    "load_preset",
    "parse_overrides",
    "resolve",
    "tiny_tuned_warning",
]

GROUPS = ("env", "policy", "learner", "judge", "backend")
"""Groups that take a preset name."""
SECTIONS = ("backend", "env", "eval", "judge", "learner", "policy", "run")
"""Top-level keys of the config."""
DEFAULTS: dict[str, Any] = {"env": "math", "policy": "tiny", "learner": "grpo", "judge": [], "backend": "native"}
"""The presets used for groups the command line does not name."""
BACKEND_POLICY = {"openrlhf": "hf"}
"""The policy preset a backend implies when none is named: OpenRLHF trains a Hugging Face model (not the tiny one)."""
EVAL_CONFIG = "lrmgym.eval.config:EvalConfig"
MEASURED_ON: dict[str, Any] = {"env": "math", "policy": "tiny", "judge": [], "backend": "native"}
"""The groups a learner preset's ``idle_steps_per_s`` (its speed on an idle 2-core machine) was measured with."""
SPEED_NEUTRAL = frozenset(
    f"learner.{key}"
    for key in (
        "steps", "time_budget_s", "generation_budget", "checkpoint_every", "keep_checkpoints", "log_samples",
        "progress", "eval_every", "eval_before_after", "eval_greedy", "lr", "warmup_steps", "lr_decay",
        "min_lr_ratio", "idle_steps_per_s",
    )
)  # fmt: skip
"""Keys that leave a training step's cost as measured: budgets, logging, evaluation and the learning-rate schedule."""

_TOKEN_RE = re.compile(r"^(?P<key>[A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*)*)=(?P<value>.*)$", re.DOTALL)


# ------------------------------------------------------------------------------------------------ presets
def list_presets(group: str) -> list[str]:
    """The preset names shipped for a group, sorted."""
    folder = resources.files("lrmgym.configs") / "presets" / group
    if not folder.is_dir():
        return []
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_preset(group: str, name: str) -> dict[str, Any]:
    """The YAML mapping of preset ``group/name``; an unknown one raises :class:`ConfigError`."""
    if not isinstance(name, str) or name not in list_presets(group):
        allowed = ", ".join(list_presets(group)) or "none"
        raise ConfigError(
            f"{group}: unknown preset {show(name)}; allowed: {allowed}.{did_you_mean(name, list_presets(group))}"
        )
    text = (resources.files("lrmgym.configs") / "presets" / group / f"{name}.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{group}: preset {name!r} is not a YAML mapping (package data is broken).")
    return data


def _env_selection(name: Any) -> dict[str, Any]:
    """``env=NAME``: a shipped preset, else a registered env id (a plug-in's ``acme/Sudoku-v1``), as ``env.id``."""
    from lrmgym.registry import UnknownEnvError, list_envs, spec

    presets = list_presets("env")
    if isinstance(name, str) and name in presets:
        return load_preset("env", name)
    if isinstance(name, str):
        try:
            return {"id": spec(name).id}
        except UnknownEnvError:
            pass
    ids = list_envs(namespace=None)
    qualified = name if not isinstance(name, str) or "/" in name else f"lrmgym/{name}"
    hint = did_you_mean(name, presets) or did_you_mean(qualified, ids)
    raise ConfigError(
        f"env: unknown preset or environment id {show(name)}; presets: {', '.join(presets)}; environment ids: "
        f"{', '.join(ids) if len(ids) <= 10 else 'see `lrmgym envs list`'}.{hint}"
    )


# ------------------------------------------------------------------------------------------------ parsing
def parse_value(raw: str) -> Any:
    """Parse a value as YAML (scalars and flow collections); text YAML cannot parse stays a string."""
    if raw == "":
        return ""
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw
    # YAML 1.1 reads 1e-6 (no dot) as a string; numbers are what people mean.
    if isinstance(value, str) and re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", value):
        return float(value)
    return value


def parse_overrides(tokens: Sequence[str]) -> tuple[dict[str, Any], list[tuple[list[str], Any, str]]]:
    """Split tokens into group selections ``{group: preset(s)}`` and dotted settings ``(path, value, token)``."""
    groups: dict[str, Any] = {}
    dotted: list[tuple[list[str], Any, str]] = []
    for token in tokens:
        match = _TOKEN_RE.match(token)
        if match is None:
            raise ConfigError(
                f"{show(token)} is not an override: expected GROUP=PRESET (e.g. env=math) "
                "or dotted.key=VALUE (e.g. learner.lr=1e-6)."
            )
        key, value = match["key"], parse_value(match["value"])
        path = key.split(".")
        if path[0] not in SECTIONS:
            raise ConfigError(
                f"{key}: unknown key (value {show(value)}); allowed: {', '.join(SECTIONS)}."
                f"{did_you_mean(path[0], SECTIONS)}"
            )
        if len(path) == 1:
            if path[0] == "eval" and value in list_presets("eval"):  # a suite: `lrmgym eval` takes it out before here
                raise ConfigError(
                    f"eval={value}: an evaluation suite is run by `lrmgym eval eval={value} eval.data_path=PATH`; "
                    "this command does not take it."
                )
            if path[0] not in GROUPS:
                raise ConfigError(
                    f"{key}: is a section, not a preset group; set its keys instead, e.g. {key}.KEY=VALUE."
                )
            groups[path[0]] = value
        else:
            dotted.append((path, value, token))
    return groups, dotted


# ------------------------------------------------------------------------------------------------ merging
def _judge_presets(value: Any, add_accuracy: bool = True) -> dict[str, dict[str, Any]]:
    if value in (None, "none", "None", [], ""):
        return {}
    names = value if isinstance(value, list) else [value]
    judges: dict[str, dict[str, Any]] = {}
    for name in names:
        if not isinstance(name, str):
            raise ConfigError(f"judge: invalid value {show(value)}; expected a preset name or a list of them.")
        if name in judges:
            raise ConfigError(
                f"judge: {name} is listed twice in [{', '.join(names)}]; each preset is one judge, addressed as "
                f"judge.{name}.KEY. To weigh it more, set judge.{name}.weight=2."
            )
        judges[name] = load_preset("judge", name)
    # Judges add to the verifiable reward rather than replace it: without an accuracy or arena judge (the
    # arena keeps verifiable rewards for mixed groups), the accuracy judge goes first, so judge=format_strict
    # trains on accuracy + format. judge.accuracy.weight=0 trains on the other judges alone.
    if add_accuracy and judges and not any(j.get("kind") in ("accuracy", "arena") for j in judges.values()):
        judges = {"accuracy": load_preset("judge", "accuracy"), **judges}
    return judges


def _set_path(tree: dict[str, Any], path: list[str], value: Any) -> None:
    node = tree
    for i, part in enumerate(path[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            where = ".".join(path[: i + 1])
            raise ConfigError(
                f"{'.'.join(path)}: {where} is {show(child)}, not a section; it has no key {path[i + 1]!r}."
            )
        node = child
    node[path[-1]] = value


def merged_tree(
    tokens: Sequence[str], defaults: Mapping[str, Any] | None = None, add_accuracy: bool = True
) -> dict[str, Any]:
    """Apply defaults, presets and dotted overrides; returns the raw (unvalidated) config tree.

    ``add_accuracy=False`` keeps the judges exactly as listed (``lrmgym judge`` scores files that may have no
    verifier to run).
    """
    groups, dotted = parse_overrides(tokens)
    chosen = {**(DEFAULTS if defaults is None else defaults), **groups}
    if "policy" not in groups and chosen.get("backend") in BACKEND_POLICY:  # backend=openrlhf policy.model=...
        chosen["policy"] = BACKEND_POLICY[chosen["backend"]]
    tree: dict[str, Any] = {"eval": {}, "run": {}}
    for group in GROUPS:
        if group == "judge":
            tree["judge"] = _judge_presets(chosen.get("judge"), add_accuracy)
        elif group == "env" and "env" in chosen:
            tree["env"] = _env_selection(chosen["env"])
        elif group in chosen:
            tree[group] = load_preset(group, chosen[group])
            if group == "learner" and isinstance(tree[group].get("eval"), dict):  # the evaluation a preset sizes
                tree["eval"] = tree[group].pop("eval")  # (learner=grpo_hf's); eval.* overrides still apply
    if not _as_measured(chosen, dotted) and isinstance(tree.get("learner"), dict):
        tree["learner"].pop("idle_steps_per_s", None)
    for path, value, _ in dotted:
        _set_path(tree, path, value)
    return tree


def _as_measured(chosen: Mapping[str, Any], dotted: Sequence[tuple[list[str], Any, str]]) -> bool:
    """Whether a run is the one its learner preset's ``idle_steps_per_s`` was measured on (see :data:`MEASURED_ON`).

    Another env, policy, judge or backend, or a key that changes what a step costs, makes the figure wrong (a
    larger model's expected finish time would be off by orders of magnitude), so the resolver drops it; a run that
    sets ``learner.idle_steps_per_s`` itself keeps its own.
    """
    if any(chosen.get(group) != preset for group, preset in MEASURED_ON.items()):
        return False
    return all(path[0] in ("eval", "run") or ".".join(path) in SPEED_NEUTRAL for path, _, _ in dotted)


# ------------------------------------------------------------------------------------------------ validation
def _validate(prefix: str, model: type[BaseModel], data: Any) -> BaseModel:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix}: invalid value {show(data)}: expected a mapping of keys to values.")
    try:
        # Components that hold components (an LLM judge's policy) resolve them through this context, so that
        # the knowledge of kinds stays here and no component imports configs.
        validated = model.model_validate(data, context={"component": _nested_component})
    except ValidationError as err:
        raise ConfigError(format_error(prefix, err.errors()[0], model)) from None
    for path, value in non_finite(validated, prefix):  # a float field without bounds accepts nan and inf
        raise ConfigError(f"{path}: invalid value {value}: must be finite.")
    return validated


def _nested_component(group: str, data: Any) -> BaseModel:
    """Validate a component held by another one (``group`` names its kind table, e.g. ``"policy"``)."""
    try:
        return validate_component(group, group, data)
    except ConfigError as err:
        raise ValueError(str(err).removeprefix(f"{group}: ").removeprefix(f"{group}.")) from None


@cache
def _import(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _component_class(group: str, path: str, kind: Any) -> type[BaseModel]:
    kinds = COMPONENTS[group]
    if kind is None:
        raise ConfigError(f"{path}.kind: missing required key; allowed: {', '.join(sorted(kinds))}.")
    if not isinstance(kind, str) or kind not in kinds:
        hint = did_you_mean(kind, kinds)
        raise ConfigError(f"{path}.kind: unknown kind {show(kind)}; allowed: {', '.join(sorted(kinds))}.{hint}")
    target = kinds[kind]
    try:
        return _import(target)
    except (ImportError, AttributeError) as err:
        raise ConfigError(
            f"{path}.kind: the {kind!r} {group} is not available in this installation ({target} cannot be "
            f"imported: {err}). Install the extra it needs, or choose another kind."
        ) from None


def validate_component(group: str, path: str, data: Any) -> BaseModel:
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: invalid value {show(data)}: expected a mapping with a 'kind' key.")
    cls = _component_class(group, path, data.get("kind"))
    try:
        return _validate(path, cls, data)
    except ConfigError as err:
        if path != group:  # a judge, or a component inside another: no group token picks it
            raise
        raise _with_preset_hint(err, group, [k for k in data if k not in cls.model_fields], data.get("kind")) from None


def _component_fields(group: str, preset: dict[str, Any]) -> Any:
    """The keys a preset's component takes (its config class's fields); ``()`` when its class cannot load."""
    if group == "env":
        from lrmgym.registry import env_class

        try:
            return fields_at(getattr(env_class(preset["id"]), "Config", None), [])
        except Exception:  # noqa: BLE001 - a plug-in that does not load only loses the hint
            return ()
    try:
        return _component_class(group, group, preset.get("kind")).model_fields
    except ConfigError:  # a kind whose extra is not installed
        return ()


def _with_preset_hint(err: ConfigError, group: str, unknown: Sequence[str], current: Any) -> ConfigError:
    """``err`` with `` policy.model needs policy=hf (or openai, vllm): add policy=hf.`` when other presets take the key.

    ``lrmgym run policy.model=PATH`` sets a key of the default tiny policy, which has none by that name: the
    message names the preset that has it, so that the fix is one token away. ``current`` is the chosen
    component's kind (env: its id), whose presets are not suggested.
    """
    key = next((k for k in unknown if str(err).startswith(f"{group}.{k}: unknown key")), None)
    if key is None:
        return err
    takers = []
    for name in list_presets(group):
        preset = load_preset(group, name)
        if preset.get("id" if group == "env" else "kind") != current and key in _component_fields(group, preset):
            takers.append(name)
    if not takers:
        return err
    others = f" (or {', '.join(takers[1:])})" if len(takers) > 1 else ""
    return ConfigError(f"{err} {group}.{key} needs {group}={takers[0]}{others}: add {group}={takers[0]}.")


def validate_env(data: Any) -> EnvConfig:
    """Validate ``env``: its id, then its options against the env class's ``Config``, then its data files.

    A plug-in's ``Config`` is held to the same rules as a built-in one: a key it does not declare is refused
    (pydantic's default would drop it silently) unless the model says ``extra="allow"``. An env class may
    define ``preflight(config)``, a classmethod that reads the files the options name (a local data file) so
    that a bad one stops the command here; its ``ValueError`` or ``OSError`` becomes a :class:`ConfigError`.
    """
    from lrmgym.registry import UnknownEnvError, env_class, list_envs, spec

    if not isinstance(data, dict):
        raise ConfigError(f"env: invalid value {show(data)}: expected a mapping with an 'id' key.")
    env_id = data.get("id")
    if not isinstance(env_id, str):
        raise ConfigError(f"env.id: invalid value {show(env_id)}: expected an env id such as lrmgym/Math-v0.")
    try:
        full_id = spec(env_id).id
    except UnknownEnvError:
        known = list_envs(namespace=None)
        qualified = env_id if "/" in env_id else f"lrmgym/{env_id}"
        listing = allowed(qualified, known, "`lrmgym envs list` shows all {n}")
        raise ConfigError(f"env.id: unknown environment {show(env_id)}{listing}") from None
    options = {k: v for k, v in data.items() if k != "id"}
    try:
        cls = env_class(full_id)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"env.id: environment {full_id!r} cannot be loaded: {err}.") from None
    options_model = getattr(cls, "Config", None) if cls is not None else None
    if options_model is not None:
        validated = _validate_options(full_id, options_model, options)
        options = validated.model_dump(mode="json") if isinstance(validated, BaseModel) else options
        _preflight(cls, validated, "env")
    elif options and cls is not None:
        raise ConfigError(f"env: {full_id} takes no options, got {', '.join(sorted(options))}.")
    for path, value in non_finite(options, "env"):
        raise ConfigError(f"{path}: invalid value {value}: must be finite.")
    return EnvConfig(id=full_id, **options)


def _preflight(cls: Any, options: Any, where: str) -> None:
    preflight = getattr(cls, "preflight", None)
    if callable(preflight):
        try:
            preflight(options)
        except (ValueError, OSError) as err:
            raise ConfigError(f"{where}: {err}") from None


def _preflight_eval_split(env: EnvConfig, split: Any) -> None:
    """Check the data of the split evaluation will rebuild the env with (``eval.split``), when it differs."""
    from lrmgym.registry import env_class

    if not isinstance(split, str) or env.options.get("split", split) == split:
        return
    cls = env_class(env.id)
    model = getattr(cls, "Config", None)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return
    try:
        switched = model.model_validate({**env.options, "split": split})
    except ValidationError:
        return  # the options do not fit that split; the evaluation says so itself
    _preflight(cls, switched, f"env (with eval.split={split!r})")


def _validate_options(env_id: str, model: Any, options: dict[str, Any]) -> Any:
    """The env's options validated by its ``Config``: a pydantic model, or any class taking keyword arguments."""
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        try:
            return model(**options)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"env: the options of {env_id} are refused by its Config: {err}") from None
    fields = fields_at(model, [])
    aliases = {f.alias for f in model.model_fields.values() if f.alias}
    if model.model_config.get("extra") != "allow":
        for key in options:
            if key not in fields and key not in aliases:
                err = ConfigError(
                    f"env.{key}: unknown key (value {show(options[key])})"
                    + allowed(key, fields, f"`lrmgym envs show {env_id}` shows all {{n}} options")
                )
                raise _with_preset_hint(err, "env", [key], env_id)
    return _validate("env", model, options)


def _check_arena_advantages(learner: Any, judges: Mapping[str, Any]) -> None:
    """Refuse the arena judge with an advantage estimator that does not compare a reward with its own group.

    The arena replaces a zero-variance group's rewards by its tournament's min-max strengths in [0, 1]: they rank
    the group's traces against each other and say nothing against other groups. A group-relative estimator (grpo,
    dr_grpo, rloo, reinforce_pp_baseline...) keeps that meaning; REINFORCE++'s batch whitening and PPO's GAE compare
    each reward with the whole batch or a critic, so the better half of an all-wrong group would be paid.
    """
    arena = next((name for name, judge in judges.items() if getattr(judge, "kind", None) == "arena"), None)
    if arena is None:
        return
    if getattr(learner, "kind", None) == "ppo":
        raise ConfigError(
            f"judge.{arena}: the arena judge cannot train with learner=ppo: GAE compares each reward with the "
            "critic's value, not with the other traces of its group, so tournament rewards (0 to 1) of an "
            "all-wrong group would push wrong answers up; use a group-relative learner (learner=grpo, cispo, "
            "dr_grpo, rloo, dapo)."
        )
    if getattr(learner, "adv_estimator", None) == "reinforce_pp":
        raise ConfigError(
            f"judge.{arena}: the arena judge cannot train with learner.adv_estimator=reinforce_pp: its batch "
            "whitening compares tournament rewards (0 to 1) with the whole batch, so the better half of an all-wrong "
            "group would be paid; use learner.adv_estimator=reinforce_pp_baseline (a group baseline first) or grpo."
        )


def resolve_dict(tree: Mapping[str, Any]) -> RunConfig:
    """Validate a raw config tree (from :func:`merged_tree` or a saved ``config.yaml``) into a RunConfig."""
    unknown = [k for k in tree if k not in SECTIONS]
    if unknown:
        raise ConfigError(
            f"{unknown[0]}: unknown key (value {show(tree[unknown[0]])}); allowed: {', '.join(SECTIONS)}."
            f"{did_you_mean(unknown[0], SECTIONS)}"
        )
    run = _validate("run", RunSection, tree.get("run") or {})
    env = validate_env(tree.get("env"))
    policy = validate_component("policy", "policy", tree.get("policy"))
    learner = validate_component("learner", "learner", tree.get("learner"))
    judges_raw = tree.get("judge") or {}
    if not isinstance(judges_raw, dict):
        raise ConfigError(f"judge: invalid value {show(judges_raw)}: expected judges by name.")
    judges = {name: validate_component("judge", f"judge.{name}", cfg) for name, cfg in judges_raw.items()}
    try:
        eval_model = _import(EVAL_CONFIG)
    except (ImportError, AttributeError):
        eval_model = None
    if eval_model is None:
        raise ConfigError("eval: evaluation is not available in this installation (lrmgym.eval.config missing).")
    evaluation = _validate("eval", eval_model, tree.get("eval") or {})
    _preflight_eval_split(env, getattr(evaluation, "split", None))
    # No backend section (every config saved before backends existed, and every native run's) means native.
    backend = validate_component("backend", "backend", tree.get("backend") or {"kind": "native"})
    _check_arena_advantages(learner, judges)
    return RunConfig(env=env, policy=policy, learner=learner, judge=judges, eval=evaluation, run=run, backend=backend)


def resolve(tokens: Sequence[str] = (), defaults: Mapping[str, Any] | None = None) -> RunConfig:
    """Resolve command-line tokens into a validated :class:`RunConfig`; see the module docstring."""
    return resolve_dict(merged_tree(tokens, defaults))


TINY_TUNED = (
    ("lr", lambda v: v is not None and v >= 1e-4),
    ("max_new_tokens", lambda v: v is not None and v <= 64),
    ("time_budget_s", lambda v: v is not None),
    ("async_rollouts", bool),
)
"""Learner values that suit the tiny CPU model (grpo.yaml's lr 4e-4, 48 new tokens, a 530-s budget, async
rollouts) and not a real one: each key with the test a value fails."""


def tiny_tuned_warning(cfg: RunConfig) -> str | None:
    """One line when ``policy=hf`` meets learner values tuned for the tiny CPU model; ``None`` otherwise.

    ``lrmgym run`` and ``lrmgym export openrlhf`` print it: grpo.yaml (and its variants) set lr 4e-4, 48 new
    tokens, a 530-s budget and async rollouts, which a 1.5B model does not survive or needs no more of;
    ``learner=grpo_hf`` holds real-model values.
    """
    if getattr(cfg.policy, "kind", None) != "hf":
        return None
    found = [
        f"learner.{key}={getattr(cfg.learner, key)}"
        for key, tiny in TINY_TUNED
        if hasattr(cfg.learner, key) and tiny(getattr(cfg.learner, key))
    ]
    if not found:
        return None
    return (
        f"policy=hf with learner values tuned for the tiny CPU model ({', '.join(found)}); for a real model use "
        "learner=grpo_hf (lr 1e-6, 1024 new tokens, no time budget, synchronous rollouts) or set these keys."
    )
