"""``lrmgym judge``: score a JSONL of completions with judges, outside training.

Example::

    lrmgym judge --input completions.jsonl env=math judge=[accuracy,format_strict] judge.format_strict.weight=0.5

Judges and the env are chosen with the same ``GROUP=PRESET`` and ``dotted.key=value`` tokens as
``lrmgym run`` (see :mod:`lrmgym.configs.resolve`); only the ``env`` and ``judge`` sections apply here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

__all__ = ["command"]


class _UserError(click.ClickException):
    exit_code = 2


def _resolve(tokens: tuple[str, ...]) -> tuple[list[Any], Any | None]:
    """The judge configs (in order) and the env config (or ``None``) the tokens select."""
    from lrmgym.configs.resolve import ConfigError, list_presets, merged_tree, validate_component, validate_env

    try:
        tree = merged_tree(tokens, defaults={"judge": []}, add_accuracy=False)
        extra = sorted(k for k, v in tree.items() if k not in ("env", "judge") and v)
        if extra:
            raise ConfigError(
                f"{extra[0]}: not used by `lrmgym judge`, which reads only env=... and judge=... settings."
            )
        judges_raw = tree.get("judge") or {}
        if not judges_raw:
            raise ConfigError(
                "judge: no judge chosen; add judge=PRESET or judge=[A,B] "
                f"(presets: {', '.join(list_presets('judge'))})."
            )
        if not isinstance(judges_raw, dict):
            raise ConfigError("judge: expected judges by preset name, e.g. judge=[accuracy,format_strict].")
        judges = [validate_component("judge", f"judge.{name}", cfg) for name, cfg in judges_raw.items()]
        env = validate_env(tree["env"]) if "env" in tree else None
    except ConfigError as err:
        raise _UserError(str(err)) from None
    return judges, env


@click.command("judge", context_settings={"ignore_unknown_options": True})
@click.option(
    "--input",
    "input_path",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="JSONL of completions: one {prompt, completion | completions, answer?, task_id?} per line.",
)
@click.option(
    "--output",
    "output_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Where to write the verdicts (default: INPUT with .verdicts.jsonl).",
)
@click.option("--force", is_flag=True, help="Replace an existing output file, or add it to a run folder.")
@click.argument("overrides", nargs=-1, metavar="[OVERRIDES]...")
def command(input_path: Path, output_path: Path | None, force: bool, overrides: tuple[str, ...]) -> None:  # fmt: skip
    """Score a JSONL of completions with judges and write one verdict per line.

    OVERRIDES choose the judges and, optionally, the env whose verifier runs first, e.g.
    `env=math judge=[accuracy,format_strict] judge.format_strict.weight=0.5`. Without env=..., the
    accuracy and arena judges use each record's `score` field. Judge failures (an endpoint down) are
    recorded as ungradeable verdicts and counted; they do not stop the command. An existing output file is
    replaced only with --force; a run folder's own files (metrics.jsonl, samples.jsonl ...) never are, and a
    new file goes into a run folder only with --force.
    """
    from lrmgym.files import OutputPathError, check_output_file
    from lrmgym.judges.scoring import JudgeInputError, judge_file

    judge_configs, env_config = _resolve(overrides)
    out = output_path or input_path.with_name(input_path.name.removesuffix(".jsonl") + ".verdicts.jsonl")
    try:  # before any judge or env is built: a bad output path costs nothing
        check_output_file(out, inputs=[input_path], what="--output", force=force)
    except OutputPathError as err:
        raise _UserError(str(err)) from None
    judges = [cfg.build() for cfg in judge_configs]
    env = env_config.make() if env_config is not None else None
    try:
        stats = judge_file(input_path, out, judges, env=env)
    except JudgeInputError as err:
        raise _UserError(str(err)) from None
    mean = "n/a" if stats["mean_score"] is None else f"{stats['mean_score']:.4f}"
    click.echo(
        f"scored {stats['completions']} completions in {stats['groups']} groups: {stats['gradeable']} gradeable, "
        f"{stats['ungradeable']} ungradeable, mean score {mean}"
    )
    for name, counters in stats["judges"].items():
        shown = ", ".join(f"{k}={v:g}" for k, v in sorted(counters.items()) if isinstance(v, (int, float)))
        click.echo(f"  {name}: {shown}")
    for name, metrics in stats.get("arena", {}).items():
        click.echo(f"  {name} metrics: {json.dumps(metrics)}")
    click.echo(f"verdicts: {out}")
