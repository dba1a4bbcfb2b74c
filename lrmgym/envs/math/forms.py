r"""Answer forms: what shape of answer a task asks for, and a string check that an answer has it.

A verifier that only compares values pays the question back to the policy: ``11 \times 9 - 52`` *equals*
47, ``\sqrt{242}`` equals ``11\sqrt{2}`` and the unfactored polynomial equals its factorisation. So every
math task declares the form its answer must take (the generator declares it; for a data set it is
inferred from the question's wording and the gold by :func:`infer_form`), and :func:`form_reason` refuses
an answer that is not in it:

========== ====================================================================================================
form       what the answer must be
========== ====================================================================================================
number     one plain number: an integer, a decimal, or a fraction in lowest terms (``a/b``, ``\frac{a}{b}``);
           units, ``\$``, degrees and a label (``x =``) around it are allowed, operators are not. In a
           true chain (``11 \times 9 - 52 = 47``) the last side is the answer.
fraction   a number as above that is not a decimal: the question asks for a common fraction / lowest terms.
percent    a number, where the question asks for a percentage: ``%`` marks the number of percent (the
           verifier reads ``50\%`` as 50 here, and as 1/2 for every other form).
radical    a simplified radical: every radicand is an integer without a square (cube...) factor, no root in
           a denominator, no fractional exponent, numeric fractions in lowest terms.
factored   a product: nothing is added or subtracted outside brackets.
expression anything (the data set's gold is an expression, a tuple, an interval, text...).
========== ====================================================================================================

Every form also refuses an answer that restates an expression of the question (a ``$...$`` block, or the
arithmetic of a generated question), unless the gold itself appears there, and one that still applies an
operation the question asks to carry out and the gold does not use (``\arcsin``, ``\binom``, ``\log``,
``\sum``, ``!``...). The checks are linear-time
string work on the extracted answer (already bounded in length by the verifier's pre-filter); nothing is
parsed as maths. Hand-written: no library declares or checks the form a question asks for.
"""

from __future__ import annotations

import re
from math import gcd

__all__ = ["FORMS", "form_reason", "infer_form", "number_text", "question_expressions", "strip_percent"]

FORMS: tuple[str, ...] = ("number", "fraction", "percent", "radical", "factored", "expression")
"""The declared answer forms, strictest first (see the module docstring)."""

# ---- wording of the question
_FRACTION_WORDS_RE = re.compile(
    r"common fraction|lowest terms|simplest fraction|fraction in simplest form|reduced fraction|improper fraction",
    re.IGNORECASE,
)
_PERCENT_WORDS_RE = re.compile(r"\bper\s?cent(?:age)?s?\b", re.IGNORECASE)
_RADICAL_WORDS_RE = re.compile(r"radical form|\bsimplify\b|\bsimplified\b", re.IGNORECASE)
_FACTOR_WORDS_RE = re.compile(
    r"(?:^|[.?!]\s+)factor\b(?!ial)|\bfactor (?:completely|fully|the (?:expression|polynomial|following))"
    r"|\bcompletely factor\b|\bfactori[sz]e\b",
    re.IGNORECASE,
)
_SENTENCE_RE = re.compile(r"(?<=[.?!])\s+")
_INSTRUCTION_RE = re.compile(r"^(?:express|give|write|answer|round|enter|state)\b", re.IGNORECASE)
_PERCENT_GOLD_RE = re.compile(r"(?:\\%|%|\\text\{\s*\\?%\s*\})\s*$")

# ---- pieces of an answer
_PERCENT_TAIL_RE = re.compile(
    r"(?:\\[,;: !]|\s|~)*(?:\\%|%|\\(?:text|mbox|mathrm|textrm)\s*\{\s*(?:\\?%|per\s?cent)\s*\}|per\s?cent)\s*$",
    re.IGNORECASE,
)
# Units and labels around a number: \text{ cm}^2, \mbox{dollars}, ^\circ, \$, trailing words.
_UNIT_GROUP_RE = re.compile(r"\\(?:text|mbox|mathrm|textrm|textnormal|operatorname)\s*\{[A-Za-z .]*\}(?:\^\{?[23]\}?)?")
_DEGREE_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|\\degree|°")
# Unit words after a number (``47 apples``): a space, then a word of two letters or more, so that ``2k`` and
# ``-2x`` stay expressions.
_TRAILING_WORDS_RE = re.compile(r"(?<=[\d}])\s+[A-Za-z]{2,}[A-Za-z .]*$")
_SPACING_RE = re.compile(r"\\[,;:! ]|\\left(?![A-Za-z])|\\right(?![A-Za-z])|\\displaystyle|\s+")
_FRACTION_RE = re.compile(
    r"\\[dt]?frac\s*\{\s*([+-]?\d+)\s*\}\s*\{\s*(\d+)\s*\}|\\[dt]?frac(\d)(\d)|(?<![\d.])(\d+)/(\d+)"
)
_ROOT_RE = re.compile(r"\\sqrt\s*(?:\[\s*([^\]]*)\]\s*)?(?:\{|(\d))")
_FRACTIONAL_EXPONENT_RE = re.compile(r"\^\s*\{?\s*(?:\d+\s*/\s*\d+|\\[dt]?frac|0?\.\d)")
_BLOCK_RE = re.compile(r"\$\$(.+?)\$\$|(?<!\\)\$(.+?)(?<!\\)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
_PROCEDURAL_EXPR_RE = re.compile(r"(?:Compute|Solve for x:|What is)\s+(.+?)(?:\s+as a fraction in lowest terms)?[.?]$")
_PLAIN_TOKEN_RE = re.compile(r"[A-Za-z0-9.,]*")
_APPROX_RE = re.compile(r"\\(?:approx|simeq|thickapprox|approxeq|doteq)(?![A-Za-z])|\u2248")
_DOUBLE_SIGN_RE = re.compile(r"^\s*([+-])\s*([+-])")
# Operations a question asks to carry out; an answer that still applies one the gold does not use has not
# evaluated it (``\arcsin(-\frac12)`` for ``-\frac{\pi}{6}``, ``\binom{31}{28}`` for 4495).
_OPERATION_RE = re.compile(
    r"\\(?:(?:sin|cos|tan|cot|sec|csc)h?|arc(?:sin|cos|tan|cot|sec|csc)|log|ln|lg|exp|[dt]?binom|choose|sum"
    r"|prod|int|iint|oint|lim|lfloor|lceil|det|gcd|lcm|max|min|operatorname|mathop)(?![A-Za-z])|(?<=[\w)}])!"
)


def _flat(text: str) -> str:
    r"""``text`` without spacing, ``\left``/``\right``, a final period and math delimiters; ``\dfrac`` as ``\frac``."""
    text = _SPACING_RE.sub("", text.replace("\\$", "")).strip("$").rstrip(".")
    for long, short in (("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\dbinom", "\\binom"), ("\\tbinom", "\\binom")):
        text = text.replace(long, short)
    return text.replace("×", "\\times").replace("÷", "\\div").replace("\\cdot", "\\times").replace("*", "\\times")


def _unwrapped(text: str) -> str:
    """``text`` without brackets that enclose all of it: ``((x+1))`` -> ``x+1``."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    while len(text) >= 2 and text[0] in pairs and text[-1] == pairs[text[0]]:
        depth = 0
        for i, ch in enumerate(text):
            depth += (ch in "([{") - (ch in ")]}")
            if depth == 0 and i < len(text) - 1:
                return text
        text = text[1:-1]
    return text


def _top_level_split(text: str, sep: str) -> list[str]:
    """``text`` split at every ``sep`` outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch in "([{") - (ch in ")]}")
        if ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _last_side(answer: str) -> str:
    r"""The value an answer ends on: the last side of ``x = ... = v`` (relations such as ``\le`` are kept)."""
    sides = _top_level_split(answer, "=")
    if len(sides) > 1 and not any(side.rstrip().endswith(("<", ">", "!", "\\")) for side in sides[:-1]):
        return sides[-1].strip()
    return answer.strip()


def strip_percent(text: str) -> tuple[str, bool]:
    r"""``(text without a final percent sign, whether it had one)``: ``50\%``, ``50%``, ``50 \text{ percent}``."""
    match = _PERCENT_TAIL_RE.search(text)
    if match is None or not text[: match.start()].strip():
        return text, False
    return text[: match.start()].rstrip(), True


def number_text(answer: str) -> str:
    r"""The number an answer states, with what may surround a number taken away.

    That is its last side (``\approx`` counts as ``=``), without units, degrees, a percent sign,
    ``\displaystyle``, a final period or a doubled sign (``- -3``). The number form checks that this is a
    plain number, and the verifier applies its rounding rule to it, so that no wrapper
    (``0.0000667 \text{ m}``, ``x \approx 0.0000667``) skips the rule.
    """
    text = answer.replace("\\$", "").replace("$", "").replace("\\displaystyle", " ")
    text = _APPROX_RE.sub("=", text.replace("\\lbrace", "{").replace("\\rbrace", "}"))
    text = _DEGREE_RE.sub("", _UNIT_GROUP_RE.sub("", _last_side(text)))
    text = _TRAILING_WORDS_RE.sub("", strip_percent(text)[0]).strip().rstrip(".").strip()
    return _DOUBLE_SIGN_RE.sub(lambda m: "" if m.group(1) == m.group(2) else "-", text)


def _plain_number(text: str) -> tuple[bool, bool]:
    """``(is a plain number, is written as a decimal)``, by the verifier's own reader."""
    from lrmgym.envs.math.verify import numeric_value  # verify imports this module

    found = numeric_value(text)
    return (found is not None, bool(found and found[1]))


def _unreduced(text: str) -> str | None:
    r"""The first numeric fraction in ``text`` not in lowest terms (``4/6``, ``\frac{8}{4}``), or ``None``."""
    for match in _FRACTION_RE.finditer(_flat(text)):
        groups = [g for g in match.groups() if g is not None]
        num, den = abs(int(groups[0])), int(groups[1])
        if den == 0 or den == 1 or gcd(num, den) != 1:
            return match.group()
    return None


def _number_reason(answer: str, form: str) -> str | None:
    text = number_text(answer)
    is_number, is_decimal = _plain_number(text)
    if not is_number:
        return f"the task asks for a number, and {text[:40]!r} is not a plain number"
    if (bad := _unreduced(text)) is not None:
        return f"the task asks for a number in lowest terms, and {bad[:40]!r} is not"
    if form == "fraction" and is_decimal:
        return "the task asks for a fraction (or an integer), not a decimal"
    return None


def _power_free(n: int, k: int) -> bool:
    """Whether no ``d**k`` with ``d > 1`` divides ``n`` (checked up to the k-th root of ``n``)."""
    if n < 2:
        return False
    d = 2
    while d**k <= n:
        if n % d**k == 0:
            return False
        d += 1
    return True


def _radical_reason(answer: str) -> str | None:
    text = _flat(_last_side(answer))
    if _FRACTIONAL_EXPONENT_RE.search(text):
        return "the task asks for a simplified radical, not a fractional power"
    if (bad := _unreduced(text)) is not None:
        return f"the task asks for a simplified radical, and {bad[:40]!r} is not in lowest terms"
    for match in _ROOT_RE.finditer(text):
        index = (match.group(1) or "2").strip()
        radicand = match.group(2)
        if radicand is None:
            end = _closing(text, match.end() - 1)
            radicand = text[match.end() : end] if end is not None else ""
        if not radicand.isdigit() or not index.isdigit() or len(radicand) > 8 or len(index) > 2:
            return f"the task asks for a simplified radical, and \\sqrt{{{radicand[:30]}}} has no integer radicand"
        if not _power_free(int(radicand), int(index)):
            return f"the task asks for a simplified radical, and \\sqrt{{{radicand}}} is not simplified"
    for match in re.finditer(r"\\frac\s*\{", text):
        num_end = _closing(text, match.end() - 1)
        if num_end is not None and num_end + 1 < len(text) and text[num_end + 1] == "{":
            den_end = _closing(text, num_end + 1)
            if den_end is not None and "\\sqrt" in text[num_end + 1 : den_end]:
                return "the task asks for a simplified radical, and a root is left in a denominator"
    if re.search(r"/\s*\\sqrt", text):
        return "the task asks for a simplified radical, and a root is left in a denominator"
    return None


def _closing(text: str, open_index: int) -> int | None:
    """The index of the brace that closes the one at ``open_index``; ``None`` if unclosed."""
    depth = 0
    for i in range(open_index, len(text)):
        depth += (text[i] == "{") - (text[i] == "}")
        if depth == 0:
            return i
    return None


def _factored_reason(answer: str, question: str) -> str | None:
    text = _unwrapped(_flat(_last_side(answer)).lstrip("+-"))
    for sep in "+-":
        if len(_top_level_split(text, sep)) > 1:
            return "the task asks for a factored form, and the answer is a sum"
    # a trivial product around the expression to factor: 1\cdot(x^2-16), (x^2-16)^1
    copies = {_unwrapped(_flat(e)) for e in question_expressions(question)}
    depth, start = 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
            start = i + 1 if depth == 1 else start
        elif ch in ")]}":
            depth -= 1
            if depth == 0 and _unwrapped(text[start:i]) in copies:
                return "the task asks for a factored form, and the answer keeps the question's expression as a factor"
    return None


def question_expressions(question: str) -> list[str]:
    r"""The expressions a question states, which an answer may not restate.

    Its ``$...$``/``\(...\)``/``\[...\]`` blocks and their sides, or the arithmetic of a generated question
    (``Compute 11 × 9 - 52.`` -> ``11 × 9 - 52``). Only expressions with an operator or a command count: a
    bare name or number (``$x$``, ``$12$``) is not a copy of anything.
    """
    found: list[str] = []
    blocks = [next(g for g in m.groups() if g is not None) for m in _BLOCK_RE.finditer(question)]
    if not blocks and (match := _PROCEDURAL_EXPR_RE.search(question.strip())):
        blocks = [match.group(1)]
    for block in blocks:
        block = block.strip().rstrip(".,;:")
        for part in [block, *(_top_level_split(block, "=") if "=" in block else [])]:
            part = part.strip().rstrip(".,;:")
            if part and not _PLAIN_TOKEN_RE.fullmatch(_flat(part)) and part not in found:
                found.append(part)
    return found


def _operations(text: str) -> set[str]:
    return {m.group().replace("dbinom", "binom").replace("tbinom", "binom") for m in _OPERATION_RE.finditer(text)}


def _operation_reason(answer: str, question: str, gold: str) -> str | None:
    asked = _operations(question)
    if not asked:
        return None
    done = _operations(gold)
    for match in _OPERATION_RE.finditer(answer):
        name = match.group().replace("dbinom", "binom").replace("tbinom", "binom")
        if name in asked and name not in done:
            return f"the answer leaves the question's operation ({match.group()}) unevaluated"
    return None


def _copy_reason(answer: str, question: str, gold: str) -> str | None:
    copies = {_unwrapped(_flat(e)) for e in question_expressions(question)}
    if not copies or _unwrapped(_flat(gold)) in copies:
        return None
    for candidate in (answer, _last_side(answer)):
        if _unwrapped(_flat(candidate)) in copies:
            return "the answer restates an expression of the question"
    return None


def form_reason(answer: str, form: str, question: str = "", gold: str = "") -> str | None:
    """Why ``answer`` is not in the declared ``form`` (or restates the question); ``None`` when it is fine.

    Args:
        answer: The extracted answer (one math block or box already reduced to its content).
        form: One of :data:`FORMS`.
        question: The task's question, for the copy check.
        gold: The gold answer: an expression that also appears in the question may be copied.

    Raises:
        ValueError: ``form`` is not one of :data:`FORMS`.
    """
    if form not in FORMS:
        raise ValueError(f"unknown answer form {form!r}; expected one of {', '.join(FORMS)}")
    reason = (_copy_reason(answer, question, gold) or _operation_reason(answer, question, gold)) if question else None
    if reason is None and form in ("number", "fraction", "percent"):
        reason = _number_reason(answer, form)
    elif reason is None and form == "radical":
        reason = _radical_reason(answer)
    elif reason is None and form == "factored":
        reason = _factored_reason(answer, question)
    return reason


def _asks(question: str) -> str:
    """The sentences of a question that ask for the answer.

    Those with a ``?`` (else the last one), and instructions such as "Express your answer as ...".
    """
    sentences = [s for s in _SENTENCE_RE.split(question.strip()) if s]
    asking = [s for s in sentences if "?" in s] or sentences[-1:]
    return " ".join(asking + [s for s in sentences if _INSTRUCTION_RE.match(s) and s not in asking])


def infer_form(question: str, gold: str) -> str:
    """The form a data-set question asks for, from its wording and its gold; always a form the gold is in.

    ``percent`` when the gold has a percent sign, or the sentence that asks (the one with the ``?``, or an
    "Express your answer as ..." instruction) speaks of a percent(age) and the gold is a number;
    ``fraction`` for "common fraction" / "lowest terms" wording with a non-decimal gold; ``number`` for any
    other plain-number gold; ``factored`` for "factor ..." questions and ``radical`` for "simplify"
    / "simplest radical form" with a root in the gold; else ``expression``.
    """
    gold = str(gold).strip()
    if not question.strip() or not gold:
        return "expression"
    candidates: list[str] = []
    number_gold = _plain_number(number_text(gold))[0]
    if _PERCENT_GOLD_RE.search(gold) or (number_gold and _PERCENT_WORDS_RE.search(_asks(question))):
        candidates.append("percent")
    if number_gold and _FRACTION_WORDS_RE.search(question):
        candidates.append("fraction")
    if number_gold:
        candidates.append("number")
    if _FACTOR_WORDS_RE.search(question):
        candidates.append("factored")
    if "\\sqrt" in gold and _RADICAL_WORDS_RE.search(question):
        candidates.append("radical")
    for form in candidates:
        if form_reason(gold, form, question, gold) is None:
            return form
    return "expression"
