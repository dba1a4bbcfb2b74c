"""Every learner preset on the tiny default model at the same budget of generated completions.

Run: ``python benchmarks/learner_variants.py [--presets grpo,dr_grpo,...] [--seeds 0,1,2] [--generations N]
[--eval-tasks 500] [--out benchmarks/results/learner_variants.md]``.

Each (preset, seed) is one ``lrmgym run env=math learner=<preset>`` from the command line (a fresh process, as a
user runs it), with the time budget off and ``learner.generation_budget=N``: every learner may sample the same
number of completions (DAPO's dynamic sampling spends them on fewer optimiser steps). ``arena`` is
``learner=grpo judge=arena``. Reported per preset (mean over seeds, and each seed's value):

- held-out accuracy after training, at T=1 (avg@n) and greedy, with the 95 % intervals the run prints, and the
  gain over the shared starting model;
- steps and completions until the training accuracy (a 20-step moving mean) first reaches plain GRPO's final
  training accuracy of the same seed (a proxy for "steps to GRPO's final accuracy": a held-out evaluation every
  few steps would cost more than the runs);
- completions per optimiser step, and wall time.

The starting model and the held-out tasks are the same for every run, so the "before" figures are equal.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

PRESETS = ("grpo", "dr_grpo", "rloo", "dapo", "gspo", "cispo", "reinforce_pp", "ppo", "arena")


def run_one(preset: str, seed: int, generations: int, eval_tasks: int, runs: Path) -> dict:
    """One run through the CLI; returns its summary plus the metrics lines."""
    name = f"{preset}-s{seed}"
    learner = ["learner=grpo", "judge=arena"] if preset == "arena" else [f"learner={preset}"]
    argv = [
        sys.executable, "-m", "lrmgym.cli.main", "run", "env=math", *learner, f"run.seed={seed}",
        "learner.time_budget_s=null", "learner.steps=1000000", f"learner.generation_budget={generations}",
        "learner.progress=false", f"eval.tasks={eval_tasks}", f"run.output_dir={runs}", f"run.name={name}",
    ]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    (runs / name / WALL_FILE).write_text(json.dumps({"wall_s": wall}))
    return load_run(preset, seed, runs)


WALL_FILE = "benchmark_wall.json"  # the wall time of the run's process, kept beside it so a report can be rebuilt


def load_run(preset: str, seed: int, runs: Path) -> dict:
    """A finished run's summary, metrics lines and wall time, read from its folder."""
    folder = runs / f"{preset}-s{seed}"
    summary = json.loads((folder / "summary.json").read_text())
    lines = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    wall = json.loads((folder / WALL_FILE).read_text())["wall_s"] if (folder / WALL_FILE).is_file() else float("nan")
    return {"preset": preset, "seed": seed, "wall_s": wall, "summary": summary, "metrics": lines}


def _smoothed_accuracy(lines: list[dict], window: int = 20) -> list[float]:
    acc = [m["accuracy"] if m.get("accuracy") is not None else np.nan for m in lines]
    return [float(np.nanmean(acc[max(0, i - window + 1) : i + 1])) for i in range(len(acc))]


def to_reach(lines: list[dict], target: float, window: int = 20) -> tuple[int | None, int | None]:
    """Steps and completions until the smoothed training accuracy first reaches ``target`` (None: never)."""
    done = 0
    for i, (m, acc) in enumerate(zip(lines, _smoothed_accuracy(lines), strict=True)):
        done += int(m.get("generations") or 0)
        if i >= window - 1 and acc >= target:  # a full window: one lucky early step does not count
            return i + 1, done
    return None, None


def _acc(summary: dict, when: str, kind: str) -> tuple[float, list[float]] | None:
    entry = summary["evals"].get(when, {}).get(kind)
    return None if entry is None else (entry["accuracy"], entry["ci"])


def report(results: list[dict], generations: int, eval_tasks: int, load: tuple) -> str:
    """The markdown tables."""
    by_seed_grpo = {r["seed"]: r for r in results if r["preset"] == "grpo"}
    rows, detail = [], []
    for preset in dict.fromkeys(r["preset"] for r in results):
        runs = [r for r in results if r["preset"] == preset]
        keys = ("t1", "greedy", "gain", "steps", "reach_s", "reach_g", "gps", "train", "wall")
        cells: dict[str, list] = {k: [] for k in keys}
        for r in runs:
            s, lines = r["summary"], r["metrics"]
            t1, greedy = _acc(s, "after", "sampled"), _acc(s, "after", "greedy")
            before = _acc(s, "before", "sampled")
            gens = [m.get("generations") or 0 for m in lines]
            target_run = by_seed_grpo.get(r["seed"])
            reach = (None, None)
            if target_run is not None:
                target = _smoothed_accuracy(target_run["metrics"])[-1]
                reach = to_reach(lines, target)
            cells["t1"].append(t1[0])
            cells["greedy"].append(greedy[0] if greedy else np.nan)
            cells["gain"].append(t1[0] - before[0])
            cells["steps"].append(s["steps"])
            cells["reach_s"].append(reach[0])
            cells["reach_g"].append(reach[1])
            cells["gps"].append(float(np.mean(gens)) if gens else np.nan)
            cells["train"].append(s["train_wall_s"])  # the steps alone: no start-up, no evaluation
            cells["wall"].append(r["wall_s"])
            detail.append(
                f"| {preset} | {r['seed']} | {100 * t1[0]:.1f} [{100 * t1[1][0]:.1f}, {100 * t1[1][1]:.1f}] | "
                + (f"{100 * greedy[0]:.1f} [{100 * greedy[1][0]:.1f}, {100 * greedy[1][1]:.1f}]" if greedy else "-")
                + f" | {s['steps']} | {s['generations']} | {reach[0] if reach[0] is not None else 'never'} | "
                f"{s['train_wall_s']:.0f} s | {r['wall_s']:.0f} s |"
            )

        def mean(xs: list) -> str:
            vals = [x for x in xs if x is not None and not np.isnan(x)]
            return "-" if not vals else f"{np.mean(vals):.4g}"

        reached = sum(x is not None for x in cells["reach_s"])
        rows.append(
            f"| {preset} | {100 * np.mean(cells['t1']):.1f} | {100 * np.nanmean(cells['greedy']):.1f} | "
            f"{100 * np.mean(cells['gain']):+.1f} | {mean(cells['steps'])} | {mean(cells['reach_s'])} "
            f"({reached}/{len(runs)}) | {mean(cells['reach_g'])} | {mean(cells['gps'])} | {mean(cells['train'])} s | "
            f"{mean(cells['wall'])} s |"
        )
    seeds = sorted({r["seed"] for r in results})
    return "\n".join([
        "# Learner variants on the tiny default model",
        "",
        f"`python benchmarks/learner_variants.py --generations {generations} --eval-tasks {eval_tasks} "
        f"--seeds {','.join(map(str, seeds))}`: every preset samples {generations} completions (steps until the "
        f"budget is spent), held-out evaluation on {eval_tasks} tasks (avg@4 at T=1, and greedy). Load at the "
        f"start: {load}.",
        "",
        "| preset | T=1 after (%) | greedy after (%) | T=1 gain (pts) | steps | steps to GRPO's final train acc "
        "(runs that reached it) | completions to it | completions / step | training time | wall |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "Per run (T=1 and greedy after training with 95 % intervals):",
        "",
        "| preset | seed | T=1 after | greedy after | steps | completions | steps to GRPO's final train acc | "
        "training time | wall |",
        "|---|---|---|---|---|---|---|---|---|",
        *detail,
        "",
    ])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--generations", type=int, default=256 * 300)
    parser.add_argument("--eval-tasks", type=int, default=500)
    parser.add_argument("--runs", type=Path, default=Path("runs/learner_variants"))
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "learner_variants.md")
    parser.add_argument("--from-runs", action="store_true", help="Only rebuild the report from --runs.")
    parser.add_argument(
        "--resume", action="store_true", help="Keep the runs already finished in --runs and make only the missing ones."
    )
    args = parser.parse_args()
    presets = [p for p in args.presets.split(",") if p]
    unknown = [p for p in presets if p not in PRESETS]
    if unknown:
        parser.error(f"unknown preset(s) {', '.join(unknown)}; choose from {', '.join(PRESETS)}")
    if "grpo" in presets:  # the reference first: the others are compared with it
        presets = ["grpo", *[p for p in presets if p != "grpo"]]
    load = tuple(round(x, 2) for x in os.getloadavg())
    results = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        for preset in presets:
            finished = (args.runs / f"{preset}-s{seed}" / "summary.json").is_file()
            if args.from_runs or (args.resume and finished):  # runs made before, with the same arguments
                results.append(load_run(preset, seed, args.runs))
                continue
            r = run_one(preset, seed, args.generations, args.eval_tasks, args.runs)
            after = r["summary"]["evals"]["after"]["sampled"]["accuracy"]
            print(f"{preset:13} seed {seed}: {r['summary']['steps']} steps, T=1 after {100 * after:.1f} %, "
                  f"{r['wall_s']:.0f} s", flush=True)  # fmt: skip
            results.append(r)
            write_report(results, args, load)  # after every run: a long benchmark stopped early keeps its tables
    print(write_report(results, args, load))


def write_report(results: list[dict], args: argparse.Namespace, load: tuple) -> str:
    text = report(results, args.generations, args.eval_tasks, load)
    args.out.write_text(text, encoding="utf-8")
    json_out = args.out.with_suffix(".json")
    json_out.write_text(json.dumps([{k: v for k, v in r.items() if k != "metrics"} for r in results], indent=1))
    return text


if __name__ == "__main__":
    main()
