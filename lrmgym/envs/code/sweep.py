"""Reference sweeps: run every task's reference solution, and two broken variants, through the sandbox.

A grader is only trustworthy if the reference solutions pass *and* broken solutions fail. For each task
with a reference solution this module builds three programs:

- ``canonical``: the reference solution as the data set gives it;
- ``pass``: the tested function's body replaced by ``pass`` (it returns ``None``);
- ``wrong``: the tested function wrapped so that it returns a perturbed value (``+1`` for numbers, ``not``
  for booleans, an extra element for strings and containers, ``0`` for ``None``).

Used by the slow tests and ``benchmarks/sandbox.py``.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from lrmgym.envs.code.loaders import CodeTask, parse_quietly
from lrmgym.envs.code.sandbox import ExecResult, Job, SandboxPool

__all__ = ["VARIANTS", "SweepReport", "sweep", "tested_function", "variant_program"]

VARIANTS = ("canonical", "pass", "wrong")

_PERTURB = """
def _lrm_perturb(v):
    if isinstance(v, bool):
        return not v
    if isinstance(v, (int, float, complex)):
        return v + 1
    if isinstance(v, (str, bytes)):
        return v + v[:0].__class__("x" if isinstance(v, str) else b"x")
    if isinstance(v, (list, tuple)):
        return type(v)(list(v) + [None]) if type(v) in (list, tuple) else list(v) + [None]
    if isinstance(v, (set, frozenset)):
        return set(v) | {"\\x00lrm"}
    if isinstance(v, dict):
        return {**v, "\\x00lrm": None}
    if v is None:
        return 0
    return None
"""


def tested_function(task: CodeTask) -> str | None:
    """The name of the function the tests call: the entry point, else the first solution-defined call in the tests."""
    if task.entry_point:
        return task.entry_point
    if not task.solution:
        return None
    tree = parse_quietly(task.solution)
    if tree is None:
        return None
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    for unit in task.units:
        for node in ast.walk(ast.parse(unit["src"])):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in defined:
                return node.func.id
    return None


def variant_program(task: CodeTask, variant: str) -> str | None:
    """The full program of ``variant`` for ``task``; ``None`` when the task has no usable reference."""
    if not task.solution:
        return None
    if task.stub and task.solution.startswith(task.stub):
        # HumanEval: the reference is the prompt continued by a body.
        if variant == "canonical":
            return task.solution
        if variant == "pass":
            return task.stub + "    pass\n"
    program = task.program(task.solution) if not task.stub else task.solution
    if variant == "canonical":
        return program
    name = tested_function(task)
    if name is None:
        return None
    if variant == "pass":
        return f"{program}\n\ndef {name}(*args, **kwargs):\n    pass\n"
    if variant == "wrong":
        return (
            f"{program}\n{_PERTURB}\n_lrm_original = {name}\n\n"
            f"def {name}(*args, **kwargs):\n    return _lrm_perturb(_lrm_original(*args, **kwargs))\n"
        )
    raise ValueError(f"Unknown variant {variant!r}; expected one of {', '.join(VARIANTS)}.")


@dataclass
class SweepReport:
    """Outcome of one variant over a task list.

    Attributes:
        variant: ``canonical``, ``pass`` or ``wrong``.
        tasks: How many tasks had a program for this variant.
        all_passed: How many passed every test.
        statuses: Count of each execution status.
        passing_ids: The ids that passed every test (for ``pass``/``wrong`` these are the grader's misses).
        failing_ids: The ids that did not.
        wall_s: Wall-clock seconds of the sweep.
    """

    variant: str
    tasks: int = 0
    all_passed: int = 0
    statuses: Counter = field(default_factory=Counter)
    passing_ids: list[str] = field(default_factory=list)
    failing_ids: list[str] = field(default_factory=list)
    wall_s: float = 0.0


def sweep(pool: SandboxPool, tasks: Sequence[CodeTask], variant: str) -> SweepReport:
    """Run ``variant`` of every task through ``pool`` concurrently and count the outcomes."""
    import time

    report = SweepReport(variant)
    pairs: list[tuple[CodeTask, Job]] = []
    for task in tasks:
        program = variant_program(task, variant)
        if program is not None:
            pairs.append((task, Job(code=program, units=task.units, prelude=task.prelude, bind=dict(task.bind))))
    start = time.monotonic()
    results: list[ExecResult] = pool.run_many([job for _, job in pairs])
    report.wall_s = time.monotonic() - start
    for (task, _), result in zip(pairs, results, strict=True):
        report.tasks += 1
        report.statuses[result.status] += 1
        if result.all_passed:
            report.all_passed += 1
            report.passing_ids.append(task.id)
        else:
            report.failing_ids.append(task.id)
    return report
