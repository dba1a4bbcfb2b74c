"""``lrmgym export``: turn a run's logs into data sets for other trainers, or a config into an OpenRLHF or verl job.

Examples::

    lrmgym export traces runs/math-grpo-20260101-120000 --pairs pairs.jsonl --min-margin 0.5
    lrmgym export openrlhf env=math learner=grpo policy=hf policy.model=Qwen/Qwen2.5-1.5B-Instruct \
        learner.time_budget_s=null learner.async_rollouts=false out=exports/math-grpo
    lrmgym export verl env=gsm8k judge=[accuracy,format_strict] out=exports/gsm8k-verl

``traces`` writes the rollouts ``samples.jsonl`` logged, one JSON object per rollout (the schema is in
:mod:`lrmgym.learners.engine.export`), and optionally preference pairs in TRL's DPO format. ``openrlhf`` writes what
OpenRLHF's ``train_ppo_ray`` needs to train a config (:mod:`lrmgym.integrations.openrlhf_launch`);
:func:`run_openrlhf` is ``lrmgym run ... backend=openrlhf``: the same export into the run directory, then its
``launch.sh``. ``verl`` writes verl's parquet data and a custom reward function (:mod:`lrmgym.adapters.verl`).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

__all__ = ["command", "hf", "run_openrlhf"]

TRACES_NAME = "traces.jsonl"
"""``export traces``' default output, in the run folder it reads."""


class _UserError(click.ClickException):
    exit_code = 2


class _MachineError(click.ClickException):
    """Not the user's mistake but the machine's (no GPU, a failed launch): one ``Error: ...`` line."""

    exit_code = 1


@click.group("export", short_help="Export a run's rollouts (traces, DPO pairs), or a config as an OpenRLHF job.")
def command() -> None:
    """Turn a run's logs into data sets for other trainers, or a config into an OpenRLHF job (export openrlhf)."""


def _samples_file(source: Path) -> Path:
    """The ``samples.jsonl`` that RUN_DIR names (RUN_DIR may be that file itself)."""
    from lrmgym.learners.engine.staged import STAGES_DIR

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
@click.option(
    "--force", is_flag=True,
    help="Replace an existing --out / --pairs file, or add --pairs (or another --out) to a run folder.",
)  # fmt: skip
def traces(run_dir: Path, out: Path | None, pairs: Path | None, min_margin: float, by: str, force: bool) -> None:
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

    \b
    An existing file is replaced only with --force. A run folder's own files (metrics.jsonl, config.yaml,
    checkpoints/ ...) are never written, --force or not; a file other than RUN_DIR/traces.jsonl is added to a
    run folder only with --force.
    """  # noqa: D301 -- click needs the real "\b" escape (its no-rewrap marker)
    from lrmgym.files import OutputPathError, check_output_file
    from lrmgym.learners.engine.export import TraceFileError, export_traces

    samples = _samples_file(run_dir)
    default = samples.parent / TRACES_NAME
    out = out if out is not None else default
    try:
        out_path = check_output_file(out, inputs=[samples], what="--out", force=force, owned=(TRACES_NAME,),
                                     default=os.path.realpath(out) == os.path.realpath(default))  # fmt: skip
        pairs_path = (check_output_file(pairs, inputs=[samples], what="--pairs", force=force)
                      if pairs is not None else None)  # fmt: skip
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


# ------------------------------------------------------------------------------------------------ openrlhf
def _export(out: str, write: Any) -> Any:
    """``write()``'s result, with its warnings echoed to stderr.

    Config and export errors, and an input file that is not there (an env's data), become user errors; a failed
    write to ``out`` is the machine's.
    """
    from lrmgym.configs.errors import ConfigError
    from lrmgym.integrations.openrlhf_launch import ExportError

    try:
        result = write()
    except (ConfigError, ExportError) as err:
        raise _UserError(str(err)) from None
    except FileNotFoundError as err:
        if err.filename is None or not _within(err.filename, out):  # an input (an env's data file), not the output
            raise _UserError(f"{err}; nothing was written.") from None
        raise _MachineError(f"cannot write {out!r}: {err}; nothing was written.") from None
    except OSError as err:
        raise _MachineError(f"cannot write {out!r}: {err}; nothing was written.") from None
    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)
    return result


def _within(path: str | os.PathLike, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or inside it."""
    target, base = Path(path).resolve(), Path(folder).resolve()
    return target == base or base in target.parents


def _split_out(overrides: tuple[str, ...], example: str) -> tuple[list[str], list[str]]:
    """``([DIR], other tokens)`` of the ``out=DIR`` token, which must appear exactly once."""
    outs = [t.split("=", 1)[1] for t in overrides if t.startswith("out=")]
    tokens = [t for t in overrides if not t.startswith("out=")]
    if len(outs) != 1 or not outs[0]:
        raise _UserError(
            f"out=DIR: name the export folder once, e.g. out={example}"
            + (f" (got out= {len(outs)} times)" if len(outs) > 1 else "")
        )
    return outs, tokens


@command.command("openrlhf", context_settings={"ignore_unknown_options": True})
@click.argument("overrides", nargs=-1, metavar="[OVERRIDES]... out=DIR")
@click.option(
    "--force", is_flag=True,
    help="Replace DIR when it exists and is not empty (its files are deleted); never the current folder or one "
    "above it, a run folder or a folder of runs. Also: make DIR inside a run folder.",
)  # fmt: skip
def openrlhf(overrides: tuple[str, ...], force: bool) -> None:
    """Write what OpenRLHF needs to train a config into DIR, without launching it.

    \b
    OVERRIDES are the GROUP=PRESET and dotted.key=VALUE tokens of `lrmgym run`; backend=openrlhf is implied
    (backend.* keys set the GPUs, vLLM engines and Ray address; see `lrmgym config show backend=openrlhf`).
    DIR gets train.jsonl and eval.jsonl (prompts with their labels), the reward / agent plug-in, launch.sh
    (`bash DIR/launch.sh` trains; run again, it resumes), runtime_env.json (Ray), export.json (what each
    lrmgym key became, and what OpenRLHF does differently) and config.yaml. An option OpenRLHF cannot
    express is refused, with its fix, before anything is written; DIR is written whole or not at all.
    """  # noqa: D301 -- click needs the real "\b" escape (its no-rewrap marker)
    from lrmgym import __version__
    from lrmgym.configs.resolve import resolve, tiny_tuned_warning
    from lrmgym.integrations.openrlhf_launch import export_openrlhf

    outs, tokens = _split_out(overrides, "exports/math-grpo")
    backends = [t.split("=", 1)[1] for t in tokens if t.startswith("backend=")]
    if not backends:
        tokens.insert(0, "backend=openrlhf")
    elif backends[-1] != "openrlhf":
        raise _UserError(f"backend={backends[-1]}: `lrmgym export openrlhf` exports for backend=openrlhf; drop it.")

    def write() -> Any:
        cfg = resolve(tokens)
        if (line := tiny_tuned_warning(cfg)) is not None:  # policy=hf with grpo.yaml's tiny-model values
            click.echo(f"warning: {line}", err=True)
        return export_openrlhf(cfg, Path(outs[0]), force=force, version=__version__)

    result = _export(outs[0], write)
    written = ", ".join(sorted(result.files))
    click.echo(f"exported to {result.out_dir}: {written}; launch it with: bash {result.out_dir / 'launch.sh'}")


# ------------------------------------------------------------------------------------------------ verl
_VERL_KEYS = ("env", "judge", "eval", "run.seed")
"""The settings `lrmgym export verl` reads; the trainer's own settings are verl's (its Hydra overrides)."""


@command.command("verl", context_settings={"ignore_unknown_options": True})
@click.argument("overrides", nargs=-1, metavar="[OVERRIDES]... out=DIR")
@click.option(
    "--force", is_flag=True,
    help="Replace DIR when it exists and is not empty (its files are deleted); never the current folder or one "
    "above it, a run folder or a folder of runs. Also: make DIR inside a run folder.",
)  # fmt: skip
@click.option(
    "--train-tasks", type=click.IntRange(min=1), default=1024, show_default=True,
    help="Rows of train.parquet: tasks 0 .. N-1 of the env's stream run.seed.",
)  # fmt: skip
@click.option(
    "--test-tasks", type=click.IntRange(min=1), default=None,
    help="Rows of test.parquet (default: eval.tasks; fewer when the held-out data set is smaller).",
)  # fmt: skip
def verl(overrides: tuple[str, ...], force: bool, train_tasks: int, test_tasks: int | None) -> None:
    """Write verl's data and custom reward function for an env and its judges into DIR.

    \b
    OVERRIDES choose the env and judges as for `lrmgym run` (env=..., judge=..., env.KEY=VALUE), plus run.seed
    (the train stream) and eval.split / eval.seed / eval.tasks (the held-out rows). DIR gets train.parquet
    and test.parquet (rows: data_source, prompt as chat messages, ability, reward_model {style: rule,
    ground_truth}, extra_info {split, index, seed, label, task_id}), reward.py (compute_score, and
    compute_score_batch for group-aware judges) and export.json, which lists the main_ppo overrides:
      data.train_files=DIR/train.parquet data.val_files=DIR/test.parquet
      custom_reward_function.path=DIR/reward.py custom_reward_function.name=compute_score
    lrmgym must be installed where verl computes rewards. Multi-turn envs are refused; DIR is written whole
    or not at all.
    """  # noqa: D301 -- click needs the real "\b" escape (its no-rewrap marker)
    from lrmgym import __version__
    from lrmgym.adapters.verl import export_verl
    from lrmgym.configs.resolve import resolve

    outs, tokens = _split_out(overrides, "exports/math-verl")
    for token in tokens:
        key = token.split("=", 1)[0]
        if "=" in token and not any(key == k or key.startswith(k + ".") for k in _VERL_KEYS):
            raise _UserError(
                f"{key}: not used by `lrmgym export verl`, which reads only env, judge, run.seed and eval.* "
                "settings; verl's trainer is configured with its own overrides (python -m verl.trainer.main_ppo ...)."
            )
    result = _export(outs[0], lambda: export_verl(
        resolve(tokens), Path(outs[0]), n_train=train_tasks, n_test=test_tasks, force=force, version=__version__,
    ))  # fmt: skip
    rows = ", ".join(f"{name} ({n} rows)" for name, n in result.rows.items())
    click.echo(f"exported to {result.out_dir}: {rows}, reward.py, export.json; train with:")
    click.echo("python -m verl.trainer.main_ppo " + " ".join(shlex.quote(a) for a in result.overrides) + " ...")


def run_openrlhf(cfg: Any, resume_dir: Path | None, dry_run: bool, default_name: str, lock: Any = None) -> None:
    """``lrmgym run ... backend=openrlhf``: export into a new run directory and run its launch.sh.

    The config is checked first (a refusal writes nothing), then the machine: without CUDA GPUs and openrlhf
    (or, with backend.address, the ``ray`` command) it stops with one line and writes nothing. ``dry_run``
    exports into a temporary folder to print the exact command (its paths name the run directory it would
    create), writes nothing and launches nothing. ``resume_dir`` (``--resume``) runs that directory's
    launch.sh again, which continues from its newest checkpoint. ``lock(run_dir)``, when given, takes the run
    directory's lock for the rest of the command (``lrmgym run`` holds it while launch.sh runs).
    """
    from lrmgym import __version__
    from lrmgym.configs.errors import ConfigError
    from lrmgym.files import OutputPathError, fresh_dir
    from lrmgym.integrations.openrlhf_launch import LAUNCH_FILE, ExportError, export_openrlhf, machine_problem, plan

    try:
        plan(cfg)
    except ConfigError as err:
        raise _UserError(str(err)) from None
    if resume_dir is not None:
        if not (resume_dir / LAUNCH_FILE).is_file():
            raise _UserError(
                f"--resume: {str(resume_dir / LAUNCH_FILE)!r} not found; expected an OpenRLHF run directory."
            )
        if dry_run:
            click.echo(shlex.join(["bash", str(resume_dir / LAUNCH_FILE)]))
            return
        _launch(resume_dir, machine_problem(cfg))
        return
    target = Path(cfg.run.output_dir) / (cfg.run.name or default_name)
    if dry_run:
        with tempfile.TemporaryDirectory(prefix="lrmgym-dry-run-") as tmp:
            try:
                result = export_openrlhf(cfg, Path(tmp) / "export", root=target.absolute(), version=__version__)
            except (ConfigError, ExportError) as err:
                raise _UserError(str(err)) from None
        click.echo(f"dry run: nothing was written; the run would create {target} and run:", err=True)
        click.echo(shlex.join(result.command))
        return
    problem = machine_problem(cfg)
    if problem is not None:
        raise _MachineError(
            f"{problem}. Nothing was written; prepare the files with `lrmgym export openrlhf ... out=DIR` and run "
            "DIR/launch.sh on a GPU machine (or set backend.address), or see the command with --dry-run."
        )
    try:
        run_dir = fresh_dir(Path(cfg.run.output_dir), cfg.run.name or default_name, unique=not cfg.run.name)
    except OutputPathError as err:
        raise _UserError(str(err)) from None
    try:
        export_openrlhf(cfg, run_dir, version=__version__)  # replaces the empty directory fresh_dir reserved
    except BaseException as err:
        shutil.rmtree(run_dir, ignore_errors=True)  # no half-made run directory
        if isinstance(err, (ConfigError, ExportError)):
            raise _UserError(str(err)) from None
        if isinstance(err, OSError):
            raise _MachineError(f"cannot write the run directory {str(run_dir)!r}: {err}; nothing was kept.") from None
        raise
    click.echo(f"run directory: {run_dir} (export.json says what each lrmgym key became)")
    if lock is not None:
        lock(run_dir)
    _launch(run_dir, None)


def _launch(run_dir: Path, problem: str | None) -> None:
    """Run ``run_dir/launch.sh`` with this interpreter's ``python`` first on PATH; its exit code ends the command."""
    if problem is not None:
        raise _MachineError(f"{problem}; nothing was launched.")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    code = subprocess.call(["bash", str(run_dir / "launch.sh")], env=env)
    if code != 0:
        err = _MachineError(
            f"OpenRLHF exited with code {code}; the run directory {run_dir} is kept: `bash {run_dir}/launch.sh` "
            "(or `lrmgym run --resume` of it) continues from its newest checkpoint."
        )
        err.exit_code = code if 0 < code < 126 else 1
        raise err
    click.echo(f"OpenRLHF finished; the run directory is {run_dir}")


# ------------------------------------------------------------------------------------------------ hf
@command.command("hf", context_settings={"ignore_unknown_options": True})
@click.argument("run_dir", metavar="RUN", type=click.Path(path_type=Path))
@click.argument("overrides", nargs=-1, metavar="out=DIR")
@click.option(
    "--merge/--adapter", "merge", default=True, show_default=True,
    help="For a LoRA run: the adapter merged into the base weights, or the peft adapter folder.",
)  # fmt: skip
@click.option("--step", type=click.IntRange(min=0), default=None, help="The checkpoint's step (default: the newest).")
@click.option(
    "--force", is_flag=True,
    help="Replace DIR when it exists (never the current folder or one above it, a run folder or a folder of runs).",
)  # fmt: skip
def hf(run_dir: Path, overrides: tuple[str, ...], merge: bool, step: int | None, force: bool) -> None:
    """Write a trained run's model as a transformers folder DIR (its newest checkpoint, or --step N).

    \b
    DIR gets config.json, model.safetensors, generation_config.json and the tokenizer's files: it loads with
    AutoModelForCausalLM.from_pretrained(DIR) and AutoTokenizer.from_pretrained(DIR), offline, and evaluates with
      lrmgym eval env=... policy=hf policy.model=DIR
    A LoRA run is merged into its base weights; with --adapter DIR is the peft adapter (adapter_config.json
    names the base model): policy=hf policy.model=BASE policy.adapter=DIR. DIR/lrmgym_export.json records the
    run, step and form. DIR is written whole or not at all. `lrmgym eval ... policy.path=RUN` evaluates the
    run's model without exporting it.
    """  # noqa: D301 -- click needs the real "\b" escape (its no-rewrap marker)
    from lrmgym import __version__
    from lrmgym.integrations.hf_export import HFExportError, export_hf

    outs, tokens = _split_out(overrides, "exports/my-model")
    if tokens:
        raise _UserError(f"{tokens[0]}: `lrmgym export hf` takes RUN and out=DIR only (options: --adapter, --step, "
                         "--force).")  # fmt: skip
    try:
        result = export_hf(run_dir, Path(outs[0]), step=step, adapter=not merge, force=force, version=__version__)
    except HFExportError as err:
        raise _UserError(str(err)) from None
    except OSError as err:
        raise _MachineError(f"cannot write {outs[0]!r}: {err}; nothing was written.") from None
    how = (f"policy=hf policy.model=BASE policy.adapter={result.out_dir}" if result.form == "adapter"
           else f"policy=hf policy.model={result.out_dir}")  # fmt: skip
    click.echo(
        f"exported step {result.step} of {run_dir} ({result.form} weights) to {result.out_dir}: "
        f"{', '.join(result.files)}; evaluate it with: lrmgym eval env=... {how}"
    )
