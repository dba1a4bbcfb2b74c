"""What the loop's records look like to a tracker: scalars of a metrics line, tables of samples and evaluations.

Pure functions over the records the loop writes (a ``metrics.jsonl`` line, ``samples.jsonl`` records, the
``evals`` of ``summary.json``), so every tracker shows the same names and numbers as the run directory.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from lrmgym.tracking.base import Cell, Table

__all__ = ["EVAL_COLUMNS", "cell", "eval_scalars", "eval_table", "flatten", "sample_table", "scalars"]

EVAL_COLUMNS = ["eval", "step", "mode", "accuracy", "ci_low", "ci_high", "tasks", "n", "mean_tokens"]
"""The eval table: one row per evaluation (``before``, ``step_N``, ``after``) and mode (sampled, greedy)."""


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Every number of a metrics line (``step`` aside) under its own name; ``None``, text and booleans are left out."""
    return {
        key: float(value)
        for key, value in metrics.items()
        if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)
    }


def cell(value: Any) -> Cell:
    """A table cell: JSON scalars as they are, anything else (a chat prompt, a list) as compact JSON text."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return json.dumps(value, ensure_ascii=False, default=str)


def sample_table(records: Iterable[Mapping[str, Any]]) -> Table | None:
    """``samples.jsonl`` records as one table: a row per trajectory, with its verdict and its judges' scores.

    A record of a group learner holds its ``trajectories``; each becomes a row with the record's own fields
    (step, task, prompt, answer), the trajectory's (reward, advantage...), ``completion`` (the policy's text; the
    turns, roles marked, when the env replied), the verdict's fields and one ``judge/<name>`` column per verdict
    component. Any other record (e.g. an offline learner's) is one row of its own fields. None when there is none.
    """
    rows: list[dict[str, Any]] = []
    for record in records:
        shared = {k: v for k, v in record.items() if k != "trajectories"}
        trajectories = record.get("trajectories")
        if not isinstance(trajectories, list):
            rows.append(shared)
            continue
        for i, traj in enumerate(trajectories):
            row = {**shared, "sample": i}
            row.update({k: v for k, v in traj.items() if k not in ("turns", "verdict")})
            row["completion"] = _completion(traj.get("turns") or [])
            verdict = traj.get("verdict") or {}
            row.update({k: v for k, v in verdict.items() if k not in ("components", "latency_s")})
            for component in verdict.get("components") or ():
                row[f"judge/{component.get('name')}"] = component.get("score")
            rows.append(row)
    if not rows:
        return None
    columns = list(dict.fromkeys(key for row in rows for key in row))
    return Table(columns, [[cell(row.get(c)) for c in columns] for row in rows])


def _completion(turns: list[Mapping[str, Any]]) -> str:
    policy = [t.get("text", "") for t in turns if t.get("role") == "policy"]
    if len(policy) == len(turns):
        return "".join(policy)
    return "\n".join(f"[{t.get('role')}] {t.get('text', '')}" for t in turns)


def eval_table(evals: Mapping[str, Mapping[str, Any]]) -> Table:
    """The loop's evaluations (``{"before": {"step": 0, "sampled": {...}, "greedy": {...}}, ...}``), by step."""
    rows = []
    for key, entry in sorted(evals.items(), key=lambda item: item[1].get("step", 0)):
        for mode in ("sampled", "greedy"):
            result = entry.get(mode)
            if not isinstance(result, Mapping):
                continue
            low, high = result.get("ci") or (None, None)
            rows.append([
                key, entry.get("step"), mode, result.get("accuracy"), low, high, result.get("tasks"),
                result.get("n"), result.get("mean_tokens"),
            ])  # fmt: skip
    return Table(list(EVAL_COLUMNS), [[cell(v) for v in row] for row in rows])


def eval_scalars(entry: Mapping[str, Any]) -> dict[str, float]:
    """One evaluation as scalars: ``eval/<mode>/accuracy`` and ``eval/<mode>/mean_tokens``."""
    out = {}
    for mode in ("sampled", "greedy"):
        result = entry.get(mode)
        if isinstance(result, Mapping):
            for name in ("accuracy", "mean_tokens"):
                if isinstance(result.get(name), (int, float)):
                    out[f"eval/{mode}/{name}"] = float(result[name])
    return out


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b.c": leaf}`` of nested dicts (lists and scalars are leaves): a config as parameters."""
    if not isinstance(tree, Mapping) or (prefix and not tree):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out
