"""The run directory's lifecycle: atomic writes, append-only logs that survive SIGKILL, checkpoints, plots.

Layout (see DESIGN.md "Runs")::

    run_dir/config.yaml          the resolved config (written by the CLI)
    run_dir/metrics.jsonl        one line per training step
    run_dir/samples.jsonl        a few rollouts per step, with their verdicts
    run_dir/checkpoints/step_000040.pt   model, optimizer, RNG states, step, data position
    run_dir/eval/<tag>/          evaluation results
    run_dir/plots/metrics.png    reward, accuracy, length and KL against step
    run_dir/summary.json         before/after results, wall time, status

Crash safety: whole files are written to a temporary sibling, fsynced, then renamed over the target (rename
is atomic on POSIX), so a reader sees the old or the new file, never half of one. The JSONL logs are
appended and fsynced line by line; a SIGKILL can leave a torn last line, which :meth:`JsonlLog.truncate`
drops on resume together with every line past the checkpoint's step.
"""

from __future__ import annotations

import json
import os
import random
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

__all__ = [
    "Checkpointer",
    "JsonlLog",
    "atomic_write_bytes",
    "atomic_write_json",
    "capture_rng",
    "plot_metrics",
    "restore_rng",
]


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some filesystems do not allow opening directories
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write`` on a temporary sibling of ``path``, fsync it, then rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash leaves either the old file or the new one."""
    _atomic_write(path, lambda f: f.write(data))


def atomic_write_json(path: Path, obj: Any) -> None:
    """Atomically write ``obj`` as indented JSON."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode())


def atomic_torch_save(obj: Any, path: Path) -> None:
    """Atomically ``torch.save`` ``obj`` to ``path`` (streamed to the file, not buffered in memory)."""
    _atomic_write(path, lambda f: torch.save(obj, f))


class JsonlLog:
    """An append-only JSON-lines file whose every record has an integer ``"step"``."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def append(self, record: dict[str, Any]) -> None:
        """Append one record and fsync it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(record, default=str, allow_nan=True) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

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

    def truncate(self, max_step: int) -> int:
        """Keep only the records with ``step <= max_step`` (atomically); returns how many were kept."""
        kept = [r for r in self.records() if isinstance(r.get("step"), int) and r["step"] <= max_step]
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

    def load_latest(self) -> dict[str, Any] | None:
        """The newest checkpoint's state, or ``None`` when there is none."""
        steps = self.steps()
        if not steps:
            return None
        # weights_only=False: the file also holds numpy/python RNG states; it is our own file from this run.
        return torch.load(self.path(steps[-1]), map_location="cpu", weights_only=False)


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


PLOT_PANELS: tuple[tuple[str, str], ...] = (
    ("reward/mean", "reward"),
    ("accuracy", "accuracy (train, T=sampling)"),
    ("length/mean", "policy tokens per trajectory"),
    ("kl_ref", "KL to the initial policy (k3)"),
)
"""The metrics plotted against step, with their panel titles."""


def plot_metrics(metrics: list[dict[str, Any]], out_png: Path, evals: list[tuple[int, float]] | None = None) -> Path:
    """Plot reward, accuracy, length and KL against step into ``out_png`` (atomically).

    Args:
        metrics: The records of ``metrics.jsonl``.
        out_png: The image to write.
        evals: ``(step, held-out accuracy)`` points drawn on the accuracy panel.
    """
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 6.5), sharex=True)
    steps = [m["step"] for m in metrics]
    for ax, (key, title) in zip(axes.flat, PLOT_PANELS, strict=True):
        values = [m.get(key) for m in metrics]
        pts = [(s, v) for s, v in zip(steps, values, strict=True) if isinstance(v, (int, float))]
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, lw=0.8, alpha=0.5, color="C0", label="train")
            # A 10-point moving mean makes the trend readable through the noise (a point is a step, or every
            # n-th step for the KL).
            if len(ys) >= 10:
                smooth = np.convolve(ys, np.ones(10) / 10, mode="valid")
                ax.plot(xs[9:], smooth, lw=1.6, color="C0", label="train (10-point moving mean)")
        if key == "accuracy" and evals:
            ax.plot(*zip(*evals, strict=True), "o-", color="C3", label="held-out")
            ax.legend(fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    atomic_write_bytes(out_png, buf.getvalue())
    return Path(out_png)
