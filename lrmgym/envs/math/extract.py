r"""Take the final answer out of a completion, from exactly the format the prompt asked for.

Strict by default: a missing answer, a doubled answer (two ``\boxed{}``, two ``<answer>`` blocks, two
``Answer:`` lines) or text after the answer is a format failure with its own reason. A hedging completion
(``\boxed{2} or \boxed{3}``) therefore earns nothing, and a completion without the requested format is
not searched for something that looks like a number (the leniency that paid reward without the format in
peers, see ../shared/specs/peers.md §4 #8).

All scans are linear (``str.find``/``str.count`` and one brace walk bounded by ``max_answer_chars``), so a
multi-megabyte completion costs milliseconds.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["TEMPLATES", "Extraction", "Template", "braced", "extract_answer"]

Template = Literal["plain", "boxed", "r1"]
TEMPLATES: tuple[str, ...] = ("plain", "boxed", "r1")

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_LINE_RE = re.compile(
    r"^[ \t*_#>]*(?:final\s+)?answer[*_]*\s*:[*_]*[ \t]*(.*?)[ \t*_]*$", re.IGNORECASE | re.MULTILINE
)


@dataclass(frozen=True)
class Extraction:
    """The result of extracting an answer.

    Attributes:
        answer: The answer text, stripped, or ``None`` on a format failure.
        reason: ``""`` when the format was followed, else ``"format: ..."`` naming what was wrong.
    """

    answer: str | None
    reason: str = ""

    @property
    def ok(self) -> bool:
        """Whether the completion followed the requested format."""
        return self.answer is not None


def _fail(reason: str) -> Extraction:
    return Extraction(None, f"format: {reason}")


def braced(text: str, open_index: int, limit: int) -> str | None:
    """The content of the brace group whose ``{`` is at ``open_index``; ``None`` if unclosed within ``limit``."""
    depth = 0
    end = min(len(text), open_index + limit + 2)
    for i in range(open_index, end):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[open_index + 1 : i]
    return None


def _clean(answer: str) -> str:
    r"""Strip whitespace, surrounding ``$``/``\(...\)`` delimiters, one enclosing ``\boxed{}`` and a final period."""
    answer = answer.strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(answer) >= len(left) + len(right) and answer.startswith(left) and answer.endswith(right):
            answer = answer[len(left) : len(answer) - len(right)].strip()
            break
    box = _BOX_RE.match(answer)
    if box:
        inner = braced(answer, box.end() - 1, len(answer))
        if inner is not None and answer[box.end() + len(inner) + 1 :].strip() == "":
            answer = inner.strip()
    if answer.endswith(".") and not answer.endswith(".."):
        answer = answer[:-1].rstrip()
    return answer


def _extract_boxed(text: str, strict: bool, limit: int, clean: Callable[[str], str]) -> Extraction:
    boxes = list(_BOX_RE.finditer(text))
    if not boxes:
        return _fail("no \\boxed{} answer")
    if strict and len(boxes) > 1:
        return _fail(f"{len(boxes)} \\boxed{{}} answers, expected exactly one")
    box = boxes[-1]
    inner = braced(text, box.end() - 1, limit)
    if inner is None:
        return _fail(f"\\boxed{{ is not closed within {limit} characters")
    return Extraction(clean(inner))


def _extract_r1(text: str, strict: bool, clean: Callable[[str], str]) -> Extraction:
    opens, closes = text.count("<answer>"), text.count("</answer>")
    if opens == 0:
        return _fail("no <answer> tag")
    if strict and (opens > 1 or closes > 1):
        return _fail(f"{max(opens, closes)} <answer> tags, expected exactly one")
    start = text.rfind("<answer>")
    end = text.find("</answer>", start)
    if end < 0:
        return _fail("<answer> is not closed by </answer>")
    if strict:
        head = text[:start]
        if head.count("<think>") != 1 or head.count("</think>") != 1:
            return _fail("expected exactly one <think>...</think> block before <answer>")
        if head.lstrip()[: len("<think>")] != "<think>" or head.rstrip()[-len("</think>") :] != "</think>":
            return _fail("text outside <think>...</think> before <answer>")
        if text[end + len("</answer>") :].strip():
            return _fail("text after </answer>")
    answer = clean(text[start + len("<answer>") : end])
    return Extraction(answer) if answer else _fail("empty <answer>")


def _extract_plain(text: str, strict: bool, clean: Callable[[str], str]) -> Extraction:
    matches = list(_ANSWER_LINE_RE.finditer(text))
    if not matches:
        return _fail("no 'Answer:' line")
    if strict and len(matches) > 1:
        return _fail(f"{len(matches)} 'Answer:' lines, expected exactly one")
    last = matches[-1]
    if strict and text[last.end() :].strip():
        return _fail("text after the 'Answer:' line")
    answer = clean(last.group(1))
    return Extraction(answer) if answer else _fail("empty 'Answer:' line")


def extract_answer(
    text: str, template: Template, *, strict: bool = True, max_answer_chars: int = 1000, raw: bool = False
) -> Extraction:
    r"""Extract the final answer of ``text`` in the format of ``template``.

    Args:
        text: The completion.
        template: ``"r1"`` (``<think>...</think><answer>...</answer>``), ``"boxed"`` (one ``\boxed{...}``)
            or ``"plain"`` (a last line ``Answer: ...``).
        strict: Require exactly one answer in exactly the format (default). When ``False`` the last answer
            in the format is taken and surrounding text is ignored.
        max_answer_chars: How far a ``\boxed{`` is scanned for its closing brace.
        raw: Return the answer as written, only stripped of surrounding whitespace: no ``$``/``\(...\)``
            delimiters, enclosing box or final period removed (for answers that are sentences or grids).

    Returns:
        An :class:`Extraction`; on a format failure ``answer`` is ``None`` and ``reason`` says why.
    """
    if not isinstance(text, str):
        return _fail(f"completion is a {type(text).__name__}, not text")
    clean = str.strip if raw else _clean
    if template == "boxed":
        return _extract_boxed(text, strict, max_answer_chars, clean)
    if template == "r1":
        return _extract_r1(text, strict, clean)
    if template == "plain":
        return _extract_plain(text, strict, clean)
    raise ValueError(f"Unknown answer template {template!r}; expected one of {', '.join(TEMPLATES)}.")
