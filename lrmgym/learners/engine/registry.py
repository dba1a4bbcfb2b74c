"""Name -> function registries for the learners' pure tensor functions (policy losses, advantage estimators).

A learner config names a function (``pg_loss=cispo``) instead of switching on strings: the learner looks the
name up in a :class:`FunctionRegistry`, and a new variant is one decorated function, not a branch in a trainer::

    @register_policy_loss("my_loss")
    def my_loss(logp, old_logp, advantages, mask, *, clip_high=0.2): ...

An unknown name raises a :class:`ValueError` that names it, lists the known ones and says how to add one. A
registry also works as pydantic metadata, ``Annotated[str, REGISTRY]``, so a config field holding a name is
checked when the config is built (the CLI then reports the bad value and exits with code 2).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterator, Mapping
from functools import cache
from typing import Any, Generic, TypeVar

__all__ = ["FunctionRegistry", "accepted_options"]

F = TypeVar("F", bound=Callable[..., Any])


class FunctionRegistry(Mapping[str, F], Generic[F]):
    """A mapping of names to functions that share one signature, filled by a decorator.

    Args:
        what: What the functions are, for messages (``"policy loss"``).
        decorator: The public name of :meth:`register` users call
        (``"lrmgym.learners.algorithms.losses.register_policy_loss"``).
    """

    def __init__(self, what: str, decorator: str) -> None:
        self.what = what
        self.decorator = decorator
        self._functions: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator that files a function under ``name``; a name can be taken only once."""

        def add(fn: F) -> F:
            if name in self._functions:
                taken = self._functions[name]
                raise ValueError(
                    f"{self.what} {name!r} is already registered ({taken.__module__}.{taken.__qualname__}); "
                    "register the new one under another name."
                )
            self._functions[name] = fn
            return fn

        return add

    def lookup(self, name: str) -> F:
        """The function registered as ``name``; an unknown name raises a :class:`ValueError` listing the known ones."""
        if isinstance(name, str) and name in self._functions:
            return self._functions[name]
        known = sorted(self._functions)
        # The one known name that starts with the input (ppo -> ppo_clip) beats difflib's pick (ppo -> gspo).
        match = [k for k in known if k.startswith(str(name))] if name else []
        match = match if len(match) == 1 else difflib.get_close_matches(str(name), known, n=1, cutoff=0.5)
        hint = f" Did you mean {match[0]!r}?" if match else ""
        raise ValueError(
            f"unknown {self.what} {name!r}; known: {', '.join(known) or 'none'}.{hint} "
            f"Use one of these, or register a new one with @{self.decorator}(name)."
        )

    def names(self) -> tuple[str, ...]:
        """The registered names, sorted."""
        return tuple(sorted(self._functions))

    def __getitem__(self, name: str) -> F:
        return self._functions[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._functions)

    def __repr__(self) -> str:
        return f"FunctionRegistry({self.what!r}: {', '.join(self.names())})"

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        """Make ``Annotated[str, registry]`` a pydantic type that accepts only registered names."""
        from pydantic_core import core_schema  # pydantic stays out of the import graph of the tensor code

        return core_schema.no_info_after_validator_function(self._check_name, handler(source))

    def _check_name(self, name: str) -> str:
        self.lookup(name)
        return name


@cache
def _keyword_names(fn: Callable[..., Any]) -> frozenset[str] | None:
    """The keyword parameters ``fn`` names, or None when it takes ``**kwargs`` (any keyword)."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))


def accepted_options(fn: Callable[..., Any], **options: Any) -> dict[str, Any]:
    """The ``options`` that ``fn`` names as parameters.

    This is how a learner hands its generic knobs (``clip_low``, ``clip_high``, ``eps``) to whichever
    registered function it was configured with: a function receives a knob exactly when its signature names
    it, e.g. ``cispo`` takes ``clip_high`` (its cap) but not ``clip_low`` (it has no floor).
    """
    names = _keyword_names(fn)
    return dict(options) if names is None else {k: v for k, v in options.items() if k in names}
