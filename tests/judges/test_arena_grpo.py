"""GRPO with the arena preset (``judge=arena``): routed and mixed groups in one step, and every arena metric logged.

``test_training.py`` checks that the arena's counters reach metrics.jsonl with ``route_when="always"``. Here the
arena runs with its shipped preset (route all-equal groups only, audit mixed groups) on an env built so that
every step has exactly one all-correct group and one mixed group, and a pairwise judge whose preferences are
known, so the logged values (routing fraction, judge calls, reward spread, audit agreement) and the rewards
the learner trained on can be checked exactly.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "learners"))  # the learner tests' fixtures

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from learner_helpers import run_config  # noqa: E402
from pydantic import BaseModel, ConfigDict  # noqa: E402

import lrmgym  # noqa: E402
from lrmgym.compose import train
from lrmgym.configs.resolve import load_preset  # noqa: E402
from lrmgym.core import Completion, Task, TextEnv, Verdict  # noqa: E402
from lrmgym.judges.arena import ArenaJudge, ArenaJudgeConfig  # noqa: E402
from lrmgym.learners.algorithms.grpo import GRPOConfig  # noqa: E402

ENV_ID = "lrmgym/ArenaRankTest-v0"
GROUP = 4


class RankEnv(TextEnv):
    """Even tasks: every completion is correct (an all-equal group). Odd tasks: the upper half of the group in
    text order is correct, the lower half wrong (always a mixed group), so routing is known in advance."""

    def make_task(self, index: int, rng: np.random.Generator) -> Task:
        return Task(id=f"rank/{index}", prompt=f"Q{index % 10}:", answer="", metadata={"all_correct": index % 2 == 0})

    def verify(self, task: Task, completion: Completion) -> Verdict:
        return Verdict(score=1.0, correct=True, reason="a single completion is the top of its group")

    def score_group(self, task: Task, completions: Sequence[Completion | str]) -> list[Verdict]:
        texts = [Completion.coerce(c).text for c in completions]
        if task.metadata["all_correct"]:
            return [Verdict(score=1.0, correct=True, reason="all correct") for _ in texts]
        order = sorted(range(len(texts)), key=lambda k: (texts[k], k))
        upper = set(order[len(texts) // 2 :])
        return [Verdict(score=float(k in upper), correct=k in upper, reason="rank") for k in range(len(texts))]


class TextOrderJudge:
    """Pairwise judge that prefers the text later in sorting order: it agrees with :class:`RankEnv`."""

    name = "text_order"

    def __init__(self) -> None:
        self.calls = 0

    def compare(self, task: Task, first: Completion, second: Completion) -> float:
        self.calls += 1
        return 1.0 if first.text > second.text else 0.0 if first.text < second.text else 0.5

    def stats(self) -> dict[str, float]:
        return {"calls": self.calls}


class PresetArenaConfig(BaseModel):
    """The shipped ``judge=arena`` preset, with the rule pairwise judge swapped for :class:`TextOrderJudge`."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["arena_preset_test"] = "arena_preset_test"
    weight: float = 1.0

    def build(self) -> ArenaJudge:
        arena = ArenaJudgeConfig(**load_preset("judge", "arena")).build()
        assert arena.route_when == "all_equal" and arena.audit_pairs == 2  # what the preset promises
        arena.pairwise = TextOrderJudge()
        return arena


if ENV_ID not in __import__("gymnasium").registry:
    lrmgym.register(ENV_ID, f"{__name__}:RankEnv")


@pytest.fixture(scope="module")
def arena_run(tmp_path_factory) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    learner = GRPOConfig(steps=2, prompts_per_step=2, group_size=GROUP, max_new_tokens=6, eval_before_after=False,
                         checkpoint_every=100, progress=False, lr=1e-3)  # fmt: skip
    cfg = run_config(learner, env_id=ENV_ID).model_copy(update={"judge": {"arena": PresetArenaConfig()}})
    run_dir = tmp_path_factory.mktemp("arena_grpo")
    train(cfg, run_dir, resume=False)
    read = lambda name: [json.loads(x) for x in (run_dir / name).read_text().splitlines()]  # noqa: E731
    return read("metrics.jsonl"), read("samples.jsonl")


def test_each_step_logs_the_routing_fraction_judge_calls_spread_and_audit(arena_run):
    metrics, _ = arena_run
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["judge/arena/groups"] == 2 and m["judge/arena/groups_routed"] == 1
        assert m["judge/arena/frac_routed"] == 0.5
        assert m["judge/arena/judge_calls"] == m["judge/arena/judge_calls_per_group"] == 3 * GROUP - 6
        assert m["judge/arena/groups_no_signal"] == 0
        assert 0.0 < m["judge/arena/routed_reward_std"] <= 0.5  # min-max rewards in [0, 1], not all equal
        # The audit: 2 correct-vs-wrong pairs of the mixed group, and this judge always sides with the verifier.
        assert m["judge/arena/audit_pairs"] == 2 and m["judge/arena/audit_calls"] == 2
        assert m["judge/arena/audit_agreement"] == 1.0
        assert m["zero_variance_frac"] == 0.0  # the all-correct group was given a signal to learn from


def test_routed_groups_train_on_tournament_rewards_and_mixed_groups_on_the_verifier(arena_run):
    _, samples = arena_run
    assert len(samples) == 4  # 2 groups per step, both logged
    for group in samples:
        texts = [t["turns"][-1]["text"] for t in group["trajectories"]]
        rewards = [t["reward"] for t in group["trajectories"]]
        by_text = [rewards[k] for k in sorted(range(GROUP), key=lambda k: (texts[k], k))]
        if group["task_id"].endswith(("/0", "/2")):  # all correct: routed; with G = 4 every pair is compared
            assert min(rewards) == 0.0 and max(rewards) == 1.0
            assert by_text == sorted(by_text)  # the judge's order, turned into rewards by Bradley-Terry
        else:  # mixed: the verifier's 0/1 rewards are kept
            assert by_text == [0.0, 0.0, 1.0, 1.0]
