"""Memory over a long run of the default preset: the trainer's and the rollout worker's RSS, step by step.

Run: ``python benchmarks/memory_soak.py [--steps 1000] [--out benchmarks/results/memory_soak.md]``.

``lrmgym run env=math learner=grpo`` (the default preset, async rollouts included) with the time budget off and
``learner.steps=N`` runs in a subprocess; every second this script reads the resident set size of the trainer and
of each of its child processes from ``/proc`` and the step reached from ``metrics.jsonl``. Reported: RSS after the
first 10 % of the steps (the warm state: model, optimizer, KV buffers, verifier workers up) and at the end, the
growth between them in MB and per 100 steps, and the least-squares slope over the last 80 % of the run. A leak
shows as a slope that does not fall to ~0 once warm; the bound checked is growth under 10 % of the warm RSS.
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


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = [int(x) for x in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except OSError:
            kids = []
        out += kids
        todo += kids
    return out


def _steps(metrics: Path) -> int:
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


def soak(steps: int, root: Path) -> list[dict]:
    run_dir = root / f"memory-{int(time.time())}"
    argv = [
        sys.executable, "-m", "lrmgym.cli.main", "run", "env=math", "learner=grpo", f"learner.steps={steps}",
        "learner.time_budget_s=null", "learner.progress=false", "learner.eval_before_after=false",
        f"run.output_dir={root}", f"run.name={run_dir.name}",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    samples = []
    start = time.perf_counter()
    while proc.poll() is None:
        kids = _descendants(proc.pid)
        trainer = _rss_mb(proc.pid)
        children = sum(x for x in (_rss_mb(k) for k in kids) if x is not None)
        step = _steps(run_dir / "metrics.jsonl")
        if trainer is not None:
            samples.append({"t": time.perf_counter() - start, "step": step, "trainer": trainer, "children": children})
        time.sleep(1.0)
    err = proc.stderr.read()
    if proc.returncode != 0:
        raise RuntimeError(f"the run failed ({proc.returncode}):\n{err[-3000:]}")
    return samples


def summarise(samples: list[dict], steps: int) -> dict:
    warm_step = max(1, steps // 10)
    # Training only: once the last step is logged the run evaluates, closes its worker and exits.
    warm = [s for s in samples if warm_step <= s["step"] < steps]
    if len(warm) < 3:
        raise RuntimeError("too few samples after the warm-up to measure growth")
    out = {}
    for key in ("trainer", "children"):
        first, last = warm[0][key], warm[-1][key]
        x = np.array([s["step"] for s in warm], dtype=float)
        y = np.array([s[key] for s in warm], dtype=float)
        slope = float(np.polyfit(x, y, 1)[0]) if np.ptp(x) > 0 else 0.0
        out[key] = {
            "warm_mb": first,
            "end_mb": last,
            "peak_mb": float(y.max()),
            "growth_mb": last - first,
            "growth_per_100_steps_mb": 100 * (last - first) / max(1.0, warm[-1]["step"] - warm[0]["step"]),
            "slope_mb_per_100_steps": 100 * slope,
            "bounded": (last - first) < 0.1 * first if first > 0 else True,
        }
    out["wall_s"] = samples[-1]["t"]
    out["steps"] = samples[-1]["step"]
    return out


def report(result: dict, steps: int, load_start: tuple, load_end: tuple) -> str:
    rows = []
    for key, label in (("trainer", "trainer process"), ("children", "its children (rollout worker, verifiers)")):
        r = result[key]
        rows.append(
            f"| {label} | {r['warm_mb']:.0f} | {r['end_mb']:.0f} | {r['peak_mb']:.0f} | {r['growth_mb']:+.1f} | "
            f"{r['growth_per_100_steps_mb']:+.2f} | {r['slope_mb_per_100_steps']:+.2f} | "
            f"{'yes' if r['bounded'] else 'NO'} |"
        )
    return "\n".join([
        "# Memory over a long run of the default preset",
        "",
        f"`python benchmarks/memory_soak.py --steps {steps}`: `lrmgym run env=math learner=grpo` (async rollouts) "
        f"for {result['steps']} steps in {result['wall_s']:.0f} s, RSS sampled every second. Warm = after the "
        f"first {max(1, steps // 10)} steps. Load average at the start: {load_start}, at the end: {load_end}.",
        "",
        "| process | RSS warm (MB) | RSS end (MB) | peak (MB) | growth (MB) | growth / 100 steps (MB) | "
        "fitted slope / 100 steps (MB) | growth < 10 % of warm |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--root", type=Path, default=Path("runs/memory_soak"))
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "memory_soak.md")
    args = parser.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    load_start = tuple(round(x, 2) for x in os.getloadavg())
    samples = soak(args.steps, args.root)
    result = summarise(samples, args.steps)
    text = report(result, args.steps, load_start, tuple(round(x, 2) for x in os.getloadavg()))
    args.out.write_text(text, encoding="utf-8")
    args.out.with_suffix(".json").write_text(json.dumps({"summary": result, "samples": samples[::5]}, indent=1))
    print(text)


if __name__ == "__main__":
    main()
