"""Multi-turn feedback of the code env: what each ``feedback`` mode reveals, and that the default reveals no
expected value (so that a second turn cannot be a lookup table of the tests' answers)."""

from __future__ import annotations

import ast
import json
import re
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from lrmgym.core import Completion
from lrmgym.envs.code import sweep
from lrmgym.envs.code.env import INSTRUCTIONS, CodeEnv, job_for
from lrmgym.envs.code.loaders import failure_kind, load_humaneval, load_jsonl, load_mbpp, unit_inputs
from lrmgym.envs.code.sandbox import Limits, SandboxPool

MODES = ("errors_only", "names", "full")


def fenced(code: str) -> str:
    return f"```python\n{code}\n```\n"


# --------------------------------------------------------------------------------------------------- pure parts
@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("AssertionError: ", "wrong answer"),
        ("AssertionError: expected 42, got 41", "wrong answer"),
        ("AssertionError", "wrong answer"),
        ("ValueError: 42 is not allowed", "error: ValueError"),
        ("CandidateError: StopIteration: 7", "error: StopIteration (raised by your code)"),
        ("CandidateError: no such type!: 7", "error: an exception (raised by your code)"),
        ("setup failed: TypeError: Node() takes no arguments", "not run: the test setup failed (error: TypeError)"),
        ("not run (timeout)", "not run (timeout)"),
        ("wrong output", "wrong output"),
        ("", "failed"),
        ("f(1) == 2", "failed"),
        ("[1, 2]: AssertionError", "failed"),
    ],
)
def test_failure_kind_keeps_only_the_kind(message, kind):
    assert failure_kind(message) == kind


HE0 = {"candidate": "has_close_elements"}


@pytest.mark.parametrize(
    ("src", "bind", "trusted", "checked", "called"),
    [
        (
            "assert candidate([1.0, 2.0], 0.3) == True",
            HE0,
            (),
            ["has_close_elements([1.0, 2.0], 0.3)"],
            ["has_close_elements"],
        ),
        ('assert f("abc") == 3, "expected 3"', {}, (), ["f('abc')"], ["f"]),  # the message is never shown
        ("assert 3 == f(2)", {}, (), ["f(2)"], ["f"]),
        ("assert set(f((1, 2))) == set((4, 5))", {}, (), ["set(f((1, 2)))"], ["f"]),
        ("assert sorted(len(f(1))) == [9]", {}, (), ["sorted(len(f(1)))"], ["f"]),
        ("assert f(1) == g(2)", {}, (), [], ["f", "g"]),  # which side is expected? neither is shown
        ("assert abs(f(1) - 2.5) < 1e-6", {}, (), [], ["f"]),
        ("assert not f('<>')", {}, (), [], ["f"]),
        ("assert f('<>')", {}, (), [], ["f"]),
        ("assert math.isclose(f(1), 2.5)", {}, {"math"}, [], ["math.isclose", "f"]),
        ("assert math.isclose(f(1), 2.5) == True", {}, {"math"}, [], ["math.isclose", "f"]),
        ("assert round(f(1), 2) == 0.5", {}, (), [], ["f"]),  # a wrapper with a second argument: names only
        ("assert f(1)[0] == 7", {}, (), [], ["f"]),
        ("assert check(f(1), 2.5) == True", {}, {"check"}, [], ["check", "f"]),  # a setup helper is not the solution
        ("assert poly(xs, 3) == candidate(xs)", {"candidate": "fz"}, {"poly"}, ["fz(xs)"], ["poly", "fz"]),
        ("h = lambda v: v\nassert h(1) == 2", {}, (), [], ["h"]),
        (
            "for x in range(2, 8):\n    assert candidate(x, x + 1) == str(x)",
            {"candidate": "change_base"},
            (),
            ["change_base(x, x + 1)"],
            ["change_base"],
        ),
    ],
)
def test_unit_inputs_shows_the_tested_call_never_the_expected_side(src, bind, trusted, checked, called):
    assert unit_inputs(src, bind, trusted) == (checked, called)


def test_default_is_errors_only_and_the_docstring_says_what_each_mode_leaks():
    field = CodeEnv.Config.model_fields["feedback"]
    assert CodeEnv.Config().feedback == "errors_only"
    doc = field.description
    for words in ("'errors_only'", "'names'", "'full'", "LEAKS the expected values", "never a test's source"):
        assert words in doc, words


def test_envs_show_lists_the_feedback_option():
    from lrmgym.cli.main import cli

    out = CliRunner().invoke(cli, ["envs", "show", "Code-v0"])
    assert out.exit_code == 0, out.output
    assert "  feedback = 'errors_only'\n      Multi-turn: what the feedback on failing code reveals." in out.output


# --------------------------------------------------------------------------------------------------- sandboxed
@pytest.fixture(scope="module")
def envs():
    """One env per mode, used only for `_verdict` and `feedback`: their pools never start (grading uses auto_pool)."""
    made = {mode: CodeEnv(feedback=mode, feedback_chars=100_000, timeout_s=20.0) for mode in MODES}
    yield made
    for e in made.values():
        e.close()


def _feedbacks(envs, code_task, code, result):
    """The feedback of every mode on one graded run."""
    out = {}
    for mode, env in envs.items():
        task = env.task_from(code_task)
        verdict = env._verdict(task, code, result)
        out[mode] = env.feedback(task, Completion(fenced(code)), verdict, 1)
    return out


def test_modes_on_a_raising_and_printing_solution(envs, auto_pool):
    code_task = _jsonl_task(
        {
            "prompt": "p",
            "entry_point": "f",
            "tests": ["assert f(12345) == 67890, 'want 67890'", "assert f(2) == 4"],
        }
    )
    code = "def f(x):\n    print('debug', x)\n    if x == 2:\n        return 5\n    raise LookupError('secret-99')\n"
    result = auto_pool.run(job_for(code_task, code))
    fb = _feedbacks(envs, code_task, code, result)
    assert fb["errors_only"].splitlines()[:4] == [
        "Your code did not pass all tests: 0/2 tests passed.",
        "2 of 2 tests failed:",
        "Test 1: error: LookupError",
        "Test 2: wrong answer",
    ]
    # The program's own printed output echoes its inputs in the tests' order: shown only in full.
    assert "debug" not in fb["errors_only"] and "debug" not in fb["names"]
    assert "Program output:\ndebug 12345\ndebug 2" in fb["full"]
    assert fb["names"].splitlines()[2:4] == [
        "Test 1: error: LookupError; tested call: f(12345)",
        "Test 2: wrong answer; tested call: f(2)",
    ]
    for mode in ("errors_only", "names"):
        assert "secret-99" not in fb[mode] and "67890" not in fb[mode] and "== 4" not in fb[mode]
    assert "Failed: assert f(12345) == 67890, 'want 67890'\n  -> LookupError: secret-99" in fb["full"]


def test_timeouts_are_reported_as_not_run(auto_pool, envs):
    code_task = _jsonl_task({"prompt": "p", "entry_point": "f", "tests": ["assert f(1) == 1", "assert f(2) == 2"]})
    code = "def f(x):\n    if x == 2:\n        while True:\n            pass\n    return 1\n"
    with SandboxPool("auto", workers=1, limits=Limits(timeout_s=1.0)) as pool:
        result = pool.run(job_for(code_task, code))
    assert result.status == "timeout"
    lines = _feedbacks(envs, code_task, code, result)["errors_only"].splitlines()
    assert lines[1:3] == ["1 of 2 tests failed:", "Test 2: not run (timeout)"]


def test_stdio_feedback_never_shows_the_expected_stdout(envs, auto_pool):
    code_task = _jsonl_task({"prompt": "add", "stdio": [{"stdin": "12340 5\n", "stdout": "12345\n"}]})
    code = "print(0)"
    result = auto_pool.run(job_for(code_task, code))
    fb = _feedbacks(envs, code_task, code, result)
    assert "Test 1: wrong output\n" in fb["errors_only"] and "12340" not in fb["errors_only"]
    assert "Test 1: wrong output; stdin: '12340 5\\n'" in fb["names"]  # the input, decided to be shown
    assert "stdin: '12340 5\\n'" in fb["full"]
    assert all("12345" not in text for text in fb.values())


@pytest.mark.parametrize("mode", MODES)
def test_feedback_keeps_its_char_cap(mode, auto_pool):
    env = CodeEnv(feedback=mode, feedback_chars=100)
    try:
        code_task = _jsonl_task(
            {"prompt": "p", "entry_point": "f", "tests": [f"assert f({i}) == {i * 7}" for i in range(40)]}
        )
        code = "def f(x):\n    return None\n"
        task = env.task_from(code_task)
        verdict = env._verdict(task, code, auto_pool.run(job_for(code_task, code)))
        text = env.feedback(task, Completion(fenced(code)), verdict, 1)
        assert len(text) <= 100 and text.endswith("\n...(truncated)")
    finally:
        env.close()


def _jsonl_task(row):
    """The task ``load_jsonl`` makes of one JSONL row."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "tasks.jsonl"
        path.write_text(json.dumps(row) + "\n")
        (task,) = load_jsonl(path)
    return task


# --------------------------------------------------------------------------------------------------- real data
@pytest.fixture(scope="module")
def real_tasks(shared_data):
    humaneval = load_humaneval(shared_data / "humaneval" / "HumanEval.jsonl.gz")
    mbpp = load_mbpp(shared_data / "mbpp" / "mbpp.jsonl")
    return humaneval + mbpp[::2]  # every HumanEval task and half of MBPP (487), spread over its splits


def _expected_values(src: str) -> list[str]:
    """The source text of the literal expected side of each ``==`` of a unit (the right side, else the left)."""
    out = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1:
            if not isinstance(node.test.ops[0], ast.Eq):
                continue
            for side in (node.test.comparators[0], node.test.left):
                try:
                    ast.literal_eval(side)
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    continue
                out.append(ast.get_source_segment(src, side) or ast.unparse(side))
                break
    return out


class _Blank(ast.NodeTransformer):
    """Replaces the literal expected side of each ``==`` by ``_``: what is left are inputs and test code."""

    def visit_Compare(self, node):
        if len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq):
            for attr in ("comparators", "left"):
                side = node.comparators[0] if attr == "comparators" else node.left
                try:
                    ast.literal_eval(side)
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    continue
                if attr == "comparators":
                    node.comparators = [ast.Name("_")]
                else:
                    node.left = ast.Name("_")
                break
        return node


def _not_expected_text(code_task) -> str:
    """Text that feedback may contain without leaking: the task's tests with expected sides blanked, and the
    env's fixed wording."""
    blanked = [ast.unparse(_Blank().visit(ast.parse(u["src"]))) for u in code_task.units]
    return "\n".join([*blanked, *INSTRUCTIONS.values(), "Your code did not pass all tests", "tests passed"])


def test_no_expected_value_in_feedback_unless_full(real_tasks, auto_pool, envs):
    """A wrong solution on HumanEval and MBPP: no failing test's expected value (the literal of its `==`) is in
    the errors_only or names feedback; the full feedback shows them (that is what it is for)."""
    programs = [(t, sweep.variant_program(t, "wrong")) for t in real_tasks]
    programs = [(t, p) for t, p in programs if p is not None]
    results = auto_pool.run_many([job_for(t, p) for t, p in programs])
    checked = {mode: 0 for mode in MODES}
    shown = 0
    for (code_task, code), result in zip(programs, results, strict=True):
        feedback = _feedbacks(envs, code_task, code, result)
        allowed = _not_expected_text(code_task)
        tests = [u for u in code_task.units if u["test"]]
        for unit, (ok, _) in zip(tests, result.results, strict=False):
            if ok:
                continue
            for value in _expected_values(unit["src"]):
                if len(value) < 3 or value in allowed:  # too short to tell ("1" is in "Test 1"), or also an input
                    continue
                for mode in MODES:
                    text = (
                        feedback[mode].replace(result.output.strip(), "") if result.output.strip() else feedback[mode]
                    )
                    checked[mode] += 1
                    if mode == "full":
                        shown += value in text
                    else:
                        assert value not in text, (mode, code_task.id, value, text)
    assert checked["errors_only"] > 1000, checked
    assert shown >= 0.95 * checked["full"], (shown, checked)


# --------------------------------------------------------------------------------------------------- the attack
_EQ = re.compile(r"(\w+)\((.*)\)\s*==\s*(.+?)\s*(?:,\s*['\"].*)?$")


def _lookup_table(feedback: str) -> dict[str, dict[str, object]]:
    """Every ``name(args) == value`` the feedback spells out, as ``{name: {repr(args): value}}``."""
    table: dict[str, dict[str, object]] = {}
    for line in feedback.splitlines():
        m = _EQ.search(line)
        if not m:
            continue
        name, args, value = m.groups()
        try:
            key = repr(ast.literal_eval(f"({args},)"))
            table.setdefault(name, {})[key] = ast.literal_eval(value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
    return table


def _lookup_program(name: str, table: dict[str, dict[str, object]]) -> str:
    """A second turn that answers from the table (`candidate` is the entry point) and returns None otherwise."""
    answers = {**table.get("candidate", {}), **table.get(name, {})}
    return f"_T = {answers!r}\n\ndef {name}(*args, **kwargs):\n    return _T.get(repr(args))\n"


def test_lookup_table_attack_earns_nothing_extra_by_default(real_tasks, auto_pool, envs):
    """Turn 1 returns None; turn 2 answers from the `f(x) == y` pairs it can parse out of the feedback. With the
    full feedback that earns most of the tests; with errors_only (the default) and names nothing is parsed and
    turn 2 scores what turn 1 did."""
    first = []
    for code_task in real_tasks[::2]:  # 82 HumanEval and 244 MBPP tasks
        name = sweep.tested_function(code_task)
        if name is not None:
            first.append((code_task, name, f"def {name}(*args, **kwargs):\n    return None\n"))
    results = auto_pool.run_many([job_for(t, code) for t, _, code in first])
    turn1 = sum(r.fraction for r in results) / len(results)
    second: dict[str, list] = {"errors_only": [], "full": []}
    for (code_task, name, code), result in zip(first, results, strict=True):
        for mode, text in _feedbacks(envs, code_task, code, result).items():
            table = _lookup_table(text)
            if mode != "full":
                assert table == {}, (mode, code_task.id, table)
            if mode != "names":  # names parses to the same empty table as errors_only: no need to run it twice
                second[mode].append(job_for(code_task, _lookup_program(name, table)))
    turn2 = {mode: [r.fraction for r in auto_pool.run_many(jobs)] for mode, jobs in second.items()}
    mean = {mode: sum(scores) / len(scores) for mode, scores in turn2.items()}
    assert mean["full"] > turn1 + 0.5, (turn1, mean)
    assert turn2["errors_only"] == [r.fraction for r in results]  # no task gains anything
