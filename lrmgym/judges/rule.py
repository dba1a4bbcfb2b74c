"""Rule judges: the env's verifier as a judge, answer format (loose A / strict B), length and overlong shaping.

- :class:`AccuracyJudge` reuses the env's own verdict (``env.verify`` / ``env.score_group`` ran first, in
  :class:`~lrmgym.judges.base.JudgedEnv`); it never re-implements a verifier.
- :class:`FormatJudge` in ``loose`` mode (format A) asks for a closed ``<think>`` block; in ``strict`` mode
  (format B) for exactly one closed ``<think>`` then exactly one closed ``<answer>`` and nothing but
  whitespace or an EOS string after ``</answer>``, in a response that ended at EOS (not cut at the token
  budget). Strict mode rejects an answer followed by appended text, a reward hack seen in large-scale zero-RL
  runs; loose mode accepts it.
- :class:`LengthPenalty` subtracts up to ``coef`` linearly between ``free_length`` and ``max_length``.
- :class:`OverlongPenalty` is DAPO's soft overlong punishment (arXiv 2503.14476, eq. 13): 0 up to
  ``L_max - L_cache``, then a linear ramp to -1 at ``L_max``, and -1 beyond.

Format checks use ``str.find`` / ``str.count`` only (linear time, no regex backtracking on 1 MB outputs).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from lrmgym.core import Completion, Task, Verdict
from lrmgym.judges.base import BaseJudge, JudgeConfigBase

__all__ = [
    "AccuracyJudge",
    "AccuracyJudgeConfig",
    "FormatJudge",
    "FormatJudgeConfig",
    "LengthPenalty",
    "LengthPenaltyConfig",
    "OverlongPenalty",
    "OverlongPenaltyConfig",
    "completion_length",
]

LengthUnit = Literal["auto", "tokens", "chars"]


def completion_length(completion: Completion, unit: LengthUnit) -> tuple[int | None, str]:
    """The completion's length and the unit used; ``None`` when ``unit="tokens"`` and no token ids are known.

    ``auto`` counts tokens when the policy reported them and characters otherwise.
    """
    if unit == "chars" or (unit == "auto" and completion.token_ids is None):
        return len(completion.text), "chars"
    if completion.token_ids is None:
        return None, "tokens"
    return len(completion.token_ids), "tokens"


# --------------------------------------------------------------------------------------------------- accuracy
class AccuracyJudge(BaseJudge):
    """The env's own verifier as a judge: its score, unchanged (``None`` stays ungradeable)."""

    name = "accuracy"
    verifiable = True

    def _score(self, task: Task, completion: Completion, verdict: Verdict) -> tuple[float | None, str, bool]:
        return verdict.score, verdict.reason or ("ungradeable" if verdict.score is None else ""), False


class AccuracyJudgeConfig(JudgeConfigBase):
    """The env's verifier as a judge (``judge=accuracy``)."""

    kind: Literal["accuracy"] = "accuracy"
    """Selects this judge."""

    def build(self) -> AccuracyJudge:
        """Make the judge."""
        return AccuracyJudge(name=self.name, weight=self.weight)


# --------------------------------------------------------------------------------------------------- format
_DEFAULT_EOS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "</s>", "<eos>")


class FormatJudge(BaseJudge):
    """Answer-format reward: ``reward_ok`` when the format holds, ``reward_bad`` otherwise.

    Args:
        mode: ``"loose"`` (format A: a closed ``<think>`` block somewhere) or ``"strict"`` (format B).
        think_prefilled: The prompt already ends with ``<think>``, so the completion starts inside the block.
        eos_strings: End-of-sequence strings allowed after ``</answer>`` in strict mode.
        reward_ok: Score when the format holds.
        reward_bad: Score when it does not.
    """

    def __init__(
        self,
        mode: Literal["loose", "strict"] = "strict",
        *,
        think_prefilled: bool = False,
        eos_strings: tuple[str, ...] = _DEFAULT_EOS,
        reward_ok: float = 1.0,
        reward_bad: float = 0.0,
        name: str | None = None,
        weight: float = 1.0,
    ) -> None:
        if mode not in ("loose", "strict"):
            raise ValueError(f"FormatJudge mode must be 'loose' or 'strict', got {mode!r}.")
        super().__init__(name or f"format_{mode}", weight)
        self.mode, self.think_prefilled = mode, think_prefilled
        self.eos_strings = tuple(eos_strings)
        self.reward_ok, self.reward_bad = reward_ok, reward_bad
        self.score_bounds = (min(reward_ok, reward_bad), max(reward_ok, reward_bad))

    def check(self, text: str) -> tuple[bool, str]:
        """``(ok, reason)`` for a completion's text."""
        return self._check_loose(text) if self.mode == "loose" else self._check_strict(text)

    def check_completion(self, completion: Completion) -> tuple[bool, str]:
        """``(ok, reason)`` for a completion: its text, and in strict mode that it ended at EOS.

        Format B asks for a response that ends in EOS: one cut at the token budget (``finish_reason ==
        "length"``) fails however its text looks. A completion whose finish reason is unknown is judged by
        its text.
        """
        ok, reason = self.check(completion.text)
        if ok and self.mode == "strict" and completion.finish_reason == "length":
            return False, "no EOS: cut at the token budget"
        return ok, reason

    def format_ok(self, completion: Completion) -> bool:
        """Whether the completion has the format (the wrapper copies this into ``Verdict.format_ok``)."""
        return self.check_completion(completion)[0]

    def _check_loose(self, text: str) -> tuple[bool, str]:
        start = 0
        if not self.think_prefilled:
            start = text.find("<think>")
            if start < 0:
                return False, "no <think> tag"
        if text.find("</think>", start) < 0:
            return False, "<think> block not closed"
        return True, "ok"

    def _check_strict(self, text: str) -> tuple[bool, str]:
        want_open = 0 if self.think_prefilled else 1
        counts = {tag: text.count(tag) for tag in ("<think>", "</think>", "<answer>", "</answer>")}
        if counts["<think>"] != want_open or counts["</think>"] != 1:
            return (
                False,
                f"expected {want_open} <think> and 1 </think>, found {counts['<think>']} and {counts['</think>']}",
            )
        if counts["<answer>"] != 1 or counts["</answer>"] != 1:
            return (
                False,
                f"expected exactly one <answer>...</answer>, found {counts['<answer>']} and {counts['</answer>']}",
            )
        body = text.lstrip()
        if not self.think_prefilled and not body.startswith("<think>"):
            return False, "text before <think>"
        think_end = body.find("</think>")
        ans_open = body.find("<answer>")
        ans_close = body.find("</answer>")
        if not (think_end < ans_open < ans_close):
            return False, "tags out of order (want <think>...</think><answer>...</answer>)"
        if body[think_end + len("</think>") : ans_open].strip():
            return False, "text between </think> and <answer>"
        if not body[ans_open + len("<answer>") : ans_close].strip():
            return False, "empty <answer>"
        tail = body[ans_close + len("</answer>") :]
        for eos in self.eos_strings:
            tail = tail.replace(eos, "")
        if tail.strip():
            return False, f"text after </answer>: {tail.strip()[:40]!r}"
        return True, "ok"

    def _score(self, task: Task, completion: Completion, verdict: Verdict) -> tuple[float | None, str, bool]:
        ok, reason = self.check_completion(completion)
        return (self.reward_ok if ok else self.reward_bad), reason, False


class FormatJudgeConfig(JudgeConfigBase):
    """Answer-format reward (``judge=format_loose`` or ``judge=format_strict``)."""

    kind: Literal["format"] = "format"
    """Selects this judge."""
    mode: Literal["loose", "strict"] = "strict"
    """loose (format A): a closed <think> block; strict (format B): exactly one closed <think> then one closed
    <answer>, nothing but whitespace or an EOS string after </answer>, and not cut at the token budget."""
    think_prefilled: bool = False
    """Set when the prompt already ends with <think> (the completion starts inside the thinking block)."""
    eos_strings: list[str] = Field(default_factory=lambda: list(_DEFAULT_EOS))
    """End-of-sequence strings allowed after </answer> in strict mode."""
    reward_ok: float = 1.0
    """Score when the format holds."""
    reward_bad: float = 0.0
    """Score when it does not."""

    def build(self) -> FormatJudge:
        """Make the judge."""
        return FormatJudge(
            self.mode, think_prefilled=self.think_prefilled, eos_strings=tuple(self.eos_strings),
            reward_ok=self.reward_ok, reward_bad=self.reward_bad, name=self.name, weight=self.weight,
        )  # fmt: skip


# --------------------------------------------------------------------------------------------------- length
class LengthPenalty(BaseJudge):
    """``-coef * clip((L - free_length) / (max_length - free_length), 0, 1)``: 0 when short, ``-coef`` when long."""

    name = "length"

    def __init__(
        self, max_length: int, free_length: int = 0, coef: float = 1.0, unit: LengthUnit = "auto",
        name: str | None = None, weight: float = 1.0,
    ) -> None:  # fmt: skip
        if not 0 <= free_length < max_length:
            raise ValueError(
                f"LengthPenalty needs 0 <= free_length < max_length, got free_length={free_length}, "
                f"max_length={max_length}."
            )
        super().__init__(name, weight)
        self.max_length, self.free_length, self.coef, self.unit = max_length, free_length, coef, unit
        self.score_bounds = (-coef, 0.0)

    def _score(self, task: Task, completion: Completion, verdict: Verdict) -> tuple[float | None, str, bool]:
        length, unit = completion_length(completion, self.unit)
        if length is None:
            return None, "unit=tokens but the policy reported no token ids", False
        frac = min(1.0, max(0.0, (length - self.free_length) / (self.max_length - self.free_length)))
        return -self.coef * frac, f"{length} {unit}", False


class LengthPenaltyConfig(JudgeConfigBase):
    """A linear length penalty (``judge=length``)."""

    kind: Literal["length"] = "length"
    """Selects this judge."""
    max_length: int = Field(1024, ge=1)
    """Length at and beyond which the full penalty applies."""
    free_length: int = Field(0, ge=0)
    """Length up to which there is no penalty."""
    coef: float = Field(1.0, ge=0.0)
    """The full penalty (the score reaches -coef at max_length)."""
    unit: LengthUnit = "auto"
    """tokens (needs token ids from the policy), chars, or auto (tokens when known, else chars)."""

    @model_validator(mode="after")
    def _check_range(self) -> LengthPenaltyConfig:
        if self.free_length >= self.max_length:
            raise ValueError(
                f"free_length ({self.free_length}) must be below max_length ({self.max_length}); "
                "raise max_length or lower free_length."
            )
        return self

    def build(self) -> LengthPenalty:
        """Make the judge."""
        return LengthPenalty(self.max_length, self.free_length, self.coef, self.unit, self.name, self.weight)


class OverlongPenalty(BaseJudge):
    """DAPO's soft overlong punishment: 0, then a linear ramp over the last ``cache_length``, then -1."""

    name = "overlong"

    def __init__(
        self, max_length: int = 20480, cache_length: int = 4096, unit: LengthUnit = "auto",
        name: str | None = None, weight: float = 1.0,
    ) -> None:  # fmt: skip
        if not 0 < cache_length <= max_length:
            raise ValueError(
                f"OverlongPenalty needs 0 < cache_length <= max_length, got cache_length={cache_length}, "
                f"max_length={max_length}."
            )
        super().__init__(name, weight)
        self.max_length, self.cache_length, self.unit = max_length, cache_length, unit
        self.score_bounds = (-1.0, 0.0)

    def _score(self, task: Task, completion: Completion, verdict: Verdict) -> tuple[float | None, str, bool]:
        length, unit = completion_length(completion, self.unit)
        if length is None:
            return None, "unit=tokens but the policy reported no token ids", False
        soft_limit = self.max_length - self.cache_length
        if length <= soft_limit:
            return 0.0, f"{length} {unit}", False
        if length <= self.max_length:
            return (soft_limit - length) / self.cache_length, f"{length} {unit} (in the overlong buffer)", False
        return -1.0, f"{length} {unit} (over max_length {self.max_length})", False


class OverlongPenaltyConfig(JudgeConfigBase):
    """DAPO's soft overlong punishment (``judge=overlong``); defaults are DAPO's (L_max 20480, L_cache 4096)."""

    kind: Literal["overlong"] = "overlong"
    """Selects this judge."""
    max_length: int = Field(20480, ge=1)
    """L_max: beyond this length the score is -1."""
    cache_length: int = Field(4096, ge=1)
    """L_cache: the penalty ramps linearly from 0 to -1 over the last cache_length units before max_length."""
    unit: LengthUnit = "auto"
    """tokens (needs token ids from the policy), chars, or auto (tokens when known, else chars)."""

    @model_validator(mode="after")
    def _check_range(self) -> OverlongPenaltyConfig:
        if self.cache_length > self.max_length:
            raise ValueError(f"cache_length ({self.cache_length}) must not exceed max_length ({self.max_length}).")
        return self

    def build(self) -> OverlongPenalty:
        """Make the judge."""
        return OverlongPenalty(self.max_length, self.cache_length, self.unit, self.name, self.weight)
