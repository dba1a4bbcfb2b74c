"""What the run loop prints and records of its results: the before/after table, evaluation summaries, durations."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lrmgym.learners.engine.loop import Loop

__all__ = ["duration", "eval_summary", "fmt_acc", "print_table"]


def print_table(loop: Loop, summary: dict) -> None:
    """Print the held-out accuracy before and after training, where the run's directory and plot are, its speed."""
    from rich.console import Console
    from rich.table import Table

    before, after = loop.evals.get("before"), loop.evals.get("after")
    console = Console()
    if before and after:
        table = Table(title=f"Held-out accuracy, {before['sampled']['tasks']} tasks (95% CI)")
        for col in ("", "before", "after", "change"):
            table.add_column(col)
        for key, label in (
            ("sampled", f"T={loop.ctx.eval.temperature:g}, avg@{loop.ctx.eval.n}"),
            ("greedy", "greedy"),
        ):
            if key in before and key in after:
                b, a = before[key], after[key]
                table.add_row(label, fmt_acc(b), fmt_acc(a), f"{100 * (a['accuracy'] - b['accuracy']):+.1f} pts")
        console.print(table)
    steps, train_s = summary["steps"], summary["train_wall_s"]
    console.print(
        f"run: {loop.run_dir}  plot: {summary['plot']}  ({steps} steps, {train_s:.0f} s training)", soft_wrap=True
    )
    for what, key in (("evaluate the trained model", "eval"), ("export it (transformers folder)", "export")):
        if key in summary.get("model_commands", {}):
            console.print(f"{what}: {summary['model_commands'][key]}", soft_wrap=True, highlight=False)
    speed = summary["speed"]
    if "note" in speed:
        console.print(speed["note"])
    elif speed["steps_per_s"] is not None and speed["idle_steps_per_s"] is not None:
        console.print(
            f"speed: {speed['steps_per_s']:.2f} steps/s (an idle 2-core machine: {speed['idle_steps_per_s']:g})"
        )


def duration(seconds: float) -> str:
    """``8 min 40 s``, ``45 s``."""
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def eval_summary(report: dict[str, Any]) -> dict[str, Any]:
    """The part of an evaluation report the summary keeps: avg@n accuracy, its CI, tasks, n, mean tokens."""
    avg = report["avg@n"]
    return {
        "accuracy": avg["value"],
        "ci": avg["ci"],
        "tasks": report["tasks"],
        "n": report["n"],
        "mean_tokens": report.get("mean_tokens"),
    }


def fmt_acc(e: dict[str, Any]) -> str:
    """``61.7% [58.1, 65.2]``: an accuracy with its 95 % interval."""
    low, high = e["ci"]
    return f"{100 * e['accuracy']:.1f}% [{100 * low:.1f}, {100 * high:.1f}]"
