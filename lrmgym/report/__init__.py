"""A run directory as one self-contained HTML page: config, before/after table, metric charts, browsable samples.

Example::

    from lrmgym.report import write_report
    path, report = write_report("runs/math-grpo-20260101-120000")   # -> runs/.../report.html

The page needs no network and no other file: the charts are inline SVG, the samples inline JSON rendered by
an inline script. It reads every learner's run directory (GRPO, PPO, DAPO, ReasonMaxxer, the staged Ring-Zero
runs with their ``stages/NN-name/`` folders and SFT stages). See :mod:`lrmgym.report.page` for how untrusted
model output is escaped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from lrmgym.report.rundata import ReportError, RunData, read_run
from lrmgym.report.samples import DEFAULT_MAX_BYTES, DEFAULT_MAX_ROWS, SampleTable, load_samples

__all__ = ["DEFAULT_MAX_ROWS", "Report", "ReportError", "build_report", "write_report"]

REPORT_NAME = "report.html"
"""The page's file name inside the run directory, by default."""


@dataclass
class Report:
    """A built report: the page and what it was built from."""

    html: str
    run: RunData
    samples: SampleTable


def build_report(run_dir: str | Path, max_rows: int = DEFAULT_MAX_ROWS, max_bytes: int = DEFAULT_MAX_BYTES) -> Report:
    """Read ``run_dir`` and build its page, embedding at most ``max_rows`` trajectories (``max_bytes`` of lines).

    Raises:
        ReportError: ``run_dir`` is not a run directory or one of its files cannot be read.
    """
    return _build(read_run(run_dir), max_rows, max_bytes)


def _build(run: RunData, max_rows: int, max_bytes: int) -> Report:
    from lrmgym.report.page import render_page

    samples = load_samples(run.parts, max_rows=max_rows, max_bytes=max_bytes)
    return Report(render_page(run, samples), run, samples)


def write_report(
    run_dir: str | Path, out: str | Path | None = None, max_rows: int = DEFAULT_MAX_ROWS, force: bool = True
) -> tuple[Path, Report]:
    """Build the report of ``run_dir`` and write it (atomically) to ``out``, default ``run_dir/report.html``.

    ``force``: replace an existing ``out``, and allow an ``out`` in a run folder other than the default
    (:func:`lrmgym.files.check_output_file`).

    Raises:
        ReportError: As :func:`build_report`.
        lrmgym.files.OutputPathError: ``out`` is one of the run's files, a directory, a device, an existing file
            without ``force`` ...
    """
    from lrmgym.files import atomic_write_bytes, check_output_file

    run = read_run(run_dir)
    target = Path(out) if out is not None else run.path / REPORT_NAME
    inputs = [run.path / n for n in ("config.yaml", "run.json", "summary.json")]
    inputs += [p for part in run.parts for p in part.folder.glob("*.json*")]
    default = os.path.realpath(target) == os.path.realpath(run.path / REPORT_NAME)
    check_output_file(target, inputs=[p for p in inputs if p.is_file()], what="--out", force=force,
                      owned=(REPORT_NAME,), default=default)  # fmt: skip
    report = _build(run, max_rows, DEFAULT_MAX_BYTES)
    atomic_write_bytes(target, report.html.encode("utf-8", errors="replace"))  # a lone surrogate becomes "?"
    return target, report
