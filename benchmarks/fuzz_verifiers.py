"""Fuzz the math verifier and the 24 checker with hypothesis: no crash, no call over its bound.

The targets, strategies and properties are those of the property tests
(``tests/envs/math/test_verify_fuzz.py``, ``tests/envs/game24/test_checker_fuzz.py``), run here at full size:
each target first gets its known hostile inputs, then ``--examples`` generated ones (derandomized, so a run is
reproducible). For each target it reports the inputs tried, the crashes (an exception escaping the public
grading call or a malformed verdict; each distinct one is shrunk by hypothesis to a minimal input, shown with
its traceback), the calls over the bound (wall time above the bound + ``--margin``), and p50/p99/max wall time
per call. The math targets run at the env's default ``timeout_s`` (2 s) unless ``--timeout`` says otherwise.

Usage::

    python benchmarks/fuzz_verifiers.py                               # 10 000 inputs per target (about an hour)
    python benchmarks/fuzz_verifiers.py --examples 500 --timeout 1   # a quick check (about 2 minutes)
    python benchmarks/fuzz_verifiers.py --targets game24/single,game24/steps

Prints a markdown report and writes it to ``--out`` (default ``benchmarks/results/fuzz_verifiers.md``).
The machine's load matters for the wall times: the report records ``os.getloadavg()``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from types import ModuleType
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings

ROOT = Path(__file__).resolve().parents[1]
TEST_MODULES = ("tests/envs/math/test_verify_fuzz.py", "tests/envs/game24/test_checker_fuzz.py")


def _load(relative: str) -> ModuleType:
    """Import a test module by path (tests/ is not a package), without touching ``sys.path``."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


@dataclass
class Report:
    """What one target's run found."""

    name: str
    bound_s: float
    margin_s: float
    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)
    outcomes: Counter = field(default_factory=Counter)
    crashes: list[tuple[Any, str]] = field(default_factory=list)  # (input, traceback)
    over: list[tuple[float, Any]] = field(default_factory=list)  # (wall, input): wall > bound + margin
    cpu_over: list[tuple[float, Any]] = field(default_factory=list)  # (cpu, input): cpu > bound
    slowest: list[tuple[float, Any]] = field(default_factory=list)
    minimal: list[tuple[Any, str]] = field(default_factory=list)

    def record(self, target: Any, case: Any) -> None:
        try:
            call = target.check(case)
        except Exception:  # noqa: BLE001 - a crash is what we are counting
            self.crashes.append((case, traceback.format_exc()))
            self.outcomes["CRASH"] += 1
            return
        self.walls.append(call.wall_s)
        self.cpus.append(call.cpu_s)
        self.outcomes[call.outcome] += 1
        if call.wall_s > self.bound_s + self.margin_s:
            self.over.append((call.wall_s, case))
        if call.cpu_s > self.bound_s:
            self.cpu_over.append((call.cpu_s, case))
        self.slowest = sorted([*self.slowest, (call.wall_s, case)], key=lambda item: -item[0])[:3]

    @property
    def inputs(self) -> int:
        return len(self.walls) + len(self.crashes)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _drive(target: Any, examples: int, on_case: Any, phases: list[Phase]) -> None:
    """Run ``on_case`` on ``examples`` generated inputs. One function for both passes, so one derandomized seed."""

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        phases=phases,
        report_multiple_bugs=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(target.strategy)
    def fuzz(case: Any) -> None:
        on_case(case)

    fuzz()


def _shrink(target: Any, examples: int) -> list[tuple[Any, str]]:
    """Replay the generation with a raising property and let hypothesis shrink each distinct crash."""

    def strict(case: Any) -> None:
        try:
            target.check(case)
        except Exception as error:
            error.fuzz_case = case  # the last replay of each bug is its minimal input
            raise

    try:
        _drive(target, examples, strict, [Phase.generate, Phase.shrink])
    except Exception as error:  # one error, or an ExceptionGroup of several
        errors = list(getattr(error, "exceptions", [error]))
        return [(getattr(e, "fuzz_case", None), "".join(traceback.format_exception(e))) for e in errors]
    return []


def run(target: Any, examples: int, margin_s: float) -> Report:
    report = Report(target.name, target.bound_s, margin_s)
    for case in target.hostile:
        report.record(target, case)
    _drive(target, examples, lambda case: report.record(target, case), [Phase.generate])
    if report.crashes:
        report.minimal = _shrink(target, examples)
    return report


def _short(case: Any, limit: int = 100) -> str:
    """``ascii(case)``, its middle cut when long (the end shows the rest of a tuple: gold, template...)."""
    text = ascii(case)
    if len(text) <= limit:
        return text
    return f"{text[: limit * 2 // 3]} ... {text[-limit // 3 :]} ({len(text)} chars)"


def markdown(reports: list[Report], args: argparse.Namespace, elapsed: float) -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    packages = ", ".join(f"{p} {version(p)}" for p in ("hypothesis", "sympy", "math-verify"))
    lines = [
        "# Fuzzing the math verifier and the 24 checker",
        "",
        f"Produced by `python benchmarks/fuzz_verifiers.py {' '.join(sys.argv[1:])}` in {elapsed:.0f} s "
        f"(Python {platform.python_version()}, {packages}; {os.cpu_count()} CPUs, load average {load}).",
        "Each target gets its known hostile inputs, then the generated ones (derandomized). A crash is an exception "
        "escaping the public call or a malformed verdict; *over bound* counts calls whose wall time exceeded the "
        f"bound + {args.margin:g} s; *CPU over bound* those whose CPU time in the calling thread exceeded the bound "
        "(for the math targets that is the parent's share: the worker's time is not in it).",
        "",
        "| target | inputs | crashes | over bound | CPU over bound | bound | wall p50 | wall p99 | wall max | CPU max "
        "| verdicts |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        kinds = ", ".join(f"{k} {n}" for k, n in r.outcomes.most_common())
        lines.append(
            f"| {r.name} | {r.inputs} | {len(r.crashes)} | {len(r.over)} | {len(r.cpu_over)} | {r.bound_s:g} s "
            f"| {_percentile(r.walls, 0.5) * 1e3:.2f} ms | {_percentile(r.walls, 0.99) * 1e3:.1f} ms "
            f"| {max(r.walls, default=0) * 1e3:.1f} ms | {max(r.cpus, default=0) * 1e3:.1f} ms | {kinds} |"
        )
    lines += ["", "## Slowest calls", ""]
    for r in reports:
        lines += [f"- {r.name}: " + "; ".join(f"{w * 1e3:.0f} ms `{_short(c, 80)}`" for w, c in r.slowest)]
    for r in reports:
        for title, items in (("Over the bound", r.over), ("CPU over the bound", r.cpu_over)):
            if items:
                lines += ["", f"## {title}: {r.name}", ""]
                lines += [
                    f"- {t * 1e3:.0f} ms: `{_short(c)}`" for t, c in sorted(items, key=lambda x: len(ascii(x[1])))[:5]
                ]
        if r.crashes:
            lines += ["", f"## Crashes: {r.name}", ""]
            shortest = min(r.crashes, key=lambda x: len(ascii(x[0])))
            lines += [
                f"Shortest crashing input seen: `{_short(shortest[0], 300)}`",
                "",
                "```",
                shortest[1].strip(),
                "```",
            ]
            for case, trace in r.minimal:
                lines += ["", f"Minimal input (hypothesis): `{_short(case, 300)}`", "", "```", trace.strip(), "```"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=10_000, help="generated inputs per target")
    parser.add_argument("--timeout", type=float, default=2.0, help="the math env's timeout_s (its default: 2 s)")
    parser.add_argument("--margin", type=float, default=2.0, help="wall seconds allowed past a bound")
    parser.add_argument("--targets", default="", help="comma-separated target names (default: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fuzz_verifiers.md")
    args = parser.parse_args()

    math_fuzz, game24_fuzz = (_load(m) for m in TEST_MODULES)
    targets = [*math_fuzz.math_targets(args.timeout), *game24_fuzz.TARGETS]
    wanted = [t for t in args.targets.split(",") if t]
    unknown = set(wanted) - {t.name for t in targets}
    if unknown:
        parser.error(f"unknown targets {sorted(unknown)}; choose from {[t.name for t in targets]}")
    start = time.perf_counter()
    reports = []
    for target in targets:
        if wanted and target.name not in wanted:
            continue
        t0 = time.perf_counter()
        reports.append(run(target, args.examples, args.margin))
        r = reports[-1]
        print(f"{target.name}: {r.inputs} inputs, {len(r.crashes)} crashes, {len(r.over)} over the bound "
              f"({len(r.cpu_over)} by CPU time), "
              f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)  # fmt: skip
    text = markdown(reports, args, time.perf_counter() - start)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
