"""Prompt and feedback texts of the Game24 env, and strict answer extraction for its two answer formats.

Two styles: ``compact`` prompts are a few characters (``Q:24 from 4 7 8 8. A:``), matching the embedded
character-level tiny model's training format; ``instruct`` prompts state the rules for real LLMs.

Two answer formats, both strict (a missing or repeated answer is a format failure with its own reason, never a
search of the whole text for something that parses):

- ``r1``: ``<think>…</think><answer>…</answer>`` (DeepSeek-R1 style). Exactly one ``<answer>…</answer>`` is
  graded. ``format_ok`` additionally requires one closed ``<think>`` block before it and nothing after it.
- ``plain``: the answer is the last non-empty line, with an optional leading ``Answer:`` (as in the
  Tree-of-Thoughts prompts). Two ``Answer:`` lines, or an ``Answer:`` line followed by more text, is a format
  failure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from lrmgym.envs.game24.solver import format_number

__all__ = ["Extracted", "extract_answer", "feedback_text", "prompt_text"]

Style = Literal["compact", "instruct"]
AnswerFormat = Literal["r1", "plain"]

_ANSWER_LINE = re.compile(r"^[ \t]*answer[ \t]*:", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class Extracted:
    """The result of extracting the answer from a completion.

    Attributes:
        answer: The answer text, or ``None`` when the format was broken.
        reason: Why extraction failed (``"format: no <answer> tag"``); empty on success.
        format_ok: Whether the completion followed the requested template in full.
    """

    answer: str | None
    reason: str = ""
    format_ok: bool = False


def _numbers(numbers: Sequence[int | Fraction]) -> str:
    return " ".join(format_number(n) for n in numbers)


# ------------------------------------------------------------------------------------------------- prompts
_R1_SINGLE = (
    "First think inside <think> </think>, then give only the expression inside <answer> </answer>, for example "
    "<answer>(1 + 2 + 3) * 4</answer>."
)
_PLAIN_SINGLE = "End with one line 'Answer: <expression>', for example 'Answer: (1 + 2 + 3) * 4'."
_R1_STEPS = "First think inside <think> </think>, then give the step inside <answer> </answer>, for example <answer>8 / 3 = 8/3</answer>."
_PLAIN_STEPS = "End with one line 'Answer: <step>', for example 'Answer: 8 / 3 = 8/3'."
_NO_SOLUTION = "If it cannot be done, answer 'no solution'. "


def prompt_text(
    numbers: Sequence[int], mode: str, style: Style, answer_format: AnswerFormat, mention_unsolvable: bool
) -> str:
    """The first prompt of a task."""
    nums = _numbers(numbers)
    if style == "compact":
        return f"Q:24 from {nums}. A:" if mode == "single" else f"Q:24 in steps from {nums}. A:"
    maybe = _NO_SOLUTION if mention_unsolvable else ""
    if mode == "single":
        return (
            f"Use the numbers {nums} and the operations +, -, *, / with parentheses to make 24. Use each number "
            "exactly once; every operator combines two numbers (no unary minus, no other operations, no decimals). "
            f"{maybe}{_R1_SINGLE if answer_format == 'r1' else _PLAIN_SINGLE}"
        )
    return (
        f"Make 24 from the numbers {nums}, one step at a time. Each step combines two of the remaining numbers with "
        "one of +, -, *, / and states the exact result, for example '8 / 3 = 8/3' (write fractions as p/q and put a "
        "fraction that follows an operator in parentheses: '2 / (8/3) = 3/4'). I check each step and reply with the "
        f"numbers left; you win when a single 24 is left. {maybe}Give one step per turn. "
        f"{_R1_STEPS if answer_format == 'r1' else _PLAIN_STEPS}"
    )


def feedback_text(style: Style, legal: bool, reason: str, remaining: Sequence[Fraction], penalty: float) -> str:
    """The env's reply after a step of step mode that did not end the episode."""
    left = _numbers(remaining)
    if style == "compact":
        return f" ok left {left}. A:" if legal else f" bad: {reason}. left {left}. A:"
    if legal:
        return f"Legal step: {reason}. Numbers left: {left}. Next step?"
    cost = f" (penalty {penalty:g})" if penalty else ""
    return f"Illegal step{cost}: {reason}. Numbers left: {left}. Try another step."


# ------------------------------------------------------------------------------------------------ extraction
def extract_answer(text: str, answer_format: AnswerFormat) -> Extracted:
    """Extract the answer strictly; linear in the text's length, never raises for any string."""
    return _extract_r1(text) if answer_format == "r1" else _extract_plain(text)


def _extract_r1(text: str) -> Extracted:
    opens, closes = text.count("<answer>"), text.count("</answer>")
    if opens == 0:
        return Extracted(None, "format: no <answer> tag")
    if opens > 1 or closes > 1:
        return Extracted(None, f"format: {max(opens, closes)} <answer> tags, expected exactly one")
    start = text.index("<answer>") + len("<answer>")
    end = text.find("</answer>")
    if end == -1:
        return Extracted(None, "format: <answer> is not closed")
    if end < start:
        return Extracted(None, "format: </answer> comes before <answer>")
    head, tail = text[: start - len("<answer>")], text[end + len("</answer>") :]
    think_ok = (
        head.count("<think>") == 1
        and head.count("</think>") == 1
        and head.lstrip().startswith("<think>")
        and head.rstrip().endswith("</think>")
    )
    return Extracted(text[start:end].strip(), format_ok=think_ok and not tail.strip())


def _extract_plain(text: str) -> Extracted:
    body = text.rstrip()
    if not body.strip():
        return Extracted(None, "format: empty answer")
    marks = [m.end() for m in _ANSWER_LINE.finditer(body)]
    if len(marks) > 1:
        return Extracted(None, f"format: {len(marks)} 'Answer:' lines, expected exactly one")
    last_line_start = body.rfind("\n") + 1
    if marks:
        if marks[0] < last_line_start:
            return Extracted(None, "format: text after the 'Answer:' line")
        return Extracted(body[marks[0] :].strip(), format_ok=True)
    return Extracted(body[last_line_start:].strip(), format_ok=True)
