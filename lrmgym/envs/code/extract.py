"""Strict extraction of the program from a completion.

Two formats, chosen by the env's ``answer_format`` option:

- ``"fenced"``: the code is the **last** fenced block tagged ``python`` (or ``py`` / ``python3``) whose
  closing fence is present. Untagged or other-language blocks do not count, and an unclosed block (a
  completion cut off by the token budget) does not count: the format was not followed.
- ``"whole"``: the whole completion is the program. If the completion is exactly one fenced block (tagged
  python or untagged) and nothing else, its content is used.

Both reject code that cannot be run safely as text: NUL bytes, lone surrogates (not encodable as UTF-8),
and more than ``max_chars`` characters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["AnswerFormat", "Extraction", "extract_code"]

AnswerFormat = Literal["fenced", "whole"]

# A fence line: ``` then an optional language tag, alone on its line; the closing fence is ``` alone.
_FENCED = re.compile(r"^```[ \t]*(python3?|py)[ \t]*\r?\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL | re.IGNORECASE)
_SINGLE = re.compile(r"\A\s*```[ \t]*(python3?|py)?[ \t]*\r?\n(.*?)^```[ \t]*\s*\Z", re.MULTILINE | re.DOTALL | re.I)


@dataclass(frozen=True)
class Extraction:
    """The outcome of extraction.

    Attributes:
        code: The program, or ``None`` when the completion does not follow the format.
        reason: Why extraction failed (empty when it succeeded).
    """

    code: str | None
    reason: str = ""

    @property
    def ok(self) -> bool:
        """Whether a program was extracted."""
        return self.code is not None


def extract_code(text: str, answer_format: AnswerFormat = "fenced", max_chars: int = 100_000) -> Extraction:
    """Extract the program from ``text`` in the given format; see the module docstring for the rules."""
    if answer_format == "fenced":
        blocks = _FENCED.findall(text)
        if not blocks:
            return Extraction(None, "format: no closed ```python code block")
        code = blocks[-1][1]
    elif answer_format == "whole":
        single = _SINGLE.match(text)
        code = single.group(2) if single else text
    else:
        raise ValueError(f"Unknown answer_format {answer_format!r}; expected 'fenced' or 'whole'.")
    if not code.strip():
        return Extraction(None, "format: the code is empty")
    if len(code) > max_chars:
        return Extraction(None, f"rejected: the code has {len(code)} characters, more than the {max_chars} allowed")
    if "\x00" in code:
        return Extraction(None, "rejected: the code contains a NUL byte")
    try:
        code.encode("utf-8")
    except UnicodeEncodeError:
        return Extraction(None, "rejected: the code contains a lone surrogate (not valid UTF-8)")
    return Extraction(code)
