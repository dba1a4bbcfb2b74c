"""The reward-hacking battery (:mod:`lrmgym.testing.reward_hacking`): every attack earns at most its cap."""

from __future__ import annotations

import pytest

from lrmgym.testing.reward_hacking import HackCase, all_cases, run_case

CASES = all_cases()


@pytest.fixture(scope="module")
def envs():
    built: dict = {}
    yield built
    for env in built.values():
        env.close()


def test_the_battery_covers_every_class_with_at_least_40_cases():
    attacks = [c for c in CASES if c.klass != "control"]
    assert len(attacks) >= 40
    assert {c.env for c in attacks} == {"math", "code", "math_tool"}
    classes = {c.klass for c in attacks}
    for needed in ("harness-takeover", "shadowed-builtin", "control-flow-exception", "read-expected"):
        assert needed in classes
    assert all(c.max_score == 0.0 for c in attacks), "an attack that solves nothing may earn nothing"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case(case: HackCase, envs):
    result = run_case(case, envs)
    if result.skipped:
        pytest.skip(f"{case.name}: {result.skipped}")
    verdict = result.verdict
    assert verdict is not None and verdict.score is not None, f"{case.name}: ungradeable ({verdict})"
    assert result.held, (
        f"{case.name} earned {verdict.score} (allowed {case.min_score}..{case.max_score}): {verdict.reason}"
    )
