"""Reading a run directory for the report: config, run record, summary, metrics, and where the samples are.

A run directory is what :mod:`lrmgym.learners.engine.loop` writes (``metrics.jsonl``, ``samples.jsonl``,
``summary.json``; the CLI adds ``config.yaml`` and ``run.json``), or a staged run (Ring-Zero) whose loops
each write those files into ``stages/NN-name/`` under one top-level ``config.yaml`` and ``summary.json``.
Every loop's folder is a :class:`Part`; a plain run has one, a staged run one per stage.

Input is read strictly: a line of ``metrics.jsonl`` that is torn or not JSON ends the report with a
:class:`ReportError` naming the file and the line, never with a report that silently lacks steps. Files a run
writes only at its end (``summary.json``) or only for some learners (``samples.jsonl``) may be missing: the
report says so in a note.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Part", "ReportError", "RunData", "iter_jsonl", "read_run"]

STAGES_DIR = "stages"
"""The folder of a staged run's stages (as :mod:`lrmgym.learners.engine.staged` names it)."""
_STAGE_RE = re.compile(r"^\d+-.+$")
_EXPECTED = "a run directory made by `lrmgym run` (metrics.jsonl, summary.json, config.yaml)"


class ReportError(ValueError):
    """The input is not a run directory the report can read; the message names the path and what was expected."""


@dataclass
class Part:
    """One loop's folder: the whole run, or one stage of a staged run.

    Attributes:
        name: ``""`` for a plain run, the folder name (``"01-rl1"``) for a stage.
        folder: The folder.
        metrics: The records of its ``metrics.jsonl``, in file order.
        summary: Its ``summary.json``, or ``None`` when it has none yet.
        samples: Its ``samples.jsonl``, or ``None`` when it logged none.
    """

    name: str
    folder: Path
    metrics: list[dict[str, Any]]
    summary: dict[str, Any] | None
    samples: Path | None

    @property
    def label(self) -> str:
        """The stage's name without its number (``"rl1"``), or ``"run"`` for a plain run."""
        return self.name.split("-", 1)[1] if self.name else "run"


@dataclass
class RunData:
    """Everything the report reads of a run directory.

    Attributes:
        path: The run directory.
        config_text: ``config.yaml`` as written, or ``None``.
        config: ``config.yaml`` parsed (``{}`` when absent).
        record: ``run.json`` (the config's hash and the lrmgym version), or ``None``.
        summary: The top-level ``summary.json``, or ``None`` when the run has not finished.
        parts: The loops' folders, in order.
        staged: Whether the run is a staged one (``stages/NN-name/``).
        notes: What is missing, for the reader of the report.
    """

    path: Path
    config_text: str | None
    config: dict[str, Any]
    record: dict[str, Any] | None
    summary: dict[str, Any] | None
    parts: list[Part]
    staged: bool
    notes: list[str] = field(default_factory=list)

    def section(self, name: str) -> dict[str, Any]:
        """A section of the config (``"env"``, ``"learner"``), ``{}`` when absent."""
        value = self.config.get(name)
        return value if isinstance(value, dict) else {}


def iter_jsonl(path: Path) -> Iterator[tuple[int, int, int, dict[str, Any]]]:
    """``(line number, byte offset, byte length, record)`` of each JSON object in ``path`` (blank lines skipped).

    Raises:
        ReportError: A line is torn (no newline at its end), is not JSON, or is not a JSON object.
    """
    offset = 0
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            start, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            if not raw.endswith(b"\n"):
                raise ReportError(
                    f"{path}: line {number} is incomplete (no newline at its end: cut off by a crash, or still being "
                    "written); expected complete JSON lines. Wait for the run to finish, or resume it with "
                    "`lrmgym run --resume`, which drops a torn last line."
                )
            try:
                record = json.loads(raw.decode("utf-8", errors="replace"))
            except json.JSONDecodeError as err:
                raise ReportError(
                    f"{path}: line {number} is not JSON ({err.msg}); expected one JSON object per line."
                ) from None
            if not isinstance(record, dict):
                raise ReportError(
                    f"{path}: line {number} is a JSON {type(record).__name__}, expected a JSON object per line."
                )
            yield number, start, len(raw), record


def _read_json(path: Path, what: str) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError as err:
        raise ReportError(f"{path}: not valid JSON ({err.msg}, line {err.lineno}); expected {what}.") from None
    if not isinstance(value, dict):
        raise ReportError(f"{path}: a JSON {type(value).__name__}, expected {what} (a JSON object).")
    return value


def _read_config(path: Path) -> tuple[str | None, dict[str, Any]]:
    import yaml

    if not path.is_file():
        return None, {}
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as err:
        first = str(err).splitlines()[0] if str(err) else "unreadable"
        raise ReportError(
            f"{path}: not valid YAML ({first}); expected the resolved config `lrmgym run` saves."
        ) from None
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ReportError(f"{path}: a YAML {type(value).__name__}, expected a mapping of sections (env:, learner:).")
    return text, value


def _read_part(name: str, folder: Path) -> Part:
    metrics_path = folder / "metrics.jsonl"
    metrics = [rec for _, _, _, rec in iter_jsonl(metrics_path)] if metrics_path.is_file() else []
    summary = _read_json(folder / "summary.json", "the summary a run writes when it ends")
    samples = folder / "samples.jsonl"
    return Part(name, folder, metrics, summary, samples if samples.is_file() else None)


def _check_run_dir(path: Path) -> None:
    if not path.exists():
        raise ReportError(f"{path}: no such directory; expected {_EXPECTED}.")
    if not path.is_dir():
        raise ReportError(f"{path} is a file; expected {_EXPECTED}.")
    if (path / "metrics.jsonl").is_file() or (path / STAGES_DIR).is_dir():
        return
    if (path / "eval.json").is_file():
        raise ReportError(
            f"{path} holds an evaluation (eval.json, made by `lrmgym eval`), not a training run; expected {_EXPECTED}."
        )
    raise ReportError(f"{path} is not a run directory: it has no metrics.jsonl (nor stages/); expected {_EXPECTED}.")


def read_run(path: str | Path) -> RunData:
    """Read the run directory ``path`` (a plain run or a staged one).

    Raises:
        ReportError: ``path`` is not a run directory, or one of its files cannot be read.
    """
    path = Path(path)
    _check_run_dir(path)
    config_text, config = _read_config(path / "config.yaml")
    record = _read_json(path / "run.json", "the run record `lrmgym run` writes")
    summary = _read_json(path / "summary.json", "the summary a run writes when it ends")
    stages_dir = path / STAGES_DIR
    staged = stages_dir.is_dir() and not (path / "metrics.jsonl").is_file()
    if staged:
        folders = sorted(p for p in stages_dir.iterdir() if p.is_dir() and _STAGE_RE.match(p.name))
        if not folders:
            raise ReportError(f"{stages_dir} holds no stage folders; expected stages/NN-name/ folders of a staged run.")
        parts = [_read_part(p.name, p) for p in folders]
    else:
        parts = [_read_part("", path)]
    run = RunData(path, config_text, config, record, summary, parts, staged)
    if config_text is None:
        run.notes.append("No config.yaml: the run was not started by `lrmgym run` (or the file was removed).")
    if summary is None:
        run.notes.append(
            "No summary.json: the run has not finished (or was killed); the before/after table needs it, the "
            "metrics and samples below are what was logged so far."
        )
    return run
