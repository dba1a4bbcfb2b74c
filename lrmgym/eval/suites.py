"""Standard evaluation suites: ``lrmgym eval eval=aime24`` (or aime25, gpqa_diamond, livecodebench, or a list).

This module holds what evaluation needs (the :class:`Suite` record, the file checks, the summary); choosing a
suite on the command line is :mod:`lrmgym.configs.suites`.

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

import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["INTERVAL_METHOD", "Suite", "SuiteError", "check_items", "print_summary", "suite_summary"]

INTERVAL_METHOD = "percentile bootstrap over problems"
"""How the intervals of a suite's figures are computed (recorded in each report)."""


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
