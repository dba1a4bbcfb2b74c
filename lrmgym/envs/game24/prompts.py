r"""Prompt and feedback texts of the Game24 env.

Two styles, as in the math env (:mod:`lrmgym.envs.math.templates`): ``compact`` prompts are a few characters
(``Q:24 from 4 7 8 8. A:``), the format of the embedded character-level tiny model, so a model trained on
``env=math`` meets the same shape here (the out-of-distribution probe); ``instruct`` prompts state the rules and
the answer template for real LLMs.

The answer templates and their strict extraction are the math env's (:func:`lrmgym.envs.math.extract.extract_answer`),
deliberately shared so that a format learnt on math means the same here: ``r1``
(``<think>…</think><answer>…</answer>``), ``boxed`` (one ``\boxed{…}``) and ``plain`` (a last line ``Answer: …``).
A missing or doubled answer, or text after it, is a format failure with its own reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Literal

from lrmgym.envs.game24.solver import format_number

__all__ = ["feedback_text", "prompt_text"]

Style = Literal["compact", "instruct"]
Template = Literal["r1", "boxed", "plain"]


def _numbers(numbers: Sequence[int | Fraction]) -> str:
    return " ".join(format_number(n) for n in numbers)


# ------------------------------------------------------------------------------------------------- prompts
_INSTRUCTIONS = {
    "r1": (
        "First think inside <think> </think>, then give only the {what} inside <answer> </answer>, exactly once, "
        "for example <think> reasoning </think><answer>{example}</answer>. Write nothing after </answer>."
    ),
    "boxed": (
        "Put the {what}, and only it, inside \\boxed{{}} exactly once, at the end, for example \\boxed{{{example}}}."
    ),
    "plain": "End with one line 'Answer: <{what}>', for example 'Answer: {example}', and write nothing after it.",
}
_NO_SOLUTION = "If it cannot be done, answer 'no solution'. "


def prompt_text(numbers: Sequence[int], mode: str, style: Style, template: Template, mention_unsolvable: bool) -> str:
    """The first prompt of a task."""
    nums = _numbers(numbers)
    if style == "compact":
        return f"Q:24 from {nums}. A:" if mode == "single" else f"Q:24 in steps from {nums}. A:"
    maybe = _NO_SOLUTION if mention_unsolvable else ""
    if mode == "single":
        return (
            f"Use the numbers {nums} and the operations +, -, *, / with parentheses to make 24. Use each number "
            "exactly once; every operator combines two numbers (no unary minus, no other operations, no decimals). "
            f"{maybe}{_INSTRUCTIONS[template].format(what='expression', example='(1 + 2 + 3) * 4')}"
        )
    return (
        f"Make 24 from the numbers {nums}, one step per turn. A step combines two of the numbers left with one of "
        "+, -, *, / and states the exact result, for example '8 / 3 = 8/3' (write fractions as p/q and put a fraction "
        "that follows an operator in parentheses: '2 / (8/3) = 3/4'). Each turn, write all your steps so far, "
        "separated by ';', with one new step at the end; I check them from the start and reply with the numbers "
        f"left. You win when a single 24 is left; you may revise earlier steps. {maybe}"
        f"{_INSTRUCTIONS[template].format(what='steps', example='8 / 3 = 8/3; 3 - (8/3) = 1/3')}"
    )


def feedback_text(style: Style, outcome: str, reason: str, numbers_left: Sequence[Fraction], penalty: float) -> str:
    """The env's reply to a steps-mode answer that did not end the episode.

    Args:
        style: ``compact`` or ``instruct``.
        outcome: ``progress``, ``illegal`` or ``dead_end`` (see :class:`lrmgym.envs.game24.env.Replay`).
        reason: The replay's reason (``"legal: 8 / 3 = 8/3"``, ``"step 2: 9 is not one of ..."``).
        numbers_left: The numbers after the answer's legal steps.
        penalty: The step penalty, named in the reply to an illegal step when non-zero.
    """
    left = _numbers(numbers_left)
    if style == "compact":
        return f" ok left {left}. A:" if outcome == "progress" else f" bad: {reason}. left {left}. A:"
    if outcome == "progress":
        steps = reason.removeprefix("legal: ")
        return f"Correct so far: {steps}. Numbers left: {left}. Reply with all your steps so far plus the next one."
    if outcome == "dead_end":
        return f"Dead end: {reason.removeprefix('dead end: ')}. Reply with a new sequence of steps from the start."
    cost = f" (penalty {penalty:g})" if penalty else ""
    return (
        f"Illegal step{cost}: {reason}. Numbers left after your legal steps: {left}. "
        "Reply with your steps from the start, corrected."
    )
