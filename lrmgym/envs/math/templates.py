r"""Prompts that state the answer format, and worked solutions written in that format.

Two prompt styles:

- ``compact``: ``Q:<question> A:`` with no instruction. Meant for the tiny character-level default model,
  which learns the format from supervised examples (short sequences are its main speed lever).
- ``instruct``: the question followed by an instruction that names the required answer format exactly,
  for real instruction-tuned models.

Three answer templates (see :mod:`lrmgym.envs.math.extract` for how each is read back):
``plain`` (last line ``Answer: X``), ``boxed`` (one ``\boxed{X}``) and ``r1``
(``<think>...</think><answer>X</answer>``, the DeepSeek-R1-Zero format, https://arxiv.org/abs/2501.12948).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from lrmgym.core import Prompt, Task

__all__ = ["INSTRUCTIONS", "STYLES", "Style", "render_prompt", "render_solution", "solution_for"]

Style = Literal["compact", "instruct"]
STYLES: tuple[str, ...] = ("compact", "instruct")

INSTRUCTIONS: dict[str, str] = {
    "plain": (
        "Solve the problem step by step. End your response with a final line of the form "
        "'Answer: <answer>' containing only the final answer, and write nothing after it."
    ),
    "boxed": (
        "Solve the problem step by step. Put the final answer, and only the final answer, inside "
        "\\boxed{} exactly once, at the end of your response."
    ),
    "r1": (
        "First reason about the problem inside <think> </think> tags, then give only the final answer inside "
        "<answer> </answer> tags, exactly once, for example: <think> reasoning </think><answer> 42 </answer>. "
        "Write nothing after </answer>."
    ),
}
"""The instruction appended to the question in the ``instruct`` style, per template."""


def render_prompt(question: str, *, template: str, style: str, chat: bool) -> Prompt:
    """The prompt for ``question``: raw text, or a single user message when ``chat`` is true.

    Args:
        question: The problem statement (for procedural problems in the style's own wording).
        template: The answer template the prompt asks for (``plain``, ``boxed``, ``r1``).
        style: ``compact`` (``Q:... A:``) or ``instruct`` (question plus format instruction).
        chat: Return ``[{"role": "user", "content": ...}]`` instead of a string.
    """
    if template not in INSTRUCTIONS:
        raise ValueError(f"Unknown answer template {template!r}; expected one of {', '.join(INSTRUCTIONS)}.")
    if style == "compact":
        text = f"Q:{question} A:"
    elif style == "instruct":
        text = f"{question}\n\n{INSTRUCTIONS[template]}"
    else:
        raise ValueError(f"Unknown prompt style {style!r}; expected one of {', '.join(STYLES)}.")
    return [{"role": "user", "content": text}] if chat else text


def render_solution(steps: Sequence[str], answer: str, template: str) -> str:
    r"""A worked solution in the answer format of ``template``: the steps joined by ``;``, then the answer.

    Examples:
        ``render_solution(["93+13=106", "106+41=147"], "147", "r1")`` gives
        ``<think>93+13=106;106+41=147</think><answer>147</answer>``; with ``"boxed"`` it gives
        ``93+13=106;106+41=147 \boxed{147}`` and with ``"plain"`` ``93+13=106;106+41=147\nAnswer: 147``.
    """
    work = ";".join(steps)
    if template == "r1":
        return f"<think>{work}</think><answer>{answer}</answer>"
    if template == "boxed":
        return f"{work} \\boxed{{{answer}}}" if work else f"\\boxed{{{answer}}}"
    if template == "plain":
        return f"{work}\nAnswer: {answer}" if work else f"Answer: {answer}"
    raise ValueError(f"Unknown answer template {template!r}; expected one of {', '.join(INSTRUCTIONS)}.")


def solution_for(task: Task, template: str) -> str:
    """The worked solution of a procedural task in any template (from ``metadata["steps"]``).

    Raises:
        ValueError: The task carries no worked steps (dataset tasks have none).
    """
    steps = task.metadata.get("steps")
    if steps is None:
        raise ValueError(
            f"Task {task.id!r} has no worked steps (metadata['steps']); only procedural math tasks carry them."
        )
    return render_solution(steps, str(task.answer), template)
