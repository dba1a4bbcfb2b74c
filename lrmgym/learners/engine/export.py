"""Export a run's logged rollouts: one JSONL row per rollout, and preference pairs in TRL's DPO format.

What a run logs: ``samples.jsonl`` of ``lrmgym run`` holds, for every training step, the first
``learner.log_samples`` groups of the step's rollout (default 2; see
:func:`lrmgym.learners.engine.metrics.sample_records`), each with all its trajectories, their turns, rewards,
advantages and verdicts. To log every rollout, run with ``learner.log_samples=<learner.prompts_per_step>``.
Token ids are not logged, so ``prompt_token_ids`` and ``token_ids`` are ``null`` (a reader re-tokenises).

One row per rollout, a :class:`~lrmgym.learners.engine.traces.JudgedRollout` line (:data:`TRACE_FIELDS`, in this
order, so the file is ``learner=reason_maxxer``'s ``rollouts_from`` input)::

    {"task_id": str, "prompt": str | [chat messages], "completion": str, "prompt_token_ids": [int] | null,
     "token_ids": [int] | null, "reward": float | null, "correct": bool | null, "strength": float | null,
     "finish_reason": null, "step": int, "verdict": {...}}

``completion`` is the final policy turn. For a multi-turn trajectory ``prompt`` is the transcript before it: a
text prompt followed by the earlier turns' texts as the policy saw them (EOS tokens are not in the text), or
the chat messages followed by one ``assistant`` message per earlier policy turn and one ``user`` message per
env reply. ``reward`` is the trajectory's reward (its verdict's score; ``null`` when ungradeable), ``correct``
the verdict's flag, ``verdict`` the logged verdict (``{}`` when the trajectory had none).

``strength`` is the Bradley-Terry strength the arena judge (:mod:`lrmgym.judges.arena`) fitted for the rollout
when its group went to the tournament; ``null`` for groups it did not route and without an arena judge. The
arena records it as its verdict component's ``raw_score`` (runs logged before that: only in the component's
text, ``"tournament: strength +0.123 (...)"``, rounded to 3 decimals; :func:`arena_strength` reads either). The
arena's *reward* for the rollout is that component's ``score``: the group's strengths min-max normalised to
[0, 1] (times ``reward_scale``).

Preference pairs (TRL's preference format: ``{"prompt", "chosen", "rejected"}``, all strings; conversational,
i.e. lists of messages with the completions as one ``assistant`` message each, when the prompt is chat
messages): within each group, the best rollout against each lower-scored one (so best vs worst among them):
at most G - 1 pairs per group. The score is the arena strength in groups the arena routed and the reward
elsewhere (``by="auto"``), or one of them throughout. Skipped: ties, margins below ``min_margin``, completions
identical to the best one, repeats of a pair already made (a lower rollout with the same text as an earlier
one), rollouts without that score, and rollouts whose prompt differs from the best one's (multi-turn
transcripts).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lrmgym.files import atomic_write_text
from lrmgym.learners.engine.traces import TRACE_FIELDS

__all__ = [
    "SKIP_REASONS",
    "TRACE_FIELDS",
    "ExportStats",
    "TraceFileError",
    "arena_strength",
    "export_traces",
    "preference_pairs",
    "read_samples",
    "trace_rows",
]


PairScore = Literal["auto", "reward", "strength"]
SKIP_REASONS = ("tie", "margin", "identical", "duplicate", "other_prompt", "unscored")
"""Why a rollout made no pair (see :func:`preference_pairs`)."""
_STRENGTH_RE = re.compile(r"^tournament: strength ([+-]?\d+(?:\.\d+)?) \(")
"""The arena's component reason for a routed rollout (see ``ArenaJudge.score_group``)."""


class TraceFileError(ValueError):
    """A samples file that cannot be exported (the message names the file, the line and what is wrong)."""


def arena_strength(verdict: Mapping[str, Any] | None) -> float | None:
    """The Bradley-Terry strength in a logged verdict's arena component, or ``None`` when it has none.

    The component's ``raw_score`` (the unrounded strength), or for runs logged before it was recorded, the
    strength in its reason, the arena's tournament line (rounded to 3 decimals). The first such component counts
    (a verdict has one arena).
    """
    for component in (verdict or {}).get("components") or ():
        raw = component.get("raw_score") if isinstance(component, Mapping) else None
        if isinstance(raw, (int, float)) and not isinstance(raw, bool) and math.isfinite(raw):
            return float(raw)
        match = _STRENGTH_RE.match(str(component.get("reason", ""))) if isinstance(component, Mapping) else None
        if match:
            return float(match.group(1))
    return None


# ------------------------------------------------------------------------------------------------ reading
def read_samples(path: Path) -> tuple[list[dict[str, Any]], bool]:
    """The group records of a ``samples.jsonl``, and whether a torn last line (a killed run's) was dropped.

    Raises:
        TraceFileError: A line that is not JSON (other than a torn last line), or not a group record.
    """
    records: list[dict[str, Any]] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.readlines()
    torn = False
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines) and not line.endswith("\n"):
                torn = True  # the run was killed while writing it; a resume drops it too
                continue
            raise TraceFileError(f"{path}:{number}: not a JSON line ({err.msg} at column {err.colno}).") from None
        records.append(_checked(record, f"{path}:{number}"))
    return records, torn


def _checked(record: Any, where: str) -> dict[str, Any]:
    """``record`` if it is a group record of ``lrmgym run``; else :class:`TraceFileError`."""
    expected = "expected a group record of `lrmgym run` ({step, task_id, prompt, trajectories: [{turns, ...}]})"
    if not isinstance(record, dict) or not isinstance(record.get("trajectories"), list):
        raise TraceFileError(f"{where}: no 'trajectories' list; {expected}.")
    step, prompt = record.get("step"), record.get("prompt")
    if isinstance(step, bool) or not isinstance(step, int):
        raise TraceFileError(f"{where}: 'step' is {step!r}, not an integer; {expected}.")
    if not isinstance(record.get("task_id"), str) or not isinstance(prompt, (str, list)):
        raise TraceFileError(f"{where}: 'task_id' must be a string and 'prompt' a string or messages; {expected}.")
    for k, traj in enumerate(record["trajectories"]):
        turns = traj.get("turns") if isinstance(traj, dict) else None
        if not isinstance(turns, list) or not any(isinstance(t, dict) and t.get("role") == "policy" for t in turns):
            raise TraceFileError(f"{where}: trajectory {k} has no policy turn; {expected}.")
    return record


# ------------------------------------------------------------------------------------------------ rows
def _transcript(prompt: str | list[dict[str, Any]], turns: Sequence[Mapping[str, Any]]) -> Any:
    """The context of the turn after ``turns``: the prompt, then those turns (text, or chat messages)."""
    if not turns:
        return prompt
    if isinstance(prompt, str):
        return prompt + "".join(str(t.get("text", "")) for t in turns)
    roles = {"policy": "assistant", "env": "user"}
    return [*prompt, *({"role": roles.get(t.get("role"), "user"), "content": str(t.get("text", ""))} for t in turns)]


def trace_rows(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One exported row (:data:`TRACE_FIELDS`) per trajectory of a group record."""
    rows = []
    for traj in record["trajectories"]:
        turns = traj["turns"]
        last = max(i for i, t in enumerate(turns) if isinstance(t, dict) and t.get("role") == "policy")
        verdict = traj.get("verdict") or {}
        rows.append({
            "task_id": record["task_id"],
            "prompt": _transcript(record["prompt"], turns[:last]),
            "completion": str(turns[last].get("text", "")),
            "prompt_token_ids": turns[last].get("prompt_token_ids"),
            "token_ids": turns[last].get("token_ids"),
            "reward": traj.get("reward"),
            "correct": verdict.get("correct"),
            "strength": arena_strength(verdict),
            "finish_reason": None,  # not logged
            "step": record["step"],
            "verdict": verdict,
        })  # fmt: skip
    return rows


# ------------------------------------------------------------------------------------------------ pairs
@dataclass
class ExportStats:
    """What :func:`export_traces` wrote and skipped."""

    rollouts: int = 0
    groups: int = 0
    steps: tuple[int, int] | None = None
    with_strength: int = 0
    pairs: int = 0
    skipped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SKIP_REASONS, 0))
    torn_last_line: bool = False


def _scores(rows: Sequence[Mapping[str, Any]], by: PairScore) -> list[float | None]:
    if by == "auto":
        by = "strength" if any(r["strength"] is not None for r in rows) else "reward"
    return [None if r[by] is None else float(r[by]) for r in rows]


def _pair(prompt: Any, chosen: str, rejected: str) -> dict[str, Any]:
    if isinstance(prompt, list):  # conversational: the completions as assistant messages
        chosen_msg, rejected_msg = ({"role": "assistant", "content": text} for text in (chosen, rejected))
        return {"prompt": prompt, "chosen": [chosen_msg], "rejected": [rejected_msg]}
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


def preference_pairs(
    rows: Sequence[Mapping[str, Any]], min_margin: float = 0.0, by: PairScore = "auto",
    skipped: dict[str, int] | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """The preference pairs of one group's rows: its best rollout against each lower-scored one.

    Args:
        rows: The group's exported rows (:func:`trace_rows`).
        min_margin: Skip a pair whose score difference is below this (a tie, difference 0, is always skipped).
        by: ``strength``, ``reward``, or ``auto``: strength when the arena routed the group, else reward.
        skipped: Counters to add the skipped rollouts to, by reason (see :class:`ExportStats`).

    Returns:
        ``{"prompt", "chosen", "rejected"}`` dicts, in the rows' order; the best is the first of the top score.
    """
    skipped = skipped if skipped is not None else {}
    scores = _scores(rows, by)
    scored = [k for k, s in enumerate(scores) if s is not None]
    skipped["unscored"] = skipped.get("unscored", 0) + len(rows) - len(scored)
    if not scored:
        return []
    best = max(scored, key=lambda k: (scores[k], -k))
    pairs, rejected = [], set()
    for k in scored:
        if k == best:
            continue
        margin = scores[best] - scores[k]  # type: ignore[operator]
        reason = None
        if rows[k]["prompt"] != rows[best]["prompt"]:
            reason = "other_prompt"
        elif margin <= 0:
            reason = "tie"
        elif margin < min_margin:
            reason = "margin"
        elif rows[k]["completion"] == rows[best]["completion"]:
            reason = "identical"
        elif rows[k]["completion"] in rejected:
            reason = "duplicate"
        if reason is not None:
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        rejected.add(rows[k]["completion"])
        pairs.append(_pair(rows[best]["prompt"], rows[best]["completion"], rows[k]["completion"]))
    return pairs


# ------------------------------------------------------------------------------------------------ export
def _jsonl(rows: Sequence[Mapping[str, Any]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in rows)


def export_traces(
    samples: Path, out: Path, pairs_out: Path | None = None, min_margin: float = 0.0, by: PairScore = "auto"
) -> ExportStats:
    """Write the rollouts of ``samples`` (a run's ``samples.jsonl``) to ``out``, and its pairs to ``pairs_out``.

    Both files are written atomically, and only once the whole input has been read.

    Raises:
        TraceFileError: A broken line (see :func:`read_samples`).
    """
    records, torn = read_samples(Path(samples))
    stats = ExportStats(torn_last_line=torn)
    rows, pairs = [], []
    for record in records:
        group = trace_rows(record)
        rows += group
        pairs += preference_pairs(group, min_margin, by, stats.skipped)
    steps = [r["step"] for r in records]
    stats.rollouts, stats.groups, stats.pairs = len(rows), len(records), len(pairs)
    stats.steps = (min(steps), max(steps)) if steps else None
    stats.with_strength = sum(r["strength"] is not None for r in rows)
    atomic_write_text(out, _jsonl(rows))
    if pairs_out is not None:
        atomic_write_text(pairs_out, _jsonl(pairs))
    return stats
