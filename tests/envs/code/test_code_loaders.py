"""HumanEval, MBPP and JSONL loaders, the procedural family, and the reference sweeps (sampled; full = slow)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from lrmgym.core import task_rng
from lrmgym.envs.code.loaders import DataError, load_humaneval, load_jsonl, load_mbpp, mbpp_split, split_tests
from lrmgym.envs.code.procedural import TEMPLATES, make_procedural_task
from lrmgym.envs.code.sandbox import Job
from lrmgym.envs.code.sweep import sweep, variant_program


@pytest.fixture(scope="module")
def humaneval(shared_data):
    return load_humaneval(shared_data / "humaneval" / "HumanEval.jsonl.gz")


@pytest.fixture(scope="module")
def mbpp(shared_data):
    return load_mbpp(shared_data / "mbpp" / "mbpp.jsonl")


def test_split_tests_marks_assert_statements_as_tests():
    units = split_tests("import math\nx = 2\nassert x == 2\nfor i in range(3):\n    assert i < 3\n")
    assert [u["test"] for u in units] == [False, False, True, True]
    assert units[3]["src"] == "for i in range(3):\n    assert i < 3"


def test_humaneval_loader(humaneval):
    assert len(humaneval) == 164
    first = humaneval[0]
    assert first.id == "humaneval/0" and first.entry_point == "has_close_elements"
    assert sum(u["test"] for u in first.units) == 7
    assert first.bind == {"candidate": "has_close_elements"}
    assert "from typing import List" in first.prefix and "def has_close_elements" not in first.prefix
    # HumanEval/32's tests call the prompt's helper `poly`: it is in the trusted prelude.
    assert "def poly" in humaneval[32].prelude


def test_humaneval_program_continues_a_body_or_prefixes_a_full_function(humaneval):
    task = humaneval[0]
    assert task.program("    return False\n") == task.stub + "    return False\n"
    full = "def has_close_elements(numbers, threshold):\n    return False\n"
    assert task.program(full) == task.prefix + "\n\n" + full


def test_mbpp_loader_and_splits(mbpp):
    assert len(mbpp) == 974
    sizes = {s: len(mbpp_split(mbpp, s)) for s in ("prompt", "test", "validation", "train", "all")}
    assert sizes == {"prompt": 10, "test": 500, "validation": 90, "train": 374, "all": 974}
    node_task = next(t for t in mbpp if t.id == "mbpp/367")
    assert "Node(" in node_task.prelude  # setup uses the solution's class: it runs after the names are bound
    with pytest.raises(
        DataError,
        match="^" + re.escape("Unknown MBPP split 'dev'; expected one of all, prompt, test, validation, train.") + "$",
    ):
        mbpp_split(mbpp, "dev")


def test_missing_file_names_the_path_and_the_fix(tmp_path):
    path = tmp_path / "nope.jsonl"
    msg = (
        f"Task file not found: {path}. Set LRMGYM_SHARED_DATA to the folder holding the data sets, "
        "or pass source=<path to a .jsonl file>."
    )
    with pytest.raises(DataError, match=f"^{re.escape(msg)}$"):
        load_jsonl(path)


@pytest.mark.parametrize(
    ("row", "msg"),
    [
        ({"tests": "assert True"}, "missing field(s) prompt."),
        ({"prompt": "p"}, "give exactly one of 'tests' (assert code) or 'stdio' (stdin/stdout cases)."),
        ({"prompt": "p", "tests": "x = 1"}, "'tests' contains no assert statement, so nothing could fail."),
        ({"prompt": "p", "tests": 3}, "'tests' must be a string of assert code or a list of such strings."),
        (
            {"prompt": "p", "stdio": [{"stdin": 1}]},
            '\'stdio\' must be a non-empty list of {"stdin": str, "stdout": str} objects.',
        ),
        ({"prompt": "p", "tests": "assert ("}, "the test code does not parse ('(' was never closed, line 1)."),
    ],
)
def test_jsonl_errors_name_the_line(tmp_path, row, msg):
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n" + json.dumps(row) + "\n")
    with pytest.raises(DataError, match=f"^{re.escape(f'{path}:2: {msg}')}$"):
        load_jsonl(path)


def test_jsonl_tasks_run_in_the_sandbox(tmp_path, auto_pool):
    path = tmp_path / "tasks.jsonl"
    rows = [
        {
            "id": "sq",
            "prompt": "square",
            "entry_point": "sq",
            "tests": ["assert candidate(3) == 9", "assert sq(-2) == 4"],
        },
        {"prompt": "echo sum", "stdio": [{"stdin": "1 2\n", "stdout": "3\n"}, {"stdin": "5 6", "stdout": "11"}]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sq, echo = load_jsonl(path)
    assert (sq.id, echo.id, echo.mode) == ("sq", "tasks/1", "stdio")
    r1 = auto_pool.run(Job(code="def sq(x):\n    return x * x\n", units=sq.units, bind=sq.bind))
    r2 = auto_pool.run(Job(code="print(sum(map(int, input().split())))", cases=echo.cases, mode="stdio"))
    r3 = auto_pool.run(Job(code="print(0)", cases=echo.cases, mode="stdio"))
    assert (r1.passed, r1.total, r2.passed, r2.total, r3.passed) == (2, 2, 2, 2, 0)


def test_procedural_tasks_are_pure_and_varied():
    a = [make_procedural_task(i, task_rng(7, i)) for i in range(40)]
    b = [make_procedural_task(i, task_rng(7, i)) for i in range(40)]
    assert a == b
    assert len({t.entry_point for t in a}) == len(TEMPLATES)
    assert make_procedural_task(0, task_rng(8, 0)) != a[0]
    assert all(sum(u["test"] for u in t.units) == 5 for t in a)


def test_procedural_references_pass_and_broken_variants_fail(auto_pool):
    tasks = [make_procedural_task(i, np.random.default_rng(i)) for i in range(16)]
    assert sweep(auto_pool, tasks, "canonical").all_passed == 16
    assert sweep(auto_pool, tasks, "pass").all_passed == 0
    assert sweep(auto_pool, tasks, "wrong").all_passed == 0


def _sample(tasks, n=20):
    step = max(1, len(tasks) // n)
    return tasks[::step][:n]


@pytest.mark.parametrize("variant", ["canonical", "pass", "wrong"])
def test_humaneval_sample_sweep(humaneval, auto_pool, variant):
    """20 spread HumanEval tasks: references pass, `pass` and wrong-return variants fail (full sweep: slow)."""
    report = sweep(auto_pool, _sample(humaneval), variant)
    assert report.tasks == 20
    assert report.all_passed == (20 if variant == "canonical" else 0), report


@pytest.mark.parametrize("variant", ["canonical", "pass", "wrong"])
def test_mbpp_sample_sweep(mbpp, auto_pool, variant):
    report = sweep(auto_pool, _sample(mbpp), variant)
    assert report.tasks == 20
    assert report.all_passed == (20 if variant == "canonical" else 0), report


def test_variant_programs_of_a_humaneval_task(humaneval):
    task = humaneval[2]
    assert variant_program(task, "pass") == task.stub + "    pass\n"
    assert "_lrm_perturb(_lrm_original(*args, **kwargs))" in variant_program(task, "wrong")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["humaneval", "mbpp"])
def test_full_reference_sweeps(name, shared_data):
    """All 164 HumanEval and 974 MBPP references pass; every `pass` and wrong-return variant fails."""
    from lrmgym.envs.code.sandbox import Limits, SandboxPool

    tasks = (
        load_humaneval(shared_data / "humaneval" / "HumanEval.jsonl.gz")
        if name == "humaneval"
        else load_mbpp(shared_data / "mbpp" / "mbpp.jsonl")
    )
    with SandboxPool("auto", limits=Limits(timeout_s=30)) as pool:
        reports = {v: sweep(pool, tasks, v) for v in ("canonical", "pass", "wrong")}
    assert reports["canonical"].all_passed == len(tasks), reports["canonical"].failing_ids
    assert reports["pass"].all_passed == 0, reports["pass"].passing_ids
    assert reports["wrong"].all_passed == 0, reports["wrong"].passing_ids
