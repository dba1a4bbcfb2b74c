"""Cost of the code sandbox: HumanEval canonical solutions through the sandbox vs a bare subprocess.

Run: ``python benchmarks/sandbox.py [--backend auto] [--repeats 1] [--sweeps] [--json out.json]``.

1. Overhead: the 164 HumanEval canonical programs (``prompt + solution + test + check(entry_point)``), each
   run once through a bare ``subprocess.run([python, file])`` and once through the sandbox (one worker),
   **interleaved** task by task so that load from other processes hits both alike. Same interpreter.
   Reports both totals and their ratio. Three pools, each in its own interleaved pass: the warm server
   (``warm_``: the default; one long-lived bwrap sandbox per slot forking fresh namespaces per job),
   cold with a pre-started sandbox per slot (no prefix: ``warm=False``, the previous default; its start-up
   costs CPU that here overlaps with the bare run), and cold started on demand (``cold_``: ``warm=False,
   prestart=False``).
2. Throughput: the same 164 jobs through pools of 2 workers (warm, cold pre-started, cold on demand), in
   executions per second, against bare ``subprocess.run`` 2 at a time: with both cores busy nothing can hide
   a start-up. Measured in ``--rounds`` rounds over the 164 jobs; each round alternates bare and every pool
   in chunks of 41 jobs (rotating who goes first), so that load from other processes hits all alike; the
   keys hold the medians over the rounds, and ``*_two_worker_vs_bare`` the median of the per-round ratios.
3. With ``--sweeps``: the full reference sweeps (HumanEval 164 and MBPP 974; canonical, ``pass``-replaced
   and wrong-return variants) with the number of programs that passed every test, on the default (warm) pool.

The data comes from ``$LRMGYM_SHARED_DATA`` (default ``<checkout>/../shared/data``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lrmgym.envs.code.loaders import default_data_dir, load_humaneval, load_mbpp
from lrmgym.envs.code.sandbox import Job, Limits, SandboxPool
from lrmgym.envs.code.sweep import VARIANTS, sweep

POOLS = {
    "warm": ("warm_", {"warm": True}),
    "prestarted": ("", {"warm": False, "prestart": True}),
    "cold": ("cold_", {"warm": False, "prestart": False}),
}
"""The pools compared: name -> (prefix of their output keys, SandboxPool options)."""


def uptime() -> str:
    """``uptime``'s line (the load of the machine, which other users' work may share)."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "load average: {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg())


def bare_programs(tasks, workdir: Path) -> list[Path]:
    """Write each task as the program the original HumanEval harness runs."""
    paths = []
    for task, row in tasks:
        path = workdir / f"{task.id.replace('/', '_')}.py"
        path.write_text(f"{row['prompt']}{row['canonical_solution']}\n{row['test']}\ncheck({row['entry_point']})\n")
        paths.append(path)
    return paths


def interleaved(pool: SandboxPool, paths: list[Path], jobs: list[Job], repeats: int) -> tuple[list, list]:
    """Seconds per program, bare and through ``pool``, alternating program by program."""
    bare, boxed = [], []
    for _ in range(repeats):
        for path, job in zip(paths, jobs, strict=True):
            t0 = time.perf_counter()
            rc = subprocess.run([pool.python, str(path)], capture_output=True).returncode
            bare.append(time.perf_counter() - t0)
            assert rc == 0, path
            t0 = time.perf_counter()
            result = pool.run(job)
            boxed.append(time.perf_counter() - t0)
            assert result.all_passed, (path, result)
    return bare, boxed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="auto", choices=["auto", "bwrap", "unshare", "process"])
    parser.add_argument("--repeats", type=int, default=1, help="passes over the 164 programs for the overhead")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds of the 2-worker throughput")
    parser.add_argument("--sweeps", action="store_true", help="also run the full HumanEval/MBPP sweeps")
    parser.add_argument("--json", type=Path, help="write the numbers here")
    args = parser.parse_args()

    import gzip

    data = default_data_dir()
    he_path = data / "humaneval" / "HumanEval.jsonl.gz"
    rows = [json.loads(line) for line in gzip.open(he_path, "rt")]
    tasks = list(zip(load_humaneval(he_path), rows, strict=True))
    out: dict = {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg(), "uptime_start": uptime()}

    jobs = [Job(code=t.solution, units=t.units, prelude=t.prelude, bind=dict(t.bind)) for t, _ in tasks]
    limits = Limits(timeout_s=30)
    with tempfile.TemporaryDirectory() as tmp:
        paths = bare_programs(tasks, Path(tmp))
        out["pools"] = {}
        for name, (prefix, options) in POOLS.items():
            with SandboxPool(args.backend, workers=1, limits=limits, **options) as pool:
                out["backend"], out["python"] = pool.backend, pool.python
                out["pools"][name] = {"key_prefix": prefix, "warm": pool.warm, "prestart": pool.prestart}
                bare, boxed = interleaved(pool, paths, jobs, args.repeats)
            out[f"{prefix}bare_total_s"], out[f"{prefix}sandbox_total_s"] = sum(bare), sum(boxed)
            out[f"{prefix}ratio"] = sum(boxed) / sum(bare)
            out[f"{prefix}bare_median_ms"] = 1000 * statistics.median(bare)
            out[f"{prefix}sandbox_median_ms"] = 1000 * statistics.median(boxed)

        def run_bare(path: Path) -> subprocess.CompletedProcess:
            return subprocess.run([out["python"], str(path)], capture_output=True)

        pools2 = {name: SandboxPool(args.backend, workers=2, limits=limits, **POOLS[name][1]) for name in POOLS}
        try:
            for pool in pools2.values():  # first use: every slot's server or spare started, as in steady state
                assert all(r.all_passed for r in pool.run_many(jobs[:8]))
            rates: dict[str, list[float]] = {name: [] for name in ("bare", *POOLS)}
            walls: dict[str, list[float]] = {name: [] for name in rates}
            chunk = 41  # a quarter of the jobs: each round alternates bare and the pools chunk by chunk
            for round_no in range(args.rounds):
                for name in walls:
                    walls[name].append(0.0)
                for at in range(0, len(jobs), chunk):
                    names = list(walls)
                    shift = (round_no + at // chunk) % len(names)  # rotate who goes first
                    for name in names[shift:] + names[:shift]:
                        t0 = time.perf_counter()
                        if name == "bare":
                            with concurrent.futures.ThreadPoolExecutor(2) as threads:
                                codes = list(threads.map(run_bare, paths[at : at + chunk]))
                            assert all(c.returncode == 0 for c in codes)
                        else:
                            results = pools2[name].run_many(jobs[at : at + chunk])
                            assert all(r.all_passed for r in results), name
                        walls[name][-1] += time.perf_counter() - t0
            for name in rates:
                rates[name] = [len(jobs) / w for w in walls[name]]
            for name, key in (("bare", "bare_"), *((n, p) for n, (p, _) in POOLS.items())):
                out[f"{key}two_worker_exec_per_s"] = statistics.median(rates[name])
                out[f"{key}two_worker_exec_per_s_rounds"] = [round(r, 1) for r in rates[name]]
                if name != "bare":
                    ratios = [r / b for r, b in zip(rates[name], rates["bare"], strict=True)]
                    out[f"{key}two_worker_vs_bare"] = statistics.median(ratios)
            out["two_worker_wall_s"] = statistics.median(walls["prestarted"])
            out["warm_two_worker_wall_s"] = statistics.median(walls["warm"])
        finally:
            for name in ("prestarted", "cold"):
                pools2.pop(name).close()
        pool2 = pools2["warm"]

        if args.sweeps:
            mbpp = load_mbpp(data / "mbpp" / "mbpp.jsonl")
            he = [t for t, _ in tasks]
            out["sweeps"] = {}
            out["sweeps_pool"] = {"warm": pool2.warm, "prestart": pool2.prestart, "workers": pool2.workers}
            for name, ts in (("humaneval", he), ("mbpp", mbpp)):
                for variant in VARIANTS:
                    rep = sweep(pool2, ts, variant)
                    out["sweeps"][f"{name}/{variant}"] = {
                        "tasks": rep.tasks,
                        "all_passed": rep.all_passed,
                        "statuses": dict(rep.statuses),
                        "wall_s": round(rep.wall_s, 1),
                        "misses": rep.failing_ids if variant == "canonical" else rep.passing_ids,
                    }
                    print(
                        f"sweep {name:9s} {variant:9s}: {rep.all_passed}/{rep.tasks} passed every test "
                        f"({dict(rep.statuses)}, {rep.wall_s:.1f} s)",
                        flush=True,
                    )
        pool2.close()
    out["loadavg_end"] = os.getloadavg()
    out["uptime_end"] = uptime()
    out["load_note"] = (
        f"load average {out['loadavg_start'][0]:.1f} at the start, {out['loadavg_end'][0]:.1f} at the end, on "
        f"{out['cpus']} CPUs shared with other users' work: absolute rates vary with it; every ratio is measured "
        "interleaved (one at a time: program by program; 2 workers: chunk by chunk)"
    )

    print(f"backend {out['backend']}, python {out['python']}, {out['cpus']} CPUs, load {out['loadavg_start']}")
    print(f"164 HumanEval canonical programs x{args.repeats}, one at a time, interleaved:")
    for prefix, label in (("warm_", "warm server"), ("", "pre-started"), ("cold_", "cold start ")):
        print(
            f"  {label}: bare subprocess.run {out[prefix + 'bare_total_s']:.2f} s (median "
            f"{out[prefix + 'bare_median_ms']:.1f} ms), sandbox {out[prefix + 'sandbox_total_s']:.2f} s (median "
            f"{out[prefix + 'sandbox_median_ms']:.1f} ms): ratio {out[prefix + 'ratio']:.2f}x"
        )
    print("  (target <= 1.0x for the pool as configured by default, warm)")
    print(f"2 at a time, executions/s (median of {args.rounds} alternating rounds):")
    print(f"  bare subprocess.run {out['bare_two_worker_exec_per_s']:.1f} {out['bare_two_worker_exec_per_s_rounds']}")
    for prefix, label in (("warm_", "warm server"), ("", "pre-started"), ("cold_", "cold start ")):
        print(
            f"  {label}: {out[prefix + 'two_worker_exec_per_s']:.1f} {out[prefix + 'two_worker_exec_per_s_rounds']}"
            f", {out[prefix + 'two_worker_vs_bare']:.2f}x bare"
        )
    print("  (target >= 0.9x bare for the warm server)")
    print(f"uptime: {out['uptime_start']} -> {out['uptime_end']}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    sys.exit(0)


if __name__ == "__main__":
    main()
