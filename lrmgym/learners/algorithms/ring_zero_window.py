"""Ring-Zero's response window against the env's reference solutions (issue 38 item 4).

RL-1's window starts small and doubles (papers.md 3.2). A first window shorter than the solutions the tasks
need cuts every sample that follows them, and a cut sample fails the strict format: on ``env=math`` the old
24-token window cut the 9.7 % of problems whose reference takes 25-28 tokens. :func:`fit_window` measures the
reference solutions (``Task.metadata["solution"]``, else the env's ``solution(task)``) of a sample of the
stage's own training tasks, tokenized with EOS, and

- resolves ``window_start="auto"`` to the longest of them (at most ``max_new_tokens``; ``max_new_tokens``
  throughout when the env has no references);
- warns, in one line naming the option to change, when the first window (or ``max_new_tokens``, for a stage
  without a window) is below the longest. A warning and not a refusal: the paper's own curriculum starts below
  the lengths the model later reaches, so a small first window is a legitimate choice, and runs made with the
  old default (24) must still resume.
"""

from __future__ import annotations

import sys
from typing import Any

from lrmgym.episodes import env_attr
from lrmgym.learners.algorithms.sft import with_eos

__all__ = ["REFERENCE_TASKS", "fit_window", "reference_lengths"]

REFERENCE_TASKS = 2048
"""How many of the stage's first training tasks are measured."""
_PROBE = 64  # an env none of whose first 64 tasks has a reference is taken to have none


def reference_lengths(env: Any, tokenizer: Any, seed: int, count: int = REFERENCE_TASKS) -> list[int]:
    """Token counts (EOS included) of the reference solutions of tasks ``0..count-1`` of stream ``seed``.

    Tasks without a reference are skipped; ``[]`` when none of the first few has one (a data set without worked
    solutions).
    """
    solve = env_attr(env, "solution")
    eos = int(tokenizer.eos_token_id)
    out: list[int] = []
    for i in range(count):
        if i == _PROBE and not out:
            return []
        task = env.task_at(i, seed=seed)
        text = (task.metadata or {}).get("solution")
        if text is None and callable(solve):
            try:
                text = solve(task)
            except (ValueError, KeyError, TypeError):  # this task has no worked solution
                text = None
        if isinstance(text, str) and text:
            out.append(len(with_eos(tokenizer(text, add_special_tokens=False)["input_ids"], eos)))
    return out


def fit_window(cfg: Any, env: Any, tokenizer: Any, seed: int, stage: str) -> tuple[Any, dict[str, Any]]:
    """``cfg`` with ``window_start`` resolved (``"auto"``) and checked against the references; and what was found.

    Args:
        cfg: The RL stage's options (``window_start``, ``max_new_tokens``, ``window(step)``).
        env: The stage's env (``task_at``).
        tokenizer: The policy's tokenizer.
        seed: The stage's training-stream seed (the tasks measured are the ones it trains on first).
        stage: The stage's name, for the option named in the warning (``learner.<stage>.window_start``).

    Returns:
        The config to train with, and ``{"window": first budget, "reference_max": longest or None,
        "reference_cut": share of the measured references longer than the first budget, "warning": text or
        None}``. The warning is also printed to stderr.
    """
    lengths = reference_lengths(env, tokenizer, seed)
    auto = cfg.window_start == "auto"
    if not lengths:
        if auto:
            cfg = cfg.model_copy(update={"window_start": None})
        return cfg, {"window": cfg.window(0), "reference_max": None, "reference_cut": None, "warning": None}
    longest = max(lengths)
    if auto:
        cfg = cfg.model_copy(update={"window_start": min(longest, cfg.max_new_tokens)})
    first = cfg.window(0)
    cut = sum(n > first for n in lengths)
    warning = None
    if cut:
        fixes = []
        if isinstance(cfg.window_start, int) and not auto and cfg.window_start < longest:
            fixes.append(f"learner.{stage}.window_start=auto (or >= {longest})")
        if cfg.max_new_tokens < longest:
            fixes.append(f"learner.{stage}.max_new_tokens>={longest}")
        what = "first response window" if cfg.window_start is not None else "token budget (max_new_tokens)"
        warning = (
            f"warning: {stage}'s {what} is {first} tokens, shorter than the reference solutions of {cut} of "
            f"{len(lengths)} of its training tasks (longest {longest} tokens with EOS), so their samples are cut "
            f"and fail the format; set {' and '.join(fixes)}."
        )
        print(warning, file=sys.stderr, flush=True)
    return cfg, {"window": first, "reference_max": longest, "reference_cut": cut / len(lengths), "warning": warning}
