"""The run directory's lifecycle: atomic writes, append-only logs that survive SIGKILL, checkpoints, plots.

Layout (see DESIGN.md "Runs")::

    run_dir/config.yaml          the resolved config (written by the CLI)
    run_dir/metrics.jsonl        one line per training step
    run_dir/samples.jsonl        a few rollouts per step, with their verdicts
    run_dir/checkpoints/step_000040.pt   model, optimizer, RNG states, step, data position
    run_dir/eval/<tag>/          evaluation results
    run_dir/plots/metrics.png    reward, accuracy (held-out evaluations as markers), length, KL, loss, grad norm, critic
    run_dir/summary.json         before/after results, wall time, status
    run_dir/tracking.json        with run.report_to: the trackers' run ids (tensorboard/, wandb/, mlruns/ beside it)
    run_dir/run.lock             while a process trains in it: that process's PID (see :func:`lock_run_dir`)

Crash safety: whole files are written to a temporary sibling, fsynced, then renamed over the target (rename
is atomic on POSIX), so a reader sees the old or the new file, never half of one. The JSONL logs are
appended and fsynced line by line; a SIGKILL can leave a torn last line, which :meth:`JsonlLog.truncate`
drops on resume together with every line past the checkpoint's step.

One writer: a process that trains in a run directory holds an exclusive ``flock`` on ``run.lock`` in it for the
whole run (stages and rollout workers included); a second ``lrmgym run --resume`` of it is refused while the
first lives. The kernel drops the lock when its holder exits, however it exits (SIGKILL included), so a resume
after a kill needs no clean-up.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import random
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lrmgym.files import atomic_write, atomic_write_bytes

__all__ = [
    "Checkpointer",
    "CorruptCheckpointError",
    "JsonlLog",
    "RUN_LOCK",
    "RunDirLocked",
    "atomic_write_bytes",
    "atomic_write_json",
    "capture_rng",
    "lock_run_dir",
    "plot_metrics",
    "restore_rng",
]


RUN_LOCK = "run.lock"
"""The lock file of a run directory: flocked by the process training in it, holding that process's PID."""


class RunDirLocked(RuntimeError):
    """Another process is training in the run directory (the message names its PID)."""

    def __init__(self, run_dir: Path, pid: int | None) -> None:
        self.run_dir, self.pid = Path(run_dir), pid
        who = f"process {pid}" if pid else "another process"
        stop = f"stop it (kill {pid})" if pid else "stop it"
        super().__init__(
            f"{str(self.run_dir)!r} is in use: {who} is training in it (it holds {RUN_LOCK}); two writers would "
            f"corrupt its logs and checkpoints. Wait for that run to end or {stop}, then resume."
        )


_held: dict[str, tuple[int, int]] = {}  # realpath of a locked run directory -> (fd of its run.lock, depth)
_held_guard = threading.Lock()


def _held_by_us(real: str) -> str | None:
    """The run directory this process holds that is ``real`` or one of its ancestors (a staged run's stage)."""
    path = Path(real)
    for candidate in (path, *path.parents):
        if str(candidate) in _held:
            return str(candidate)
    return None


def _lock_holder(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _acquire(run_dir: Path) -> int:
    """An fd of ``run_dir/run.lock`` with an exclusive flock on it and this PID written in it."""
    path = run_dir / RUN_LOCK
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise RunDirLocked(run_dir, _lock_holder(path)) from None
            raise
        try:  # a holder that ended between our open and flock unlinked the file we locked: lock the new one
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return fd
        os.close(fd)


@contextlib.contextmanager
def lock_run_dir(run_dir: str | os.PathLike) -> Iterator[Path]:
    """Hold the run directory's lock while the block runs; :class:`RunDirLocked` if another process holds it.

    Re-entrant within a process: a block inside another one on the same directory, or on a directory below a
    held one (a staged run's stage folder), holds nothing more. The lock is an exclusive, non-blocking ``flock``
    on ``run_dir/run.lock``, which holds the PID of its holder and is removed when the outermost block ends; the
    kernel releases it when the process dies, so a killed run leaves a stale file that locks nothing. Programs it
    starts (a rollout worker, a sandbox) do not inherit it: the file is opened close-on-exec.
    """
    run_dir = Path(run_dir)
    real = os.path.realpath(run_dir)
    with _held_guard:
        key = _held_by_us(real)
        if key is None:
            run_dir.mkdir(parents=True, exist_ok=True)
            key, fd, depth = real, _acquire(run_dir), 0
        else:
            fd, depth = _held[key]
        _held[key] = (fd, depth + 1)
    try:
        yield run_dir
    finally:
        with _held_guard:
            fd, depth = _held.pop(key)
            if depth > 1:
                _held[key] = (fd, depth - 1)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(key, RUN_LOCK))  # while still locked: no one holds a deleted file
                os.close(fd)


def atomic_write_json(path: Path, obj: Any) -> None:
    """Atomically write ``obj`` as indented JSON."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode())


def atomic_torch_save(obj: Any, path: Path) -> None:
    """Atomically ``torch.save`` ``obj`` to ``path`` (streamed to the file, not buffered in memory)."""
    atomic_write(path, lambda f: torch.save(obj, f))


class JsonlLog:
    """An append-only JSON-lines file whose every record has an integer ``"step"``."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def append(self, record: dict[str, Any]) -> None:
        """Append one record and fsync it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(record, default=str, allow_nan=True) + "\n"
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        except OSError as err:  # a full disk: name the file (a torn last line is dropped on resume)
            raise OSError(err.errno, err.strerror, str(self.path)) from err

    def records(self) -> Iterator[dict[str, Any]]:
        """The complete, parseable records in file order (a torn last line is skipped)."""
        if not self.path.exists():
            return
        with open(self.path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.endswith("\n"):
                    return  # torn by a crash mid-write
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(rec, dict):
                    yield rec

    def truncate(self, max_step: int, unique: bool = False) -> int:
        """Keep only the records with ``step <= max_step`` (atomically); returns how many were kept.

        With ``unique``, only the first record of each step is kept (a log with one line per step).
        """
        kept, seen = [], set()
        for r in self.records():
            step = r.get("step")
            if isinstance(step, int) and step <= max_step and not (unique and step in seen):
                kept.append(r)
                seen.add(step)
        data = "".join(json.dumps(r, default=str) + "\n" for r in kept)
        atomic_write_bytes(self.path, data.encode())
        return len(kept)


_CKPT_RE = re.compile(r"^step_(\d+)\.pt$")


class Checkpointer:
    """Numbered checkpoint files in ``run_dir/checkpoints``, each written atomically; keeps the newest few."""

    def __init__(self, directory: Path, keep: int = 2) -> None:
        self.directory = Path(directory)
        self.keep = keep

    def path(self, step: int) -> Path:
        """Where the checkpoint of ``step`` lives."""
        return self.directory / f"step_{step:06d}.pt"

    def steps(self) -> list[int]:
        """The steps with a checkpoint, ascending."""
        if not self.directory.is_dir():
            return []
        found = (_CKPT_RE.match(p.name) for p in self.directory.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def save(self, step: int, state: dict[str, Any]) -> Path:
        """Write the checkpoint of ``step`` and delete all but the newest ``keep``."""
        path = self.path(step)
        atomic_torch_save({**state, "step": step}, path)
        for old in self.steps()[: -self.keep]:
            self.path(old).unlink(missing_ok=True)
        return path

    def load_latest(self, report: Callable[[str], None] = print, max_step: int | None = None) -> dict[str, Any] | None:
        """The newest checkpoint that loads (of a step <= ``max_step`` if given), or ``None`` when there is none.

        A checkpoint that does not load (truncated, garbled, empty: a crash or a full disk while it was copied)
        is renamed to ``*.corrupt`` beside the others, and the next older one is tried; ``report`` says so.
        Raises :class:`CorruptCheckpointError` when checkpoints exist and none loads.
        """
        steps = [s for s in self.steps() if max_step is None or s <= max_step]
        failures = []
        for step in reversed(steps):
            path = self.path(step)
            try:
                # weights_only=False: the file also holds numpy/python RNG states; it is our own file from this run.
                state = torch.load(path, map_location="cpu", weights_only=False)
                if not isinstance(state, dict) or state.get("step") != step:
                    raise ValueError(f"it holds no state of step {step}")
            except Exception as err:  # noqa: BLE001 - any failure to read means this file cannot be resumed from
                reason = f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else 'unreadable'}"
                failures.append(f"{path.name} ({reason})")
                aside = path.with_name(path.name + ".corrupt")
                path.replace(aside)
                report(f"checkpoint {path} does not load ({reason}); moved it to {aside.name} and trying an older one.")
                continue
            if failures:
                report(f"resuming from {path.name}, the newest checkpoint that loads.")
            return state
        if failures:
            raise CorruptCheckpointError(
                f"no checkpoint in {self.directory} loads: {'; '.join(failures)}. The run cannot be resumed; start "
                "a new run (the unreadable files were kept as *.corrupt)."
            )
        return None

    def drop_after(self, step: int, report: Callable[[str], None] = print) -> None:
        """Delete the checkpoints of steps after ``step`` (a resume went back past them; they would be resumed from)."""
        newer = [s for s in self.steps() if s > step]
        for s in newer:
            self.path(s).unlink(missing_ok=True)
        if newer:
            report(f"deleted the checkpoints of steps {', '.join(map(str, newer))}, after the step resumed from.")


class CorruptCheckpointError(RuntimeError):
    """Checkpoints exist and none of them loads."""


def capture_rng() -> dict[str, Any]:
    """The states of Python's, numpy's and torch's global generators."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Restore what :func:`capture_rng` captured."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def plot_metrics(metrics: list[dict[str, Any]], out_png: Path, evals: dict[str, Any] | None = None) -> Path:
    """Plot a run's metrics against step into ``out_png`` (atomically); see :func:`lrmgym.report.charts.overview_png`.

    Args:
        metrics: The records of ``metrics.jsonl``.
        out_png: The image to write.
        evals: The held-out evaluations as ``summary.json`` keeps them, drawn as markers at their steps.
    """
    from lrmgym.report.charts import overview_png  # the report's charts: one drawing code for both

    atomic_write_bytes(out_png, overview_png(metrics, evals))
    return Path(out_png)
