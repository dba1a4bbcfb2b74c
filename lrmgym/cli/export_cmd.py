"""``lrmgym export``: turn a run's logs into data sets for other trainers.

Example::

    lrmgym export traces runs/math-grpo-20260101-120000 --pairs pairs.jsonl --min-margin 0.5

``traces`` writes the rollouts ``samples.jsonl`` logged, one JSON object per rollout (the schema is in
:mod:`lrmgym.learners.export`), and optionally preference pairs in TRL's DPO format.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

__all__ = ["command"]


class _UserError(click.ClickException):
    exit_code = 2


@click.group("export", short_help="Export a run's rollouts as JSONL traces and DPO preference pairs.")
def command() -> None:
    """Turn a run's logs into data sets for other trainers."""


def _samples_file(source: Path) -> Path:
    """The ``samples.jsonl`` that RUN_DIR names (RUN_DIR may be that file itself)."""
    from lrmgym.learners.staged import STAGES_DIR

    if source.is_file():
        return source
    if not source.is_dir():
        raise _UserError(f"RUN_DIR: {str(source)!r} does not exist; give the directory of a `lrmgym run`.")
    samples = source / "samples.jsonl"
    if samples.is_file():
        return samples
    stages = source / STAGES_DIR
    logged = sorted(p.name for p in stages.iterdir() if (p / "samples.jsonl").is_file()) if stages.is_dir() else []
    if logged:
        raise _UserError(
            f"RUN_DIR: {str(source)!r} is a staged run, whose samples are logged per stage; export one stage, e.g. "
            f"`lrmgym export traces {stages / logged[0]}` (stages: {', '.join(logged)})."
        )
    raise _UserError(
        f"RUN_DIR: {str(source)!r} has no samples.jsonl; give the directory of a `lrmgym run` that trained at least "
        "one step with learner.log_samples > 0."
    )


@command.command("traces")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "--out", "out", type=click.Path(path_type=Path, dir_okay=False), default=None,
    help="Where to write the rollouts (default: RUN_DIR/traces.jsonl).",
)  # fmt: skip
@click.option(
    "--pairs", "pairs", type=click.Path(path_type=Path, dir_okay=False), default=None,
    help="Also write preference pairs here, in TRL's DPO format.",
)  # fmt: skip
@click.option(
    "--min-margin", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
    help="Skip pairs whose score difference is below this (ties are always skipped).",
)  # fmt: skip
@click.option(
    "--by", type=click.Choice(["auto", "reward", "strength"]), default="auto", show_default=True,
    help="The score pairs are ranked by: auto is the arena strength in groups the arena routed, else the reward.",
)  # fmt: skip
def traces(run_dir: Path, out: Path | None, pairs: Path | None, min_margin: float, by: str) -> None:
    """Write a run's logged rollouts with their verdicts as JSONL, one rollout per line.

    \b
    RUN_DIR is the directory of a `lrmgym run` (or its samples.jsonl). That file holds only the first
    learner.log_samples groups of each step (default 2); to log every rollout, train with
    learner.log_samples=<learner.prompts_per_step>. Each line:
      {"task_id", "prompt", "completion", "prompt_token_ids", "token_ids", "reward", "correct", "strength",
       "step", "verdict"}
    Token ids are not logged (null). A multi-turn trajectory is exported as its final policy turn, with the
    transcript before it as the prompt. "strength" is the Bradley-Terry strength the arena judge gave the
    rollout when its group went to the tournament (null otherwise), as the arena records it: in its verdict
    component's reason, to 3 decimals.

    \b
    --pairs FILE: {"prompt", "chosen", "rejected"} per line (TRL's preference format; lists of messages when
    the prompt is chat messages). In each group, the best rollout against each lower-scored one: at most
    G - 1 pairs per group, best vs worst among them. Ties, margins under --min-margin, completions identical
    to the best, repeated pairs and rollouts with another prompt (multi-turn transcripts) are skipped.
    """  # noqa: D301 -- click needs the real "\b" escape (its no-rewrap marker)
    from lrmgym.files import OutputPathError, check_output_file
    from lrmgym.learners.export import TraceFileError, export_traces

    samples = _samples_file(run_dir)
    out = out if out is not None else samples.parent / "traces.jsonl"
    try:
        out_path = check_output_file(out, inputs=[samples], what="--out")
        pairs_path = check_output_file(pairs, inputs=[samples], what="--pairs") if pairs is not None else None
    except OutputPathError as err:
        raise _UserError(str(err)) from None
    if pairs_path is not None and os.path.realpath(pairs_path) == os.path.realpath(out_path):
        raise _UserError(f"--pairs {str(pairs)!r} is also the --out file; give the pairs another path.")
    try:
        stats = export_traces(samples, out_path, pairs_path, min_margin=min_margin, by=by)  # type: ignore[arg-type]
    except TraceFileError as err:
        raise _UserError(str(err)) from None
    steps = f"steps {stats.steps[0]}-{stats.steps[1]}" if stats.steps else "no steps"
    line = (f"exported {stats.rollouts} rollouts of {stats.groups} groups ({steps}; {stats.with_strength} with an "
            f"arena strength) to {out_path}")  # fmt: skip
    if pairs_path is not None:
        skipped = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in stats.skipped.items() if v) or "none"
        line += f"; {stats.pairs} pairs to {pairs_path} (skipped: {skipped})"
    if stats.torn_last_line:
        line += "; dropped a torn last line (the run was killed while writing it)"
    click.echo(line)
