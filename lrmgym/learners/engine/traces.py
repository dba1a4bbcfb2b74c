"""Judged rollouts as data: one graded rollout per JSONL line.

The format ``lrmgym export traces`` writes and ``learner=reason_maxxer`` trains on (its own sampled rollouts are
stored the same way).

A line is a :class:`JudgedRollout`::

    {"task_id": str, "prompt": str | [chat messages], "completion": str, "prompt_token_ids": [int] | null,
     "token_ids": [int] | null, "reward": float | null, "correct": bool | null, "strength": float | null,
     "finish_reason": "stop" | "length" | null, "step": int | null, "verdict": {...} | null}

:func:`read_rollouts` reads a file with a size bound per line and per file (:mod:`lrmgym.envs._jsonl`) and names
the file and line of anything wrong; :func:`write_rollouts` writes atomically.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from lrmgym.core import Prompt
from lrmgym.files import atomic_write_text

__all__ = ["TRACE_FIELDS", "JudgedRollout", "read_rollouts", "write_rollouts"]


@dataclass(frozen=True)
class JudgedRollout:
    """One graded rollout: a line of ``rollouts.jsonl`` and of an exported traces file (``rollouts_from``).

    Attributes:
        task_id: The problem it answers; rollouts are grouped into problems by it.
        prompt: The prompt, text or chat messages.
        completion: The completion's text.
        prompt_token_ids: The prompt's token ids as sampled; ``None``: encoded with the policy's tokenizer.
        token_ids: The completion's token ids as sampled (what is trained on), EOS included when sampled;
            ``None``: the text encoded with the policy's tokenizer, plus EOS unless ``finish_reason`` is length.
        reward: The env's (and judges') score; ``None``: ungradeable, left out.
        correct: Whether the answer is right (the pass rate counts it); ``None``: unknown.
        strength: The Bradley-Terry strength an arena judge gave it; ``None`` when none.
        finish_reason: ``"stop"`` or ``"length"`` (a truncation); ``None``: unknown (not a truncation).
        step: The training step that sampled it, when it comes from a run's log (``lrmgym export traces``).
        verdict: Its verdict as the run logged it (kept for provenance; not read).
    """

    task_id: str
    prompt: Prompt
    completion: str
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    reward: float | None = None
    correct: bool | None = None
    strength: float | None = None
    finish_reason: Literal["stop", "length"] | None = None
    step: int | None = None
    verdict: dict[str, Any] | None = None

    def to_json(self) -> str:
        """One JSON line (no newline)."""
        return json.dumps(dataclasses.asdict(self), ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JudgedRollout:
        """Validate one parsed line; raises ``ValueError`` saying what is wrong."""
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in ("task_id", "prompt", "completion") if n not in data]
        extra = sorted(set(data) - set(names))
        if missing or extra:
            raise ValueError(f"missing keys {missing}, unknown keys {extra}; the keys are {', '.join(names)}")
        if not isinstance(data["task_id"], str) or not data["task_id"]:
            raise ValueError(f"task_id must be a non-empty string, got {data['task_id']!r:.40}")
        if not isinstance(data["completion"], str):
            raise ValueError(f"completion must be a string, got {type(data['completion']).__name__}")
        prompt = data["prompt"]
        chat = isinstance(prompt, list) and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt
        )
        if not isinstance(prompt, str) and not (chat and prompt):
            raise ValueError("prompt must be a string or a list of chat messages {role: str, content: str}")
        for name in ("prompt_token_ids", "token_ids"):
            ids = data.get(name)
            if ids is not None and not (isinstance(ids, list) and ids and all(_is_int(t) and t >= 0 for t in ids)):
                raise ValueError(f"{name} must be null or a non-empty list of token ids (integers >= 0)")
        for name in ("reward", "strength"):
            value = data.get(name)
            if value is not None and not (_is_number(value) and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number or null, got {value!r:.40}")
        if data.get("correct") not in (None, True, False):
            raise ValueError(f"correct must be true, false or null, got {data['correct']!r:.40}")
        if data.get("finish_reason") not in (None, "stop", "length"):
            raise ValueError(f"finish_reason must be 'stop', 'length' or null, got {data['finish_reason']!r:.40}")
        if data.get("step") is not None and not _is_int(data["step"]):
            raise ValueError(f"step must be an integer or null, got {data['step']!r:.40}")
        if data.get("verdict") is not None and not isinstance(data["verdict"], dict):
            raise ValueError(f"verdict must be an object or null, got {type(data['verdict']).__name__}")
        return cls(**data)

    def signal(self, advantage: str) -> float | None:
        """The value advantages are computed from: ``reward`` or ``strength``."""
        return self.reward if advantage == "reward" else self.strength


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def write_rollouts(path: str | Path, rollouts: Sequence[JudgedRollout]) -> None:
    """Write ``rollouts`` as JSONL, atomically (a crash leaves the old file or the new one)."""
    atomic_write_text(path, "".join(r.to_json() + "\n" for r in rollouts))


def read_rollouts(path: str | Path, vocab_size: int | None = None) -> list[JudgedRollout]:
    """The judged rollouts of a JSONL file (blank lines skipped), read with bounded memory.

    Raises:
        ValueError: The file or a line is not valid (the message names the file, the line and the fix), or a
            token id is not below ``vocab_size``.
    """
    from lrmgym.envs._jsonl import iter_jsonl

    out = []
    for line, data in iter_jsonl(Path(path), ValueError):
        try:
            item = JudgedRollout.from_dict(data)
            for name in ("prompt_token_ids", "token_ids"):
                ids = getattr(item, name)
                if vocab_size is not None and ids is not None and max(ids) >= vocab_size:
                    raise ValueError(f"{name} holds id {max(ids)}, not below the policy's vocabulary ({vocab_size})")
        except ValueError as err:
            raise ValueError(
                f"{path}:{line}: not a judged rollout: {err}. Fix this line, or export the file again with "
                "`lrmgym export traces`."
            ) from None
        out.append(item)
    return out


TRACE_FIELDS = tuple(f.name for f in dataclasses.fields(JudgedRollout))
"""The keys of a judged rollout line, in the order they are written."""
