"""The ``lrmgym`` command line.

Every command that takes a config reads ``GROUP=PRESET`` and ``dotted.key=value`` tokens (see
:mod:`lrmgym.configs.resolve`). A user's mistake ends with one ``Error: ...`` line and exit code 2, before
anything is written.
"""

from __future__ import annotations

import datetime as dt
import importlib
import importlib.util
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import click

from lrmgym import __version__

_OVERRIDES_HELP = "GROUP=PRESET and dotted.key=VALUE tokens, e.g. env=math learner=grpo learner.lr=1e-4"


class UserError(click.ClickException):
    """A user's mistake: printed as one ``Error: ...`` line, exit code 2."""

    exit_code = 2


def _resolve(tokens: tuple[str, ...], defaults: dict[str, Any] | None = None):
    from lrmgym.configs.resolve import ConfigError, resolve

    try:
        return resolve(tokens, defaults)
    except ConfigError as err:
        raise UserError(str(err)) from None


def _load_env(env_id: str, options: dict[str, Any]):
    from pydantic import ValidationError

    import lrmgym
    from lrmgym.configs.resolve import ConfigError, format_error

    try:
        return lrmgym.make(env_id, **options)
    except lrmgym.UnknownEnvError as err:
        raise UserError(str(err)) from None
    except ValidationError as err:
        cls = lrmgym.registry.env_class(env_id)
        raise UserError(format_error("env", err.errors()[0], getattr(cls, "Config", None))) from None
    except (ConfigError, ValueError, TypeError, FileNotFoundError) as err:
        raise UserError(f"env {env_id}: {err}") from None


def _parse_options(tokens: tuple[str, ...]) -> dict[str, Any]:
    from lrmgym.configs.resolve import parse_value

    options = {}
    for token in tokens:
        key, sep, value = token.partition("=")
        if not sep or not key.isidentifier():
            raise UserError(f"{token!r} is not an env option: expected KEY=VALUE, e.g. difficulty=2.")
        options[key] = parse_value(value)
    return options


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


# ------------------------------------------------------------------------------------------------ root
class _LazyGroup(click.Group):
    """A group whose extra commands live in their component's module, imported only when used or listed."""

    lazy: dict[str, str] = {"judge": "lrmgym.cli.judge_cmd", "tiny": "lrmgym.cli.tiny_cmd"}

    def _lazy_command(self, name: str) -> click.Command | None:
        try:
            return importlib.import_module(self.lazy[name]).command
        except ImportError:  # the component is not installed in this build
            return None

    def list_commands(self, ctx: click.Context) -> list[str]:
        present = [n for n in self.lazy if importlib.util.find_spec(self.lazy[n]) is not None]
        return sorted([*super().list_commands(ctx), *present])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy:
            return self._lazy_command(cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="lrmgym")
def cli() -> None:
    """lrmgym: environments with verifiable rewards, judges and learners for reasoning LLMs.

    \b
    Quick start:
      lrmgym run env=math learner=grpo        train the embedded tiny model on CPU
      lrmgym eval env=game24 eval.n=8         pass@k of a policy on an env
      lrmgym envs list                        the registered environments
      lrmgym config show env=math learner.lr=1e-4
    """  # noqa: D301 -- click needs the real "\b" escape (its no-rewrap marker); a raw docstring breaks it


# ------------------------------------------------------------------------------------------------ envs
@cli.group()
def envs() -> None:
    """List, describe and sample environments."""


@envs.command("list")
def envs_list() -> None:
    """List the registered environments (bundled and plug-ins)."""
    import lrmgym
    from lrmgym.configs.resolve import list_presets, load_preset

    presets: dict[str, list[str]] = {}
    for name in list_presets("env"):
        presets.setdefault(str(load_preset("env", name).get("id")), []).append(name)
    for env_id in lrmgym.list_envs(namespace=None):
        try:
            cls = lrmgym.registry.env_class(env_id)
            summary = ((cls.__doc__ or "").strip().splitlines() or [""])[0] if cls else ""
        except Exception as err:  # noqa: BLE001 - a broken plug-in must not hide the others
            summary = f"(cannot be loaded: {err})"
        names = ", ".join(f"env={p}" for p in presets.get(env_id, []))
        click.echo(f"{env_id:<24} {summary}" + (f"  [{names}]" if names else ""))


@envs.command("show")
@click.argument("env_id")
def envs_show(env_id: str) -> None:
    """Describe ENV_ID: its class, its options with defaults and their documentation."""
    import lrmgym

    try:
        spec = lrmgym.spec(env_id)
    except lrmgym.UnknownEnvError as err:
        raise UserError(str(err)) from None
    cls = lrmgym.registry.env_class(spec.id)
    click.echo(f"id:          {spec.id}")
    click.echo(f"entry point: {spec.entry_point}")
    if cls is not None:
        click.echo(f"summary:     {((cls.__doc__ or '').strip().splitlines() or [''])[0]}")
        model = getattr(cls, "Config", None)
        if model is not None:
            click.echo("options:")
            for name, field in model.model_fields.items():
                default = field.get_default(call_default_factory=True)
                click.echo(f"  {name} = {default!r}")
                if field.description:
                    click.echo(f"      {field.description}")


@envs.command("sample")
@click.argument("env_id")
@click.argument("options", nargs=-1)
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0), help="Task stream seed.")
@click.option("-n", "--count", default=3, show_default=True, type=click.IntRange(1, 1000), help="How many tasks.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per task instead of text.")
def envs_sample(env_id: str, options: tuple[str, ...], seed: int, count: int, as_json: bool) -> None:
    """Print the first tasks of ENV_ID's stream SEED. OPTIONS are env options as KEY=VALUE."""
    env = _load_env(env_id, _parse_options(options))
    try:
        env.reset(seed=seed)
        for i in range(count):
            _, info = env.reset(options={"index": i})
            task = info["task"]
            if as_json:
                row = {"id": task.id, "prompt": task.prompt, "answer": task.answer, "metadata": dict(task.metadata)}
                click.echo(json.dumps(row, default=str, ensure_ascii=False))
            else:
                click.echo(f"--- {task.id}  (difficulty: {task.difficulty})")
                click.echo(f"prompt: {task.prompt}")
                click.echo(f"answer: {task.answer}")
    finally:
        env.close()


# ------------------------------------------------------------------------------------------------ config
@cli.group()
def config() -> None:
    """Inspect configurations."""


@config.command("show")
@click.argument("overrides", nargs=-1, metavar="[OVERRIDES]...")
def config_show(overrides: tuple[str, ...]) -> None:
    """Print the resolved config as YAML. OVERRIDES: GROUP=PRESET and dotted.key=VALUE tokens."""
    click.echo(_resolve(overrides).to_yaml(), nl=False)


@config.command("presets")
def config_presets() -> None:
    """List the shipped presets of each group."""
    from lrmgym.configs.resolve import GROUPS, list_presets

    for group in GROUPS:
        click.echo(f"{group}: {', '.join(list_presets(group))}")


# ------------------------------------------------------------------------------------------------ run
def _new_run_dir(cfg: Any) -> Path:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    env_name = cfg.env.id.split("/")[-1].split("-v")[0].lower()
    name = cfg.run.name or f"{env_name}-{cfg.learner.kind}-{stamp}"
    run_dir = Path(cfg.run.output_dir) / name
    if run_dir.exists():
        raise UserError(
            f"run.name: the run directory {str(run_dir)!r} already exists; choose another run.name, "
            f"or continue it with `lrmgym run --resume {run_dir}`."
        )
    return run_dir


@cli.command(
    short_help="Train a policy, e.g. lrmgym run env=math learner=grpo.",
    context_settings={"ignore_unknown_options": True},
)
@click.argument("overrides", nargs=-1, metavar="[OVERRIDES]...")
@click.option("--resume", "resume_dir", type=click.Path(path_type=Path), help="Continue the run in this directory.")
def run(overrides: tuple[str, ...], resume_dir: Path | None) -> None:
    """Train: env x judge x learner x policy, e.g. `lrmgym run env=math learner=grpo`.

    OVERRIDES are GROUP=PRESET and dotted.key=VALUE tokens; see `lrmgym config presets` and
    `lrmgym config show`. The run directory gets the resolved config, metrics, samples, checkpoints and plots.
    """
    import yaml

    from lrmgym.compose import train
    from lrmgym.configs.resolve import ConfigError, resolve_dict

    if resume_dir is not None:
        if overrides:
            raise UserError(
                f"--resume continues a run with its saved config; remove the overrides {' '.join(overrides)} "
                "(edit RUN_DIR/config.yaml deliberately if you must change it)."
            )
        config_path = resume_dir / "config.yaml"
        if not config_path.is_file():
            raise UserError(f"--resume: {str(config_path)!r} not found; expected a run directory made by `lrmgym run`.")
        try:
            cfg = resolve_dict(yaml.safe_load(config_path.read_text(encoding="utf-8")) or {})
        except (ConfigError, yaml.YAMLError) as err:
            raise UserError(f"--resume: {config_path}: {err}") from None
        run_dir = resume_dir
    else:
        cfg = _resolve(overrides)
        run_dir = _new_run_dir(cfg)
    if not callable(getattr(cfg.learner, "build", None)):
        raise UserError(
            f"learner.kind: the {cfg.learner.kind!r} learner cannot train in this build (its config has no build(ctx))."
        )
    if resume_dir is None:
        run_dir.mkdir(parents=True)
        _write_atomic(run_dir / "config.yaml", cfg.to_yaml())
    click.echo(f"run directory: {run_dir}")
    try:
        train(cfg, run_dir, resume=resume_dir is not None)
    except (FileNotFoundError, ConfigError) as err:  # e.g. policy.model points nowhere: a user mistake
        if resume_dir is None and [p.name for p in run_dir.iterdir()] == ["config.yaml"]:
            shutil.rmtree(run_dir)  # nothing but the config was written: leave no half-made run behind
        raise UserError(str(err)) from None
    except KeyboardInterrupt:
        click.echo(f"\nInterrupted; resume with: lrmgym run --resume {run_dir}", err=True)
        sys.exit(130)


# ------------------------------------------------------------------------------------------------ eval
@cli.command(
    "eval",
    short_help="Evaluate a policy on an env: pass@k, avg@n, by difficulty.",
    context_settings={"ignore_unknown_options": True},
)
@click.argument("overrides", nargs=-1, metavar="[OVERRIDES]...")
def eval_(overrides: tuple[str, ...]) -> None:
    """Evaluate a policy on an env: pass@k, avg@n, accuracy by difficulty, e.g. `lrmgym eval env=game24 eval.n=8`.

    Writes eval.json and samples.jsonl under run.output_dir (default runs/) and prints a table.
    """
    cfg = _resolve(overrides)
    from lrmgym.compose import build_env, build_policy
    from lrmgym.eval.runner import evaluate, print_report

    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    env_name = cfg.env.id.split("/")[-1].split("-v")[0].lower()
    out_dir = Path(cfg.run.output_dir) / (cfg.run.name or f"eval-{env_name}-{stamp}")
    from lrmgym.configs.resolve import ConfigError

    try:
        env = build_env(cfg)
        policy = build_policy(cfg)
    except (FileNotFoundError, ConfigError) as err:
        raise UserError(str(err)) from None
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_atomic(out_dir / "config.yaml", cfg.to_yaml())
    print_report(evaluate(env, policy, cfg.eval, out_dir))
    click.echo(f"results: {out_dir}")


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="lrmgym")


if __name__ == "__main__":
    main()
