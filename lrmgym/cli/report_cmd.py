"""``lrmgym report``: a run directory as one self-contained HTML page.

Example::

    lrmgym report runs/math-grpo-20260101-120000            # -> runs/math-grpo-20260101-120000/report.html
    lrmgym report runs/ring-zero --out /tmp/rz.html --max-samples 500

The page (see :mod:`lrmgym.report`) opens offline: the run's config, the before/after table, charts of reward,
accuracy, length, KL and the judges' metrics over steps, and a filterable table of the logged samples.
"""

from __future__ import annotations

from pathlib import Path

import click

from lrmgym.report.samples import DEFAULT_MAX_ROWS

__all__ = ["command"]


class _UserError(click.ClickException):
    exit_code = 2


@click.command("report", short_help="Write a self-contained HTML report of a run directory.")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), help="The page to write. [default: RUN_DIR/report.html]")
@click.option(
    "--max-samples",
    default=DEFAULT_MAX_ROWS,
    show_default=True,
    type=click.IntRange(min=0),
    help="Trajectories embedded at most (whole logged groups, spread evenly over the run).",
)
@click.option("--force", is_flag=True, help="Replace an existing page, or write --out into a run folder.")
def command(run_dir: Path, out: Path | None, max_samples: int, force: bool) -> None:
    """Write RUN_DIR's report: one HTML file that needs no network (default RUN_DIR/report.html).

    RUN_DIR is a directory made by `lrmgym run` (any learner; a staged run with its stages/ folders too), also
    while it trains. An existing page is replaced only with --force; the run's own files never are.
    """
    from lrmgym.files import OutputPathError, describe_os_error
    from lrmgym.report import ReportError, write_report

    try:
        path, report = write_report(run_dir, out, max_rows=max_samples, force=force)
    except (ReportError, OutputPathError) as err:
        raise _UserError(str(err)) from None
    except OSError as err:  # a full disk, a folder that cannot be created: the machine's, not the user's
        where = f" writing {err.filename}" if err.filename else ""
        raise click.ClickException(f"{describe_os_error(err)}{where}.") from None
    table = report.samples
    click.echo(
        f"report: {path} ({path.stat().st_size / 1e6:.1f} MB; {len(table.rows)} of {table.logged_rows} logged "
        "trajectories embedded)"
    )
