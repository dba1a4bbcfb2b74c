"""reasoning-gym's task generators as lrmgym sees them: names, configs, curriculum levels and items.

reasoning-gym (https://github.com/open-thought/reasoning-gym) registers 100+ procedural generators by name;
each has a config dataclass, most have a curriculum (named difficulty attributes, each with a list of levels),
and item ``i`` of a dataset with seed ``s`` is drawn from ``random.Random(s + i)``. lrmgym names an item by its
*item seed* alone: the item is ``create_dataset(name, **config, seed=item_seed, size=1)[0]``, a pure function
of ``(name, config, item_seed)`` that the scoring worker rebuilds the same way.

Every function here imports reasoning-gym lazily, so importing this module costs nothing.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from functools import cache
from typing import Any

__all__ = [
    "LEVEL_MODES",
    "RGError",
    "attribute_levels",
    "config_fields",
    "config_spec",
    "has_curriculum",
    "make_entry",
    "max_level",
    "resolve_config",
    "resolve_name",
    "task_names",
]

LEVEL_MODES = ("inclusive", "upper_bound")
"""How a curriculum level becomes a range: ``inclusive`` (levels 0..L, reasoning-gym's default) or ``upper_bound``
(only the top segment, L-1..L for an interval attribute)."""
_NOT_TASKS = frozenset({"composite"})  # a mixer of other datasets, not a generator
_RESERVED = frozenset({"seed", "size"})  # lrmgym sets these per item


class RGError(ValueError):
    """A reasoning-gym task name or config that cannot be used; the message is one line with the fix."""


def _registry() -> tuple[dict[str, Any], dict[str, Any]]:
    try:
        from reasoning_gym.factory import CURRICULA, DATASETS
    except ImportError as err:
        raise RGError(
            f"env=rg needs the reasoning-gym package ({err}); install it with `pip install 'lrmgym[rg]'`."
        ) from None
    return DATASETS, CURRICULA


@cache
def task_names() -> tuple[str, ...]:
    """The names of reasoning-gym's generators, sorted."""
    datasets, _ = _registry()
    return tuple(sorted(n for n in datasets if n not in _NOT_TASKS))


def resolve_name(name: Any) -> str:
    """``name`` when it is a reasoning-gym generator; else :class:`RGError` with the closest names."""
    names = task_names()
    if isinstance(name, str) and name in names:
        return name
    close = difflib.get_close_matches(str(name), names, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise RGError(
        f"unknown reasoning-gym task {name!r}.{hint} There are {len(names)} tasks "
        f"(`python -c 'import reasoning_gym; print(sorted(reasoning_gym.factory.DATASETS))'` lists them)."
    )


def _config_class(name: str) -> Any:
    datasets, _ = _registry()
    return datasets[name][1]


@cache
def config_fields(name: str) -> tuple[str, ...]:
    """The knobs of generator ``name`` (its config dataclass's fields, less ``seed`` and ``size``)."""
    return tuple(f.name for f in dataclasses.fields(_config_class(name)) if f.name not in _RESERVED)


def has_curriculum(name: str) -> bool:
    """Whether reasoning-gym defines difficulty levels for ``name``."""
    return name in _registry()[1]


@cache
def max_level(name: str) -> int:
    """The highest curriculum level of ``name`` (its most finely graded attribute's last level); 0 without one."""
    _, curricula = _registry()
    if name not in curricula:
        return 0
    curriculum = curricula[name]()
    return max((len(a.levels) - 1 for a in curriculum.attributes.values()), default=0)


def attribute_levels(name: str) -> dict[str, int]:
    """The difficulty attributes of ``name``'s curriculum and the last level of each (empty without one)."""
    _, curricula = _registry()
    if name not in curricula:
        return {}
    return {a: len(d.levels) - 1 for a, d in curricula[name]().attributes.items()}


def _curriculum_config(name: str, level: int | dict[str, int], mode: str) -> dict[str, Any]:
    from reasoning_gym.coaching.base_curriculum import DefaultCurriculumContext, RangeAttributeMode

    _, curricula = _registry()
    if name not in curricula:
        raise RGError(f"reasoning-gym task {name!r} has no curriculum: remove env.level, set its knobs directly.")
    curriculum = curricula[name]()
    tops = attribute_levels(name)
    if isinstance(level, dict):
        for attr, value in level.items():
            if attr not in tops:
                close = difflib.get_close_matches(str(attr), list(tops), n=1, cutoff=0.5)
                hint = f" Did you mean {close[0]}?" if close else ""
                listing = ", ".join(f"{a} (0-{t})" for a, t in tops.items())
                raise RGError(
                    f"reasoning-gym task {name!r} has no difficulty attribute {attr!r}.{hint} It has {listing}."
                )
            if not isinstance(value, int) or not 0 <= value <= tops[attr]:
                raise RGError(
                    f"env.level.{attr}={value!r} is out of range for {name!r}: its levels are 0 to {tops[attr]}."
                )
            curriculum.set_attr_level(attr, value)
    else:
        top = max_level(name)
        if not 0 <= level <= top:
            raise RGError(f"env.level={level} is out of range for {name!r}: its curriculum has levels 0 to {top}.")
        curriculum.set_global_level(level)
    context = DefaultCurriculumContext(mode=RangeAttributeMode(mode))
    config = curriculum.generate_configuration(context=context)
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in _RESERVED}


def resolve_config(
    name: str, overrides: dict[str, Any], level: int | dict[str, int] | None = None, mode: str = "inclusive"
) -> dict[str, Any]:
    """The config knobs of generator ``name``: curriculum ``level`` (if any), then ``overrides``, validated.

    The values are the generator's own (enums, tuples, objects); what lrmgym stores and sends is the *spec*
    ``{"overrides": ..., "level": ..., "mode": ...}`` (plain data), from which :func:`make_entry` rebuilds them.

    Raises:
        RGError: an unknown knob (with the closest ones), a bad level, or a config the generator refuses.
    """
    fields = config_fields(name)
    for key in overrides:
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=2, cutoff=0.5)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise RGError(
                f"reasoning-gym task {name!r} has no config knob {key!r}.{hint} Its knobs: {', '.join(fields)}."
            )
    base = _curriculum_config(name, level, mode) if level is not None else {}
    merged = {**base, **overrides}
    cls = _config_class(name)
    try:
        config = cls(**merged, seed=0, size=1)
        if hasattr(config, "validate"):
            config.validate()
    except Exception as err:  # noqa: BLE001 - the generator's own check, reported as the user's mistake
        raise RGError(f"reasoning-gym task {name!r} refuses the config {merged}: {err}") from None
    return {f: getattr(config, f) for f in fields}


def config_spec(overrides: dict[str, Any], level: int | dict[str, int] | None, mode: str) -> dict[str, Any]:
    """The plain-data spec of a config (what a task records): explicit knobs, curriculum level and mode."""
    return json.loads(json.dumps({"overrides": overrides, "level": level, "mode": mode}, sort_keys=True))


@cache
def _config_from_spec(name: str, spec_json: str) -> tuple[tuple[str, Any], ...]:
    spec = json.loads(spec_json)
    config = resolve_config(name, spec.get("overrides") or {}, spec.get("level"), spec.get("mode") or "inclusive")
    return tuple(config.items())


def make_entry(name: str, spec: dict[str, Any], item_seed: int) -> tuple[Any, dict[str, Any]]:
    """``(dataset, item)`` for ``item_seed``: the dataset built with ``seed=item_seed, size=1`` and its item 0.

    ``spec`` is a :func:`config_spec`. reasoning-gym seeds item 0 with ``random.Random(item_seed)``; a few
    generators (``isomorphic_strings``, ``ransom_note``, ``polynomial_multiplication``) also depend on the
    order of a ``set``, so on Python's hash seed: their items repeat across processes only under a fixed
    ``PYTHONHASHSEED``.
    """
    from reasoning_gym import create_dataset

    config = dict(_config_from_spec(name, json.dumps(spec, sort_keys=True)))
    dataset = create_dataset(name, **{**config, "seed": int(item_seed), "size": 1})
    return dataset, dataset[0]
