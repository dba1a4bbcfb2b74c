"""Strict code extraction: which block counts, and what is rejected before anything runs."""

from __future__ import annotations

import re

import pytest

from lrmgym.envs.code.extract import extract_code


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("Here:\n```python\nx = 1\n```\n", "x = 1\n"),
        ("```py\nx = 1\n```", "x = 1\n"),
        ("```Python3\nx = 1\n```", "x = 1\n"),
        ("draft\n```python\nx = 1\n```\nfinal\n```python\nx = 2\n```\nthanks", "x = 2\n"),
        ("```text\nnot code\n```\n```python\nx = 3\n```", "x = 3\n"),
        ("```python\r\nx = 4\r\n```", "x = 4\r\n"),
    ],
)
def test_fenced_takes_the_last_closed_python_block(text, code):
    assert extract_code(text, "fenced").code == code


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("x = 1", "format: no closed ```python code block"),
        ("```\nx = 1\n```", "format: no closed ```python code block"),
        ("```js\nx = 1\n```", "format: no closed ```python code block"),
        ("```python\nx = 1\n", "format: no closed ```python code block"),
        ("inline ```python x = 1 ```", "format: no closed ```python code block"),
        ("```python\n   \n```", "format: the code is empty"),
    ],
)
def test_fenced_rejects_other_formats(text, reason):
    out = extract_code(text, "fenced")
    assert (out.ok, out.code, out.reason) == (False, None, reason)


def test_whole_answer_uses_everything_or_one_enclosing_fence():
    assert extract_code("def f():\n    return 1\n", "whole").code == "def f():\n    return 1\n"
    assert extract_code("```python\ndef f(): pass\n```\n", "whole").code == "def f(): pass\n"
    assert extract_code("```\ndef f(): pass\n```", "whole").code == "def f(): pass\n"
    mixed = "text\n```python\nx = 1\n```"
    assert extract_code(mixed, "whole").code == mixed


@pytest.mark.parametrize("fmt", ["fenced", "whole"])
def test_hostile_text_is_rejected_before_running(fmt):
    wrap = (lambda s: f"```python\n{s}\n```") if fmt == "fenced" else (lambda s: s)
    assert extract_code(wrap("x = '\x00'"), fmt).reason == "rejected: the code contains a NUL byte"
    assert extract_code(wrap("x = '\ud800'"), fmt).reason == (
        "rejected: the code contains a lone surrogate (not valid UTF-8)"
    )
    big = "x = 1\n" * 20_000
    assert extract_code(wrap(big), fmt, max_chars=100_000).reason == (
        f"rejected: the code has {len(big) + (1 if fmt == 'fenced' else 0)} characters, more than the 100000 allowed"
    )


def test_megabyte_completion_without_fence_is_fast():
    import time

    text = "```python" + "a" * (1 << 20)
    start = time.perf_counter()
    assert not extract_code(text, "fenced").ok
    assert time.perf_counter() - start < 1.0


def test_unknown_format_is_a_clear_error():
    msg = "Unknown answer_format 'xml'; expected 'fenced' or 'whole'."
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        extract_code("x", "xml")  # type: ignore[arg-type]
