"""The arena: routing, the anchor schedule and its call budget, BT rewards, pools, both orders, metrics."""

from __future__ import annotations

import re

import numpy as np
import pydantic
import pytest
from test_llm import SlowCountingPolicy  # the same directory; pytest puts it on sys.path

import lrmgym
from lrmgym.core import Completion, Task, Verdict
from lrmgym.judges.arena import ArenaJudge, ArenaJudgeConfig, select_anchors
from lrmgym.judges.base import JudgedEnv
from lrmgym.judges.bradley_terry import fit_bradley_terry
from lrmgym.judges.llm import LLMPairwiseJudge
from lrmgym.testing import ScriptedPolicy

TASK = Task(id="p/0", prompt="Q", answer="1")


class ValueJudge:
    """Pairwise judge by a number in the text (higher wins, equal ties); logs every comparison it makes.

    ``bias="first"`` makes it always prefer the first slot; ``fail=True`` makes every call fail.
    """

    name = "value"

    def __init__(self, bias: str | None = None, fail: bool = False, invert: bool = False) -> None:
        self.log: list[tuple[int, int]] = []
        self.bias, self.fail, self.invert = bias, fail, invert

    def compare(self, task, first, second):
        a, b = int(first.text), int(second.text)
        self.log.append((a, b))
        if self.fail:
            return None
        if self.bias == "first":
            return 1.0
        if self.invert:
            a, b = b, a
        return 1.0 if a > b else 0.0 if a < b else 0.5

    def stats(self):
        return {"calls": len(self.log)}


def _group(values, score=0.0, correct=None):
    comps = [Completion(str(v)) for v in values]
    verdicts = [Verdict(score=score, correct=correct if correct is not None else bool(score)) for _ in values]
    return comps, verdicts


def test_select_anchors_takes_best_lower_median_and_worst():
    assert select_anchors(np.array([0.5, -1.0, 2.0, 0.1]), 3) == [2, 3, 1]  # ascending: 1, 3, 0, 2
    assert select_anchors(np.array([0.0, 1.0, 2.0, 3.0, 4.0]), 3) == [4, 2, 0]
    assert select_anchors(np.array([3.0, 1.0]), 3) == [0, 1]
    assert select_anchors(np.array([3.0, 5.0, 1.0]), 1) == [1]
    assert select_anchors(np.zeros(6), 2) == [5, 0]


@pytest.mark.parametrize(("g", "calls"), [(2, 1), (3, 3), (4, 6), (8, 18), (16, 42)])
def test_anchor_schedule_costs_at_most_3g_minus_6_calls(g, calls):
    judge = ValueJudge()
    arena = ArenaJudge(judge)
    arena.score_group(TASK, *_group(range(g)))
    assert len(judge.log) == calls == sum(min(3, k) for k in range(g))
    assert arena.pop_metrics()["judge_calls"] == calls


def test_newcomers_meet_the_best_median_and_worst_of_the_pool():
    judge = ValueJudge()
    ArenaJudge(judge, seed=1).score_group(TASK, *_group([5, 1, 9, 3, 7]))
    met_by_7 = {a if b == 7 else b for a, b in judge.log if 7 in (a, b)}
    assert met_by_7 == {9, 3, 1}  # pool ranked 9 > 5 > 3 > 1: best 9, lower middle 3, worst 1


def test_rewards_are_min_max_normalised_bt_strengths_in_judge_order():
    arena = ArenaJudge(ValueJudge())
    comps = arena.score_group(TASK, *_group([5, 1, 9, 3, 7, 2]))
    rewards = [c.score for c in comps]
    assert max(rewards) == 1.0 and min(rewards) == 0.0
    assert rewards[2] == 1.0 and rewards[1] == 0.0  # the 9 and the 1
    # An incomplete graph need not rank every pair (the 2 never met the 3); the full tournament does.
    full = ArenaJudge(ValueJudge(), tournament="round_robin").score_group(TASK, *_group([5, 1, 9, 3, 7, 2]))
    assert np.argsort([c.score for c in full]).tolist() == np.argsort([5, 1, 9, 3, 7, 2]).tolist()


def test_rewards_match_an_independent_bt_fit_of_the_logged_comparisons():
    judge = ValueJudge()
    comps = ArenaJudge(judge, l2=0.5).score_group(TASK, *_group([4, 8, 2, 6]))
    index = {4: 0, 8: 1, 2: 2, 6: 3}
    triples = []
    for a, b in judge.log:
        y = 1.0 if a > b else 0.0
        triples += [(index[a], index[b], y), (index[b], index[a], 1 - y)]
    beta = fit_bradley_terry(4, triples, l2=0.5).strengths
    expected = (beta - beta.min()) / (beta.max() - beta.min())
    np.testing.assert_allclose([c.score for c in comps], expected, atol=1e-8)


def test_all_ties_give_no_signal():
    arena = ArenaJudge(ValueJudge())
    assert [c.score for c in arena.score_group(TASK, *_group([3, 3, 3, 3]))] == [0.0] * 4
    assert arena.pop_metrics()["groups_no_signal"] == 1


def test_mixed_groups_keep_verifiable_rewards_without_judge_calls():
    judge = ValueJudge()
    arena = ArenaJudge(judge)
    comps = [Completion("1"), Completion("2"), Completion("3")]
    verdicts = [Verdict(score=1.0, correct=True), Verdict(score=0.0, correct=False), Verdict(score=1.0, correct=True)]
    out = arena.score_group(TASK, comps, verdicts)
    assert [c.score for c in out] == [1.0, 0.0, 1.0] and judge.log == []
    assert out[0].reason == "verifier (not routed)"


@pytest.mark.parametrize(
    ("route_when", "all_correct", "all_wrong", "mixed"),
    [("all_equal", True, True, False), ("all_correct", True, False, False), ("all_wrong", False, True, False),
     ("always", True, True, True), ("never", False, False, False)],
)  # fmt: skip
def test_route_when(route_when, all_correct, all_wrong, mixed):
    arena = ArenaJudge(ValueJudge(), route_when=route_when)
    assert arena.routes([Verdict(score=1.0, correct=True)] * 3) is all_correct
    assert arena.routes([Verdict(score=0.0, correct=False)] * 3) is all_wrong
    assert arena.routes([Verdict(score=1.0, correct=True), Verdict(score=0.0, correct=False)]) is mixed
    assert arena.routes([Verdict(score=1.0, correct=True)]) is False  # one trace: nothing to compare


def test_equal_float_rewards_route_within_tolerance():
    arena = ArenaJudge(ValueJudge())
    assert arena.routes([Verdict(score=0.3), Verdict(score=0.3 + 1e-12)])
    assert not arena.routes([Verdict(score=0.3), Verdict(score=0.31)])


def test_ungradeable_traces_stay_ungradeable_and_the_rest_are_routed():
    judge = ValueJudge()
    comps = [Completion("1"), Completion("2"), Completion("3")]
    verdicts = [Verdict(score=0.0), Verdict.ungradeable("timeout after 2.0 s"), Verdict(score=0.0)]
    out = ArenaJudge(judge).score_group(TASK, comps, verdicts)
    assert [c.score for c in out] == [0.0, None, 1.0]
    assert out[1].reason == "timeout after 2.0 s" and all(2 not in pair for pair in judge.log)


def test_round_robin_compares_every_pair():
    judge = ValueJudge()
    ArenaJudge(judge, tournament="round_robin").score_group(TASK, *_group(range(8)))
    assert len(judge.log) == 28 and len({frozenset(p) for p in judge.log}) == 28


def test_random_order_presents_both_slots():
    judge = ValueJudge()
    ArenaJudge(judge, seed=0).score_group(TASK, *_group(range(16)))
    newcomer_first = sum(1 for a, b in judge.log if a > b)  # newcomers carry larger numbers here
    assert 0 < newcomer_first < len(judge.log)


def test_both_orders_doubles_calls_and_neutralises_position_bias():
    biased = ValueJudge(bias="first")
    arena = ArenaJudge(biased, both_orders=True)
    out = arena.score_group(TASK, *_group(range(8)))
    assert len(biased.log) == 36 and [c.score for c in out] == [0.0] * 8  # every flip is a tie: no signal
    consistent = ArenaJudge(ValueJudge(), both_orders=True).score_group(TASK, *_group([2, 9, 4]))
    # 4 beats 2 and loses to 9 in both orders: halfway between them on the min-max scale.
    assert [c.score for c in consistent] == [0.0, 1.0, pytest.approx(0.5)]


def test_prompt_pool_persists_across_steps_and_is_trimmed():
    judge = ValueJudge()
    arena = ArenaJudge(judge, pool="prompt", pool_size=5)
    arena.score_group(TASK, *_group([1, 2, 3, 4]))
    judge.log.clear()
    out = arena.score_group(TASK, *_group([10, 0]))
    assert len(judge.log) == 6  # each newcomer meets 3 anchors of the kept pool
    assert [c.score for c in out] == [1.0, 0.0]
    assert len(arena._pools[TASK.id].members) == 5
    judge.log.clear()
    arena.score_group(Task(id="p/1", prompt="Q2", answer="1"), *_group([1, 2]))
    assert len(judge.log) == 1  # another prompt starts from an empty pool


def test_a_trimmed_pool_keeps_the_comparisons_among_its_kept_members():
    # Kills: `>` for `>=` at the trim: the comparisons of the oldest kept member lost (or a dropped one's kept).
    from lrmgym.judges.arena import _Pool

    members = [Completion(str(v)) for v in range(5)]
    comps = [(i, j, 1.0) for i in range(5) for j in range(i + 1, 5)]
    pool = _Pool(members, comps, np.arange(5.0)).trimmed(3)
    assert [m.text for m in pool.members] == ["2", "3", "4"]
    assert sorted(pool.comparisons) == [(0, 1, 1.0), (0, 2, 1.0), (1, 2, 1.0)]
    assert pool.strengths.tolist() == [2.0, 3.0, 4.0]
    whole = _Pool(members, comps, np.arange(5.0))
    assert whole.trimmed(5) is whole and len(whole.trimmed(4).comparisons) == 6


def test_call_cap_and_failures_are_counted_and_never_raise():
    capped = ValueJudge()
    ArenaJudge(capped, max_calls_per_group=5).score_group(TASK, *_group(range(8)))
    assert len(capped.log) == 5
    arena = ArenaJudge(ValueJudge(fail=True))
    out = arena.score_group(TASK, *_group(range(4)))
    assert [c.score for c in out] == [0.0] * 4
    metrics = arena.pop_metrics()
    assert (metrics["judge_calls"], metrics["judge_failures"], metrics["comparisons"]) == (6, 6, 0)


def test_audit_measures_agreement_with_the_verifier_on_mixed_groups():
    comps = [Completion("9"), Completion("1"), Completion("8"), Completion("2")]
    verdicts = [Verdict(score=1.0, correct=True), Verdict(score=0.0, correct=False)] * 2
    agree = ArenaJudge(ValueJudge(), audit_pairs=4)
    agree.score_group(TASK, comps, verdicts)
    assert agree.pop_metrics()["audit_agreement"] == 1.0
    disagree = ArenaJudge(ValueJudge(invert=True), audit_pairs=4)
    assert [c.score for c in disagree.score_group(TASK, comps, verdicts)] == [1.0, 0.0, 1.0, 0.0]
    metrics = disagree.pop_metrics()
    assert (metrics["audit_agreement"], metrics["audit_pairs"], metrics["audit_calls"]) == (0.0, 4, 4)


def test_metrics_report_routing_calls_and_spread_then_reset():
    arena = ArenaJudge(ValueJudge())
    arena.score_group(TASK, *_group(range(8)))
    arena.score_group(TASK, [Completion("1"), Completion("2")], [Verdict(score=1.0), Verdict(score=0.0)])
    m = arena.pop_metrics()
    assert (m["groups"], m["groups_routed"], m["frac_routed"], m["judge_calls_per_group"]) == (2, 1, 0.5, 18)
    assert 0.2 < m["routed_reward_std"] < 0.5
    assert arena.pop_metrics()["groups"] == 0 and arena.metrics()["frac_routed"] is None


def test_arena_over_the_math_env_with_the_rule_judge():
    env = JudgedEnv(lrmgym.make("Math-v0"), ArenaJudgeConfig().build())
    env.reset(seed=0)
    task = env.task
    ans = int(task.answer)
    texts = [
        f"<think>{task.metadata['steps'][0]}</think><answer>{ans + 1}</answer>",
        f"<think>1+1=3</think><answer>{ans + 1}</answer>",
        f"<think>{task.metadata['steps'][0]}</think><answer>{ans + 50}</answer>",
    ]
    verdicts = env.score_group(task, texts)  # all wrong: routed
    assert [v.correct for v in verdicts] == [False] * 3
    assert [v.components[0].name for v in verdicts] == ["arena"] * 3
    assert verdicts[0].score == 1.0 and verdicts[1].score == 0.0 and 0 < verdicts[2].score < 1
    mixed = env.score_group(task, [task.metadata["solution"], texts[0]])
    assert [v.score for v in mixed] == [1.0, 0.0]


def test_config_builds_rule_and_llm_pairwise_judges():
    assert ArenaJudgeConfig().build().pairwise.name == "rule_pairwise"
    cfg = ArenaJudgeConfig(pairwise={"kind": "llm_pairwise", "policy": {"kind": "mock", "mode": "scripted",
                                                                        "responses": ["VERDICT: A"]}},
                           both_orders=True, num_anchors=2)  # fmt: skip
    arena = cfg.build()
    out = arena.score_group(TASK, *_group([1, 2, 3]))
    assert [c.score for c in out] == [0.0, 0.0, 0.0]  # an always-"A" judge in both orders: all ties
    with pytest.raises(pydantic.ValidationError, match=re.escape("Input tag 'llm' found using 'kind' does not match")):
        ArenaJudgeConfig(pairwise={"kind": "llm"})


def test_llm_pairwise_judge_inside_the_arena_with_a_scripted_model():
    def judge_by_length(prompt, i):  # a toy judge model: prefers the longer fenced solution
        text = prompt[-1]["content"]
        a = re.search(r"<<<BEGIN SOLUTION A (\w+)>>>\n(.*?)\n<<<END SOLUTION A \1>>>", text, re.S).group(2)
        b = re.search(r"<<<BEGIN SOLUTION B (\w+)>>>\n(.*?)\n<<<END SOLUTION B \1>>>", text, re.S).group(2)
        return "VERDICT: " + ("A" if len(a) > len(b) else "B" if len(b) > len(a) else "TIE")

    arena = ArenaJudge(LLMPairwiseJudge(ScriptedPolicy(judge_by_length)))
    out = arena.score_group(TASK, [Completion("x" * n) for n in (3, 1, 5, 2)], [Verdict(score=0.0)] * 4)
    assert [c.score for c in out][2] == 1.0 and [c.score for c in out][1] == 0.0


def test_concurrent_workers_give_the_same_rewards_as_sequential_judging():
    seq = ArenaJudge(ValueJudge(), seed=3).score_group(TASK, *_group([5, 1, 9, 3, 7, 2, 8, 4]))
    par = ArenaJudge(ValueJudge(), seed=3, workers=3).score_group(TASK, *_group([5, 1, 9, 3, 7, 2, 8, 4]))
    assert [c.score for c in par] == [c.score for c in seq]
    slow = SlowCountingPolicy("VERDICT: TIE")
    arena = ArenaJudge(LLMPairwiseJudge(slow, cache_size=0), workers=3)
    arena.score_group(TASK, *_group(range(6)))
    assert slow.peak > 1 and arena.pop_metrics()["judge_calls"] == 12


# ---- issue 35.10: identical traces get identical rewards, whatever their arrival order
@pytest.mark.parametrize("where", range(8))
def test_identical_traces_get_identical_rewards_in_any_arrival_order(where):
    values = [3] * 7
    values.insert(where, 5)  # seven identical traces and one better one, the better one at every position
    judge = ValueJudge()
    out = ArenaJudge(judge).score_group(TASK, *_group(values))
    rewards = [c.score for c in out]
    assert rewards[where] == 1.0
    assert [r for k, r in enumerate(rewards) if k != where] == [0.0] * 7
    assert len(judge.log) == 1  # the copies are one node: one comparison decides the group


def test_traces_equal_after_whitespace_normalisation_are_one_node():
    comps = [Completion("3"), Completion(" 3\r\n"), Completion("5"), Completion("3  \n")]
    out = ArenaJudge(ValueJudge()).score_group(TASK, comps, [Verdict(score=0.0)] * 4)
    assert [c.score for c in out] == [0.0, 0.0, 1.0, 0.0]
    arena = ArenaJudge(ValueJudge())
    arena.score_group(TASK, *_group([3, 3, 3, 5]))
    assert arena.pop_metrics()["duplicate_traces"] == 2


def test_identical_traces_in_the_math_env_get_one_reward_and_an_empty_trace_does_not_win():
    env = JudgedEnv(lrmgym.make("Math-v0"), ArenaJudgeConfig().build())
    env.reset(seed=0)
    task = env.task  # "Compute 97 - 75."
    wrong = int(task.answer) + 1
    traces = [f"<think>97-75=21;21+1=23</think><answer>{wrong}</answer>"] * 7
    traces.append(f"<think></think><answer>{wrong}</answer>")
    assert [v.score for v in env.score_group(task, traces)] == [0.0] * 8  # no correct work anywhere: no signal
    traces[3] = f"<think>97-75=22</think><answer>{wrong}</answer>"  # one trace with a correct step
    scores = [v.score for v in env.score_group(task, traces)]
    assert scores[3] == 1.0
    assert scores[:3] + scores[4:7] == [scores[0]] * 6  # the six copies: one node, one reward
    assert scores[7] == pytest.approx(scores[0], abs=1e-6)  # the empty trace: level with them, not above


# ---- issue 35.9 (pairwise sibling): a trace that derails the judge earns no rank from it
class DerailedBy(ValueJudge):
    """ValueJudge that fails whenever the trace "0" is in the comparison (it derails the judge)."""

    def compare(self, task, first, second):
        if "0" in (first.text, second.text):
            self.log.append((int(first.text), int(second.text)))
            return None
        return super().compare(task, first, second)


@pytest.mark.parametrize("where", [0, 2, 3])
def test_a_trace_whose_every_comparison_failed_gets_the_bottom_reward_not_the_prior(where):
    values = [5, 1, 9]
    values.insert(where, 0)
    arena = ArenaJudge(DerailedBy(), tournament="round_robin")
    out = arena.score_group(TASK, *_group(values))
    rewards = dict(zip(values, [c.score for c in out], strict=True))
    assert rewards[0] == 0.0 and rewards[9] == 1.0 and rewards[1] == 0.0 and 0 < rewards[5] < 1
    assert "every comparison failed" in out[where].reason
    assert arena.stats()["failures"] == 1  # counted as the arena's failure on that completion


def test_a_dead_pairwise_judge_counts_every_routed_trace_as_failed():
    arena = ArenaJudge(ValueJudge(fail=True))
    out = arena.score_group(TASK, *_group(range(4)))
    assert [c.score for c in out] == [0.0] * 4 and arena.stats()["failures"] == 4


class Broken(ValueJudge):
    """A pairwise judge with bugs: it raises, or answers outside [0, 1] (NaN, 7), for some pairs."""

    def compare(self, task, first, second):
        a, b = int(first.text), int(second.text)
        self.log.append((a, b))
        if 0 in (a, b):
            raise RuntimeError("judge bug")
        if 4 in (a, b):
            return float("nan") if a == 4 else 7.0
        return 1.0 if a > b else 0.0 if a < b else 0.5


def test_a_pairwise_judge_that_raises_or_answers_out_of_range_fails_those_comparisons_only():
    arena = ArenaJudge(Broken(), tournament="round_robin")
    out = arena.score_group(TASK, *_group([5, 0, 9, 4, 1]))
    scores = dict(zip([5, 0, 9, 4, 1], [c.score for c in out], strict=True))
    assert scores[0] == 0.0 and scores[4] == 0.0 and scores[9] == 1.0 and scores[1] == 0.0 and 0 < scores[5] < 1
    assert arena.pop_metrics()["judge_failures"] == 7  # every pair with the 0 or the 4


# ---- pool_keep="best": a cross-step pool of the strongest traces per prompt
def test_a_best_pool_keeps_correct_then_strongest_not_newest():
    from lrmgym.judges.arena import _Pool

    members = [Completion(str(v)) for v in range(5)]
    comps = [(0, 1, 1.0), (1, 0, 0.0)]
    strengths = np.array([3.0, 0.5, -1.0, 2.0, 0.0])
    correct = [False, False, True, False, False]
    pool = _Pool(members, comps, strengths, correct).trimmed(2, keep="best")
    # Correct first (node 2, weakest but correct), then the strongest wrong one (node 0); kept in pool order.
    assert [m.text for m in pool.members] == ["0", "2"]
    assert pool.correct == [False, True] and pool.strengths.tolist() == [3.0, -1.0]
    assert pool.comparisons == []  # node 1, the other end of the only comparison, was dropped
    recent = _Pool(members, comps, strengths, correct).trimmed(2, keep="recent")
    assert [m.text for m in recent.members] == ["3", "4"]


def test_a_best_pool_breaks_strength_ties_towards_the_newer_trace_and_keeps_a_full_pool_whole():
    from lrmgym.judges.arena import _Pool

    members = [Completion(str(v)) for v in range(4)]
    pool = _Pool(members, [(0, 3, 0.5), (3, 0, 0.5)], np.zeros(4), [False] * 4)
    assert [m.text for m in pool.trimmed(2, keep="best").members] == ["2", "3"]
    # Trim only above the size: a pool of exactly pool_size members is kept whole (`<=`, not `<`).
    assert pool.trimmed(4, keep="best") is pool
    assert len(pool.trimmed(3, keep="best").members) == 3


def test_a_later_group_of_the_same_prompt_meets_the_best_kept_anchors_and_only_it_is_rewarded():
    judge = ValueJudge()
    arena = ArenaJudge(judge, pool="prompt", pool_size=2, pool_keep="best")
    arena.score_group(TASK, *_group([5, 1, 9, 3]))  # step 1: strengths rank 9 > 5 > 3 > 1
    assert [m.text for m in arena._pools[TASK.id].members] == ["5", "9"]  # the two strongest, not 9 and 3
    judge.log.clear()
    out = arena.score_group(TASK, *_group([7, 2]))  # step 2, the same prompt
    met_by_7 = {a if b == 7 else b for a, b in judge.log[:2]}  # 7 arrives first: it meets the pool only
    assert met_by_7 == {5, 9} and len(judge.log) == 5  # the kept anchors, not step 1's newest; then 2 meets 3
    # The fit has the anchors as nodes (4 nodes), but only the group's own two traces get rewards: 7 > 2.
    assert len(out) == 2 and [c.score for c in out] == [1.0, 0.0]
    kept = arena._pools[TASK.id]
    assert sorted(m.text for m in kept.members) == ["7", "9"]
    comps = [(kept.members[i].text, kept.members[j].text, y) for i, j, y in kept.comparisons]
    assert ("7", "9", 0.0) in comps and ("9", "7", 1.0) in comps


def test_the_bt_fit_of_a_pooled_group_includes_the_anchors_as_nodes():
    judge = ValueJudge()
    arena = ArenaJudge(judge, pool="prompt", pool_size=8, pool_keep="best")
    arena.score_group(TASK, *_group([4, 6]))
    out = arena.score_group(TASK, *_group([5, 3]))
    # By hand: nodes 4, 6, 5, 3; comparisons 6>4, 5 meets 6 and 4 (loses, wins), 3 meets 6, 5 and 4 (all lost).
    # The group's rewards are the joint fit's strengths of 5 and 3, min-max normalised between themselves.
    pool = arena._pools[TASK.id]
    index = {m.text: i for i, m in enumerate(pool.members)}
    fit = fit_bradley_terry(4, pool.comparisons, 1.0)
    assert fit.strengths[index["5"]] > fit.strengths[index["4"]] > fit.strengths[index["3"]]
    assert [c.score for c in out] == [1.0, 0.0]
    assert out[0].raw_score == pytest.approx(fit.strengths[index["5"]], abs=1e-6)
    assert out[1].raw_score == pytest.approx(fit.strengths[index["3"]], abs=1e-6)


def test_a_best_pool_prefers_verifier_correct_traces_across_steps():
    judge = ValueJudge()
    arena = ArenaJudge(judge, pool="prompt", pool_size=2, pool_keep="best")
    arena.score_group(TASK, *_group([1, 2], score=1.0, correct=True))  # an all-correct group
    arena.score_group(TASK, *_group([8, 9]))  # all wrong, judged stronger
    assert sorted(m.text for m in arena._pools[TASK.id].members) == ["1", "2"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"pool_keep": "best"}, "pool_keep='best' keeps traces across steps and needs pool='prompt'"),
        ({"pool": "prompt", "pool_keep": "oldest"}, "pool_keep must be 'recent' or 'best', got 'oldest'"),
    ],
)
def test_bad_pool_options_are_one_line_errors(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ArenaJudge(ValueJudge(), **kwargs)


def test_the_config_passes_pool_keep_and_refuses_it_without_a_prompt_pool():
    arena = ArenaJudgeConfig(pool="prompt", pool_keep="best").build()
    assert arena.pool_keep == "best"
    with pytest.raises(pydantic.ValidationError, match=re.escape("set pool: prompt")):
        ArenaJudgeConfig(pool_keep="best")
