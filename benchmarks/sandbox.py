"""Cost of the code sandbox: HumanEval canonical solutions through the sandbox vs a bare subprocess.

Run: ``python benchmarks/sandbox.py [--backend auto] [--repeats 1] [--sweeps] [--json out.json]``.

1. Overhead: the 164 HumanEval canonical programs (``prompt + solution + test + check(entry_point)``), each
   run once through a bare ``subprocess.run([python, file])`` and once through the sandbox (one worker),
   **interleaved** task by task so that load from other processes hits both alike. Same interpreter.
   Reports both totals and their ratio (target: at most 1.3x).
2. Throughput: the same 164 jobs through a pool of 2 workers, in executions per second.
3. With ``--sweeps``: the full reference sweeps (HumanEval 164 and MBPP 974; canonical, ``pass``-replaced
   and wrong-return variants) with the number of programs that passed every test.

The data comes from ``$LRMGYM_SHARED_DATA`` (default ``<checkout>/../shared/data``).
"""

from __future__ import annotations

import argparse
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

    with SandboxPool(args.backend, workers=1, limits=Limits(timeout_s=30)) as pool:
        out["backend"], out["python"] = pool.backend, pool.python
        jobs = [Job(code=t.solution, units=t.units, prelude=t.prelude, bind=dict(t.bind)) for t, _ in tasks]
        with tempfile.TemporaryDirectory() as tmp:
            paths = bare_programs(tasks, Path(tmp))
            bare, boxed = [], []
            for _ in range(args.repeats):
                for path, job in zip(paths, jobs, strict=True):
                    t0 = time.perf_counter()
                    rc = subprocess.run([pool.python, str(path)], capture_output=True).returncode
                    bare.append(time.perf_counter() - t0)
                    assert rc == 0, path
                    t0 = time.perf_counter()
                    result = pool.run(job)
                    boxed.append(time.perf_counter() - t0)
                    assert result.all_passed, (path, result)
        out["bare_total_s"], out["sandbox_total_s"] = sum(bare), sum(boxed)
        out["ratio"] = sum(boxed) / sum(bare)
        out["bare_median_ms"] = 1000 * statistics.median(bare)
        out["sandbox_median_ms"] = 1000 * statistics.median(boxed)

    with SandboxPool(args.backend, workers=2, limits=Limits(timeout_s=30)) as pool2:
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
    print(f"  bare subprocess.run : {out['bare_total_s']:.2f} s (median {out['bare_median_ms']:.1f} ms)")
    print(f"  sandbox             : {out['sandbox_total_s']:.2f} s (median {out['sandbox_median_ms']:.1f} ms)")
    print(f"  ratio               : {out['ratio']:.2f}x (target <= 1.3x)")
    print(f"2 workers: {out['two_worker_wall_s']:.2f} s for 164 -> {out['two_worker_exec_per_s']:.1f} executions/s")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    sys.exit(0)


if __name__ == "__main__":
    main()
