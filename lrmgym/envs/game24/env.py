"""``lrmgym/Game24-v0``: make 24 from four numbers with + - * / and parentheses (``env=game24``).

Training on math and evaluating here is the out-of-distribution probe: the arithmetic is easy, the search is
not. The same instance serves two modes:

- ``single``: one expression per task, graded exactly (:mod:`lrmgym.envs.game24.checker`).
- ``steps``: a multi-turn episode; each turn adds one step that combines two of the numbers left
  (``8 / 3 = 8/3``), the env checks the arithmetic and the operands exactly, replies with the numbers left, and
  the episode is solved when a single 24 remains. An illegal step gets a clear message and a configurable
  penalty. Each answer restates the earlier steps (``8 / 3 = 8/3; 3 - (8/3) = 1/3``) and is replayed from the
  puzzle's numbers, so grading needs no episode state (see :class:`Game24Env`).

Two splits: ``train`` draws puzzles from a seeded generator over every distinct four-number puzzle of a range
(labelled by the solver: number of distinct solutions, need for fractions; difficulty ``easy``/``medium``/``hard``/
``unsolvable``); ``test`` serves the 1 362 ToT puzzles (``24.csv``) in rank order, labelled by their human
solve-time rank (difficulty = rank bucket of 100, see :data:`RANK_BUCKET`; both splits also carry the solver labels).

Note: the 1 362 puzzles of 24.csv are exactly the solvable puzzles over 1..13, so the default train split (1..13)
generates only test puzzles. For a train-then-test experiment set ``held_out_ranks`` (e.g. ``[901, 1000]``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from lrmgym.core import Completion, Component, Prompt, Task, TextEnv, Verdict
from lrmgym.envs.game24.checker import (
    MAX_EXPR_CHARS,
    NO_SOLUTION_ANSWERS,
    CheckError,
    apply_step,
    check_answer,
    parse_step,
)
from lrmgym.envs.game24.data import HeldOutPuzzle, PuzzlePool, load_held_out, puzzle_pool, sample_puzzle
from lrmgym.envs.game24.prompts import feedback_text, prompt_text
from lrmgym.envs.game24.solver import TARGET, analyse, format_number, solutions
from lrmgym.envs.math.extract import extract_answer

__all__ = ["Game24Config", "Game24Env"]

DEFAULT_MIN_NUMBER, DEFAULT_MAX_NUMBER = 1, 13
DEFAULT_UNSOLVABLE_RATIO = 0.25
DEFAULT_STEP_PENALTY = 0.1
DEFAULT_STEP_TURNS = 6
MAX_STEPS_PER_ANSWER = 8
RANK_BUCKET = 100
"""Test-split difficulty: the human solve-time rank in buckets of 100 (1 = ranks 1-100, 10 = ranks 901-1000, ToT's
test range, 14 = ranks 1301-1362), so that results by difficulty have 14 rows, not 1 362. ``metadata['rank']``
keeps the exact rank."""
_STEP_SPLIT = re.compile(r"[;\n]")


class Game24Config(BaseModel):
    """Options of the Game24 env. Options that only apply to one mode or split default to ``None``."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    mode: Literal["single", "steps"] = "single"
    """'single': one expression per task; 'steps': a multi-turn episode, each answer restating the steps so far
    and adding one such as '8 / 3 = 8/3' (the env replays them and replies with the numbers left)."""
    split: Literal["train", "test"] = "train"
    """'train': seeded generator; 'test': the 1 362 ToT puzzles of 24.csv in rank order (held out)."""
    style: Literal["compact", "instruct"] = "instruct"
    """'compact': very short prompts ('Q:24 from 4 7 8 8. A:') for the tiny model; 'instruct': full rules for LLMs."""
    template: Literal["r1", "boxed", "plain"] = "r1"
    """Answer format asked for and checked strictly, as in the math env: 'r1' (<think>…</think><answer>…</answer>),
    'boxed' (one \\boxed{…}) or 'plain' (a last line 'Answer: …'). A missing or doubled answer is a format failure."""
    chat: bool = False
    """Give prompts as chat messages ([{'role': 'user', ...}]) instead of raw text (feedback stays text)."""
    order: Literal["sequential", "random"] | None = None
    """Test split only: task i is puzzle i mod N by rank ('sequential', the default, for evaluation over the whole
    set) or a random puzzle of the stream ('random')."""
    allow_unsolvable: bool = False
    """Train split only: also generate unsolvable puzzles, whose right answer is 'no solution'."""
    unsolvable_ratio: float | None = Field(None, ge=0.0, le=1.0)
    """With allow_unsolvable: the share of unsolvable puzzles (default 0.25)."""
    min_number: int | None = Field(None, ge=0, le=20)
    """Train split only: the smallest puzzle number (default 1)."""
    max_number: int | None = Field(None, ge=1, le=20)
    """Train split only: the largest puzzle number (default 13; at most 20, since every puzzle is enumerated)."""
    held_out_ranks: tuple[int, int] | None = None
    """Ranks [first, last] of 24.csv reserved for evaluation: the test split serves only these and the train split
    never generates them (it then reads 24.csv). None: test serves all 1 362, train excludes nothing."""
    step_penalty: float | None = Field(None, ge=0.0, le=1.0)
    """Steps mode only: score subtracted per illegal step (default 0.1)."""
    max_turns: int | None = Field(None, ge=1, le=50)
    """Steps mode only: policy turns per episode (default 6; three legal steps solve a puzzle)."""
    data_path: str | None = None
    """The held-out 24.csv; default $LRMGYM_SHARED_DATA/game24/24.csv, else <repo>/../shared/data/game24/24.csv."""

    @model_validator(mode="after")
    def _check_combinations(self) -> Game24Config:
        if self.order is not None and self.split != "test":
            raise ValueError(f"order={self.order!r} applies to split='test' only; remove it or set split='test'.")
        steps_only = {"step_penalty": self.step_penalty, "max_turns": self.max_turns}
        for name, value in steps_only.items():
            if value is not None and self.mode != "steps":
                raise ValueError(f"{name}={value} applies to mode='steps' only; remove it or set mode='steps'.")
        if self.unsolvable_ratio is not None and not self.allow_unsolvable:
            raise ValueError(
                f"unsolvable_ratio={self.unsolvable_ratio} needs allow_unsolvable=True; set it or remove the ratio."
            )
        if self.split == "test":
            for name in ("allow_unsolvable", "min_number", "max_number"):
                if getattr(self, name) not in (None, False):
                    raise ValueError(
                        f"{name}={getattr(self, name)} applies to split='train' only (the test split is the fixed "
                        "24.csv set, all solvable); remove it or set split='train'."
                    )
        low, high = self.numbers_range
        if low > high:
            raise ValueError(f"min_number={low} is above max_number={high}; the range must be non-empty.")
        if self.held_out_ranks is not None:
            first, last = self.held_out_ranks
            if not 1 <= first <= last:
                raise ValueError(
                    f"held_out_ranks={list(self.held_out_ranks)} must be [first, last] with 1 <= first <= last, "
                    "for example [901, 1000] (the ToT test range)."
                )
        return self

    @property
    def numbers_range(self) -> tuple[int, int]:
        """The effective (min_number, max_number)."""
        low = DEFAULT_MIN_NUMBER if self.min_number is None else self.min_number
        high = DEFAULT_MAX_NUMBER if self.max_number is None else self.max_number
        return low, high


class Game24Env(TextEnv):
    """The 24-point game: four numbers, + - * / and parentheses, make 24; single-shot or step by step.

    Rewards: single mode scores 1.0 for a correct expression (or a right 'no solution'), else 0.0.

    Steps mode is stateless: every answer lists the steps from the start of the puzzle (separated by ';' or
    newlines), each turn adding one, and the env replays them all from the puzzle's numbers. That is what lets
    both ``env.step`` and the GRPO rollout (which grades each turn with ``score_group`` and asks ``feedback``,
    with no episode state in the env) run the same episode; it also lets a model revise earlier steps after a
    dead end. A turn scores 1.0 when a single 24 is left (or on a right 'no solution'), ``-step_penalty`` when a
    step is illegal (or the format is broken), else 0.0. The episode ends when solved, on a wrong 'no solution'
    claim, or after ``max_turns``. Since ``Trajectory.reward`` is the last verdict's score, an illegal step in an
    earlier turn is penalised in that turn's reward (gymnasium's sum of rewards) but not in the trajectory reward
    the learner uses; see the hook proposed in the Game24 report.
    """

    Config = Game24Config

    @classmethod
    def preflight(cls, config: Game24Config) -> None:
        """Read an explicit ``data_path`` when the config is resolved, so that a bad file stops a run early."""
        if config.data_path is not None and (config.split == "test" or config.held_out_ranks is not None):
            load_held_out(config.data_path)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        cfg: Game24Config = self.config
        self.max_turns = (cfg.max_turns or DEFAULT_STEP_TURNS) if cfg.mode == "steps" else 1
        self._penalty = (
            (DEFAULT_STEP_PENALTY if cfg.step_penalty is None else cfg.step_penalty) if cfg.mode == "steps" else 0.0
        )
        self._held_out: tuple[HeldOutPuzzle, ...] = ()
        self._pool: PuzzlePool | None = None
        if cfg.split == "test" or cfg.held_out_ranks is not None:
            self._held_out = self._select_ranks(load_held_out(cfg.data_path))
        if cfg.split == "train":
            self._build_train_pool()

    # ------------------------------------------------------------------------------------------ task sources
    def _select_ranks(self, puzzles: tuple[HeldOutPuzzle, ...]) -> tuple[HeldOutPuzzle, ...]:
        ranks = self.config.held_out_ranks
        if ranks is None:
            return puzzles
        chosen = tuple(p for p in puzzles if ranks[0] <= p.rank <= ranks[1])
        if not chosen:
            raise ValueError(
                f"held_out_ranks={list(ranks)} selects no puzzle of 24.csv "
                f"(ranks {puzzles[0].rank}-{puzzles[-1].rank})."
            )
        return chosen

    def _build_train_pool(self) -> None:
        cfg: Game24Config = self.config
        low, high = cfg.numbers_range
        pool = puzzle_pool(low, high)
        excluded = {p.numbers for p in self._held_out}
        good = tuple(p for p in pool.solvable if p not in excluded)
        bad = pool.unsolvable if cfg.allow_unsolvable else ()
        if not good and not bad:
            raise ValueError(
                f"No puzzle to generate: numbers {low}..{high} give no solvable puzzle outside held_out_ranks. "
                "Widen min_number/max_number or set allow_unsolvable=True."
            )
        self._pool = PuzzlePool(low, high, good, bad)

    def make_task(self, index: int, rng: np.random.Generator) -> Task:
        """Task ``index``: a generated puzzle (train), or the ``index mod N``-th held-out puzzle by rank (test)."""
        cfg: Game24Config = self.config
        if cfg.split == "test":
            position = int(rng.integers(len(self._held_out))) if cfg.order == "random" else index % len(self._held_out)
            row = self._held_out[position]
            numbers, task_id = row.numbers, f"game24/test/{row.rank}"
            extra: dict[str, Any] = {
                "source": "tot/24.csv",
                "rank": row.rank,
                "human_solve_time_s": row.solve_time_s,
                "human_solved_rate": row.solved_rate,
            }
        else:
            ratio = (
                (DEFAULT_UNSOLVABLE_RATIO if cfg.unsolvable_ratio is None else cfg.unsolvable_ratio)
                if cfg.allow_unsolvable
                else 0.0
            )
            numbers = sample_puzzle(self._pool, rng, ratio)
            task_id = f"game24/train/{index}/{'-'.join(map(str, numbers))}"
            extra = {"source": "game24/generator"}
        return self._build_task(task_id, numbers, extra)

    def _build_task(self, task_id: str, numbers: tuple[int, ...], extra: dict[str, Any]) -> Task:
        cfg: Game24Config = self.config
        analysis = analyse(numbers)
        found = solutions(numbers) if analysis.solvable else ()
        labels = {
            "solvable": analysis.solvable,
            "needs_fractions": analysis.needs_fractions,
            "num_solutions": len(found),
            "solutions": found,
        }
        if cfg.split == "test":
            difficulty: int | str = (extra["rank"] - 1) // RANK_BUCKET + 1
        else:
            difficulty = _level(len(found), analysis.needs_fractions)
        text = prompt_text(numbers, cfg.mode, cfg.style, cfg.template, mention_unsolvable=cfg.allow_unsolvable)
        prompt: Prompt = [{"role": "user", "content": text}] if cfg.chat else text
        metadata = {
            **extra,
            "split": cfg.split,
            "mode": cfg.mode,
            "numbers": numbers,
            "target": TARGET,
            "difficulty": difficulty,
            **labels,
        }
        return Task(id=task_id, prompt=prompt, answer=found[0] if found else "no solution", metadata=metadata)

    # ---------------------------------------------------------------------------------------------- grading
    def verify(self, task: Task, completion: Completion) -> Verdict:
        """Grade one completion; never raises for model output (an internal failure is an ungradeable verdict)."""
        numbers = task.metadata.get("numbers")
        if not numbers:
            return Verdict.ungradeable(f"task {task.id!r} has no metadata['numbers']; it is not a Game24 task")
        try:
            if self.config.mode == "single":
                return self._verify_single(task, completion.text)
            return self._verify_steps(task, completion.text)
        except Exception as err:  # noqa: BLE001 - a checker bug must not crash a training run; it is reported
            return Verdict.ungradeable(f"internal error in the Game24 checker: {type(err).__name__}: {err}"[:300])

    def _verify_single(self, task: Task, text: str) -> Verdict:
        extracted = extract_answer(text, self.config.template)
        if extracted.answer is None:
            return _verdict(0.0, False, None, extracted.reason, format_ok=False)
        result = check_answer(extracted.answer, task.metadata["numbers"], bool(task.metadata.get("solvable", True)))
        return _verdict(float(result.ok), result.ok, extracted.answer[:MAX_EXPR_CHARS], result.reason, format_ok=True)

    def _replay(self, task: Task, text: str) -> tuple[Replay, str | None, bool]:
        """Extract the answer and replay its steps from the puzzle's numbers: (replay, answer, format ok)."""
        extracted = extract_answer(text, self.config.template)
        if extracted.answer is None:
            start = tuple(sorted(Fraction(n) for n in task.metadata["numbers"]))
            return Replay("illegal", extracted.reason, start), None, False
        return replay_steps(extracted.answer, task), extracted.answer, True

    def _verify_steps(self, task: Task, text: str) -> Verdict:
        replay, answer, format_ok = self._replay(task, text)
        won = replay.outcome in ("solved", "no_solution")
        score = 1.0 if won else (-self._penalty if replay.outcome == "illegal" else 0.0)
        correct = True if won else (None if replay.outcome == "progress" else False)
        return Verdict(
            score=score,
            correct=correct,
            parsed=None if answer is None else answer[: MAX_STEPS_PER_ANSWER * MAX_EXPR_CHARS],
            reason=replay.reason,
            components=(Component("steps", score, reason=replay.reason),),
            format_ok=format_ok,
        )

    def feedback(self, task: Task, completion: Completion, verdict: Verdict, turn: int) -> str | None:
        """Steps mode: the numbers left after the answer's steps, or why a step was illegal; ``None`` ends it.

        Stateless: the answer is replayed from the puzzle's numbers (the same work as :meth:`verify`, a few
        hundred microseconds), so it is right however the episode is driven (``step``, or the GRPO rollout's
        ``score_group`` + ``feedback``) and whatever judges changed in ``verdict``.
        """
        if self.config.mode != "steps":
            return None
        replay, _, _ = self._replay(task, completion.text)
        if replay.outcome == "wrong_claim":
            return None
        return feedback_text(self.config.style, replay.outcome, replay.reason, replay.numbers_left, self._penalty)


@dataclass(frozen=True)
class Replay:
    """The result of replaying one steps-mode answer from the puzzle's numbers.

    Attributes:
        outcome: ``progress`` (legal, numbers remain), ``solved``, ``illegal`` (the steps before the illegal one
            still count for the numbers left), ``dead_end`` (one number left, not 24), ``no_solution`` (a right
            'no solution' claim) or ``wrong_claim`` (a 'no solution' claim on a solvable puzzle).
        reason: What happened, for the verdict and the feedback.
        numbers_left: The numbers after the legal steps, sorted.
    """

    outcome: str
    reason: str
    numbers_left: tuple[Fraction, ...]


def replay_steps(answer: str, task: Task) -> Replay:
    """Replay the steps of one answer (one per line or separated by ';') from the numbers of ``task``."""
    numbers_left = tuple(sorted(Fraction(n) for n in task.metadata["numbers"]))
    if answer.lower().rstrip(".").strip() in NO_SOLUTION_ANSWERS:
        if task.metadata.get("solvable", True):
            return Replay("wrong_claim", "claimed no solution, but the puzzle is solvable", numbers_left)
        return Replay("no_solution", "correct: the puzzle has no solution", numbers_left)
    limit = MAX_STEPS_PER_ANSWER * MAX_EXPR_CHARS
    if len(answer) > limit:
        return Replay("illegal", f"too long: {len(answer)} characters, the limit is {limit}", numbers_left)
    texts = [t for t in _STEP_SPLIT.split(answer) if t.strip()]
    if not texts:
        return Replay("illegal", "no step: write a step like '8 / 3 = 8/3'", numbers_left)
    if len(texts) > MAX_STEPS_PER_ANSWER:
        return Replay("illegal", f"{len(texts)} steps, the limit is {MAX_STEPS_PER_ANSWER}", numbers_left)
    done: list[str] = []
    for number, text in enumerate(texts, start=1):
        if len(numbers_left) < 2:
            return Replay("illegal", f"step {number}: no numbers left to combine", numbers_left)
        try:
            step = parse_step(text)
            numbers_left = apply_step(numbers_left, step)
        except CheckError as err:
            return Replay("illegal", f"step {number}: {err}", numbers_left)
        done.append(str(step))  # the normalised step, not the model's text
    steps = "; ".join(done)
    if len(numbers_left) > 1:
        return Replay("progress", f"legal: {steps}", numbers_left)
    if numbers_left[0] == TARGET:
        return Replay("solved", f"solved: {steps}", numbers_left)
    return Replay("dead_end", f"dead end: {steps} leaves {format_number(numbers_left[0])}, not {TARGET}", numbers_left)


def _verdict(score: float, correct: bool, parsed: str | None, reason: str, format_ok: bool) -> Verdict:
    return Verdict(
        score=score,
        correct=correct,
        parsed=parsed,
        reason=reason,
        components=(Component("accuracy", score, reason=reason),),
        format_ok=format_ok,
    )


def _level(num_solutions: int, needs_fractions: bool) -> str:
    """Difficulty label of a generated puzzle from the solver.

    On the 1 362 held-out puzzles, puzzles with one distinct solution have a median human rank of 882, two
    solutions 811, three or four 659, five or more about 340 (Spearman rho of count vs rank: -0.39).
    """
    if num_solutions == 0:
        return "unsolvable"
    if num_solutions == 1 or needs_fractions:
        return "hard"
    return "medium" if num_solutions <= 4 else "easy"
