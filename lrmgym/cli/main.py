"""The ``lrmgym`` command line.

Every command that takes a config reads ``GROUP=PRESET`` and ``dotted.key=value`` tokens (see
:mod:`lrmgym.configs.resolve`). A user's mistake ends with one ``Error: ...`` line and exit code 2, before
anything is written.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib
import importlib.util
import json
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
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


def _warn_tiny_tuned(cfg: Any) -> None:
    """Print :func:`~lrmgym.configs.resolve.tiny_tuned_warning`'s line (stderr) when it has one."""
    from lrmgym.configs.resolve import tiny_tuned_warning

    if (line := tiny_tuned_warning(cfg)) is not None:
        click.echo(f"warning: {line}", err=True)


def _load_env(env_id: str, options: dict[str, Any]):
    from pydantic import ValidationError

    import lrmgym
    from lrmgym.configs.resolve import ConfigError, format_error, list_presets, load_preset

    if env_id in list_presets("env"):  # a preset name (`envs sample rg task=countdown`): its id and options
        preset = load_preset("env", env_id)
        env_id, options = str(preset.pop("id")), {**preset, **options}
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


# ------------------------------------------------------------------------------------------------ root
class _LazyGroup(click.Group):
    """A group whose extra commands live in their component's module, imported only when used or listed."""

    lazy: dict[str, str] = {
        name: f"lrmgym.cli.{name}_cmd" for name in ("judge", "tiny", "analyze", "export", "serve", "report")
    }

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
    from lrmgym.progress import quiet_library_bars

    quiet_library_bars()  # in a log file, transformers' own bars would be carriage-return frames


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
    """Print the first tasks of ENV_ID's stream SEED. OPTIONS are env options as KEY=VALUE.

    ENV_ID is a registered id (Math-v0) or an env preset (rg, gsm8k), whose options OPTIONS override.
    """
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
class EnvironmentFailure(click.ClickException):
    """Not the user's mistake but the machine's (a full disk): one ``Error: ...`` line, exit code 1."""

    exit_code = 1


def _default_name(cfg: Any, command: str) -> str:
    """``ENV-LEARNER-TIME`` for a run, ``eval-ENV-TIME`` for an evaluation (UTC, to the second)."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    env_name = cfg.env.id.split("/")[-1].split("-v")[0].lower()
    return f"{env_name}-{cfg.learner.kind}-{stamp}" if command == "run" else f"eval-{env_name}-{stamp}"


def _fresh_dir(cfg: Any, default: str) -> Path:
    """A new directory under run.output_dir: run.name (refused if it exists) or ``default`` made unique."""
    from lrmgym.files import OutputPathError, fresh_dir

    try:
        return fresh_dir(Path(cfg.run.output_dir), cfg.run.name or default, unique=not cfg.run.name)
    except OutputPathError as err:
        raise UserError(str(err)) from None


def _missing_folders(cfg: Any) -> list[Path]:
    """run.output_dir and the folders above it that do not exist yet, innermost first."""
    out = Path(cfg.run.output_dir).absolute()
    return [p for p in (out, *out.parents) if not p.exists()]


def _remove_made(run_dir: Path, made: list[Path]) -> None:
    """Remove a new run directory that holds nothing of value, and the empty folders made for it."""
    shutil.rmtree(run_dir, ignore_errors=True)
    for folder in made:
        try:
            folder.rmdir()  # only while empty: another command may have written there meanwhile
        except OSError:
            break


def _check_name_free(cfg: Any) -> None:
    """Fail fast, before anything is built, when run.name names an existing directory."""
    if cfg.run.name and (Path(cfg.run.output_dir) / cfg.run.name).exists():
        existing = Path(cfg.run.output_dir) / cfg.run.name
        hint = f" or continue it with `lrmgym run --resume {existing}`" if (existing / "config.yaml").is_file() else ""
        raise UserError(f"run.name: {str(existing)!r} already exists; choose another run.name{hint}.")


def _disk_full(err: OSError, run_dir: Path | None) -> EnvironmentFailure:
    from lrmgym.files import describe_os_error

    where = f" writing {err.filename}" if err.filename else ""
    text = f"{describe_os_error(err)}{where}."
    if run_dir is not None and run_dir.is_dir():
        text += f" {_stopped(run_dir)}. Free some space, then: lrmgym run --resume {run_dir}"
    return EnvironmentFailure(text)


def _stopped(run_dir: Path) -> str:
    """``The run in DIR stopped; its newest checkpoint (step 40) is intact`` (or that it has none yet)."""
    from lrmgym.learners.engine.staged import newest_checkpoint

    point = newest_checkpoint(run_dir)
    kept = f"its newest checkpoint ({point}) is intact" if point else "it has no checkpoint yet"
    return f"The run in {run_dir} stopped; {kept}"


def _load_saved(resume_dir: Path) -> tuple[Any, dict[str, Any]]:
    """The saved config of a run directory, resolved, and as written (for the resume check)."""
    import yaml

    from lrmgym.configs.errors import yaml_problem
    from lrmgym.configs.resolve import ConfigError, resolve_dict

    config_path = resume_dir / "config.yaml"
    if not config_path.is_file():
        raise UserError(f"--resume: {str(config_path)!r} not found; expected a run directory made by `lrmgym run`.")
    try:
        raw = yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}
        if not isinstance(raw, dict):
            raise ConfigError("expected a mapping of sections (env:, learner:, ...)")
        return resolve_dict(raw), raw
    except yaml.YAMLError as err:
        raise UserError(
            f"--resume: {config_path} is not valid YAML ({yaml_problem(err)}); fix the file; run.json beside it holds "
            "the config the run was started with."
        ) from None
    except (ConfigError, UnicodeDecodeError) as err:
        raise UserError(f"--resume: {config_path}: {err}") from None


@cli.command(
    short_help="Train a policy, e.g. lrmgym run env=math learner=grpo.",
    context_settings={"ignore_unknown_options": True},
)
@click.argument("overrides", nargs=-1, metavar="[OVERRIDES]...")
@click.option("--resume", "resume_dir", type=click.Path(path_type=Path), help="Continue the run in this directory.")
@click.option("--dry-run", is_flag=True, help="backend=openrlhf: print the launch command; write nothing.")
def run(overrides: tuple[str, ...], resume_dir: Path | None, dry_run: bool) -> None:
    """Train: env x judge x learner x policy, e.g. `lrmgym run env=math learner=grpo`.

    OVERRIDES are GROUP=PRESET and dotted.key=VALUE tokens; see `lrmgym config presets` and
    `lrmgym config show`. The run directory gets the resolved config, metrics, samples, checkpoints and plots.
    SIGTERM or Ctrl-C stops after the current step with a checkpoint; `--resume RUN_DIR` continues. One
    process at a time trains in a run directory (it holds RUN_DIR/run.lock): a `--resume` of a live run is
    refused, naming its PID; the lock dies with its process, so a resume after a kill works.
    With backend=openrlhf the run directory gets the OpenRLHF export (see `lrmgym export openrlhf --help`)
    and its launch.sh runs, on a machine with CUDA GPUs and openrlhf installed.
    """
    with contextlib.ExitStack() as held:
        _run(overrides, resume_dir, dry_run, held)


def _lock(run_dir: Path, held: contextlib.ExitStack) -> None:
    """Hold ``run_dir``'s lock until ``held`` closes; one ``Error:`` line when another process holds it."""
    from lrmgym.files import describe_os_error
    from lrmgym.learners.engine.rundir import RunDirLocked, lock_run_dir

    try:
        held.enter_context(lock_run_dir(run_dir))
    except RunDirLocked as err:
        raise UserError(str(err)) from None
    except OSError as err:  # a read-only folder, a full disk: the run could not write its logs either
        raise EnvironmentFailure(f"cannot lock {run_dir} for this run: {describe_os_error(err)}.") from None


def _run(overrides: tuple[str, ...], resume_dir: Path | None, dry_run: bool, held: contextlib.ExitStack) -> None:
    from lrmgym.learners.engine.resume import ResumeConfigError, check_config, read_run_record

    if resume_dir is not None:
        if overrides:
            raise UserError(
                f"--resume continues a run with its saved config; remove the overrides {' '.join(overrides)} "
                "(edit RUN_DIR/config.yaml deliberately if you must change it)."
            )
        cfg, raw = _load_saved(resume_dir)
        if not dry_run:
            _lock(resume_dir, held)  # before anything is written or said: a live run keeps its folder to itself
        try:
            record = read_run_record(resume_dir)
            changed, notes = check_config(raw, cfg.to_dict(), record["config"] if record else None)
        except ResumeConfigError as err:
            raise UserError(str(err)) from None
        for note in notes:
            click.echo(note)
        if changed:
            click.echo(f"resuming with changed {', '.join(changed)} (as config.yaml now says)")
    else:
        cfg = _resolve(overrides)
        _check_name_free(cfg)
        _warn_tiny_tuned(cfg)
    if getattr(cfg.backend, "kind", "native") != "native":
        from lrmgym.cli.export_cmd import run_openrlhf

        run_openrlhf(cfg, resume_dir, dry_run, _default_name(cfg, "run"), lock=lambda d: _lock(d, held))
        return
    if dry_run:
        raise UserError("--dry-run prints the launch command of backend=openrlhf; a native run has none to print.")
    if not callable(getattr(cfg.learner, "build", None)):
        raise UserError(
            f"learner.kind: the {cfg.learner.kind!r} learner cannot train in this build (its config has no build(ctx))."
        )
    with _sigterm_as_interrupt():  # a scheduler's stop or `docker stop`: as Ctrl-C (the loop saves, then exits)
        _train(cfg, resume_dir, held)


def _train(cfg: Any, resume_dir: Path | None, held: contextlib.ExitStack) -> None:
    from lrmgym.compose import prepare
    from lrmgym.configs.resolve import ConfigError
    from lrmgym.files import atomic_write_text
    from lrmgym.learners.engine.async_rollout import RolloutWorkerLost
    from lrmgym.learners.engine.resume import write_run_record
    from lrmgym.learners.engine.rundir import CorruptCheckpointError
    from lrmgym.policies.base import EngineStartError, MissingPackageError

    new = resume_dir is None
    run_dir = resume_dir
    made = _missing_folders(cfg) if new else []
    if new:
        run_dir = _fresh_dir(cfg, _default_name(cfg, "run"))
        _lock(run_dir, held)  # a new directory: no one else holds it
    try:
        if new:
            atomic_write_text(run_dir / "config.yaml", cfg.to_yaml())
        loop = prepare(cfg, run_dir)
        write_run_record(run_dir, cfg.to_dict(), __version__)
        # The learner's own checks (e.g. learner.update_threads off the CPU) and its workers, while a failure can
        # still remove the new directory. A staged run sets each stage up as it starts it; a registered learner's
        # runner may have no separate setup.
        setup = getattr(loop, "setup", None)
        if callable(setup):
            setup()
    except BaseException as err:
        if new:  # nothing of value was written: leave no half-made run directory (nor runs/ made for it) behind
            _remove_made(run_dir, made)
        if isinstance(err, (FileNotFoundError, ConfigError, ValueError)):  # e.g. a bad data file or model folder
            raise UserError(str(err)) from None
        if isinstance(err, (MissingPackageError, EngineStartError)):  # e.g. no vllm; vLLM out of GPU memory
            raise EnvironmentFailure(str(err)) from None
        if isinstance(err, OSError) and _is_disk_full(err, run_dir.parent if new else run_dir):
            raise _disk_full(err, None if new else run_dir) from None
        if isinstance(err, KeyboardInterrupt):
            kept = "nothing was kept" if new else f"the run is as it was; resume with: lrmgym run --resume {run_dir}"
            click.echo(f"\nInterrupted before training started; {kept}.", err=True)
            sys.exit(130)
        raise
    click.echo(f"run directory: {run_dir}")
    try:
        loop.run(resume=not new)
    except CorruptCheckpointError as err:
        raise EnvironmentFailure(str(err)) from None
    except RolloutWorkerLost as err:  # killed (the OOM killer) or stopped: the trainer's state is the last step's
        raise EnvironmentFailure(f"{err} {_stopped(run_dir)}. Resume with: lrmgym run --resume {run_dir}") from None
    except OSError as err:
        if _is_disk_full(err, run_dir):
            raise _disk_full(err, run_dir) from None
        raise
    except KeyboardInterrupt:
        from lrmgym.learners.engine.staged import newest_checkpoint

        point = newest_checkpoint(run_dir)
        if point:
            click.echo(
                f"\nInterrupted; the newest checkpoint is {point}; resume with: lrmgym run --resume {run_dir}",
                err=True,
            )
        else:
            click.echo(
                f"\nInterrupted before the first checkpoint: nothing to resume (`lrmgym run --resume {run_dir}` "
                "starts it over).",
                err=True,
            )
        sys.exit(130)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt while the block runs (in the main thread; restored after)."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _is_disk_full(err: OSError, where: Path) -> bool:
    from lrmgym.files import out_of_space

    return out_of_space(err, where if where.is_dir() else Path.cwd())


# ------------------------------------------------------------------------------------------------ eval
@cli.command(
    "eval",
    short_help="Evaluate a policy on an env: pass@k, avg@n, by difficulty.",
    context_settings={"ignore_unknown_options": True},
)
@click.argument("overrides", nargs=-1, metavar="[OVERRIDES]...")
def eval_(overrides: tuple[str, ...]) -> None:
    """Evaluate a policy on an env: pass@k, avg@n, accuracy by difficulty, e.g. `lrmgym eval env=game24 eval.n=8`.

    Writes config.yaml, eval.json and samples.jsonl into a new directory under run.output_dir (default runs/):
    run.name, which must not exist yet, or eval-ENV-TIME (made unique) and prints a table.

    Benchmark suites read a local file, never a download: `lrmgym eval eval=aime24 eval.data_path=aime_2024.jsonl`
    (suites: aime24, aime25, gpqa_diamond, livecodebench; several: eval=[aime24,aime25] with
    eval.data_path.aime24=... eval.data_path.aime25=...). Each suite's files go in a folder of its name, with
    suites.json (every suite's avg@n and pass@k with bootstrap intervals over problems) beside them.
    """
    from lrmgym.configs.suites import split_suite_tokens
    from lrmgym.eval.suites import SuiteError

    try:
        suites, paths, rest = split_suite_tokens(overrides)
    except SuiteError as err:
        raise UserError(str(err)) from None
    if suites:
        _eval_suites(suites, paths, rest)
        return
    cfg = _resolve(overrides)
    from lrmgym.compose import build_env, build_policy
    from lrmgym.configs.resolve import ConfigError
    from lrmgym.eval.runner import evaluate, print_report
    from lrmgym.files import atomic_write_text
    from lrmgym.policies.base import EngineStartError, MissingPackageError
    from lrmgym.policies.openai import PolicyRequestError

    _check_name_free(cfg)
    try:
        env = build_env(cfg)
        policy = build_policy(cfg)
    except (FileNotFoundError, ConfigError, ValueError) as err:  # a bad data file, model folder, device ...
        raise UserError(str(err)) from None
    except (MissingPackageError, EngineStartError) as err:  # e.g. no vllm; vLLM out of GPU memory
        raise EnvironmentFailure(str(err)) from None
    made = _missing_folders(cfg)
    out_dir = _fresh_dir(cfg, _default_name(cfg, "eval"))
    try:
        atomic_write_text(out_dir / "config.yaml", cfg.to_yaml())
        report = evaluate(env, policy, cfg.eval, out_dir)
    except BaseException as err:
        _remove_made(out_dir, made)  # no half-made results
        if isinstance(err, OSError) and _is_disk_full(err, Path(cfg.run.output_dir)):
            raise _disk_full(err, None) from None
        if isinstance(err, KeyboardInterrupt):
            click.echo("\nInterrupted; no results were kept.", err=True)
            sys.exit(130)
        if isinstance(err, PolicyRequestError):  # the policy's server is down, refuses the model, ...
            where = getattr(cfg.policy, "base_url", None)
            hint = f" Is a server running at policy.base_url={where!r}?" if where else ""
            text = f"policy={cfg.policy.kind}: {_one_line(err)}.{hint} No results were kept."
            raise EnvironmentFailure(text) from None
        raise
    print_report(report)
    click.echo(f"results: {out_dir}")


def _eval_suites(suites: list[Any], paths: dict[str, str], rest: list[str]) -> None:
    """``lrmgym eval eval=NAME ...``: each suite's config resolved and checked first, then evaluated in turn."""
    from lrmgym.compose import build_env, build_policy
    from lrmgym.configs.resolve import ConfigError, resolve
    from lrmgym.configs.suites import suite_tokens
    from lrmgym.eval.runner import evaluate, print_report
    from lrmgym.eval.suites import SuiteError, check_items, print_summary, suite_summary
    from lrmgym.files import atomic_write_text
    from lrmgym.policies.base import EngineStartError, MissingPackageError
    from lrmgym.policies.openai import PolicyRequestError

    planned = []
    for suite in suites:
        try:
            cfg = resolve(suite_tokens(suite, paths.get(suite.name), rest))
        except SuiteError as err:
            raise UserError(str(err)) from None
        except ConfigError as err:  # the suite's file or a user override: say which suite it was for
            raise UserError(f"eval={suite.name}: {err}") from None
        _check_name_free(cfg)
        try:
            env = build_env(cfg)
            count = check_items(suite, env, seed=cfg.eval.seed)
        except (FileNotFoundError, ConfigError, ValueError) as err:  # SuiteError is a ValueError
            raise UserError(str(err)) from None
        planned.append((suite, cfg, env, cfg.eval.model_copy(update={"tasks": min(cfg.eval.tasks, count)})))
    first = planned[0][1]
    try:
        policy = build_policy(first)
    except (FileNotFoundError, ConfigError, ValueError) as err:
        raise UserError(str(err)) from None
    except (MissingPackageError, EngineStartError) as err:
        raise EnvironmentFailure(str(err)) from None
    made = _missing_folders(first)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    out_dir = _fresh_dir(first, f"eval-{'-'.join(s.name for s in suites)}-{stamp}")
    reports, rows = [], []
    try:
        for suite, cfg, env, plan in planned:
            click.echo(f"{suite.title}: {plan.tasks} problems x n={plan.n}", err=True)
            atomic_write_text(out_dir / suite.name / "config.yaml", cfg.to_yaml())
            report = {"suite": suite.name, **evaluate(env, policy, plan, out_dir / suite.name)}
            reports.append(report)
            rows.append(suite_summary(suite, report))
        summary = {"suites": rows, "confidence": first.eval.confidence}
        atomic_write_text(out_dir / "suites.json", json.dumps(summary, indent=2) + "\n")
    except BaseException as err:
        _remove_made(out_dir, made)  # no half-made results
        if isinstance(err, OSError) and _is_disk_full(err, Path(first.run.output_dir)):
            raise _disk_full(err, None) from None
        if isinstance(err, KeyboardInterrupt):
            click.echo("\nInterrupted; no results were kept.", err=True)
            sys.exit(130)
        if isinstance(err, PolicyRequestError):
            raise EnvironmentFailure(f"policy={first.policy.kind}: {_one_line(err)}. No results were kept.") from None
        raise
    for report in reports:
        print_report(report)
    print_summary(rows, first.eval.confidence)
    click.echo(f"results: {out_dir}")


def _one_line(err: BaseException) -> str:
    """An error's message on one line (a server's reply may span several), without its closing full stop."""
    return " ".join(str(err).split()).rstrip(".")


def main() -> None:
    """Console-script entry point."""
    try:
        cli(prog_name="lrmgym")
    except SystemExit as exit_:
        # click ends a command whose stdout reader went away (`lrmgym ... | head`) with exit code 1 and no word;
        # it marks that case by wrapping the streams so that their last flush cannot fail.
        if exit_.code == 1 and "PacifyFlushWrapper" in type(sys.stdout).__name__:
            print(
                "lrmgym stopped: its standard output was closed (its reader, e.g. `| head`, exited); redirect it to "
                "a file (> out.txt) to keep all of it.",
                file=sys.stderr,
            )
        raise


if __name__ == "__main__":
    main()
