"""``lrmgym tiny``: build and inspect the embedded default model (``policy=tiny``).

Examples::

    lrmgym tiny build                 # build (or find) the default tiny model in the cache
    lrmgym tiny build --seed 1 --force
    lrmgym tiny build --recipe testbed   # the reasoning testbed's model (env=testbed, see the README)
    lrmgym tiny info                  # where it is and what its build measured
"""

from __future__ import annotations

import json
from typing import Any

import click

__all__ = ["command"]


class _UserError(click.ClickException):
    exit_code = 2


def _config(seed: int, steps: int | None, threads: int | None, recipe: str = "default") -> Any:
    from pydantic import ValidationError

    from lrmgym.policies.tiny import TinyPolicyConfig

    try:
        train = {} if steps is None else {"steps": steps}
        return TinyPolicyConfig(seed=seed, recipe=recipe, train=train, threads=threads)
    except ValidationError as err:
        first = err.errors()[0]
        raise _UserError(f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from None


def _summary(folder: Any) -> str:
    facts = json.loads((folder / "build.json").read_text())
    return (
        f"tiny model: {folder}\n"
        f"  parameters: {facts['params']:,}   weights: {facts['weight_bytes'] / 1e6:.2f} MB\n"
        f"  build: {facts['build_s']:.1f} s wall, {facts['cpu_s']:.1f} s CPU ({facts['train_s']:.1f} s training, "
        f"{facts['tokens_per_s']:.0f} tok/s, "
        f"{facts['threads']} threads, load {facts['loadavg_before']} -> {facts['loadavg_after']})\n"
        f"  loss: {facts['first_loss']:.3f} -> {facts['final_loss']:.3f}"
    )


@click.group("tiny", short_help="Build or inspect the embedded default model (policy=tiny).")
def command() -> None:
    """Build or inspect the embedded default model: a ~0.8 M-parameter Llama trained here on the math env."""


_seed = click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0), help="Weight-init seed.")
_steps = click.option("--steps", default=None, type=click.IntRange(min=1), help="Training steps (default: recipe's).")
_recipe = click.option(
    "--recipe", default="default", show_default=True, type=click.Choice(["default", "testbed"]),
    help="What to train on: 'default' (env=math, the shipped model) or 'testbed' (env=testbed, see the README).",
)  # fmt: skip


@command.command("build")
@_recipe
@_seed
@_steps
@click.option("--threads", default=None, type=click.IntRange(min=1), help="torch threads (default: torch's).")
@click.option("--force", is_flag=True, help="Rebuild even if cached.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def build(recipe: str, seed: int, steps: int | None, threads: int | None, force: bool, quiet: bool) -> None:
    """Build the tiny model into the cache ($XDG_CACHE_HOME/lrmgym/tiny/<hash>), or report the cached one."""
    from lrmgym.learners.algorithms.sft import build_tiny

    cfg = _config(seed, steps, threads, recipe)
    cached = (cfg.cache_dir() / "build.json").is_file() and not force
    shipped = cfg.shipped_dir()
    if shipped is not None and not cached and not force:
        click.echo("shipped with lrmgym (--force rebuilds it into the cache); " + _summary(shipped))
        return
    folder = build_tiny(cfg, force=force, progress=not quiet)
    click.echo(("already built; " if cached else "") + _summary(folder))


@command.command("info")
@_recipe
@_seed
@_steps
def info(recipe: str, seed: int, steps: int | None) -> None:
    """Show where the tiny model for a seed lives and what its build measured."""
    cfg = _config(seed, steps, None, recipe)
    folder = cfg.model_dir()
    if not (folder / "build.json").is_file():
        flag = "" if recipe == "default" else f" --recipe {recipe}"
        click.echo(f"not built yet (would be {folder}); run `lrmgym tiny build{flag}`")
        return
    click.echo(("shipped with lrmgym; " if folder == cfg.shipped_dir() else "") + _summary(folder))
