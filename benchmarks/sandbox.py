"""Cost of the code sandbox: HumanEval canonical solutions through the sandbox vs a bare subprocess.

Run: ``python benchmarks/sandbox.py [--backend auto] [--repeats 1] [--sweeps] [--json out.json]``.

1. Overhead: the 164 HumanEval canonical programs (``prompt + solution + test + check(entry_point)``), each
   run once through a bare ``subprocess.run([python, file])`` and once through the sandbox (one worker),
   **interleaved** task by task so that load from other processes hits both alike. Same interpreter.
   Reports both totals and their ratio (target: at most 1.3x). The pool pre-starts each slot's next
   sandbox while a job runs (the default), so a job's time is hand-over to result; that start-up still
   costs CPU, which here overlaps with the bare run. A second pass does the same with ``prestart=False``
   (every sandbox started on demand: the cold-start cost, for reference).
2. Throughput: the same 164 jobs through a pool of 2 workers (with and without pre-start), in executions per
   second, against bare ``subprocess.run`` 2 at a time: with both cores busy nothing can hide the start-up.
3. With ``--sweeps``: the full reference sweeps (HumanEval 164 and MBPP 974; canonical, ``pass``-replaced
   and wrong-return variants) with the number of programs that passed every test.

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
    parser.add_argument("--sweeps", action="store_true", help="also run the full HumanEval/MBPP sweeps")
    parser.add_argument("--json", type=Path, help="write the numbers here")
    args = parser.parse_args()

    import gzip

    data = default_data_dir()
    he_path = data / "humaneval" / "HumanEval.jsonl.gz"
    rows = [json.loads(line) for line in gzip.open(he_path, "rt")]
    tasks = list(zip(load_humaneval(he_path), rows, strict=True))
    out: dict = {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()}

    jobs = [Job(code=t.solution, units=t.units, prelude=t.prelude, bind=dict(t.bind)) for t, _ in tasks]
    limits = Limits(timeout_s=30)
    with tempfile.TemporaryDirectory() as tmp:
        paths = bare_programs(tasks, Path(tmp))
        for prefix, prestart in (("", True), ("cold_", False)):
            with SandboxPool(args.backend, workers=1, limits=limits, prestart=prestart) as pool:
                out["backend"], out["python"] = pool.backend, pool.python
                bare, boxed = interleaved(pool, paths, jobs, args.repeats)
            out[f"{prefix}bare_total_s"], out[f"{prefix}sandbox_total_s"] = sum(bare), sum(boxed)
            out[f"{prefix}ratio"] = sum(boxed) / sum(bare)
            out[f"{prefix}bare_median_ms"] = 1000 * statistics.median(bare)
            out[f"{prefix}sandbox_median_ms"] = 1000 * statistics.median(boxed)

        with concurrent.futures.ThreadPoolExecutor(2) as threads:
            t0 = time.perf_counter()
            codes = list(threads.map(lambda p: subprocess.run([out["python"], str(p)], capture_output=True), paths))
            wall = time.perf_counter() - t0
        assert all(c.returncode == 0 for c in codes)
        out["bare_two_worker_exec_per_s"] = len(paths) / wall

    with SandboxPool(args.backend, workers=2, limits=limits, prestart=False) as cold2:
        t0 = time.perf_counter()
        assert all(r.all_passed for r in cold2.run_many(jobs))
        out["cold_two_worker_exec_per_s"] = len(jobs) / (time.perf_counter() - t0)

    with SandboxPool(args.backend, workers=2, limits=limits) as pool2:
        t0 = time.perf_counter()
        results = pool2.run_many(jobs)
        wall = time.perf_counter() - t0
        assert all(r.all_passed for r in results)
        out["two_worker_wall_s"], out["two_worker_exec_per_s"] = wall, len(jobs) / wall

        if args.sweeps:
            mbpp = load_mbpp(data / "mbpp" / "mbpp.jsonl")
            he = [t for t, _ in tasks]
            out["sweeps"] = {}
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
    out["loadavg_end"] = os.getloadavg()

    print(f"backend {out['backend']}, python {out['python']}, {out['cpus']} CPUs, load {out['loadavg_start']}")
    print(f"164 HumanEval canonical programs x{args.repeats}, one at a time, interleaved:")
    for prefix, label in (("", "pre-started"), ("cold_", "cold start ")):
        print(
            f"  {label}: bare subprocess.run {out[prefix + 'bare_total_s']:.2f} s (median "
            f"{out[prefix + 'bare_median_ms']:.1f} ms), sandbox {out[prefix + 'sandbox_total_s']:.2f} s (median "
            f"{out[prefix + 'sandbox_median_ms']:.1f} ms): ratio {out[prefix + 'ratio']:.2f}x"
        )
    print("  (target <= 1.3x for the pool as configured by default, pre-started)")
    print(f"2 at a time, executions/s: sandbox {out['two_worker_exec_per_s']:.1f} (pre-started), ", end="")
    print(
        f"{out['cold_two_worker_exec_per_s']:.1f} (cold), bare subprocess.run {out['bare_two_worker_exec_per_s']:.1f}"
    )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    sys.exit(0)


if __name__ == "__main__":
    main()
