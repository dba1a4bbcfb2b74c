"""Time our Bradley-Terry fit against choix on 10 000 comparisons over 1 000 traces.

Run: ``python benchmarks/bradley_terry.py [--items 1000] [--comparisons 10000] [--repeats 5]``.
Prints the median wall time of each solver, their iterations, and the largest difference between the two
solutions (choix gets the same graph with counts doubled and ``alpha = lam``; see the mapping in
``lrmgym/judges/bradley_terry.py``). choix is a benchmark dependency only.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from lrmgym.judges.bradley_terry import fit_bradley_terry


def make_graph(n_items: int, n_comparisons: int, seed: int) -> np.ndarray:
    """Random comparisons with outcomes drawn from a true BT model (ties when |p - 0.5| is small)."""
    rng = np.random.default_rng(seed)
    true = rng.normal(size=n_items)
    i = rng.integers(0, n_items, n_comparisons)
    j = (i + rng.integers(1, n_items, n_comparisons)) % n_items
    p = 1.0 / (1.0 + np.exp(-(true[i] - true[j])))
    u = rng.random(n_comparisons)
    y = np.where(u < p - 0.05, 1.0, np.where(u > p + 0.05, 0.0, 0.5))
    return np.stack([i, j, y], axis=1)  # (m, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--comparisons", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--l2", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    comps = make_graph(args.items, args.comparisons, args.seed)

    ours_times, fit = [], None
    for _ in range(args.repeats):
        start = time.perf_counter()
        fit = fit_bradley_terry(args.items, comps, l2=args.l2)
        ours_times.append(time.perf_counter() - start)
    print(f"graph: {args.items} traces, {args.comparisons} comparisons (win/tie/loss), lambda={args.l2}")
    print(
        f"lrmgym Newton : median {1e3 * statistics.median(ours_times):8.1f} ms over {args.repeats} runs, "
        f"{fit.iterations} Newton steps, converged={fit.converged}, |grad|max={fit.grad_norm:.1e}"
    )

    try:
        import choix
    except ImportError:
        print("choix           : not installed (pip install choix) - skipped")
        return
    data = []
    for a, b, y in comps:
        wins = int(round(2 * y))
        data += [(int(a), int(b))] * wins + [(int(b), int(a))] * (2 - wins)
    choix_times, theirs = [], None
    for _ in range(max(1, min(args.repeats, 2))):
        start = time.perf_counter()
        theirs = choix.opt_pairwise(args.items, data, alpha=args.l2, tol=1e-8)
        choix_times.append(time.perf_counter() - start)
    print(
        f"choix Newton-CG: median {1e3 * statistics.median(choix_times):8.1f} ms over {len(choix_times)} runs "
        f"(opt_pairwise, alpha=lambda on doubled counts)"
    )
    print(f"max |ours - choix| = {np.max(np.abs(fit.strengths - theirs)):.2e}")


if __name__ == "__main__":
    main()
