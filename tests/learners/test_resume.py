"""Crash safety: a run killed mid-way and resumed has one metrics line per step and matches an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from learner_helpers import TEST_ENV_ID, register_test_env, run_config, save_tiny_hf

from lrmgym.compose import train
from lrmgym.learners.algorithms.grpo import GRPOConfig
from lrmgym.learners.engine.loop import Loop

register_test_env()
HERE = Path(__file__).resolve().parent
VOLATILE = ("time/", "tokens_per_s", "perf/")  # perf/*: FLOPs per second of wall time


def _learner(steps: int = 5) -> GRPOConfig:
    return GRPOConfig(
        steps=steps, prompts_per_step=4, group_size=4, max_new_tokens=8, eval_before_after=False,
        checkpoint_every=2, progress=False, lr=3e-3, torch_threads=1,
    )  # fmt: skip


def _stable(path: Path) -> list[dict]:
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    return [{k: v for k, v in m.items() if not k.startswith(VOLATILE)} for m in lines]


def test_resume_after_crash_matches_uninterrupted(tmp_path, monkeypatch):
    cfg = run_config(_learner())
    train(cfg, tmp_path / "a", resume=False)

    original = Loop.train_step

    def crash_after_step_3(self):
        out = original(self)
        if self.step == 3:  # metrics line 3 is written, the last checkpoint is step 2
            raise RuntimeError("simulated crash")
        return out

    monkeypatch.setattr(Loop, "train_step", crash_after_step_3)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(cfg, tmp_path / "b", resume=False)
    assert [m["step"] for m in _stable(tmp_path / "b" / "metrics.jsonl")] == [1, 2, 3]
    monkeypatch.setattr(Loop, "train_step", original)
    train(cfg, tmp_path / "b", resume=True)
    a, b = _stable(tmp_path / "a" / "metrics.jsonl"), _stable(tmp_path / "b" / "metrics.jsonl")
    assert [m["step"] for m in b] == [1, 2, 3, 4, 5]
    assert a[-1]["reward/mean"] != a[0]["reward/mean"]  # the runs really trained
    assert b == a  # same seed, same sampling seeds per step, restored RNG and optimizer: identical


def test_resume_without_checkpoint_starts_over(tmp_path):
    run_dir = tmp_path / "r"
    (run_dir).mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "x": 1}\n{"step": 2, "x"')  # torn line from a crash
    cfg = run_config(_learner(steps=2))
    train(cfg, run_dir, resume=True)
    assert [m["step"] for m in _stable(run_dir / "metrics.jsonl")] == [1, 2]


# A wrapper around the real CLI entry point that first registers the test env (the subprocess cannot see
# envs registered in this process). Everything else is `lrmgym run`.
_CLI = (
    "import sys; sys.path.insert(0, {here!r}); import learner_helpers; learner_helpers.register_test_env(); "
    "from lrmgym.cli.main import main; sys.argv = ['lrmgym', *sys.argv[1:]]; main()"
)


def _write_run_dir(run_dir: Path, model_dir: Path, steps: int) -> None:
    cfg = {
        "env": {"id": TEST_ENV_ID},
        "policy": {"kind": "hf", "model": str(model_dir), "device": "cpu"},
        "learner": {"kind": "grpo", **_learner(steps).model_dump(mode="json", exclude={"kind"})},
        "eval": {"tasks": 4, "n": 1, "max_new_tokens": 8, "split": None},
        "run": {"seed": 3, "output_dir": str(run_dir.parent), "name": run_dir.name},
    }
    from lrmgym.configs.resolve import resolve_dict

    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(resolve_dict(cfg).to_yaml())  # complete, as `lrmgym run` writes it


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-c", _CLI.format(here=str(HERE)), *args]


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_sigkill_mid_run_then_resume(tmp_path):
    model = save_tiny_hf(tmp_path / "model", seed=1)
    steps = 9
    for name in ("killed", "clean"):
        _write_run_dir(tmp_path / name, model, steps)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # The uninterrupted reference runs in this process (from the same config.yaml): one subprocess fewer.
    from lrmgym.configs.resolve import resolve_dict

    clean = resolve_dict(yaml.safe_load((tmp_path / "clean" / "config.yaml").read_text()))
    train(clean, tmp_path / "clean", resume=False)

    killed_dir = tmp_path / "killed"
    metrics = killed_dir / "metrics.jsonl"
    proc = subprocess.Popen(
        _cli("run", "--resume", str(killed_dir)), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 180
    while _lines(metrics) < 5 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed: " + proc.stderr.read().decode()[-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    before_resume = _lines(metrics)
    assert 5 <= before_resume < steps

    resumed = subprocess.run(_cli("run", "--resume", str(killed_dir)), env=env, capture_output=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr.decode()[-2000:]
    got, want = _stable(metrics), _stable(tmp_path / "clean" / "metrics.jsonl")
    assert [m["step"] for m in got] == list(range(1, steps + 1))  # none missing, none repeated
    assert got == want
    assert json.loads((killed_dir / "summary.json").read_text())["status"] == "finished"


def test_ctrl_c_saves_and_exits_cleanly(tmp_path):
    model = save_tiny_hf(tmp_path / "model", seed=1)
    run_dir = tmp_path / "run"
    _write_run_dir(run_dir, model, steps=500)
    proc = subprocess.Popen(_cli("run", "--resume", str(run_dir)), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    while _lines(run_dir / "metrics.jsonl") < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()[-2000:]
    assert "Traceback" not in err.decode()
    assert f"resume with: lrmgym run --resume {run_dir}" in err.decode()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    steps = [m["step"] for m in _stable(run_dir / "metrics.jsonl")]
    assert steps == list(range(1, summary["steps"] + 1)) and 2 <= summary["steps"] < 500
    assert (run_dir / "checkpoints" / f"step_{summary['steps']:06d}.pt").exists()


def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def test_resume_of_a_live_run_is_refused_naming_its_pid_then_works_after_sigkill(tmp_path):
    from click.testing import CliRunner

    from lrmgym.cli.main import cli

    model = save_tiny_hf(tmp_path / "model", seed=1)
    run_dir = tmp_path / "run"
    _write_run_dir(run_dir, model, steps=500)
    live = subprocess.Popen(_cli("run", "--resume", str(run_dir)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180
        while not list((run_dir / "checkpoints").glob("step_*.pt")) and live.poll() is None:
            assert time.monotonic() < deadline, "the live run saved no checkpoint in 180 s"
            time.sleep(0.02)
        assert live.poll() is None, live.stderr.read().decode()[-2000:]
        live.send_signal(signal.SIGSTOP)  # frozen, so that its own writes cannot change the files compared below
        before = _tree(run_dir)
        second = CliRunner().invoke(cli, ["run", "--resume", str(run_dir)])
        assert second.exit_code != 0, second.output
        assert second.output.strip().splitlines() == [
            f"Error: {str(run_dir)!r} is in use: process {live.pid} is training in it (it holds run.lock); two "
            f"writers would corrupt its logs and checkpoints. Wait for that run to end or stop it (kill {live.pid}), "
            "then resume."
        ]
        assert _tree(run_dir) == before  # nothing written
    finally:
        live.send_signal(signal.SIGKILL)
        live.wait(timeout=30)
    # The kernel released the dead run's lock: a resume continues it (to the checkpoint's step: a short run).
    done = max(int(p.stem.split("_")[1]) for p in (run_dir / "checkpoints").glob("step_*.pt"))
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    cfg["learner"]["steps"] = done + 1
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
    resumed = CliRunner().invoke(cli, ["run", "--resume", str(run_dir)])
    assert resumed.exit_code == 0, resumed.output
    assert [m["step"] for m in _stable(run_dir / "metrics.jsonl")] == list(range(1, done + 2))
    assert not (run_dir / "run.lock").exists()
