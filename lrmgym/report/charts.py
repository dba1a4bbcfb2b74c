"""Charts of a run's metrics against step, as inline SVG made with matplotlib (no script, nothing fetched).

The parts of a staged run share one step axis: each stage starts where the last one ended, a dashed line marks
the boundary and the stage's name stands above it. A panel shows the logged value of each step (thin) and a
moving mean (thick); the accuracy panel adds the held-out evaluations of ``summary.json`` as points.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from lrmgym.report.rundata import Part

__all__ = ["JUDGE_PREFIX", "MAIN_PANELS", "TRAINING_PANELS", "chart_svg", "judge_panels", "step_offsets"]

MAIN_PANELS: tuple[tuple[str, str], ...] = (
    ("reward/mean", "reward"),
    ("accuracy", "accuracy (train; held-out evals as points)"),
    ("length/mean", "policy tokens per trajectory"),
    ("kl_ref", "KL to the initial policy"),
)
"""The headline metrics, with their panel titles."""
TRAINING_PANELS: tuple[tuple[str, str], ...] = (
    ("loss", "loss"),
    ("entropy", "entropy"),
    ("clip_frac", "clipped fraction"),
    ("zero_variance_frac", "groups without signal"),
    ("all_failed_frac", "groups none of which is correct"),
    ("format_ok_frac", "answer format ok"),
    ("grad_norm", "gradient norm"),
    ("tokens_per_s", "tokens per second"),
)
"""The optimisation metrics shown when a run logs them."""
JUDGE_PREFIX = "judge/"
_MAX_POINTS = 1500  # per part and panel: more adds bytes, not information, at a page's width


def _value(record: dict[str, Any], key: str) -> float | None:
    v = record.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _has(parts: Sequence[Part], key: str) -> bool:
    return any(_value(m, key) is not None for p in parts for m in p.metrics)


def step_offsets(parts: Sequence[Part]) -> list[int]:
    """Where each part starts on the shared step axis (0 for the first; a stage starts where the last ended)."""
    offsets, at = [], 0
    for part in parts:
        offsets.append(at)
        steps = [m["step"] for m in part.metrics if isinstance(m.get("step"), int)]
        at += max(steps, default=0)
    return offsets


def judge_panels(parts: Sequence[Part]) -> list[tuple[str, str]]:
    """``(key, title)`` of every ``judge/*`` metric the run logged a number for, sorted."""
    keys = {k for p in parts for m in p.metrics for k in m if k.startswith(JUDGE_PREFIX)}
    return [(k, k.removeprefix(JUDGE_PREFIX)) for k in sorted(keys) if _has(parts, k)]


def _eval_points(part: Part, offset: int, kind: str) -> list[tuple[float, float]]:
    evals = (part.summary or {}).get("evals")
    points = []
    for entry in evals.values() if isinstance(evals, dict) else []:
        result = entry.get(kind) if isinstance(entry, dict) else None
        if isinstance(result, dict) and isinstance(entry.get("step"), int):
            acc = _value(result, "accuracy")
            if acc is not None:
                points.append((offset + entry["step"], acc))
    return sorted(points)


def _thin(xs: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    stride = math.ceil(len(xs) / _MAX_POINTS)
    return (xs[::stride], ys[::stride]) if stride > 1 else (xs, ys)


def _panel(ax: Any, parts: Sequence[Part], offsets: list[int], key: str, title: str) -> None:
    for part, offset in zip(parts, offsets, strict=True):
        pts = [(m["step"], _value(m, key)) for m in part.metrics if isinstance(m.get("step"), int)]
        pts = [(s, v) for s, v in pts if v is not None]
        if not pts:
            continue
        xs, ys = (np.asarray(a, dtype=float) for a in zip(*pts, strict=True))
        xs = xs + offset
        ax.plot(*_thin(xs, ys), lw=0.8, alpha=0.45, color="C0")
        window = max(10, len(ys) // 50)
        if len(ys) >= 2 * window:
            smooth = np.convolve(ys, np.ones(window) / window, mode="valid")
            ax.plot(*_thin(xs[window - 1 :], smooth), lw=1.6, color="C0")
    if key == "accuracy":
        for kind, style, color in (("sampled", "o", "C3"), ("greedy", "s", "C2")):
            pts = [p for part, off in zip(parts, offsets, strict=True) for p in _eval_points(part, off, kind)]
            if pts:
                ax.plot(*zip(*pts, strict=True), style, ms=4, color=color, label=f"held-out, {kind}")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
    if len(parts) > 1:  # the stage boundaries, each stage's name at its start (the first at the left edge)
        ax.annotate(parts[0].label, (0.0, 1.0), xycoords="axes fraction", xytext=(2, -9), textcoords="offset points",
                    fontsize=7, color="0.35")  # fmt: skip
        for part, offset in zip(parts[1:], offsets[1:], strict=True):
            ax.axvline(offset, color="0.5", lw=0.8, ls="--")
            ax.annotate(part.label, (offset, 1.0), xycoords=("data", "axes fraction"), xytext=(2, -9),
                        textcoords="offset points", fontsize=7, color="0.35", annotation_clip=True)  # fmt: skip
    ax.set_title(title.replace("$", r"\$"), fontsize=9)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)


def chart_svg(parts: Sequence[Part], panels: Sequence[tuple[str, str]], name: str, cols: int = 2) -> str | None:
    """One figure of ``panels`` (those the run logged) as an ``<svg>`` element, or ``None`` when it logged none.

    Args:
        parts: The run's parts (one step axis).
        panels: ``(metric key, title)`` of each panel, in order.
        name: The figure's name; it seeds the SVG's element ids, so two figures in a page never share one.
        cols: Panels per row.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [(k, t) for k, t in panels if _has(parts, k)]
    if not shown:
        return None
    offsets = step_offsets(parts)
    cols = min(cols, len(shown))
    rows = math.ceil(len(shown) / cols)
    # Text as <text> (not paths): smaller and crisp; a fixed salt per figure: ids unique in the page, output stable.
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": f"lrmgym-report-{name}"}):
        fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 2.6 * rows), squeeze=False)
        try:
            for ax, (key, title) in zip(axes.flat, shown, strict=False):
                _panel(ax, parts, offsets, key, title)
            for i, ax in enumerate(axes.flat):
                if i >= len(shown):
                    ax.set_visible(False)
                elif i + cols >= len(shown):  # nothing below it: the bottom of its column
                    ax.set_xlabel("step", fontsize=8)
            fig.tight_layout()
            buf = io.StringIO()
            fig.savefig(buf, format="svg", metadata={"Date": None})
        finally:
            plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg") :]
