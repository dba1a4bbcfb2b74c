"""``lrmgym serve``: an env and its judges as an HTTP reward server (OpenRLHF's remote-reward protocol).

Example::

    lrmgym serve env=math judge=[accuracy,format_strict] --port 8000
    # OpenRLHF: --reward.remote_url http://127.0.0.1:8000/get_reward --data.label_key label

The env and judges are chosen with the same ``GROUP=PRESET`` and ``dotted.key=value`` tokens as ``lrmgym run``
(only the ``env`` and ``judge`` sections apply), so a server started with the tokens a data set was exported
with accepts that data set's labels. The protocol, the limits and the group window are described in
:mod:`lrmgym.integrations.serve`.
"""

from __future__ import annotations

import signal
from typing import Any

import click

__all__ = ["command"]


class _UserError(click.ClickException):
    exit_code = 2


def _resolve(tokens: tuple[str, ...]) -> tuple[Any, dict[str, Any]]:
    """The env config and the judge configs (by name) the tokens select, validated as ``lrmgym run`` does."""
    from lrmgym.configs.resolve import ConfigError, merged_tree, parse_overrides, validate_component, validate_env

    try:
        groups, _ = parse_overrides(tokens)
        if "env" not in groups:
            raise ConfigError(
                "env: `lrmgym serve` needs env=... (e.g. env=math): a server grades one env, fixed when it starts, "
                "and never builds an env a request describes."
            )
        tree = merged_tree(tokens, defaults={"judge": []})
        extra = sorted(k for k, v in tree.items() if k not in ("env", "judge") and v)
        if extra:
            raise ConfigError(
                f"{extra[0]}: not used by `lrmgym serve`, which reads only env=... and judge=... settings."
            )
        env = validate_env(tree["env"])
        judges_raw = tree.get("judge") or {}
        if not isinstance(judges_raw, dict):
            raise ConfigError("judge: expected judges by preset name, e.g. judge=[accuracy,format_strict].")
        judges = {name: validate_component("judge", f"judge.{name}", cfg) for name, cfg in judges_raw.items()}
    except ConfigError as err:
        raise _UserError(str(err)) from None
    return env, judges


@click.command("serve", context_settings={"ignore_unknown_options": True})
@click.option("--port", type=int, default=8000, show_default=True, help="TCP port (0: a free one, printed).")
@click.option(
    "--host", default="127.0.0.1", show_default=True,
    help="Interface to listen on. 0.0.0.0 exposes the server to other machines: it has no authentication, so "
    "anyone who reaches it can spend its CPU; use a private network or an authenticating proxy.",
)  # fmt: skip
@click.option("--workers", type=int, default=None, help="Grading threads (default: 4 per CPU core, at most 32).")
@click.option("--max-concurrency", type=int, default=512, show_default=True, help="Requests in flight; more: 503.")
@click.option("--max-body-mb", type=float, default=32.0, show_default=True, help="Largest request body; more: 413.")
@click.option("--max-items", type=int, default=4096, show_default=True, help="Most queries per request; more: 413.")
@click.option(
    "--deadline-s", type=float, default=120.0, show_default=True,
    help="Seconds to score a request once its body arrived; then 504, and its grading not yet started is cancelled.",
)  # fmt: skip
@click.option(
    "--read-timeout-s", type=float, default=30.0, show_default=True,
    help="Seconds a request's headers, then its body, may take to arrive; slower: connection closed / 408.",
)  # fmt: skip
@click.option(
    "--group-size", type=int, default=1, show_default=True,
    help="Grade N completions of one task together across requests (the arena: --rollout.n_samples_per_prompt).",
)  # fmt: skip
@click.option("--group-wait-s", type=float, default=30.0, show_default=True, help="Longest wait for a group.")
@click.option("--shutdown-grace-s", type=float, default=10.0, show_default=True, help="Grace for requests on stop.")
@click.argument("overrides", nargs=-1, metavar="[OVERRIDES]...")
def command(
    port: int, host: str, workers: int | None, max_concurrency: int, max_body_mb: float, max_items: int,
    deadline_s: float, read_timeout_s: float, group_size: int, group_wait_s: float, shutdown_grace_s: float,
    overrides: tuple[str, ...],
) -> None:  # fmt: skip
    """Serve an env and its judges over HTTP for remote trainers (POST /get_reward, GET /health).

    OVERRIDES choose the env (required) and the judges, as for `lrmgym run`, e.g.
    `env=math judge=[accuracy,format_strict]`. Each request carries OpenRLHF's {"query", "prompts", "labels"};
    the labels name the tasks (those `lrmgym export openrlhf` writes, or {"v": 1, "index": I, "seed": S}).
    """
    from pydantic import ValidationError

    from lrmgym.integrations.labels import LabelError, Scorer
    from lrmgym.integrations.serve import ServeConfig, serve

    try:  # the [serve] extra, before anything is built
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise _UserError(
            '`lrmgym serve` needs starlette and uvicorn: pip install -e ".[serve]" (or pip install "lrmgym[serve]").'
        ) from None

    options: dict[str, Any] = dict(
        host=host, port=port, max_concurrency=max_concurrency, max_body_bytes=int(max_body_mb * (1 << 20)),
        max_items=max_items, deadline_s=deadline_s, read_timeout_s=read_timeout_s, group_size=group_size,
        group_wait_s=group_wait_s,
        shutdown_grace_s=shutdown_grace_s,
    )  # fmt: skip
    if workers is not None:
        options["workers"] = workers
    try:
        config = ServeConfig(**options)
    except ValidationError as err:
        first = err.errors()[0]
        message = first["msg"].replace("Input should be", "expected").replace("Value error, ", "").rstrip(".")
        if not first["loc"]:
            raise _UserError(f"{message}.") from None
        name = str(first["loc"][0])
        flag, value = f"--{name.replace('_', '-')}", first.get("input")
        if name == "max_body_bytes":
            flag, value, message = "--max-body-mb", max_body_mb, f"{message} bytes (1 KiB)"
        raise _UserError(f"{flag}: invalid value {value!r}: {message}.") from None
    env, judges = _resolve(overrides)
    try:
        scorer = Scorer(env, judges)
    except LabelError as err:
        raise _UserError(str(err)) from None
    world = scorer.fixed
    assert world is not None
    click.echo(
        f"lrmgym serve: {world.env_id} (max_turns {world.max_turns}), judges: "
        f"{', '.join(world.judge_names) or 'none (the env verifier)'}; {config.workers} grading threads, "
        f"group size {config.group_size}"
    )
    if world.max_turns > 1:
        click.echo("  note: this env is multi-turn; the server grades single answers (no feedback turns).")
    try:
        stopped_by = serve(scorer, config)
    except OSError as err:
        raise _UserError(f"--host/--port: cannot listen on {host}:{port}: {err}") from None
    if stopped_by is not None:
        click.echo(f"lrmgym serve: stopped by {signal.Signals(stopped_by).name}; sandboxes and workers closed.")
