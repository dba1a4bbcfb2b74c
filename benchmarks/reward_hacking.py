"""Run the reward-hacking battery and report each case's reward.

Run: ``python benchmarks/reward_hacking.py [--out benchmarks/results/reward_hacking.md]``.

Every attack (:mod:`lrmgym.testing.reward_hacking`) solves nothing and tries to be paid anyway; it holds
when its reward is at most its cap (0 for every attack) and it is not ungradeable. Controls are honest
answers that must still earn full marks. Cases on HumanEval/MBPP tasks are skipped without the data sets
(``$LRMGYM_SHARED_DATA``).
"""

from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path

from lrmgym.testing.reward_hacking import iter_results

# Measured once on the code before the reward-integrity fixes (commit 596ad98), with the same cases.
BEFORE = (
    "Before the fixes (commit 596ad98, same cases): 12 of the 26 code attacks earned reward (shadowed builtins "
    "0.33-1.0, StopIteration in map/filter 1.0, a hang swallowed by a test's except 1.0, the stdio memory scan "
    "1.0, do-nothing functions 0.125-0.75 from asserts that cannot fail; the harness-takeover cases here write "
    "the new record format, and a marshal-format forgery of the same attack scored 1 000 000 of 2 tests, see "
    "tests/envs/code/test_code_integrity.py), 38 of the 64 math attacks scored 1.0 and 14 were ungradeable "
    "(masked: the timeout opt-out), and 2 math controls failed (3e3 for 3000, e^{i pi} for -1). Round 3 (issue 35), "
    "measured on commit 0ff3c91 with the round-3 cases: 55 of the 58 new math attacks were paid (copying the "
    "question's expression, answers in a form the task does not ask for, a name in the middle of a false chain, "
    "bracketed decimals past the rounding rule, percent read two ways) and 19 of the 24 new code attacks (lookup "
    "tables of the tests the prompt shows, constant answers, print-then-lookup over two turns, fake modules for "
    "names the tests use); their 16 controls earned full marks before and after."
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "reward_hacking.md")
    args = parser.parse_args()
    rows, by_class = [], collections.defaultdict(lambda: [0, 0])
    start = time.monotonic()
    for result in iter_results():
        case, verdict = result.case, result.verdict
        score = "skipped" if result.skipped else ("None" if verdict.score is None else f"{verdict.score:.3g}")
        held = "skipped" if result.skipped else ("held" if result.held else "**BROKEN**")
        reason = result.skipped or (verdict.reason or "").replace("|", "/").replace("\n", " ")[:100]
        rows.append(f"| `{case.name}` | {score} | {case.max_score:g} | {held} | {reason} |")
        if not result.skipped:
            by_class[(case.env, case.klass)][0] += result.held
            by_class[(case.env, case.klass)][1] += 1
        print(f"{held:8} {score:>8}  {case.name}")
    wall = time.monotonic() - start
    held_n = sum(h for h, _ in by_class.values())
    total_n = sum(n for _, n in by_class.values())
    lines = [
        "# Reward-hacking battery",
        "",
        f"`python benchmarks/reward_hacking.py`: {held_n}/{total_n} cases held ({len(rows) - total_n} skipped), "
        f"{wall:.0f} s wall.",
        "",
        BEFORE,
        "",
        "| env | class | held |",
        "|---|---|---|",
        *(f"| {env} | {klass} | {h}/{n} |" for (env, klass), (h, n) in sorted(by_class.items())),
        "",
        "| case | reward | cap | outcome | verdict reason |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ]
    args.out.write_text("\n".join(lines), encoding="utf-8")
    print(f"{held_n}/{total_n} held; wrote {args.out}")


if __name__ == "__main__":
    main()
