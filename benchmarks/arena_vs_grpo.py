"""Plain GRPO against GRPO + Reasoning Arena on the tiny model, the same budget of generated completions.

Reasoning Arena (Zhou et al., arXiv 2606.09380; ``../shared/specs/papers.md`` §1) routes the groups whose
verifiable rewards are all equal (no GRPO gradient) to a pairwise tournament scored by Bradley-Terry. Here the
pairwise judge is the CPU rule judge (:mod:`lrmgym.judges.pairwise_rule`: arithmetic steps, distance of the
answer to the truth, format), a stand-in for the paper's LLM judge.

Every run is one ``lrmgym run`` (the CLI users call) with the same overrides, the arena runs adding
``judge=arena``; each (method, seed) pair uses the same ``run.seed``, so both methods see the same task stream.
Both methods generate exactly ``steps x prompts x group`` completions per run (the arena's judge calls are
comparisons of completions already generated, counted separately). Every ``--eval-every`` steps, and before
and after training, the learner evaluates on the same held-out tasks (the math env's test split, ``eval.seed``
0): ``--eval-n`` samples per task at temperature 1 (avg@n, the primary figure) and one greedy sample.

Reported (``--out``, Markdown):

* the target: plain GRPO's final held-out accuracy (the mean over its seeds);
* for each run, the first evaluation step whose accuracy reaches the target, and the completions generated
  by then (``step x prompts x group``); a run that never reaches it is shown as ``>steps`` (censored);
* final accuracies, each with its bootstrap CI over tasks, and per method the mean over seeds with a
  Student-t 95 % interval over seeds, and the paired (same seed) difference;
* the fraction of groups routed to the tournament over training (per quarter of training), judge calls per
  step, the reward spread inside routed groups, and the judge's agreement with the verifier on mixed groups;
  for plain GRPO the fraction of zero-variance groups (the groups that carried no signal).

Runs whose ``summary.json`` already exists are not run again, so an interrupted benchmark resumes where it
stopped, and ``--report-only`` rewrites the table from the run folders. Run from the repository root::

    python benchmarks/arena_vs_grpo.py --seeds 0 1 2 --steps 120 --jobs 6 \\
        --workdir /tmp/arena_vs_grpo --out benchmarks/results/arena_vs_grpo.md

Timings depend on the machine's load (the table records ``uptime`` at the start and the end).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

METHODS = ("grpo", "arena")
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
"""Two-sided 95 % Student-t quantiles by degrees of freedom (seed-level intervals for a handful of seeds)."""


# --------------------------------------------------------------------------------------------------- running
def run_overrides(args: argparse.Namespace, method: str, seed: int) -> list[str]:
    """The ``lrmgym run`` overrides of one (method, seed) run."""
    over = [
        "env=math", "learner=grpo", f"run.seed={seed}", f"run.output_dir={args.workdir}",
        f"run.name={method}-seed{seed}", f"learner.steps={args.steps}", f"learner.prompts_per_step={args.prompts}",
        f"learner.group_size={args.group}", f"learner.eval_every={args.eval_every}",
        f"learner.checkpoint_every={args.steps}", "learner.progress=false", f"learner.torch_threads={args.threads}",
        "learner.time_budget_s=null",  # the preset stops at 7 minutes: every run must do all its steps
        f"eval.tasks={args.eval_tasks}", f"eval.n={args.eval_n}", f"eval.max_new_tokens={args.eval_max_new_tokens}",
    ]  # fmt: skip
    if args.policy_path:
        over.append(f"policy.path={args.policy_path}")
    if method == "arena":
        over.append("judge=arena")
    return over + list(args.override)


def run_one(args: argparse.Namespace, method: str, seed: int, overrides: list[str] | None = None) -> Path:
    """Run one (method, seed) through the CLI unless its summary exists; returns the run folder.

    ``overrides``: the run's ``lrmgym run`` overrides (default: :func:`run_overrides`), for harnesses that
    reuse this one with other methods.
    """
    run_dir = Path(args.workdir) / f"{method}-seed{seed}"
    if (run_dir / "summary.json").is_file() and finished(run_dir):
        return run_dir
    if run_dir.exists():  # an interrupted run: start it over (a resume would need its checkpoints)
        shutil.rmtree(run_dir)
    over = run_overrides(args, method, seed) if overrides is None else overrides
    cmd = [sys.executable, "-m", "lrmgym.cli.main", "run", *over]
    log = Path(args.workdir) / f"{method}-seed{seed}.log"
    start = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed with exit code {proc.returncode}; see {log}")
    print(f"{method} seed {seed}: {time.perf_counter() - start:.0f} s", flush=True)
    if not finished(run_dir):
        raise RuntimeError(f"{run_dir} stopped before its last step; see {run_dir / 'summary.json'}")
    return run_dir


def finished(run_dir: Path) -> bool:
    """Whether a run with a ``summary.json`` did all its planned steps (not stopped by a time budget)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    return summary.get("status") == "finished" and summary.get("steps") == summary.get("steps_planned")


# --------------------------------------------------------------------------------------------------- reading
@dataclass
class RunResult:
    """What one run's folder says."""

    method: str
    seed: int
    curve: list[tuple[int, float, tuple[float, float]]]  # (step, avg@n accuracy, CI), by step
    greedy: list[tuple[int, float]]  # (step, greedy accuracy), by step
    metrics: list[dict[str, Any]]  # metrics.jsonl lines
    wall_s: float
    partial: bool = False  # unfinished: its evaluations so far

    @property
    def final(self) -> tuple[float, tuple[float, float]]:
        """Final held-out accuracy and its CI."""
        return self.curve[-1][1], self.curve[-1][2]

    def first_reaching(self, target: float) -> int | None:
        """The first evaluated step whose accuracy is at least ``target`` (None: never)."""
        return next((step for step, acc, _ in self.curve if acc >= target - 1e-12), None)

    def series(self, key: str) -> list[float]:
        """Non-null values of a metric over the steps."""
        return [m[key] for m in self.metrics if m.get(key) is not None]


def read_run(run_dir: Path, method: str, seed: int) -> RunResult:
    """Parse one run folder: ``summary.json`` when the run finished, else its evaluations so far (partial)."""
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    if (run_dir / "summary.json").is_file() and finished(run_dir):
        summary = json.loads((run_dir / "summary.json").read_text())
        evals = sorted(summary["evals"].values(), key=lambda e: e["step"])
        curve = [(e["step"], e["sampled"]["accuracy"], tuple(e["sampled"]["ci"])) for e in evals]
        greedy = [(e["step"], e["greedy"]["accuracy"]) for e in evals if "greedy" in e]
        return RunResult(method, seed, curve, greedy, metrics, float(summary["train_wall_s"]))
    reports = {}  # step -> (sampled report, greedy report or None), from eval/step_<k>[_greedy]/eval.json
    for path in (run_dir / "eval").glob("step_*/eval.json"):
        tag = path.parent.name.removeprefix("step_")
        step, greedy = int(tag.removesuffix("_greedy")), tag.endswith("_greedy")
        reports.setdefault(step, [None, None])[int(greedy)] = json.loads(path.read_text())
    steps = sorted(k for k, (sampled, _) in reports.items() if sampled is not None)
    curve = [(k, reports[k][0]["avg@n"]["value"], tuple(reports[k][0]["avg@n"]["ci"])) for k in steps]
    greedy = [(k, reports[k][1]["avg@n"]["value"]) for k in steps if reports[k][1] is not None]
    wall = sum(m["time/step_s"] for m in metrics)
    return RunResult(method, seed, curve, greedy, metrics, wall, partial=True)


def partial_note(step: int) -> list[str]:
    """The report's warning that some runs were unfinished."""
    return [f"**Partial results: some runs were unfinished; every run is reported up to step {step}, the last "
            "step that all of them had evaluated.**", ""]  # fmt: skip


def truncated(run: RunResult, step: int) -> RunResult:
    """``run`` as it was at ``step``: its evaluations and metrics up to that step."""
    return RunResult(
        run.method, run.seed, [c for c in run.curve if c[0] <= step], [g for g in run.greedy if g[0] <= step],
        [m for m in run.metrics if m["step"] <= step], run.wall_s * step / max(len(run.metrics), 1), run.partial,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------------- stats
def mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its two-sided 95 % Student-t interval (nan with fewer than 2 values)."""
    m = statistics.fmean(values)
    if len(values) < 2:
        return m, math.nan
    return m, T975.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))


def mean_or_nan(values: list[float]) -> float:
    """The mean, or nan for no values."""
    return statistics.fmean(values) if values else math.nan


def pct(x: float) -> str:
    """A fraction as a percentage with one decimal."""
    return "n/a" if x is None or math.isnan(x) else f"{100 * x:.1f}"


def quarters(values: list[float]) -> list[float]:
    """Means of the four quarters of a per-step series (fewer parts when it is shorter than four)."""
    parts = min(4, len(values))
    bounds = [round(k * len(values) / parts) for k in range(parts + 1)]
    return [statistics.fmean(values[bounds[k] : bounds[k + 1]]) for k in range(parts)]


# --------------------------------------------------------------------------------------------------- report
def report(args: argparse.Namespace, runs: list[RunResult], load: tuple[str, str], cmd: str) -> str:
    """The Markdown results."""
    by = {m: sorted((r for r in runs if r.method == m), key=lambda r: r.seed) for m in METHODS}
    per_step = args.prompts * args.group
    target = statistics.fmean(r.final[0] for r in by["grpo"])
    plain_final = {r.seed: r.final[0] for r in by["grpo"]}
    out = [
        "# Plain GRPO vs GRPO + Reasoning Arena (rule-based pairwise judge), tiny model",
        "",
        "Reproduce (from the repository root, lrmgym's venv; `--report-only` rewrites this file from the runs):",
        "",
        "```",
        cmd,
        "```",
        "",
        *(partial_note(args.steps) if any(r.partial for r in runs) else []),
        f"Setup: `env=math` (procedural level-1 arithmetic), `policy=tiny` (the embedded ~0.8 M-parameter model"
        f"{model_note(args.policy_path)}), `learner=grpo` preset with "
        f"{args.steps} steps x {args.prompts} prompts x group {args.group} = **{args.steps * per_step} generated "
        f"completions per run, for both methods**; the arena runs add `judge=arena` (its preset: route groups "
        f"whose verifiable rewards are all equal, 3 anchors, rule pairwise judge, 2 audit pairs per mixed group). "
        f"Held-out evaluation every {args.eval_every} steps on the same {args.eval_tasks} test-split tasks, "
        f"avg@{args.eval_n} at temperature 1 (the accuracy used below) and greedy. Seeds: "
        f"{', '.join(str(r.seed) for r in by['grpo'])} (the same `run.seed` gives both methods the same task "
        f"stream). Load average (1, 5, 15 min) at the start: {load[0]}; at the end: {load[1]} "
        f"(2 shared CPU cores; wall times are noisy).",
        "",
        f"## Steps to reach plain GRPO's final held-out accuracy ({pct(target)} %)",
        "",
        "The target is the mean over seeds of plain GRPO's final avg@n accuracy. A step is counted when an "
        f"evaluation (every {args.eval_every} steps) first shows an accuracy at or above the target; `>N` means "
        "not reached within the budget. The paired column uses each seed's own plain-GRPO final accuracy as "
        "that seed's target.",
        "",
        "| method | seed | steps to target | completions to target | steps to paired target "
        "| final avg@n (95 % CI over tasks) | final greedy | train wall (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    reach: dict[str, list[int | None]] = {m: [] for m in METHODS}
    for m in METHODS:
        for r in by[m]:
            s = r.first_reaching(target)
            sp = r.first_reaching(plain_final[r.seed]) if r.seed in plain_final else None
            reach[m].append(s)
            acc, (lo, hi) = r.final
            greedy = pct(r.greedy[-1][1]) if r.greedy else "n/a"
            name = f"{m} (unfinished: last evaluation at step {r.curve[-1][0]})" if r.partial else m
            out.append(
                f"| {name} | {r.seed} | {s if s is not None else f'>{args.steps}'} | "
                f"{s * per_step if s is not None else f'>{args.steps * per_step}'} | "
                f"{sp if sp is not None else f'>{args.steps}'} | {pct(acc)} [{pct(lo)}, {pct(hi)}] | {greedy} | "
                f"{r.wall_s:.0f} |"
            )
    out += [
        "",
        "| method | runs reaching the target | mean steps to target (reaching runs) "
        "| mean final avg@n +- 95 % t-interval over seeds | mean final greedy |",
        "|---|---|---|---|---|",
    ]
    means: dict[str, float] = {}
    for m in METHODS:
        hit = [s for s in reach[m] if s is not None]
        means[m] = statistics.fmean(hit) if hit else math.nan
        fm, fh = mean_ci([r.final[0] for r in by[m]])
        gm = statistics.fmean(r.greedy[-1][1] for r in by[m] if r.greedy) if any(r.greedy for r in by[m]) else math.nan
        steps_txt = f"{means[m]:.1f} ({statistics.fmean(hit) * per_step:.0f} completions)" if hit else "-"
        out.append(f"| {m} | {len(hit)}/{len(by[m])} | {steps_txt} | {pct(fm)} +- {pct(fh)} | {pct(gm)} |")
    diffs = [a.final[0] - plain_final[a.seed] for a in by["arena"] if a.seed in plain_final]
    if diffs:
        dm, dh = mean_ci(diffs)
        out += ["", f"Paired final-accuracy difference (arena - plain, same seed): {100 * dm:+.1f} +- {pct(dh)} "
                f"points (95 % t-interval over {len(diffs)} seeds; per seed: "
                f"{', '.join(f'{100 * d:+.1f}' for d in diffs)})."]  # fmt: skip
    start = statistics.fmean(r.curve[0][1] for r in by["grpo"])
    if by["grpo"][0].curve[0][0] == 0 and target <= start:
        out.append(f"**Plain GRPO ended no higher than it started ({pct(start)} % before training, mean over seeds): "
                   "the steps-to-target figures measure noise, not learning speed.**")  # fmt: skip
    if all(reach[m] and all(s is not None for s in reach[m]) for m in METHODS) and means["grpo"] > 0:
        out.append(f"Step reduction (1 - arena mean / plain mean): {100 * (1 - means['arena'] / means['grpo']):.0f} % "
                   "(the paper reports 27-41 % fewer steps).")  # fmt: skip
    out += ["", "## Held-out accuracy over training (avg@n, %, mean over seeds)", "",
            "| step | " + " | ".join(METHODS) + " |", "|---|" + "---|" * len(METHODS)]  # fmt: skip
    steps_all = sorted({s for r in runs for s, _, _ in r.curve})
    for step in steps_all:
        cells = []
        for m in METHODS:
            vals = [acc for r in by[m] for s, acc, _ in r.curve if s == step]
            cells.append(pct(statistics.fmean(vals)) if vals else "")
        out.append(f"| {step} | " + " | ".join(cells) + " |")
    out += ["", "## Routing over training", "",
            "Per quarter of training, mean over seeds. For plain GRPO, the fraction of zero-variance groups (no "
            "gradient); for the arena, the fraction of groups routed to the tournament (the same all-equal rule), "
            "judge calls per step, the std of rewards inside routed groups, and the pairwise judge's agreement "
            "with the verifier on mixed groups (1 = always prefers the correct trace).",
            "", "| quantity | Q1 | Q2 | Q3 | Q4 | whole run |", "|---|---|---|---|---|---|"]  # fmt: skip
    rows = [
        ("plain GRPO: zero-variance groups (%)", "grpo", "zero_variance_frac", 100.0),
        ("arena: groups routed (%)", "arena", "judge/arena/frac_routed", 100.0),
        ("arena: judge calls per step", "arena", "judge/arena/judge_calls", 1.0),
        ("arena: reward std inside routed groups", "arena", "judge/arena/routed_reward_std", 1.0),
        ("arena: routed groups with no signal (all ties, per step)", "arena", "judge/arena/groups_no_signal", 1.0),
        ("arena: judge-verifier agreement on mixed groups (%)", "arena", "judge/arena/audit_agreement", 100.0),
        ("plain GRPO: training-sample accuracy (%)", "grpo", "accuracy", 100.0),
        ("arena: training-sample accuracy (%)", "arena", "accuracy", 100.0),
    ]  # fmt: skip
    for label, m, key, scale in rows:
        qs = [quarters(r.series(key)) for r in by[m] if r.series(key)]
        if not qs:
            continue
        cols = [mean_or_nan([q[k] for q in qs if k < len(q)]) * scale for k in range(4)]
        whole = statistics.fmean(statistics.fmean(r.series(key)) for r in by[m] if r.series(key)) * scale
        out.append(f"| {label} | " + " | ".join(f"{c:.2f}" for c in cols) + f" | {whole:.2f} |")
    return "\n".join(out) + "\n"


def model_note(policy_path: str | None) -> str:
    """Which tiny model the runs loaded: the cache key in its ``build.json`` when a copy was given."""
    if not policy_path:
        return ", from the cache"
    build = Path(policy_path) / "build.json"
    key = json.loads(build.read_text()).get("key", "?") if build.is_file() else "?"
    return f", loaded from `{policy_path}`: a copy of the tiny cache folder with build key `{key}`"


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages."""
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="run.seed values (each method runs each)")
    p.add_argument("--steps", type=int, default=120, help="GRPO steps per run")
    p.add_argument("--prompts", type=int, default=16, help="prompts per step")
    p.add_argument("--group", type=int, default=8, help="completions per prompt")
    p.add_argument("--eval-every", type=int, default=10, help="held-out evaluation every this many steps")
    p.add_argument("--eval-tasks", type=int, default=200, help="held-out tasks per evaluation")
    p.add_argument("--eval-n", type=int, default=4, help="samples per held-out task (avg@n)")
    p.add_argument("--eval-max-new-tokens", type=int, default=48, help="token budget of evaluation samples")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run (1 is fastest on a busy machine)")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time")
    p.add_argument("--policy-path", default=None, help="policy.path (a copy of the tiny model); default: the cache")
    p.add_argument("--override", action="append", default=[], help="extra `lrmgym run` override (repeatable)")
    p.add_argument("--workdir", default="/tmp/arena_vs_grpo", help="folder of the run directories")
    p.add_argument("--out", default="benchmarks/results/arena_vs_grpo.md", help="Markdown results file")
    p.add_argument("--report-only", action="store_true", help="only rewrite --out from finished runs")
    args = p.parse_args(argv)
    for name in ("steps", "prompts", "group", "eval_every", "eval_tasks", "eval_n", "jobs"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}.")
    if args.group < 2:
        p.error(f"--group must be at least 2 (advantages compare samples within a group), got {args.group}.")
    return args


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces this benchmark."""
    parts = ["python benchmarks/arena_vs_grpo.py", "--seeds", *map(str, args.seeds), "--steps", str(args.steps),
             "--prompts", str(args.prompts), "--group", str(args.group), "--eval-every", str(args.eval_every),
             "--eval-tasks", str(args.eval_tasks), "--eval-n", str(args.eval_n), "--eval-max-new-tokens",
             str(args.eval_max_new_tokens), "--threads", str(args.threads), "--jobs", str(args.jobs),
             "--workdir", args.workdir, "--out", args.out]  # fmt: skip
    if args.policy_path:
        parts += ["--policy-path", args.policy_path]
    for o in args.override:
        parts += ["--override", o]
    return " ".join(parts)


def main(argv: list[str] | None = None) -> None:
    """Run the missing runs (``--jobs`` at a time), then write the report."""
    args = parse_args(argv)
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    state = Path(args.workdir) / "load.json"
    loads = json.loads(state.read_text()) if state.is_file() else {"start": loadavg()}
    state.write_text(json.dumps(loads))
    pairs = [(m, s) for s in args.seeds for m in METHODS]
    if not args.report_only:
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            for fut in [pool.submit(run_one, args, m, s) for m, s in pairs]:
                fut.result()
        loads["end"] = loadavg()
        state.write_text(json.dumps(loads))
    runs = [read_run(Path(args.workdir) / f"{m}-seed{s}", m, s) for m, s in pairs
            if (Path(args.workdir) / f"{m}-seed{s}" / "metrics.jsonl").is_file()]  # fmt: skip
    if not any(r.method == "grpo" for r in runs):
        sys.exit(f"No plain-GRPO run in {args.workdir}: nothing to report yet.")
    cmd = command_line(args)
    if any(r.partial for r in runs):  # compare every run at the last step that all of them have evaluated
        args.steps = min(r.curve[-1][0] for r in runs)
        runs = [truncated(r, args.steps) for r in runs]
        print(f"Unfinished runs: reporting every run up to step {args.steps}.", file=sys.stderr)
    text = report(args, runs, (loads["start"], loads.get("end", "(unfinished)")), cmd)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
