"""A rule-based pointwise judge for arithmetic traces: one trace scored alone on the rule pairwise judge's facts.

The Reasoning Arena's ablations compare its pairwise tournament with a *pointwise* LLM judge that scores each
trace alone (the paper's "RLAIF" and "Adaptive Pointwise" rows). On a CPU there is no LLM judge; this is the
stand-in, on the same facts the rule pairwise judge (:mod:`lrmgym.judges.pairwise_rule`) compares, so a
tournament-vs-pointwise comparison changes only how the facts become a reward:

    score = 0.6 * first-error score + 0.3 * closeness + 0.1 * strict format,   in [0, 1]

- first-error score (:func:`~lrmgym.judges.pairwise_rule.first_error_rank`): 1 for verified work and no wrong
  step; ``0.25 + 0.5 * k / (k + 1)`` when the first wrong step comes after ``k`` verified steps (a caught slip
  is an error at its position); 0 for no verified work and no wrong step (nothing written);
- closeness: ``1 / (1 + |answer - reference|)`` for a numeric final ``<answer>``, 0 without one;
- strict format: one ``<think>`` then one ``<answer>``, nothing after.

The weights follow the pairwise rule order (work, then distance, then format); they are our choice, not the
paper's. The score is monotone in each fact, so it orders traces with the same answer and format as the
``first_error`` criterion does.
"""

from __future__ import annotations

from typing import Literal

from lrmgym.core import Completion, Task, Verdict
from lrmgym.judges.base import BaseJudge, JudgeConfigBase
from lrmgym.judges.pairwise_rule import _reference, problem_numbers, trace_facts
from lrmgym.judges.rule import FormatJudge

__all__ = ["RulePointwiseJudge", "RulePointwiseJudgeConfig", "first_error_score"]

WORK, CLOSENESS, FORMAT = 0.6, 0.3, 0.1


def first_error_score(rank: tuple[int, int]) -> float:
    """A :func:`~lrmgym.judges.pairwise_rule.first_error_rank` as a number in [0, 1] (1: error-free work)."""
    tier, before = rank
    if tier == 2:
        return 1.0
    return 0.25 + 0.5 * before / (before + 1) if tier == 1 else 0.0


class RulePointwiseJudge(BaseJudge):
    """Scores one arithmetic trace alone (see the module docstring); a CPU stand-in for an LLM pointwise judge."""

    name = "rule_pointwise"

    def __init__(self, name: str | None = None, weight: float = 1.0) -> None:
        super().__init__(name, weight)
        self._strict = FormatJudge("strict")

    def _score(self, task: Task, completion: Completion, verdict: Verdict) -> tuple[float | None, str, bool]:
        facts = trace_facts(completion.text, problem_numbers(task), self._strict)
        ref = _reference(task)
        close = 0.0 if facts.answer is None or ref is None else float(1 / (1 + abs(facts.answer - ref)))
        work = first_error_score(facts.first_error)
        score = WORK * work + CLOSENESS * close + FORMAT * facts.strict_format
        reason = f"first error {work:.2f}, closeness {close:.2f}, format {int(facts.strict_format)}"
        return score, reason, False


class RulePointwiseJudgeConfig(JudgeConfigBase):
    """Rule-based pointwise judge for arithmetic traces (``judge=rule_pointwise``): the pointwise ablation's judge."""

    kind: Literal["rule_pointwise"] = "rule_pointwise"
    """Selects this judge."""

    def build(self) -> RulePointwiseJudge:
        """Make the judge."""
        return RulePointwiseJudge(self.name, self.weight)
