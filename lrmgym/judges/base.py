"""Judges: reward wrappers that plug over any env.

A :class:`Judge` turns ``(task, completion, env verdict)`` into a named :class:`~lrmgym.core.Component`.
:class:`JudgedEnv` wraps any :class:`~lrmgym.core.TextEnv`, runs the env's own verifier once, hands its
verdict to each judge, and replaces the reward with the weighted sum of the judges' scores. Every component
is recorded in the verdict (name, score, weight, latency, cache hit, reason), so every reward a learner
sees can be traced back to the judge that produced it.

Group-aware judges (the arena) override :meth:`BaseJudge.score_group`; learners always call
``env.score_group``, so the wrapper passes whole groups through.

Rules of composition:
    - The total is ``sum(weight * score)`` over the listed judges only. List the ``accuracy`` judge to keep
      the verifier's reward in the total (``judge=[accuracy,format_strict]``).
    - A judge that fails on a completion (an LLM judge's endpoint is down, its reply is garbage, a judge bug,
      a non-finite score) gives a component with ``score=None`` whose reason says why. What the verdict
      then is depends on whether a *verifiable* judge (``accuracy``: the env's own verifier) graded it:

      * the verifier graded it and weighs in the total (weight not 0): the verdict keeps a score. Each failed
        component counts at its judge's lowest score (``score_bounds``, ``(0, 1)`` unless a judge says
        otherwise; for an LLM judge, 0), so a wrong answer scores what the verifier gave it (0 with
        ``judge=[accuracy,llm_pointwise]``), never masked, and a correct one falls back to the verifiable
        score. Failing the judge can never raise a reward above what the judge could have given. The
        verdict's reason starts with ``judge_failed: <names>``, and :meth:`JudgedEnv.pop_metrics` counts such
        samples (``judge_failed``);
      * otherwise (no verifier, its weight is 0, or the verifier itself could not grade) the verdict is
        ungradeable (``score=None``): learners mask it out instead of training on a partial reward.

      Each completion's verdict depends only on its own components: one completion's failure never changes
      another's reward.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol, SupportsFloat, runtime_checkable

import gymnasium
from pydantic import BaseModel, ConfigDict

from lrmgym.cache import ContentCache
from lrmgym.core import Completion, Component, Prompt, Task, TextEnv, Verdict

__all__ = [
    "BaseJudge",
    "PairwiseAsJudge",
    "JudgeConfigBase",
    "JudgeStats",
    "Judge",
    "JudgedEnv",
    "PairwiseJudge",
    "ContentCache",
    "both_orders",
    "check_judges",
    "judge_group",
    "content_hash",
    "prompt_text",
]


# --------------------------------------------------------------------------------------------------- protocols
@runtime_checkable
class Judge(Protocol):
    """Scores completions; ``name`` labels its component in every verdict.

    ``score`` grades one completion given the env's own verdict for it; ``score_group`` grades the ``G``
    completions of one task together (group-aware judges use the whole group, others loop over ``score``).
    Neither may raise for any model output: a judge that cannot grade returns a component with
    ``score=None`` and a reason.
    """

    name: str
    weight: float

    def score(self, task: Task, completion: Completion, verdict: Verdict) -> Component:
        """Grade one completion."""
        ...

    def score_group(
        self, task: Task, completions: Sequence[Completion], verdicts: Sequence[Verdict]
    ) -> list[Component]:
        """Grade the completions of one task, one component each, in order."""
        ...

    def stats(self) -> dict[str, float]:
        """Counters since creation: calls, cache hits, failures, seconds spent, and judge-specific costs."""
        ...


@runtime_checkable
class PairwiseJudge(Protocol):
    """Compares two completions of the same task.

    ``compare`` returns the soft outcome for ``first``: 1.0 when ``first`` is better, 0.0 when ``second``
    is, 0.5 for a tie, or ``None`` when the comparison failed (endpoint down, unparseable reply). It must not
    raise for any model output.
    """

    name: str

    def compare(self, task: Task, first: Completion, second: Completion) -> float | None:
        """The outcome of ``first`` against ``second``."""
        ...

    def stats(self) -> dict[str, float]:
        """Counters since creation."""
        ...


def both_orders(judge: PairwiseJudge, task: Task, first: Completion, second: Completion) -> tuple[float | None, int]:
    """Ask ``judge`` in both presentation orders; a flip (each order prefers its first slot) counts as a tie.

    Returns:
        ``(outcome for first, number of compare calls made)``. When the two orders agree, their outcome;
        when they disagree, 0.5; when one call failed, the other's outcome; when both failed, ``None``.
    """
    y1 = judge.compare(task, first, second)
    y2 = judge.compare(task, second, first)
    if y1 is None and y2 is None:
        return None, 2
    if y1 is None:
        return 1.0 - y2, 2
    if y2 is None:
        return y1, 2
    return (y1 if abs(y1 - (1.0 - y2)) < 1e-9 else 0.5), 2


# --------------------------------------------------------------------------------------------------- helpers
def prompt_text(prompt: Prompt) -> str:
    """A prompt as plain text: the string itself, or the chat messages as ``role: content`` lines."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(f"{m.get('role', 'user')}: {m.get('content', '')}" for m in prompt)


def content_hash(*parts: Any) -> str:
    """A SHA-256 over the ``repr`` of each part (length-prefixed, so part boundaries cannot collide)."""
    h = hashlib.sha256()
    for part in parts:
        data = repr(part).encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


class JudgeStats:
    """Thread-safe named counters (calls, failures, seconds, tokens) for one judge."""

    def __init__(self) -> None:
        self._counts: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, **increments: float) -> None:
        """Add to counters, creating them at 0."""
        with self._lock:
            for key, value in increments.items():
                self._counts[key] = self._counts.get(key, 0) + value

    def snapshot(self) -> dict[str, float]:
        """A copy of the counters."""
        with self._lock:
            return dict(self._counts)


class BaseJudge:
    """Plumbing shared by the bundled judges: a name, a weight, counters, and the group loop.

    Subclasses implement :meth:`_score` (one completion, no timing); the base class times it, counts it and
    turns any exception into an ungradeable component (a judge bug must not stop training; the reason
    carries the exception).
    """

    name: str = "judge"
    weight: float = 1.0
    verifiable: bool = False
    """Whether the score is the env's own verifier's (the ``accuracy`` judge): see the module's rules."""
    score_bounds: tuple[float, float] = (0.0, 1.0)
    """The lowest and highest score the judge gives; a failed component counts at the bound that weighs least."""

    def __init__(self, name: str | None = None, weight: float = 1.0) -> None:
        if name is not None:
            self.name = name
        self.weight = float(weight)
        self._stats = JudgeStats()

    def _score(self, task: Task, completion: Completion, verdict: Verdict) -> tuple[float | None, str, bool]:
        """``(score, reason, cached)`` for one completion."""
        raise NotImplementedError(f"{type(self).__name__} must implement _score(task, completion, verdict).")

    def score(self, task: Task, completion: Completion, verdict: Verdict) -> Component:
        """Grade one completion; never raises for model output."""
        start = time.perf_counter()
        try:
            value, reason, cached = self._score(task, completion, verdict)
        except Exception as err:  # noqa: BLE001 - a judge failure becomes an ungradeable component
            value, reason, cached = None, f"{self.name} failed: {type(err).__name__}: {err}"[:500], False
        if value is not None and not _finite(value):
            value, reason = None, f"{self.name} gave a non-finite score ({value!r:.40}); {reason}"[:500]
        latency = time.perf_counter() - start
        self._stats.add(calls=1, seconds=latency, failures=int(value is None), cache_hits=int(cached))
        return Component(self.name, value, self.weight, latency, cached, reason)

    def score_group(
        self, task: Task, completions: Sequence[Completion], verdicts: Sequence[Verdict]
    ) -> list[Component]:
        """Grade each completion independently."""
        return [self.score(task, c, v) for c, v in zip(completions, verdicts, strict=True)]

    def stats(self) -> dict[str, float]:
        """Counters since creation: ``calls``, ``failures``, ``cache_hits``, ``seconds`` and judge-specific ones."""
        return self._stats.snapshot()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, weight={self.weight})"


class PairwiseAsJudge(BaseJudge):
    """Lets a pairwise judge stand alone as a :class:`~lrmgym.judges.base.Judge`.

    In a group, each completion's score is its mean outcome against every other completion (a round-robin
    win rate in [0, 1]). Alone (``step``), a completion has no opponent and is ungradeable. For adaptive
    routing and Bradley-Terry rewards, wrap the pairwise judge in ``judge=arena`` instead.
    """

    both_orders: bool = False

    def compare(self, task: Task, first: Completion, second: Completion) -> float | None:
        """The outcome of ``first`` against ``second`` (1, 0.5, 0), or ``None`` when the judge failed."""
        if self.both_orders:
            return both_orders(self._Once(self), task, first, second)[0]
        return self._compare_once(task, first, second)

    def _compare_once(self, task: Task, first: Completion, second: Completion) -> float | None:
        raise NotImplementedError(f"{type(self).__name__} must implement _compare_once(task, first, second).")

    class _Once:
        """A view of the judge that asks one order only (for :func:`both_orders`)."""

        def __init__(self, judge: PairwiseAsJudge) -> None:
            self.name, self._judge = judge.name, judge

        def compare(self, task: Task, first: Completion, second: Completion) -> float | None:
            return self._judge._compare_once(task, first, second)

    def _score(self, task: Task, completion: Completion, verdict: Verdict) -> tuple[float | None, str, bool]:
        return None, "a pairwise judge needs two completions of the task; use it on groups or inside judge=arena", False

    def score_group(
        self, task: Task, completions: Sequence[Completion], verdicts: Sequence[Verdict]
    ) -> list[Component]:
        """Each completion's round-robin win rate against the rest of its group."""
        if len(completions) < 2:
            return super().score_group(task, completions, verdicts)
        start = time.perf_counter()
        n = len(completions)
        totals, counts = [0.0] * n, [0] * n
        for i in range(n):
            for j in range(i + 1, n):
                y = self.compare(task, completions[i], completions[j])
                if y is None:
                    continue
                totals[i] += y
                totals[j] += 1.0 - y
                counts[i] += 1
                counts[j] += 1
        latency = (time.perf_counter() - start) / n
        out = []
        for i in range(n):
            if counts[i]:
                out.append(Component(self.name, totals[i] / counts[i], self.weight, latency, False,
                                     f"won {totals[i]:g} of {counts[i]} comparisons"))  # fmt: skip
            else:
                out.append(Component(self.name, None, self.weight, latency, False, "every comparison failed"))
        self._stats.add(calls=n, failures=sum(c == 0 for c in counts), seconds=latency * n)
        return out


# --------------------------------------------------------------------------------------------------- the wrapper
def _finite(value: Any) -> bool:
    try:
        return math.isfinite(value)
    except TypeError:
        return False


def _failed(component: Component) -> bool:
    return component.score is None or not _finite(component.score)


def _lowest(judge: Any, weight: float) -> float:
    """A failed component's share of the total: its judge's bound that weighs least (0 for a [0, 1] judge)."""
    low, high = getattr(judge, "score_bounds", (0.0, 1.0))
    return min(weight * low, weight * high)


def _combine(
    base: Verdict, components: Sequence[Component], format_ok: bool | None, judges: Sequence[Any] | None = None
) -> Verdict:
    """The judged verdict: the weighted sum of the components (see the module's rules for failed ones)."""
    judges = judges if judges is not None else [None] * len(components)
    failed = [k for k, c in enumerate(components) if _failed(c)]
    reason = "; ".join(f"{c.name}: {c.reason}" for c in components if c.reason)
    latency = base.latency_s + sum(c.latency_s for c in components)
    fields = dict(correct=base.correct, parsed=base.parsed, components=tuple(components), latency_s=latency)
    fields["format_ok"] = base.format_ok if format_ok is None else format_ok
    if not failed:
        total = sum(c.weight * c.score for c in components)  # type: ignore[operator]
        return Verdict(score=float(total), reason=reason, **fields)
    names = ", ".join(components[k].name for k in failed)
    verifiers = [k for k, j in enumerate(judges) if getattr(j, "verifiable", False)]
    graded = bool(verifiers) and not set(verifiers) & set(failed)
    if not graded or all(components[k].weight == 0 for k in verifiers):
        return Verdict(score=None, reason=f"ungradeable by {names}; {reason}", **fields)
    total = sum(
        _lowest(judges[k], c.weight) if k in failed else c.weight * c.score  # type: ignore[operator]
        for k, c in enumerate(components)
    )
    note = f"judge_failed: {names} (counted at the lowest score; the verifier graded this completion)"
    return Verdict(score=float(total), reason=f"{note}; {reason}", **fields)


def _failed_group(judge: Judge, n: int, err: Exception) -> list[Component]:
    """What a judge whose ``score_group`` raised (a bug: it must not) gives: ``n`` failed components."""
    why = f"{judge.name} failed: {type(err).__name__}: {err}"[:500]
    return [Component(judge.name, None, judge.weight, 0.0, False, why) for _ in range(n)]


def check_judges(judges: Judge | Sequence[Judge], weights: Sequence[float] | None = None) -> list[Judge]:
    """Validate a judge list (non-empty, Judge objects, unique names) and apply optional weights."""
    judges = [judges] if not isinstance(judges, Sequence) else list(judges)
    if not judges:
        raise ValueError("JudgedEnv needs at least one judge; for the env's own reward use the env itself.")
    bad = [type(j).__name__ for j in judges if not isinstance(j, Judge)]
    if bad:
        raise TypeError(
            f"JudgedEnv expects Judge objects (name, weight, score, score_group, stats); got {', '.join(bad)}."
        )
    names = [j.name for j in judges]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"Two judges share the name(s) {dupes}; give each a distinct name (name=...).")
    if weights is not None:
        if len(weights) != len(judges):
            raise ValueError(f"Got {len(weights)} weights for {len(judges)} judges; give one weight per judge.")
        for judge, w in zip(judges, weights, strict=True):
            judge.weight = float(w)
    return judges


def judge_group(
    judges: Sequence[Judge], task: Task, completions: Sequence[Completion], base: Sequence[Verdict]
) -> list[Verdict]:
    """Apply each judge to the whole group and combine: one judged verdict per completion.

    A judge whose ``score_group`` raises, or returns the wrong number of components, fails on the whole
    group (its components are ungradeable, with the error as their reason); it never raises into training.
    """
    per_judge = []  # [judge][completion]
    for judge in judges:
        try:
            comps = list(judge.score_group(task, completions, base))
            if len(comps) != len(completions):
                raise ValueError(f"score_group returned {len(comps)} components for {len(completions)} completions")
        except Exception as err:  # noqa: BLE001 - a judge bug becomes failed components, not a crash
            comps = _failed_group(judge, len(completions), err)
        per_judge.append(comps)
    out = []
    for k, (completion, verdict) in enumerate(zip(completions, base, strict=True)):
        components = [comps[k] for comps in per_judge]
        fmt = [j.format_ok(completion) for j in judges if hasattr(j, "format_ok")]
        out.append(_combine(verdict, components, all(fmt) if fmt else None, judges))
    return out


class JudgedEnv(gymnasium.Wrapper):
    """Any env with its reward replaced by a weighted composition of judges.

    Args:
        env: The env to wrap (its own verifier runs first; its verdict is what the judges see).
        judges: One judge or a list; each judge's ``weight`` attribute is its weight unless ``weights`` is given.
        weights: Optional weights overriding the judges' own.

    ``step`` and ``score_group`` both apply the judges; ``verify(task, completion)`` gives the judged
    verdict of one completion. ``info["verdict"]`` holds the judged verdict and ``info["env_verdict"]`` the
    env's own.

    Example:
        >>> from lrmgym.envs.echo import EchoEnv
        >>> from lrmgym.judges.rule import AccuracyJudge, LengthPenalty
        >>> length = LengthPenalty(max_length=10, free_length=0, unit="chars")
        >>> env = JudgedEnv(EchoEnv(words=1), [AccuracyJudge(), length])
        >>> _ = env.reset(seed=0)
        >>> _, reward, *_ = env.step(env.task.answer)  # a 5-letter word: accuracy 1, length -0.5
        >>> reward
        0.5
    """

    def __init__(
        self, env: gymnasium.Env, judges: Judge | Sequence[Judge], weights: Sequence[float] | None = None
    ) -> None:
        super().__init__(env)
        self.judges: list[Judge] = check_judges(judges, weights)
        self._samples = JudgeStats()  # judged samples, and those a judge failed on (pop_metrics)
        self.last_failure: str | None = None
        """``"<judge name>: <reason>"`` of the newest failed component, for a learner's error message."""

    # ---- the env's own API, forwarded (gymnasium 1.x wrappers do not forward attributes)
    @property
    def text_env(self) -> TextEnv:
        """The innermost text env."""
        return self.env.unwrapped  # type: ignore[return-value]

    @property
    def max_turns(self) -> int:
        """The wrapped env's policy turns per episode."""
        return getattr(self.env, "max_turns", 1)

    @property
    def task(self) -> Task | None:
        """The task of the current episode."""
        return self.text_env.task

    def task_at(self, index: int, seed: int | None = None) -> Task:
        """The env's task ``index`` (see :meth:`TextEnv.task_at`)."""
        return self.text_env.task_at(index, seed)

    # ---- judging
    def _judge(self, task: Task, completions: list[Completion], base: list[Verdict]) -> list[Verdict]:
        verdicts = judge_group(self.judges, task, completions, base)
        failed = [v for v in verdicts if any(_failed(c) for c in v.components)]
        for verdict in failed[-1:]:
            comp = next(c for c in reversed(verdict.components) if _failed(c))
            self.last_failure = f"{comp.name}: {comp.reason}"
        self._samples.add(
            samples=len(verdicts), judge_failed=len(failed), judge_ungradeable=sum(v.score is None for v in failed)
        )
        return verdicts

    def score_group(self, task: Task, completions: Sequence[Completion | str]) -> list[Verdict]:
        """Grade ``G`` completions of one task: the env's verifier, then each judge over the whole group."""
        completions = [Completion.coerce(c) for c in completions]
        base = self.env.score_group(task, completions)
        return self._judge(task, completions, list(base))

    def verify(self, task: Task, completion: Completion | str) -> Verdict:
        """The judged verdict of one completion (a group of one)."""
        return self.score_group(task, [completion])[0]

    def step(self, action: Completion | str) -> tuple[Prompt, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the env, then judge its verdict; the reward is the judged score (0.0 when ungradeable)."""
        completion = Completion.coerce(action)
        task = self.text_env.task
        obs, _, terminated, truncated, info = self.env.step(completion)
        base = info["verdict"]
        verdict = self._judge(task, [completion], [base])[0]
        info = {**info, "verdict": verdict, "env_verdict": base}
        reward = 0.0 if verdict.score is None else float(verdict.score)
        return obs, reward, terminated, truncated, info

    def judge_stats(self) -> dict[str, dict[str, float]]:
        """Each judge's lifetime counters, by name."""
        return {j.name: j.stats() for j in self.judges}

    def pop_metrics(self) -> dict[str, float | None]:
        """What the judges did since the last call, for a learner to log once per step.

        Keys are ``"<judge name>/<counter>"``: the change of every numeric counter of :meth:`judge_stats`
        (calls, failures, seconds, LLM retries and timeouts, ...) and, for judges that keep step metrics
        (the arena), their ``pop_metrics()`` (``arena/frac_routed``, ``arena/judge_calls``, ...). Three keys
        have no judge name: ``samples`` (completions judged), ``judge_failed`` (those on which at least one judge
        failed) and ``judge_ungradeable`` (those of them left ungradeable; the rest fell back to the verifier).
        """
        last = getattr(self, "_last_stats", {})
        samples = self._samples.snapshot()
        before = last.get("", {})
        out: dict[str, float | None] = {k: samples.get(k, 0) - before.get(k, 0)
                                        for k in ("samples", "judge_failed", "judge_ungradeable")}  # fmt: skip
        last[""] = samples
        for judge in self.judges:
            now = judge.stats()
            before = last.get(judge.name, {})
            out.update(
                {f"{judge.name}/{k}": v - before.get(k, 0) for k, v in now.items() if isinstance(v, (int, float))}
            )
            last[judge.name] = now
            pop = getattr(judge, "pop_metrics", None)
            if callable(pop):
                out.update({f"{judge.name}/{k}": v for k, v in pop().items()})
        self._last_stats = last
        return out


# --------------------------------------------------------------------------------------------------- configs
class JudgeConfigBase(BaseModel):
    """Fields every judge config has. Subclasses add ``kind: Literal[...]`` and their options."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    weight: float = 1.0
    """The judge's weight in the verdict's total (``sum(weight * score)``)."""
    name: str | None = None
    """The component's name in verdicts; defaults to the judge's kind (and mode). Must be unique per env."""

    def build(self) -> Judge:
        """Make the judge."""
        raise NotImplementedError(f"{type(self).__name__} must implement build().")
