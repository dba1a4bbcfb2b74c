"""The Reasoning Arena judge: zero-variance groups become a trace tournament scored by Bradley-Terry.

Reasoning Arena (Zhou et al., arXiv 2606.09380; spec in ``../shared/specs/papers.md`` §1). Under GRPO, a
group whose verifiable rewards are all equal has zero advantage and teaches nothing. This judge routes such
groups to a tournament instead:

1. Each trace, in arrival order, meets up to K *anchors* (default: the best, median and worst of the pool so
   far under the current strengths; the median is the lower middle one) through a pairwise judge, in a
   random presentation order (or in both orders, a flip counting as a tie).
2. Every outcome y (win 1, tie 0.5, loss 0) is recorded with its mirror (1 - y): symmetric augmentation.
3. Bradley-Terry strengths are refitted (warm-started Newton, :mod:`lrmgym.judges.bradley_terry`) after each
   trace; the final strengths of the group's traces are min-max normalised into rewards in [0, 1]
   (times ``reward_scale``). When every comparison is a tie there is no signal and every reward is 0.

Traces that are the same text (after normalising line ends and surrounding whitespace) are one node of the
tournament: the copies after the first meet nobody and share its reward, so identical traces get identical
rewards whatever their arrival order (and cost no judge calls).

Groups with mixed verifiable rewards keep them. The first trace of a group meets nobody, the second one
trace, then up to K each: at most 3G - 6 judge calls per group for K = 3 (G >= 3), every call counted.

Options: ``tournament="round_robin"`` (every pair: the ArenaRL-style full tournament ablation),
``pool="prompt"`` (a pool kept across steps per prompt, so anchors evolve over training) with ``pool_keep``
(``recent``: the newest traces; ``best``: the paper's reading of a pool of high-quality traces, verifier-correct
first, then the strongest), ``num_anchors``,
``both_orders``, ``route_when`` (which groups go to the tournament), ``audit_pairs`` (judge a few
correct-vs-wrong pairs of the mixed groups that were not routed, to measure the judge's agreement with the
verifier).

:meth:`ArenaJudge.pop_metrics` returns the counters since its last call, for a learner to log: the fraction
of groups routed, judge calls, the reward spread inside routed groups, and the audit's agreement.
"""

from __future__ import annotations

import concurrent.futures
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, model_validator

from lrmgym.core import Completion, Component, Task, Verdict
from lrmgym.judges.base import BaseJudge, JudgeConfigBase, PairwiseJudge, both_orders
from lrmgym.judges.bradley_terry import fit_bradley_terry
from lrmgym.judges.llm import PairwiseJudgeConfig
from lrmgym.judges.pairwise_rule import RulePairwiseJudgeConfig

__all__ = ["ArenaJudge", "ArenaJudgeConfig", "select_anchors"]

RouteWhen = Literal["all_equal", "all_correct", "all_wrong", "always", "never"]
_EQUAL_TOL = 1e-9


def select_anchors(strengths: np.ndarray, k: int) -> list[int]:
    """Indices of ``k`` anchors spread over the pool ranked by strength: best, ..., median, ..., worst.

    For ``k = 3``: the argmax, the lower-middle element, and the argmin (deduplicated). A pool of at most
    ``k`` items is returned whole. Ties in strength are broken by index (earlier first), so the choice is
    deterministic.
    """
    m = len(strengths)
    if m <= k:
        return list(range(m))
    order = np.argsort(strengths, kind="stable")  # ascending
    if k == 1:
        return [int(order[-1])]
    positions = [(q * (m - 1)) // (k - 1) for q in range(k)]  # 0 ... lower middle ... m - 1
    picked = [int(order[p]) for p in reversed(positions)]  # best first
    return list(dict.fromkeys(picked))


PoolKeep = Literal["recent", "best"]


def pool_keep_error(pool: str, pool_keep: str) -> str | None:
    """The one-line error for a ``pool_keep`` that cannot apply to ``pool`` (None: the pair is valid)."""
    if pool_keep not in ("recent", "best"):
        return f"pool_keep must be 'recent' or 'best', got {pool_keep!r}."
    if pool_keep == "best" and pool != "prompt":
        return (
            f"pool_keep='best' keeps traces across steps and needs pool='prompt', got pool={pool!r}; set pool: "
            "prompt (judge.arena.pool=prompt) or leave pool_keep at 'recent'."
        )
    return None


@dataclass
class _Pool:
    """Traces of one prompt, their comparisons (node indices into ``members``) and verifier correctness."""

    members: list[Completion] = field(default_factory=list)
    comparisons: list[tuple[int, int, float]] = field(default_factory=list)
    strengths: np.ndarray = field(default_factory=lambda: np.zeros(0))
    correct: list[bool] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.correct) != len(self.members):  # a pool built without verdicts: none counts as correct
            self.correct = [False] * len(self.members)

    def trimmed(self, size: int, keep: PoolKeep = "recent") -> _Pool:
        """At most ``size`` members and the comparisons among them (the pool itself when it has no more).

        ``recent`` keeps the newest members; ``best`` the verifier-correct ones first, then the highest
        strengths of the current fit, a tie going to the newer member. Kept members stay in pool order.
        """
        if len(self.members) <= size:
            return self
        n = len(self.members)
        if keep == "best":
            ranked = sorted(range(n), key=lambda i: (self.correct[i], float(self.strengths[i]), i), reverse=True)
            kept = sorted(ranked[:size])
        else:
            kept = list(range(n - size, n))
        new = {old: k for k, old in enumerate(kept)}
        comps = [(new[i], new[j], y) for i, j, y in self.comparisons if i in new and j in new]
        return _Pool(
            [self.members[i] for i in kept], comps, self.strengths[kept].copy(), [self.correct[i] for i in kept]
        )


_METRIC_KEYS = (
    "groups", "groups_routed", "groups_no_signal", "judge_calls", "judge_failures", "comparisons",
    "routed_reward_std_sum", "audit_pairs", "audit_agree", "audit_calls", "seconds", "duplicate_traces",
)  # fmt: skip


class _NeverRaises:
    """A pairwise judge's view whose ``compare`` turns an exception or an outcome outside [0, 1] into a failure."""

    def __init__(self, judge: PairwiseJudge) -> None:
        self.name, self._judge = judge.name, judge

    def compare(self, task: Task, first: Completion, second: Completion) -> float | None:
        try:
            y = self._judge.compare(task, first, second)
        except Exception:  # noqa: BLE001 - a judge bug is a failed comparison, not a crash of the step
            return None
        try:
            y = None if y is None else float(y)
        except (TypeError, ValueError):
            return None
        return y if y is not None and 0.0 <= y <= 1.0 else None


def _trace_key(text: str) -> str:
    """The text a trace is deduplicated by: line ends unified, trailing spaces and surrounding whitespace cut."""
    return "\n".join(line.rstrip() for line in text.replace("\r\n", "\n").strip().split("\n"))


class ArenaJudge(BaseJudge):
    """Group-aware judge: verifiable rewards for mixed groups, a BT tournament for zero-variance groups.

    Args:
        pairwise: The judge that compares two traces (an LLM pairwise judge, the rule pairwise judge, ...).
        route_when: Which groups go to the tournament: ``all_equal`` (all verifiable rewards equal: the
            paper's rule), ``all_correct``, ``all_wrong``, ``always`` (tournament everywhere) or ``never``.
        tournament: ``anchors`` (each trace meets up to ``num_anchors`` anchors) or ``round_robin`` (every
            trace meets every earlier one: the full-tournament ablation).
        num_anchors: K, the anchors per trace.
        pool: ``group`` (anchors come from the group's earlier traces) or ``prompt`` (a pool per prompt kept
            across steps, at most ``pool_size`` traces, for at most ``max_prompts`` prompts).
        pool_keep: With ``pool="prompt"``, which traces the pool keeps after each routed group: ``recent``
            (the newest) or ``best`` (verifier-correct first, then the strongest under the pool's joint
            Bradley-Terry fit, ties to the newer): the cross-step anchor pool of strong traces, so a later
            group of the same prompt meets strong anchors. Only the group's own traces get rewards; the
            anchors are nodes of the fit.
        pool_size: Traces kept per prompt with ``pool="prompt"``.
        max_prompts: Prompts whose pools are kept (least recently used dropped first).
        both_orders: Judge each pair in both orders (two calls; a flip counts as a tie) instead of one
            random order.
        l2: The Bradley-Terry L2 coefficient lambda.
        reward_scale: Multiplies the [0, 1] tournament rewards.
        max_calls_per_group: Optional hard cap on judge calls per group.
        audit_pairs: Correct-vs-wrong pairs judged per mixed (non-routed) group, to audit the judge.
        workers: Pairs judged concurrently (a trace's anchors are independent); 1 judges them in turn.
        seed: Seed of the presentation-order coin flips and of the audit's pair choice.
        name: The component's name.
        weight: The judge's weight.
    """

    name = "arena"

    def __init__(
        self,
        pairwise: PairwiseJudge,
        *,
        route_when: RouteWhen = "all_equal",
        tournament: Literal["anchors", "round_robin"] = "anchors",
        num_anchors: int = 3,
        pool: Literal["group", "prompt"] = "group",
        pool_keep: PoolKeep = "recent",
        pool_size: int = 16,
        max_prompts: int = 10_000,
        both_orders: bool = False,
        l2: float = 1.0,
        reward_scale: float = 1.0,
        max_calls_per_group: int | None = None,
        audit_pairs: int = 0,
        workers: int = 1,
        seed: int = 0,
        name: str | None = None,
        weight: float = 1.0,
    ) -> None:
        super().__init__(name, weight)
        if not callable(getattr(pairwise, "compare", None)):
            raise TypeError(
                f"ArenaJudge needs a pairwise judge with compare(task, first, second), got {type(pairwise).__name__}."
            )
        if num_anchors < 1:
            raise ValueError(f"num_anchors must be at least 1, got {num_anchors}.")
        if (error := pool_keep_error(pool, pool_keep)) is not None:
            raise ValueError(error)
        self.pairwise = pairwise
        self.route_when, self.tournament, self.num_anchors = route_when, tournament, num_anchors
        self.pool, self.pool_keep, self.pool_size, self.max_prompts = pool, pool_keep, pool_size, max_prompts
        self.both_orders, self.l2, self.reward_scale = both_orders, l2, reward_scale
        self.max_calls_per_group, self.audit_pairs = max_calls_per_group, audit_pairs
        self.workers = workers
        self.score_bounds = (0.0, max(1.0, reward_scale))  # verifier scores (0 / 1) or tournament rewards
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._pools: OrderedDict[str, _Pool] = OrderedDict()
        self._metrics = dict.fromkeys(_METRIC_KEYS, 0.0)

    # ---- routing
    @staticmethod
    def _is_correct(verdict: Verdict) -> bool:
        return verdict.correct if verdict.correct is not None else bool(verdict.score and verdict.score > 0)

    def routes(self, verdicts: Sequence[Verdict]) -> bool:
        """Whether a group with these verdicts goes to the tournament (needs two gradeable traces)."""
        graded = [v for v in verdicts if v.score is not None]
        if len(graded) < 2 or self.route_when == "never":
            return False
        if self.route_when == "always":
            return True
        scores = [v.score for v in graded]
        if max(scores) - min(scores) > _EQUAL_TOL:  # type: ignore[operator]
            return False
        if self.route_when == "all_correct":
            return all(self._is_correct(v) for v in graded)
        if self.route_when == "all_wrong":
            return not any(self._is_correct(v) for v in graded)
        return True

    # ---- judging one pair
    def _judge_pairs(self, task: Task, pairs: list[tuple[Completion, Completion]]) -> list[tuple[float | None, int]]:
        """Outcome for ``a`` against ``b`` of each pair, with the judge calls each took.

        The presentation-order coin flips are drawn in order before any call, so results do not depend on
        thread timing; with ``workers > 1`` the pairs are judged concurrently (LLM judges are I/O bound).
        """
        judge = _NeverRaises(self.pairwise)
        if self.both_orders:

            def run(k: int) -> tuple[float | None, int]:
                return both_orders(judge, task, *pairs[k])
        else:
            with self._lock:
                swaps = [self._rng.random() < 0.5 for _ in pairs]

            def run(k: int) -> tuple[float | None, int]:
                a, b = pairs[k]
                if swaps[k]:
                    y = judge.compare(task, b, a)
                    return (None if y is None else 1.0 - y), 1
                return judge.compare(task, a, b), 1

        if self.workers > 1 and len(pairs) > 1:
            with self._lock:
                if self._executor is None:
                    self._executor = concurrent.futures.ThreadPoolExecutor(self.workers, "lrmgym-arena")
            return list(self._executor.map(run, range(len(pairs))))
        return [run(k) for k in range(len(pairs))]

    # ---- the tournament
    def _tournament(
        self, task: Task, traces: list[Completion], correct: list[bool]
    ) -> tuple[np.ndarray, np.ndarray, int, int, int, int]:
        """The tournament of ``traces``: strengths, unjudged flags, judge calls, failures, comparisons, duplicates.

        ``correct`` holds each trace's verifier correctness (kept with the pool's members for ``pool_keep``).

        Strengths and unjudged flags have shape (len(traces),). A trace whose text (see :func:`_trace_key`) is
        already in the pool is not a new node: it takes that node's strength. A trace is unjudged when it was
        put to the judge and every comparison it took part in failed (its strength is only the prior's).
        """
        with self._lock:
            start = self._pools.get(task.id) if self.pool == "prompt" else None
        pool = (
            _Pool(list(start.members), list(start.comparisons), start.strengths.copy(), list(start.correct))
            if start
            else _Pool()
        )
        calls = failures = made = duplicates = 0
        current: list[int] = []
        nodes = {_trace_key(m.text): i for i, m in enumerate(pool.members)}
        tried: set[int] = set()  # nodes put to the judge in this group
        for trace, ok in zip(traces, correct, strict=True):
            key = _trace_key(trace.text)
            if key in nodes:
                current.append(nodes[key])
                duplicates += 1
                continue
            k = nodes[key] = len(pool.members)
            candidates = list(range(k))
            if self.tournament == "anchors":
                opponents = [candidates[i] for i in select_anchors(pool.strengths[candidates], self.num_anchors)]
            else:
                opponents = candidates
            pool.members.append(trace)
            pool.correct.append(ok)
            pool.strengths = np.append(pool.strengths, 0.0)  # (k + 1,) warm start: the newcomer at 0
            added = False
            if self.max_calls_per_group is not None:
                per_pair = 2 if self.both_orders else 1
                opponents = opponents[: max(0, self.max_calls_per_group - calls) // per_pair]
            results = self._judge_pairs(task, [(trace, pool.members[a]) for a in opponents])
            for a, (y, n) in zip(opponents, results, strict=True):
                calls += n
                tried.update((k, a))
                if y is None:
                    failures += 1
                    continue
                pool.comparisons += [(k, a, y), (a, k, 1.0 - y)]  # symmetric augmentation
                made += 1
                added = True
            if added:
                fit = fit_bradley_terry(len(pool.members), pool.comparisons, self.l2, init=pool.strengths)
                pool.strengths = fit.strengths
            current.append(k)
        strengths = pool.strengths[current]
        if self.pool == "prompt":
            with self._lock:
                self._pools[task.id] = pool.trimmed(self.pool_size, self.pool_keep)
                self._pools.move_to_end(task.id)
                while len(self._pools) > self.max_prompts:
                    self._pools.popitem(last=False)
        judged = {i for i, _, _ in pool.comparisons}
        unjudged = np.array([k in tried and k not in judged for k in current], dtype=bool)
        return strengths, unjudged, calls, failures, made, duplicates

    def _audit(
        self, task: Task, completions: Sequence[Completion], verdicts: Sequence[Verdict]
    ) -> tuple[int, float, int]:
        """Judge up to ``audit_pairs`` correct-vs-wrong pairs: ``(pairs judged, agreement sum, calls)``."""
        right = [c for c, v in zip(completions, verdicts, strict=True) if v.score is not None and self._is_correct(v)]
        wrong = [
            c for c, v in zip(completions, verdicts, strict=True) if v.score is not None and not self._is_correct(v)
        ]
        if not right or not wrong:
            return 0, 0.0, 0
        pairs, agree, calls = 0, 0.0, 0
        with self._lock:
            chosen = [(self._rng.choice(right), self._rng.choice(wrong)) for _ in range(self.audit_pairs)]
        for y, n in self._judge_pairs(task, chosen):
            calls += n
            if y is not None:
                pairs, agree = pairs + 1, agree + y  # y = 1: the judge prefers the correct trace
        return pairs, agree, calls

    # ---- the Judge API
    def _score(self, task: Task, completion: Completion, verdict: Verdict) -> tuple[float | None, str, bool]:
        return verdict.score, "verifier (a single completion is never routed)", False

    def score_group(
        self, task: Task, completions: Sequence[Completion], verdicts: Sequence[Verdict]
    ) -> list[Component]:
        """Verifiable rewards for mixed groups; tournament rewards for routed ones (see the module docstring)."""
        start = time.perf_counter()
        counts = dict.fromkeys(_METRIC_KEYS, 0.0)
        counts["groups"] = 1
        if not self.routes(verdicts):
            if self.audit_pairs:
                pairs, agree, calls = self._audit(task, completions, verdicts)
                counts.update(audit_pairs=pairs, audit_agree=agree, audit_calls=calls)
            latency = (time.perf_counter() - start) / max(1, len(completions))
            out = [Component(self.name, v.score, self.weight, latency, False,
                             "verifier (not routed)" if v.score is not None else (v.reason or "ungradeable"))
                   for v in verdicts]  # fmt: skip
        else:
            graded = [k for k, v in enumerate(verdicts) if v.score is not None]
            beta, unjudged, calls, failures, made, duplicates = self._tournament(
                task, [completions[k] for k in graded], [self._is_correct(verdicts[k]) for k in graded]
            )
            # A trace whose every comparison failed (it derailed the judge, or the judge is down) earns no rank
            # from the prior: it gets the bottom reward, and the others are normalised among themselves.
            ranked = beta[~unjudged]
            spread = float(ranked.max() - ranked.min()) if ranked.size else 0.0
            if spread > _EQUAL_TOL:
                rewards = np.where(unjudged, 0.0, (beta - ranked.min()) / spread * self.reward_scale)
            else:
                rewards = np.zeros_like(beta)
            counts.update(groups_routed=1, judge_calls=calls, judge_failures=failures, comparisons=made,
                          groups_no_signal=int(spread <= _EQUAL_TOL), duplicate_traces=duplicates,
                          routed_reward_std_sum=float(np.std(rewards)))  # fmt: skip
            latency = (time.perf_counter() - start) / max(1, len(completions))
            by_index = dict(zip(graded, zip(rewards.tolist(), beta.tolist(), unjudged.tolist(), strict=True),
                                strict=True))  # fmt: skip
            out = []
            for k, v in enumerate(verdicts):
                if k in by_index:
                    r, b, lost = by_index[k]
                    reason = f"tournament: strength {b:+.3f} ({made} comparisons, {calls} judge calls in the group)"
                    if lost:
                        reason = f"tournament: every comparison failed, bottom reward ({calls} judge calls in group)"
                    out.append(Component(self.name, r, self.weight, latency, False, reason, raw_score=b))
                else:
                    out.append(Component(self.name, None, self.weight, latency, False, v.reason or "ungradeable"))
        counts["seconds"] = time.perf_counter() - start
        with self._lock:
            for key, value in counts.items():
                self._metrics[key] += value
        lost = sum(c.reason.startswith("tournament: every comparison failed") for c in out)
        self._stats.add(calls=len(completions), seconds=counts["seconds"], judge_calls=counts["judge_calls"],
                        failures=sum(c.score is None for c in out) + lost)  # fmt: skip
        return out

    def metrics(self) -> dict[str, float | None]:
        """Counters since the last :meth:`pop_metrics`, with derived rates (``None`` when undefined).

        Keys: ``groups``, ``groups_routed``, ``frac_routed``, ``groups_no_signal`` (routed groups where every
        comparison tied), ``judge_calls``, ``judge_calls_per_group``, ``judge_failures``, ``comparisons``,
        ``routed_reward_std`` (mean std of rewards inside routed groups), ``audit_pairs``,
        ``audit_agreement`` (mean outcome of the judge for the correct trace: 1 = always agrees with the
        verifier, 0.5 = chance or ties), ``audit_calls``, ``duplicate_traces`` (routed traces that repeated an
        earlier trace's text and shared its node), ``seconds``.
        """
        with self._lock:
            return self._derive(dict(self._metrics))

    @staticmethod
    def _derive(m: dict[str, float]) -> dict[str, float | None]:
        routed = m["groups_routed"]
        return {
            "groups": m["groups"],
            "groups_routed": routed,
            "frac_routed": routed / m["groups"] if m["groups"] else None,
            "groups_no_signal": m["groups_no_signal"],
            "judge_calls": m["judge_calls"],
            "judge_calls_per_group": m["judge_calls"] / routed if routed else None,
            "judge_failures": m["judge_failures"],
            "comparisons": m["comparisons"],
            "routed_reward_std": m["routed_reward_std_sum"] / routed if routed else None,
            "audit_pairs": m["audit_pairs"],
            "audit_agreement": m["audit_agree"] / m["audit_pairs"] if m["audit_pairs"] else None,
            "audit_calls": m["audit_calls"],
            "duplicate_traces": m["duplicate_traces"],
            "seconds": m["seconds"],
        }

    def pop_metrics(self) -> dict[str, float | None]:
        """:meth:`metrics`, then reset the counters (call once per training step)."""
        with self._lock:
            snapshot, self._metrics = self._metrics, dict.fromkeys(_METRIC_KEYS, 0.0)
        return self._derive(snapshot)

    def stats(self) -> dict[str, float]:
        """Lifetime counters of the arena and of its pairwise judge (``pairwise_*``)."""
        inner = {f"pairwise_{k}": v for k, v in self.pairwise.stats().items()}
        return {**self._stats.snapshot(), **inner}


PairwiseConfig = Annotated[RulePairwiseJudgeConfig | PairwiseJudgeConfig, Field(discriminator="kind")]


class ArenaJudgeConfig(JudgeConfigBase):
    """Reasoning Arena (``judge=arena``): zero-variance groups scored by a pairwise tournament and Bradley-Terry."""

    kind: Literal["arena"] = "arena"
    """Selects this judge."""
    pairwise: PairwiseConfig = Field(default_factory=RulePairwiseJudgeConfig)
    """The pairwise judge: {kind: rule_pairwise} (CPU rules for arithmetic traces) or
    {kind: llm_pairwise, policy: ...}."""
    route_when: RouteWhen = "all_equal"
    """Which groups go to the tournament: all_equal (the paper), all_correct, all_wrong, always, never."""
    tournament: Literal["anchors", "round_robin"] = "anchors"
    """anchors: each trace meets up to num_anchors anchors; round_robin: every pair (the full-tournament ablation)."""
    num_anchors: int = Field(3, ge=1, le=64)
    """Anchors per trace (3: best, median and worst of the pool under the current strengths)."""
    pool: Literal["group", "prompt"] = "group"
    """group: anchors from the group's earlier traces; prompt: a pool per prompt kept across steps (in memory: a
    resumed run starts with empty pools). Prompts recur only over a finite training set (env.num_problems on the
    testbed)."""
    pool_keep: PoolKeep = "recent"
    """With pool: prompt, the traces each prompt's pool keeps: recent (the newest pool_size) or best (verifier-correct
    first, then the strongest under the pool's Bradley-Terry fit, ties to the newer): strong anchors across steps."""
    pool_size: int = Field(16, ge=1, le=1024)
    """Traces kept per prompt when pool is prompt."""
    max_prompts: int = Field(10_000, ge=1)
    """Prompts whose pools are kept when pool is prompt (least recently used dropped first)."""
    both_orders: bool = False
    """Judge each pair in both presentation orders (two calls; a flip counts as a tie) instead of one random order."""
    l2: float = Field(1.0, gt=0)
    """L2 coefficient lambda of the Bradley-Terry fit."""
    reward_scale: float = Field(1.0, gt=0)
    """Multiplies tournament rewards (in [0, 1]); matters only without std-normalised advantages."""
    max_calls_per_group: int | None = Field(None, ge=1)
    """Hard cap on judge calls per routed group; None: no cap beyond the schedule's (3G - 6 with 3 anchors)."""
    audit_pairs: int = Field(0, ge=0, le=64)
    """Correct-vs-wrong pairs judged per mixed group that was not routed, to audit the judge against the verifier."""
    workers: int = Field(1, ge=1, le=64)
    """Comparisons run concurrently (a trace's anchors are independent); raise it for LLM judges."""
    seed: int = Field(0, ge=0)
    """Seed of the presentation-order coin flips and the audit's pair choice."""

    @model_validator(mode="after")
    def _check_pool_keep(self) -> ArenaJudgeConfig:
        if (error := pool_keep_error(self.pool, self.pool_keep)) is not None:
            raise ValueError(error)
        return self

    def build(self) -> ArenaJudge:
        """Make the arena and its pairwise judge."""
        return ArenaJudge(
            self.pairwise.build(), route_when=self.route_when, tournament=self.tournament,
            num_anchors=self.num_anchors, pool=self.pool, pool_keep=self.pool_keep, pool_size=self.pool_size,
            max_prompts=self.max_prompts,
            both_orders=self.both_orders, l2=self.l2, reward_scale=self.reward_scale,
            max_calls_per_group=self.max_calls_per_group, audit_pairs=self.audit_pairs, workers=self.workers,
            seed=self.seed,
            name=self.name, weight=self.weight,
        )  # fmt: skip
