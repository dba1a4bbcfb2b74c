"""What ``lrmgym judge`` says about completions: the reference that every plug-in, adapter and server must match.

:func:`judge_rows` writes ``lrmgym judge``'s input file from task rows and runs
:func:`lrmgym.judges.scoring.judge_file` on it, with the line limit raised to fit the rows (hostile completions
can be megabytes), so tests and benchmarks compare against the real command's logic, not a re-implementation.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lrmgym.core import Task
from lrmgym.judges.scoring import judge_file

__all__ = ["judge_rows", "task_row"]


def task_row(task: Task, completion: str) -> dict[str, Any]:
    """One input line of ``lrmgym judge`` for ``completion`` on ``task``."""
    return {"task_id": task.id, "prompt": task.prompt, "answer": task.answer, "metadata": dict(task.metadata),
            "completion": completion}  # fmt: skip


def judge_rows(rows: Sequence[dict[str, Any]], judges: Sequence[Any], env: Any, folder: Path) -> list[dict]:
    """``lrmgym judge``'s verdict dict for each row (lines of one ``task_id`` form its group), in order.

    ``env`` is closed afterwards; the input and output files are left in ``folder``.
    """
    source = Path(folder) / f"judge-input-{time.monotonic_ns()}.jsonl"
    lines = [json.dumps(r, default=list) for r in rows]
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8", errors="surrogatepass")
    out = source.with_suffix(".verdicts.jsonl")
    before = os.environ.get("LRMGYM_MAX_LINE_BYTES")
    os.environ["LRMGYM_MAX_LINE_BYTES"] = str(max([1 << 20, *(len(line.encode()) + 1 for line in lines)]))
    try:
        judge_file(source, out, list(judges), env=env)
    finally:
        env.close()
        if before is None:
            os.environ.pop("LRMGYM_MAX_LINE_BYTES", None)
        else:
            os.environ["LRMGYM_MAX_LINE_BYTES"] = before
    return [json.loads(line)["verdict"] for line in out.read_text(encoding="utf-8").splitlines()]
