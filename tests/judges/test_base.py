"""JudgedEnv: weighted composition over any env, in step and score_group, with every component recorded."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from lrmgym.core import Completion, Task, Verdict
from lrmgym.envs.echo import EchoEnv
from lrmgym.judges import base
from lrmgym.judges.base import BaseJudge, ContentCache, JudgedEnv, PairwiseAsJudge, both_orders, content_hash
from lrmgym.judges.rule import AccuracyJudge, FormatJudge, LengthPenalty


class CountingEcho(EchoEnv):
    """Echo that counts verifier calls, to show judges reuse the env's verdict instead of re-verifying."""

    calls = 0

    def verify(self, task, completion):
        CountingEcho.calls += 1
        return super().verify(task, completion)


class Exploding(BaseJudge):
    name = "exploding"

    def _score(self, task, completion, verdict):
        raise RuntimeError("boom")


def _env(**kw):
    return JudgedEnv(
        CountingEcho(words=1, **kw),
        [
            AccuracyJudge(weight=1.0),
            FormatJudge("loose", weight=0.5),
            LengthPenalty(max_length=100, unit="chars", weight=2.0),
        ],
    )


def test_score_group_composes_weighted_components_and_verifies_once_each():
    env = _env()
    env.reset(seed=0)
    task = env.task
    texts = [task.answer, "<think>x</think>" + task.answer, "wrong"]
    CountingEcho.calls = 0
    verdicts = env.score_group(task, texts)
    assert CountingEcho.calls == 3
    assert [c.name for c in verdicts[0].components] == ["accuracy", "format_loose", "length"]
    assert [c.weight for c in verdicts[0].components] == [1.0, 0.5, 2.0]
    # accuracy 1, format 0, length -(5/100) * 2
    assert verdicts[0].score == pytest.approx(1.0 - 0.1)
    assert verdicts[1].score == pytest.approx(0.0 + 0.5 - 2 * 21 / 100)  # echo wants the bare words: wrong
    assert verdicts[1].format_ok is True and verdicts[0].format_ok is False
    assert verdicts[2].correct is False
    assert all(c.cached is False for v in verdicts for c in v.components)  # latencies: see the fake-clock tests
    assert verdicts[0].reason == "accuracy: match; format_loose: no <think> tag; length: 5 chars"


def test_step_applies_the_same_judges_and_keeps_the_env_verdict():
    env = _env()
    env.reset(seed=0)
    answer = env.task.answer
    expected = env.score_group(env.task, [answer])[0].score
    _, reward, terminated, truncated, info = env.step(answer)
    assert reward == pytest.approx(expected)
    assert info["verdict"].score == pytest.approx(expected)
    assert info["env_verdict"].score == 1.0
    assert terminated and not truncated


def test_multi_turn_env_keeps_its_feedback_loop_under_the_wrapper():
    env = _env(max_turns=3)
    env.reset(seed=1)
    obs, reward, terminated, truncated, _ = env.step("nope")
    assert obs.startswith("Wrong. Repeat exactly:") and not terminated and not truncated
    assert reward == pytest.approx(-2 * 4 / 100)
    _, reward, terminated, _, _ = env.step(env.task.answer)
    assert terminated and reward == pytest.approx(1.0 - 0.1)


def test_weights_override_and_verify_gives_the_judged_verdict():
    env = JudgedEnv(EchoEnv(words=1), [AccuracyJudge(), FormatJudge("loose")], weights=[3.0, 1.0])
    env.reset(seed=0)
    assert env.verify(env.task, env.task.answer).score == 3.0


def test_a_failing_judge_without_a_verifier_makes_the_verdict_ungradeable_without_raising():
    env = JudgedEnv(EchoEnv(), [FormatJudge("loose"), Exploding()])
    env.reset(seed=0)
    _, reward, _, _, info = env.step("anything")
    verdict = info["verdict"]
    assert reward == 0.0 and verdict.score is None
    assert verdict.reason == (
        "ungradeable by exploding; format_loose: no <think> tag; exploding: exploding failed: RuntimeError: boom"
    )
    assert env.judge_stats()["exploding"]["failures"] == 1


# ---- issue 35.9: a judge's failure never masks what the verifier graded
def test_a_failing_judge_never_masks_a_wrong_answer_the_verifier_graded():
    env = JudgedEnv(EchoEnv(), [AccuracyJudge(), Exploding()])
    env.reset(seed=0)
    _, reward, _, _, info = env.step("anything")
    verdict = info["verdict"]
    assert reward == 0.0 and verdict.score == 0.0 and verdict.correct is False  # wrong: 0, not masked
    assert verdict.reason == (
        "judge_failed: exploding (counted at the lowest score; the verifier graded this completion); "
        "accuracy: mismatch; exploding: exploding failed: RuntimeError: boom"
    )
    assert verdict.components[1].score is None  # the failed component stays on record as failed


def test_a_correct_answer_falls_back_to_the_verifiable_score_and_failures_are_counted():
    env = JudgedEnv(EchoEnv(words=1), [AccuracyJudge(weight=2.0), Exploding(weight=0.5), FormatJudge("loose")])
    env.reset(seed=0)
    verdicts = env.score_group(env.task, [env.task.answer, "<think>x</think>wrong"])
    assert [v.score for v in verdicts] == [2.0, 1.0]  # 2 x accuracy + 0 (failed judge) + format
    m = env.pop_metrics()
    assert (m["samples"], m["judge_failed"], m["judge_ungradeable"]) == (2, 2, 0)
    assert env.pop_metrics()["judge_failed"] == 0


class Penalty(BaseJudge):
    """A failing judge whose scores are penalties in [-1, 0]: failing must count as -1, not as 0."""

    name = "penalty"
    score_bounds = (-1.0, 0.0)

    def _score(self, task, completion, verdict):
        raise RuntimeError("boom")


def test_a_failed_component_counts_at_the_bound_that_weighs_least():
    for weight, expected in ((1.0, -1.0), (-2.0, 0.0)):
        env = JudgedEnv(EchoEnv(words=1), [AccuracyJudge(), Penalty(weight=weight)])
        env.reset(seed=0)
        assert env.verify(env.task, env.task.answer).score == 1.0 + expected


def test_without_a_weighted_or_gradeable_verifier_a_judge_failure_is_ungradeable():
    env = JudgedEnv(EchoEnv(words=1), [AccuracyJudge(weight=0.0), Exploding()])  # trains on the judge alone
    env.reset(seed=0)
    assert env.verify(env.task, "wrong").score is None
    assert env.pop_metrics()["judge_ungradeable"] == 1


class NonFinite(BaseJudge):
    name = "nonfinite"

    def __init__(self, value, **kw):
        super().__init__(**kw)
        self.value = value

    def _score(self, task, completion, verdict):
        return self.value, "", False


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 1e400, "7"])
def test_a_non_finite_judge_score_is_a_failure_not_a_nan_reward(value):
    env = JudgedEnv(EchoEnv(words=1), [AccuracyJudge(), NonFinite(value)])
    env.reset(seed=0)
    verdict = env.verify(env.task, "wrong")
    assert verdict.score == 0.0 and verdict.components[1].score is None
    assert "gave a non-finite score" in verdict.components[1].reason


class GroupBug(BaseJudge):
    """A judge whose group call raises, or returns too few components (bugs: neither may happen)."""

    name = "groupbug"

    def __init__(self, short: bool = False) -> None:
        super().__init__()
        self.short = short

    def score_group(self, task, completions, verdicts):
        if self.short:
            return []
        raise RuntimeError("group boom")


@pytest.mark.parametrize("short", [False, True])
def test_a_judge_whose_group_call_breaks_fails_its_components_and_never_raises(short):
    env = JudgedEnv(EchoEnv(words=1), [AccuracyJudge(), GroupBug(short)])
    env.reset(seed=0)
    verdicts = env.score_group(env.task, [env.task.answer, "wrong"])
    assert [v.score for v in verdicts] == [1.0, 0.0]
    assert all(v.components[1].score is None and "groupbug failed" in v.components[1].reason for v in verdicts)


class FailsOn(BaseJudge):
    """Fails on one text (a completion that derails it), scores 0.5 elsewhere."""

    name = "picky"

    def _score(self, task, completion, verdict):
        if completion.text == "derail":
            raise RuntimeError("derailed")
        return 0.5, "", False


def test_one_completion_s_judge_failure_does_not_change_another_s_reward():
    env = JudgedEnv(EchoEnv(words=1), [AccuracyJudge(), FailsOn()])
    env.reset(seed=0)
    alone = env.score_group(env.task, [env.task.answer, "wrong"])
    together = env.score_group(env.task, [env.task.answer, "derail", "wrong"])
    assert [v.score for v in alone] == [1.5, 0.5]
    assert [v.score for v in together] == [1.5, 0.0, 0.5]


def test_an_ungradeable_env_verdict_stays_ungradeable():
    class Broken(EchoEnv):
        def verify(self, task, completion):
            return Verdict.ungradeable("timeout after 2.0 s")

    env = JudgedEnv(Broken(), AccuracyJudge())
    env.reset(seed=0)
    assert env.score_group(env.task, ["x"])[0].score is None


@pytest.mark.parametrize(
    ("judges", "kwargs", "error", "message"),
    [
        ([], {}, ValueError, "JudgedEnv needs at least one judge; for the env's own reward use the env itself."),
        ([AccuracyJudge(), AccuracyJudge()], {}, ValueError,
         "Two judges share the name(s) ['accuracy']; give each a distinct name (name=...)."),
        ([AccuracyJudge()], {"weights": [1.0, 2.0]}, ValueError,
         "Got 2 weights for 1 judges; give one weight per judge."),
        (["accuracy"], {}, TypeError,
         "JudgedEnv expects Judge objects (name, weight, score, score_group, stats); got str."),
    ],
)  # fmt: skip
def test_bad_wrapper_arguments(judges, kwargs, error, message):
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        JudgedEnv(EchoEnv(), judges, **kwargs)


class FixedPairwise:
    """Pairwise judge returning a scripted outcome per (first, second) text pair."""

    name = "fixed"

    def __init__(self, table):
        self.table = table

    def compare(self, task, first, second):
        return self.table.get((first.text, second.text))

    def stats(self):
        return {}


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ({("a", "b"): 1.0, ("b", "a"): 0.0}, 1.0),  # consistent: a wins
        ({("a", "b"): 1.0, ("b", "a"): 1.0}, 0.5),  # position bias: a flip counts as a tie
        ({("a", "b"): 0.5, ("b", "a"): 0.5}, 0.5),
        ({("a", "b"): 0.0}, 0.0),  # second call failed: the first decides
        ({("b", "a"): 0.0}, 1.0),
        ({}, None),
    ],
)
def test_both_orders(table, expected):
    task = Task(id="t", prompt="p")
    assert both_orders(FixedPairwise(table), task, Completion("a"), Completion("b")) == (expected, 2)


def test_content_cache_is_bounded_lru_and_hash_separates_parts():
    cache = ContentCache(max_entries=2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == (True, 1)
    cache.put("c", 3)  # evicts b, the least recently used
    assert cache.get("b") == (False, None) and len(cache) == 2
    assert content_hash("ab", "c") != content_hash("a", "bc")
    # Lone surrogates hash without error, and distinct ones stay distinct (no lossy "replace"/"ignore").
    assert content_hash("x\ud800") == content_hash("x\ud800") != content_hash("x\udc00")


def test_pop_metrics_reports_counter_changes_since_the_last_call():
    env = JudgedEnv(EchoEnv(), [AccuracyJudge(), Exploding()])
    env.reset(seed=0)
    env.score_group(env.task, ["a", "b"])
    first = env.pop_metrics()
    assert (first["accuracy/calls"], first["exploding/failures"]) == (2, 2)
    env.score_group(env.task, ["c"])
    second = env.pop_metrics()
    assert (second["accuracy/calls"], second["exploding/failures"]) == (1, 1)


def test_judged_envs_pass_the_env_checker_with_adversarial_outputs():
    from lrmgym.judges.arena import ArenaJudge
    from lrmgym.judges.llm import LLMPointwiseJudge
    from lrmgym.judges.pairwise_rule import RulePairwiseJudge
    from lrmgym.judges.rule import OverlongPenalty
    from lrmgym.testing import ScriptedPolicy, check_env

    judges = [
        AccuracyJudge(), FormatJudge("strict"), LengthPenalty(max_length=100), OverlongPenalty(100, 20),
        ArenaJudge(RulePairwiseJudge()), LLMPointwiseJudge(ScriptedPolicy(lambda p, i: "SCORE: 5")),
    ]  # fmt: skip
    check_env(JudgedEnv(EchoEnv(max_turns=2), judges))


def test_content_cache_clear_forgets_everything():
    cache = ContentCache(max_entries=4)
    cache.put("a", 1)
    cache.clear()
    assert cache.get("a") == (False, None) and len(cache) == 0


# --------------------------------------------------------------------------------------------------- latencies
class FakeClock:
    """A ``perf_counter`` that only moves when a judge says it spent time (starts far from 0)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(base, "time", SimpleNamespace(perf_counter=fake))  # base.py's clock only
    return fake


class Slow(BaseJudge):
    """Spends ``seconds`` of fake time per completion, then scores 1 (or raises, when ``fail``)."""

    def __init__(self, clock, seconds, name, fail=False):
        super().__init__(name=name)
        self.clock, self.seconds, self.fail = clock, seconds, fail

    def _score(self, task, completion, verdict):
        self.clock.advance(self.seconds)
        if self.fail:
            raise RuntimeError("late boom")
        return 1.0, "", False


class TimedEcho(EchoEnv):
    """Echo whose verifier reports a fixed latency of its own."""

    def verify(self, task, completion):
        return super().verify(task, completion).replace(latency_s=0.125)


# All times below are dyadic fractions, so the sums are exact in floating point.
def test_component_latency_is_the_judge_s_time_and_the_verdict_adds_the_env_s(clock):
    env = JudgedEnv(TimedEcho(), [Slow(clock, 0.25, "quick"), Slow(clock, 0.5, "slow")])
    env.reset(seed=0)
    verdicts = env.score_group(env.task, ["a", "b", "c"])
    for v in verdicts:
        assert [c.latency_s for c in v.components] == [0.25, 0.5]
        assert v.latency_s == 0.125 + 0.25 + 0.5  # the env's own, plus every component's
    stats = env.judge_stats()
    assert (stats["quick"]["calls"], stats["quick"]["seconds"]) == (3, 0.75)
    assert (stats["slow"]["calls"], stats["slow"]["seconds"]) == (3, 1.5)
    _, _, _, _, info = env.step("a")
    assert info["env_verdict"].latency_s == 0.125
    assert info["verdict"].latency_s == 0.875


def test_a_failing_judge_s_time_still_counts(clock):
    env = JudgedEnv(TimedEcho(), [Slow(clock, 0.25, "quick"), Slow(clock, 2.0, "late", fail=True)])
    env.reset(seed=0)
    verdict = env.score_group(env.task, ["a"])[0]
    assert verdict.score is None and [c.latency_s for c in verdict.components] == [0.25, 2.0]
    assert verdict.latency_s == 0.125 + 0.25 + 2.0
    assert env.judge_stats()["late"] == {"calls": 1, "failures": 1, "cache_hits": 0, "seconds": 2.0}


class SlowPairwise(PairwiseAsJudge):
    """Spends one fake second per comparison; the longer text wins."""

    name = "slow_pairwise"

    def __init__(self, clock):
        super().__init__()
        self.clock = clock

    def _compare_once(self, task, first, second):
        self.clock.advance(1.0)
        return float(len(first.text) > len(second.text))


def test_pairwise_group_latency_is_the_group_s_time_shared_equally(clock):
    judge = SlowPairwise(clock)
    env = JudgedEnv(TimedEcho(), judge)
    env.reset(seed=0)
    verdicts = env.score_group(env.task, ["a", "bb", "ccc", "dddd"])  # 6 comparisons, 6 s, over 4 completions
    assert [v.components[0].latency_s for v in verdicts] == [1.5] * 4
    assert [v.latency_s for v in verdicts] == [0.125 + 1.5] * 4
    assert [v.score for v in verdicts] == [0.0, 1 / 3, 2 / 3, 1.0]
    assert (judge.stats()["calls"], judge.stats()["seconds"]) == (4, 6.0)
