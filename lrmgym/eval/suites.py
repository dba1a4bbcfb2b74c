"""Standard evaluation suites: ``lrmgym eval eval=aime24`` (or aime25, gpqa_diamond, livecodebench, or a list).

A suite is a preset (``lrmgym/configs/presets/eval/<name>.yaml``) that fixes the env (id and options) and the
evaluation (samples, k, sampling) of a published benchmark, read from a local file the user names with
``eval.data_path=PATH`` (several suites: ``eval.data_path.NAME=PATH`` each) or with the env's own option
(``env.source=`` / ``env.data_path=``). Nothing is downloaded: a missing file is one error that names the suite,
the format expected and how to point at it.

The suite's settings become ordinary override tokens placed *before* the user's, so ``eval.n=4`` or
``env.timeout_s=2`` after ``eval=aime24`` wins, and every value is validated by the usual resolver.

Intervals: every figure of a suite (avg@n, pass@k) is a mean over problems, and its interval is a percentile
bootstrap over problems (the samples of one problem are correlated, the problems are the independent units);
see :mod:`lrmgym.eval.passk`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lrmgym.configs.resolve import ConfigError, list_presets, load_preset, parse_value

__all__ = [
    "INTERVAL_METHOD",
    "Suite",
    "SuiteError",
    "check_items",
    "load_suite",
    "split_suite_tokens",
    "suite_summary",
    "suite_tokens",
]

INTERVAL_METHOD = "percentile bootstrap over problems"
"""How the intervals of a suite's figures are computed (recorded in each report)."""
_DATA_KEY = "eval.data_path"


class SuiteError(ValueError):
    """A user's mistake in choosing or pointing at a suite; the message names it and the fix."""


@dataclass(frozen=True)
class Suite:
    """One benchmark preset: its env, its evaluation settings and the data file it needs.

    Attributes:
        name: The preset name (``aime24``).
        title: The benchmark's name for tables (``AIME 2024``).
        expects: The file the user must give, in words (format and fields).
        data_option: The env option that takes the file's path (``source`` for math and code, ``data_path``).
        env: The env's id and options.
        eval: ``eval.*`` settings.
        integer_answers: Every gold answer must be an integer 0-999 (AIME): checked when the file is read.
    """

    name: str
    title: str
    expects: str
    data_option: str
    env: dict[str, Any] = field(default_factory=dict)
    eval: dict[str, Any] = field(default_factory=dict)
    integer_answers: bool = False


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


_AIME_ANSWER = re.compile(r"\d{1,3}")


def check_items(suite: Suite, env: Any, seed: int = 0) -> int:
    """The number of problems in the suite's file, after its own checks (AIME: every gold an integer 0-999).

    Raises:
        SuiteError: A problem breaks the suite's rule; the message names it and the file.
    """
    base = env.unwrapped
    count = getattr(base, "num_items", None)
    if not isinstance(count, int) or count < 1:
        raise SuiteError(f"eval={suite.name}: the data file holds no problems.")
    if suite.integer_answers:
        for index in range(count):
            task = base.task_at(index, seed=seed)
            answer = str(task.answer)
            if not _AIME_ANSWER.fullmatch(answer) or task.metadata.get("answer_form") not in (None, "number"):
                raise SuiteError(
                    f"eval={suite.name}: problem {task.id} has the answer {answer[:40]!r}; {suite.title} answers are "
                    "integers from 0 to 999. Is this the right file (and env.answer_field the right field)?"
                )
    return count


def suite_summary(suite: Suite, report: dict[str, Any]) -> dict[str, Any]:
    """The figures of one suite's report for the summary table and ``suites.json``."""
    n = report["n"]
    return {
        "suite": suite.name, "title": suite.title, "tasks": report["tasks"], "n": n,
        f"avg@{n}": report["avg@n"], **report["pass@k"],
        "format_failure_rate": report["format_failure_rate"]["value"],
        "ungradeable_rate": report["ungradeable_rate"]["value"],
        "interval": report.get("interval"),
    }  # fmt: skip


def print_summary(rows: list[dict[str, Any]], confidence: float, console: Any = None) -> None:
    """One table over suites: problems, samples per problem, avg@n and each pass@k, each with its interval."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    level = int(round(confidence * 100))
    ks = sorted({key for row in rows for key in row if key.startswith("pass@")}, key=lambda k: int(k[5:]))
    table = Table(title=f"eval suites: mean over problems [{level}% interval, {INTERVAL_METHOD}]")
    for column in ("suite", "problems", "n", "avg@n", *ks):
        table.add_column(column, justify="left" if column == "suite" else "right")

    def cell(entry: dict[str, Any] | None) -> str:
        if entry is None:
            return "-"
        return f"{100 * entry['value']:.1f}% [{100 * entry['ci'][0]:.1f}, {100 * entry['ci'][1]:.1f}]"

    for row in rows:
        n = row["n"]
        table.add_row(row["title"], str(row["tasks"]), str(n), cell(row[f"avg@{n}"]), *(cell(row.get(k)) for k in ks))
    console.print(table)
