"""``lrmgym/Testbed-v0``: chained arithmetic built so that the seed methods' claims can show, or fail, on a CPU.

The default ``env=math`` is a poor place to test a reasoning-RL idea at toy scale: almost no GRPO group is
all-wrong at the start, most samples are exactly the reference length, and the model's uncertain tokens are
result digits, not choices. This family fixes each of those by construction:

- **Variable length, and reasoning that pays.** ``Compute 7+5-3+12.`` chains ``min_ops``..``max_ops`` additions
  and subtractions (left to right, never negative). The stepwise solution writes one operation per step
  (``7+5=12;12-3=9;9+12=21``), so its length grows with the chain; the direct solution writes the whole chain
  and its result at once (``7+5-3+12=21``), which a small model gets wrong far more often.
- **A problem-independent fork.** The two styles start with different words, ``Let`` (stepwise) and ``So``
  (direct), drawn per task with probability ``stepwise_share`` independently of the problem: the first token
  after ``<think>`` is a real choice with a real consequence for accuracy.
- **Re-checks that make a solution longer and correct errors.** With probability ``recheck_share`` a stepwise
  solution checks some steps by the inverse operation (``12-3=9;chk 9+3=12 ok``); with probability
  ``slip_share`` a checked step was first written wrong, and its check catches and redoes it
  (``12-3=8;chk 8+3=11 no;12-3=9``).
- **Difficulty knobs** (``min_ops``, ``max_ops``, ``two_digit_share``) set how many problems a partly trained
  model never solves, i.e. the share of all-wrong GRPO groups.

Grading is the math env's own (:class:`~lrmgym.envs.math.env.MathEnv`: strict answer extraction in the
template, then :func:`lrmgym.envs.math.verify.verify_answer` in the plain-number form), so reward integrity
(answer forms, one value per answer, bounded checks) is the same as ``env=math``'s. ``lrmgym tiny build
--recipe testbed`` trains the tiny model on this family's worked solutions (``Task.metadata["solution"]``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from lrmgym.core import Task, TextEnv
from lrmgym.envs.math.env import MathEnv
from lrmgym.envs.math.generator import split_of
from lrmgym.envs.math.templates import render_prompt, render_solution

__all__ = ["STYLES", "Chain", "TestbedConfig", "TestbedEnv", "chain_solution", "sample_chain"]

STYLES: dict[str, str] = {"stepwise": "Let", "direct": "So"}
"""Solution style -> the word it starts with (after ``<think>``): the fork token is its first character."""


class TestbedConfig(BaseModel):
    """Options of the testbed family (defaults: the mixture ``lrmgym tiny build --recipe testbed`` trains on)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)
    __test__: ClassVar[bool] = False  # not a pytest test class, whatever its name

    split: Literal["train", "test"] = "train"
    """'train' or 'test': a hash partition of the problems (1 in 10 is test), as the math env's generator."""
    min_ops: int = Field(1, ge=1, le=12)
    """Fewest operations in a chain."""
    max_ops: int = Field(8, ge=1, le=12)
    """Most operations in a chain (each chain's count is uniform in min_ops..max_ops)."""
    two_digit_share: float = Field(0.5, ge=0.0, le=1.0)
    """Probability that an operand is 10-99 rather than 1-9."""
    stepwise_share: float = Field(0.5, ge=0.0, le=1.0)
    """Probability that a task's worked solution is stepwise ('Let ...') rather than direct ('So ...')."""
    recheck_share: float = Field(0.0, ge=0.0, le=1.0)
    """Probability that a stepwise solution checks some of its steps ('chk ...'), each with probability 1/2."""
    slip_share: float = Field(0.3, ge=0.0, le=1.0)
    """Probability that a checked step was first written wrong (off by 1-3), then caught by its check and redone."""
    template: Literal["plain", "boxed", "r1"] = "r1"
    """Answer format asked for and checked (as the math env's)."""
    style: Literal["compact", "instruct"] = "compact"
    """Prompt style (as the math env's): 'compact' ('Q:... A:') for the tiny model."""
    chat: bool = False
    """Give prompts as chat messages."""
    strict: bool = True
    """Require exactly one answer in exactly the requested format (as the math env's)."""
    max_turns: int = Field(1, ge=1, le=5)
    """Policy turns per episode; above 1 a wrong answer gets the math env's feedback and another try."""
    timeout_s: float = Field(2.0, gt=0, le=60)
    """Hard wall-clock bound of one answer check, in seconds."""
    max_answer_chars: int = Field(1000, ge=1, le=100_000)
    """Extracted answers longer than this are incorrect without being parsed."""
    num_problems: int | None = Field(None, ge=1)
    """A finite training set: on the train split, task i of a stream is task i mod num_problems, so each prompt
    recurs every num_problems positions (what a cross-step per-prompt pool, e.g. judge.arena.pool=prompt, needs).
    The test split stays unbounded (a held-out evaluation, which rebuilds the env with split=test, never counts a
    problem twice). None: every position draws a new problem."""

    @model_validator(mode="after")
    def _check_ops(self) -> TestbedConfig:
        if self.min_ops > self.max_ops:
            raise ValueError(
                f"min_ops ({self.min_ops}) must be <= max_ops ({self.max_ops}); raise max_ops or lower min_ops"
            )
        return self


@dataclass(frozen=True)
class Chain:
    """One chained problem: ``numbers[0] ops[0] numbers[1] ...`` evaluated left to right."""

    numbers: tuple[int, ...]
    ops: tuple[str, ...]

    @property
    def expression(self) -> str:
        """``7+5-3``."""
        return str(self.numbers[0]) + "".join(f"{o}{n}" for o, n in zip(self.ops, self.numbers[1:], strict=True))

    @property
    def partials(self) -> tuple[int, ...]:
        """The running value after each operation (the last is the answer)."""
        values, acc = [], self.numbers[0]
        for op, n in zip(self.ops, self.numbers[1:], strict=True):
            acc = acc + n if op == "+" else acc - n
            values.append(acc)
        return tuple(values)

    @property
    def answer(self) -> int:
        """The chain's value."""
        return self.partials[-1]


def _operand(rng: np.random.Generator, two_digit_share: float) -> int:
    return int(rng.integers(10, 100)) if rng.random() < two_digit_share else int(rng.integers(1, 10))


def sample_chain(config: TestbedConfig, rng: np.random.Generator, max_tries: int = 10_000) -> Chain:
    """A chain of ``config``'s sizes in its split; a subtraction that would go negative becomes an addition."""
    for _ in range(max_tries):
        n_ops = int(rng.integers(config.min_ops, config.max_ops + 1))
        numbers = [_operand(rng, config.two_digit_share) for _ in range(n_ops + 1)]
        ops, acc = [], numbers[0]
        for n in numbers[1:]:
            op = "-" if rng.random() < 0.5 and acc >= n else "+"
            acc = acc + n if op == "+" else acc - n
            ops.append(op)
        chain = Chain(tuple(numbers), tuple(ops))
        if split_of(f"testbed|{chain.expression}") == config.split:
            return chain
    raise RuntimeError(f"No chain of split {config.split!r} in {max_tries} draws.")


def _step(a: int, op: str, b: int, result: int) -> str:
    return f"{a}{op}{b}={result}"


def _check(a: int, op: str, b: int, written: int) -> str:
    """The inverse operation from the written result back to ``a``: ``chk 9+3=12 ok`` or ``chk 8+3=11 no``."""
    inverse = "-" if op == "+" else "+"
    back = written - b if op == "+" else written + b
    return f"chk {written}{inverse}{b}={back} {'ok' if back == a else 'no'}"


def chain_solution(
    chain: Chain, style: str, template: str = "r1", checks: tuple[bool, ...] = (), slips: tuple[int, ...] = ()
) -> str:
    """The worked solution of ``chain`` in ``style`` (:data:`STYLES`) and ``template``.

    Args:
        chain: The problem.
        style: ``"stepwise"`` (one operation per step) or ``"direct"`` (the whole chain at once).
        template: The answer template (``r1``, ``boxed``, ``plain``).
        checks: Stepwise only: per operation, whether its step is re-checked by the inverse operation.
        slips: Stepwise only: per operation, how far off the first written result of a checked step is (0: right);
            the check then reads ``no`` and the step is written again, right.
    """
    if style not in STYLES:
        raise ValueError(f"Unknown solution style {style!r}; expected one of {', '.join(STYLES)}.")
    answer = str(chain.answer)
    if style == "direct":
        return render_solution([f"{STYLES[style]} {chain.expression}={answer}"], answer, template)
    parts, acc = [], chain.numbers[0]
    for i, (op, b, result) in enumerate(zip(chain.ops, chain.numbers[1:], chain.partials, strict=True)):
        checked = i < len(checks) and checks[i]
        slip = slips[i] if checked and i < len(slips) else 0
        if slip and result + slip >= 0:
            parts += [_step(acc, op, b, result + slip), _check(acc, op, b, result + slip)]
        parts.append(_step(acc, op, b, result))
        if checked:
            parts.append(_check(acc, op, b, result))
        acc = result
    parts[0] = f"{STYLES[style]} {parts[0]}"
    return render_solution(parts, answer, template)


class TestbedEnv(MathEnv):
    """Chained addition and subtraction with stepwise / direct worked solutions, graded as the math env grades.

    See the module docstring for what each option controls. Tasks carry ``metadata["solution"]`` (the worked
    solution in its drawn style), ``metadata["solution_style"]``, ``metadata["ops"]`` (the chain's operation
    count) and ``metadata["checks"]`` (re-checked steps).
    """

    Config = TestbedConfig  # type: ignore[assignment]
    __test__: ClassVar[bool] = False  # not a pytest test class, whatever its name

    @classmethod
    def preflight(cls, config: Any) -> None:
        """Nothing to read ahead: the family is generated."""

    def __init__(self, **kwargs: Any) -> None:
        TextEnv.__init__(self, **kwargs)  # the config only: MathEnv's would look for a data set
        self.max_turns = self.config.max_turns
        self._items = None

    def task_at(self, index: int, seed: int | None = None) -> Task:
        """Task ``index`` of stream ``seed``; on the train split with ``num_problems``, task ``index mod n``."""
        n = self.config.num_problems if self.config.split == "train" else None
        if n is not None and isinstance(index, (int, np.integer)) and not isinstance(index, bool) and index >= 0:
            index = int(index) % n
        return super().task_at(index, seed)

    def make_task(self, index: int, rng: np.random.Generator) -> Task:
        """Task ``index``: a chain, then (independently of it) its solution's style, re-checks and slips."""
        cfg: TestbedConfig = self.config
        chain = sample_chain(cfg, rng)
        style = "stepwise" if rng.random() < cfg.stepwise_share else "direct"
        n = len(chain.ops)
        checked = style == "stepwise" and rng.random() < cfg.recheck_share
        checks = tuple(bool(c) for c in rng.random(n) < 0.5) if checked else ()
        slips = tuple(int(rng.integers(1, 4)) if rng.random() < cfg.slip_share else 0 for _ in range(n))
        question = f"Compute {chain.expression}."
        digest = hashlib.sha256(chain.expression.encode()).hexdigest()[:12]
        return Task(
            id=f"testbed/{cfg.split}/{digest}",
            prompt=render_prompt(question, template=cfg.template, style=cfg.style, chat=cfg.chat),
            answer=str(chain.answer),
            metadata={
                "source": "testbed",
                "split": cfg.split,
                "question": question,
                "answer_form": "number",
                "ops": n,
                "difficulty": n,
                "solution_style": style,
                "checks": sum(checks),
                "solution": chain_solution(chain, style, cfg.template, checks, slips if checked else ()),
                "template": cfg.template,
                "index": index,
            },
        )

    def solution(self, task: Task, template: str | None = None) -> str:
        """The task's worked solution (its drawn style) in the env's template; ``template`` must be the env's."""
        if template not in (None, self.config.template):
            raise ValueError(
                f"The testbed's solutions are written in its own template {self.config.template!r}, got "
                f"{template!r}; set env.template={template!r} instead."
            )
        return str(task.metadata["solution"])
