"""The evaluation loop: tasks -> n samples each -> verdicts -> pass@k / avg@n report, files and a table."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lrmgym.core import Completion, Task, TextEnv, Verdict, learner_env, task_rng
from lrmgym.episodes import rollout
from lrmgym.eval.config import EvalConfig
from lrmgym.eval.passk import avg_at_n, bootstrap_interval, pass_at_k, wilson_interval
from lrmgym.files import atomic_write_text
from lrmgym.policies.base import Policy

__all__ = ["evaluate", "print_report", "select_tasks"]


# --------------------------------------------------------------------------------------------------- tasks
def _with_split(env: TextEnv, split: str | None) -> TextEnv:
    """The env itself, or a copy with ``split`` when the env has a ``split`` option that differs."""
    base = env.unwrapped
    options = getattr(base, "config", None)
    if split is None or options is None or "split" not in type(options).model_fields:
        return base
    if options.split == split:
        return base
    return type(base)(**{**options.model_dump(), "split": split})


def select_tasks(env: TextEnv, cfg: EvalConfig) -> tuple[TextEnv, list[Task]]:
    """The env to grade with (split applied) and its tasks ``0 .. cfg.tasks - 1`` of stream ``cfg.seed``.

    A finite data set may hold fewer tasks: the list stops at the first index the env rejects with
    ``IndexError``, and at the data set's size (``num_items``) when the env serves it in order
    (``order="sequential"``, where index i is item i mod N): a problem counted twice would narrow the intervals
    over problems.
    """
    env = _with_split(env, cfg.split)
    limit = cfg.tasks
    count = getattr(env, "num_items", None)
    if isinstance(count, int) and getattr(getattr(env, "config", None), "order", None) == "sequential":
        limit = min(limit, count)
    tasks = []
    for index in range(limit):
        try:
            tasks.append(env.task_at(index, seed=cfg.seed))
        except IndexError:
            break
    if not tasks:
        raise ValueError(f"The env {type(env).__name__} produced no tasks for split={cfg.split!r}, seed={cfg.seed}.")
    return env, tasks


def _grade(env: TextEnv, task: Task, completions: list[Completion]) -> list[Verdict]:
    """The env's verdicts; a verifier that raises (a bug: verify must not) makes the group ungradeable."""
    try:
        verdicts = env.score_group(task, completions)
    except Exception as err:  # noqa: BLE001 - a crashing verifier must not end a long evaluation
        reason = f"verifier raised {type(err).__name__}: {str(err)[:200]}"
        return [Verdict.ungradeable(reason) for _ in completions]
    if len(verdicts) != len(completions):
        return [Verdict.ungradeable(f"score_group returned {len(verdicts)} verdicts for {len(completions)}")] * len(
            completions
        )
    return list(verdicts)


def _passes(verdict: Verdict, threshold: float) -> bool:
    if verdict.score is None:
        return False
    if verdict.correct is not None:
        return bool(verdict.correct)
    return verdict.score >= threshold


# --------------------------------------------------------------------------------------------------- loop
def evaluate(
    env: TextEnv,
    policy: Policy,
    cfg: EvalConfig,
    out_dir: Path | None = None,
    progress: bool = True,
    transform: Callable[[Task], Task] | None = None,
) -> dict:
    """Evaluate ``policy`` on ``env``: ``cfg.n`` samples for each of ``cfg.tasks`` tasks.

    Args:
        env: The env (a gymnasium wrapper around it is fine). With ``cfg.split`` set and a ``split`` option,
            the tasks come from that split.
        policy: Anything with ``generate(prompts, n, sampling)``.
        cfg: What to evaluate and how to sample.
        out_dir: Where to write ``eval.json`` (the report) and ``samples.jsonl`` (one line per sample);
            ``None`` writes nothing.
        progress: Show a progress bar.
        transform: Rewrites each held-out task before it is sampled and graded (e.g. Ring-Zero's tier prompt
            before the question); None: the tasks as the env makes them.

    Returns:
        The report: pass@k and avg@n with intervals, accuracy by difficulty, mean length, format-failure,
        ungradeable and truncation rates, throughput, and the config.
    """
    grader, tasks = select_tasks(env, cfg)
    if transform is not None:
        tasks = [transform(t) for t in tasks]
    turns = learner_env(grader).max_turns
    samples: list[dict[str, Any]] = []
    correct: list[int] = []
    first_correct: list[int] = []
    start = time.perf_counter()
    with _progress(len(tasks), progress) as bar:  # closed on an error too: its line never precedes the error's
        for b in range(0, len(tasks), cfg.batch_size):
            batch = tasks[b : b + cfg.batch_size]
            seed = int(task_rng(cfg.seed, b, 1).integers(0, 2**31 - 1))  # one sampling seed per batch, reproducible
            if turns > 1:  # multi-turn: whole episodes (feedback turns included), graded by their final verdict
                _multi_turn_batch(grader, policy, cfg, batch, b, seed, turns, samples, correct, first_correct)
                bar.update(len(batch))
                continue
            groups = policy.generate([t.prompt for t in batch], n=cfg.n, sampling=cfg.sampling(seed))
            if len(groups) != len(batch) or any(len(g) != cfg.n for g in groups):
                got = [len(g) for g in groups]
                raise RuntimeError(
                    f"{type(policy).__name__}.generate returned {got} completions for {len(batch)} prompts x "
                    f"n={cfg.n}; a policy must return one list of n completions per prompt."
                )
            for index, (task, group) in enumerate(zip(batch, groups, strict=True), start=b):
                group = [Completion.coerce(c) for c in group]
                verdicts = _grade(grader, task, group)
                passed = [_passes(v, cfg.pass_threshold) for v in verdicts]
                correct.append(sum(passed))
                rows = zip(group, verdicts, passed, strict=True)
                samples += [_sample_row(index, task, j, c, v, p) for j, (c, v, p) in enumerate(rows)]
            bar.update(len(batch))
    report = _report(cfg, grader, tasks, samples, correct, time.perf_counter() - start, env_name=_env_name(env))
    if turns > 1:
        report["max_turns"] = turns
        report["first_turn_avg@n"] = avg_at_n(first_correct, cfg.n)
        report["mean_turns"] = float(np.mean([s["turns"] for s in samples])) if samples else None
    if out_dir is not None:
        _write(Path(out_dir), report, samples)
    return report


def _multi_turn_batch(
    grader: Any, policy: Policy, cfg: EvalConfig, batch: list[Task], start: int, seed: int, turns: int,
    samples: list[dict[str, Any]], correct: list[int], first_correct: list[int],
) -> None:  # fmt: skip
    """Sample and grade whole episodes of ``batch`` (:func:`lrmgym.episodes.rollout`), appending the results."""
    ro = rollout(grader, policy, batch, cfg.n, cfg.sampling(seed), turns)
    for index, (task, group, per_turn) in enumerate(zip(batch, ro.groups, ro.turn_verdicts, strict=True), start=start):
        passed = [_passes(t.verdict, cfg.pass_threshold) for t in group]
        correct.append(sum(passed))
        first_correct.append(sum(_passes(v[0], cfg.pass_threshold) for v in per_turn))
        for j, (traj, ok) in enumerate(zip(group, passed, strict=True)):
            row = _sample_row(index, task, j, traj.policy_turns[-1].completion, traj.verdict, ok)
            row["turns"] = len(traj.policy_turns)
            row["transcript"] = [{"role": turn.role, "text": turn.text} for turn in traj.turns]
            samples.append(row)


def _progress(total: int, enabled: bool) -> Any:
    from lrmgym.progress import progress_bar

    return progress_bar(total, "eval", "tasks", enabled=enabled, leave=False)


def _sample_row(index: int, task: Task, j: int, c: Completion, v: Verdict, passed: bool) -> dict[str, Any]:
    return {
        "index": index, "task_id": task.id, "sample": j, "difficulty": _jsonable(task.difficulty),
        "prompt": task.prompt if j == 0 else None, "answer": _jsonable(task.answer), "completion": c.text,
        "tokens": len(c.token_ids) if c.token_ids is not None else None, "finish_reason": c.finish_reason,
        "passed": passed, "verdict": v.to_dict(),
    }  # fmt: skip


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


# --------------------------------------------------------------------------------------------------- report
def _report(
    cfg: EvalConfig, env: TextEnv, tasks: list[Task], samples: list[dict], correct: list[int], wall: float,
    env_name: str,
) -> dict:  # fmt: skip
    n, level = cfg.n, cfg.confidence
    per_task_avg = [c / n for c in correct]
    passk = {}
    for k in cfg.k:
        values = [pass_at_k(n, c, k) for c in correct]
        low, high = bootstrap_interval(values, confidence=level, resamples=cfg.bootstrap, seed=cfg.seed)
        passk[f"pass@{k}"] = {"value": float(np.mean(values)), "ci": [low, high]}
    low, high = bootstrap_interval(per_task_avg, confidence=level, resamples=cfg.bootstrap, seed=cfg.seed)
    verdicts = [s["verdict"] for s in samples]
    format_checked = [v["format_ok"] for v in verdicts if v["format_ok"] is not None]
    ungradeable = sum(v["score"] is None for v in verdicts)
    scores = [v["score"] for v in verdicts if v["score"] is not None]
    tokens = [s["tokens"] for s in samples if s["tokens"] is not None]
    truncated = sum(s["finish_reason"] == "length" for s in samples)
    return {
        "env": env_name,  # the id the caller made, even when the tasks come from a split-switched copy
        "env_config": env.config.model_dump(mode="json") if getattr(env, "config", None) is not None else None,
        "split": getattr(getattr(env, "config", None), "split", None),
        "tasks": len(tasks), "n": n, "samples": len(samples),
        "avg@n": {"value": avg_at_n(correct, n), "ci": [low, high]},
        "interval": {"method": "percentile bootstrap over tasks", "confidence": level, "resamples": cfg.bootstrap},
        "pass@k": passk,
        "mean_score": float(np.mean(scores)) if scores else None,
        "by_difficulty": _by_difficulty(tasks, correct, n, cfg.k),
        "mean_tokens": float(np.mean(tokens)) if tokens else None,
        "mean_chars": float(np.mean([len(s["completion"]) for s in samples])),
        "format_failure_rate": _rate(sum(not ok for ok in format_checked), len(format_checked), level),
        "ungradeable_rate": _rate(ungradeable, len(samples), level),
        "truncated_rate": _rate(truncated, len(samples), level),
        "wall_s": wall, "samples_per_s": len(samples) / wall if wall > 0 else None,
        "tokens_per_s": sum(tokens) / wall if tokens and wall > 0 else None,
        "config": cfg.model_dump(mode="json"),
    }  # fmt: skip


def _env_name(env: TextEnv) -> str:
    """The registered id (``lrmgym/Math-v0``) when the env was made by id, else its class name."""
    spec = getattr(env, "spec", None) or getattr(env.unwrapped, "spec", None)
    return getattr(spec, "id", None) or type(env.unwrapped).__name__


def _rate(count: int, total: int, level: float) -> dict[str, Any]:
    """A rate over samples with its Wilson interval (samples treated as independent; an approximation)."""
    return {"value": count / total if total else None, "count": count, "total": total,
            "ci": list(wilson_interval(count, total, level))}  # fmt: skip


def _by_difficulty(tasks: Sequence[Task], correct: Sequence[int], n: int, ks: Sequence[int]) -> dict[str, dict]:
    groups: dict[str, list[int]] = defaultdict(list)
    for task, c in zip(tasks, correct, strict=True):
        groups[str(task.difficulty)].append(c)
    return {
        level: {"tasks": len(cs), "avg@n": avg_at_n(cs, n),
                **{f"pass@{k}": float(np.mean([pass_at_k(n, c, k) for c in cs])) for k in ks}}
        for level, cs in sorted(groups.items())
    }  # fmt: skip


def _write(out_dir: Path, report: dict, samples: list[dict]) -> None:
    """Write both files atomically (temporary file + rename)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "samples.jsonl", "".join(json.dumps(s, ensure_ascii=False) + "\n" for s in samples))
    atomic_write_text(out_dir / "eval.json", json.dumps(report, indent=2, ensure_ascii=False) + "\n")


# --------------------------------------------------------------------------------------------------- table
def print_report(report: dict, console: Any = None) -> None:
    """Print the report as a rich table (metric, value, interval)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    level = int(round(report["config"]["confidence"] * 100))
    name = f"eval={report['suite']} on {report['env']}" if report.get("suite") else report["env"]
    table = Table(title=f"{name} ({report.get('split') or 'default split'}): {report['tasks']} tasks x "
                  f"n={report['n']}, T={report['config']['temperature']}")  # fmt: skip
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column(f"{level}% CI", justify="right")
    for name, entry in [("avg@n", report["avg@n"]), *report["pass@k"].items()]:
        table.add_row(name, _pct(entry["value"]), f"{_pct(entry['ci'][0])} - {_pct(entry['ci'][1])}")
    for name in ("format_failure_rate", "ungradeable_rate", "truncated_rate"):
        entry = report[name]
        ci = f"{_pct(entry['ci'][0])} - {_pct(entry['ci'][1])}" if entry["total"] else ""
        table.add_row(name.replace("_", " "), _pct(entry["value"]), ci)
    if "first_turn_avg@n" in report:
        table.add_row(f"first turn avg@n (of {report['max_turns']})", _pct(report["first_turn_avg@n"]), "")
        table.add_row("mean turns", f"{report['mean_turns']:.2f}", "")
    table.add_row("mean tokens", "-" if report["mean_tokens"] is None else f"{report['mean_tokens']:.1f}", "")
    table.add_row("wall time", f"{report['wall_s']:.1f} s", "")
    console.print(table)
    if len(report["by_difficulty"]) > 1:
        by = Table(title="by difficulty")
        ks = list(report["pass@k"])
        for col in ("difficulty", "tasks", "avg@n", *ks):
            by.add_column(col, justify="right")
        for level_name, row in report["by_difficulty"].items():
            by.add_row(level_name, str(row["tasks"]), _pct(row["avg@n"]), *(_pct(row[k]) for k in ks))
        console.print(by)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"
