"""Named recipes of the tiny model (``policy.recipe`` / ``lrmgym tiny build --recipe``): shape and training data.

A recipe is a set of :class:`~lrmgym.policies.tiny.TinyPolicyConfig` values (``arch`` and ``train`` fields) that
explicitly given values override; the weights' cache key is computed from the result, as for any config, so a
recipe's model is cached (and rebuilt) like the default one.

- ``default``: nothing changed, the shipped model (``env=math``, level 1).
- ``testbed``: the reasoning testbed (``env=testbed``, docs/testbed.md): trained on chains of 1-8 operations,
  half in the stepwise style and half direct, a quarter of the stepwise solutions with re-checks, to partial
  competence; longer positions for the longer solutions. 700 steps of batch 32, batched by length.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RECIPES", "length_batched", "recipe_values"]

RECIPES: dict[str, dict[str, Any]] = {
    "default": {},
    "testbed": {
        "arch": {"max_positions": 512},
        "train": {
            "env": "lrmgym/Testbed-v0",
            "env_options": {
                "split": "train",
                "min_ops": 1,
                "max_ops": 8,
                "two_digit_share": 0.5,
                "stepwise_share": 0.5,
                "recheck_share": 0.25,
                "slip_share": 0.3,
                "template": "r1",
                "style": "compact",
            },  # fmt: skip
            "steps": 700,
            "length_batches": True,
        },
    },
}
"""Recipe name -> the config values it sets (nested dicts: ``arch`` and ``train`` fields)."""


def recipe_values(name: str, given: dict[str, Any]) -> dict[str, Any]:
    """The config values of recipe ``name`` with ``given`` (the user's values, nested dicts) laid over them.

    Raises:
        ValueError: ``name`` is not a recipe (the message lists them).
    """
    if name not in RECIPES:
        raise ValueError(f"unknown tiny-model recipe {name!r}; expected one of {', '.join(RECIPES)}")
    merged = dict(given)
    for section, values in RECIPES[name].items():
        own = given.get(section)
        if own is None:
            merged[section] = dict(values)
        elif isinstance(own, dict):
            merged[section] = {**values, **own}
        # a section given as a model instance is taken as it is: it says every value
    return merged


def length_batched(pairs: list[tuple[str, str]], batch_size: int, seed: int, window: int = 64) -> list[tuple[str, str]]:
    """``pairs`` reordered so that each batch of ``batch_size`` holds examples of similar length.

    Within each window of ``window`` batches the examples are sorted by length and cut into batches; all the
    batches are then shuffled (seeded by ``seed``), so the order of lengths over training stays random. The same
    pairs come out, each once.
    """
    import numpy as np

    chunk = batch_size * window
    batches = []
    for start in range(0, len(pairs), chunk):
        part = sorted(pairs[start : start + chunk], key=lambda p: len(p[0]) + len(p[1]))
        batches += [part[i : i + batch_size] for i in range(0, len(part), batch_size)]
    order = np.random.default_rng([seed, 0x6C62]).permutation(len(batches))  # "lb"
    return [pair for i in order for pair in batches[i]]
