"""The staged run (:class:`~lrmgym.learners.engine.staged.StagedRun`) with stand-in stages: weights, seeds, evals.

The stages here train nothing: each adds a constant to every weight, and its "evaluation" is the sum of the
weights, so where a stage started from and which evaluation it was handed are read off numbers.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lrmgym.learners.engine.common import derived_seed
from lrmgym.learners.engine.context import RunContext
from lrmgym.learners.engine.staged import StagedRun, StageRecord


def _weight_sum(model):
    return float(sum(float(p.detach().double().sum()) for p in model.parameters()))


class _Loop:
    def __init__(self, ctx, model, stage):
        self.ctx, self.model, self.stage = ctx, model, stage
        self.cfg = SimpleNamespace(eval_greedy=False)
        self.evals = {}

    def _eval(self, step):
        return {"sampled": {"tasks": 2, "n": self.ctx.eval.n, "accuracy": _weight_sum(self.model)}, "step": step}

    def run(self, resume=False):
        self.stage.seen = {"seed": self.ctx.seed, "handed_before": self.evals.get("before"),
                           "start_sum": _weight_sum(self.model)}  # fmt: skip
        self.evals.setdefault("before", self._eval(0))
        with torch.no_grad():
            for p in self.model.parameters():
                p.add_(self.stage.delta)  # in place, as an optimizer step is
        self.evals["after"] = self._eval(1)
        return {"evals": dict(self.evals), "steps": 1, "status": "finished"}


class _Stage:
    def __init__(self, name, delta, from_base=False):
        self.name, self.delta, self.from_base = name, delta, from_base
        self.seen = None

    def build(self, run, ctx):
        if self.from_base:
            run.load_base()
        return _Loop(ctx, run.model, self)

    def finish(self, run, ctx, loop, summary):
        return {}


def _ctx(tmp_path, seed=7):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    return RunContext(env=None, policy=SimpleNamespace(model=model), eval=SimpleNamespace(n=1), seed=seed,
                      run_dir=tmp_path)  # fmt: skip


def test_each_stage_after_the_first_gets_a_seed_of_its_own(tmp_path):
    # Kills: every stage run on the run's seed (a second RL stage replays the first one's stream and samples).
    ctx = _ctx(tmp_path)
    stages = [_Stage("a", 1.0), _Stage("b", 1.0), _Stage("c", 1.0)]
    StagedRun(ctx, stages).run()
    seeds = [s.seen["seed"] for s in stages]
    assert seeds == [7, derived_seed(7, 0x7374, 1), derived_seed(7, 0x7374, 2)]
    assert len(set(seeds)) == 3


def test_a_continuing_stage_is_handed_the_previous_stages_after_as_its_before(tmp_path):
    # Kills: the continuing stage handed the previous stage's "before" (or the first stage's) instead of its "after".
    ctx = _ctx(tmp_path)
    base = _weight_sum(ctx.policy.model)
    stages = [_Stage("a", 1.0), _Stage("b", 0.5), _Stage("c", 0.25)]
    summary = StagedRun(ctx, stages).run()
    n = 8  # weights and biases of Linear(3, 2)
    assert stages[0].seen["handed_before"] is None  # the first stage measures its own
    for k, stage in enumerate(stages[1:], 1):
        after = summary["stages"][k - 1]["after"]
        assert stage.seen["handed_before"] == {**after, "step": 0}
        assert stage.seen["start_sum"] == after["sampled"]["accuracy"]
    assert summary["stages"][2]["before"]["sampled"]["accuracy"] == pytest.approx(base + n * 1.5)


def test_a_stage_from_base_starts_from_the_base_weights_not_the_previous_stages(tmp_path):
    # Kills: the base copy sharing storage with the model (no copy), load_base not loading, and the SD-like
    # stage handed the previous stage's "after" as its "before".
    ctx = _ctx(tmp_path)
    base = {k: v.clone() for k, v in ctx.policy.model.state_dict().items()}
    stages = [_Stage("rl", 1.0), _Stage("sd", 0.5, from_base=True)]
    summary = StagedRun(ctx, stages).run()
    assert stages[1].seen["start_sum"] == sum(float(v.double().sum()) for v in base.values())
    assert summary["stages"][1]["start"] == "base"
    assert summary["stages"][1]["before"] == summary["stages"][0]["before"]  # the base's evaluation, handed on
    assert stages[1].seen["handed_before"] == {**summary["stages"][0]["before"], "step": 0}
    final = ctx.policy.model.state_dict()
    for k, v in base.items():
        torch.testing.assert_close(final[k], v + 0.5)  # base + the SD stage's own step, nothing of the RL stage


def test_load_base_restores_the_weights_the_run_was_built_with_after_in_place_training(tmp_path):
    ctx = _ctx(tmp_path)
    model = ctx.policy.model
    base = {k: v.clone() for k, v in model.state_dict().items()}
    run = StagedRun(ctx, [_Stage("rl", 1.0), _Stage("sd", 1.0, from_base=True)])
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0).add_(1.0)
    run.records.append(StageRecord(0, "rl", run.folder(0), {}, {}, "base"))
    run.start = "01-rl"
    run.load_base()
    for k, v in model.state_dict().items():
        assert torch.equal(v, base[k]), k
    assert run.start == "base"
