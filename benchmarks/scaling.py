"""How cost grows: GRPO step time against model size, group size and prompts per step; verifier and sandbox
throughput against worker count.

Run (from the repository root, in lrmgym's venv, on an idle machine)::

    python benchmarks/scaling.py [--quick] [--out benchmarks/results] [--threads 1]

1. Native GRPO step time (``learner=grpo`` with ``learner.async_rollouts=false``, no time budget, no evaluation,
   no checkpoints): the median of ``time/step_s`` over a fixed number of steps after warm-up steps that are
   left out. Each factor is varied around the default with the others fixed:

   - model size: 0.8 M (the tiny model's default shape), 2.6 M and 21 M parameters, all freshly initialised
     from a ``TinyArch`` (``policy.arch.*``; the exact counts are printed) and trained on the dense
     ``bench_env:FractionAEnv`` reward (the fraction of ``a`` characters), so every group carries signal and
     every step runs a full update; a random model on ``env=math`` scores 0 everywhere and would skip the
     update;
   - group size 4, 8 (the preset), 16 and prompts per step 8, 16, 32 (the preset): ``env=math`` with the
     shipped tiny default model, as ``lrmgym run env=math learner=grpo`` trains it.

   The two kinds of row differ in completion length (a random model rarely stops before ``max_new_tokens``;
   the trained one answers in ~17 tokens), so the tables show the mean length and the trained share beside
   each time; compare exponents within a series, not times across them.
2. Math-verifier throughput: ``verify_many`` (cache off) on a fixed set of symbolic pairs that all take the
   worker (slow) path (``\\frac{a}{\\sqrt{b}}`` against ``\\frac{a\\sqrt{b}}{b}``), verifications/s against
   ``VerifierPool(size=1, 2, 4)``; the median of the repeats. Each repeat has its own pairs (the same ones for
   every worker count): the workers cache what they have parsed, and a repeated pair ran 2-4x faster.
3. Code-sandbox throughput: ``SandboxPool(workers=1, 2, 4).run_many`` on copies of one small job (a 2-line
   function and 2 asserts), executions/s; the median of the repeats.

Every measurement runs in a fresh subprocess of this file (torch, its thread pool, the verifier cache and the
worker pools cannot leak from one to the next) with ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` and torch's
threads set to ``--threads`` (default 1, the preset's ``learner.torch_threads``). Each series gets a log-log
least-squares fit ``y = c * x^k``; ``k`` is printed in the tables and the plot. Writes ``scaling.md`` and
``scaling.png`` into ``--out``; ``--quick`` is a smoke run (fewer steps and repeats, under 3 minutes) that
must not overwrite the real figures, so give it another ``--out``. The machine's load matters: ``uptime``
is recorded before and after.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = {
    # name: (hidden, layers, heads, mlp); head dim 32 like the tiny default model
    "0.8m": (128, 4, 4, 336),  # the default TinyArch: 792 576 parameters
    "2.6m": (256, 3, 8, 768),  # 2 584 064 parameters (the same shape as grpo_vs_trl.py's)
    "21m": (512, 6, 16, 1600),  # 21 096 448 parameters
}
GROUPS = (4, 8, 16)
PROMPTS = (8, 16, 32)
DEFAULT_GROUP, DEFAULT_PROMPTS = 8, 32  # the learner=grpo preset
WORKERS = (1, 2, 4)
SETTINGS = {
    # warm-up steps (left out), timed steps, (prompts, group) of the model-size series, verifier pairs and
    # repeats, sandbox jobs and repeats. --quick shrinks the size series' batch: 21 M at 32 x 8 takes ~40 s a step.
    "full": {"warmup": 2, "steps": 10, "size_batch": (DEFAULT_PROMPTS, DEFAULT_GROUP), "pairs": 280,
             "verify_repeats": 5, "jobs": 200, "sandbox_repeats": 5},
    "quick": {"warmup": 1, "steps": 2, "size_batch": (4, 4), "pairs": 70, "verify_repeats": 1, "jobs": 30,
              "sandbox_repeats": 1},
}  # fmt: skip


def fit_exponent(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares fit of ``log y = log c + k log x``; returns ``(k, c)``.

    Example:
        >>> k, c = fit_exponent([1, 2, 4], [3 * x**1.5 for x in (1, 2, 4)])
        >>> round(k, 6), round(c, 6)
        (1.5, 3.0)
    """
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError(f"fit_exponent needs at least 2 points of equal count, got {len(xs)} x and {len(ys)} y.")
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    sxx = sum((a - mx) ** 2 for a in lx)
    if sxx == 0:
        raise ValueError(f"fit_exponent needs at least 2 distinct x values, got {sorted(set(xs))}.")
    k = sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sxx
    return k, math.exp(my - k * mx)


# --------------------------------------------------------------------------------------------------- workers
def grpo_worker(spec: dict) -> dict:
    """Train ``warmup + steps`` GRPO steps as ``spec`` says; the timed steps' figures."""
    import gymnasium
    import torch

    import lrmgym
    from lrmgym.compose import train
    from lrmgym.configs.resolve import resolve

    torch.set_num_threads(spec["threads"])
    n = spec["warmup"] + spec["steps"]
    tokens = [
        "learner=grpo", "learner.async_rollouts=false", "learner.time_budget_s=null", f"learner.steps={n}",
        "learner.eval_before_after=false", "learner.progress=false", "learner.checkpoint_every=1000000",
        f"learner.torch_threads={spec['threads']}", f"policy.threads={spec['threads']}",
        f"learner.group_size={spec['group']}", f"learner.prompts_per_step={spec['prompts']}",
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        params = None
        if spec["size"] is None:  # the shipped default model on the default math env
            tokens.append("env=math")
        else:  # a fresh random init of this shape on the dense bench reward
            from lrmgym.policies.tiny import TinyArch, build_model, build_tokenizer

            hidden, layers, heads, mlp = SIZES[spec["size"]]
            arch = TinyArch(hidden=hidden, layers=layers, heads=heads, mlp=mlp)
            tok = build_tokenizer()
            model = build_model(arch, len(tok), seed=0)
            params = sum(p.numel() for p in model.parameters())
            model.save_pretrained(f"{tmp}/model")
            tok.save_pretrained(f"{tmp}/model")
            if "lrmgym/BenchFractionA-v0" not in gymnasium.registry:
                lrmgym.register("lrmgym/BenchFractionA-v0", "bench_env:FractionAEnv")
            tokens += ["env=lrmgym/BenchFractionA-v0", f"policy.path={tmp}/model"]
            tokens += [f"policy.arch.{k}={v}" for k, v in arch.model_dump().items()]  # recorded in config.yaml
        train(resolve(tokens), Path(tmp) / "run", resume=False)
        lines = [json.loads(x) for x in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
    timed = lines[spec["warmup"] :]
    return {
        "params": params,
        "step_s": [m["time/step_s"] for m in timed],
        "median_s": statistics.median(m["time/step_s"] for m in timed),
        "length": statistics.fmean(m["length/mean"] for m in timed),
        "trained_frac": statistics.fmean(m["trained_frac"] for m in timed),
        "generations": timed[0]["generations"],
    }


def verify_pairs(n: int, start: int = 0) -> list[tuple[str, str]]:
    """Pairs ``start`` to ``start + n`` of a fixed stream of distinct (prediction, gold) pairs, equal in value,
    that the fast path cannot decide."""
    pairs = []
    for i in range(start, start + n):
        a, b = 1 + i // 7, (2, 3, 5, 6, 7, 10, 11)[i % 7]
        pairs.append((f"\\frac{{{a}}}{{\\sqrt{{{b}}}}}", f"\\frac{{{a}\\sqrt{{{b}}}}}{{{b}}}"))
    return pairs


def verify_worker(spec: dict) -> dict:
    """Verifications/s of ``verify_many`` with ``spec["workers"]`` verifier workers, one figure per repeat."""
    from lrmgym.envs.math import verify as mv

    pool = mv.VerifierPool(size=spec["workers"])
    pool.warm()
    warm_up = verify_pairs(4 * spec["workers"], start=10**6)  # pairs never timed: first imports in every worker
    mv.verify_many(warm_up, pool=pool, use_cache=False)
    rates = []
    for repeat in range(spec["repeats"]):
        # New pairs in every repeat: the workers keep caches of their own, so a pair seen before is cheaper.
        pairs = verify_pairs(spec["pairs"], start=repeat * spec["pairs"])
        start = time.perf_counter()
        verdicts = mv.verify_many(pairs, pool=pool, use_cache=False)
        rates.append(len(pairs) / (time.perf_counter() - start))
        if not all(v.correct for v in verdicts):
            raise RuntimeError(f"expected every pair to verify as correct: {[v.reason for v in verdicts][:5]}")
    checks = pool.stats["checks"]
    pool.close()
    return {"rates": rates, "median": statistics.median(rates), "worker_checks": checks}


SANDBOX_JOB = {
    "code": "def f(x):\n    return sum(i * i for i in range(x))\n",
    "units": ({"src": "assert f(10) == 285", "test": True}, {"src": "assert f(0) == 0", "test": True}),
}


def sandbox_worker(spec: dict) -> dict:
    """Executions/s of ``SandboxPool.run_many`` with ``spec["workers"]`` workers, one figure per repeat."""
    from lrmgym.envs.code.sandbox import Job, SandboxPool

    job = Job(**SANDBOX_JOB)
    rates = []
    with SandboxPool("auto", workers=spec["workers"]) as pool:
        pool.run_many([job] * spec["workers"])  # warm-up: every slot started once
        for _ in range(spec["repeats"]):
            start = time.perf_counter()
            results = pool.run_many([job] * spec["jobs"])
            rates.append(spec["jobs"] / (time.perf_counter() - start))
            if not all(r.all_passed for r in results):
                raise RuntimeError(f"expected every run to pass: {[r for r in results if not r.all_passed][:2]}")
        backend = pool.backend
    return {"rates": rates, "median": statistics.median(rates), "backend": backend}


WORKER_KINDS = {"grpo": grpo_worker, "verify": verify_worker, "sandbox": sandbox_worker}


def measure(kind: str, spec: dict, threads: int) -> dict:
    """Run one measurement in a fresh subprocess of this file with the thread count pinned; its result."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, __file__, "--worker", kind, "--spec", json.dumps({**spec, "threads": threads})]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"{kind} {spec} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")


# --------------------------------------------------------------------------------------------------- report
def machine() -> str:
    """CPU model, core count, Python, torch and platform, in one line."""
    import torch

    model = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{model}, {os.cpu_count()} CPUs, Python {platform.python_version()}, torch {torch.__version__}, "
        f"{platform.platform()}"
    )


def uptime() -> str:
    """``uptime``'s line (the load averages), or ``os.getloadavg()`` where there is no ``uptime``."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"load average: {os.getloadavg()}"


def series(results: dict) -> dict[str, dict]:
    """Every plotted series: x label, points ``(x, y)`` and the fitted ``(k, c)``."""
    grpo = results["grpo"]
    out = {
        "GRPO s/step vs parameters": {
            "xlabel": "parameters",
            "points": [(grpo[f"size:{s}"]["params"], grpo[f"size:{s}"]["median_s"]) for s in SIZES],
        },
        "GRPO s/step vs group size": {
            "xlabel": f"group size ({DEFAULT_PROMPTS} prompts/step)",
            "points": [(g, grpo[f"group:{g}"]["median_s"]) for g in GROUPS],
        },
        "GRPO s/step vs prompts per step": {
            "xlabel": f"prompts per step (group {DEFAULT_GROUP})",
            "points": [(p, grpo[f"prompts:{p}"]["median_s"]) for p in PROMPTS],
        },
        "math verifications/s vs workers": {
            "xlabel": "workers",
            "points": [(w, results["verify"][w]["median"]) for w in WORKERS],
        },
        "sandbox executions/s vs workers": {
            "xlabel": "workers",
            "points": [(w, results["sandbox"][w]["median"]) for w in WORKERS],
        },
    }
    for entry in out.values():
        entry["fit"] = fit_exponent(*zip(*entry["points"], strict=True))
    return out


def plot(fits: dict[str, dict], path: Path, title: str) -> None:
    """Log-log plots of every series with its fitted line and exponent."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    panels = [
        ["GRPO s/step vs parameters"],
        ["GRPO s/step vs group size"],
        ["GRPO s/step vs prompts per step"],
        ["math verifications/s vs workers", "sandbox executions/s vs workers"],
    ]
    for ax, names in zip(axes.flat, panels, strict=True):
        for name in names:
            xs, ys = zip(*fits[name]["points"], strict=True)
            k, c = fits[name]["fit"]
            line = ax.plot(xs, ys, "o", label=f"{name.split(' vs ')[0]}: k = {k:.2f}")[0]
            grid = [min(xs) * (max(xs) / min(xs)) ** (i / 50) for i in range(51)]
            ax.plot(grid, [c * x**k for x in grid], "-", color=line.get_color(), alpha=0.6)
        ax.set_xscale("log")
        ax.set_yscale("log")
        if names[0] != "GRPO s/step vs parameters":  # few small x values: label them plainly
            ax.set_xticks(xs, [str(x) for x in xs])
            ax.minorticks_off()
        ax.set_xlabel(fits[names[0]]["xlabel"])
        ax.set_ylabel("s/step" if names[0].startswith("GRPO") else "per second")
        ax.set_title(names[0].split(" vs ")[1] if len(names) == 1 else "throughput vs workers")
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(results: dict, fits: dict[str, dict], meta: dict) -> str:
    """The markdown: setup, machine, load, one table per series with its exponent."""
    s = meta["settings"]
    grpo = results["grpo"]
    lines = [
        "# How cost grows" + (" (smoke run: --quick)" if meta["quick"] else ""),
        "",
        f"`{meta['command']}`, {meta['wall_s']:.0f} s in all. Machine: {meta['machine']}.",
        f"Threads: `OMP_NUM_THREADS=MKL_NUM_THREADS={meta['threads']}`, `torch.set_num_threads({meta['threads']})`, "
        f"`learner.torch_threads={meta['threads']}`, `policy.threads={meta['threads']}`; every measurement in a fresh "
        "subprocess.",
        "",
        f"- `uptime` before: `{meta['uptime_before']}`",
        f"- `uptime` after: `{meta['uptime_after']}`",
        "",
        "Fitted exponent k: the least-squares slope of log y on log x over the series (y = c x^k).",
        "",
        "## GRPO step time",
        "",
        f"`learner=grpo`, `learner.async_rollouts=false`, max_new_tokens 48; median `time/step_s` of {s['steps']} "
        f"steps after {s['warmup']} warm-up step(s). Model-size rows: fresh random init on the dense "
        f"`bench_env:FractionAEnv` reward ({s['size_batch'][0]} prompts x group {s['size_batch'][1]}); group and "
        "prompt rows: `env=math` with the shipped tiny default model.",
        "",
        "| series | setting | parameters | completions/step | mean length (tokens) | trained share | "
        "median s/step | steps (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, r in grpo.items():
        name, value = key.split(":")
        params = f"{r['params']:,}" if r["params"] else "792,576 (trained default)"
        lines.append(
            f"| {name} | {value} | {params} | {r['generations']} | {r['length']:.1f} | {r['trained_frac']:.2f} | "
            f"{r['median_s']:.3f} | {', '.join(f'{t:.2f}' for t in r['step_s'])} |"
        )
    lines += ["", "| series | fitted exponent k | c |", "|---|---|---|"]
    for name, entry in fits.items():
        if name.startswith("GRPO"):
            lines.append(f"| {name} | {entry['fit'][0]:.2f} | {entry['fit'][1]:.3g} |")
    lines += [
        "",
        "## Math verifier and code sandbox throughput",
        "",
        f"Verifier: `verify_many` (cache off) on {s['pairs']} fixed symbolic pairs per repeat, all on the worker "
        f"path (new pairs each repeat, the same for every worker count), median of {s['verify_repeats']} "
        f"repeat(s). Sandbox: `SandboxPool.run_many` on {s['jobs']} copies of one small job (backend "
        f"{results['sandbox'][WORKERS[0]]['backend']}), median of {s['sandbox_repeats']} repeat(s).",
        "",
        "| workers | verifications/s | (repeats) | sandbox executions/s | (repeats) |",
        "|---|---|---|---|---|",
    ]
    for w in WORKERS:
        v, b = results["verify"][w], results["sandbox"][w]
        lines.append(
            f"| {w} | {v['median']:.1f} | {', '.join(f'{x:.0f}' for x in v['rates'])} | {b['median']:.1f} | "
            f"{', '.join(f'{x:.0f}' for x in b['rates'])} |"
        )
    lines += ["", "| series | fitted exponent k | c |", "|---|---|---|"]
    for name, entry in fits.items():
        if not name.startswith("GRPO"):
            lines.append(f"| {name} | {entry['fit'][0]:.2f} | {entry['fit'][1]:.3g} |")
    lines += ["", f"![scaling]({meta['png']})", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 1+2 steps, 1 repeat (under 3 minutes)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results", help="folder for the report")
    parser.add_argument("--threads", type=int, default=1, help="OMP/MKL/torch threads of every measurement")
    parser.add_argument("--worker", choices=sorted(WORKER_KINDS), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(WORKER_KINDS[args.worker](json.loads(args.spec))), flush=True)
        return

    settings = SETTINGS["quick" if args.quick else "full"]
    args.out.mkdir(parents=True, exist_ok=True)
    start, before = time.perf_counter(), uptime()
    print(f"uptime before: {before}", flush=True)
    steps = {"warmup": settings["warmup"], "steps": settings["steps"]}
    prompts, group = settings["size_batch"]
    runs = {f"size:{s}": {"size": s, "group": group, "prompts": prompts} for s in SIZES}
    runs |= {f"group:{g}": {"size": None, "group": g, "prompts": DEFAULT_PROMPTS} for g in GROUPS}
    runs |= {f"prompts:{p}": {"size": None, "group": DEFAULT_GROUP, "prompts": p} for p in PROMPTS}
    results: dict = {"grpo": {}, "verify": {}, "sandbox": {}}
    done: dict[str, dict] = {}  # the default point is shared by the group and prompt series: run it once
    for key, spec in runs.items():
        same = json.dumps(spec, sort_keys=True)
        if same not in done:
            done[same] = measure("grpo", {**spec, **steps}, args.threads)
        results["grpo"][key] = done[same]
        r = results["grpo"][key]
        print(f"grpo {key:12s}: {r['median_s']:.3f} s/step (params {r['params']}, length {r['length']:.1f}, "
              f"trained {r['trained_frac']:.2f})", flush=True)  # fmt: skip
    for w in WORKERS:
        results["verify"][w] = measure("verify", {"workers": w, "pairs": settings["pairs"],
                                                  "repeats": settings["verify_repeats"]}, args.threads)  # fmt: skip
        results["sandbox"][w] = measure("sandbox", {"workers": w, "jobs": settings["jobs"],
                                                    "repeats": settings["sandbox_repeats"]}, args.threads)  # fmt: skip
        print(f"{w} worker(s): {results['verify'][w]['median']:.1f} verifications/s, "
              f"{results['sandbox'][w]['median']:.1f} sandbox executions/s", flush=True)  # fmt: skip
    fits = series(results)
    command = "python benchmarks/scaling.py" + (" --quick" if args.quick else "") + f" --threads {args.threads}"
    if args.out != parser.get_default("out"):
        command += f" --out {args.out}"
    meta = {
        "quick": args.quick, "settings": settings, "threads": args.threads, "machine": machine(),
        "uptime_before": before, "uptime_after": uptime(), "wall_s": time.perf_counter() - start,
        "command": command, "png": "scaling.png",
    }  # fmt: skip
    plot(fits, args.out / "scaling.png", "How cost grows" + (" (smoke run)" if args.quick else ""))
    text = report(results, fits, meta)
    (args.out / "scaling.md").write_text(text, encoding="utf-8")
    (args.out / "scaling.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print(text)


if __name__ == "__main__":
    main()
