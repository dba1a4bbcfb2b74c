"""Ring-Zero's RL stage algorithm: GRPO with the shortest-correct trace store and (RL-3) the tiers.

:class:`RingZeroRL` records each task's shortest correct single-turn trace (what the SD stage distils and what
RL-3 tiers a task by) and, with tiers, samples each tier with its own prompt (:func:`with_tier`) and token cap.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from lrmgym.core import Task
from lrmgym.episodes import Rollout, rollout
from lrmgym.learners.algorithms.distill import Trace
from lrmgym.learners.algorithms.grpo import GRPO
from lrmgym.learners.algorithms.ring_zero_config import RingZeroRLConfig, TierConfig
from lrmgym.learners.engine.common import derived_seed
from lrmgym.learners.engine.loop import StepResult
from lrmgym.learners.engine.onpolicy import _SAMPLING

__all__ = ["RingZeroRL", "after_answer", "with_tier"]

_TIER_SAMPLING = 0x7469  # "ti": the sampling seeds of RL-3's tier rollouts


def with_tier(task: Task, tier: TierConfig) -> Task:
    """``task`` with the tier's prompt before its own (a system message for chat prompts)."""
    text = tier.text()
    if isinstance(task.prompt, str):
        return dataclasses.replace(task, prompt=text + task.prompt)
    messages = list(task.prompt)
    if messages and messages[0].get("role") == "system":
        messages[0] = {**messages[0], "content": text + messages[0].get("content", "")}
    else:
        messages.insert(0, {"role": "system", "content": text.rstrip("\n")})
    return dataclasses.replace(task, prompt=messages)


class RingZeroRL(GRPO):
    """GRPO with Ring-Zero's record of the shortest correct trace per task, and (RL-3) its tiers.

    Args:
        cfg: The stage's options.
        known: Shortest correct solution lengths (tokens) by task id, from earlier stages (RL-3's tiers).
    """

    cfg: RingZeroRLConfig

    def __init__(
        self, cfg: RingZeroRLConfig, name: str, known: dict[str, int] | None = None, stream_seed: int | None = None
    ) -> None:
        super().__init__(cfg)
        self.name = name
        self.stream_seed = stream_seed
        self.traces: dict[str, Trace] = {}
        self.known = dict(known or {})
        self.tiers: list[TierConfig] = list(getattr(cfg, "tiers", []) or [])
        self._tier_metrics: dict[str, Any] = {}
        self._after: dict[str, float] = {}

    def setup(self) -> None:
        """GRPO's setup; the task stream is the first stage's when the stage says so."""
        super().setup()
        if self.stream_seed is not None:
            self.train_seed = self.stream_seed

    # ---- rollouts
    def collect(self) -> tuple[Rollout, float | None]:
        """The step's groups (per tier in RL-3), recorded in the shortest-correct store."""
        start = self.data_pos
        ro, wait_s = self._collect_tiers() if self.tiers else super().collect()
        self._record(ro, start)
        self._after = after_answer([t for group in ro.groups for t in group])
        return ro, wait_s

    def tier_of(self, task_id: str) -> int:
        """The tier index of a task: the lowest whose cap holds its shortest correct solution (never solved: last)."""
        length = self.known.get(task_id)
        if length is not None:
            for i, tier in enumerate(self.tiers):
                if length <= tier.max_new_tokens:
                    return i
        return len(self.tiers) - 1

    def tiered(self, task: Task, tier: TierConfig) -> Task:
        """``task`` as a sample of ``tier`` sees it: with the tier's prompt (tier_marker=prompt) or unchanged (cap)."""
        return with_tier(task, tier) if getattr(self.cfg, "tier_marker", "prompt") == "prompt" else task

    def _collect_tiers(self) -> tuple[Rollout, None]:
        cfg, step, g = self.cfg, self.loop.step, self.cfg.group_size
        tasks = self._tasks(self.data_pos)
        which = [self.tier_of(t.id) for t in tasks]
        groups: list[Any] = [None] * len(tasks)
        verdicts: list[Any] = [None] * len(tasks)
        generate_s = score_s = 0.0
        self._tier_metrics = {}
        for k, tier in enumerate(self.tiers):
            rows = [i for i, w in enumerate(which) if w == k]
            self._tier_metrics[f"tier/{tier.name}/tasks"] = len(rows)
            if not rows:
                continue
            seed = derived_seed(self.loop.ctx.seed, _SAMPLING, step, _TIER_SAMPLING, k)
            cap = min(tier.max_new_tokens, cfg.window(step))
            sampling = cfg.sampling(seed, step).model_copy(update={"max_new_tokens": cap})
            ro = rollout(self.env, self.policy, [self.tiered(tasks[i], tier) for i in rows], g, sampling, self.turns)
            for i, group, tv in zip(rows, ro.groups, ro.turn_verdicts, strict=True):
                groups[i], verdicts[i] = group, tv
            generate_s += ro.generate_s
            score_s += ro.score_s
            right = [t.verdict.correct for grp in ro.groups for t in grp if t.verdict is not None]
            self._tier_metrics[f"tier/{tier.name}/accuracy"] = sum(bool(c) for c in right) / max(len(right), 1)
        self.data_pos += cfg.prompts_per_step
        return Rollout(groups, verdicts, generate_s, score_s), None

    def _record(self, ro: Rollout, start: int) -> None:
        """Keep each task's shortest correct single-turn trace (with the format, where one was checked)."""
        for b, group in enumerate(ro.groups):
            for t in group:
                v, turns = t.verdict, t.policy_turns
                if v is None or v.correct is not True or v.format_ok is False or len(turns) != 1:
                    continue
                c = turns[0].completion
                if c is None or c.token_ids is None:
                    continue
                n = len(c.token_ids)
                if t.task.id not in self.known or n < self.known[t.task.id]:
                    self.known[t.task.id] = n
                old = self.traces.get(t.task.id)
                if old is None or n < old.tokens:
                    self.traces[t.task.id] = Trace(
                        task_id=t.task.id, position=start + b, stream_seed=self.train_seed,
                        prompt_token_ids=list(c.prompt_token_ids or []), token_ids=list(c.token_ids), text=c.text,
                        tokens=n,
                    )  # fmt: skip

    def train_step(self) -> StepResult:
        """GRPO's step, plus the response window and (RL-3) each tier's share and accuracy."""
        out = super().train_step()
        out.metrics["window"] = self.cfg.window(self.loop.step)
        out.metrics["traces"] = len(self.traces)
        out.metrics.update(self._after)
        out.metrics.update(self._tier_metrics)
        return out

    # ---- state
    def state_dict(self) -> dict[str, Any]:
        """GRPO's state plus the trace store and the known lengths."""
        return {**super().state_dict(), "traces": [t.to_json() for t in self.traces.values()], "known": self.known}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        super().load_state_dict(state)
        traces = [Trace.from_json(line) for line in state.get("traces", [])]
        self.traces = {t.task_id: t for t in traces}
        self.known = dict(state.get("known", self.known))


def after_answer(trajs: list[Any]) -> dict[str, float]:
    """How much text the policy wrote after its last ``</answer>`` (format A's exploit, papers.md 3.3).

    ``after_answer/frac``: the share of trajectories whose last policy turn has non-blank text after its last
    ``</answer>``; ``after_answer/chars``: the mean count of those characters (0 for the others).
    """
    counts = []
    for t in trajs:
        turns = t.policy_turns
        if not turns:
            continue
        text = turns[-1].text
        cut = text.rfind("</answer>")
        counts.append(len(text[cut + len("</answer>") :].strip()) if cut >= 0 else 0)
    if not counts:
        return {}
    return {
        "after_answer/frac": sum(c > 0 for c in counts) / len(counts),
        "after_answer/chars": sum(counts) / len(counts),
    }
