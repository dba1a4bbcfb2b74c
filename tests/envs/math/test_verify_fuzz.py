r"""Fuzz the math verifier with hypothesis: no crash, a well-formed verdict, no call over its bound.

Answers come from two grammars, mixed with junk and unicode tricks and with known sympy hangs:

- LaTeX: ``\frac``, ``\sqrt``, ``\sqrt[n]``, ``^{}``, ``_``, ``\cdot``, ``\times``, ``\pi``, ``\infty``,
  ``\left( \right)``, ``\boxed``, ``\text``, sets, intervals, tuples, matrices, percents, degrees, numbers
  with thousands commas, relations;
- plain arithmetic: small, long and huge literals, ``+ - * / ** ^ !``, functions, brackets nested up to
  past the verifier's nesting cap.

Two targets, graded through the public entry points:

- ``math/env``: the answer in a completion of the prompt's format (``r1``, ``boxed``, ``plain``; or none),
  graded by ``MathEnv.verify`` (what ``env.step`` and ``score_group`` call) against a fixed realistic gold;
- ``math/verify_answer``: ``verify_answer(prediction, gold)`` with both sides generated.

A call fails when an exception escapes, when the verdict is not well-formed (score 0 or 1, or ``None`` only
for a gold that cannot be read; ``correct`` agreeing with the score; JSON-serialisable), or when it takes
longer than ``timeout_s`` + :data:`MARGIN_S` of wall time. The bound counts once a worker is ready, so the
pool is warmed outside the timed call. ``benchmarks/fuzz_verifiers.py`` runs the same targets at 10 000
inputs each; here they run at a modest size, derandomized so that CI is deterministic.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lrmgym.core import Completion, Task, Verdict
from lrmgym.envs.math.env import MathEnv
from lrmgym.envs.math.verify import default_pool, verify_answer
from lrmgym.testing.fuzz import Call, Target, timed

TEST_TIMEOUT_S = 0.5
"""The env's ``timeout_s`` in these tests, to keep them short (the default is 2 s; the benchmark uses it)."""
MARGIN_S = 2.0
"""Allowed wall time past the bound: a worker's kill and reap, and the parent's share of a loaded 2-core box."""
FUZZ_SETTINGS = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# ------------------------------------------------------------------------------------------------ grammars
_JUNK_FRAGMENTS = [
    "\ud800", "\x00", "\u202e", "\u200b", "\ufeff", "\u0301", "\uff12\uff14", "\u0662", "\u2212", "\u00d7",
    "\u221a", "\u03c0", "\u221e", "\u00bd", "\u00b2", "\U0001d7d9", "\\\\", "\\to", "\\quad", "&", "%", "$",
    "$$", "{", "}", "[", ")", "\\", "\\begin{cases}", "\\end{", "\\phantom{3}", "\\cancel{3}", "\\bmod",
    "Actually no: ", "\n", "\t", " or ", "=", "\\approx", "\\,", "\\!", "\\left", "\\right.", "^", "_",
    "</answer>", "<answer>", "\\boxed{", "Answer:", "#", "~", "'", '"', "\\displaystyle", "\\mathrm{",
]  # fmt: skip
JUNK = st.one_of(st.sampled_from(_JUNK_FRAGMENTS), st.text(max_size=6))
"""Fragments inserted at random places: unicode tricks, control characters, unbalanced brackets, hedges."""

DIGITS = st.integers(1, 1200).map(lambda k: "9" * k)  # around the 1000-character cap and the 4300-digit limit
NUMBER = st.one_of(
    st.integers(-1000, 1000).map(str),
    st.integers(0, 10**40).map(str),
    st.integers(1000, 10**12).map(lambda n: f"{n:,}"),
    st.integers(1000, 10**9).map(lambda n: f"{n:,}".replace(",", ",\\!")),
    st.builds("{}.{}".format, st.integers(0, 999), st.integers(0, 10**8)),
    st.integers(0, 99999).map(lambda n: f".{n}"),
    st.builds("{}e{}".format, st.integers(1, 99), st.integers(-400, 400)),
    st.builds("{} \\times 10^{{{}}}".format, st.integers(1, 9), st.integers(-999, 999)),
    DIGITS,
)
LATEX_ATOM = st.one_of(
    NUMBER,
    st.sampled_from(["\\pi", "\\infty", "-\\infty", "e", "i", "x", "y", "n", "a_1", "x_{10}", "\\alpha", "\\theta"]),
    st.sampled_from(["\\emptyset", "\\mathbb{R}", "\\circ", "\\%", "\\$", "\\ldots", "\\sqrt2", "\\frac12"]),
    st.from_regex(r"[A-Za-z ]{0,8}", fullmatch=True).map(lambda s: f"\\text{{{s}}}"),
    st.builds("{}\\%".format, NUMBER),
    st.builds("{}^\\circ".format, NUMBER),
    st.builds("{}^{{\\circ}}".format, NUMBER),
    st.builds("\\${}".format, NUMBER),
    st.builds("{}\\text{{ {}}}".format, NUMBER, st.sampled_from(["cm", "m^2", "dollars", "degrees", "inches"])),
)
_LATEX_UNARY = [
    "\\sqrt{{{}}}", "-{}", "{}!", "\\left( {} \\right)", "({})", "\\boxed{{{}}}", "\\{{{}\\}}", "\\sin {}",
    "\\ln({})", "\\log {}", "\\lfloor {} \\rfloor", "|{}|", "\\pm {}", "\\overline{{{}}}", "\\mathrm{{{}}}", "{}'",
]  # fmt: skip
_LATEX_BINARY = [
    "\\frac{{{}}}{{{}}}", "\\dfrac{{{}}}{{{}}}", "\\tfrac{}{}", "\\sqrt[{}]{{{}}}", "{}^{{{}}}", "{}^{}",
    "{}_{{{}}}", "{}_{}", "{} \\cdot {}", "{} \\times {}", "{} + {}", "{} - {}", "{}/{}", "{} = {}", "{} \\le {}",
    "[{}, {})", "({}, {}]", "({}, {})", "[{},{}]", "\\{{{}, {}\\}}", "\\binom{{{}}}{{{}}}", "\\log_{{{}}} {}",
    "{} \\cup {}", "{}, {}", "{} \\div {}", "\\begin{{pmatrix}} {} \\\\ {} \\end{{pmatrix}}",
    "\\begin{{bmatrix}} {} & {} \\end{{bmatrix}}", "x \\in {}{}", "{}\\sqrt{{{}}}", "{} \\text{{ and }} {}",
]  # fmt: skip


def _latex_extend(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    unary = st.tuples(st.sampled_from(_LATEX_UNARY), children).map(lambda t: t[0].format(t[1]))
    binary = st.tuples(st.sampled_from(_LATEX_BINARY), children, children).map(lambda t: t[0].format(t[1], t[2]))
    matrix = st.lists(children, min_size=4, max_size=4).map(
        lambda c: f"\\begin{{pmatrix}} {c[0]} & {c[1]} \\\\ {c[2]} & {c[3]} \\end{{pmatrix}}"
    )
    return st.one_of(binary, unary, matrix)


LATEX = st.recursive(LATEX_ATOM, _latex_extend, max_leaves=10)
"""An answer in the LaTeX grammar."""

_FUNCTIONS = ["sqrt", "log", "ln", "exp", "sin", "cos", "tan", "factorial", "abs", "floor", "gamma", "Gamma"]
_OPERATORS = [" + ", " - ", " * ", " / ", "**", "^", "*", "/", " % ", "//", " mod "]
EXPR_ATOM = st.one_of(
    st.integers(0, 100).map(str),
    st.integers(0, 10**60).map(str),
    DIGITS,
    st.sampled_from(["1e308", "1e-308", "1e999999", "0.5", "pi", "e", "x", "inf", "nan", "oo", "I", "E"]),
)


def _expr_extend(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    binary = st.tuples(children, st.sampled_from(_OPERATORS), children).map("".join)
    return st.one_of(
        binary,
        st.tuples(st.sampled_from(_FUNCTIONS), children).map(lambda t: f"{t[0]}({t[1]})"),
        children.map(lambda c: f"({c})"),
        children.map(lambda c: f"-{c}"),
        children.map(lambda c: f"{c}!"),
    )


def _nested(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """``inner`` inside 0 to 80 brackets, across the verifier's cap of 64."""
    brackets = st.sampled_from([("(", ")"), ("{", "}"), ("[", "]"), ("\\left(", "\\right)")])
    depth = st.one_of(st.integers(0, 4), st.integers(0, 80))
    return st.builds(lambda e, b, k: b[0] * k + e + b[1] * k, inner, brackets, depth)


_ARITHMETIC = st.recursive(EXPR_ATOM, _expr_extend, max_leaves=10)
EXPRESSION = st.one_of(_ARITHMETIC, _ARITHMETIC, _nested(EXPR_ATOM))
"""An answer in the plain-arithmetic grammar."""

HOSTILE = (
    "9^{9^{9}}",
    "10^{10^{10^{10}}}",
    "\\dfrac{5^{\\left(5^{\\left(5^{\\left(5^5\\right)}\\right)} - 4\\right)} - 5}{16}",
    "10000000!",
    "99999!!",
    "(10^{6})!",
    "\\int_{0}^{1} e^{x^{2}} \\sin(x^{3}) dx",
    "\\sum_{n=1}^{10^{10}} n",
    "\\prod_{k=1}^{10^{9}} k",
    "\\binom{10^{9}}{10^{5}}",
    "2^{2^{2^{2^{2^{2}}}}}",
    "\\sqrt[10^{10}]{10^{10^{10}}}",
    "x^{10^{100}}",
    "e^{e^{e^{e^{10}}}}",
    "10^{10^{10}} = 10^{10^{10}}",
    "\\frac{10^{10^{10}}}{10^{10^{10}-1}}",
    "\\Gamma(10^{10})",
    "\\sin(10^{100})",
    "\\lfloor 10^{10^{10}} \\rfloor",
    "(" * 64 + "1" + ")" * 64,
    "\\sqrt{" * 64 + "2" + "}" * 64,
    "\\frac{1}{" * 32 + "2" + "}" * 32,
    "1+" * 499 + "1",
    "\\boxed{" * 300,
    "9" * 1000,
    "10**10**10",
    "9**9**9",
    "factorial(10**7)",
    "2^2^2^2^2^2",
    "exp(exp(exp(100)))",
    "__import__('os').system('true')",
)
"""Known sympy hangs and heavy answers (power towers, huge factorials, hard integrals, deep brackets)."""


def _junked(answer: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """``answer``, sometimes with junk fragments inserted at random positions."""
    insertions = st.lists(st.tuples(st.integers(0, 2000), JUNK), max_size=3)

    def insert(args: tuple[str, list[tuple[int, str]]]) -> str:
        text, parts = args
        for position, junk in parts:
            position %= len(text) + 1
            text = text[:position] + junk + text[position:]
        return text

    return st.tuples(answer, insertions).map(insert)


ANSWER = st.one_of(_junked(LATEX), _junked(EXPRESSION), st.sampled_from(HOSTILE))
"""A model's final answer: either grammar with junk, or a hostile answer."""

GOLDS = {
    "42": ("42", "42.0", "$42$", "x = 42", "4.2 \\times 10^{1}", "\\boxed{42}"),
    "-7": ("-7", "-7.00", "- 7", "\\left(-7\\right)"),
    "2,125": ("2125", "2,125", "2125.0", "2,\\!125"),
    "0.25": ("\\frac{1}{4}", "1/4", ".25", "\\frac14", "25\\%"),
    "\\frac{1}{2}": ("0.5", "\\dfrac12", "2/4", "\\frac{2}{4}", "0.500000"),
    "\\frac{\\sqrt{3}}{2}": ("\\sqrt{3}/2", "\\frac{\\sqrt3}{2}", "0.866025", "\\frac{3}{2\\sqrt{3}}"),
    "3\\sqrt{2}": ("\\sqrt{18}", "3 \\sqrt 2", "4.242641", "\\sqrt{2} \\cdot 3"),
    "\\pi": ("\\pi", "3.14159265", "\\frac{2\\pi}{2}"),
    "2\\pi": ("2 \\pi", "\\pi \\cdot 2", "6.283185", "360^\\circ"),
    "(1, 2)": ("(1,2)", "\\left( 1, 2 \\right)", "(1.0, 2.0)"),
    "[0, \\infty)": ("[0,\\infty)", "\\left[0, \\infty\\right)", "x \\ge 0"),
    "(3,4]": ("(3, 4]", "\\left(3, 4\\right]"),
    "\\{1, 2\\}": ("\\{2, 1\\}", "1, 2", "\\{1,2\\}"),
    "1,-2": ("-2, 1", "\\{1,-2\\}", "x = 1, x = -2"),
    "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}": (
        "\\begin{pmatrix} 1.0 \\\\ 2 \\end{pmatrix}",
        "\\begin{bmatrix}1\\\\2\\end{bmatrix}",
    ),
    "x^2 + 1": ("1 + x^2", "x^{2}+1", "(x + i)(x - i)"),
    "y = 2x + 3": ("2x+3", "y=3+2x", "y = 2 x + 3"),
    "50\\%": ("50", "50\\%", "0.5", "50 \\%"),
    "30^\\circ": ("30", "30^{\\circ}", "\\frac{\\pi}{6}", "30^\\circ"),
    "\\text{Evelyn}": ("Evelyn", "\\text{Evelyn}", "\\textbf{Evelyn}"),
    "\\text{(C)}": ("C", "(C)", "\\text{C}"),
    "6 - 5i": ("6-5i", "-5i + 6", "6 - 5 i"),
    "3 \\pm \\sqrt{2}": ("3 + \\sqrt2, 3 - \\sqrt2", "3 \\pm \\sqrt2"),
    "52_8": ("52_8", "52_{8}", "42"),
    "10^{10}": ("10000000000", "10,000,000,000", "1e10", "10^{10}"),
    "\\infty": ("\\infty", "+\\infty", "\\infty."),
    "\\$18.90": ("18.9", "\\$18.90", "18.90"),
    "864 \\text{ inches}^2": ("864", "864 \\mbox{ inches}^2", "864 \\text{ inches}^2\\,"),
    "x \\in [-2,7]": ("[-2, 7]", "x \\in [-2.0, 7.0]", "-2 \\le x \\le 7"),
}  # fmt: skip
"""Realistic reference answers (MATH-500 and GSM8K shapes), each with right or nearly right ways to write it."""


def _near_gold(gold: str) -> st.SearchStrategy[str]:
    """An answer close to ``gold``: one of its forms (or the gold), maybe junked, so correct paths run too."""
    return _junked(st.sampled_from((gold, *GOLDS.get(gold, ()))))


@st.composite
def env_cases(draw: st.DrawFn) -> tuple[str, str, str]:
    """``(completion text, gold, template)``: an answer in the format of the template (or in none)."""
    gold = draw(st.sampled_from(sorted(GOLDS)))
    answer = draw(st.one_of(ANSWER, _near_gold(gold)))
    template = draw(st.sampled_from(["r1", "boxed", "plain"]))
    thought = draw(st.one_of(st.just("work"), st.text(max_size=20), JUNK))
    layout = draw(st.sampled_from(["strict", "strict", "strict", "doubled", "trailing", "bare"]))
    if template == "r1":
        text = f"<think>{thought}</think><answer>{answer}</answer>"
    elif template == "boxed":
        text = f"{thought} The final answer is $\\boxed{{{answer}}}$."
    else:
        text = f"{thought}\nAnswer: {answer}"
    if layout == "doubled":
        text = f"{text}\n{text}"
    elif layout == "trailing":
        text = f"{text} {draw(JUNK)}"
    elif layout == "bare":
        text = answer
    return text, gold, template


GOLD = st.one_of(st.sampled_from(sorted(GOLDS)), _junked(LATEX), _ARITHMETIC)
"""A generated gold: a realistic one, or either grammar (as a trusted file could hold by mistake)."""


@st.composite
def pairs(draw: st.DrawFn) -> tuple[str, str]:
    """``(prediction, gold)`` for :func:`verify_answer`: a generated gold and an answer, sometimes near it."""
    gold = draw(GOLD)
    return draw(st.one_of(ANSWER, _near_gold(gold))), gold


# ------------------------------------------------------------------------------------------------ properties


def outcome(verdict: Verdict) -> str:
    """A coarse verdict kind for the benchmark's report (timeouts, dead workers, pre-filter rejections...)."""
    reason = verdict.reason
    for key, kind in (
        ("exhausted", "timeout"),
        ("worker died", "worker died"),
        ("checker failed", "checker error"),
        ("rejected:", "pre-filter"),
        ("format:", "format"),
    ):
        if key in reason:
            return kind
    if verdict.score is None:
        return "ungradeable"
    return "correct" if verdict.correct else "incorrect"


def assert_well_formed(verdict: Any, gold_is_trusted: bool) -> None:
    """Raise AssertionError unless ``verdict`` is a well-formed math verdict.

    Ungradeable (``score=None``) is allowed for any generated gold, and for a trusted realistic one only when
    the reason blames the reference (never the prediction: that would let a model opt out of a wrong answer).
    """
    assert isinstance(verdict, Verdict), f"not a Verdict: {verdict!r:.200}"
    assert isinstance(verdict.reason, str) and verdict.reason, f"no reason: {verdict!r:.200}"
    if verdict.score is None:
        assert verdict.correct is None, verdict
        if gold_is_trusted:
            assert verdict.reason.startswith("ungradeable: the reference answer"), verdict.reason
    else:
        assert verdict.score in (0.0, 1.0), f"score {verdict.score!r} is not 0 or 1 ({verdict.reason})"
        assert verdict.correct is (verdict.score == 1.0), verdict
    assert verdict.parsed is None or isinstance(verdict.parsed, str), verdict
    if verdict.parsed is not None:
        verdict.parsed.encode("utf-8")  # the shown answer is escaped, so logs never choke
    json.dumps(verdict.to_dict())


def _ready() -> None:
    """Make sure a worker is idle, outside the timed call (a kill's replacement starts in 1-3 s)."""
    default_pool().warm(1)


def _timed(fn: Callable[[], Verdict]) -> tuple[Verdict, float, float]:
    _ready()
    return timed(fn)


def math_targets(timeout_s: float) -> tuple[Target, Target]:
    """The two math targets with the verifier's hard bound ``timeout_s``."""
    env = MathEnv(timeout_s=timeout_s)

    def check_env(case: tuple[str, str, str]) -> Call:
        text, gold, template = case
        task = Task(id="fuzz", prompt="", answer=gold, metadata={"template": template})
        verdict, wall, cpu = _timed(lambda: env.verify(task, Completion(text)))
        assert_well_formed(verdict, gold_is_trusted=True)
        assert isinstance(verdict.format_ok, bool), verdict
        return Call(wall, cpu, outcome(verdict))

    def check_pair(case: tuple[str, str]) -> Call:
        prediction, gold = case
        verdict, wall, cpu = _timed(lambda: verify_answer(prediction, gold, timeout_s=timeout_s))
        assert_well_formed(verdict, gold_is_trusted=False)
        return Call(wall, cpu, outcome(verdict))

    hostile_env = tuple((f"<think>x</think><answer>{h}</answer>", "1", "r1") for h in HOSTILE)
    hostile_golds = tuple(("1", h) for h in HOSTILE[::4])  # the gold side: a file could hold one by mistake
    return (
        Target("math/env", env_cases(), check_env, timeout_s, hostile_env),
        Target("math/verify_answer", pairs(), check_pair, timeout_s, hostile_golds),
    )


ENV_TARGET, PAIR_TARGET = math_targets(TEST_TIMEOUT_S)


# ------------------------------------------------------------------------------------------------ tests
@FUZZ_SETTINGS
@given(env_cases())
@example(("<think>x</think><answer>9^{9^{9}}</answer>", "1", "r1"))
@example(("\\boxed{\\dfrac{5^{\\left(5^{\\left(5^{\\left(5^5\\right)}\\right)} - 4\\right)} - 5}{16}}", "3", "boxed"))
@example(("think\nAnswer: 10000000!", "42", "plain"))
@example(("<think>x</think><answer>" + "(" * 64 + "1" + ")" * 64 + "</answer>", "1", "r1"))
@example(("<think>x</think><answer>\ud800\x00\u202e</answer>", "1", "r1"))
def test_env_verify_never_crashes_and_stays_within_its_bound(case):
    call = ENV_TARGET.check(case)
    assert call.wall_s < ENV_TARGET.bound_s + MARGIN_S, (case, call)


@FUZZ_SETTINGS
@given(pairs())
@example(("\\int_{0}^{1} e^{x^{2}} \\sin(x^{3}) dx", "1"))
@example(("10^{10^{10}} = 10^{10^{10}}", "x = 5"))
@example(("1", "9" * 5000))
@example(("\\frac12", "\ud800"))
@example(("2", "10^{10^{10^{10}}}"))
def test_verify_answer_never_crashes_and_stays_within_its_bound(case):
    call = PAIR_TARGET.check(case)
    assert call.wall_s < PAIR_TARGET.bound_s + MARGIN_S, (case, call)
