"""Named recipes of the tiny model (``policy.recipe`` / ``lrmgym tiny build --recipe``): shape and training data.

A recipe is a set of :class:`~lrmgym.policies.tiny.TinyPolicyConfig` values (``arch`` and ``train`` fields) that
explicitly given values override; the weights' cache key is computed from the result, as for any config, so a
recipe's model is cached (and rebuilt) like the default one.

- ``default``: nothing changed, the shipped model (``env=math``, level 1).
- ``testbed``: the reasoning testbed (``env=testbed``, README "Test an RL idea on a laptop"): the default model
  fine-tuned on chains of 1-8 operations, half in the stepwise style and half direct, a quarter of the stepwise
  solutions with re-checks, to partial competence; longer positions for the longer solutions. 1 000 steps of
  batch 32 at lr 1e-3, batched by length (7 CPU-minutes on one core). Measured in
  benchmarks/results/testbed.md; shorter recipes were weaker: from scratch, 700 steps at 3e-3 left a model that
  could not copy the problem's numbers (0.4 % accuracy); 600 fine-tuning steps reached 37 % instead of 60 % on
  1-operation chains (stepwise, forced).
"""

from __future__ import annotations

from typing import Any

__all__ = ["RECIPES", "length_batched", "load_recipe_weights", "recipe_values"]

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
            "init_from": "default",
            "steps": 1000,
            "lr": 1e-3,
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


def load_recipe_weights(model: Any, recipe: str) -> None:
    """Load recipe ``recipe``'s trained weights (cached or shipped) into ``model``, whose shapes must match.

    Raises:
        FileNotFoundError: That recipe's model is not built (the message says how to build it).
    """
    from safetensors.torch import load_file

    from lrmgym.policies.tiny import TinyPolicyConfig

    folder = TinyPolicyConfig(recipe=recipe).model_dir()
    weights = folder / "model.safetensors"
    if not weights.is_file():
        flag = "" if recipe == "default" else f" --recipe {recipe}"
        raise FileNotFoundError(
            f"train.init_from={recipe!r}: that model is not built ({folder}); run `lrmgym tiny build{flag}`"
        )
    state = load_file(str(weights))
    if "lm_head.weight" not in state:  # tied embeddings are saved once
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    own = model.state_dict()
    wrong = [k for k in own if k not in state or state[k].shape != own[k].shape]
    if wrong:
        raise ValueError(
            f"train.init_from={recipe!r}: its weights do not fit this arch (first: {wrong[0]}); keep that recipe's "
            "arch (hidden, layers, heads, mlp) or set train.init_from=null"
        )
    model.load_state_dict(state)
