"""ReasonMaxxer against the default GRPO run on the tiny model: held-out gain against compute (issue 19).

Run: ``python benchmarks/reason_maxxer_vs_grpo.py [--seeds 0,1,2] [--grpo-runs DIR] [--runs runs/reason_maxxer]
[--out benchmarks/results/reason_maxxer_vs_grpo.md]``.

Every run is one ``lrmgym run env=math learner=...`` from the command line (a fresh process, its wall time
measured): ``learner=grpo`` as the README's default command runs it, but for ``--grpo-steps`` steps (default 900,
what its 530-s budget reaches on this idle 2-core machine: 898-1011 steps in ``results/default_run.md``) instead of
the time budget, so that a loaded machine changes the wall time and not the training (runs in ``--grpo-runs`` with
a ``summary.json`` are reused), and ``learner=reason_maxxer`` with its preset, with
``learner.positive_only=true`` (entropy-gated rejection-sampling fine-tuning) and with ``learner.kl_coef=0``.
Held-out evaluation is the runs' own: 500 tasks, avg@4 at T=1 and greedy, with 95 % intervals.

Compute, from each run's ``metrics.jsonl`` (``compute/*``, counted the same way for both learners: tokens through
a model, prompt + completion, padding excluded, a shared prompt once per row):

- generated tokens: sampled by the policy (GRPO: every step's rollouts; ReasonMaxxer: its one pass);
- forward tokens: through a model, with and without gradient (GRPO: the update's forwards, its recomputed
  log-probs and its reference model's; ReasonMaxxer: the adapter's forwards, the base's for the KL anchor, and the
  entropy scoring);
- backward tokens: through a backward pass;
- wall time: the whole process (start-up, sampling, training, the two evaluations) and the training part alone.

The goal the issue sets: at least 90 % of GRPO's held-out gain at no more than 10 % of its compute.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = {
    "reason_maxxer": ["learner=reason_maxxer"],
    "positive_only": ["learner=reason_maxxer", "learner.positive_only=true"],
    "no_kl": ["learner=reason_maxxer", "learner.kl_coef=0"],
}
WALL = "benchmark_wall.json"


def run(name: str, seed: int, argv: list[str], runs: Path) -> Path:
    """One ``lrmgym run`` into ``runs/<name>-s<seed>`` (kept when it finished before; resumed when it did not)."""
    folder = runs / f"{name}-s{seed}"
    if (folder / "summary.json").is_file():
        return folder
    cmd = ["--resume", str(folder)] if folder.is_dir() else [
        "env=math", *argv, f"run.seed={seed}", "learner.progress=false", f"run.output_dir={runs}",
        f"run.name={folder.name}",
    ]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "lrmgym.cli.main", "run", *cmd], capture_output=True, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{folder.name} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    (folder / WALL).write_text(json.dumps({"wall_s": time.perf_counter() - start}))
    return folder


def facts(folder: Path, seed: int) -> dict:
    """Accuracy before/after with intervals, compute and wall time of one finished run.

    A run made before lrmgym counted ``compute/*`` (the learner-variants runs) gets its generated tokens from
    ``tokens_per_s x time/generate_s`` and no forward or backward count.
    """
    summary = json.loads((folder / "summary.json").read_text())
    lines = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]

    def total(key: str) -> int | None:
        if not any(key in m for m in lines):
            return None
        return int(sum(m.get(key) or 0 for m in lines))

    wall = json.loads((folder / WALL).read_text())["wall_s"] if (folder / WALL).is_file() else None
    out = {
        "summary": summary,
        "seed": seed,
        "wall_s": wall,
        "train_s": summary["train_wall_s"],
        "steps": summary["steps"],
    }
    for when in ("before", "after"):
        for kind in ("sampled", "greedy"):
            entry = summary["evals"].get(when, {}).get(kind)
            out[f"{when}_{kind}"] = (entry["accuracy"], entry["ci"]) if entry else None
    generated = total("compute/generated_tokens")
    if generated is None:
        generated = int(sum((m.get("tokens_per_s") or 0) * (m.get("time/generate_s") or 0) for m in lines))
    out["generated"] = generated
    parts = [total(k) for k in ("compute/forward_tokens", "compute/nograd_forward_tokens",
                                "compute/base_forward_tokens", "compute/scoring_tokens")]  # fmt: skip
    out["forward"] = sum(p for p in parts if p is not None) if any(p is not None for p in parts) else None
    out["backward"] = total("compute/backward_tokens")
    # One weighted count of the work: a token generated or forwarded is one forward pass, a backward about two.
    parts = (out["generated"], out["forward"], out["backward"])
    out["work"] = None if None in parts else out["generated"] + out["forward"] + 2 * out["backward"]
    return out


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def report(results: dict[str, list[dict]], seeds: list[int], load: tuple) -> str:
    grpo = results.get("grpo", [])
    base_gain = _mean([r["after_sampled"][0] - r["before_sampled"][0] for r in grpo])
    keys = ("generated", "forward", "backward", "work", "wall_s", "train_s")
    base_compute = {k: _mean([r[k] for r in grpo]) for k in keys}
    rows, detail = [], []
    for name, runs in results.items():
        gain = _mean([r["after_sampled"][0] - r["before_sampled"][0] for r in runs])
        greedy = _mean([r["after_greedy"][0] - r["before_greedy"][0] for r in runs if r["after_greedy"]])
        compute = {k: _mean([r[k] for r in runs]) for k in base_compute}

        def share(key: str, compute: dict = compute) -> str:
            base = base_compute[key]
            return f"{100 * compute[key] / base:.1f} %" if compute[key] is not None and base else "-"

        of_gain = f"{100 * gain / base_gain:.0f} %" if gain is not None and base_gain else "-"

        def num(key: str, unit: str = "", compute: dict = compute) -> str:
            value = compute[key]
            return "-" if value is None else f"{value:.3g}{unit} ({share(key)})"

        rows.append(
            f"| {name} | {100 * gain:+.1f} | {of_gain} | {100 * greedy:+.1f} | {num('generated')} | "
            f"{num('forward')} | {num('backward')} | {num('work')} | {num('train_s', ' s')} | {num('wall_s', ' s')} |"
        )
        for r in runs:
            a, g = r["after_sampled"], r["after_greedy"]
            detail.append(
                f"| {name} | {r['seed']} | {100 * a[0]:.1f} [{100 * a[1][0]:.1f}, "
                f"{100 * a[1][1]:.1f}] | "
                + (f"{100 * g[0]:.1f} [{100 * g[1][0]:.1f}, {100 * g[1][1]:.1f}]" if g else "-")
                + f" | {r['steps']} | {r['generated']} | {r['forward']} | {r['backward']} | {r['train_s']:.0f} s |"
            )
    before = grpo[0] if grpo else next(iter(results.values()))[0]
    b, bg = before["before_sampled"], before["before_greedy"]
    return "\n".join([
        "# ReasonMaxxer against the default GRPO run (tiny model)",
        "",
        f"`python benchmarks/reason_maxxer_vs_grpo.py --seeds {','.join(map(str, seeds))}`; load at the start: "
        f"{load}. Held-out (500 tasks) before training: {100 * b[0]:.1f} % at T=1 (avg@4), {100 * bg[0]:.1f} % "
        "greedy. Gains are means over the seeds; compute shares are against GRPO's mean.",
        "",
        "| learner | T=1 gain (pts) | share of GRPO's gain | greedy gain (pts) | generated tokens | forward tokens | "
        "backward tokens | work (gen + fwd + 2 bwd) | training time | wall |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "| learner | seed | T=1 after | greedy after | steps | generated | forward | backward | training time |",
        "|---|---|---|---|---|---|---|---|---|",
        *detail,
        "",
    ])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--runs", type=Path, default=Path("runs/reason_maxxer"))
    parser.add_argument("--grpo-runs", type=Path, default=None, help="finished default GRPO runs grpo-s<seed>")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--no-new-grpo", action="store_true", help="only reuse finished GRPO runs")
    parser.add_argument("--grpo-steps", type=int, default=900, help="GRPO's steps (the default run's, idle)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "reason_maxxer_vs_grpo.md")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s]
    load = tuple(round(x, 2) for x in os.getloadavg())
    args.runs.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict]] = {"grpo": []}
    for seed in seeds:
        grpo_dir = args.runs if args.grpo_runs is None else args.grpo_runs
        grpo = ["learner=grpo", "learner.time_budget_s=null", f"learner.steps={args.grpo_steps}"]
        if not args.no_new_grpo or (grpo_dir / f"grpo-s{seed}" / "summary.json").is_file():
            results["grpo"].append(facts(run("grpo", seed, grpo, grpo_dir), seed))
        for name in [v for v in args.variants.split(",") if v]:
            results.setdefault(name, []).append(facts(run(name, seed, VARIANTS[name], args.runs), seed))
        args.out.write_text(report(results, seeds, load), encoding="utf-8")
    text = report(results, seeds, load)
    args.out.write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
