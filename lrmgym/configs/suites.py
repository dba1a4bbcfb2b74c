"""``eval=NAME`` on the command line: load a suite preset and turn it, with its data file, into override tokens.

See :mod:`lrmgym.eval.suites` for what a suite is. The suite's settings become ordinary tokens placed *before* the
user's, so ``eval.n=4`` after ``eval=aime24`` wins and every value is validated by the usual resolver.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lrmgym.configs.resolve import ConfigError, list_presets, load_preset, parse_value
from lrmgym.eval.suites import Suite, SuiteError

__all__ = ["load_suite", "split_suite_tokens", "suite_tokens"]

_DATA_KEY = "eval.data_path"


def load_suite(name: Any) -> Suite:
    """The suite preset ``name``; an unknown name raises :class:`SuiteError` with the known ones."""
    try:
        data = load_preset("eval", name)
    except ConfigError as err:
        raise SuiteError(str(err).replace("eval: unknown preset", "eval: unknown suite", 1)) from None
    return Suite(name=name, **data)


def _token_value(value: Any) -> str:
    """A value as override text that the resolver parses back to the same value (JSON is a subset of YAML)."""
    return json.dumps(value)


def split_suite_tokens(tokens: tuple[str, ...] | list[str]) -> tuple[list[Suite], dict[str, str], list[str]]:
    """Take ``eval=NAME`` (or ``eval=[A,B]``) and ``eval.data_path...`` out of the tokens.

    Returns:
        The suites chosen (none: a plain ``lrmgym eval``), the data path given for each (by suite name), and the
        other tokens in order.

    Raises:
        SuiteError: An unknown suite, a suite named twice, data paths that match no suite, or ``env=`` beside a
            suite (a suite sets the env itself).
    """
    chosen: Any = None
    paths: Any = None
    rest: list[str] = []
    for token in tokens:
        key, sep, raw = token.partition("=")
        if sep and key == "eval":
            chosen = parse_value(raw)
        elif sep and (key == _DATA_KEY or key.startswith(f"{_DATA_KEY}.")):
            value = parse_value(raw)
            if key == _DATA_KEY:
                paths = value
            else:
                paths = paths if isinstance(paths, dict) else {}
                paths[key.removeprefix(f"{_DATA_KEY}.")] = value
        else:
            rest.append(token)
    if chosen is None:
        if paths is not None:
            raise SuiteError(
                f"{_DATA_KEY} is set but no suite is chosen; add eval=NAME (suites: {', '.join(list_presets('eval'))})."
            )
        return [], {}, rest
    names = chosen if isinstance(chosen, list) else [chosen]
    suites = [load_suite(n) for n in names]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SuiteError(f"eval: {', '.join(map(str, twice))} is listed twice in {names}; name each suite once.")
    group = next((t for t in rest if t.partition("=")[0] == "env"), None)
    if group is not None:
        raise SuiteError(
            f"{group}: eval={names[0] if len(names) == 1 else names} sets the env itself; drop {group} (set an env "
            "option with env.KEY=VALUE instead)."
        )
    if len(suites) > 1 and any(t.startswith("env.") for t in rest):
        bad = next(t for t in rest if t.startswith("env."))
        raise SuiteError(
            f"{bad}: with several suites an env option would apply to envs of different kinds; run that suite alone "
            "to change its env options."
        )
    return suites, _paths_by_suite(suites, paths), rest


def _paths_by_suite(suites: list[Suite], paths: Any) -> dict[str, str]:
    if paths is None:
        return {}
    if not isinstance(paths, dict):
        if len(suites) > 1:
            listed = " ".join(f"{_DATA_KEY}.{s.name}=PATH" for s in suites)
            raise SuiteError(
                f"{_DATA_KEY}={paths!r} names one file but {len(suites)} suites are chosen; give one per suite: "
                f"{listed}."
            )
        return {suites[0].name: str(paths)}
    names = [s.name for s in suites]
    unknown = [k for k in paths if k not in names]
    if unknown:
        raise SuiteError(f"{_DATA_KEY}.{unknown[0]}: {unknown[0]!r} is not a chosen suite; chosen: {', '.join(names)}.")
    return {k: str(v) for k, v in paths.items()}


def suite_tokens(suite: Suite, given: str | None, rest: list[str]) -> list[str]:
    """The override tokens of ``suite`` with its data file, followed by the user's ``rest``.

    The data file is ``given`` (``eval.data_path``), else the last ``env.<data_option>=`` token of ``rest``.

    Raises:
        SuiteError: No data file, or one that is not an existing regular file: the message names the suite,
            the format expected and how to point at it. Nothing is ever downloaded.
    """
    option = f"env.{suite.data_option}"
    in_rest = [t.partition("=")[2] for t in rest if t.partition("=")[0] == option]
    path = given if given is not None else (str(parse_value(in_rest[-1])) if in_rest else None)
    if path is None:
        raise SuiteError(
            f"eval={suite.name}: no data file. {suite.title} is read from a local file and never downloaded: give "
            f"{_DATA_KEY}=PATH (beside other suites {_DATA_KEY}.{suite.name}=PATH), PATH being {suite.expects}."
        )
    file = Path(path).expanduser()
    if not file.is_file():
        what = "does not exist" if not file.exists() else "is a folder" if file.is_dir() else "is not a regular file"
        raise SuiteError(
            f"eval={suite.name}: the data file {path!r} {what}. Expected {suite.expects}; point {_DATA_KEY} at the "
            "file you downloaded (nothing is downloaded at run time)."
        )
    tokens = [f"env={suite.env['id']}"]
    tokens += [f"env.{k}={_token_value(v)}" for k, v in suite.env.items() if k != "id"]
    tokens.append(f"{option}={_token_value(path)}")
    tokens += [f"eval.{k}={_token_value(v)}" for k, v in suite.eval.items()]
    if given is not None:  # eval.data_path wins over an env.<data_option> the user also gave
        rest = [t for t in rest if t.partition("=")[0] != option]
    return tokens + rest
