r"""Declared answer forms per data set, and what copying the question earns (reward integrity, round 3).

For each data set (procedural levels 1-5 of the default env, GSM8K test, MATH-500) this counts the tasks of
each declared answer form (``metadata["answer_form"]``, :mod:`lrmgym.envs.math.forms`), checks that every
gold verifies against itself in its form, and runs the copy attack through the env's real ``verify``: the
answer is an expression the question states (the arithmetic of a generated question, in each way an
attacker would write it; every ``$...$`` / ``\(...\)`` / ``\[...\]`` block of a data-set question and each
side of an ``=`` in one). A task counts as paid when any of its copies earns reward.

The attack set is built here, without the forms module, so that the script also runs on the code before
the change (the forms columns are then ``n/a``) and the two runs are comparable.

Run::

    python benchmarks/answer_forms.py --json /tmp/before.json   # on the code before (PYTHONPATH=old checkout)
    python benchmarks/answer_forms.py --before /tmp/before.json --out benchmarks/results/answer_forms.md

Data sets come from ``$LRMGYM_SHARED_DATA`` (skipped when absent).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import time
from pathlib import Path

from lrmgym.envs.math import generator, loaders
from lrmgym.envs.math.env import MathEnv

_BLOCK_RE = re.compile(r"\$\$(.+?)\$\$|(?<!\\)\$(.+?)(?<!\\)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
_COMPUTE_RE = re.compile(r"^Compute (.+?)(?: as a fraction in lowest terms)?\.$")
_SOLVE_RE = re.compile(r"^(?:Solve for x: (.+)\.|(.+)\. x=\?)$")
_OF_RE = re.compile(r"^(?:What is|Compute) (\S+) of (\d+)[?.]$")
_CHANGE_RES = (
    re.compile(r"^A price of (\d+) dollars is (increased|decreased) by (\d+)%\."),
    re.compile(r"^(\d+) (increased|decreased) by (\d+)%\. Result\?$"),
)


# Measured once with `lrmgym eval env=math eval.tasks=300 eval.n=4` (the embedded tiny model, the default env's
# held-out split) on the code before (0ff3c91) and after the change: the same seed gives the same completions.
TINY_EVAL = (
    "Honest answers are not refused: the default env's tiny model, `lrmgym eval env=math eval.tasks=300 eval.n=4` "
    "(held-out split, T=1), scores avg@4 60.8 % (95 % CI 56.6-64.9) before (0ff3c91) and 60.8 % after; the 1 200 "
    "completions are identical and not one verdict changed (it answers with plain numbers)."
)


def _latex(expr: str) -> str:
    return expr.replace("×", r"\times").replace("÷", r"\div").replace("*", r" \times ")


def procedural_copies(question: str) -> list[str]:
    """Ways to write a generated question's own expression as the answer."""
    copies: list[str] = []
    if match := _OF_RE.match(question):
        share, whole = match.groups()
        copies += [f"{share} \\times {whole}", f"{share} \\cdot {whole}", f"{share}*{whole}"]
        if "%" in share:
            copies.append(f"{share.replace('%', '')}/100 \\times {whole}")
    elif match := _COMPUTE_RE.match(question):
        expr = match.group(1)
        copies += [expr, _latex(expr), _latex(expr).replace(" ", ""), f"x = {_latex(expr)}"]
    elif match := _SOLVE_RE.match(question):
        equation = match.group(1) or match.group(2)
        copies += [equation, equation.replace(" ", "")]
    for change_re in _CHANGE_RES:
        if match := change_re.match(question):
            base, word, pct = match.groups()
            sign = "+" if word == "increased" else "-"
            copies += [f"{base} {sign} {pct}\\% \\times {base}", f"{base} \\times (1 {sign} {pct}/100)"]
    return list(dict.fromkeys(copies))


def block_copies(question: str) -> list[str]:
    """Every math block of a data-set question, and each side of an ``=`` in one."""
    copies: list[str] = []
    for match in _BLOCK_RE.finditer(question):
        block = next(g for g in match.groups() if g is not None).strip().rstrip(".,;:")
        copies.append(block)
        if "=" in block:
            copies += [side.strip() for side in block.split("=") if side.strip()]
    return [c for c in dict.fromkeys(copies) if c]


def _same_as_gold(copy: str, gold: str) -> bool:
    """Whether a copied block is the gold itself (``$6$`` for 6, ``$c$`` for ``\\text{(C)}``): a right answer."""

    def squash(text: str) -> str:
        return re.sub(r"\\text|[\s${}()]", "", text).lower()

    return squash(copy) == squash(gold)


def _r1(answer: str) -> str:
    return f"<think>I copied the question.</think><answer>{answer}</answer>"


def measure(env: MathEnv, tasks: list, copies_of) -> dict:
    """Forms, gold self-check and the copy attack over ``tasks``."""
    forms = collections.Counter(t.metadata.get("answer_form", "n/a") for t in tasks)
    gold_ok = sum(env.verify(t, _r1(str(t.answer))).score == 1.0 for t in tasks)
    paid, paid_not_gold, attempted, examples = 0, 0, 0, []
    for task in tasks:
        copies = copies_of(task.metadata["question"])
        if not copies:
            continue
        attempted += 1
        for copy in copies:
            verdict = env.verify(task, _r1(copy))
            if verdict.score:
                paid += 1
                paid_not_gold += not _same_as_gold(copy, str(task.answer))
                if len(examples) < 8:
                    question = task.metadata["question"][:90]
                    examples.append({"question": question, "copy": copy, "gold": str(task.answer)})
                break
    return {
        "tasks": len(tasks),
        "forms": dict(sorted(forms.items())),
        "gold_self_verified": gold_ok,
        "copy_attempted": attempted,
        "copy_paid": paid,
        "copy_paid_not_gold": paid_not_gold,
        "copy_paid_pct": round(100 * paid / max(attempted, 1), 1),
        "examples": examples,
    }


def run(n_per_level: int, data_dir: Path | None) -> dict:
    results: dict[str, dict] = {}
    for level in generator.LEVELS:
        for style in ("compact", "instruct"):
            env = MathEnv(difficulty=level, style=style)
            tasks = [env.task_at(i, seed=20261203) for i in range(n_per_level)]
            results[f"procedural L{level} ({style})"] = measure(env, tasks, procedural_copies)
            env.close()
            print(f"procedural L{level} {style}: {results[f'procedural L{level} ({style})']['copy_paid_pct']} % paid")
    if data_dir is not None and data_dir.is_dir():
        for source in ("gsm8k", "math500"):
            env = MathEnv(source=source, split="test", order="sequential", data_dir=str(data_dir))
            tasks = [env.task_at(i) for i in range(env.num_items)]
            results[source] = measure(env, tasks, block_copies)
            env.close()
            print(f"{source}: {results[source]['copy_paid']}/{results[source]['copy_attempted']} paid")
    return results


def _report(after: dict, before: dict | None, wall: float, n: int) -> str:
    lines = [
        "# Answer forms and the copy attack",
        "",
        f"`python benchmarks/answer_forms.py --before <before.json>` ({n} tasks per procedural level and style, "
        f"the whole GSM8K test split and MATH-500; {wall:.0f} s). Each task declares the form its answer must "
        'take (`metadata["answer_form"]`, see `lrmgym/envs/math/forms.py`); the copy attack answers with an '
        "expression the question states (a generated question's arithmetic in several spellings; every "
        "`$...$` block of a data-set question and each side of an `=` in one), graded by the env's `verify`. "
        "A task is paid when any copy earns reward. *Before* is the same script on the code before the change "
        "(commit 0ff3c91), which declared no forms.",
        "",
        "| data set | tasks | declared forms | golds verified | copy paid before | copy paid now | of which the "
        "copy is not the gold |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in after.items():
        forms = ", ".join(f"{k} {v}" for k, v in row["forms"].items())
        was = before.get(name) if before else None
        was_text = f"{was['copy_paid']}/{was['copy_attempted']} ({was['copy_paid_pct']} %)" if was else "n/a"
        now_text = f"{row['copy_paid']}/{row['copy_attempted']} ({row['copy_paid_pct']} %)"
        lines.append(
            f"| {name} | {row['tasks']} | {forms} | {row['gold_self_verified']}/{row['tasks']} | {was_text} | "
            f"{now_text} | {row.get('copy_paid_not_gold', 'n/a')} |"
        )
    lines += ["", TINY_EVAL]
    leftovers = [(name, e) for name, row in after.items() for e in row["examples"]]
    lines += [
        "",
        "Copies still paid now: only where the question itself states the right answer (the block *is* the "
        "gold, e.g. a digit the question names, or a radical already in simplest form):"
        if leftovers
        else "No copy is paid now.",
    ]
    lines += [
        f"- {name}: `{e['copy']}` for gold `{e['gold']}`"
        f"{'' if _same_as_gold(e['copy'], e['gold']) else ' (NOT the gold)'} ({e['question']!r})"
        for name, e in leftovers
    ]
    if before:
        lines += ["", "Examples paid before:"]
        for name, row in before.items():
            for e in row["examples"][:2]:
                lines.append(f"- {name}: `{e['copy']}` for gold `{e['gold']}` ({e['question']!r})")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300, help="tasks per procedural level and style")
    parser.add_argument("--data", type=Path, default=loaders.default_data_dir())
    parser.add_argument("--json", type=Path, help="write the raw results here")
    parser.add_argument("--before", type=Path, help="the --json of a run on the code before, for the report")
    parser.add_argument("--out", type=Path, help="write the markdown report here")
    args = parser.parse_args()
    start = time.monotonic()
    results = run(args.n, args.data)
    wall = time.monotonic() - start
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    before = json.loads(args.before.read_text()) if args.before else None
    report = _report(results, before, wall, args.n)
    print(report)
    if args.out:
        args.out.write_text(report)


if __name__ == "__main__":
    main()
