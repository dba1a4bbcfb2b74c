"""Puzzle sources: the seeded generator (train split) and the 1 362 ToT puzzles (held-out test split).

The held-out file is the Tree-of-Thoughts ``24.csv`` (Yao et al. 2023, https://arxiv.org/abs/2305.10601),
1 362 puzzles ranked by human solve time on 4nums.com, easiest first. It is not bundled: it is read from
``$LRMGYM_SHARED_DATA/game24/24.csv``, else ``<repo>/../shared/data/game24/24.csv``, or from an explicit path,
and only when a test-split env is built (never at import).
"""

from __future__ import annotations

import csv
import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from lrmgym.envs._jsonl import iter_lines
from lrmgym.envs.game24.solver import analyse

__all__ = ["HeldOutPuzzle", "PuzzlePool", "default_data_path", "load_held_out", "puzzle_pool", "sample_puzzle"]

_HEADER = ["Rank", "Puzzles", "AMT (s)", "Solved rate", "1-sigma Mean (s)", "1-sigma STD (s)"]
_REPO = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class HeldOutPuzzle:
    """One row of ``24.csv``.

    Attributes:
        rank: Human solve-time rank, 1 (fastest) to 1362; the difficulty label of the test split.
        numbers: The four numbers, ascending.
        solve_time_s: Mean human solve time in seconds (the ``AMT (s)`` column).
        solved_rate: Fraction of human attempts that solved it (``"99.20%"`` -> 0.992).
    """

    rank: int
    numbers: tuple[int, ...]
    solve_time_s: float
    solved_rate: float


def default_data_path() -> Path:
    """``$LRMGYM_SHARED_DATA/game24/24.csv`` when the variable is set, else ``<repo>/../shared/data/game24/24.csv``."""
    root = os.environ.get("LRMGYM_SHARED_DATA")
    base = Path(root) if root else _REPO.parent / "shared" / "data"
    return base / "game24" / "24.csv"


def load_held_out(path: str | os.PathLike | None = None) -> tuple[HeldOutPuzzle, ...]:
    """Read the held-out puzzles, ordered by rank.

    Args:
        path: The CSV file; ``None`` uses :func:`default_data_path`.

    Raises:
        FileNotFoundError: The file is absent; the message names the path and how to point to the file.
        ValueError: The path is a folder or a device, or the file is not in the ToT format (the message names
            the line), or it has a line over 1 MiB.
    """
    resolved = Path(path).expanduser() if path is not None else default_data_path()
    if not resolved.exists():
        raise FileNotFoundError(
            f"The Game24 test split needs the ToT puzzle file, not found at {resolved}. Set LRMGYM_SHARED_DATA to the "
            "folder that holds game24/24.csv, or pass data_path='/path/to/24.csv' to the env."
        )
    stat = resolved.stat()
    return _load(str(resolved.resolve()), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=4)
def _load(path: str, mtime_ns: int, size: int) -> tuple[HeldOutPuzzle, ...]:
    rows = []
    for line, text in iter_lines(Path(path), ValueError):  # bounded: a huge line is refused, never read whole
        if not text.strip():
            continue
        try:
            rows.append((line, next(csv.reader([text]))))
        except csv.Error as err:
            raise ValueError(f"{path}:{line}: not a CSV row ({err}).") from None
    if not rows or rows[0][1] != _HEADER:
        got = rows[0][1] if rows else "an empty file"
        raise ValueError(
            f"{path}:{rows[0][0] if rows else 1}: expected the ToT 24.csv header {_HEADER}, got {got}. "
            "Point data_path at the Tree-of-Thoughts 24.csv."
        )
    puzzles = [_parse_row(path, line, row) for line, row in rows[1:]]
    if not puzzles:
        raise ValueError(f"{path}: the file has a header but no puzzles.")
    return tuple(sorted(puzzles, key=lambda p: p.rank))


def _parse_row(path: str, line: int, row: list[str]) -> HeldOutPuzzle:
    try:
        numbers = tuple(sorted(int(n) for n in row[1].split()))
        if len(numbers) != 4 or min(numbers) < 0:
            raise ValueError("four non-negative integers expected")
        return HeldOutPuzzle(
            rank=int(row[0]),
            numbers=numbers,
            solve_time_s=float(row[2]),
            solved_rate=float(row[3].rstrip("%")) / 100,
        )
    except (ValueError, IndexError) as err:
        raise ValueError(
            f"{path}:{line}: cannot read {','.join(row)!r} as 'rank,n1 n2 n3 n4,seconds,rate%,...' ({err})."
        ) from None


@dataclass(frozen=True)
class PuzzlePool:
    """Every four-number puzzle over a number range, split by solvability (both sorted, deterministic)."""

    low: int
    high: int
    solvable: tuple[tuple[int, ...], ...]
    unsolvable: tuple[tuple[int, ...], ...]


@lru_cache(maxsize=8)
def puzzle_pool(low: int, high: int, size: int = 4) -> PuzzlePool:
    """All multisets of ``size`` numbers in ``[low, high]``, classified by the solver (1 820 for 1..13)."""
    good, bad = [], []
    for numbers in itertools.combinations_with_replacement(range(low, high + 1), size):
        (good if analyse(numbers).solvable else bad).append(numbers)
    return PuzzlePool(low, high, tuple(good), tuple(bad))


def sample_puzzle(pool: PuzzlePool, rng: np.random.Generator, unsolvable_ratio: float) -> tuple[int, ...]:
    """Draw one puzzle uniformly among the distinct puzzles of the pool.

    With probability ``unsolvable_ratio`` it is an unsolvable one (when the range has any), else a solvable one.
    """
    want_unsolvable = unsolvable_ratio > 0 and rng.random() < unsolvable_ratio
    source: Sequence[tuple[int, ...]] = pool.unsolvable if want_unsolvable and pool.unsolvable else pool.solvable
    if not source:
        source = pool.unsolvable
    return source[int(rng.integers(len(source)))]
