"""Rule judges: format A/B, length and DAPO overlong shaping, accuracy from the env's own verdict."""

from __future__ import annotations

import re
import time

import pydantic
import pytest

from lrmgym.core import Completion, Task, Verdict
from lrmgym.judges.rule import (
    AccuracyJudge,
    FormatJudge,
    FormatJudgeConfig,
    LengthPenalty,
    LengthPenaltyConfig,
    OverlongPenalty,
    OverlongPenaltyConfig,
)

TASK = Task(id="t/0", prompt="Q:Compute 2+3. A:", answer="5")
OK = Verdict(score=1.0, correct=True, reason="correct")


def _fmt(mode: str, text: str, **kw) -> tuple[float | None, str]:
    comp = FormatJudge(mode, **kw).score(TASK, Completion(text), OK)
    return comp.score, comp.reason


GOOD = "<think>2+3=5</think><answer>5</answer>"
APPENDED = "<think>2+3=5</think><answer>5</answer> Actually, let me also say hello and add more text."


def test_strict_format_rejects_appended_text_and_loose_accepts_it():
    assert _fmt("strict", APPENDED) == (0.0, "text after </answer>: 'Actually, let me also say hello and add '")
    assert _fmt("loose", APPENDED) == (1.0, "ok")
    assert _fmt("strict", GOOD) == (1.0, "ok")


@pytest.mark.parametrize(
    ("text", "ok", "reason"),
    [
        (GOOD, True, "ok"),
        ("  \n" + GOOD + "\n  ", True, "ok"),
        (GOOD + "<|im_end|>", True, "ok"),
        (GOOD + "</s>\n", True, "ok"),
        ("<think></think>\n<answer>5</answer>", True, "ok"),
        ("Sure! " + GOOD, False, "text before <think>"),
        ("<think>a</think>so<answer>5</answer>", False, "text between </think> and <answer>"),
        ("<think>a</think><answer> </answer>", False, "empty <answer>"),
        ("<think>a</think><answer>5</answer><answer>6</answer>", False,
         "expected exactly one <answer>...</answer>, found 2 and 2"),
        ("<think>a<think>b</think></think><answer>5</answer>", False,
         "expected 1 <think> and 1 </think>, found 2 and 2"),
        ("<answer>5</answer><think>a</think>", False, "text before <think>"),
        ("<think>a</think><answer>5", False, "expected exactly one <answer>...</answer>, found 1 and 0"),
        ("<think>a<answer>5</answer></think>", False,
         "tags out of order (want <think>...</think><answer>...</answer>)"),
        ("5", False, "expected 1 <think> and 1 </think>, found 0 and 0"),
        ("", False, "expected 1 <think> and 1 </think>, found 0 and 0"),
    ],
)  # fmt: skip
def test_strict_format_cases(text, ok, reason):
    assert _fmt("strict", text) == (float(ok), reason)


@pytest.mark.parametrize(
    ("text", "ok", "reason"),
    [
        ("<think>x</think>anything at all", True, "ok"),
        ("preamble <think>x</think>", True, "ok"),
        ("<think>never closed", False, "<think> block not closed"),
        ("</think><think>", False, "<think> block not closed"),
        ("no tags", False, "no <think> tag"),
    ],
)
def test_loose_format_cases(text, ok, reason):
    assert _fmt("loose", text) == (float(ok), reason)


def test_prefilled_think_and_custom_rewards():
    assert _fmt("strict", "2+3=5</think><answer>5</answer>", think_prefilled=True) == (1.0, "ok")
    assert _fmt("strict", GOOD, think_prefilled=True)[0] == 0.0  # an extra <think> when it was prefilled
    assert _fmt("loose", "x</think>", think_prefilled=True) == (1.0, "ok")
    assert _fmt("strict", "junk", reward_ok=0.5, reward_bad=-1.0)[0] == -1.0


def test_format_check_is_linear_on_a_megabyte_of_tags():
    text = "<think>" * 200_000 + "</answer>" * 100_000
    start = time.perf_counter()
    for mode in ("loose", "strict"):
        _fmt(mode, text)
    assert time.perf_counter() - start < 1.0


def test_format_judge_rejects_unknown_mode():
    message = "FormatJudge mode must be 'loose' or 'strict', got 'lenient'."
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        FormatJudge("lenient")  # type: ignore[arg-type]


def test_accuracy_judge_returns_the_env_verdict_score():
    judge = AccuracyJudge()
    assert judge.score(TASK, Completion("x"), OK).score == 1.0
    assert judge.score(TASK, Completion("x"), Verdict(score=0.0, reason="wrong")).reason == "wrong"
    missing = judge.score(TASK, Completion("x"), Verdict.ungradeable("timeout after 2.0 s"))
    assert missing.score is None and missing.reason == "timeout after 2.0 s"


def test_length_penalty_is_linear_between_free_and_max():
    judge = LengthPenalty(max_length=20, free_length=10, coef=2.0, unit="chars")
    scores = [judge.score(TASK, Completion("x" * n), OK).score for n in (0, 10, 15, 20, 40)]
    assert scores == [0.0, 0.0, -1.0, -2.0, -2.0]


def test_length_counts_tokens_when_known_and_tokens_unit_without_ids_is_ungradeable():
    auto = LengthPenalty(max_length=4, unit="auto")
    assert auto.score(TASK, Completion("long text here", token_ids=[1, 2]), OK).score == -0.5
    assert auto.score(TASK, Completion("ab"), OK).reason == "2 chars"
    strict_tokens = LengthPenalty(max_length=4, unit="tokens").score(TASK, Completion("ab"), OK)
    assert strict_tokens.score is None
    assert strict_tokens.reason == "unit=tokens but the policy reported no token ids"


@pytest.mark.parametrize(("length", "expected"), [(0, 0.0), (6, 0.0), (7, -0.25), (8, -0.5), (10, -1.0), (11, -1.0)])
def test_overlong_penalty_follows_dapo(length, expected):
    # L_max = 10, L_cache = 4: no penalty up to 6, ((10 - 4) - L) / 4 from 6 to 10, then -1.
    judge = OverlongPenalty(max_length=10, cache_length=4, unit="tokens")
    assert judge.score(TASK, Completion("", token_ids=[0] * length), OK).score == pytest.approx(expected)


def test_configs_build_judges_with_names_and_weights():
    fmt = FormatJudgeConfig(mode="loose", weight=0.2).build()
    assert (fmt.name, fmt.weight, fmt.mode) == ("format_loose", 0.2, "loose")
    assert LengthPenaltyConfig(name="short", max_length=5).build().name == "short"
    assert OverlongPenaltyConfig().build().max_length == 20480


@pytest.mark.parametrize(
    ("cls", "kwargs", "message"),
    [
        (LengthPenaltyConfig, {"max_length": 10, "free_length": 10},
         "free_length (10) must be below max_length (10); raise max_length or lower free_length."),
        (OverlongPenaltyConfig, {"max_length": 10, "cache_length": 11},
         "cache_length (11) must not exceed max_length (10)."),
        (FormatJudgeConfig, {"mode": "strcit"}, "Input should be 'loose' or 'strict'"),
        (FormatJudgeConfig, {"modes": "strict"}, "Extra inputs are not permitted"),
    ],
)  # fmt: skip
def test_config_errors_name_the_value(cls, kwargs, message):
    with pytest.raises(pydantic.ValidationError, match=re.escape(message)):
        cls(**kwargs)
