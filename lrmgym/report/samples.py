"""The samples a run logged, as one flat table for the report: a row per trajectory, a group per task.

Learners log two shapes into ``samples.jsonl``:

- a group (GRPO, PPO, DAPO, the RL stages of Ring-Zero): ``{step, task_id, prompt, answer, trajectories: [{turns,
  reward, advantage, verdict}]}``, each verdict with its judge components;
- a rollout (ReasonMaxxer): ``{step, task_id, completion, reward, correct, advantage, decisions: [[position,
  token, entropy]]}``; its prompt is looked up in ``reason_maxxer/rollouts.jsonl`` by task id.

SFT stages log none. A large run logs far more than a page should hold, so :func:`load_samples` embeds at most
``max_rows`` trajectories and ``max_bytes`` of the files' text: whole logged groups, evenly spread over the run
with the first and the last kept, and says so in :attr:`SampleTable.note`. Every text is model output and is
only ever put into the page as data (see :mod:`lrmgym.report.page`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from lrmgym.report.rundata import Part, iter_jsonl

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_ROWS", "MAX_TEXT_CHARS", "VERDICTS", "SampleTable", "load_samples"]

DEFAULT_MAX_ROWS = 3000
"""Trajectories embedded in a page at most, by default."""
DEFAULT_MAX_BYTES = 6_000_000
"""Bytes of ``samples.jsonl`` lines embedded at most, by default (keeps a page of long completions a few MB)."""
MAX_TEXT_CHARS = 12_000
"""A text longer than this (a prompt, a completion) is cut there, with a marker saying how much was left out."""
VERDICTS = ("correct", "incorrect", "scored", "ungradeable", "unjudged")
"""The verdict classes of a row: right, wrong, graded without a yes/no, masked out (score None), no verdict."""


@dataclass
class SampleTable:
    """The embedded samples.

    Attributes:
        groups: One per logged record: ``{"part", "step", "task", "prompt", "answer"}``.
        rows: One per trajectory: ``{"g" (its group), "text", "verdict", "reward", "adv", "comp" (one score per
            component name), "why" (component reasons), "parsed", "reason", "fmt", "dec"}``.
        components: The judge component names, in first-seen order (the table's columns).
        logged_rows: Trajectories in the files; logged_groups: records in the files.
        note: What was left out, or ``""``.
    """

    groups: list[dict[str, Any]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    components: list[str] = field(default_factory=list)
    logged_rows: int = 0
    logged_groups: int = 0
    note: str = ""

    @property
    def has_decisions(self) -> bool:
        """Whether any row carries decision tokens (ReasonMaxxer)."""
        return any(r["dec"] for r in self.rows)

    @property
    def has_format(self) -> bool:
        """Whether any row's verdict checked the answer format."""
        return any(r["fmt"] is not None for r in self.rows)


@dataclass
class _Line:
    part: int
    offset: int
    length: int
    step: int | None
    rows: int


def _num(value: Any) -> float | None:
    """A finite float, or ``None`` (missing, NaN, infinite or not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _text(value: Any) -> str:
    """Any logged value as display text (chat messages as ``role: content`` lines), cut at :data:`MAX_TEXT_CHARS`."""
    if value is None:
        return ""
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        value = "\n".join(f"{m.get('role', '?')}: {m.get('content', '')}" for m in value)
    elif not isinstance(value, str):
        value = json.dumps(value, ensure_ascii=False, default=str)
    if len(value) > MAX_TEXT_CHARS:
        value = f"{value[:MAX_TEXT_CHARS]}\n… [{len(value) - MAX_TEXT_CHARS} more characters not shown]"
    return value


def _verdict_class(verdict: dict[str, Any] | None) -> str:
    if not isinstance(verdict, dict):
        return "unjudged"
    if verdict.get("score") is None:
        return "ungradeable"
    correct = verdict.get("correct")
    return "scored" if correct is None else ("correct" if correct else "incorrect")


def _turns_text(turns: Any) -> str:
    if not isinstance(turns, list):
        return _text(turns)
    turns = [t for t in turns if isinstance(t, dict)]
    if len(turns) == 1:
        return _text(turns[0].get("text"))
    return _text("\n".join(f"▸ {t.get('role', '?')}\n{t.get('text', '')}" for t in turns))


class _Builder:
    """Turns records into groups and rows, collecting the component names."""

    def __init__(self, prompts: dict[str, str]) -> None:
        self.table = SampleTable()
        self.prompts = prompts
        self._index: dict[str, int] = {}

    def _component(self, name: str) -> int:
        if name not in self._index:
            self._index[name] = len(self.table.components)
            self.table.components.append(name)
        return self._index[name]

    def _row(self, group: int, text: str, verdict: Any, reward: Any, advantage: Any) -> dict[str, Any]:
        verdict = verdict if isinstance(verdict, dict) else None
        comp: dict[int, float | None] = {}
        why: dict[int, str] = {}
        for c in (verdict or {}).get("components") or []:
            if isinstance(c, dict) and isinstance(c.get("name"), str):
                i = self._component(c["name"])
                if i not in comp:
                    comp[i], why[i] = _num(c.get("score")), _text(c.get("reason"))
        return {
            "g": group, "text": text, "verdict": _verdict_class(verdict), "reward": _num(reward),
            "adv": _num(advantage), "comp": comp, "why": why,
            "parsed": _text((verdict or {}).get("parsed")), "reason": _text((verdict or {}).get("reason")),
            "fmt": (verdict or {}).get("format_ok") if isinstance((verdict or {}).get("format_ok"), bool) else None,
            "dec": [],
        }  # fmt: skip

    def add(self, part: int, record: dict[str, Any]) -> None:
        """Add one ``samples.jsonl`` record (either shape; an unknown one becomes a row holding its JSON)."""
        task = _text(record.get("task_id"))
        step = record.get("step") if isinstance(record.get("step"), int) else None
        prompt = record.get("prompt", self.prompts.get(task))
        group = len(self.table.groups)
        self.table.groups.append(
            {"part": part, "step": step, "task": task, "prompt": _text(prompt), "answer": _text(record.get("answer"))}
        )
        trajectories = record.get("trajectories")
        if isinstance(trajectories, list):
            for t in trajectories:
                if isinstance(t, dict):
                    text = _turns_text(t.get("turns"))
                    self.table.rows.append(
                        self._row(group, text, t.get("verdict"), t.get("reward"), t.get("advantage"))
                    )
        elif "completion" in record:
            correct = record.get("correct")
            reward = record.get("reward")
            judged = "correct" in record or "reward" in record
            verdict = {"score": reward, "correct": correct} if judged else None
            row = self._row(group, _text(record["completion"]), verdict, reward, record.get("advantage"))
            row["dec"] = [
                [int(d[0]), _text(d[1]), _num(d[2])]
                for d in record.get("decisions") or []
                if isinstance(d, list) and len(d) == 3 and isinstance(d[0], int)
            ]
            self.table.rows.append(row)
        else:
            rest = {k: v for k, v in record.items() if k not in ("step", "task_id", "prompt", "answer")}
            self.table.rows.append(self._row(group, _text(rest), record.get("verdict"), record.get("reward"), None))


def _count_rows(record: dict[str, Any]) -> int:
    trajectories = record.get("trajectories")
    return sum(isinstance(t, dict) for t in trajectories) if isinstance(trajectories, list) else 1


def _spread(n: int, k: int) -> list[int]:
    """``k`` of ``range(n)``, evenly spaced, the first and the last included."""
    if k >= n:
        return list(range(n))
    if k == 1:
        return [n - 1]
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def _prompt_lookup(parts: list[Part], wanted: set[str]) -> dict[str, str]:
    """Prompts by task id from ReasonMaxxer's stored rollouts (its ``samples.jsonl`` records carry none)."""
    found: dict[str, str] = {}
    for part in parts:
        path = part.folder / "reason_maxxer" / "rollouts.jsonl"
        if not wanted or not path.is_file():
            continue
        for _, _, _, rec in iter_jsonl(path):
            task = rec.get("task_id")
            if isinstance(task, str) and task in wanted and task not in found and "prompt" in rec:
                found[task] = _text(rec["prompt"])
    return found


def load_samples(
    parts: list[Part], max_rows: int = DEFAULT_MAX_ROWS, max_bytes: int = DEFAULT_MAX_BYTES
) -> SampleTable:
    """The samples of ``parts`` as a table of at most ``max_rows`` trajectories and ``max_bytes`` of lines.

    Raises:
        ReportError: A ``samples.jsonl`` line is torn or not a JSON object.
    """
    lines: list[_Line] = []
    for i, part in enumerate(parts):
        if part.samples is not None:
            for _, offset, length, rec in iter_jsonl(part.samples):
                step = rec.get("step") if isinstance(rec.get("step"), int) else None
                lines.append(_Line(i, offset, length, step, _count_rows(rec)))
    n = len(lines)
    total_rows, total_bytes = sum(x.rows for x in lines), sum(x.length for x in lines)
    k = n
    if total_rows > max_rows or total_bytes > max_bytes:
        k = min(n, n * max_rows // max(total_rows, 1), n * max_bytes // max(total_bytes, 1))
        k = max(k, 1 if max_rows > 0 and n else 0)
    chosen = [lines[i] for i in _spread(n, k)] if k else []
    records = []
    for part in sorted({line.part for line in chosen}):  # one open per file, records in the run's order
        with open(str(parts[part].samples), "rb") as f:
            for line in (x for x in chosen if x.part == part):
                f.seek(line.offset)
                records.append((part, json.loads(f.read(line.length).decode("utf-8", errors="replace"))))
    missing = {r.get("task_id") for _, r in records if "prompt" not in r and isinstance(r.get("task_id"), str)}
    builder = _Builder(_prompt_lookup(parts, missing))
    for part, rec in records:
        builder.add(part, rec)
    table = builder.table
    table.logged_rows, table.logged_groups = total_rows, n
    if k < n:
        steps = [x.step for x in lines if x.step is not None]
        span = f" over steps {min(steps)}–{max(steps)}" if steps and len(parts) == 1 else " over the run"
        table.note = (
            f"{len(table.rows)} of {total_rows} logged trajectories are embedded: {k} of the {n} logged groups, "
            f"evenly spread{span} (the first and the last kept), to keep the page a few MB. "
            "`lrmgym report --max-samples N` embeds up to N."
        )
    return table
