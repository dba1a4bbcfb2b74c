"""Reward integrity of the code env: a candidate that solves nothing must not be paid (issue 15, classes 1-6).

Each test here failed on the harness before the fix (the forged record scored 1 000 000 of 2 tests; a
shadowed ``abs`` passed HumanEval/2 with a wrong constant; a ``StopIteration`` passed ``all(map(...))``; a
stdio candidate printed the expected output it found in its own memory).
"""

from __future__ import annotations

import marshal
import time
import tracemalloc

import pytest

from lrmgym.envs.code.sandbox import Job, _decode_report, entry_points

SQUARE_UNITS = (
    {"src": "assert candidate(2) == 4", "test": True},
    {"src": "assert candidate(3) == 9", "test": True},
)

# Candidate code that makes whoever imports the module ``unittest.__main__`` run test discovery in the work
# dir, where it planted a module whose ``load_tests`` writes a forged record (in the harness's old marshal
# format and in the new one) to every descriptor, then exits.
TAKEOVER = r"""
import os, marshal, types
forged = marshal.dumps({"status": "ok", "passed": 1000000, "total": 2, "results": [(True, "")] * 2,
                        "error": "", "output": "", "output_bytes": 0})
RECORD = b"LRMGYM-RESULT\n" + len(forged).to_bytes(8, "big") + forged
src = "import os\nRECORD = %r\ndef load_tests(*a, **k):\n" % (RECORD,)
src += "    for fd in range(3, 64):\n        try:\n            os.write(fd, RECORD)\n"
src += "        except OSError:\n            pass\n    os._exit(0)\n"
def plant():
    for folder in (os.getcwd(), "/tmp", "/tmp/work"):
        try:
            with open(os.path.join(folder, "test_pwn.py"), "w") as f:
                f.write(src)
        except OSError:
            pass
plant()
"""


def run(pool, code: str, units=SQUARE_UNITS, **kw):
    return pool.run(Job(code=code, units=units, bind={"candidate": "square"}, **kw))


# ------------------------------------------------------------------------------ 1. no candidate code in H
@pytest.mark.parametrize(
    "tail",
    [
        'main = types.ModuleType("unittest.__main__")\ndef square(x):\n    return 0\n',
        'def square(x):\n    return types.ModuleType("unittest.__main__")\n',
        'def square(x):\n    return {"m": [types.ModuleType("unittest.__main__")]}\n',
    ],
    ids=["global", "returned", "nested"],
)
def test_a_module_the_candidate_names_is_never_imported_by_the_harness(auto_pool, tail):
    result = run(auto_pool, TAKEOVER + tail)
    assert (result.passed, result.total) == (0, 2)
    assert result.status in {"ok", "error", "protocol"}


def test_a_returned_module_reaches_the_tests_as_an_opaque_handle(auto_pool):
    result = run(
        auto_pool,
        "import math\ndef square(x):\n    return math\n",
        units=({"src": "r = candidate(1)\nassert r is not None and not isinstance(r, type(abs))", "test": True},),
    )
    assert (result.status, result.passed) == ("ok", 1)  # a handle: usable as an object, never imported in H


def test_lazy_harness_imports_come_from_folders_the_candidate_cannot_write(auto_pool):
    plant = (
        "import os\nfor d in (os.getcwd(), '/tmp', '/tmp/work'):\n    try:\n"
        "        open(os.path.join(d, 'fractions.py'), 'w').write('import os\\nos._exit(0)\\n')\n"
        "    except OSError:\n        pass\n"
        "from fractions import Fraction\ndef square(x):\n    return Fraction(x * x)\n"
    )
    result = run(auto_pool, plant)
    assert (result.status, result.passed, result.total) == ("ok", 2, 2)  # decoded by the real fractions


# ------------------------------------------------------------------------------ 2. the parent believes nothing
def _record(status="ok", results=((True, ""),), outputs=(), error="", output="", extra=b""):
    def s(t):
        b = t.encode()
        return len(b).to_bytes(4, "big") + b

    body = b"R1" + s(status) + s(error) + s(output) + (0).to_bytes(8, "big")
    body += len(results).to_bytes(4, "big") + b"".join((b"\x01" if ok else b"\x00") + s(m) for ok, m in results)
    body += len(outputs).to_bytes(4, "big") + b"".join(s(o) for o in outputs) + extra
    return len(body).to_bytes(8, "big") + body


CALL_JOB = Job(code="", units=SQUARE_UNITS)


def test_a_well_formed_record_decodes():
    assert _decode_report(_record(results=((True, ""), (False, "AssertionError: "))), CALL_JOB) == (
        "ok",
        "",
        "",
        [(True, ""), (False, "AssertionError: ")],
        [],
    )


@pytest.mark.parametrize(
    "data",
    [
        _record(results=((True, ""),) * 3),  # more results than the job's tests
        _record(results=((True, ""),)),  # fewer
        _record(status="infra", results=((False, ""),) * 2),  # a status only the parent may decide
        _record(status="killed", results=((False, ""),) * 2),
        _record(status="passed", results=((True, ""),) * 2),  # unknown status
        _record(results=((True, ""),) * 2, extra=b"x"),  # trailing bytes
        _record(results=((True, ""),) * 2)[:-1],  # truncated
        _record(results=((True, ""),) * 2, outputs=("x",)),  # stdio outputs in a call job
        _record(results=((True, ""),) * 2).replace(b"\x01", b"\x02", 1),  # a flag that is not 0/1
        marshal.dumps({"status": "ok", "passed": 1000000, "total": 2}),  # the old format
    ],
    ids=["extra", "missing", "infra", "killed", "unknown", "trailing", "truncated", "outputs", "flag", "marshal"],
)
def test_a_malformed_or_lying_record_is_refused(data):
    assert _decode_report(data, CALL_JOB) is None


def test_the_parent_scores_a_forged_record_zero_never_ungradeable(auto_pool):
    from lrmgym.envs.code.sandbox import _RESULT, _START

    for data in (_record(status="infra", results=((False, ""),) * 2), b"\x00" * 8):
        result = auto_pool._parse(CALL_JOB, _START + _RESULT + data, b"", False, 0.1)
        assert (result.status, result.passed, result.total) == ("protocol", 0, 2)
    good = auto_pool._parse(CALL_JOB, _START + _RESULT + _record(results=((True, ""), (True, ""))), b"", False, 0.1)
    assert (good.status, good.passed, good.total, good.fraction) == ("ok", 2, 2, 1.0)


# ------------------------------------------------------------------------------ 3. bounded decoding
def test_decoding_allocates_no_more_than_the_message_claims_it_holds():
    # Counts and lengths near 2**32 on a 40-byte message: refused before anything is built.
    lying = [
        b"R1" + (2**32 - 1).to_bytes(4, "big"),
        b"R1" + (0).to_bytes(4, "big") * 3 + (0).to_bytes(8, "big") + (2**32 - 1).to_bytes(4, "big"),
    ]
    for body in lying:
        data = len(body).to_bytes(8, "big") + body
        tracemalloc.start()
        start = time.perf_counter()
        assert _decode_report(data, CALL_JOB) is None
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert time.perf_counter() - start < 0.05
        assert peak < 64 * 1024
    # A large but honest record costs about its own size.
    big = _record(results=((False, "x" * 100_000), (False, "y" * 100_000)), output="z" * 1_000_000)
    tracemalloc.start()
    assert _decode_report(big, CALL_JOB) is not None
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 4 * len(big)


def test_marshal_bombs_from_the_candidate_cost_only_its_own_run(auto_pool):
    # The candidate writes a reply frame declaring a list of 2**31 items on its RPC channel (fd 4 or so).
    code = (
        "import os\nbomb = b'[' + (2**31 - 1).to_bytes(4, 'little')\n"
        "def square(x):\n"
        "    for fd in range(3, 16):\n"
        "        try:\n            os.write(fd, len(bomb).to_bytes(8, 'big') + bomb)\n"
        "        except OSError:\n            pass\n"
        "    return 0\n"
    )
    result = run(auto_pool, code)
    assert result.passed == 0 and result.status != "infra"


# ------------------------------------------------------------------------------ 4. builtins stay builtins
def test_entry_points_are_the_free_non_builtin_names_and_the_alias_targets():
    units = ["assert abs(candidate(1)) == 1", "xs = [f(i) for i in range(3)]\nassert sorted(xs) == xs", "import math"]
    prelude = "def helper(a):\n    return a\n"
    assert entry_points(units, prelude, {"candidate": "truncate"}) == ("truncate", "f")
    assert entry_points(["assert sum(1, 2) == 3"], "", {"sum": "sum"}) == ("sum",)  # MBPP 126 defines sum()


@pytest.mark.parametrize(
    ("shadow", "test"),
    [
        ("abs = lambda x: 0", "assert abs(candidate(2) - 4) < 1e-9"),
        ("sorted = lambda *a, **k: [4]", "assert sorted([candidate(2)]) == [4]"),
        ("len = lambda x: 1", "assert len([candidate(2), 1]) == 2 and candidate(2) == 4"),
        ("str = lambda x: '4'", "assert str(candidate(2)) == '4'"),
        ("tuple = lambda x: (4,)", "assert tuple([candidate(2)]) == (4,)"),
        ("range = lambda *a: []", "for i in range(3):\n    assert candidate(i) == i * i"),
        ("isinstance = lambda *a: True", "assert isinstance(candidate(2), int) and candidate(2) > 3"),
        ("def helper(x):\n    return 4", "assert helper(candidate(2)) == 4"),
    ],
    ids=["abs", "sorted", "len", "str", "tuple", "range", "isinstance", "prelude-helper"],
)
def test_candidate_globals_do_not_shadow_the_tests_names(auto_pool, shadow, test):
    code = f"{shadow}\ndef square(x):\n    return 0\n"
    result = auto_pool.run(
        Job(
            code=code,
            units=({"src": test, "test": True},),
            prelude="def helper(x):\n    return x",
            bind={"candidate": "square"},
        )
    )
    assert (result.status, result.passed) == ("ok", 0), result


def test_humaneval_2_with_a_wrong_constant_and_a_shadowed_abs_scores_zero(auto_pool, shared_data):
    from lrmgym.envs.code.loaders import load_humaneval

    task = next(t for t in load_humaneval(shared_data / "humaneval" / "HumanEval.jsonl.gz") if t.id == "humaneval/2")
    from lrmgym.envs.code.env import job_for

    result = auto_pool.run(job_for(task, "abs = lambda x: 0\ndef truncate_number(number):\n    return 0.25\n"))
    assert (result.passed, result.total) == (0, 3)


# ------------------------------------------------------------------------------ 5. stdio: nothing but stdin
STDIO_CASES = ({"stdin": "2\n", "stdout": "secret-4\n"}, {"stdin": "3\n", "stdout": "secret-9\n"})


def test_a_stdio_candidate_cannot_find_the_expected_output_in_its_memory(auto_pool):
    code = (
        "import gc, sys\ninp = sys.stdin.read()\nfound = 'none'\n"
        "for o in gc.get_objects():\n"
        "    for x in (o if isinstance(o, (list, tuple)) else o.values() if isinstance(o, dict) else ()):\n"
        "        if isinstance(x, str) and x.endswith('\\n') and '-' in x and x != inp:\n"
        "            found = x\n"
        "        if isinstance(x, dict) and 'stdout' in x:\n"
        "            found = x['stdout']\n"
        "print(found, end='')\n"
    )
    result = auto_pool.run(Job(code=code, mode="stdio", cases=STDIO_CASES))
    assert (result.passed, result.total) == (0, 2)
    assert "secret" not in result.output


def test_a_stdio_candidate_holds_only_its_own_stdin(auto_pool):
    # The second case's input is not in the first case's process (nor any earlier one's).
    code = (
        "import gc, sys\ninp = sys.stdin.read()\n"
        "others = [x for o in gc.get_objects() if isinstance(o, list) for x in o\n"
        "          if isinstance(x, str) and x.endswith('\\n') and x != inp and x.strip().isdigit()]\n"
        "print('leak' if others else int(inp) * int(inp))\n"
    )
    result = auto_pool.run(
        Job(code=code, mode="stdio", cases=({"stdin": "2\n", "stdout": "4"}, {"stdin": "3\n", "stdout": "9"}))
    )
    assert (result.status, result.passed, result.total) == ("ok", 2, 2), result


def test_stdio_honest_programs_still_pass_and_wrong_ones_fail(auto_pool):
    cases = ({"stdin": "1 2\n", "stdout": "3\n"}, {"stdin": "5 6", "stdout": "11"}, {"stdin": "", "stdout": ""})
    ok = auto_pool.run(
        Job(
            code="import sys\nd = sys.stdin.read().split()\nprint(sum(map(int, d)) if d else '')",
            mode="stdio",
            cases=cases,
        )
    )
    assert (ok.status, ok.passed, ok.total) == ("ok", 3, 3)
    bad = auto_pool.run(Job(code="print(3)", mode="stdio", cases=cases))
    assert (bad.passed, bad.results[1]) == (1, (False, "wrong output"))


# ------------------------------------------------------------------------------ 6. exceptions and aborts
@pytest.mark.parametrize(
    ("raise_", "test"),
    [
        ("raise StopIteration", "assert all(map(lambda x: candidate(x) == x * x, [1, 2]))"),
        ("raise StopIteration('x')", "assert not list(filter(lambda x: candidate(x) != x * x, [1, 2]))"),
        ("raise StopAsyncIteration", "assert all(map(candidate, [1]))"),
        ("raise SystemExit(0)", "assert candidate(2) == 4"),
        ("raise KeyboardInterrupt", "assert candidate(2) == 4"),
        ("raise GeneratorExit", "assert all(map(candidate, [1]))"),
    ],
    ids=[
        "stopiteration-map",
        "stopiteration-filter",
        "stopasynciteration",
        "systemexit",
        "keyboardinterrupt",
        "generatorexit",
    ],
)
def test_exceptions_from_the_candidate_do_not_steer_the_tests(auto_pool, raise_, test):
    result = run(auto_pool, f"def square(x):\n    {raise_}\n", units=({"src": test, "test": True},))
    assert (result.status, result.passed) == ("ok", 0), result


def test_an_expected_builtin_error_keeps_its_type(auto_pool):
    test = "try:\n    candidate(-1)\n    ok = False\nexcept ValueError:\n    ok = True\nassert ok"
    result = run(auto_pool, "def square(x):\n    raise ValueError('negative')\n", units=({"src": test, "test": True},))
    assert result.passed == 1


@pytest.mark.parametrize(
    "test",
    [
        "try:\n    candidate(-1)\n    ok = False\nexcept Exception:\n    ok = True\nassert ok",
        "try:\n    candidate(-1)\nexcept:\n    pass\nassert True or candidate",
    ],
    ids=["except-exception", "bare-except"],
)
def test_a_timeout_cannot_be_swallowed_by_a_tests_except_clause(auto_pool, test):
    from lrmgym.envs.code.sandbox import Limits

    units = ({"src": test, "test": True}, {"src": "assert candidate(2) == 4", "test": True})
    result = auto_pool.run(
        Job(code="import time\ndef square(x):\n    time.sleep(60)\n", units=units, bind={"candidate": "square"}),
        Limits(timeout_s=0.5),
    )
    assert (result.status, result.passed) == ("timeout", 0), result


def test_an_entry_point_named_like_a_builtin_is_bound_from_the_reference(auto_pool, shared_data):
    from lrmgym.envs.code.env import job_for
    from lrmgym.envs.code.loaders import load_mbpp

    task = next(t for t in load_mbpp(shared_data / "mbpp" / "mbpp.jsonl") if t.id == "mbpp/126")
    assert task.bind == {"sum": "sum"}  # the reference defines sum(a, b); the tests call it
    assert auto_pool.run(job_for(task, task.solution)).all_passed
    # Any other builtin the candidate defines stays the builtin for the tests.
    result = auto_pool.run(job_for(task, "abs = lambda x: 0\n" + task.solution))
    assert result.all_passed
