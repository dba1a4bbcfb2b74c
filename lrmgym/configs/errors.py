"""Config errors and their one-line messages: the path, the bad value, what is allowed, what was probably meant.

Conventions every message follows: a dotted path with list items as ``[i]`` (``learner.adam_betas[0]``), the
value as the user typed it, the full allowed range of a bounded number (``an integer from 1 to 10000000``),
``must be finite`` for nan / inf, and a did-you-mean that names only close matches (:func:`difflib` with a
cutoff). A short list of choices is spelled out; a long one is not (the message says where to see it).
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Union, get_args, get_origin

import yaml
from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel

__all__ = ["ConfigError", "allowed", "did_you_mean", "format_error", "non_finite", "show"]

LIST_AT_MOST = 10
"""Choices spelled out in a message; above this only the close ones are named."""
_BOUND_KINDS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number")
_NUMBER_KINDS = ("int_parsing", "int_from_float", "int_type", "float_parsing", "float_type")
_NON_FINITE_TEXT = {"nan", "+nan", "-nan", "inf", "+inf", "-inf", "infinity", "+infinity", "-infinity"}


class ConfigError(ValueError):
    """A user's config mistake. The message is complete: the CLI prints it and exits with code 2."""


def did_you_mean(word: Any, choices: Iterable[Any], cutoff: float = 0.65) -> str:
    """`` Did you mean 'x'?`` for the closest choice above ``cutoff`` (case-insensitive), else ``""``."""
    names = [str(c) for c in choices]
    lowered = {n.lower(): n for n in names}
    match = difflib.get_close_matches(str(word).lower(), list(lowered), n=1, cutoff=cutoff)
    return f" Did you mean '{lowered[match[0]]}'?" if match else ""


def allowed(word: Any, choices: Iterable[Any], see: str) -> str:
    """``; allowed: a, b, c. Did you mean 'b'?`` for a short list; for a long one, the close match and ``see``.

    ``see`` says where the whole list is, with ``{n}`` for its length: "`lrmgym envs list` shows all {n}".
    """
    names = sorted(str(c) for c in choices)
    hint = did_you_mean(word, names)
    if len(names) <= LIST_AT_MOST:
        return f"; allowed: {', '.join(names) or 'none'}.{hint}"
    return f".{hint or ' No allowed name is close to it.'} {see.format(n=len(names))}."


def show(value: Any) -> str:
    """A value as the user typed it (YAML flow style), shortened."""
    if isinstance(value, str):
        text = repr(value)
    elif isinstance(value, float) and not math.isfinite(value):
        text = str(value)
    else:
        text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
        text = text.removesuffix("\n...").removesuffix(" ...")
    return text if len(text) <= 80 else text[:77] + "..."


def dotted(prefix: str, loc: Sequence[Any]) -> str:
    """``prefix.a.b[0]`` from a pydantic location."""
    out = prefix
    for part in loc:
        out = f"{out}[{part}]" if isinstance(part, int) else f"{out}.{part}" if out else str(part)
    return out


def _is_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    return isinstance(value, str) and value.strip().lower() in _NON_FINITE_TEXT


def non_finite(value: Any, path: str) -> Iterator[tuple[str, float]]:
    """``(dotted path, value)`` of each nan / inf float inside a validated value (models, lists, mappings)."""
    if isinstance(value, float) and not math.isfinite(value):
        yield path, value
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from non_finite(getattr(value, name), f"{path}.{name}")
        for name, extra in (value.model_extra or {}).items():
            yield from non_finite(extra, f"{path}.{name}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from non_finite(item, f"{path}[{i}]")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from non_finite(item, f"{path}.{key}")


# ------------------------------------------------------------------------------------------------ pydantic
def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) is Union or type(annotation).__name__ == "UnionType":
        models = [m for m in map(_model_of, get_args(annotation)) if m is not None]
        return models[0] if len(models) == 1 else None
    return None


def _field_at(model: type[BaseModel] | None, loc: Sequence[Any]) -> Any:
    """The pydantic ``FieldInfo`` at ``loc`` inside (nested) ``model``, or ``None``."""
    field = None
    for part in loc:
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            return None
        field = model.model_fields[part]
        model = _model_of(field.annotation)
    return field


def fields_at(model: type[BaseModel] | None, loc: Sequence[Any]) -> list[str]:
    """The field names of the (nested) model at ``loc``, for listing allowed keys."""
    for part in loc:
        field = _field_at(model, [part])
        model = _model_of(field.annotation) if field is not None else None
    return sorted(model.model_fields) if model is not None else []


def _number(value: Any) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() and abs(value) < 1e15 else str(value)


def bounds(model: type[BaseModel] | None, loc: Sequence[Any]) -> str | None:
    """The allowed range of the number field at ``loc``: ``"an integer from 1 to 10000000"``, ``"a number > 0"``."""
    field = _field_at(model, loc)
    if field is None:
        return None
    low = high = None
    for rule in field.metadata:
        if isinstance(rule, (Ge, Gt)):
            low = (">=" if isinstance(rule, Ge) else ">", getattr(rule, "ge", getattr(rule, "gt", None)))
        elif isinstance(rule, (Le, Lt)):
            high = ("<=" if isinstance(rule, Le) else "<", getattr(rule, "le", getattr(rule, "lt", None)))
    if low is None and high is None:
        return None
    types = set(get_args(field.annotation)) or {field.annotation}
    integer = int in types and float not in types
    if integer and low and high and low[0] == ">=" and high[0] == "<=":
        return f"an integer from {_number(low[1])} to {_number(high[1])}"
    rules = " and ".join(f"{op} {_number(v)}" for op, v in (b for b in (low, high) if b is not None))
    return f"{'an integer' if integer else 'a number'} {rules}"


def format_error(prefix: str, err: Mapping[str, Any], model: type[BaseModel] | None) -> str:
    """One pydantic error as ``path: problem``, with the allowed keys, values or range and a did-you-mean."""
    loc = list(err["loc"])
    path = dotted(prefix, loc)
    value = err.get("input")
    kind = err["type"]
    if kind == "extra_forbidden":
        fields = fields_at(model, loc[:-1])
        section = dotted(prefix, loc[:-1])
        see = f"`lrmgym config show` shows all {{n}} keys of {section} with their values"
        return f"{path}: unknown key (value {show(value)})" + allowed(loc[-1], fields, see)
    if kind == "missing":
        return f"{path}: missing required key; set it with {path}=VALUE."
    if kind in ("literal_error", "enum"):
        expected = err.get("ctx", {}).get("expected", "")
        options = re.findall(r"'([^']*)'", expected)
        return f"{path}: invalid value {show(value)}; allowed: {expected}.{did_you_mean(value, options, 0.5)}"
    allowed_range = bounds(model, loc)
    if _is_non_finite(value) and kind in (*_BOUND_KINDS, *_NUMBER_KINDS):
        return f"{path}: invalid value {str(value).strip()}: must be finite" + (
            f" ({allowed_range})." if allowed_range else "."
        )
    if allowed_range and kind in _BOUND_KINDS:
        return f"{path}: invalid value {show(value)}: expected {allowed_range}."
    message = err["msg"].replace("Input should be", "expected").replace("Value error, ", "").rstrip(".")
    if not loc:  # a model-level check (e.g. eval.k against eval.n): its message names the keys itself
        return f"{path}: {message}."
    if allowed_range and kind in _NUMBER_KINDS:
        message += f" ({allowed_range})"
    return f"{path}: invalid value {show(value)}: {message}."


def yaml_problem(err: Exception) -> str:
    """A YAML parser's error in one line: what it expected and where (``line L, column C``)."""
    problem = getattr(err, "problem", None) or (str(err).splitlines() or ["unreadable"])[0]
    mark = getattr(err, "problem_mark", None)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem
