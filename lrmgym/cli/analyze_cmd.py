"""``lrmgym analyze``: analyses of trained policies.

Example::

    lrmgym analyze shift --base tiny --rl runs/math-grpo-20260101-120000 env=math --tasks 100 --out shift/

``shift`` is ReasonMaxxer's token-shift analysis (:mod:`lrmgym.eval.shift`): where does the RL model's greedy
choice depart from the base model's, and how many tokens carry the difference?
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from lrmgym.configs.locate import MODEL_HELP

__all__ = ["command"]

_SECTIONS = ("env", "eval")
"""The config sections `analyze shift` reads from its overrides."""


class _UserError(click.ClickException):
    exit_code = 2


@click.group("analyze", short_help="Analyse trained policies (shift: an RL model against its base).")
def command() -> None:
    """Analyses of trained policies."""


# ------------------------------------------------------------------------------------------------ models
def _locate(value: str, option: str, device: str | None) -> Any:
    from lrmgym.configs.locate import ModelLocateError, locate_model

    try:
        return locate_model(value, option, device)
    except ModelLocateError as err:
        raise _UserError(str(err)) from None


def _load(model: Any) -> Any:
    from lrmgym.compose import build_policy
    from lrmgym.configs.locate import ModelLocateError, load_located

    try:
        return load_located(model, build_policy)
    except ModelLocateError as err:
        raise _UserError(str(err)) from None


def _check_tokenizers(base: Any, rl: Any) -> None:
    from lrmgym.policies.vocab import check_same_vocabulary

    try:
        check_same_vocabulary(rl, base, "--rl", "--base")
    except ValueError as err:
        raise _UserError(str(err)) from None


# ------------------------------------------------------------------------------------------------ shift
@command.command("shift", context_settings={"ignore_unknown_options": True})
@click.option("--base", "base_name", required=True, metavar="MODEL", help=f"The base model: {MODEL_HELP}.")
@click.option("--rl", "rl_name", required=True, metavar="MODEL", help="The RL-tuned model, named like --base.")
@click.option("--tasks", type=click.IntRange(min=1), default=None, help="Held-out tasks (default: eval.tasks).")
@click.option("--max-new-tokens", type=click.IntRange(min=1), help="Tokens per decode (default: eval.max_new_tokens).")
@click.option("--batch-size", type=click.IntRange(min=1), help="Prompts decoded together (default: eval.batch_size).")
@click.option("--device", default=None, help="Run both models here (cpu, cuda, auto); default: each policy's own.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed of the control's draws.")
@click.option(
    "--gate-tau", "gate_taus", type=click.FloatRange(min=0.0, max=1e6), multiple=True, metavar="NATS",
    help="Also decode with the entropy gate at this threshold (repeatable): the RL model's argmax wherever the "
    "base's entropy exceeds it (the paper's §3.3: 1.2).",
)  # fmt: skip
@click.option(
    "--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
    help="Write shift.json (every number and the config) and shift.png into this directory.",
)  # fmt: skip
@click.option("--force", is_flag=True, help="Replace an existing shift.json / shift.png, or write into a run folder.")
@click.argument("overrides", nargs=-1, metavar="[OVERRIDES]...")
def shift(
    base_name: str, rl_name: str, tasks: int | None, max_new_tokens: int | None, batch_size: int | None,
    device: str | None, seed: int, gate_taus: tuple[float, ...], out_dir: Path | None, force: bool,
    overrides: tuple[str, ...],
) -> None:  # fmt: skip
    """Where does an RL model's greedy choice depart from its base model's (ReasonMaxxer's token shift)?

    \b
    On held-out tasks of the env the OVERRIDES select (env=..., eval.split, eval.tasks; default env=math), the
    base model decodes greedily; at each of its positions the RL model's argmax on the same prefix is
    UNSHIFTED (the base's argmax), RERANKED (in the base's top 5) or SHIFTED (outside). Reported: the three
    rates, the RL token's mean rank under the base at reranked positions, the base entropy at reranked vs
    unshifted positions; and the accuracy of four greedy decodes: base, RL, the oracle (the base, taking the
    RL model's argmax where it re-ranks the base's top 5; with no shifted position that is the RL model's
    greedy decode, and what counts is the share of tokens it edits) and the control (a random one of the
    base's top 20 instead, where the RL model disagrees). With --gate-tau T (repeatable), also the entropy-gated
    decode (the paper's §3.3): the base, taking the RL model's argmax wherever the base's own entropy exceeds T
    nats (no RL information about where); its accuracy, share of tokens gated and edited, and how often it is
    exactly the RL model's greedy decode.

    \b
    MODEL (--base, --rl) is a model folder (config.json + weights, read as policy=hf policy.model=PATH), a run
    directory of `lrmgym run` (its newest checkpoint's weights loaded into the run's own policy; in a staged
    run, the latest stage's), or tiny (the shipped default model). Both must share one tokenizer. Decoding
    stops at EOS or --max-new-tokens (eval.stop is not applied) and covers the first turn of multi-turn envs.

    \b
    --out DIR: an existing shift.json or shift.png is replaced only with --force; into a run folder (a directory
    of `lrmgym run`) only with --force, and never over the run's own files.
    """  # noqa: D301 -- click needs the real "\b" escape (its no-rewrap marker)
    for token in overrides:
        key = token.partition("=")[0].split(".")[0]
        if "=" in token and key not in _SECTIONS:
            raise _UserError(
                f"{token}: `lrmgym analyze shift` takes its models from --base and --rl and grades with the env's "
                "own verifier; it reads only env=... and eval.* settings."
            )
    from lrmgym.configs.resolve import ConfigError, resolve

    try:
        cfg = resolve(overrides)
    except ConfigError as err:
        raise _UserError(str(err)) from None
    outputs = _check_out(out_dir, force)
    base_model, rl_model = _locate(base_name, "--base", device), _locate(rl_name, "--rl", device)
    from lrmgym.compose import build_env
    from lrmgym.eval.runner import select_tasks
    from lrmgym.eval.shift import analyze_shift

    eval_cfg = cfg.eval.model_copy(update={"tasks": tasks or cfg.eval.tasks})
    try:
        grader, chosen = select_tasks(build_env(cfg), eval_cfg)
    except (ConfigError, ValueError, FileNotFoundError) as err:
        raise _UserError(f"env: {err}") from None
    base, rl = _load(base_model), _load(rl_model)
    _check_tokenizers(base, rl)
    try:
        report = analyze_shift(
            base.model, rl.model, base.tokenizer, grader, chosen,
            max_new_tokens=max_new_tokens or cfg.eval.max_new_tokens, batch_size=batch_size or cfg.eval.batch_size,
            seed=seed, gate_taus=gate_taus, pass_threshold=cfg.eval.pass_threshold, eos_ids=base.eos_token_ids,
            encode=base.encode_prompt, decode=base.decode, progress=True,
        )  # fmt: skip
    except ValueError as err:  # the models' vocabularies differ after all (e.g. padded embeddings)
        raise _UserError(str(err)) from None
    config = {**report.config, "base": base_model.where, "rl": rl_model.where, "env": cfg.env.model_dump(mode="json"),
              "split": eval_cfg.split, "task_seed": eval_cfg.seed}  # fmt: skip
    _print_table(report, config)
    if outputs is not None:
        _write(report, config, *outputs)


def _check_out(out_dir: Path | None, force: bool) -> tuple[Path, Path] | None:
    """``(shift.json, shift.png)`` under ``--out``, checked before any model is loaded."""
    if out_dir is None:
        return None
    from lrmgym.files import OutputPathError, check_output_file

    names = ("shift.json", "shift.png")
    try:
        return tuple(check_output_file(out_dir / n, what="--out", force=force, owned=names) for n in names)  # type: ignore[return-value]
    except OutputPathError as err:
        raise _UserError(str(err)) from None


def _write(report: Any, config: dict[str, Any], json_path: Path, png_path: Path) -> None:
    import json

    from lrmgym.eval.shift import plot_shift
    from lrmgym.files import atomic_write_text

    text = json.dumps({**report.to_dict(), "config": config}, indent=2, ensure_ascii=False)
    atomic_write_text(json_path, text + "\n")
    plot_shift(report, png_path)
    click.echo(f"results: {json_path}  plot: {png_path}")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _print_table(report: Any, config: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    s = report.summary
    table = Table(title=f"token shift: {config['rl']} vs {config['base']} on {config['env']['id']} "
                  f"({config['tasks']} tasks, {s['positions']} base positions)")  # fmt: skip
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name in ("unshifted", "reranked", "shifted"):
        table.add_row(f"{name} rate", f"{_pct(s['rates'][name])} ({s['counts'][name]})")
    table.add_row("RL token's mean rank under the base (reranked)", _num(s["reranked_mean_rank"]))
    entropy = s["entropy"]
    table.add_row("base entropy, reranked / unshifted (nats)",
                  f"{_num(entropy['reranked'], 3)} / {_num(entropy['unshifted'], 3)}")  # fmt: skip
    table.add_row("entropy ratio (reranked / unshifted)", _num(s["entropy_ratio"]))
    for name, label in (("base", "base"), ("rl", "RL"), ("oracle", "oracle"), ("control", "control (random top-20)")):
        table.add_row(f"greedy accuracy: {label}", _pct(report.accuracy[name]))
    table.add_row("oracle: share of tokens edited", _pct(report.oracle_edit_rate))
    table.add_row("control: share of tokens edited", _pct(report.control_edit_rate))
    table.add_row("oracle = RL's own greedy tokens", _pct(report.oracle_matches_rl))
    for gate in report.gated:
        table.add_row(
            f"gated (base entropy > {gate['tau']:g}): accuracy / tokens gated / edited / = RL's greedy",
            f"{_pct(gate['accuracy'])} / {_pct(gate['gated_rate'])} / {_pct(gate['edit_rate'])} / "
            f"{_pct(gate['matches_rl'])}",
        )
    table.add_row("wall time", f"{report.wall_s:.1f} s")
    Console().print(table)
