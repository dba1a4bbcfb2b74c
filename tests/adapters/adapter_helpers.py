"""Helpers of the adapter tests: what ``lrmgym judge`` says about completions of labelled tasks.

:func:`judge_verdicts` grades ``(label, completion)`` pairs the way ``lrmgym judge`` does
(:func:`lrmgym.judges.scoring.judge_file` on a JSONL written from the labels' tasks, lines of one task forming its
group), with a fresh env: the numbers every adapter must reproduce.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lrmgym.configs.resolve import validate_component, validate_env
from lrmgym.integrations.labels import decode_label
from lrmgym.testing.judging import judge_rows, task_row


def build_judges(judge_cfgs: dict[str, Any]) -> list[Any]:
    """Fresh judge objects from configs (models or their dumps), in order."""
    return [
        (c if hasattr(c, "build") else validate_component("judge", f"judge.{n}", dict(c))).build()
        for n, c in judge_cfgs.items()
    ]


def judge_verdicts(
    env_cfg: Any, judges: Sequence[Any], labels: Sequence[Any], texts: Sequence[str], tmp_path: Path
) -> list[dict]:
    """``lrmgym judge``'s verdict (as its output file holds it) for each ``texts[i]`` of the task ``labels[i]``.

    ``env_cfg`` is the env the tasks are rebuilt from (``None``: the first label's own env config); ``judges`` are
    judge objects, reused across calls the way one trainer's judges are.
    """
    decoded = [decode_label(raw) for raw in labels]
    env = (env_cfg if env_cfg is not None else validate_env(decoded[0].env)).make()
    tasks = [env.unwrapped.task_at(label.index, seed=label.seed) for label in decoded]
    # lines of one task_id form its group, as TRL's and verl's batches hold a prompt's completions together
    return judge_rows([task_row(t, text) for t, text in zip(tasks, texts, strict=True)], judges, env, tmp_path)


def contributions(verdict: dict, names: Sequence[str]) -> dict[str, float | None]:
    """Each judge's ``weight * score`` in a verdict dict; all ``None`` when the verdict is ungradeable."""
    if verdict["score"] is None:
        return dict.fromkeys(names)
    parts = {c["name"]: c for c in verdict["components"]}
    return {n: parts[n]["weight"] * parts[n]["score"] for n in names}


def adversarial_math_completions() -> list[str]:
    """The math verifier battery's predictions, bare and in the math env's answer tags (the slow ones bare only)."""
    import pytest

    from lrmgym.testing import adversarial as battery

    cases = battery.cases("math_verifier")
    if cases is None:
        pytest.skip(f"adversarial battery not found at {battery.battery_path()} (set LRMGYM_SHARED_DATA)")
    out = []
    for case in cases:
        pred = case["input"]["pred"]
        out.append(pred)
        if case["expected"].get("max_wall_s", 0.0) <= 2.0:  # a bounded verifier run each: keep the slow ones out
            out.append(f"<think>x</think><answer>{pred}</answer>")
    return out
