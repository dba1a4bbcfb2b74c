"""The math cases of the reward-hacking battery, each graded through the real env: attacks earn 0 and are
never ungradeable; the controls still earn 1."""

from __future__ import annotations

import time

import pytest

from lrmgym.envs.math.verify import default_pool
from lrmgym.testing.reward_hacking import run_case
from lrmgym.testing.reward_hacking.math_cases import CASES

SLACK_S = 1.0


@pytest.fixture(scope="module")
def envs():
    default_pool().warm()  # so that no case's time includes starting a worker
    built: dict = {}
    yield built
    for env in built.values():
        env.close()


def test_the_math_battery_is_complete():
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))
    assert all(c.name.startswith("math/") and c.env == "math" for c in CASES)
    attacks = [c for c in CASES if c.klass != "control"]
    assert len(attacks) >= 25 and all(c.max_score == 0.0 for c in attacks)
    assert all(c.min_score == c.max_score == 1.0 for c in CASES if c.klass == "control")
    assert len({c.klass for c in attacks}) >= 15


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_holds(case, envs):
    start = time.perf_counter()
    result = run_case(case, envs)
    elapsed = time.perf_counter() - start
    assert not result.skipped
    verdict = result.verdict
    assert verdict.score is not None, (case.name, verdict.reason)  # never masked: that would be an opt-out
    assert result.held, (case.name, verdict.score, verdict.reason)
    assert elapsed < case.env_config.get("timeout_s", 2.0) + SLACK_S, (case.name, elapsed)  # the hard bound held
