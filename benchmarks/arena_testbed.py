"""Reasoning Arena on the reasoning testbed: Arena-Live vs ArenaRL vs pointwise vs RLVR (CISPO) vs DAPO sampling.

Reasoning Arena (Zhou et al., arXiv 2606.09380; ``../shared/specs/papers.md`` §1.7-1.8) claims, against a CISPO
RLVR baseline: (a) zero-variance groups become more common late in training, (b) about 25-40 % fewer steps to
the baseline's final accuracy, (c) about 0.5x the generations per optimiser step of a dynamic-sampling
baseline, and (d) the ablation order Arena-Live > ArenaRL (tournament everywhere) > pointwise judge > RLVR.
This harness tests those claims on ``env=testbed policy.recipe=testbed`` in a setting with many all-wrong
groups at the start, with the CPU rule judges as stand-ins for the paper's LLM judges:

* ``rlvr``: ``learner=cispo`` (GRPO-normalised advantages, the CISPO loss), the verifier's reward;
* ``dapo``: the same CISPO learner with DAPO's dynamic sampling (``learner=dapo learner.pg_loss=cispo``): groups
  without reward variance are dropped and the batch refilled from the task stream (its generations counted);
* ``arena_live``: CISPO + ``judge=arena`` routing all-equal groups to the anchor tournament, with the
  cross-step per-prompt pool of the best traces (``pool=prompt pool_keep=best``);
* ``arena_rl``: CISPO + ``judge=arena route_when=always tournament=round_robin`` (every group, every pair);
* ``pointwise``: CISPO + ``judge=rule_pointwise judge.accuracy.weight=0``: the pointwise score is the reward of
  every group, as the tournament's is in ArenaRL (our stand-in for the paper's LLM pointwise judge, "RLAIF":
  one trace scored alone on the rule judge's facts).

Every run is one ``lrmgym run`` with the same overrides but its arm's; each seed gives every arm the same
``run.seed``, so the same task stream (``env.num_problems`` makes it a finite set, so prompts recur and the
arena's per-prompt pool meets them again). Held-out evaluation every ``--eval-every`` steps on the same test
tasks (avg@n at temperature 1). Runs whose ``summary.json`` exists are skipped (the benchmark resumes), and
``--report-only`` rewrites the page from the run folders (keeping a hand-written ``## Reading`` section). One
run at a time, one thread. From the repository root::

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 5 python benchmarks/arena_testbed.py --seeds 0 1 2 3 4 \\
        --steps 80 --workdir /tmp/arena_testbed --out benchmarks/results/arena_testbed.md
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from arena_vs_grpo import RunResult, loadavg, mean_ci, mean_or_nan, pct, quarters, read_run, run_one

ARMS: dict[str, list[str]] = {
    "rlvr": ["learner=cispo"],
    "dapo": ["learner=dapo", "learner.pg_loss=cispo", "learner.clip_high=4.0"],
    "arena_live": ["learner=cispo", "judge=arena", "judge.arena.pool=prompt", "judge.arena.pool_keep=best"],
    "arena_rl": ["learner=cispo", "judge=arena", "judge.arena.route_when=always", "judge.arena.tournament=round_robin"],
    "pointwise": ["learner=cispo", "judge=rule_pointwise", "judge.accuracy.weight=0"],
}
"""Each arm's own overrides (the rest are shared: :func:`overrides`)."""
LABELS = {"rlvr": "RLVR (CISPO)", "dapo": "DAPO sampling (CISPO loss)", "arena_live": "Arena-Live",
          "arena_rl": "ArenaRL", "pointwise": "pointwise (rule)"}  # fmt: skip
READING = "## Reading"
"""A section of the page that starts with this heading is kept (at the end) when the page is rewritten."""
ORDER = ("arena_live", "arena_rl", "pointwise", "rlvr")
"""The paper's ablation order, best first (§1.8 target d)."""


def overrides(args: argparse.Namespace, arm: str, seed: int) -> list[str]:
    """The ``lrmgym run`` overrides of one (arm, seed) run."""
    over = [
        "env=testbed", "policy.recipe=testbed", f"env.max_ops={args.max_ops}",
        f"env.two_digit_share={args.two_digit_share}", f"env.num_problems={args.num_problems}",
        *ARMS[arm], f"run.seed={seed}", f"run.output_dir={args.workdir}", f"run.name={arm}-seed{seed}",
        f"learner.lr={args.lr}", f"learner.steps={args.steps}", f"learner.prompts_per_step={args.prompts}",
        f"learner.group_size={args.group}",
        f"learner.eval_every={args.eval_every}", f"learner.checkpoint_every={args.steps}", "learner.progress=false",
        "learner.torch_threads=1", "learner.async_rollouts=false", "learner.eval_greedy=false",
        f"eval.tasks={args.eval_tasks}", f"eval.n={args.eval_n}",
    ]  # fmt: skip
    if arm in ("arena_live",):
        over.append(f"judge.arena.pool_size={args.pool_size}")
    return over


# --------------------------------------------------------------------------------------------------- stats
def verdict(diffs: list[float], unit: str = "points", scale: float = 100.0) -> str:
    """A paired difference's mean, 95 % t-interval over seeds, and whether the claimed direction (> 0) held."""
    if len(diffs) < 2:
        return "n/a (fewer than 2 seeds)"
    m, h = mean_ci(diffs)
    text = f"{scale * m:+.1f} +- {scale * h:.1f} {unit} (per seed {', '.join(f'{scale * d:+.1f}' for d in diffs)})"
    if m - h > 0:
        return f"{text}: **held**"
    if m + h < 0:
        return f"{text}: **did not hold** (reversed)"
    return f"{text}: **not separable at this noise**"


def curve_mean(run: RunResult) -> float:
    """Mean held-out accuracy over the evaluations after step 0 (the area under the learning curve)."""
    vals = [acc for step, acc, _ in run.curve if step > 0]
    return statistics.fmean(vals) if vals else math.nan


def censored(reached: dict[int, int | None], seed: int, steps: int) -> str:
    """A run's steps to the target: the step, ``>steps`` when never reached, blank when the seed has no run."""
    if seed not in reached:
        return ""
    return f">{steps}" if reached[seed] is None else str(reached[seed])


def generations_until(run: RunResult, step: int) -> float:
    """Completions the run sampled in its first ``step`` optimiser steps (DAPO's extra rounds included)."""
    return float(sum(m.get("generations", 0) for m in run.metrics if m["step"] <= step))


def series_mean(runs: list[RunResult], key: str) -> tuple[list[float], list[float]]:
    """Per seed: the mean of a per-step metric, and its four quarter means averaged over seeds."""
    per_seed = [statistics.fmean(r.series(key)) for r in runs if r.series(key)]
    qs = [quarters(r.series(key)) for r in runs if r.series(key)]
    return per_seed, [mean_or_nan([q[k] for q in qs if k < len(q)]) for k in range(4)]


# --------------------------------------------------------------------------------------------------- report
def report(args: argparse.Namespace, runs: dict[str, list[RunResult]], loads: dict, cmd: str) -> str:
    """The Markdown page."""
    arms = [a for a in ARMS if runs.get(a)]
    seeds = sorted({r.seed for a in arms for r in runs[a]})
    base = {r.seed: r for r in runs["rlvr"]}
    target = statistics.fmean(r.final[0] for r in runs["rlvr"])
    during = loads.get("during", [])
    out = [
        "# Reasoning Arena on the reasoning testbed: Arena-Live, ArenaRL, pointwise, RLVR (CISPO), DAPO sampling",
        "",
        "Reproduce (from the repository root, lrmgym's venv; `--report-only` rewrites this page from the runs):",
        "", "```", cmd, "```", "",
        f"Setup: `env=testbed policy.recipe=testbed env.max_ops={args.max_ops} env.two_digit_share="
        f"{args.two_digit_share}`, `learner.lr={args.lr}` for every arm (chains of 1-{args.max_ops} operations; "
        "about 42 % all-wrong groups at the start "
        f"per `benchmarks/results/testbed.md`), `env.num_problems={args.num_problems}` (a finite training set, so "
        f"each prompt recurs about every {args.num_problems // args.prompts} steps), {args.steps} steps x "
        f"{args.prompts} prompts x G={args.group}, synchronous rollouts, one thread per run, one run at a time. "
        f"Held-out: every {args.eval_every} steps, the same {args.eval_tasks} test-split tasks, avg@{args.eval_n} at "
        f"temperature 1. Seeds {', '.join(map(str, seeds))} (`run.seed`: every arm sees the same task stream per "
        "seed). Intervals are two-sided 95 % Student-t over seeds; differences are paired by seed. The judges are "
        "CPU rules, not the paper's LLM judges: the pairwise one (`rule_pairwise`: verified arithmetic work, then "
        "distance of the answer, then format) and our pointwise stand-in (`rule_pointwise`: 0.6 x first-error "
        "score + 0.3 x closeness + 0.1 x format, one trace alone).",
        "",
        f"Load average (1, 5, 15 min) at the start: {loads.get('start', '?')}; at the end: "
        f"{loads.get('end', '(unfinished)')}; after each run (1 min): "
        f"{', '.join(x.split(',')[0] for x in during) if during else 'n/a'} (2 CPU cores shared by three "
        "engineers' experiments: wall times are noisy, step counts and accuracies are not affected).",
        "",
        "| arm | overrides |", "|---|---|",
        *[f"| {LABELS[a]} | `{' '.join(ARMS[a])}` |" for a in arms],
        "",
        f"## Steps to reach RLVR's final held-out accuracy ({pct(target)} %)",
        "",
        "A run reaches the target at the first evaluation whose avg@n is at or above it (`>N`: not within the "
        "budget). `paired` uses the same seed's RLVR final accuracy as that seed's target.",
        "",
        "| arm | " + " | ".join(f"seed {s}" for s in seeds) + " | reached | mean steps (reaching runs) | "
        "mean generations (reaching runs) | paired: " + " | ".join(f"seed {s}" for s in seeds) + " |",
        "|---|" + "---|" * (2 * len(seeds) + 3),
    ]  # fmt: skip
    reach: dict[str, dict[int, int | None]] = {}
    for a in arms:
        reach[a] = {r.seed: r.first_reaching(target) for r in runs[a]}
        paired = {r.seed: r.first_reaching(base[r.seed].final[0]) if r.seed in base else None for r in runs[a]}
        hit = [s for s in reach[a].values() if s is not None]
        cells = [censored(reach[a], s, args.steps) for s in seeds]
        pcells = [censored(paired, s, args.steps) for s in seeds]
        mean_txt = f"{statistics.fmean(hit):.1f}" if hit else "-"
        spent = [generations_until(r, reach[a][r.seed]) for r in runs[a] if reach[a][r.seed] is not None]
        gen_txt = f"{statistics.fmean(spent):.0f}" if spent else "-"
        out.append(f"| {LABELS[a]} | " + " | ".join(cells) + f" | {len(hit)}/{len(runs[a])} | {mean_txt} | "
                   f"{gen_txt} | " + " | ".join(pcells) + " |")  # fmt: skip
    rlvr_hit = [reach["rlvr"][s] for s in seeds if reach["rlvr"].get(s) is not None]
    out.append("")
    start = mean_or_nan([r.curve[0][1] for r in runs["rlvr"] if r.curve and r.curve[0][0] == 0])
    if target <= start + 0.01:
        out.append(f"**RLVR ended within a point of where it started ({pct(start)} % at step 0, mean over seeds): "
                   "steps to its final accuracy measure noise, not learning speed.**")  # fmt: skip
    if rlvr_hit and "arena_live" in reach:
        both = [s for s in seeds if reach["rlvr"].get(s) and reach["arena_live"].get(s) is not None]  # RLVR > 0
        if both:
            red = [1 - reach["arena_live"][s] / reach["rlvr"][s] for s in both]
            out.append(f"Arena-Live's step reduction against RLVR, per seed where both reached the target: "
                       f"{', '.join(f'{100 * x:.0f} %' for x in red)}; mean {verdict(red, '%')} (claim (b): "
                       "25-40 % fewer steps; the steps are censored at the evaluation grid and RLVR reaches its own "
                       "mean final accuracy only near the end by construction).")  # fmt: skip
    out += ["", "## Final held-out accuracy (avg@n, %) and the learning curve's mean", "",
            "| arm | " + " | ".join(f"seed {s}" for s in seeds) + " | mean +- 95 % t | curve mean +- 95 % t |",
            "|---|" + "---|" * (len(seeds) + 2)]  # fmt: skip
    for a in arms:
        finals = {r.seed: r.final[0] for r in runs[a]}
        fm, fh = mean_ci(list(finals.values()))
        cm, ch = mean_ci([curve_mean(r) for r in runs[a]])
        out.append(f"| {LABELS[a]} | " + " | ".join(pct(finals[s]) if s in finals else "" for s in seeds)
                   + f" | {pct(fm)} +- {pct(fh)} | {pct(cm)} +- {pct(ch)} |")  # fmt: skip
    out += ["", "## Held-out accuracy over training (avg@n, %, mean over seeds)", "",
            "| step | " + " | ".join(LABELS[a] for a in arms) + " |", "|---|" + "---|" * len(arms)]  # fmt: skip
    for step in sorted({s for a in arms for r in runs[a] for s, _, _ in r.curve}):
        cells = [mean_or_nan([acc for r in runs[a] for s, acc, _ in r.curve if s == step]) for a in arms]
        out.append(f"| {step} | " + " | ".join(pct(c) for c in cells) + " |")
    out += ["", "## The ablation order (claim (d): Arena-Live > ArenaRL > pointwise > RLVR)", "",
            "Paired by seed, 95 % t-interval over seeds; **held** when the interval lies above 0, **did not "
            "hold** when it lies below, otherwise not separable at this noise.", "",
            "| claim | final accuracy difference | curve-mean difference |", "|---|---|---|"]  # fmt: skip
    pairs = list(zip(ORDER, ORDER[1:], strict=False)) + [("arena_live", "rlvr"), ("arena_live", "dapo")]
    for hi, lo in pairs:
        if hi not in runs or lo not in runs:
            continue
        a, b = {r.seed: r for r in runs[hi]}, {r.seed: r for r in runs[lo]}
        common = sorted(set(a) & set(b))
        fin = [a[s].final[0] - b[s].final[0] for s in common]
        auc = [curve_mean(a[s]) - curve_mean(b[s]) for s in common]
        out.append(f"| {LABELS[hi]} > {LABELS[lo]} | {verdict(fin)} | {verdict(auc)} |")
    out += ["", "## Generations per optimiser step, judge calls, compute", "",
            "Generations are completions sampled for the step (DAPO's over-sampling rounds included; "
            "`generations` in metrics.jsonl). Judge calls are pairwise comparisons of the arena (audits of mixed "
            "groups excluded) or pointwise scorings. Train wall is the runs' own `train_wall_s` under the load "
            "above.", "",
            "| arm | generations / step: " + " | ".join(f"seed {s}" for s in seeds)
            + " | mean +- 95 % t | judge calls / step | total generations / run | train wall s / run |",
            "|---|" + "---|" * (len(seeds) + 4)]  # fmt: skip
    gens: dict[str, list[float]] = {}
    for a in arms:
        per = {r.seed: statistics.fmean(r.series("generations")) for r in runs[a] if r.series("generations")}
        gens[a] = list(per.values())
        gm, gh = mean_ci(gens[a]) if gens[a] else (math.nan, math.nan)
        key = "judge/arena/judge_calls" if a.startswith("arena") else "judge/rule_pointwise/calls"
        calls = mean_or_nan(series_mean(runs[a], key)[0]) if a not in ("rlvr", "dapo") else 0.0
        total = mean_or_nan([sum(r.series("generations")) for r in runs[a]])
        wall = mean_or_nan([r.wall_s for r in runs[a]])
        out.append(f"| {LABELS[a]} | " + " | ".join(f"{per[s]:.1f}" if s in per else "" for s in seeds)
                   + f" | {gm:.1f} +- {gh:.1f} | {calls:.1f} | {total:.0f} | {wall:.0f} |")  # fmt: skip
    if gens.get("dapo") and gens.get("arena_live"):
        ratio = statistics.fmean(gens["arena_live"]) / statistics.fmean(gens["dapo"])
        held = ("held (about half)" if 0.4 <= ratio <= 0.6 else "partly held (fewer generations, but not half)"
                if 0.6 < ratio < 1 else "did not hold")  # fmt: skip
        out.append("")
        out.append(f"Arena-Live / DAPO generations per optimiser step: **{ratio:.2f}x** (claim (c): about 0.5x; "
                   f"{held} here at this share of zero-variance groups).")  # fmt: skip
    out += ["", "## Zero-variance groups over training (claim (a): should rise as all-correct groups take over)", "",
            "Per quarter of training, mean over seeds, %. RLVR's `zero_variance_frac` is the share of groups whose "
            "verifiable rewards are all equal; Arena-Live's `frac_routed` is the same test (its routed groups); "
            "`all_failed_frac` is the share of all-wrong groups of every arm.", "",
            "| quantity | Q1 | Q2 | Q3 | Q4 | whole run |", "|---|---|---|---|---|---|"]  # fmt: skip
    rows = [("RLVR: zero-variance groups", "rlvr", "zero_variance_frac"),
            ("Arena-Live: groups routed (all equal)", "arena_live", "judge/arena/frac_routed"),
            *[(f"{LABELS[a]}: all-wrong groups", a, "all_failed_frac") for a in arms],
            *[(f"{LABELS[a]}: training-sample accuracy", a, "accuracy") for a in arms]]  # fmt: skip
    for label, a, key in rows:
        if a not in runs:
            continue
        per_seed, qs = series_mean(runs[a], key)
        if per_seed:
            out.append(f"| {label} | " + " | ".join(pct(q) for q in qs) + f" | {pct(statistics.fmean(per_seed))} |")
    zq = series_mean(runs["rlvr"], "zero_variance_frac")[1]
    if len(zq) == 4:
        rose = zq[3] > zq[0]
        out.append("")
        out.append(f"Claim (a): RLVR's zero-variance share went from {pct(zq[0])} % (Q1) to {pct(zq[3])} % (Q4): "
                   f"{'held (it rose)' if rose else 'did not hold (it did not rise)'}; see the all-wrong rows for "
                   "which kind of group it is.")  # fmt: skip
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="run.seed values (every arm)")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS), help="arms to run")
    p.add_argument("--steps", type=int, default=80, help="optimiser steps per run")
    p.add_argument("--lr", type=float, default=1e-4, help="learner.lr of every arm (the presets' 4e-4 collapsed)")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step")
    p.add_argument("--group", type=int, default=8, help="completions per prompt (G)")
    p.add_argument("--max-ops", type=int, default=3, help="env.max_ops")
    p.add_argument("--two-digit-share", type=float, default=0.2, help="env.two_digit_share")
    p.add_argument("--num-problems", type=int, default=256, help="env.num_problems: the finite training set")
    p.add_argument("--pool-size", type=int, default=8, help="Arena-Live's traces kept per prompt")
    p.add_argument("--eval-every", type=int, default=10, help="held-out evaluation every this many steps")
    p.add_argument("--eval-tasks", type=int, default=96, help="held-out tasks per evaluation")
    p.add_argument("--eval-n", type=int, default=2, help="samples per held-out task (avg@n)")
    p.add_argument("--workdir", default="/tmp/arena_testbed", help="folder of the run directories")
    p.add_argument("--out", default="benchmarks/results/arena_testbed.md", help="Markdown results page")
    p.add_argument("--report-only", action="store_true", help="only rewrite --out from the runs")
    args = p.parse_args(argv)
    for name in ("steps", "prompts", "eval_every", "eval_tasks", "eval_n", "num_problems", "pool_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}.")
    if args.group < 2:
        p.error(f"--group must be at least 2 (advantages compare samples within a group), got {args.group}.")
    if "rlvr" not in args.arms:
        p.error("--arms must include rlvr: every figure is relative to the RLVR baseline.")
    return args


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces the page."""
    parts = ["OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 5 python benchmarks/arena_testbed.py",
             "--seeds", *map(str, args.seeds), "--arms", *args.arms, "--steps", str(args.steps), "--lr", str(args.lr),
             "--prompts", str(args.prompts), "--group", str(args.group), "--max-ops", str(args.max_ops),
             "--two-digit-share", str(args.two_digit_share), "--num-problems", str(args.num_problems),
             "--pool-size", str(args.pool_size), "--eval-every", str(args.eval_every),
             "--eval-tasks", str(args.eval_tasks), "--eval-n", str(args.eval_n),
             "--workdir", args.workdir, "--out", args.out]  # fmt: skip
    return " ".join(parts)


def main(argv: list[str] | None = None) -> None:
    """Run the missing runs one at a time (seed by seed, every arm), then write the page."""
    args = parse_args(argv)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    state = work / "load.json"
    loads = json.loads(state.read_text()) if state.is_file() else {"start": loadavg(), "during": []}
    state.write_text(json.dumps(loads))
    if not args.report_only:
        for seed in args.seeds:
            for arm in args.arms:
                if not (work / f"{arm}-seed{seed}" / "summary.json").is_file():
                    run_one(args, arm, seed, overrides(args, arm, seed))
                    loads["during"].append(loadavg())
                    state.write_text(json.dumps(loads))
        loads["end"] = loadavg()
        state.write_text(json.dumps(loads))
    runs: dict[str, list[RunResult]] = {}
    for arm in args.arms:
        for seed in args.seeds:
            run_dir = work / f"{arm}-seed{seed}"
            if (run_dir / "summary.json").is_file():
                runs.setdefault(arm, []).append(read_run(run_dir, arm, seed))
    if not runs.get("rlvr"):
        sys.exit(f"No finished RLVR run in {args.workdir}: nothing to report yet.")
    text = report(args, runs, loads, command_line(args))
    out = Path(args.out)
    old = out.read_text() if out.is_file() else ""
    if READING in old:  # a hand-written reading of the figures survives a --report-only rewrite
        text += "\n" + old[old.index(READING) :]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
