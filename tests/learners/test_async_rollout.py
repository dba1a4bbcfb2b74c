"""Rollouts in a second process: same data as the synchronous loop, one step of lag, no process left behind."""

from __future__ import annotations

import json
import os
import time

import pytest
from learner_helpers import make_loop, register_test_env, run_config

from lrmgym.compose import train
from lrmgym.learners.async_rollout import RolloutWorker, RolloutWorkerError
from lrmgym.learners.grpo import GRPOConfig
from lrmgym.policies.base import SamplingParams

register_test_env()


def _learner(**kw) -> GRPOConfig:
    base = dict(
        steps=3, prompts_per_step=4, group_size=4, max_new_tokens=8, eval_before_after=False, checkpoint_every=10,
        progress=False, lr=1e-3, torch_threads=1,
    )  # fmt: skip
    base.update(kw)
    return GRPOConfig(**base)


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def _lines(path) -> list[dict]:
    return [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]


def test_async_run_sees_the_same_data_as_the_synchronous_loop(tmp_path):
    # With a negligible learning rate the weights do not move, so the one-step lag changes nothing: both loops
    # must sample the same tasks with the same seeds, and the sampler's log-probs (the behaviour policy of the
    # async ratio) must equal the trainer's own.
    results = {}
    for mode in (False, True):
        cfg = run_config(_learner(async_rollouts=mode, lr=1e-12))
        loop = make_loop(cfg, tmp_path / str(mode))
        summary = loop.run()
        assert summary["status"] == "finished" and summary["steps"] == 3
        results[mode] = _lines(tmp_path / str(mode))
        if mode:
            assert loop.algorithm.worker is not None and not _alive(loop.algorithm.worker.pid)
    for sync, lagged in zip(results[False], results[True], strict=True):
        assert lagged["reward/mean"] == pytest.approx(sync["reward/mean"], abs=1e-9)
        assert lagged["length/mean"] == pytest.approx(sync["length/mean"], abs=1e-9)
        assert lagged["ratio_max"] == pytest.approx(1.0, abs=1e-3)
        assert "time/wait_s" in lagged and "time/wait_s" not in sync


def test_async_run_learns_with_lag_and_resumes(tmp_path):
    cfg = run_config(_learner(async_rollouts=True, steps=4, checkpoint_every=2))
    train(cfg, tmp_path, resume=False)
    lines = _lines(tmp_path)
    assert [m["step"] for m in lines] == [1, 2, 3, 4]
    assert lines[-1]["ratio_max"] > 1.0  # samples from the policy before the last update: the ratio moved
    # Resume from step 2's checkpoint: steps 3 and 4 run again, once each.
    (tmp_path / "checkpoints" / "step_000004.pt").unlink()
    train(cfg.model_copy(update={"learner": cfg.learner.model_copy(update={"steps": 4})}), tmp_path, resume=True)
    assert [m["step"] for m in _lines(tmp_path)] == [1, 2, 3, 4]


def _builders(cfg):
    import functools

    from lrmgym.compose import build_env, build_policy

    return functools.partial(build_env, cfg), functools.partial(build_policy, cfg)


def test_worker_errors_carry_the_workers_traceback(tmp_path):
    from lrmgym.policies.tiny import TinyPolicyConfig

    cfg = run_config(_learner())
    cfg.policy = TinyPolicyConfig(path=str(tmp_path / "nowhere"))
    worker = RolloutWorker(*_builders(cfg), env_id=cfg.env.id, threads=1)
    try:
        with pytest.raises(RolloutWorkerError, match="(?s)failed during start-up.*holds no tiny model"):
            worker.submit(None, [], 2, SamplingParams(), None)
        assert not _alive(worker.pid)
    finally:
        worker.close()


def test_worker_exits_when_the_trainer_goes_away():
    from lrmgym.learners.grpo import GRPO  # noqa: F401  (the trainer's imports, as in a real run)

    cfg = run_config(_learner())
    worker = RolloutWorker(*_builders(cfg), env_id=cfg.env.id, threads=1)
    try:
        worker._conn.close()  # what a trainer killed with SIGKILL leaves: the pipe's other end closes
        deadline = time.monotonic() + 60
        while _alive(worker.pid) and worker._process.exitcode is None and time.monotonic() < deadline:
            time.sleep(0.1)
        worker._process.join(timeout=5)
        assert worker._process.exitcode is not None
    finally:
        worker.close()


def test_sampler_logprobs_as_behaviour_policy_need_the_untempered_distribution():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"async_rollouts=true takes the sampler's log-probs .* temperature=0\.7"):
        _learner(async_rollouts=True, temperature=0.7)
    with pytest.raises(ValidationError, match=r"behavior_logprobs='sampler' .* top_p=0\.9"):
        _learner(behavior_logprobs="sampler", top_p=0.9)
    assert _learner(temperature=0.7).temperature == 0.7  # recomputed pi_old: any temperature


def test_one_cpu_runs_synchronously(tmp_path, monkeypatch, capsys):
    from lrmgym.learners import onpolicy

    monkeypatch.setattr(onpolicy, "usable_cpus", lambda: 1)
    cfg = run_config(_learner(async_rollouts=True, steps=1))
    loop = make_loop(cfg, tmp_path)
    loop.run()
    assert loop.algorithm.worker is None and "running synchronously" in capsys.readouterr().out
    assert "time/wait_s" not in _lines(tmp_path)[0]


def _stable(path) -> list[dict]:
    return [{k: v for k, v in m.items() if not k.startswith(("time/", "tokens_per_s", "perf/"))} for m in _lines(path)]


def test_a_resumed_async_run_matches_an_uninterrupted_one(tmp_path):
    # The checkpoint holds the weights the pending rollout was handed, so the resumed run samples its first
    # step exactly as the uninterrupted run did (it used to resample it with the newer weights).
    cfg = run_config(_learner(async_rollouts=True, steps=4, checkpoint_every=2, lr=3e-3))
    train(cfg, tmp_path / "a")
    train(cfg, tmp_path / "b")
    for name in ("step_000004.pt",):
        (tmp_path / "b" / "checkpoints" / name).unlink()  # as if killed after step 2's checkpoint
    train(cfg, tmp_path / "b", resume=True)
    a, b = _stable(tmp_path / "a"), _stable(tmp_path / "b")
    assert [m["step"] for m in b] == [1, 2, 3, 4]
    assert a[-1]["reward/mean"] != a[0]["reward/mean"] or a[-1]["loss"] != a[0]["loss"]  # it trained
    assert b == a


def test_async_rollouts_are_refused_on_a_gpu(tmp_path, monkeypatch):
    """The worker would build a second copy of the model on the same GPU: refused with its fix, no worker started."""
    import torch

    from lrmgym.learners import onpolicy

    class OnGPU(onpolicy.PolicyUpdater):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.device = torch.device("cuda", 0)  # as a policy on a GPU gives it

    monkeypatch.setattr(onpolicy, "PolicyUpdater", OnGPU)
    started = []
    monkeypatch.setattr(RolloutWorker, "for_context", classmethod(lambda cls, *a, **k: started.append(1)))
    loop = make_loop(run_config(_learner(async_rollouts=True)), tmp_path)
    with pytest.raises(ValueError, match=r"a second model on cuda:0 .* set learner.async_rollouts=false"):
        loop.algorithm.setup()
    assert not started
    make_loop(run_config(_learner(async_rollouts=False)), tmp_path / "sync", setup=True)  # synchronous: fine
