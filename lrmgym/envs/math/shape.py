r"""String-level checks that an extracted answer states exactly one value, run in the trusted parent.

math-verify grades the *last* value it can find: when LaTeX parsing of an answer fails it falls back to
the last number in the text, so ``3 \to 4``, ``3 \\ 4``, ``\cancel{3} 4`` or ``4. Actually no: 3``
are read as their last number, and ``3 \quad 4`` or ``\phantom{3}4`` are read as 7. A policy trained on
that reward learns to hedge. These checks reject, in microseconds and without parsing any maths, the
shapes that carry more than one value or a hidden one:

- more than one ``\boxed{}``;
- line breaks (``\\``, ``\newline``, ``\cr``) outside a matrix, and environments other than matrices
  (``cases``, ``aligned``...);
- steps and alternatives: arrows, implications, ``\therefore``, ``\lor``/``\vee``, ``\mid``;
- hidden or struck-out content: ``\phantom``, ``\cancel``, ``\sout``, ``\not``, ``\tag``, colours;
- two numbers side by side with only spacing between them (``3 \quad 4``), thousands groups excepted.

Each rule is waived when the gold answer itself uses the construct (a gold written as a mapping may use
``\mapsto``). False equations (``3 = 4``) need maths and are checked in the verifier's worker.

:func:`base_numeral` reads ``52_8``-style answers, whose subscript math-verify drops (it accepts ``52`` and
``204_5`` for ``52_8``/``204_8``); :func:`value_part` strips an ``x =`` label so that plain numbers behind
one still take the exact fast path. Hand-written: no library grades the *shape* of a LaTeX answer.
"""

from __future__ import annotations

import re

__all__ = ["base_numeral", "hedge_reason", "sole_block", "value_part"]

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_BEGIN_RE = re.compile(r"\\begin\s*\{\s*([A-Za-z*]+)\s*\}")
# Environments whose rows are one value (a matrix or vector); math-verify parses them as matrices.
_MATRIX_ENVS = frozenset({"matrix", "pmatrix", "bmatrix", "Bmatrix", "vmatrix", "Vmatrix", "smallmatrix", "array"})
_LINE_BREAKS = frozenset({"\\\\", "\\newline", "\\cr", "\\par", "\\linebreak"})
# A step or an alternative between two statements: ``a \to b`` means "a, then b", never one value.
_STEPS = frozenset(
    {
        "\\to", "\\rightarrow", "\\Rightarrow", "\\longrightarrow", "\\Longrightarrow", "\\implies",
        "\\impliedby", "\\iff", "\\Leftrightarrow", "\\leftrightarrow", "\\Longleftrightarrow",
        "\\longleftrightarrow", "\\leftarrow", "\\Leftarrow", "\\longleftarrow", "\\Longleftarrow",
        "\\gets", "\\mapsto", "\\longmapsto", "\\leadsto", "\\rightsquigarrow", "\\hookrightarrow",
        "\\therefore", "\\because", "\\lor", "\\vee", "\\land", "\\wedge", "\\mid", "\\models", "\\vdash",
    }
)  # fmt: skip
_STEP_CHARS = frozenset("→⇒⟹⟶⇔↔⟺←⇐↦∴∵∨∧")
_ASCII_STEPS = ("->", "=>")  # not "<-" (x<-1) nor "|-" (|-3|)
# Content that is drawn invisibly, struck out, or outside the formula: the reader sees one value and
# math-verify another (``\phantom{3}4`` is 7 to it; ``\cancel{3} 4`` is 4).
_HIDDEN = frozenset(
    {
        "\\phantom", "\\hphantom", "\\vphantom", "\\smash", "\\llap", "\\rlap", "\\clap", "\\mathllap",
        "\\mathrlap", "\\mathclap", "\\cancel", "\\bcancel", "\\xcancel", "\\cancelto", "\\sout", "\\st",
        "\\xout", "\\not", "\\tag", "\\label", "\\color", "\\textcolor", "\\colorbox", "\\fcolorbox",
        "\\pagecolor", "\\hidden", "\\iffalse",
    }
)  # fmt: skip
_TOKEN_RE = re.compile(r"\\(?:[A-Za-z]+|.)|\s+|.", re.DOTALL)
# Spacing that separates two numerals without an operator. ``\!`` (negative space) is the one spacing
# MATH uses inside numbers (``10,\!080``); it only appears after a comma there, so it counts as a gap.
_SPACING_RE = re.compile(
    r"\\(?:[,;:! ]|quad|qquad|enspace|enskip|thinspace|medspace|thickspace|negthinspace|negmedspace"
    r"|negthickspace|space|nobreakspace)(?![A-Za-z])|\\(?:hspace|hskip|kern|mkern|mskip)\*?\s*\{[^{}]*\}|~"
    r"|\\(?:text|mbox|textrm|mathrm|hbox)\s*\{\s*\}|\{\s*\}"
)
_NUMERAL_RUN_RE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:\s+\d+(?:\.\d+)?)+(?![\w.])")
_THOUSANDS_RUN_RE = re.compile(r"\d{1,3}(?: \d{3})+(?:\.\d+)?")
_ARG_COMMAND_RE = re.compile(r"\\(?:[dt]?frac|cfrac|binom|[dt]binom|sqrt|overset|underset|stackrel)\s*$")
_BASE_RE = re.compile(r"\(?\s*([0-9A-Za-z]+)\s*\)?\s*_\s*(?:\{\s*(?:\\(?:text|mathrm)\s*\{\s*)?(\d+)\s*\}?\s*\}|(\d))")
_LABEL_RE = re.compile(r"\s*[A-DF-HJ-Za-df-hj-z](?:_\{?[A-Za-z0-9]+\}?)?\s*=(?![=<>])\s*(.+)", re.DOTALL)
_DELIMS_RE = re.compile(r"\\[,;:! ]|\\left|\\right|\$")


_BLOCK_RES = (  # outermost first: a $...$ block may hold the \boxed{}
    re.compile(r"(?<![\\$])\$\$?(?!\$)"),
    re.compile(r"(?<!\\)\\[(\[]"),
    re.compile(r"\\(?:boxed|fbox)\s*\{"),
)
_CLOSERS = {"$": "$", "$$": "$$", "\\(": "\\)", "\\[": "\\]"}
# Words that change what the one value in a sentence means: "not $4$", "either $4$ or ...", "one less
# than $4$", "$4$ hundred", "the negative of $4$". A sentence with any of them (or any digit) around its
# one math block is not reduced to the block.
_MODIFIER_WORDS = frozenset(
    """
    not no nor or isn isnt aren arent wrong incorrect false never except but instead rather actually wait
    either maybe perhaps possibly probably unless without almost nearly approximately approx about around
    roughly circa guess unsure if else otherwise alternatively correction corrected sorry oops
    one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen
    seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred hundreds
    thousand thousands million millions billion billions trillion dozen dozens half halves third thirds
    quarter quarters twice double triple thrice percent percentage pct
    plus minus times less more fewer greater smaller larger than over under above below add added adding
    subtract subtracted divided multiplied squared cubed square cube root roots power powers exponent
    negative positive inverse reciprocal opposite factorial log logarithm sqrt exceeds exceed off
    """.split()
)
_PROSE_RE = re.compile(r"[A-Za-z\s,.:;!?'\"()\-]*")


def _block_at(text: str, start: int, opener: str) -> tuple[int, int, int] | None:
    """``(content_start, content_end, block_end)`` of the math block or box opening at ``start``."""
    if opener.endswith("{"):
        depth = 0
        for i in range(start + len(opener) - 1, len(text)):
            depth += (text[i] == "{") - (text[i] == "}")
            if depth == 0:
                return start + len(opener), i, i + 1
        return None
    closer = _CLOSERS[opener]
    end = text.find(closer, start + len(opener))
    return None if end < 0 else (start + len(opener), end, end + len(closer))


def sole_block(answer: str) -> str:
    r"""The content of the answer's only math block or ``\boxed{}`` when the rest is plain prose; else ``answer``.

    ``So the final answer is $\boxed{0.5}$.`` is ``0.5`` and ``$3$ cm`` is ``3``. Text with maths or a digit
    in it (``\boxed{3} = 4``), a second block, or a word that changes the value (``not $4$``, ``$4$ minus
    one``, ``either $4$ or``) keeps the whole answer, which must then parse as one formula.
    """
    for block_re in _BLOCK_RES:
        matches = list(block_re.finditer(answer))
        if not matches:
            continue
        span = _block_at(answer, matches[0].start(), matches[0].group())
        if span is None:
            return answer
        content_start, content_end, block_end = span
        rest = answer[: matches[0].start()] + " " + answer[block_end:]
        if not _PROSE_RE.fullmatch(rest) or _MODIFIER_WORDS.intersection(re.findall(r"[a-z]+", rest.lower())):
            return answer
        inner = answer[content_start:content_end].strip()
        return sole_block(inner) if inner and len(inner) < len(answer) else answer
    return answer


def _several_values(gold: str) -> bool:
    r"""Whether the gold lists several values, so that an answer may box each of them.

    ``1,-2``, ``\{1,2\}``, ``3 \pm 1``, ``6 \text{ and } 8`` and tuples do; a number or an expression does not.
    """
    if any(marker in gold for marker in ("\\{", "\\pm", "\\mp", "\\boxed", ";")) or re.search(r"\b(?:and|or)\b", gold):
        return True
    # any comma that is not a thousands separator (``1,-2``, ``{1,2,3}``; a tuple counts too)
    return any(not re.match(r"\\?!?\s*\d{3}(?!\d)", gold[i + 1 :]) for i, ch in enumerate(gold) if ch == ",")


def _uses(gold: str, token: str) -> bool:
    return token in gold


def hedge_reason(answer: str, gold: str) -> str | None:
    r"""Why ``answer`` offers more than one value, a step or hidden content; ``None`` when it offers one.

    Args:
        answer: The extracted answer (already pre-filtered: bounded length, no control characters).
        gold: The reference answer; a construct the gold itself uses is allowed in the answer.

    Returns:
        A short reason such as ``"the answer is a chain of steps (\\to)"``, or ``None``.
    """
    boxes = len(_BOX_RE.findall(answer))
    if boxes > 1 and not _several_values(gold):
        return f"the answer holds {boxes} \\boxed{{}} answers"
    for env in _BEGIN_RE.findall(answer):
        if env.rstrip("*") not in _MATRIX_ENVS and f"{{{env}}}" not in gold.replace(" ", ""):
            return f"the answer uses \\begin{{{env}}} (several lines or values)"
    matrix_depth = 0
    tokens = _TOKEN_RE.findall(answer)
    script_depths: list[int] = []  # brace depths at which a ``_{...}``/``^{...}`` group opened
    depth = 0
    previous = ""
    for i, tok in enumerate(tokens):
        if tok == "\\begin" or tok == "\\end":
            name = "".join(tokens[i + 1 : i + 40]).split("}", 1)[0].strip("{ ").rstrip("*")
            if name in _MATRIX_ENVS:
                matrix_depth += 1 if tok == "\\begin" else -1
        elif tok == "{":
            depth += 1
            if previous in ("_", "^"):
                script_depths.append(depth)
        elif tok == "}":
            if script_depths and script_depths[-1] == depth:
                script_depths.pop()
            depth -= 1
        elif tok in _LINE_BREAKS and matrix_depth <= 0 and not _uses(gold, tok):
            return f"the answer spans several lines ({tok})"
        elif (tok in _STEPS or tok in _STEP_CHARS) and not script_depths and not _uses(gold, tok):
            return f"the answer is a chain of steps or alternatives ({tok})"
        elif tok in _HIDDEN and not _uses(gold, tok):
            return f"the answer has hidden or struck-out content ({tok})"
        if not tok.isspace():
            previous = tok
    flat = " ".join(_SPACING_RE.sub(" ", answer).split())
    for step in _ASCII_STEPS:
        if step in flat.replace(" ", "") and step not in gold.replace(" ", ""):
            return f"the answer is a chain of steps or alternatives ({step})"
    for run in _NUMERAL_RUN_RE.finditer(flat):
        if _THOUSANDS_RUN_RE.fullmatch(run.group()) or _ARG_COMMAND_RE.search(flat[: run.start()]):
            continue
        if run.group() in " ".join(_SPACING_RE.sub(" ", gold).split()):
            continue
        return f"the answer has several numbers side by side ({run.group()[:40]})"
    return None


def base_numeral(text: str) -> tuple[int, int] | None:
    """``(value, base)`` of a numeral with a base subscript (``52_8``, ``4210_{5}``, ``(52)_8``); else ``None``.

    The numeral must contain a digit and only digits valid in its base (2 to 36), so ``x_2`` and ``a_{10}``
    are variables, not numerals.
    """
    text = _DELIMS_RE.sub("", text).strip()
    match = _BASE_RE.fullmatch(text)
    if not match:
        return None
    digits, base = match.group(1), int(match.group(2) or match.group(3))
    if not 2 <= base <= 36 or not any(c.isdigit() for c in digits) or len(digits) > 200:
        return None
    try:
        return int(digits, base), base
    except ValueError:
        return None


def value_part(answer: str) -> str:
    """The value of ``x = 5`` (``5``); the answer itself when it is not one plain label and ``=``."""
    match = _LABEL_RE.fullmatch(answer)
    if match and "=" not in match.group(1):
        return match.group(1).strip()
    return answer
