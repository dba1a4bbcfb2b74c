"""HumanEval, MBPP and JSONL loaders, the procedural family, and the reference sweeps (sampled; full = slow)."""

from __future__ import annotations

import ast
import gzip
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


@pytest.mark.parametrize(
    "src",
    [
        'assert True, "This prints if this assert fails 1 (good for debugging!)"',
        "assert 1",
        'assert "x"',
        "assert ...",
        "assert -1",
        "assert 1 == 1",
        "assert 'a' < 'b' <= 'b'",
        "assert not 0",
        "assert not None",
        "assert not []",
        "assert (candidate(1) == 2, 'the parenthesized-assert bug')",
        "assert [x]",
        "assert {'k': candidate(1)}",
        "assert (candidate(1) or True)",
        "assert False or candidate(1) or 'x'",
        "assert True and 1",
        "assert 1 if candidate(1) else 2",
        "for i in range(3):\n    assert True",
        "if candidate(1):\n    assert True\nelse:\n    assert 1",
    ],
)
def test_split_tests_tautologies_are_setup(src):
    """An assert that cannot fail tests nothing: the unit is setup (a do-nothing solution does not earn it)."""
    assert split_tests(src) == [{"src": src, "test": False}]


@pytest.mark.parametrize(
    "src",
    [
        "assert x",
        "assert candidate(1)",
        "assert not candidate(1)",
        "assert candidate(1) or x",
        "assert candidate(1) and True",
        "assert False",
        "assert 0",
        "assert ()",
        "assert 1 == 2",
        "assert 1 < 'a'",
        "assert 1 is 1",
        "assert [*x]",
        "assert {**x}",
        "assert -x",
        "assert True\nassert candidate(1) == 2",
        "for i in range(3):\n    assert True\n    assert candidate(i)",
    ],
)
def test_split_tests_keeps_asserts_that_can_fail(src):
    units = split_tests(src)
    assert any(u["test"] for u in units), units


def _raw_check_units(humaneval_path):
    """Every top-level statement of each HumanEval check(), straight from the file (independent of the loader)."""
    out = {}
    with gzip.open(humaneval_path, "rt") as f:
        for line in f:
            row = json.loads(line)
            check = next(n for n in ast.parse(row["test"]).body if isinstance(n, ast.FunctionDef) and n.name == "check")
            out["humaneval/" + row["task_id"].split("/")[1]] = check.body
    return out


def _constant_true(stmt) -> bool:
    asserts = [n for n in ast.walk(stmt) if isinstance(n, ast.Assert)]
    return bool(asserts) and all(isinstance(a.test, ast.Constant) and a.test.value for a in asserts)


def test_humaneval_constant_true_asserts_are_not_tests(humaneval, shared_data):
    """48 `assert True, "..."` statements in 36 tasks (16 % of those tasks' asserts) are setup, not tests."""
    raw = _raw_check_units(shared_data / "humaneval" / "HumanEval.jsonl.gz")
    constant = {tid: sum(_constant_true(s) for s in body) for tid, body in raw.items()}
    affected = {tid for tid, n in constant.items() if n}
    assert (sum(constant.values()), len(affected)) == (48, 36)
    by_id = {t.id: t for t in humaneval}
    for tid in affected:
        tests = [u for u in by_id[tid].units if u["test"]]
        assert all("assert True" not in u["src"] for u in tests), tid
        asserts = sum(1 for s in raw[tid] if any(isinstance(n, ast.Assert) for n in ast.walk(s)))
        assert len(tests) == asserts - constant[tid], tid
    assert sum(u["test"] for t in humaneval for u in t.units) == 1181 - 48
    assert min(sum(u["test"] for u in t.units) for t in humaneval) >= 1  # no task is left without a test


def test_mbpp_tasks_keep_their_three_tests(mbpp):
    assert all(sum(u["test"] for u in t.units) == 3 for t in mbpp)


def _do_nothing_share(task) -> tuple[int, int]:
    """(passed, total) of the task's real asserts for a do-nothing candidate, run here in plain Python.

    The HumanEval tests are trusted data and `None` is what the candidate returns, so this is an oracle
    independent of the sandbox and of the loader's classification.
    """
    ns: dict = {}
    exec(task.prelude, ns)  # noqa: S102 - the data set's own helpers
    ns[task.entry_point] = ns["candidate"] = lambda *a, **k: None
    passed = total = 0
    for unit in task.units:
        code = compile(unit["src"], "tests.py", "exec")
        tree = ast.parse(unit["src"])
        if not any(isinstance(n, ast.Assert) for n in ast.walk(tree)) or _constant_true(tree.body[0]):
            exec(code, ns)  # noqa: S102 - setup, or an assert that cannot fail
            continue
        total += 1
        try:
            exec(code, ns)  # noqa: S102
            passed += 1
        except Exception:  # noqa: BLE001 - a failing test
            pass
    return passed, total


def test_do_nothing_earns_nothing_from_constant_true_asserts(humaneval, shared_data, auto_pool):
    """On the 36 tasks with `assert True` units, `def f(*a, **k): pass` scores at most the share of the real
    asserts that `None` passes (0 on 32 of them; before the fix it earned 1-4 points on every one)."""
    from lrmgym.envs.code.env import job_for

    raw = _raw_check_units(shared_data / "humaneval" / "HumanEval.jsonl.gz")
    tasks = [t for t in humaneval if any(_constant_true(s) for s in raw[t.id])]
    assert len(tasks) == 36
    results = auto_pool.run_many([job_for(t, f"def {t.entry_point}(*a, **k):\n    pass\n") for t in tasks])
    scores = {}
    for task, result in zip(tasks, results, strict=True):
        passed, total = _do_nothing_share(task)
        assert result.status == "ok" and result.fraction <= passed / total, (task.id, result, passed, total)
        assert result.total == total, (task.id, result)
        scores[task.id] = result.fraction
    assert sum(s == 0 for s in scores.values()) == 32, scores


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
        ({"tests": "assert True"}, "missing field(s) prompt; it has tests."),
        ({"prompt": "p"}, "give exactly one of 'tests' (assert code) or 'stdio' (stdin/stdout cases)."),
        ({"prompt": "p", "tests": "x = 1"}, "'tests' contains no assert statement, so nothing could fail."),
        ({"prompt": "p", "tests": ["x = 1", "y = 2"]}, "'tests' contains no assert statement, so nothing could fail."),
        (
            {"prompt": "p", "tests": "x = 1\nassert True, 'always'\nassert (f(x), 'msg')"},
            "'tests' contains only asserts that cannot fail (such as `assert True`), so nothing could fail; "
            "give at least one assert that checks the solution.",
        ),
        (
            {"prompt": "p", "tests": ["assert True", "assert 1 == 1"]},
            "'tests' contains only asserts that cannot fail (such as `assert True`), so nothing could fail; "
            "give at least one assert that checks the solution.",
        ),
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


def test_jsonl_list_items_without_a_real_assert_are_setup(tmp_path, auto_pool):
    """A list item of `tests` is a test only when it has an assert that can fail: `assert True` pays nothing."""
    path = tmp_path / "tasks.jsonl"
    row = {"prompt": "p", "entry_point": "f", "tests": ["k = 3", "assert True, 'free'", "assert f(k) == 9"]}
    path.write_text(json.dumps(row) + "\n")
    (task,) = load_jsonl(path)
    assert [u["test"] for u in task.units] == [False, False, True]
    nothing = auto_pool.run(Job(code="def f(*a):\n    pass\n", units=task.units, bind=task.bind))
    right = auto_pool.run(Job(code="def f(x):\n    return x * x\n", units=task.units, bind=task.bind))
    assert (nothing.passed, nothing.total, right.passed, right.total) == (0, 1, 1, 1)


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
