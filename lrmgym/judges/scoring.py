"""Score a JSONL file of completions with judges, outside training (the logic of ``lrmgym judge``).

Input: one JSON object per line, either one completion or a whole group::

    {"task_id": "gsm8k/test/3", "prompt": "...", "answer": "42", "completion": "<think>...</think>..."}
    {"task_id": "gsm8k/test/3", "prompt": "...", "answer": "42", "completions": ["...", "..."]}

``prompt`` is required (text or chat messages); ``answer``, ``task_id`` (default: a hash of the prompt),
``metadata`` (a mapping passed to the env's verifier) and, when no env is given, ``score`` / ``correct`` (a
verifiable reward computed elsewhere, which the ``accuracy`` and ``arena`` judges then use) are optional.
Lines with the same ``task_id`` form one group, so group-aware judges (the arena) see them together.

Output: one JSON object per completion, in input order:
``{"line": N, "task_id": ..., "index": i, "verdict": {...}}`` (``index`` is the position in its line's
``completions`` list, 0 for a single ``completion``).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lrmgym.core import Completion, Task, Verdict
from lrmgym.envs._jsonl import iter_jsonl
from lrmgym.files import atomic_write, check_output_file
from lrmgym.judges.base import Judge, check_judges, content_hash, judge_group

__all__ = ["JudgeInputError", "judge_file", "read_records"]


class JudgeInputError(ValueError):
    """The input file is missing or malformed; the message names the line and what was expected."""


def _record_completions(record: dict[str, Any], where: str) -> list[str]:
    if "completions" in record:
        texts = record["completions"]
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise JudgeInputError(f"{where}: 'completions' must be a non-empty list of strings.")
        return texts
    text = record.get("completion")
    if not isinstance(text, str):
        raise JudgeInputError(
            f"{where}: expected a 'completion' string or a 'completions' list, got keys {sorted(record)}."
        )
    return [text]


def _record_task(record: dict[str, Any], where: str) -> Task:
    prompt = record.get("prompt")
    if not isinstance(prompt, (str, list)):
        raise JudgeInputError(f"{where}: 'prompt' must be a string or a list of chat messages.")
    metadata = record.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise JudgeInputError(f"{where}: 'metadata' must be a JSON object.")
    answer = record.get("answer")
    if answer is not None and (isinstance(answer, bool) or not isinstance(answer, (str, int, float))):
        raise JudgeInputError(f"{where}: 'answer' must be text or a number (or left out), got {type(answer).__name__}.")
    task_id = record.get("task_id", record.get("id"))
    if task_id is None:
        task_id = "prompt/" + content_hash(prompt)[:12]
    return Task(id=str(task_id), prompt=prompt, answer=answer, metadata=metadata)


def read_records(path: Path) -> list[tuple[int, Task, list[str], dict[str, Any]]]:
    """Parse the input: ``(line number, task, completion texts, record)`` per non-blank line.

    The file is read by :func:`lrmgym.envs._jsonl.iter_jsonl`: UTF-8 JSON lines, at most 1 MiB a line and 1 GiB
    a file; every problem is one :class:`JudgeInputError` naming the file, the line (1-based) and the fix.
    """
    path = Path(path)
    if not path.exists():
        raise JudgeInputError(f"--input: {str(path)!r} not found; expected a JSONL file of completions.")
    out = []
    for number, record in iter_jsonl(path, JudgeInputError):
        where = f"{path}:{number}"
        out.append((number, _record_task(record, where), _record_completions(record, where), record))
    return out


class _RecordedEnv:
    """Stand-in env when none is given: the verifiable reward is the record's ``score`` field, if any."""

    def __init__(self, scores: dict[tuple[str, int], Verdict]) -> None:
        self.scores = scores

    def score_group(self, task: Task, completions: Sequence[Completion]) -> list[Verdict]:
        return [self.scores[(task.id, k)] for k in range(len(completions))]


def _recorded_verdict(record: dict[str, Any]) -> Verdict:
    score = record.get("score")
    if isinstance(score, (int, float)) and not isinstance(score, bool) and math.isfinite(score):
        correct = record.get("correct")
        return Verdict(score=float(score), correct=correct if isinstance(correct, bool) else None, reason="from input")
    return Verdict.ungradeable("no verifier: pass env=... or give each record a numeric 'score'")


def judge_file(
    input_path: str | os.PathLike,
    output_path: str | os.PathLike,
    judge: Judge | Sequence[Judge],
    env: Any | None = None,
) -> dict[str, Any]:
    """Score every completion of ``input_path`` and write one verdict per line to ``output_path``.

    Args:
        input_path: The JSONL of completions (format in the module docstring).
        output_path: Where to write the verdicts (written to a temporary file, then moved into place); refused
            (:class:`~lrmgym.files.OutputPathError`) if it is the input, a device or a directory.
        judge: One judge or a list, composed by weighted sum as in :class:`~lrmgym.judges.base.JudgedEnv`.
        env: The env whose verifier grades the completions first (``None``: use the records' ``score``).

    Returns:
        Counts (records, groups, completions, gradeable, ungradeable), the mean score of the gradeable ones,
        each judge's counters, and the arena's metrics when an arena judge is present.
    """
    out_path = check_output_file(output_path, inputs=[input_path], what="output")  # not the input, not a device
    records = read_records(Path(input_path))
    judges = check_judges(judge)
    groups: dict[str, list[tuple[int, int, str]]] = {}  # task id -> (record #, index in record, text)
    tasks: dict[str, Task] = {}
    recorded: dict[tuple[str, int], Verdict] = {}
    for r, (_, task, texts, record) in enumerate(records):
        tasks.setdefault(task.id, task)
        members = groups.setdefault(task.id, [])
        for i, text in enumerate(texts):
            recorded[(task.id, len(members))] = _recorded_verdict(record)
            members.append((r, i, text))

    base_env = env if env is not None else _RecordedEnv(recorded)
    verdicts: dict[tuple[int, int], Verdict] = {}
    for task_id, members in groups.items():
        task = tasks[task_id]
        try:
            completions = [Completion(text) for _, _, text in members]
            judged = judge_group(judges, task, completions, base_env.score_group(task, completions))
        except Exception as err:  # noqa: BLE001 - an env bug must not lose the rest of the file
            judged = [Verdict.ungradeable(f"scoring failed: {type(err).__name__}: {err}"[:300])] * len(members)
        for (r, i, _), verdict in zip(members, judged, strict=True):
            verdicts[(r, i)] = verdict

    scores: list[float] = []
    ungradeable = 0

    def write(fh: Any) -> None:
        nonlocal ungradeable
        for r, (number, task, texts, _) in enumerate(records):
            for i in range(len(texts)):
                verdict = verdicts[(r, i)]
                if verdict.score is None:
                    ungradeable += 1
                else:
                    scores.append(verdict.score)
                row = {"line": number, "task_id": task.id, "index": i, "verdict": verdict.to_dict()}
                fh.write((json.dumps(row, ensure_ascii=False, default=str) + "\n").encode("utf-8", "surrogatepass"))

    atomic_write(out_path, write)  # a unique temporary sibling, renamed into place: never half a file
    stats: dict[str, Any] = {
        "records": len(records),
        "groups": len(groups),
        "completions": len(scores) + ungradeable,
        "gradeable": len(scores),
        "ungradeable": ungradeable,
        "mean_score": sum(scores) / len(scores) if scores else None,
        "judges": {j.name: j.stats() for j in judges},
    }
    for j in judges:
        if callable(getattr(j, "pop_metrics", None)):
            stats.setdefault("arena", {})[j.name] = j.pop_metrics()
    return stats
