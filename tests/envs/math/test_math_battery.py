"""The math-verifier cases of the shared adversarial battery (../shared/data/adversarial/cases.json).

Each case is run two ways: as a completion through the env's strict ``boxed`` extraction (how a policy's
output is graded), and as a raw string straight into ``verify_answer`` (how another component might call
the verifier), which exercises the worker pool even where strict extraction would already reject it.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from lrmgym.core import Completion, Task
from lrmgym.envs.math.env import MathEnv
from lrmgym.envs.math.verify import default_pool, verify_answer

SLACK_S = 1.0  # process kill and reap on a loaded machine


def _decode(value):
    if isinstance(value, str):
        return value
    return "".join(p if isinstance(p, str) else p["repeat"] * p["times"] for p in value["concat"])


def _cases(shared_data):
    rows = json.loads((shared_data / "adversarial" / "cases.json").read_text())
    return [r for r in rows if r["component"] == "math_verifier"]


@pytest.fixture(scope="module")
def cases(shared_data):
    default_pool().warm()
    return _cases(shared_data)


def _run(case, way: str):
    gold, pred = case["input"]["gold"], _decode(case["input"]["pred"])
    env = MathEnv(template="boxed")
    task = Task(id=f"battery/{case['name']}", prompt="", answer=gold, metadata={"template": "boxed"})
    box: list = []

    def call():
        if way == "env":
            box.append(env.verify(task, Completion(pred)))
        else:
            box.append(verify_answer(pred, gold, use_cache=False))

    start = time.perf_counter()
    if case["name"] == "non_main_thread_call":
        thread = threading.Thread(target=call)
        thread.start()
        thread.join()
    else:
        call()
    return box[0], time.perf_counter() - start


NAMES = [
    "control_equivalent_forms", "power_tower_latex", "power_tower_plain", "power_tower_str_landmine",
    "huge_factorial", "hard_integral", "deep_nesting_parens", "unclosed_boxed_flood", "long_expression_100k",
    "huge_response_5MB", "bmod_false_positive", "hedged_multiple_boxed", "nul_and_bidi_junk", "non_main_thread_call",
]  # fmt: skip


def test_battery_has_the_14_math_cases(cases):
    assert [c["name"] for c in cases] == NAMES


@pytest.mark.parametrize("way", ["env", "verifier"])
@pytest.mark.parametrize("name", NAMES)
def test_battery_case(name, way, cases):
    if way == "verifier" and name in ("huge_response_5MB", "hedged_multiple_boxed"):
        pytest.skip("an extraction case (where is the answer in a long or hedging text): applies to the env way only")
    case = next(c for c in cases if c["name"] == name)
    expected = case["expected"]
    verdict, elapsed = _run(case, way)
    # Every gold here parses, so nothing may be ungradeable: a masked sample would be an opt-out.
    assert verdict.score == expected["reward"], (name, way, verdict.reason)
    if "max_wall_s" in expected:
        assert elapsed < expected["max_wall_s"] + (SLACK_S if expected["max_wall_s"] >= 2 else 0.5), (
            name,
            way,
            elapsed,
        )
    if expected.get("verifier_alive_after"):
        assert verify_answer("\\sqrt{9}", "3", use_cache=False).correct
