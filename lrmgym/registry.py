"""Environment registry: gymnasium's own registry under the ``lrmgym/`` namespace, plus entry-point plug-ins.

Our environments are ordinary gymnasium registrations, so ``gymnasium.make("lrmgym/Echo-v0")`` works as
well as ``lrmgym.make("Echo-v0")``. Third-party packages add environments without touching lrmgym by
declaring entry points in the group ``lrmgym.envs``; the entry point's *name* is the env id and its
*value* is the ``module:Class`` string, so nothing is imported until the env is made::

    [project.entry-points."lrmgym.envs"]
    "Sokoban-v0" = "my_pkg.sokoban:SokobanEnv"       # becomes lrmgym/Sokoban-v0
    "acme/Sudoku-v1" = "acme_envs.sudoku:SudokuEnv"  # an explicit namespace is kept
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import logging
import re
from collections.abc import Callable
from typing import Any

import gymnasium
from gymnasium.envs.registration import EnvSpec

from lrmgym.core import TextEnv

__all__ = ["NAMESPACE", "ENTRY_POINT_GROUP", "UnknownEnvError", "register", "make", "list_envs", "spec", "env_class"]

NAMESPACE = "lrmgym"
ENTRY_POINT_GROUP = "lrmgym.envs"
_ID_RE = re.compile(r"^(?:[\w:.-]+/)?[\w:.-]+?(?:-v\d+)?$")

logger = logging.getLogger(__name__)
_plugins_loaded = False
_registered: set[str] = set()
"""Ids registered through :func:`register` (any namespace), so that :func:`list_envs` shows them."""


class UnknownEnvError(KeyError):
    """Raised for an env id that is not registered; the message carries a did-you-mean."""

    def __str__(self) -> str:  # KeyError would print the message with quotes around it
        return str(self.args[0])


def _qualify(env_id: str) -> str:
    return env_id if "/" in env_id else f"{NAMESPACE}/{env_id}"


def register(env_id: str, entry_point: str | Callable[..., TextEnv], **kwargs: Any) -> None:
    """Register an env in gymnasium's registry; an id without a namespace goes under ``lrmgym/``.

    Args:
        env_id: ``"Name-vN"`` or ``"namespace/Name-vN"``.
        entry_point: ``"module:Class"`` (imported lazily, at ``make`` time) or a callable returning the env.
        **kwargs: Default constructor options, validated against the env's ``Config`` when it is made.
    """
    if not isinstance(env_id, str) or not _ID_RE.match(env_id):
        raise ValueError(f"Invalid env id {env_id!r}: expected '[namespace/]Name-vN', for example 'lrmgym/Math-v0'.")
    # Text envs validate their own inputs and enforce reset/step order, so gymnasium's passive checker
    # (written for array spaces) and OrderEnforcing wrapper are off: make() returns the env itself.
    _registered.add(_qualify(env_id))
    gymnasium.register(
        id=_qualify(env_id),
        entry_point=entry_point,
        kwargs=kwargs,
        disable_env_checker=True,
        order_enforce=False,
    )


def _load_plugins() -> None:
    """Register every env declared in the ``lrmgym.envs`` entry-point group (once per process)."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        env_id = _qualify(ep.name)
        if env_id in gymnasium.registry:
            continue
        try:
            register(env_id, ep.value)
        except ValueError as err:
            dist = ep.dist.name if ep.dist is not None else "an unknown distribution"
            logger.warning("Skipping lrmgym plug-in %r from %s: %s", ep.name, dist, err)


def list_envs(namespace: str | None = NAMESPACE) -> list[str]:
    """Sorted ids of the registered envs; ``namespace=None`` lists every namespace's text envs and ours."""
    _load_plugins()
    ids = [i for i, s in gymnasium.registry.items() if namespace is None or s.namespace == namespace]
    if namespace is None:  # other namespaces may hold Atari and the like: keep only what plug-ins added
        plugin_ids = {_qualify(ep.name) for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
        ids = [i for i in ids if i.startswith(f"{NAMESPACE}/") or i in plugin_ids or i in _registered]
    return sorted(ids)


def spec(env_id: str) -> EnvSpec:
    """The gymnasium ``EnvSpec`` of a registered env; an unknown id raises :class:`UnknownEnvError`."""
    _load_plugins()
    full = _qualify(env_id)
    if full in gymnasium.registry:
        return gymnasium.registry[full]
    known = list_envs(namespace=None)
    close = difflib.get_close_matches(full, known, n=1, cutoff=0.6)
    if not close:  # also try case-insensitively ("math-v0" -> "lrmgym/Math-v0")
        lowered = {k.lower(): k for k in known}
        close = [lowered[m] for m in difflib.get_close_matches(full.lower(), list(lowered), n=1, cutoff=0.6)]
    hint = f" Did you mean '{close[0]}'?" if close else ""
    raise UnknownEnvError(
        f"Unknown environment id '{env_id}'.{hint} Registered: {', '.join(known) or 'none'}. "
        "Run `lrmgym envs list` to see them, or install the package that provides it."
    )


def env_class(env_id: str) -> type | None:
    """The class behind an env id (imports its module), or ``None`` if the entry point is not a class."""
    entry = spec(env_id).entry_point
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        entry = getattr(importlib.import_module(module), attr)
    return entry if isinstance(entry, type) else None


def make(env_id: str, **kwargs: Any) -> TextEnv:
    """Make an env by id (``"Math-v0"`` or ``"lrmgym/Math-v0"``); ``kwargs`` are its options."""
    return gymnasium.make(spec(env_id).id, **kwargs)
