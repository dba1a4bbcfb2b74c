"""What a lookup table of the shown tests, or a constant, earns on the code env, before and after held-out grading.

Run: ``python benchmarks/code_lookup.py [--procedural 400] [--workers 2] [--fresh-cache] [--out
benchmarks/results/code_lookup.md]``.

For HumanEval (164), MBPP (974, every split) and procedural tasks, each task is graded on

- **before**: the tests it was graded on before this change (HumanEval's ``check``, MBPP's ``test_list``, which
  its prompt lists; procedural: the shown example among the graded tests, as the generator used to do);
- **after**: the tests :mod:`lrmgym.envs.code.heldout` grades on (hidden originals plus generated tests, joined
  in twos of different expected values; procedural: tests other than the example);

against these answers (no one solves the task):

- ``lookup+none``: a table of the calls and expected values the prompt shows, ``None`` for anything else;
- ``lookup+shown``: the same table, and for anything else the most common expected value the prompt shows;
- ``const:<v>``: every tested function returns ``v`` (``None``, ``0``, ``True``, ``False``, ``''``, ``[]``).

It reports each answer's mean reward (``reward="fraction"``), the share of tasks at 0, at >= 0.5 and at 1.0, and
how many canonical solutions pass every new test (with the ``pass`` and wrong-return variants, which must not),
plus the time the held-out generation took (with ``--fresh-cache``: from an empty cache).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from lrmgym.envs.code import heldout
from lrmgym.envs.code.env import job_for
from lrmgym.envs.code.loaders import CodeTask, default_data_dir, load_humaneval, load_mbpp
from lrmgym.envs.code.procedural import make_procedural_task
from lrmgym.envs.code.sandbox import Limits, SandboxPool
from lrmgym.envs.code.sweep import VARIANTS, sweep
from lrmgym.testing.reward_hacking.code_cases import constant_program, lookup_program, tested_names

CONSTANTS = (None, 0, True, False, "", [])


def attacks(task: CodeTask) -> dict[str, str]:
    """The attack programs for ``task``."""
    names = tested_names(task)
    out = {
        "lookup+none": lookup_program(task.text, names, "none"),
        "lookup+shown": lookup_program(task.text, names, "shown"),
    }
    for value in CONSTANTS:
        out[f"const:{value!r}"] = constant_program(names, value)
    return out


def summary(scores: list[float]) -> dict[str, float]:
    """Mean and shares of one answer's rewards over a data set."""
    n = len(scores)
    return {
        "mean": statistics.fmean(scores),
        "at_0": sum(s == 0 for s in scores) / n,
        "at_least_half": sum(s >= 0.5 for s in scores) / n,
        "at_1": sum(s == 1 for s in scores) / n,
        "n": n,
    }


def grade(pool: SandboxPool, pairs: list[tuple[CodeTask, CodeTask]]) -> dict[str, dict[str, dict[str, float]]]:
    """``{"before"|"after": {attack: summary}}`` over ``(before, after)`` task pairs (the attack reads the prompt)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for side in ("before", "after"):
        jobs, keys = [], []
        for before, after in pairs:
            task = before if side == "before" else after
            for name, code in attacks(before).items():
                jobs.append(job_for(task, code))
                keys.append(name)
        results = pool.run_many(jobs)
        scores: dict[str, list[float]] = {}
        for name, result in zip(keys, results, strict=True):
            scores.setdefault(name, []).append(result.fraction)
        out[side] = {name: summary(s) for name, s in scores.items()}
    return out


def procedural_pairs(n: int) -> list[tuple[CodeTask, CodeTask]]:
    """``n`` procedural tasks, before (the example graded too) and after (the example not graded)."""
    pairs = []
    for i in range(n):
        task = make_procedural_task(i, np.random.default_rng(np.random.SeedSequence([7, i])))
        example = {"src": task.text.splitlines()[-1], "test": True}
        pairs.append((dataclasses.replace(task, units=(example, *task.units[:-1])), task))
    return pairs


def table(name: str, graded: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    lines = [
        f"### {name} ({graded['after']['lookup+none']['n']} tasks)",
        "",
        "| answer | before: mean | at 1.0 | after: mean | at 0 | >= 0.5 | at 1.0 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for attack, after in graded["after"].items():
        before = graded["before"][attack]
        lines.append(
            f"| `{attack}` | {before['mean']:.3f} | {before['at_1']:.1%} | **{after['mean']:.3f}** | "
            f"{after['at_0']:.1%} | {after['at_least_half']:.1%} | {after['at_1']:.1%} |"
        )
    worst = max(graded["after"].items(), key=lambda kv: kv[1]["mean"])
    lines += ["", f"Highest mean after: `{worst[0]}` {worst[1]['mean']:.3f}.", ""]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procedural", type=int, default=400, help="procedural tasks (default 400)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--fresh-cache", action="store_true", help="generate into an empty cache (times it)")
    parser.add_argument("--limit", type=int, default=None, help="first N tasks of each data set (a smoke run)")
    parser.add_argument("--out", default="benchmarks/results/code_lookup.md")
    args = parser.parse_args()

    data = default_data_dir()
    if args.fresh_cache:
        os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="lrmgym-heldout-bench-")
    raw = {
        "HumanEval": load_humaneval(data / "humaneval" / "HumanEval.jsonl.gz"),
        "MBPP": load_mbpp(data / "mbpp" / "mbpp.jsonl"),
    }
    raw = {name: tasks[: args.limit] for name, tasks in raw.items()}

    def factory() -> SandboxPool:
        return SandboxPool("auto", workers=args.workers, warm=False)

    generation = {}
    graded_sets = {}
    for name, tasks in raw.items():
        start = time.monotonic()
        graded_sets[name] = heldout.graded_tasks(tasks, factory)
        generation[name] = time.monotonic() - start
        print(f"{name}: held-out tests for {len(tasks)} tasks in {generation[name]:.1f} s", file=sys.stderr)

    pool = SandboxPool("auto", workers=args.workers, limits=Limits(timeout_s=10.0))
    results: dict[str, object] = {"generation_s": generation, "backend": pool.backend}
    lines = [
        "# Lookup tables of the shown tests and constant answers on the code env",
        "",
        f"`python benchmarks/code_lookup.py --procedural {args.procedural}"
        + (" --fresh-cache" if args.fresh_cache else "")
        + f"` (sandbox: {pool.backend}, {args.workers} workers). Mean reward (`reward=fraction`) of answers that"
        " solve nothing, graded on the tests of before this change and on the held-out tests"
        " (`lrmgym/envs/code/heldout.py`); the goal is a mean < 0.1 after, on every data set.",
        "",
    ]
    try:
        sweeps = {}
        for name, tasks in graded_sets.items():
            by_id = {t.id: t for t in tasks}
            pairs = [(t, by_id[t.id]) for t in raw[name] if t.id in by_id]
            graded = grade(pool, pairs)
            results[name] = graded
            lines += table(name, graded)
            sweeps[name] = {v: sweep(pool, tasks, v) for v in VARIANTS}
            sweeps[name]["original"] = sweep(pool, raw[name], "canonical")
            print(f"{name}: graded", file=sys.stderr)
        graded = grade(pool, procedural_pairs(args.procedural))
        results["procedural"] = graded
        lines += table("procedural", graded)
    finally:
        pool.close()

    lines += [
        "### Reference solutions on the held-out tests",
        "",
        "| data set | tasks kept | dropped (no hidden test) | canonical passes all | `pass` variant passes | "
        "wrong-return variant passes | canonical on the original tests | generation (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, reports in sweeps.items():
        kept = len(graded_sets[name])
        lines.append(
            f"| {name} | {kept} | {len(raw[name]) - kept} | {reports['canonical'].all_passed}/{kept} | "
            f"{reports['pass'].all_passed} | {reports['wrong'].all_passed} | "
            f"{reports['original'].all_passed}/{len(raw[name])} | {generation[name]:.1f} |"
        )
        results[f"{name}_sweep"] = {
            v: {"all_passed": r.all_passed, "tasks": r.tasks, "failing": r.failing_ids[:20] if v == "canonical" else []}
            for v, r in reports.items()
        }
    dropped = sorted({t.id for ts in raw.values() for t in ts} - {t.id for ts in graded_sets.values() for t in ts})
    lines += ["", f"Dropped tasks (no hidden test could be generated or kept): {', '.join(dropped) or 'none'}."]
    tests = {name: [sum(1 for u in t.units if u["test"]) for t in ts] for name, ts in graded_sets.items()}
    lines += [
        "",
        "Graded units per task (a unit joins two tests of different expected values where it can): "
        + ", ".join(f"{n} median {statistics.median(c):g} (min {min(c)}, max {max(c)})" for n, c in tests.items())
        + ".",
        "",
    ]
    out = Path(args.out)
    out.write_text("\n".join(lines))
    out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=str))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
