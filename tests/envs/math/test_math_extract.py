"""Prompt templates, worked solutions and strict answer extraction."""

from __future__ import annotations

import re
import time

import pytest

from lrmgym.core import Task
from lrmgym.envs.math.extract import extract_answer
from lrmgym.envs.math.templates import INSTRUCTIONS, render_prompt, render_solution, solution_for


def _reason(text: str, template: str, **kw) -> str:
    result = extract_answer(text, template, **kw)
    assert result.answer is None and not result.ok
    return result.reason


# ------------------------------------------------------------------------------------------------ templates
def test_compact_prompt_is_the_tiny_model_shape():
    assert render_prompt("Compute 93+13+41.", template="r1", style="compact", chat=False) == "Q:Compute 93+13+41. A:"
    assert render_prompt("x-50=42. x=?", template="boxed", style="compact", chat=True) == [
        {"role": "user", "content": "Q:x-50=42. x=? A:"}
    ]


@pytest.mark.parametrize("template", ["plain", "boxed", "r1"])
def test_instruct_prompt_states_the_format(template):
    prompt = render_prompt("What is 2+2?", template=template, style="instruct", chat=False)
    assert prompt == f"What is 2+2?\n\n{INSTRUCTIONS[template]}"
    marker = {"plain": "'Answer: <answer>'", "boxed": "\\boxed{}", "r1": "<answer> </answer>"}[template]
    assert marker in prompt


def test_render_solution_in_each_template():
    steps = ["93+13=106", "106+41=147"]
    assert render_solution(steps, "147", "r1") == "<think>93+13=106;106+41=147</think><answer>147</answer>"
    assert render_solution(steps, "147", "boxed") == "93+13=106;106+41=147 \\boxed{147}"
    assert render_solution(steps, "147", "plain") == "93+13=106;106+41=147\nAnswer: 147"
    for template in ("r1", "boxed", "plain"):
        assert extract_answer(render_solution(steps, "147", template), template).answer == "147"


def test_solution_for_needs_steps():
    task = Task(id="gsm8k/test/0", prompt="q", answer="3")
    msg = "Task 'gsm8k/test/0' has no worked steps (metadata['steps']); only procedural math tasks carry them."
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        solution_for(task, "r1")
    assert (
        solution_for(Task(id="t", prompt="q", answer="3", metadata={"steps": ("1+2=3",)}), "boxed")
        == "1+2=3 \\boxed{3}"
    )


def test_unknown_template_and_style_are_clear_errors():
    with pytest.raises(
        ValueError,
        match=f"^{re.escape('Unknown answer template ' + repr('latex') + '; expected one of plain, boxed, r1.')}$",
    ):
        render_prompt("q", template="latex", style="compact", chat=False)
    with pytest.raises(
        ValueError,
        match=f"^{re.escape('Unknown prompt style ' + repr('fancy') + '; expected one of compact, instruct.')}$",
    ):
        render_prompt("q", template="r1", style="fancy", chat=False)


# ------------------------------------------------------------------------------------------------ r1
def test_r1_accepts_the_exact_format():
    assert extract_answer("<think>2+2=4</think><answer>4</answer>", "r1").answer == "4"
    assert extract_answer("  <think>a</think>\n<answer> $\\frac{1}{2}$ </answer>\n", "r1").answer == "\\frac{1}{2}"
    assert extract_answer("<think>a</think><answer>\\boxed{7}</answer>", "r1").answer == "7"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("The answer is 4.", "format: no <answer> tag"),
        ("<think>a</think><answer>3</answer><answer>4</answer>", "format: 2 <answer> tags, expected exactly one"),
        ("<think>a</think><answer>4", "format: <answer> is not closed by </answer>"),
        ("<answer>4</answer>", "format: expected exactly one <think>...</think> block before <answer>"),
        ("Sure! <think>a</think><answer>4</answer>", "format: text outside <think>...</think> before <answer>"),
        ("<think>a</think><answer>4</answer> or 5", "format: text after </answer>"),
        ("<think>a</think><answer>  </answer>", "format: empty <answer>"),
    ],
)
def test_r1_format_failures_have_their_own_reason(text, reason):
    assert _reason(text, "r1") == reason


def test_r1_lenient_takes_the_last_answer():
    assert extract_answer("<answer>3</answer> no wait <answer>4</answer> done", "r1", strict=False).answer == "4"


# ------------------------------------------------------------------------------------------------ boxed
def test_boxed_takes_the_one_box_with_nested_braces():
    assert extract_answer("so $\\boxed{\\frac{1}{2}}$.", "boxed").answer == "\\frac{1}{2}"
    assert extract_answer("\\fbox{ 12 }", "boxed").answer == "12"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("The answer is 7", "format: no \\boxed{} answer"),
        ("Either $\\boxed{2}$ or $\\boxed{3}$", "format: 2 \\boxed{} answers, expected exactly one"),
        ("\\boxed{7} and again \\boxed{7}", "format: 2 \\boxed{} answers, expected exactly one"),
        ("\\boxed{" + "1" * 50, "format: \\boxed{ is not closed within 20 characters"),
    ],
)
def test_boxed_format_failures(text, reason):
    assert _reason(text, "boxed", max_answer_chars=20) == reason


def test_boxed_flood_and_huge_response_are_fast():
    start = time.perf_counter()
    assert _reason("\\boxed{" * 50_000, "boxed") == "format: 50000 \\boxed{} answers, expected exactly one"
    assert extract_answer("blah " * 1_000_000 + "\\boxed{7}", "boxed").answer == "7"
    assert time.perf_counter() - start < 1.0


# ------------------------------------------------------------------------------------------------ plain
def test_plain_takes_the_last_answer_line():
    assert extract_answer("2+2=4\nAnswer: 4", "plain").answer == "4"
    assert extract_answer("work\n**Final answer:** 1,000.\n", "plain").answer == "1,000"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("it is 4", "format: no 'Answer:' line"),
        ("Answer: 3\nAnswer: 4", "format: 2 'Answer:' lines, expected exactly one"),
        ("Answer: 4\nbut maybe 5", "format: text after the 'Answer:' line"),
        ("Answer:   ", "format: empty 'Answer:' line"),
    ],
)
def test_plain_format_failures(text, reason):
    assert _reason(text, "plain") == reason


def test_non_text_completion_is_a_format_failure():
    assert _reason(None, "r1") == "format: completion is a NoneType, not text"  # type: ignore[arg-type]


def test_unknown_template_in_extraction():
    with pytest.raises(
        ValueError,
        match=f"^{re.escape('Unknown answer template ' + repr('xml') + '; expected one of plain, boxed, r1.')}$",
    ):
        extract_answer("x", "xml")  # type: ignore[arg-type]
