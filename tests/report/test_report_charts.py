"""What the charts and the sample table show a reader: distinct panels, evaluations where measured, unique columns.

The run directory's ``plots/metrics.png`` and the report's charts are drawn by one code (``lrmgym.report.charts``);
the figure is caught as it is saved and read back (its panels' titles, the held-out markers' style and steps).
"""

from __future__ import annotations

import json
import re

import matplotlib
import pytest
from report_helpers import copy_run, jsonl

from lrmgym.learners.engine.rundir import plot_metrics
from lrmgym.report import build_report
from lrmgym.report.charts import main_panels
from lrmgym.report.page import column_names
from lrmgym.report.rundata import read_run

matplotlib.use("Agg")


@pytest.fixture
def saved_figures(monkeypatch) -> list:
    """Every matplotlib figure saved while the test runs (it is still saved)."""
    from matplotlib.figure import Figure

    figures, save = [], Figure.savefig

    def keep(self, *args, **kwargs):
        figures.append(self)
        return save(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figures


def _plot(run_dir, tmp_path, saved_figures) -> dict:
    """``plots/metrics.png`` of ``run_dir`` drawn again: ``{panel title: axes}`` of its visible panels."""
    metrics = jsonl(run_dir / "metrics.jsonl")
    evals = json.loads((run_dir / "summary.json").read_text())["evals"]
    saved_figures.clear()  # (the run itself, made on first use, saved its own)
    out = plot_metrics(metrics, tmp_path / "metrics.png", evals=evals)
    assert out.read_bytes().startswith(b"\x89PNG")
    (figure,) = saved_figures
    return {ax.get_title(): ax for ax in figure.axes if ax.get_visible()}


def test_a_reward_that_is_the_accuracy_is_one_panel_not_one_curve_twice(make_run, tmp_path, saved_figures):
    run_dir = make_run("ppo")  # the accuracy judge alone: reward == accuracy at every step
    metrics = jsonl(run_dir / "metrics.jsonl")
    assert all(m["reward/mean"] == m["accuracy"] for m in metrics)
    panels = _plot(run_dir, tmp_path, saved_figures)
    assert "reward" not in panels
    assert "accuracy = reward (line: train; markers: held-out)" in panels
    assert [k for k, _ in main_panels(read_run(run_dir).parts)] == ["accuracy", "length/mean", "kl_ref"]


def test_a_reward_with_a_format_judge_has_its_own_panel(make_run, tmp_path, saved_figures):
    run_dir = make_run("grpo")  # accuracy + format_strict: the reward is not the accuracy
    metrics = jsonl(run_dir / "metrics.jsonl")
    assert any(m["reward/mean"] != m["accuracy"] for m in metrics)
    panels = _plot(run_dir, tmp_path, saved_figures)
    reward, accuracy = panels["reward"], panels["accuracy (line: train; markers: held-out)"]
    train = [line for line in reward.lines if not line.get_label().startswith("held-out")]
    assert list(train[0].get_ydata()) == [m["reward/mean"] for m in metrics]
    train = [line for line in accuracy.lines if not line.get_label().startswith("held-out")]
    assert list(train[0].get_ydata()) == [m["accuracy"] for m in metrics]


def test_held_out_evaluations_are_markers_at_the_steps_measured_sampled_and_greedy(make_run, tmp_path, saved_figures):
    run_dir = make_run("grpo")
    evals = json.loads((run_dir / "summary.json").read_text())["evals"]
    panels = _plot(run_dir, tmp_path, saved_figures)
    held_out = {line.get_label(): line for ax in panels.values() for line in ax.lines
                if line.get_label().startswith("held-out")}  # fmt: skip
    assert set(held_out) == {"held-out, sampled", "held-out, greedy"}
    for kind, line in (("sampled", held_out["held-out, sampled"]), ("greedy", held_out["held-out, greedy"])):
        assert line.get_linestyle() == "None"  # not joined: nothing was measured between two evaluations
        assert line.get_marker() not in (None, "None", "")
        points = sorted((e["step"], e[kind]["accuracy"]) for e in evals.values())
        assert list(zip(line.get_xdata(), line.get_ydata(), strict=True)) == points


def test_the_metrics_png_has_loss_gradient_norm_and_the_critics_metrics(make_run, tmp_path, saved_figures):
    panels = _plot(make_run("grpo"), tmp_path / "grpo", saved_figures)
    assert {"loss", "gradient norm"} <= set(panels)
    panels = _plot(make_run("ppo"), tmp_path / "ppo", saved_figures)
    assert {"critic loss", "critic explained variance", "value estimate (mean)", "returns (mean)"} <= set(panels)


def test_the_report_charts_the_critic(make_run):
    page = build_report(make_run("ppo")).html
    chart = page[page.index("id='chart-critic'") :]
    chart = chart[: chart.index("</svg>")]
    for title in ("critic loss", "critic explained variance", "critic gradient norm"):
        assert f">{title}</text>" in chart
    assert "id='chart-critic'" not in build_report(make_run("grpo")).html  # no critic, no empty chart


def _headers(page: str) -> list[str]:
    table = page[page.index("<table class='samples'") : page.index("id='samples-body'")]
    return re.findall(r"<th[^>]*>([^<]*)</th>", table)


def test_sample_table_columns_are_uniquely_named_whatever_the_judges_are_called(make_run, tmp_path):
    run_dir = copy_run(make_run("grpo"), tmp_path / "run")
    records = jsonl(run_dir / "samples.jsonl")
    for record in records:  # judges named like the table's own columns
        for trajectory in record["trajectories"]:
            names = iter(["format", "reward"])
            for component in trajectory["verdict"]["components"]:
                component["name"] = next(names)
    (run_dir / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    headers = _headers(build_report(run_dir).html)
    assert len(headers) == len(set(headers)), headers
    assert headers[-3:] == ["format", "reward (judge)", "format ok (verifier)"]


def test_column_names_never_repeat():
    fixed = ["step", "reward", "verdict"]
    names = column_names(fixed, ["reward", "reward (judge)", "Verdict", "accuracy"], ["format ok (verifier)"])
    assert names == ["step", "reward", "verdict", "reward (judge)", "reward (judge) (judge)", "Verdict (judge)",
                     "accuracy", "format ok (verifier)"]  # fmt: skip


def test_a_metric_logged_at_few_steps_is_points_not_a_line(make_run, tmp_path, saved_figures):
    run_dir = copy_run(make_run("grpo"), tmp_path / "run")
    records = jsonl(run_dir / "metrics.jsonl")
    for m in records:  # the KL logged at the last step only, as a run that measures it every n-th step
        m["kl_ref"] = 0.5 if m["step"] == len(records) else None
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in records))
    panels = _plot(run_dir, tmp_path, saved_figures)
    (line,) = panels["KL to the initial policy"].lines
    assert line.get_linestyle() == "None" and list(line.get_xdata()) == [len(records)]
