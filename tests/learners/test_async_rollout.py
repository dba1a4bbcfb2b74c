"""Rollouts in a second process: same data as the synchronous loop, one step of lag, no process left behind."""

from __future__ import annotations

import json
import os
import time

import pytest
from learner_helpers import CountAEnv, make_loop, register_test_env, run_config

from lrmgym.compose import train
from lrmgym.learners.algorithms.grpo import GRPOConfig
from lrmgym.learners.engine.async_rollout import RolloutWorker, RolloutWorkerError
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
    from lrmgym.learners.algorithms.grpo import GRPO  # noqa: F401  (the trainer's imports, as in a real run)

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
    from lrmgym.learners.engine import onpolicy

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


def test_the_trainer_holds_the_run_directory_lock_for_itself_and_its_rollout_worker(tmp_path, monkeypatch):
    from learner_helpers import lock_seen_from_another_process

    from lrmgym.learners.engine.loop import Loop

    seen, real = [], Loop.train_step

    def step_and_look(self):
        out = real(self)
        if self.step == 2:  # the worker is sampling step 3 now
            assert _alive(self.algorithm.worker.pid)
            seen.append(lock_seen_from_another_process(tmp_path))
        return out

    monkeypatch.setattr(Loop, "train_step", step_and_look)
    train(run_config(_learner(async_rollouts=True)), tmp_path, resume=False)
    assert len(seen) == 1 and seen[0].startswith(f"'{tmp_path}' is in use: process {os.getpid()} is training in it")
    assert lock_seen_from_another_process(tmp_path) == "free"  # released when the run ended
    assert not (tmp_path / "run.lock").exists()


# ------------------------------------------------------------------------------------------------ a lost worker
def _bare_worker(**kw) -> RolloutWorker:
    """A worker with no env or policy (``dict`` builds each): cheap to start, for the tests that kill it."""
    return RolloutWorker(dict, dict, threads=1, **kw)


def _signal(pid: int, name: str = "SIGKILL") -> None:
    import signal

    os.kill(pid, getattr(signal, name))


@pytest.mark.parametrize("when", ["start-up", "idle", "sending", "waiting"])
def test_a_killed_worker_is_reported_wherever_it_dies(when):
    # SIGKILL at each point the trainer talks to the worker: while it starts; between rollouts (the next submit's
    # send meets a closed pipe: a BrokenPipeError that click swallowed as a closed stdout, exit 1 with no
    # message); in the middle of sending the weights; while the trainer waits for the result (the 40-line
    # traceback). A stopped worker first, where a fast reply could otherwise beat the kill.
    import threading

    from lrmgym.learners.engine.async_rollout import RolloutWorkerLost

    sampling = SamplingParams(max_new_tokens=4)
    worker = _bare_worker()
    try:
        if when != "start-up":
            worker.wait_ready()
        if when in ("sending", "waiting"):
            _signal(worker.pid, "SIGSTOP")
        if when == "sending":  # a stopped worker drains nothing, so this send blocks until the kill breaks the pipe
            threading.Timer(0.5, _signal, (worker.pid,)).start()
            with pytest.raises(RolloutWorkerLost, match=r"was killed by SIGKILL during sending a rollout request"):
                worker.submit(None, [], 2, sampling, None, state=b"x" * (32 << 20))
        else:
            if when == "waiting":
                worker.submit(None, [], 2, sampling, None)
            _signal(worker.pid)
            if when == "idle":
                worker._process.join(timeout=30)  # gone: its end of the pipe is closed
            during = {"start-up": "start-up", "idle": "sending a rollout request", "waiting": "rollout"}[when]
            with pytest.raises(RolloutWorkerLost, match=rf"^The rollout worker \(pid \d+\) was killed by SIGKILL "
                               rf"during {during} \(the out-of-memory killer, or a kill -9\)\.$"):  # fmt: skip
                worker.submit(None, [], 2, sampling, None) if when != "waiting" else worker.result()
        assert not worker.pending and worker._process.exitcode is not None
    finally:
        worker.close()


class _SlowCountA(CountAEnv):
    """The count-a env with a slow grader: a rollout of 4 completions takes over 3 s."""

    def verify(self, task, completion):
        time.sleep(0.8)
        return super().verify(task, completion)


def test_a_stopped_worker_is_noticed_within_the_bound_and_a_busy_one_is_not():
    # The bound counts the worker's heartbeats, not the rollout's length: a rollout longer than the bound is
    # fine; a stopped worker is given up within the bound (not waited on forever) and killed.
    import gymnasium

    import lrmgym
    from lrmgym.learners.engine.async_rollout import RolloutWorkerLost

    if "lrmgym/SlowCountA-v0" not in gymnasium.registry:
        lrmgym.register("lrmgym/SlowCountA-v0", "test_async_rollout:_SlowCountA")
    cfg = run_config(_learner(), env_id="lrmgym/SlowCountA-v0")
    worker = RolloutWorker(*_builders(cfg), env_id=cfg.env.id, threads=1, stall_s=2.0)
    try:
        tasks = [_SlowCountA().task_at(i) for i in range(2)]
        worker.wait_ready()
        start = time.monotonic()
        worker.submit(None, tasks, 2, SamplingParams(max_new_tokens=4), None)
        assert len(worker.result().groups) == 2 and time.monotonic() - start > 3.0

        _signal(worker.pid, "SIGSTOP")
        worker.submit(None, tasks, 2, SamplingParams(max_new_tokens=4), None)
        start = time.monotonic()
        with pytest.raises(RolloutWorkerLost, match=r"is stopped \(SIGSTOP or Ctrl-Z\): no sign of life for 2 s "
                           r"during rollout; it was killed\.$"):  # fmt: skip
            worker.result()
        assert 1.9 <= time.monotonic() - start < 30  # the bound, not forever (generous above: a loaded machine)
        assert worker._process.exitcode is not None  # not left behind, stopped
    finally:
        worker.close()


def test_a_request_that_does_not_pickle_raises_in_the_trainer():
    # Pickled before the watched send: the error is the trainer's to see, not a rollout that never comes.
    import pickle

    worker = _bare_worker()
    try:
        worker.wait_ready()
        with pytest.raises((pickle.PicklingError, TypeError, AttributeError)):
            worker.submit(None, [lambda: None], 2, SamplingParams(max_new_tokens=4), None)
        assert not worker.pending
    finally:
        worker.close()


_SCRIPT_HEAD = """
import lrmgym
from lrmgym.compose import train
from lrmgym.configs.resolve import resolve
from lrmgym.envs.echo import EchoEnv
"""
_SCRIPT_TRAIN = """
cfg = resolve([ENV, "learner=grpo", "learner.steps=1", "learner.prompts_per_step=2", "learner.group_size=2",
               "learner.max_new_tokens=4", "learner.eval_before_after=false", "learner.progress=false"])
print("steps", train(cfg, "runs/mine")["steps"])
"""


def _run_script(tmp_path, source: str):
    import subprocess
    import sys

    script = tmp_path / "train_me.py"
    script.write_text(source)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env
    )


@pytest.mark.timeout(900)  # a training script in a subprocess: minutes on a loaded 2-core machine
def test_a_script_without_a_main_guard_trains_with_async_rollouts(tmp_path):
    # The worker is spawned; spawning re-imports __main__, which here would start training again inside the
    # worker. Nothing the worker needs lives in the script, so it starts without it.
    done = _run_script(tmp_path, _SCRIPT_HEAD + "ENV = 'env=echo'\n" + _SCRIPT_TRAIN)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "steps 1"


@pytest.mark.timeout(900)  # a training script in a subprocess: minutes on a loaded 2-core machine
def test_a_script_whose_env_needs_the_main_guard_is_told_so(tmp_path):
    # An env class defined in the script: the worker must import the script to rebuild it, so the script's top
    # level runs again there; without the guard that fails, and the message names the fix.
    source = (
        _SCRIPT_HEAD
        + "class MyEcho(EchoEnv):\n    pass\n\n"
        + "lrmgym.register('lrmgym/MyEcho-v0', MyEcho)\nENV = 'env=MyEcho-v0'\n"
        + _SCRIPT_TRAIN
    )
    done = _run_script(tmp_path, source)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("lrmgym.learners.engine.async_rollout.RolloutWorkerError: The rollout worker (pid ")
    assert last.endswith(
        f"could not start: it re-imports {tmp_path / 'train_me.py'} for the objects defined there, so that script's "
        'training code must sit under `if __name__ == "__main__":` (or set learner.async_rollouts=false).'
    )


def test_async_rollouts_are_refused_on_a_gpu(tmp_path, monkeypatch):
    """The worker would build a second copy of the model on the same GPU: refused with its fix, no worker started."""
    import torch

    from lrmgym.learners.engine import onpolicy

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


def _quarter_judge():
    """A custom judge: every completion earns 0.25, whatever the env's verifier says."""
    from lrmgym.judges.base import BaseJudge

    class Quarter(BaseJudge):
        name = "quarter"

        def _score(self, task, completion, verdict):
            return 0.25, "a quarter", False

    return Quarter()


def test_a_replaced_env_is_what_an_async_run_samples_and_grades(tmp_path, capsys):
    # The README's recipe: build the context, wrap its env in a judge of one's own, run the loop. The rollout
    # worker builds its env from ctx.make_env, which still builds the unwrapped one: the run must either use
    # the env it was handed or refuse, never train on the old reward.
    from lrmgym.compose import build_context
    from lrmgym.judges.base import JudgedEnv

    cfg = run_config(_learner(async_rollouts=True, steps=2))
    ctx = build_context(cfg, tmp_path)
    ctx.env = JudgedEnv(ctx.env, [_quarter_judge()])
    loop = cfg.learner.build(ctx)
    loop.run()
    rewards = [m["reward/mean"] for m in _lines(tmp_path)]
    assert rewards == pytest.approx([0.25, 0.25])
    assert "ctx.env was replaced" in capsys.readouterr().out
    assert loop.algorithm.worker is None


def test_a_replaced_env_with_its_own_builder_keeps_async_rollouts(tmp_path):
    import functools

    from lrmgym.compose import build_context, build_env

    cfg = run_config(_learner(async_rollouts=True, steps=1))
    ctx = build_context(cfg, tmp_path)
    other = run_config(_learner(), ungradeable_marker="zzz")
    ctx.env = build_env(other)
    ctx.make_env = functools.partial(build_env, other)
    loop = cfg.learner.build(ctx)
    loop.run()
    assert loop.algorithm.worker is not None
