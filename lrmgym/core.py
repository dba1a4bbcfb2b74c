"""The contract every lrmgym component shares: tasks, completions, verdicts, groups and the text env.

The one-line picture: a :class:`Task` is rendered into a prompt by a :class:`TextEnv`; a policy samples a
group of :class:`Completion` objects for it; the env (and any judges wrapped around it) turns each one into
a :class:`Verdict`; a learner turns the verdicts' scores into advantages.

This module imports only the standard library, numpy and gymnasium, so that everything else can import it
cheaply.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, SupportsFloat, runtime_checkable

import gymnasium
import numpy as np

__all__ = [
    "Component",
    "Completion",
    "Group",
    "LearnerEnv",
    "Message",
    "Prompt",
    "PromptSpace",
    "ResetNeeded",
    "Task",
    "TextEnv",
    "Turn",
    "Trajectory",
    "Verdict",
    "feedback_after",
    "learner_env",
    "task_rng",
]

Message = dict[str, str]
"""One chat message: ``{"role": "system" | "user" | "assistant", "content": "..."}``."""

Prompt = str | list[Message]
"""What a policy is asked: raw text, or chat messages for a chat template."""


# --------------------------------------------------------------------------------------------------- data types
@dataclass(frozen=True)
class Task:
    """One problem. Pure data: an env builds it from ``(seed, index)`` or a loader reads it from a file.

    Attributes:
        id: Stable identifier built from the source and the index (``"gsm8k/test/17"``, ``"math/gen/3/9f2c"``).
        prompt: What the policy sees: text or chat messages.
        answer: The reference answer. Never shown to the policy; only verifiers read it.
        metadata: Provenance and anything the verifier needs: ``source``, ``split``, ``difficulty``, unit tests.
    """

    id: str
    prompt: Prompt
    answer: Any = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def difficulty(self) -> Any:
        """The difficulty label recorded by the task's source, or ``None``."""
        return self.metadata.get("difficulty")


@dataclass
class Completion:
    """One sampled answer and what the sampler knew about it.

    Attributes:
        text: The decoded text of the completion (prompt excluded).
        token_ids: The sampled token ids, when the policy exposes them.
        logprobs: The sampler's log-probability of each sampled token (same length as ``token_ids``).
            Learners use them as the behaviour policy's log-probs (PPO ratios, Ring-Zero's clipped IS).
        finish_reason: ``"stop"`` (EOS or a stop string) or ``"length"`` (hit the token budget).
        prompt_token_ids: The prompt's token ids as the policy encoded them, when known.
    """

    text: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: Literal["stop", "length"] | None = None
    prompt_token_ids: list[int] | None = None

    @classmethod
    def coerce(cls, value: Completion | str) -> Completion:
        """Accept a bare string where a completion is expected."""
        if isinstance(value, Completion):
            return value
        if isinstance(value, str):
            return cls(text=value)
        raise TypeError(
            f"Expected a Completion or a str, got {type(value).__name__}: {value!r:.80}. "
            "Wrap raw model output as Completion(text=...)."
        )


@dataclass(frozen=True)
class Component:
    """One named part of a reward, as recorded in a :class:`Verdict`.

    Attributes:
        name: The judge or verifier that produced it (``"accuracy"``, ``"format_strict"``, ``"arena"``).
        score: Its score, or ``None`` when it could not grade.
        weight: Its weight in the verdict's total.
        latency_s: Wall-clock seconds it took.
        cached: Whether the score came from a cache.
        reason: A short human-readable explanation.
        raw_score: The judge's own unnormalised score behind ``score``, when it has one (the arena's
            Bradley-Terry strength, before the group's min-max normalisation); ``None`` otherwise.
    """

    name: str
    score: float | None
    weight: float = 1.0
    latency_s: float = 0.0
    cached: bool = False
    reason: str = ""
    raw_score: float | None = None


@dataclass(frozen=True)
class Verdict:
    """The graded outcome of one completion. Every reward a learner sees can be traced to one.

    ``score is None`` means *ungradeable*, and only for a failure that is ours, never the completion's: the
    reference could not be parsed, the sandbox or verifier could not start, a judge's endpoint failed.
    Learners mask ungradeable samples out instead of scoring them 0, so a completion that makes the checker
    time out, crash or run out of memory scores 0 (with the reason): masking it would pay the policy for
    opting out of being wrong.

    Attributes:
        score: The reward, or ``None`` when ungradeable.
        correct: Whether the answer is right; ``None`` when that is unknown or not a yes/no question.
        parsed: What the verifier extracted from the completion (the answer string, the code), if anything.
        reason: A short explanation: ``"correct"``, ``"format: no <answer> tag"``, ``"timeout after 2.0 s"``.
        components: Per-judge parts of the score, in the order they were applied.
        latency_s: Total wall-clock seconds spent grading.
        format_ok: Whether the completion had the requested answer format; ``None`` when not checked.
    """

    score: float | None
    correct: bool | None = None
    parsed: Any = None
    reason: str = ""
    components: tuple[Component, ...] = ()
    latency_s: float = 0.0
    format_ok: bool | None = None

    def __post_init__(self) -> None:
        if self.score is not None and not math.isfinite(self.score):
            raise ValueError(f"Verdict.score must be finite or None (ungradeable), got {self.score!r}.")

    @property
    def gradeable(self) -> bool:
        """``False`` when the score is ``None``."""
        return self.score is not None

    @classmethod
    def ungradeable(cls, reason: str, **fields: Any) -> Verdict:
        """A verdict that learners must mask out (timeout, crash, unparseable reference)."""
        return cls(score=None, correct=None, reason=reason, **fields)

    def replace(self, **changes: Any) -> Verdict:
        """A copy with some fields changed (verdicts are immutable)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``parsed`` is stringified when it is not a JSON scalar)."""
        out = dataclasses.asdict(self)
        if out["parsed"] is not None and not isinstance(out["parsed"], (str, int, float, bool)):
            out["parsed"] = str(out["parsed"])
        return out


@dataclass
class Turn:
    """One turn of a multi-turn trajectory: the policy's completion or the env's reply.

    Attributes:
        role: ``"policy"`` for sampled text (trained on) or ``"env"`` for feedback (masked out of the loss).
        text: The turn's text.
        completion: For policy turns, the sampled completion with its token ids and log-probs.
    """

    role: Literal["policy", "env"]
    text: str
    completion: Completion | None = None


@dataclass
class Trajectory:
    """A whole episode: the prompt, the alternating turns, and the final verdict that rewards every policy turn."""

    task: Task
    turns: list[Turn] = field(default_factory=list)
    verdict: Verdict | None = None

    @property
    def reward(self) -> float | None:
        """The trajectory's reward (the final verdict's score); ``None`` if unfinished or ungradeable."""
        return None if self.verdict is None else self.verdict.score

    @property
    def policy_turns(self) -> list[Turn]:
        """The turns the policy wrote, in order."""
        return [t for t in self.turns if t.role == "policy"]


@dataclass
class Group:
    """One task with its G completions and their verdicts: the unit of group advantages and of the arena."""

    task: Task
    completions: list[Completion]
    verdicts: list[Verdict]

    def __post_init__(self) -> None:
        if len(self.completions) != len(self.verdicts):
            raise ValueError(
                f"Group for task {self.task.id!r} has {len(self.completions)} completions but "
                f"{len(self.verdicts)} verdicts; score_group must return one verdict per completion."
            )

    @property
    def scores(self) -> list[float | None]:
        """Each completion's score; ``None`` where ungradeable."""
        return [v.score for v in self.verdicts]

    @property
    def zero_variance(self) -> bool:
        """True when all gradeable scores are equal (no GRPO signal); also true when fewer than 2 are gradeable."""
        graded = [s for s in self.scores if s is not None]
        return len(graded) < 2 or max(graded) - min(graded) == 0.0


# --------------------------------------------------------------------------------------------------- seeding
def task_rng(seed: int, index: int, *extra: int) -> np.random.Generator:
    """The random generator for task ``index`` of the stream ``seed``: a pure function of its arguments.

    Uses :class:`numpy.random.SeedSequence` over the tuple, never ``seed + index``, so that adjacent seeds
    give unrelated streams (``(42, 1)`` and ``(43, 0)`` collide under addition; they do not here).
    ``extra`` mixes in further integers (for example a split tag).
    """
    if seed < 0 or index < 0 or any(e < 0 for e in extra):
        raise ValueError(f"seed and index must be non-negative integers, got seed={seed}, index={index}, {extra}.")
    return np.random.default_rng(np.random.SeedSequence([seed, index, *extra]))


class PromptSpace(gymnasium.spaces.Space):
    """The observation and action space of text envs: a string, or a list of chat messages.

    Gymnasium's ``Text`` space is charset-based (it samples random characters and checks each one against a
    charset), which does not fit multi-kilobyte UTF-8 completions; this space checks type and length only.
    ``sample()`` returns an empty string: random text is not a meaningful action. Use the mock policies in
    :mod:`lrmgym.testing` for that.
    """

    def __init__(self, max_length: int = 1 << 20) -> None:
        super().__init__(shape=None, dtype=None)
        self.max_length = max_length

    def contains(self, x: Any) -> bool:
        """True for a string or :class:`Completion` of at most ``max_length`` characters, or a list of messages."""
        if isinstance(x, str):
            return len(x) <= self.max_length
        if isinstance(x, Completion):
            return len(x.text) <= self.max_length
        if isinstance(x, list):
            return all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in x)
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """The empty string: random text is not a meaningful action (``mask`` and ``probability`` are ignored)."""
        return ""

    @property
    def is_np_flattenable(self) -> bool:
        """False: text cannot be flattened into a numpy array."""
        return False

    def __repr__(self) -> str:
        return f"PromptSpace(max_length={self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PromptSpace) and other.max_length == self.max_length


class ResetNeeded(RuntimeError):
    """Raised by :meth:`TextEnv.step` before the first reset or after the episode ended."""


# --------------------------------------------------------------------------------------------------- the env
class TextEnv(gymnasium.Env):
    """Base class of lrmgym environments: text in, text out, a :class:`Verdict` per answer.

    Subclasses implement two methods:

    - :meth:`make_task` builds task ``index`` from a seeded generator; it must be a pure function of its
      arguments (no hidden state), so a task is reproducible from ``(seed, index)``.
    - :meth:`verify` grades one completion's text against the task.

    Multi-turn envs also override :meth:`feedback` and set ``max_turns`` > 1.

    Seeding contract:
        ``reset(seed=s)`` starts the task stream ``s`` at index 0; each later ``reset()`` without options moves
        to the next index. ``reset()`` before any seed draws a stream seed from gymnasium's ``np_random``.
        ``reset(options={"index": i})`` pins task ``i`` of the current stream (the stream position does not
        move), and ``reset(options={"task": task})`` pins a given :class:`Task`. So the G samples of one
        prompt are G resets with the same ``index``.

    Step contract:
        ``step(action)`` takes the completion (a ``str`` or a :class:`Completion`) and returns
        ``(observation, reward, terminated, truncated, info)``. ``info["verdict"]`` holds the verdict;
        ``reward`` is its score, or 0.0 when the verdict is ungradeable (check ``verdict.score is None``,
        learners mask those). Single-turn envs terminate after one step. Multi-turn envs return feedback as
        the next observation until the answer is correct (terminated), there is no feedback to give
        (terminated), or ``max_turns`` is used up (truncated). Stepping after the end raises
        :class:`ResetNeeded`.

    Configuration:
        Each env declares a pydantic model ``Config``; keyword arguments to the constructor (and so to
        ``lrmgym.make(id, **kwargs)``) are validated against it and stored as ``self.config``.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    Config: ClassVar[type | None] = None
    """Pydantic model of the env's options; ``None`` means the env takes no options."""

    max_turns: int = 1
    """How many policy turns an episode may have. 1 for single-turn envs."""

    def __init__(self, **kwargs: Any) -> None:
        self.config = self._validate_config(kwargs)
        self.observation_space = PromptSpace()
        self.action_space = PromptSpace()
        self._stream_seed: int | None = None
        self._next_index = 0
        self._task: Task | None = None
        self._turn = 0
        self._done = True

    def _validate_config(self, kwargs: dict[str, Any]) -> Any:
        if self.Config is None:
            if kwargs:
                raise TypeError(
                    f"{type(self).__name__} takes no options, got {sorted(kwargs)}. Remove them from the env config."
                )
            return None
        # A pydantic model that neither forbids nor allows extra keys drops them silently: refuse them here.
        fields = getattr(self.Config, "model_fields", None)
        extra = getattr(self.Config, "model_config", {}).get("extra")
        if isinstance(fields, dict) and extra not in ("allow", "forbid"):
            known = set(fields) | {f.alias for f in fields.values() if getattr(f, "alias", None)}
            unknown = sorted(k for k in kwargs if k not in known)
            if unknown:
                raise TypeError(
                    f"{type(self).__name__} has no option {', '.join(map(repr, unknown))}; its options are "
                    f"{', '.join(sorted(fields)) or 'none'}. Remove or rename it."
                )
        return self.Config(**kwargs)

    # ---- to implement
    def make_task(self, index: int, rng: np.random.Generator) -> Task:
        """Build task ``index``; ``rng`` is seeded from ``(stream seed, index)``. Must be pure."""
        raise NotImplementedError(f"{type(self).__name__} must implement make_task(index, rng).")

    def verify(self, task: Task, completion: Completion) -> Verdict:
        """Grade one completion of ``task``. Must not raise for any model output: return a verdict."""
        raise NotImplementedError(f"{type(self).__name__} must implement verify(task, completion).")

    def feedback(self, task: Task, completion: Completion, verdict: Verdict, turn: int) -> str | None:
        """The env's reply after policy turn ``turn`` (1-based) of a multi-turn episode, or ``None`` to end it."""
        return None

    # ---- provided
    @property
    def stream_seed(self) -> int | None:
        """The seed of the current task stream (``None`` before the first reset)."""
        return self._stream_seed

    @property
    def task(self) -> Task | None:
        """The task of the current episode."""
        return self._task

    def task_at(self, index: int, seed: int | None = None) -> Task:
        """Task ``index`` of stream ``seed`` (default: the current stream), without touching the episode."""
        seed = self._ensure_stream_seed() if seed is None else seed
        if not isinstance(index, (int, np.integer)) or isinstance(index, bool) or index < 0:
            raise ValueError(f"Task index must be a non-negative integer, got {index!r}.")
        return self.make_task(int(index), task_rng(seed, int(index)))

    def _ensure_stream_seed(self) -> int:
        if self._stream_seed is None:
            self._stream_seed = int(self.np_random.integers(0, 2**31 - 1))
        return self._stream_seed

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Prompt, dict]:
        """Start an episode; see the class docstring for the seeding contract."""
        super().reset(seed=seed)
        if seed is not None:
            if not isinstance(seed, (int, np.integer)) or seed < 0:
                raise ValueError(f"reset(seed=...) must be a non-negative integer, got {seed!r}.")
            self._stream_seed = int(seed)
            self._next_index = 0
        self._ensure_stream_seed()
        options = dict(options or {})
        unknown = set(options) - {"index", "task"}
        if unknown:
            raise ValueError(
                f"Unknown reset option(s) {sorted(unknown)}; allowed: 'index' (pin task i of the stream) "
                "or 'task' (pin a Task object)."
            )
        if "task" in options and "index" in options:
            raise ValueError("reset options 'task' and 'index' are exclusive: pass one of them.")
        if "task" in options:
            task = options["task"]
            if not isinstance(task, Task):
                raise TypeError(f"reset(options={{'task': ...}}) expects a lrmgym.Task, got {type(task).__name__}.")
            index = None
        elif "index" in options:
            index = options["index"]
            task = self.task_at(index)
        else:
            index = self._next_index
            task = self.task_at(index)
            self._next_index += 1
        self._task, self._turn, self._done = task, 0, False
        return task.prompt, {"task": task, "task_id": task.id, "index": index, "stream_seed": self._stream_seed}

    def step(self, action: Completion | str) -> tuple[Prompt, SupportsFloat, bool, bool, dict[str, Any]]:
        """Grade the completion; see the class docstring for the step contract."""
        if self._task is None:
            raise ResetNeeded(f"Cannot call {type(self).__name__}.step() before reset(). Call env.reset() first.")
        if self._done:
            raise ResetNeeded(
                f"Cannot call {type(self).__name__}.step() after the episode ended (terminated or truncated). "
                "Call env.reset() to start a new episode."
            )
        completion = Completion.coerce(action)
        self._turn += 1
        start = time.perf_counter()
        verdict = self.verify(self._task, completion)
        if not verdict.latency_s:
            verdict = verdict.replace(latency_s=time.perf_counter() - start)
        terminated, truncated, obs = True, False, ""
        if self.max_turns > 1:
            reply = feedback_after(self, self._task, completion, verdict, self._turn)
            if reply is not None:
                obs = reply
                terminated = False
                truncated = self._turn >= self.max_turns
        self._done = terminated or truncated
        reward = 0.0 if verdict.score is None else float(verdict.score)
        info = {"verdict": verdict, "task_id": self._task.id, "turn": self._turn}
        return obs, reward, terminated, truncated, info

    def score_group(self, task: Task, completions: Sequence[Completion | str]) -> list[Verdict]:
        """Grade G completions of one task, one verdict each, in order.

        The default verifies each completion independently. Group-aware judges (the arena) override this;
        learners always call it rather than :meth:`verify`.
        """
        verdicts = []
        for c in completions:
            start = time.perf_counter()
            v = self.verify(task, Completion.coerce(c))
            if not v.latency_s:
                v = v.replace(latency_s=time.perf_counter() - start)
            verdicts.append(v)
        return verdicts

    def describe(self) -> dict[str, Any]:
        """A short description for ``lrmgym envs show``: the docstring's first line, options, turns."""
        doc = (type(self).__doc__ or "").strip().splitlines()
        return {
            "class": f"{type(self).__module__}.{type(self).__qualname__}",
            "summary": doc[0] if doc else "",
            "max_turns": self.max_turns,
            "config": None if self.config is None else self.config.model_dump(mode="json"),
        }


# ------------------------------------------------------------------------------------------ the learner contract
@runtime_checkable
class LearnerEnv(Protocol):
    """What a learner, ``lrmgym eval`` and the episode driver (:mod:`lrmgym.episodes`) use of an env.

    :class:`TextEnv` satisfies it, and so does a judge wrapper around one (:func:`learner_env` resolves members
    a gymnasium wrapper does not forward).
    """

    max_turns: int
    """Policy turns per episode (1: single-turn)."""

    def task_at(self, index: int, seed: int | None = None) -> Task:
        """Task ``index`` of the stream ``seed``."""
        ...

    def score_group(self, task: Task, completions: Sequence[Completion | str]) -> list[Verdict]:
        """One verdict per completion of ``task``, in order."""
        ...

    def feedback(self, task: Task, completion: Completion, verdict: Verdict, turn: int) -> str | None:
        """The next observation after a not-correct turn, or ``None`` to end the episode."""
        ...


class _ResolvedEnv:
    """An env's learner members taken from it or, where a wrapper does not forward one, from ``env.unwrapped``."""

    def __init__(self, env: Any) -> None:
        base = getattr(env, "unwrapped", env)
        self.env = env
        for name in ("task_at", "score_group", "feedback"):
            member = getattr(env, name, None) or getattr(base, name, None)
            if not callable(member):
                raise TypeError(
                    f"{type(env).__name__} is not a learner env: it has no {name}() (nor has its unwrapped env "
                    f"{type(base).__name__}). Subclass lrmgym.TextEnv, or give it task_at, score_group and feedback."
                )
            setattr(self, name, member)
        turns = getattr(env, "max_turns", None)
        self.max_turns = int((turns if turns is not None else getattr(base, "max_turns", 1)) or 1)


def learner_env(env: Any) -> LearnerEnv:
    """``env`` as a :class:`LearnerEnv` (itself when it is one; else its members resolved through wrappers).

    Raises:
        TypeError: ``env`` lacks a member, with the member's name and how to add it.
    """
    if isinstance(env, LearnerEnv):
        return env
    return _ResolvedEnv(env)  # type: ignore[return-value]


def feedback_after(env: Any, task: Task, completion: Completion, verdict: Verdict, turn: int) -> str | None:
    """The episode rule every driver applies after a policy turn: the env's feedback, or ``None`` (the end).

    A correct answer ends the episode; otherwise the env's ``feedback`` is the next observation, and ``None``
    from it ends the episode too. (The caller stops once ``max_turns`` is used up.)
    """
    if verdict.correct is True:
        return None
    return env.feedback(task, completion, verdict, turn)
