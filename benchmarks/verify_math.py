"""Benchmark and audit of the math verifier (lrmgym.envs.math.verify) against math-verify called directly.

Sections (all by default; pick with ``--only``):

- ``selfcheck``: every GSM8K test gold and MATH-500 gold verified against itself through the env's strict
  boxed extraction, in two surface forms: the gold as written, and a rewrite (``surface.rewrite_answer``).
- ``agreement``: our verdict on each of Math-Verify's own regression cases (gold, pred, expected).
- ``throughput``: the same 10 000 (prediction, gold) pairs from MATH-500 answers and perturbations, graded
  by math-verify directly (parse + parse + verify, one process, its own SIGALRM timeouts) and by
  ``verify_many`` (fast path, cache, worker pool); verdicts/s, p50/p99 latency, verdict agreement.
- ``adversarial``: wall time of a batch of 1 000 pairs of which 5 % are hostile, and the slowest call.

Usage::

    python benchmarks/verify_math.py [--data ../shared/data] [--only throughput] [--out benchmarks/results]

Writes ``verify_math.json`` (every number and every miss/disagreement) into ``--out``. The machine's load
matters: record ``os.getloadavg()`` (printed) with the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from collections import Counter
from pathlib import Path

from lrmgym.core import Completion
from lrmgym.envs.math import verify as mv
from lrmgym.envs.math.env import MathEnv
from lrmgym.envs.math.surface import rewrite_answer, wrong_answer

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------------- selfcheck
def selfcheck(data: Path) -> dict:
    """Gold vs gold in two surface forms, through the env (strict boxed extraction + verifier)."""
    out = {}
    for source, n in (("gsm8k", 1319), ("math500", 500)):
        env = MathEnv(source=source, split="test", template="boxed", order="sequential", data_dir=str(data))
        tasks = [env.task_at(i, seed=0) for i in range(n)]
        raw = [t.answer for t in tasks]
        if source == "gsm8k":  # the gold as written in the file, thousands commas included
            raw = [json.loads(line)["answer"].split("####")[-1].strip() for line in open(data / "gsm8k" / "test.jsonl")]
        forms = {"gold_as_written": raw, "rewrite": [rewrite_answer(t.answer) for t in tasks]}
        result = {}
        for form, answers in forms.items():
            completions = [Completion(f"The final answer is $\\boxed{{{a}}}$.") for a in answers]
            start = time.perf_counter()
            verdicts = [None] * n
            pairs = list(zip(tasks, completions, strict=True))
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(mv.default_pool().size) as executor:
                verdicts = list(executor.map(lambda tc, env=env: env.verify(*tc), pairs))
            misses = [
                {"index": i, "gold": t.answer, "form": a, "reason": v.reason}
                for i, (t, a, v) in enumerate(zip(tasks, answers, verdicts, strict=True))
                if v.correct is not True
            ]
            result[form] = {
                "n": n,
                "correct": n - len(misses),
                "misses": misses,
                "reasons": Counter(v.reason for v in verdicts),
                "changed_after_normalisation": sum(
                    mv._normalise(a) != mv._normalise(t.answer) for t, a in zip(tasks, answers, strict=True)
                ),
                "wall_s": round(time.perf_counter() - start, 2),
            }
            print(f"selfcheck {source} {form}: {n - len(misses)}/{n} correct ({len(misses)} misses)")
        out[source] = result
    return out


# --------------------------------------------------------------------------------------------------- agreement
AGREEMENT_MODES = {
    # The verifier exactly as the env calls it on an extracted answer.
    "defaults": {"timeout_s": 2.0, "max_answer_chars": 1000},
    # Many upstream cases pass a whole model response as "pred" (math-verify extracts the answer itself);
    # this mode lifts the answer cap for them and gives a loaded machine more time.
    "full_responses": {"timeout_s": 5.0, "max_answer_chars": 50_000},
}


def agreement(data: Path) -> dict:
    """Our verdict on Math-Verify's regression cases versus their recorded expectation, in both modes."""
    return {mode: _agreement(data, **kwargs) for mode, kwargs in AGREEMENT_MODES.items()}


def _agreement(data: Path, timeout_s: float, max_answer_chars: int) -> dict:
    rows = [json.loads(line) for line in open(data / "math_verify_tests" / "math_verify_cases.jsonl")]
    mv.clear_cache()
    from concurrent.futures import ThreadPoolExecutor

    def one(row):
        return mv.verify_answer(
            row["pred"], row["gold"], use_cache=False, timeout_s=timeout_s, max_answer_chars=max_answer_chars
        )

    with ThreadPoolExecutor(mv.default_pool().size) as executor:
        verdicts = list(executor.map(one, rows))
    disagreements = []
    for row, verdict in zip(rows, verdicts, strict=True):
        ours = verdict.correct is True
        if ours != row["expected"]:
            disagreements.append(
                {
                    "id": row["id"],
                    "gold": row["gold"],
                    "pred": row["pred"],
                    "expected": row["expected"],
                    "ours": verdict.score,
                    "reason": verdict.reason,
                    "options": {k: row[k] for k in ("match_types", "precision", "strict", "allow_set_relation_comp")},
                    "comments": row["comments"],
                }
            )
    agree = len(rows) - len(disagreements)
    print(
        f"agreement (timeout {timeout_s} s, answer cap {max_answer_chars}): "
        f"{agree}/{len(rows)} = {agree / len(rows):.1%}"
    )
    return {"n": len(rows), "agree": agree, "rate": agree / len(rows), "disagreements": disagreements}


# --------------------------------------------------------------------------------------------------- pairs
def benchmark_pairs(data: Path, n: int = 10_000, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` (prediction, gold) pairs from MATH-500 golds: identical, rewritten, near-miss and swapped answers."""
    rng = random.Random(seed)
    golds = [json.loads(line)["answer"] for line in open(data / "math500" / "test.jsonl")]
    kinds = ("same", "rewrite", "wrong", "wrong2", "other", "rewrite_other")
    pairs = []
    while len(pairs) < n:
        gold = rng.choice(golds)
        kind = rng.choice(kinds)
        if kind == "same":
            pred = gold
        elif kind == "rewrite":
            pred = rewrite_answer(gold)
        elif kind in ("wrong", "wrong2"):
            pred = wrong_answer(gold, k=rng.randint(1, 9) if kind == "wrong" else -rng.randint(1, 99)) or rng.choice(
                golds
            )
        elif kind == "other":
            pred = rng.choice(golds)
        else:
            pred = rewrite_answer(rng.choice(golds))
        pairs.append((pred, gold))
    return pairs


def _mv_direct(pairs: list[tuple[str, str]]) -> tuple[list[bool | None], list[float]]:
    """math-verify called directly, as its README shows, with our anchor so bare LaTeX is found."""
    from math_verify import parse, verify

    sys.path.insert(0, str(ROOT / "lrmgym" / "envs" / "math"))
    from _worker import _prepare  # the same anchoring our worker uses, so both see the same strings

    sys.path.pop(0)
    verdicts, latencies = [], []
    for pred, gold in pairs:
        start = time.perf_counter()
        try:
            verdicts.append(bool(verify(parse(_prepare(gold)), parse(_prepare(pred)))))
        except BaseException as exc:  # noqa: BLE001 - its TimeoutException is a BaseException
            if isinstance(exc, KeyboardInterrupt):
                raise
            verdicts.append(None)
        latencies.append(time.perf_counter() - start)
    return verdicts, latencies


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ours(pairs: list[tuple[str, str]], pool: mv.VerifierPool, use_cache: bool) -> tuple[list, list[float]]:
    """Our verdicts on ``pairs`` with as many threads as ``pool`` has workers; (verdicts, latencies)."""
    from concurrent.futures import ThreadPoolExecutor

    latencies = [0.0] * len(pairs)

    def timed(i):
        t0 = time.perf_counter()
        verdict = mv.verify_answer(*pairs[i], pool=pool, use_cache=use_cache)
        latencies[i] = time.perf_counter() - t0
        return verdict

    with ThreadPoolExecutor(pool.size) as executor:
        verdicts = list(executor.map(timed, range(len(pairs))))
    return verdicts, latencies


def throughput(data: Path, n: int = 10_000, block: int = 500) -> dict:
    """The three graders on the same pairs, interleaved block by block so that they see the same load."""
    pairs = benchmark_pairs(data, n)
    print(f"throughput: {n} pairs, {len(set(pairs))} distinct; load {os.getloadavg()}")
    single = mv.VerifierPool(size=1)
    single.warm()
    default = mv.default_pool()
    default.warm()
    mv.clear_cache()
    graders = {
        "math_verify": None,
        "lrmgym": (default, True),  # as shipped: fast path, verdict cache, 2 workers
        "lrmgym_1_worker_no_cache": (single, False),  # no parallelism, no verdict cache
    }
    verdicts: dict[str, list] = {name: [] for name in graders}
    latencies: dict[str, list[float]] = {name: [] for name in graders}
    walls = dict.fromkeys(graders, 0.0)
    killed = {name: g[0].stats["killed"] for name, g in graders.items() if g}
    names = list(graders)
    for b, lo in enumerate(range(0, n, block)):
        chunk = pairs[lo : lo + block]
        for name in names[b % 3 :] + names[: b % 3]:  # rotate who goes first
            start = time.perf_counter()
            if graders[name] is None:
                got, lat = _mv_direct(chunk)
            else:
                got, lat = _ours(chunk, *graders[name])
            walls[name] += time.perf_counter() - start
            verdicts[name] += got
            latencies[name] += lat
    result: dict = {"pairs": n, "distinct_pairs": len(set(pairs)), "block": block}
    reference = [bool(v) for v in verdicts["math_verify"]]
    for name in names:
        lat = latencies[name]
        entry = {
            "wall_s": walls[name],
            "verdicts_per_s": n / walls[name],
            "p50_s": _pct(lat, 0.5),
            "p99_s": _pct(lat, 0.99),
            "max_s": max(lat),
        }
        if name != "math_verify":
            pool, use_cache = graders[name]
            ours = verdicts[name]
            diffs = [
                {"pred": p, "gold": g, "math_verify": m, "ours": o.score, "reason": o.reason}
                for (p, g), m, o in zip(pairs, reference, ours, strict=True)
                if m != (o.correct is True)
            ]
            entry.update(
                speedup_vs_math_verify=walls["math_verify"] / walls[name],
                workers=pool.size,
                verdict_cache=use_cache,
                reasons=Counter(o.reason for o in ours).most_common(),
                cache_hits=sum(o.components[0].cached for o in ours),
                killed_workers=pool.stats["killed"] - killed[name],
                calls_over_bound=sum(x > mv.DEFAULT_TIMEOUT_S for x in lat),
                verdict_differences=len(diffs),
                distinct_differences=list({(d["pred"], d["gold"]): d for d in diffs}.values()),
            )
        result[name] = entry
        extra = (
            f" | speed-up {entry['speedup_vs_math_verify']:.2f}x | {entry['verdict_differences']} differing verdicts"
            if name != "math_verify"
            else ""
        )
        print(
            f"  {name}: {entry['verdicts_per_s']:.0f}/s p50 {entry['p50_s'] * 1e3:.1f} ms "
            f"p99 {entry['p99_s'] * 1e3:.1f} ms max {entry['max_s']:.2f} s{extra}"
        )
    single.close()
    return result


# --------------------------------------------------------------------------------------------------- adversarial
HOSTILE = [
    "9**9**9", "10^{10^{10}}", "9^{9^{9}}", "10000000!", "(10!)!", "\\Gamma(10^{10})", "7^{123456789}",
    "\\int_{0}^{1} e^{x^{2}} \\sin(x^{3}) dx", "(" * 1000 + "1" + ")" * 1000, "1" * (1 << 20), "\x00" * 64,
    "\ud800\udc80" * 10, "123 \\bmod 7", "\\sqrt{" * 200 + "2" + "}" * 200, "1+" * 50_000 + "1",
    "\\dfrac{5^{\\left(5^{\\left(5^{\\left(5^5\\right)}\\right)} - 4\\right)} - 5}{16}", "1e999999999",
    "\\binom{10^9}{5\\cdot 10^8}", "\\sum_{n=1}^{10^{12}} n", "2^{2^{2^{2^{2^{2}}}}}",
]  # fmt: skip


def adversarial(data: Path, n: int = 1000, share: float = 0.05, timeout_s: float = 2.0) -> dict:
    rng = random.Random(1)
    normal = benchmark_pairs(data, n, seed=7)
    hostile_idx = set(rng.sample(range(n), int(n * share)))
    pairs = [
        (HOSTILE[i % len(HOSTILE)], gold) if i in hostile_idx else (pred, gold) for i, (pred, gold) in enumerate(normal)
    ]
    pool = mv.default_pool()
    pool.warm()
    mv.clear_cache()
    killed_before = pool.stats["killed"]
    latencies = [0.0] * n

    def timed(i):
        t0 = time.perf_counter()
        verdict = mv.verify_answer(*pairs[i], timeout_s=timeout_s, pool=pool)
        latencies[i] = time.perf_counter() - t0
        return verdict

    from concurrent.futures import ThreadPoolExecutor

    start = time.perf_counter()
    with ThreadPoolExecutor(pool.size) as executor:
        verdicts = list(executor.map(timed, range(n)))
    wall = time.perf_counter() - start
    hostile = [(pairs[i][0][:60], verdicts[i].reason, round(latencies[i], 3)) for i in sorted(hostile_idx)]
    result = {
        "n": n,
        "hostile": len(hostile_idx),
        "timeout_s": timeout_s,
        "wall_s": wall,
        "max_call_s": max(latencies),
        "slowest_calls": sorted(((round(t, 3), pairs[i][0][:60]) for i, t in enumerate(latencies)), reverse=True)[:8],
        "hostile_scored_correct": sum(verdicts[i].correct is True for i in hostile_idx),
        "hostile_outcomes": Counter(r for _, r, _ in hostile).most_common(),
        "killed_workers": pool.stats["killed"] - killed_before,
        "workers_alive_after": len(pool.worker_pids()),
    }
    print(
        f"adversarial: {n} pairs ({len(hostile_idx)} hostile) in {wall:.2f} s; slowest call {max(latencies):.2f} s "
        f"(bound {timeout_s} s); {result['killed_workers']} workers killed; hostile scored correct: "
        f"{result['hostile_scored_correct']}"
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--only", choices=["selfcheck", "agreement", "throughput", "adversarial"], action="append")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--pairs", type=int, default=10_000)
    args = parser.parse_args()
    if not args.data.is_dir():
        sys.exit(f"Data folder {args.data} not found; pass --data /path/to/shared/data.")
    sections = args.only or ["selfcheck", "agreement", "throughput", "adversarial"]
    report = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "loadavg_start": os.getloadavg()},
        "versions": {
            m: __import__("importlib.metadata").metadata.version(m)
            for m in ("math-verify", "sympy", "latex2sympy2_extended")
        },
    }
    for section in sections:
        if section == "throughput":
            report[section] = throughput(args.data, args.pairs)
        else:
            report[section] = globals()[section](args.data)
    report["machine"]["loadavg_end"] = os.getloadavg()
    print(f"load average: start {report['machine']['loadavg_start']}, end {report['machine']['loadavg_end']}")
    args.out.mkdir(parents=True, exist_ok=True)
    name = "verify_math.json" if not args.only else f"verify_math_{'_'.join(sections)}.json"
    (args.out / name).write_text(json.dumps(report, indent=1, default=str, ensure_ascii=True))
    print(f"wrote {args.out / name}")
    mv.shutdown_pools()


if __name__ == "__main__":
    main()
