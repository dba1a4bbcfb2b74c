r"""Other surface forms of a gold answer: ``0.5`` for ``\frac12``, ``1,000`` for ``1000``, sympy's own LaTeX.

Used to check that the verifier accepts a correct answer however it is written (self-verification of the
GSM8K and MATH-500 golds) and to build perturbed (prediction, gold) pairs for the verifier benchmark.
Only run on trusted gold answers: the sympy round trip here is not bounded.
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["rewrite_answer", "wrong_answer"]

_INT_RE = re.compile(r"([+-]?)(\d{1,3}(?:,\d{3})+|\d+)")
_DEC_RE = re.compile(r"([+-]?)(\d*)\.(\d+)")
_FRAC_RE = re.compile(r"([+-]?)\\[dt]?frac(?:\{(\d+)\}\{(\d+)\}|\s*(\d)\s*(\d)|\s*(\d)\{(\d+)\})")
_SLASH_RE = re.compile(r"([+-]?)(\d+)/(\d+)")
_STANDALONE_INT_RE = re.compile(r"(?<![\w^_{}/.\\])(\d+)(?![\w}{/.^])")
_MIXED_RE = re.compile(r"(\d+)\s*\\[dt]?frac\{(\d+)\}\{(\d+)\}")
_BASE_RE = re.compile(r"\s*(\d+)\s*_\s*(?:\{\s*(\d+)\s*\}|(\d))\s*")


def _squash(text: str) -> str:
    return re.sub(r"\\[!,;]|\s+", "", text)


def _terminating(value: Fraction) -> bool:
    den = value.denominator
    for p in (2, 5):
        while den % p == 0:
            den //= p
    return den == 1


def _decimal(value: Fraction) -> str:
    """A terminating fraction as a decimal string, exactly (``Fraction(1, 8)`` -> ``0.125``)."""
    sign = "-" if value < 0 else ""
    value = abs(value)
    places = 0
    while (value * 10**places).denominator != 1:
        places += 1
    digits = str((value * 10**places).numerator).rjust(places + 1, "0")
    return sign + (digits[:-places] + "." + digits[-places:] if places else digits)


def _numeric_rewrite(text: str) -> str | None:
    squashed = _squash(text)
    if m := _INT_RE.fullmatch(squashed):
        sign, digits = m.groups()
        n = int(digits.replace(",", ""))
        if "," in digits:
            return f"{sign}{n}"
        return f"{sign}{n:,}" if n >= 1000 else f"{sign}{n}.0"
    if m := _DEC_RE.fullmatch(squashed):
        value = Fraction(squashed)
        return f"{'-' if value < 0 else ''}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"
    if m := _MIXED_RE.fullmatch(squashed):
        whole, num, den = (int(g) for g in m.groups())
        value = whole + Fraction(num, den)
        return f"\\frac{{{value.numerator}}}{{{value.denominator}}}"
    m = _FRAC_RE.fullmatch(squashed) or _SLASH_RE.fullmatch(squashed)
    if m:
        sign, *parts = m.groups()
        num, den = [int(p) for p in parts if p is not None]
        if den == 0:
            return None
        value = Fraction(num, den) * (-1 if sign == "-" else 1)
        if _terminating(value):
            return _decimal(value)
        if "/" in squashed and "\\" not in squashed:
            return f"{sign}\\frac{{{num}}}{{{den}}}"
        return f"{sign}{num}/{den}"
    return None


def _sympy_rewrite(text: str) -> str | None:
    """The LaTeX printing by sympy of the parsed gold, when it parses to a plain expression."""
    try:
        import sympy
        from latex2sympy2_extended import latex2sympy

        expr = latex2sympy(text)
        if not isinstance(expr, sympy.Expr) or isinstance(expr, sympy.Symbol):
            return None
        printed = sympy.latex(expr)
        if _squash(printed) == _squash(text):
            # Same print: write it as twice itself over two, which the verifier has to simplify.
            doubled = sympy.latex(sympy.expand(2 * expr))
            printed = f"\\frac{{{doubled}}}{{2}}"
    except Exception:  # noqa: BLE001 - anything latex2sympy cannot read keeps its cosmetic rewrite
        return None
    return printed


def _cosmetic_rewrite(text: str) -> str:
    r"""Same maths, different spelling.

    A bare word for ``\text{word}``, ``\dfrac``/``\frac`` swapped, ``\left``/``\right`` added, spaces after
    commas and around ``=`` and ``+``.
    """
    if m := re.fullmatch(r"\\text\{\s*\(?([A-Za-z]+)\)?\s*\}", text.strip()):
        return m.group(1)
    out = _STANDALONE_INT_RE.sub(r"\1.0", text)  # (6,31,-1) -> (6.0,31.0,-1.0): the values must be compared
    out = out.replace("\\dfrac", "\\tfrac") if "\\dfrac" in out else out.replace("\\frac", "\\dfrac")
    out = re.sub(r"\\sqrt(\d)", r"\\sqrt{\1}", out)
    if "[" not in out and "]" not in out and "\\left" not in out:  # \left( needs its \right)
        out = re.sub(r"\(", r"\\left(", out)
        out = re.sub(r"\)", r"\\right)", out)
    out = re.sub(r"\s*([=+])\s*", r" \1 ", out)
    out = re.sub(r",\s*", ", ", out)
    return out if out != text else f"{text}\\,"


def rewrite_answer(gold: str) -> str:
    r"""A different spelling of ``gold`` with the same value.

    Plain numbers change notation (``1000`` <-> ``1,000``, ``5`` -> ``5.0``, ``\frac12`` -> ``0.5``,
    ``.35625`` -> ``\frac{57}{160}``, ``1\frac45`` -> ``\frac{9}{5}``), base numerals keep their base
    (``52_8`` -> ``52_{8}``); other expressions are reprinted by sympy (``3\sqrt{13}`` -> ``3 \sqrt{13}``),
    and what sympy cannot reprint gets a cosmetic respelling.
    """
    if m := _BASE_RE.fullmatch(gold):  # 52_8 -> 52_{8}, 4210_{5} -> (4210)_{5}: the base must stay
        digits, braced, bare = m.groups()
        return f"{digits}_{{{bare}}}" if bare else f"({digits})_{{{braced}}}"
    if "\\text" in gold or "\\mbox" in gold:  # units and words: sympy would turn them into variables
        return _numeric_rewrite(gold) or _cosmetic_rewrite(gold.replace("\\mbox", "\\text"))
    return _numeric_rewrite(gold) or _sympy_rewrite(gold) or _cosmetic_rewrite(gold)


def wrong_answer(gold: str, k: int = 1) -> str | None:
    """A plausible wrong answer near ``gold`` (off by ``k`` for numbers, a changed digit otherwise)."""
    squashed = _squash(gold)
    if m := _INT_RE.fullmatch(squashed):
        return str(int(squashed.replace(",", "")) + k)
    m = _FRAC_RE.fullmatch(squashed)
    if m:
        sign, *parts = m.groups()
        num, den = [int(p) for p in parts if p is not None]
        return f"{sign}\\frac{{{num + k}}}{{{den}}}"
    digits = [i for i, ch in enumerate(gold) if ch.isdigit()]
    if not digits:
        return None
    i = digits[-1]
    return gold[:i] + str((int(gold[i]) + k) % 10) + gold[i + 1 :]
