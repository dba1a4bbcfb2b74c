"""The GRPO loop end to end on a tiny random Llama and a dense-reward test env."""

from __future__ import annotations

import json

import pytest
from learner_helpers import register_test_env, run_config

from lrmgym.learners.grpo import GRPOConfig

register_test_env()


def _learner(**kw):
    base = dict(steps=3, prompts_per_step=4, group_size=4, max_new_tokens=8, eval_before_after=False,
                checkpoint_every=2, progress=False, lr=1e-3)
    base.update(kw)
    return GRPOConfig(**base)


def test_run_writes_the_run_directory(tmp_path):
    cfg = run_config(_learner())
    summary = cfg.learner.run(cfg, tmp_path, resume=False)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3]
    for key in ("reward/mean", "accuracy", "zero_variance_frac", "entropy", "length/mean", "kl_ref", "clip_frac",
                "tokens_per_s", "loss", "grad_norm"):
        assert key in lines[0], key
    assert lines[0]["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # the policy equals the reference before step 1
    assert lines[-1]["kl_ref"] > 0  # and has moved after two updates
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000002.pt", "step_000003.pt"]
    assert (tmp_path / "plots" / "metrics.png").stat().st_size > 1000
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "finished"
    assert summary["steps"] == 3
    samples = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 3 * 2 and len(samples[0]["trajectories"]) == 4


def test_run_refuses_to_overwrite(tmp_path):
    cfg = run_config(_learner(steps=1))
    cfg.learner.run(cfg, tmp_path, resume=False)
    with pytest.raises(FileExistsError):
        cfg.learner.run(cfg, tmp_path, resume=False)
