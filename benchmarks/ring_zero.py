"""Ring-Zero's ablations and pipeline on the tiny default model (issue 18; papers.md section 3).

Run: ``python benchmarks/ring_zero.py [--seeds 0,1,2] [--rl1 38400] [--rl2 19200] [--rl3 19200]
[--grpo-runs /path/to/learner_variants/runs] [--runs runs/ring_zero] [--out benchmarks/results/ring_zero.md]``.

Every run is ``lrmgym run env=math learner=ring_zero`` from the command line (a fresh process), with the time
budgets off and generation budgets instead, so that every variant samples the same number of completions:

1. RL-1 variants, each ``learner.stages=[rl1]`` for ``--rl1`` completions: ``base`` (the stage's defaults:
   clipped IS with the absolute cap 5, ratio correction, token-level loss, k3 KL 1e-4, format B), ``sample``
   (sample-level loss), ``format_a`` (the loose format reward), ``no_kl`` (kl_coef 0) and ``ppo_clip``
   (PPO's clipped surrogate instead of clipped IS). Reported from metrics.jsonl: response length over training,
   text after ``</answer>``, entropy / reward / train-infer gap, early training accuracy and the clip fraction.
2. SD: each ``base`` run resumed with ``learner.stages=[rl1,sd]`` (a resumed run may append stages): held-out
   accuracy and mean length of the model distilled from the base against the RL-1 model it distils.
3. The pipeline: the same runs resumed with all four stages, RL-2 and RL-3 for ``--rl2`` / ``--rl3`` completions,
   against plain GRPO at the same total (``learner=grpo``, ``--rl1 + --rl2 + --rl3`` completions; the runs of
   ``benchmarks/learner_variants.py`` are reused from ``--grpo-runs`` when they hold that budget).

Held-out evaluation: the run's default (500 tasks, avg@4 at T=1, and greedy).
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
import yaml

VARIANTS = {
    "base": [],
    "sample": ["learner.rl1.loss_agg=seq_mean_token_mean"],
    "format_a": ["learner.rl1.format_reward=loose"],
    "no_kl": ["learner.rl1.kl_coef=0"],
    "ppo_clip": ["learner.rl1.pg_loss=ppo_clip"],
}
WALL = "benchmark_wall.json"


def _cli(argv: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "lrmgym.cli.main", "run", *argv], capture_output=True, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"lrmgym run {' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def _budgets(args: argparse.Namespace) -> list[str]:
    out = []
    for stage, gens in (("rl1", args.rl1), ("rl2", args.rl2), ("rl3", args.rl3)):
        out += [f"learner.{stage}.time_budget_s=null", f"learner.{stage}.steps=1000000",
                f"learner.{stage}.generation_budget={gens}", f"learner.{stage}.progress=false"]  # fmt: skip
    return [*out, "learner.sd.progress=false", f"eval.tasks={args.eval_tasks}"]


def run_variant(name: str, seed: int, args: argparse.Namespace) -> Path:
    """RL-1 alone, as ``name`` says."""
    folder = args.runs / f"{name}-s{seed}"
    if (folder / "summary.json").is_file():
        return folder
    if folder.is_dir():  # a run stopped part-way (this script interrupted): continue it
        wall = _cli(["--resume", str(folder)])
        (folder / WALL).write_text(json.dumps({"rl1": wall, "resumed": True}))
        return folder
    argv = ["env=math", "learner=ring_zero", "learner.stages=[rl1]", f"run.seed={seed}", *_budgets(args),
            *VARIANTS[name], f"run.output_dir={args.runs}", f"run.name={folder.name}"]  # fmt: skip
    wall = _cli(argv)
    (folder / WALL).write_text(json.dumps({"rl1": wall}))
    return folder


def extend(folder: Path, stages: list[str]) -> None:
    """Resume a run with more stages (config.yaml's learner.stages is one of the keys a resume may change)."""
    summary = json.loads((folder / "summary.json").read_text())
    if [s["stage"] for s in summary["stages"]][: len(stages)] == stages:
        return  # it has these stages already (perhaps more: a run extended before)
    config = yaml.safe_load((folder / "config.yaml").read_text())
    config["learner"]["stages"] = stages
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    wall = _cli(["--resume", str(folder)])
    walls = json.loads((folder / WALL).read_text()) if (folder / WALL).is_file() else {}
    walls["+".join(stages)] = wall
    (folder / WALL).write_text(json.dumps(walls))


def run_grpo(seed: int, args: argparse.Namespace, launch: bool = True) -> Path:
    """Plain GRPO at the pipeline's total of completions (reused from the learner-variants runs when it matches;
    made unless ``launch`` is false)."""
    total = args.rl1 + args.rl2 + args.rl3
    if args.grpo_runs is not None:
        old = args.grpo_runs / f"grpo-s{seed}"
        if (old / "summary.json").is_file():
            config = yaml.safe_load((old / "config.yaml").read_text())
            same = config["learner"].get("generation_budget") == total and config["eval"]["tasks"] == args.eval_tasks
            if same:
                return old
    folder = args.runs / f"grpo-s{seed}"
    if not launch:
        return folder
    if folder.is_dir() and not (folder / "summary.json").is_file():
        _cli(["--resume", str(folder)])
    elif not folder.is_dir():
        _cli(["env=math", "learner=grpo", f"run.seed={seed}", "learner.time_budget_s=null", "learner.steps=1000000",
              f"learner.generation_budget={total}", "learner.progress=false", f"eval.tasks={args.eval_tasks}",
              f"run.output_dir={args.runs}",
              f"run.name={folder.name}"])  # fmt: skip
    return folder


# --------------------------------------------------------------------------------------------------- reading
def metrics(folder: Path, stage: str = "01-rl1") -> list[dict]:
    path = folder / "stages" / stage / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()]


def stage_summary(folder: Path, name: str) -> dict:
    summary = json.loads((folder / "summary.json").read_text())
    return next(s for s in summary["stages"] if s["stage"] == name)


def rl1_after(folder: Path) -> dict | None:
    """RL-1's held-out evaluation after its last step (the run's own "after" is the last stage's once extended)."""
    return stage_summary(folder, "rl1")["after"]


def window_mean(lines: list[dict], key: str, lo: float, hi: float) -> float:
    """Mean of ``key`` over the steps in the fraction ``[lo, hi)`` of the run."""
    n = len(lines)
    part = [m.get(key) for m in lines[int(lo * n) : max(int(hi * n), int(lo * n) + 1)]]
    vals = [v for v in part if v is not None]
    return float(np.mean(vals)) if vals else float("nan")


def _ms(values: list[float], scale: float = 1.0, digits: int = 1) -> str:
    vals = [v * scale for v in values if v is not None and not np.isnan(v)]
    if not vals:
        return "-"
    if len(vals) == 1:
        return f"{vals[0]:.{digits}f}"
    return f"{np.mean(vals):.{digits}f} ± {np.std(vals, ddof=1):.{digits}f}"


def _acc(entry: dict | None, kind: str = "sampled") -> float:
    part = (entry or {}).get(kind)
    return part["accuracy"] if part else float("nan")


def _tok(entry: dict | None) -> float:
    part = (entry or {}).get("sampled") or {}
    return part.get("mean_tokens") if part.get("mean_tokens") is not None else float("nan")


# --------------------------------------------------------------------------------------------------- report
def report(args: argparse.Namespace, seeds: list[int], load: tuple) -> str:
    runs = {(v, s): args.runs / f"{v}-s{s}" for v in VARIANTS for s in seeds}
    have = {k: f for k, f in runs.items() if (f / "summary.json").is_file()}
    lines = {k: metrics(f) for k, f in have.items()}

    def col(variant: str, fn) -> list[float]:
        return [fn(lines[(variant, s)], have[(variant, s)]) for s in seeds if (variant, s) in have]

    def table(header: list[str], rows: list[list[str]]) -> list[str]:
        return [
            "| " + " | ".join(header) + " |",
            "|" + "---|" * len(header),
            *("| " + " | ".join(r) + " |" for r in rows),
        ]

    out = [
        "# Ring-Zero on the tiny default model",
        "",
        f"`python benchmarks/ring_zero.py --seeds {','.join(map(str, seeds))} --rl1 {args.rl1} --rl2 {args.rl2} "
        f"--rl3 {args.rl3}`. Load at the start: {load}. Mean ± sd over seeds; 'early', 'mid' and 'late' are "
        "the first, middle and last fifth of the run's steps. Every RL-1 run samples the same number of "
        "completions.",
        "",
    ]

    # 1. token vs sample; 2. format A vs B; 3. KL; 4. clipped IS vs PPO-clip
    def length_rows(variants: list[str]) -> list[list[str]]:
        rows = []
        for v in variants:
            rows.append([
                v, _ms(col(v, lambda m, f: window_mean(m, "length/mean", 0, 0.2))),
                _ms(col(v, lambda m, f: window_mean(m, "length/mean", 0.4, 0.6))),
                _ms(col(v, lambda m, f: window_mean(m, "length/mean", 0.8, 1.0))),
                _ms(col(v, lambda m, f: window_mean(m, "after_answer/frac", 0.8, 1.0)), 100),
                _ms(col(v, lambda m, f: window_mean(m, "after_answer/chars", 0.8, 1.0)), 1, 2),
                _ms(col(v, lambda m, f: _acc(rl1_after(f))), 100),
                _ms(col(v, lambda m, f: _tok(rl1_after(f)))),
            ])  # fmt: skip
        return rows

    head = ["variant", "length early", "length mid", "length late", "text after </answer> late (%)",
            "chars after late", "held-out T=1 after (%)", "held-out tokens"]  # fmt: skip
    out += ["## 1. Token-level vs sample-level loss (RL-1)", "", *table(head, length_rows(["base", "sample"])), ""]
    out += ["## 2. Format B (strict) vs format A (loose)", "", *table(head, length_rows(["base", "format_a"])), ""]

    def stab_rows(variants: list[str]) -> list[list[str]]:
        rows = []
        for v in variants:
            rows.append([
                v, _ms(col(v, lambda m, f: window_mean(m, "entropy", 0, 0.2)), 1, 3),
                _ms(col(v, lambda m, f: window_mean(m, "entropy", 0.8, 1.0)), 1, 3),
                _ms(col(v, lambda m, f: window_mean(m, "reward/mean", 0.8, 1.0)), 1, 3),
                _ms(col(v, lambda m, f: float(np.nanstd([x.get("reward/mean") or np.nan for x in m[len(m) // 2 :]]))),
                    1, 3),
                _ms(col(v, lambda m, f: window_mean(m, "train_infer/logp_abs_diff", 0.8, 1.0)), 1, 4),
                _ms(col(v, lambda m, f: window_mean(m, "kl_ref", 0.8, 1.0)), 1, 4),
            ])  # fmt: skip
        return rows

    head = ["variant", "entropy early", "entropy late", "reward late", "reward sd, 2nd half",
            "train/infer |Δ log p| late", "KL to ref late"]  # fmt: skip
    out += ["## 3. KL on vs off (RL-1)", "", *table(head, stab_rows(["base", "no_kl"])), ""]

    def early_rows(variants: list[str]) -> list[list[str]]:
        rows = []
        for v in variants:
            rows.append([
                v, _ms(col(v, lambda m, f: window_mean(m, "accuracy", 0, 0.1)), 100),
                _ms(col(v, lambda m, f: window_mean(m, "accuracy", 0.1, 0.2)), 100),
                _ms(col(v, lambda m, f: window_mean(m, "accuracy", 0.8, 1.0)), 100),
                _ms(col(v, lambda m, f: window_mean(m, "clip_frac", 0, 1.0)), 100, 2),
                _ms(col(v, lambda m, f: window_mean(m, "ratio_max", 0, 1.0)), 1, 2),
                _ms(col(v, lambda m, f: _acc(rl1_after(f))), 100),
            ])  # fmt: skip
        return rows

    head = ["variant", "train acc, first tenth (%)", "second tenth (%)", "last fifth (%)",
            "clipped / capped tokens (%)", "max ratio", "held-out T=1 after (%)"]  # fmt: skip
    out += ["## 4. Clipped IS vs PPO-clip (RL-1)", "", *table(head, early_rows(["base", "ppo_clip"])), ""]

    # 5. SD against the RL-1 model it distils; 6. the pipeline against GRPO
    sd_rows, pipe_rows = [], []
    for s in seeds:
        folder = args.runs / f"base-s{s}"
        summary = json.loads((folder / "summary.json").read_text()) if (folder / "summary.json").is_file() else None
        if summary is None:
            continue
        by = {st["stage"]: st for st in summary["stages"]}
        if "sd" in by:
            rl1, sd = by["rl1"], by["sd"]
            corpus = sd["outputs"].get("corpus") or {}
            sd_rows.append([
                str(s), f"{100 * _acc(rl1['after']):.1f}", f"{100 * _acc(rl1['after'], 'greedy'):.1f}",
                f"{_tok(rl1['after']):.1f}", f"{100 * _acc(sd['after']):.1f}",
                f"{100 * _acc(sd['after'], 'greedy'):.1f}", f"{_tok(sd['after']):.1f}", str(corpus.get("kept", "-")),
                f"{corpus.get('mean_tokens_after', 0):.1f}",
                str(sd["steps"]),
            ])  # fmt: skip
        if "rl3" in by:
            grpo = run_grpo(s, args, launch=not args.no_new_runs)
            g = json.loads((grpo / "summary.json").read_text()) if (grpo / "summary.json").is_file() else {"evals": {}}
            tiers = by["rl3"]["outputs"].get("tiers") or {}
            tier_text = ", ".join(f"{n} {100 * _acc(t):.1f} % / {_tok(t):.1f} tok" for n, t in tiers.items())
            pipe_rows.append([
                str(s), f"{summary['generations']}", f"{100 * _acc(summary['evals'].get('before')):.1f}",
                f"{100 * _acc(by['rl2']['after']):.1f}", f"{100 * _acc(by['rl3']['after']):.1f}",
                f"{100 * _acc(by['rl3']['after'], 'greedy'):.1f}", tier_text,
                f"{g.get('generations', '-')}", f"{100 * _acc(g['evals'].get('after')):.1f}",
                f"{100 * _acc(g['evals'].get('after'), 'greedy'):.1f}",
                f"{summary['train_wall_s']:.0f} s vs {g.get('train_wall_s', float('nan')):.0f} s",
            ])  # fmt: skip
    head = ["seed", "RL-1 T=1 (%)", "RL-1 greedy (%)", "RL-1 tokens", "SD T=1 (%)", "SD greedy (%)", "SD tokens",
            "corpus", "corpus tokens", "SD steps"]  # fmt: skip
    out += ["## 5. Self-distillation from the base vs the RL-1 model", "", *table(head, sd_rows), ""]
    head = ["seed", "completions", "before T=1 (%)", "after RL-2 (%)", "after RL-3, no tier prompt (%)",
            "RL-3 greedy (%)", "per tier (T=1 / tokens)", "GRPO completions", "GRPO T=1 (%)", "GRPO greedy (%)",
            "training time"]  # fmt: skip
    out += ["## 6. The pipeline vs plain GRPO at the same completions", "", *table(head, pipe_rows), ""]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--rl1", type=int, default=256 * 150)
    parser.add_argument("--rl2", type=int, default=256 * 75)
    parser.add_argument("--rl3", type=int, default=256 * 75)
    parser.add_argument("--eval-tasks", type=int, default=500)
    parser.add_argument("--runs", type=Path, default=Path("runs/ring_zero"))
    parser.add_argument("--grpo-runs", type=Path, default=None, help="learner_variants.py's runs, to reuse GRPO's")
    parser.add_argument("--no-pipeline", action="store_true", help="RL-1 variants only")
    parser.add_argument("--no-new-runs", action="store_true", help="only rebuild the report from --runs")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "ring_zero.md")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s]
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    load = tuple(round(x, 2) for x in os.getloadavg())
    args.runs.mkdir(parents=True, exist_ok=True)
    if not args.no_new_runs:
        for seed in seeds:
            for v in variants:
                start = time.perf_counter()
                run_variant(v, seed, args)
                print(f"{v:9} seed {seed}: {time.perf_counter() - start:.0f} s", flush=True)
                args.out.write_text(report(args, seeds, load), encoding="utf-8")
            if not args.no_pipeline and "base" in variants:
                extend(args.runs / f"base-s{seed}", ["rl1", "sd"])
                extend(args.runs / f"base-s{seed}", ["rl1", "sd", "rl2", "rl3"])
                run_grpo(seed, args)
                print(f"pipeline  seed {seed} done", flush=True)
                args.out.write_text(report(args, seeds, load), encoding="utf-8")
    text = report(args, seeds, load)
    args.out.write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
