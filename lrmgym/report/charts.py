"""Charts of a run's metrics against step, as inline SVG made with matplotlib (no script, nothing fetched).

The parts of a staged run share one step axis: each stage starts where the last one ended, a dashed line marks
the boundary and the stage's name stands above it. A panel shows the logged value of each step (thin) and a
moving mean (thick); the accuracy panel adds the held-out evaluations of ``summary.json`` (sampled and greedy) as
markers at the steps they were measured, never joined by a line (nothing was measured in between). When the
reward is the accuracy at every step (the accuracy judge alone), one panel shows both instead of one curve twice.

:func:`overview_png` is the run directory's ``plots/metrics.png``: the headline panels, loss, gradient norm and the
critic's metrics, drawn by the same code as the report's charts.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from lrmgym.report.rundata import Part

__all__ = [
    "CRITIC_PANELS",
    "JUDGE_PREFIX",
    "TRAINING_PANELS",
    "chart_png",
    "chart_svg",
    "constant_judge_metrics",
    "judge_panels",
    "main_panels",
    "overview_png",
    "step_offsets",
]

_ACCURACY = "accuracy (line: train; markers: held-out)"
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
CRITIC_PANELS: tuple[tuple[str, str], ...] = (
    ("value/loss", "critic loss"),
    ("value/explained_variance", "critic explained variance"),
    ("value/mean", "value estimate (mean)"),
    ("returns/mean", "returns (mean)"),
    ("value/clip_frac", "critic clipped fraction"),
    ("value/grad_norm", "critic gradient norm"),
)
"""The critic's metrics (PPO), shown when a run logs them."""
JUDGE_PREFIX = "judge/"
_MAX_POINTS = 1500  # per part and panel: more adds bytes, not information, at a page's width


def _value(record: dict[str, Any], key: str) -> float | None:
    v = record.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _has(parts: Sequence[Part], key: str) -> bool:
    return any(_value(m, key) is not None for p in parts for m in p.metrics)


def _same_series(parts: Sequence[Part], a: str, b: str) -> bool:
    """Whether metrics ``a`` and ``b`` were logged with equal values at every step that logged either."""
    pairs = [(_value(m, a), _value(m, b)) for p in parts for m in p.metrics]
    pairs = [(x, y) for x, y in pairs if x is not None or y is not None]
    return bool(pairs) and all(x is not None and y is not None and abs(x - y) <= 1e-9 for x, y in pairs)


def main_panels(parts: Sequence[Part]) -> list[tuple[str, str]]:
    """Reward, accuracy, length and KL; reward and accuracy as one panel when they are one series."""
    if _same_series(parts, "reward/mean", "accuracy"):
        head = [("accuracy", _ACCURACY.replace("accuracy", "accuracy = reward", 1))]
    else:
        head = [("reward/mean", "reward"), ("accuracy", _ACCURACY)]
    return [*head, ("length/mean", "policy tokens per trajectory"), ("kl_ref", "KL to the initial policy")]


def step_offsets(parts: Sequence[Part]) -> list[int]:
    """Where each part starts on the shared step axis (0 for the first; a stage starts where the last ended)."""
    offsets, at = [], 0
    for part in parts:
        offsets.append(at)
        steps = [m["step"] for m in part.metrics if isinstance(m.get("step"), int)]
        at += max(steps, default=0)
    return offsets


def _axis_end(parts: Sequence[Part]) -> int:
    """The last step on the shared step axis (where the last part ends)."""
    if not parts:
        return 0
    steps = [m["step"] for m in parts[-1].metrics if isinstance(m.get("step"), int)]
    return step_offsets(parts)[-1] + max(steps, default=0)


def judge_panels(parts: Sequence[Part]) -> list[tuple[str, str]]:
    """``(key, title)`` of every ``judge/*`` metric the run logged a number for that changed over the run, sorted.

    A metric with one value at every step (no failures, the same calls each step) is a flat line: see
    :func:`constant_judge_metrics`.
    """
    constant = constant_judge_metrics(parts)
    keys = {k for p in parts for m in p.metrics for k in m if k.startswith(JUDGE_PREFIX)}
    return [(k, k.removeprefix(JUDGE_PREFIX)) for k in sorted(keys) if _has(parts, k) and k not in constant]


def constant_judge_metrics(parts: Sequence[Part]) -> dict[str, float]:
    """``{key: value}`` of the ``judge/*`` metrics logged with one value at every step that logged them."""
    values: dict[str, set[float]] = {}
    for part in parts:
        for m in part.metrics:
            for key in m:
                if key.startswith(JUDGE_PREFIX) and (v := _value(m, key)) is not None:
                    values.setdefault(key, set()).add(v)
    return {k: next(iter(v)) for k, v in sorted(values.items()) if len(v) == 1}


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
        logged = sum(isinstance(m.get("step"), int) for m in part.metrics)
        if 2 * len(ys) < logged:  # logged at few steps (the KL every n-th): points, no line through unmeasured steps
            ax.plot(*_thin(xs, ys), ls="none", marker="o", ms=3, color="C0")
            continue
        few = len(ys) <= 40  # a handful of steps: each one a dot, so that a line is not read as measured between
        ax.plot(*_thin(xs, ys), lw=0.8, alpha=0.45, color="C0", marker="." if few else None, ms=3)
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
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    last = _axis_end(parts)
    if last > 0:
        ax.set_xlim(-0.04 * last, 1.04 * last)  # one step axis in every panel, step 0 (before training) included


def _figure(parts: Sequence[Part], panels: Sequence[tuple[str, str]], cols: int) -> Any:
    """The matplotlib figure of ``panels`` the run logged (``None`` when it logged none); the caller closes it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [(k, t) for k, t in panels if _has(parts, k)]
    if not shown:
        return None
    offsets = step_offsets(parts)
    cols = min(cols, len(shown))
    rows = math.ceil(len(shown) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 2.6 * rows), squeeze=False)
    for ax, (key, title) in zip(axes.flat, shown, strict=False):
        _panel(ax, parts, offsets, key, title)
    for i, ax in enumerate(axes.flat):
        if i >= len(shown):
            ax.set_visible(False)
        elif i + cols >= len(shown):  # nothing below it: the bottom of its column
            ax.set_xlabel("step", fontsize=8)
    fig.tight_layout()
    return fig


def chart_svg(parts: Sequence[Part], panels: Sequence[tuple[str, str]], name: str, cols: int = 2) -> str | None:
    """One figure of ``panels`` (those the run logged) as an ``<svg>`` element, or ``None`` when it logged none.

    Args:
        parts: The run's parts (one step axis).
        panels: ``(metric key, title)`` of each panel, in order.
        name: The figure's name; it seeds the SVG's element ids, so two figures in a page never share one.
        cols: Panels per row.
    """
    import matplotlib
    import matplotlib.pyplot as plt

    # Text as <text> (not paths): smaller and crisp; a fixed salt per figure: ids unique in the page, output stable.
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": f"lrmgym-report-{name}"}):
        fig = _figure(parts, panels, cols)
        if fig is None:
            return None
        try:
            buf = io.StringIO()
            fig.savefig(buf, format="svg", metadata={"Date": None})
        finally:
            plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg") :]


def chart_png(parts: Sequence[Part], panels: Sequence[tuple[str, str]], cols: int = 2, dpi: int = 90) -> bytes | None:
    """:func:`chart_svg`'s figure as PNG bytes, or ``None`` when the run logged none of ``panels``."""
    import matplotlib.pyplot as plt

    fig = _figure(parts, panels, cols)
    if fig is None:
        return None
    try:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi)
    finally:
        plt.close(fig)
    return buf.getvalue()


def overview_png(metrics: list[dict[str, Any]], evals: dict[str, Any] | None = None) -> bytes:
    """``plots/metrics.png`` of one loop: :func:`main_panels`, loss, gradient norm and the critic's metrics.

    Args:
        metrics: The records of ``metrics.jsonl``.
        evals: The held-out evaluations, as ``summary.json`` keeps them (``{"before": {"step": 0, "sampled":
            {"accuracy": ...}, "greedy": {...}}, ...}``), drawn as markers on the accuracy panel.
    """
    from pathlib import Path

    part = Part("", Path("."), metrics, {"evals": evals or {}}, None)
    panels = [*main_panels([part]), ("loss", "loss"), ("grad_norm", "gradient norm"), *CRITIC_PANELS]
    png = chart_png([part], panels, cols=2)
    if png is not None:
        return png
    import matplotlib.pyplot as plt  # nothing logged yet: a figure that says so (the summary names the file)

    fig = plt.figure(figsize=(4.6, 1.2))
    fig.text(0.5, 0.5, "no metrics logged yet", ha="center", va="center")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()
