"""Resume verifies what it resumes: the config, the checkpoints and the metrics log (refuse, or repair and say so)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from learner_helpers import TEST_ENV_ID, register_test_env, save_tiny_hf

from lrmgym.cli.main import cli
from lrmgym.learners.engine.resume import check_config, ranges
from lrmgym.learners.engine.rundir import Checkpointer

register_test_env()
HERE = Path(__file__).resolve().parent
VOLATILE = ("time/", "tokens_per_s", "perf/")  # perf/*: FLOPs per second of wall time


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return save_tiny_hf(tmp_path_factory.mktemp("model") / "m", seed=1)


def _config(run_dir: Path, model: Path, steps: int, **learner) -> dict:
    from lrmgym.configs.resolve import resolve_dict

    base = dict(
        kind="grpo", steps=steps, prompts_per_step=4, group_size=4, max_new_tokens=8, eval_before_after=False,
        checkpoint_every=2, keep_checkpoints=2, progress=False, lr=3e-3, torch_threads=1,
    )  # fmt: skip
    raw = {
        "env": {"id": TEST_ENV_ID},
        "policy": {"kind": "hf", "model": str(model), "device": "cpu"},
        "learner": {**base, **learner},
        "eval": {"tasks": 4, "n": 1, "max_new_tokens": 8, "split": None},
        "run": {"seed": 3, "output_dir": str(run_dir.parent), "name": run_dir.name},
    }
    return resolve_dict(raw).to_dict()


def _write(run_dir: Path, cfg: dict) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))


def _resume(run_dir: Path):
    return CliRunner().invoke(cli, ["run", "--resume", str(run_dir)])


def _trained(run_dir: Path, model: Path, steps: int, **learner) -> dict:
    cfg = _config(run_dir, model, steps, **learner)
    _write(run_dir, cfg)
    result = _resume(run_dir)  # the first "resume" of a folder with no checkpoint starts it
    assert result.exit_code == 0, result.output
    return cfg


def _stable(run_dir: Path) -> list[dict]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in m.items() if not k.startswith(VOLATILE)} for m in lines]


def _error(result, code: int = 2) -> str:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    return result.output.strip().splitlines()[-1]


def test_config_with_keys_removed_is_refused(tmp_path, model):
    run = tmp_path / "run"
    cfg = _trained(run, model, steps=2)
    before = (run / "metrics.jsonl").read_text()
    del cfg["learner"]["lr"]
    del cfg["policy"]["dtype"]
    _write(run, cfg)
    line = _error(_resume(run))
    assert "config.yaml lacks learner.lr, policy.dtype" in line and "defaults" in line
    assert (run / "metrics.jsonl").read_text() == before


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("env", "ungradeable_marker", "zz"),
        ("policy", "dtype", "bfloat16"),
        ("learner", "lr", 0.5),
        ("eval", "tasks", 9),
    ],
)
def test_config_edits_that_change_the_experiment_are_refused(tmp_path, model, section, key, value):
    run = tmp_path / "run"
    cfg = _trained(run, model, steps=2)
    old = cfg[section][key]
    cfg[section][key] = value
    _write(run, cfg)
    line = _error(_resume(run))
    assert f"{section}.{key}: {old!r} -> {value!r}" in line and "start a new run" in line


def test_more_steps_on_resume_trains_on_and_evaluates_the_final_model(tmp_path, model):
    run = tmp_path / "run"
    cfg = _trained(run, model, steps=2, eval_before_after=True, eval_greedy=False)
    first = json.loads((run / "summary.json").read_text())
    assert first["evals"]["after"]["step"] == 2
    cfg["learner"]["steps"] = 4
    _write(run, cfg)
    result = CliRunner().invoke(cli, ["run", "--resume", str(run)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "resuming with changed learner.steps" in result.output
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["evals"]["after"]["step"] == 4  # not the old model's figures
    assert summary["evals"]["step_2"] == first["evals"]["after"]  # the earlier "after", kept under its step
    assert [m["step"] for m in _stable(run)] == [1, 2, 3, 4]


def test_a_truncated_metrics_log_goes_back_to_a_checkpoint_before_the_gap(tmp_path, model):
    reference, run = tmp_path / "reference", tmp_path / "run"
    _trained(reference, model, steps=6, keep_checkpoints=3)
    _trained(run, model, steps=6, keep_checkpoints=3)
    assert Checkpointer(run / "checkpoints").steps() == [2, 4, 6]
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run / "metrics.jsonl").write_text("".join(lines[:3]) + lines[3][:20])  # cut mid-line 4
    result = _resume(run)
    assert result.exit_code == 0, result.output
    assert "no line for steps 4-6 of the 6" in result.output and "checkpoint of step 2" in result.output
    assert _stable(run) == _stable(reference)  # every step once, and the same steps as the uninterrupted run
    assert "log_gaps" not in json.loads((run / "summary.json").read_text())


def test_a_gap_with_no_checkpoint_before_it_is_reported_and_recorded(tmp_path, model):
    run = tmp_path / "run"
    _trained(run, model, steps=4, keep_checkpoints=1)
    assert Checkpointer(run / "checkpoints").steps() == [4]
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run / "metrics.jsonl").write_text(lines[0] + lines[3] + lines[3])  # steps 2-3 lost, step 4 twice
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["learner"]["steps"] = 5
    _write(run, cfg)
    result = _resume(run)
    assert result.exit_code == 0, result.output
    assert "no line for steps 2-3" in result.output and "log_gaps" in result.output
    assert [m["step"] for m in _stable(run)] == [1, 4, 5]  # the duplicate dropped, the gap stays
    assert json.loads((run / "summary.json").read_text())["log_gaps"] == "2-3"


@pytest.mark.parametrize("damage", ["truncated", "garbled", "empty"])
def test_a_corrupt_newest_checkpoint_falls_back_to_the_older_one(tmp_path, model, damage):
    reference, run = tmp_path / "reference", tmp_path / "run"
    _trained(reference, model, steps=4)
    _trained(run, model, steps=4)
    newest = Checkpointer(run / "checkpoints").path(4)
    data = newest.read_bytes()
    newest.write_bytes(
        {"truncated": data[: len(data) // 2], "garbled": data[:100] + b"\x00" * 5000, "empty": b""}[damage]
    )
    stray = run / "checkpoints" / ".step_000006.pt.abcd1234.tmp"  # an interrupted write's leftover
    stray.write_bytes(b"partial")
    result = _resume(run)
    assert result.exit_code == 0, result.output
    assert "does not load" in result.output and "resuming from step_000002.pt" in result.output
    assert "removed 1 temporary file" in result.output and not stray.exists()
    assert (run / "checkpoints" / "step_000004.pt.corrupt").is_file()  # kept aside, not deleted
    assert _stable(run) == _stable(reference)  # steps 3-4 trained again, to the same result
    assert Checkpointer(run / "checkpoints").load_latest()["step"] == 4


def test_no_loadable_checkpoint_is_one_error_line(tmp_path, model):
    run = tmp_path / "run"
    _trained(run, model, steps=4)
    for step in Checkpointer(run / "checkpoints").steps():
        Checkpointer(run / "checkpoints").path(step).write_bytes(b"garbage")
    line = _error(_resume(run), code=1)
    assert "no checkpoint in" in line and "loads" in line and "start a new run" in line


def test_check_config_allows_budget_changes_and_options_a_newer_version_added():
    recorded = {"learner": {"steps": 10, "lr": 0.1, "betas": [0.9, 0.99]}, "env": {"id": "a"}}
    now = {"learner": {"steps": 20, "lr": 0.1, "betas": (0.9, 0.99)}, "env": {"id": "a"}}
    assert check_config(now, now, recorded) == (["learner.steps"], [])
    grown = {**now, "env": {"id": "a", "test_fraction": 0.1}}  # a field this version added: not in the record
    raw = {**now, "env": {"id": "a"}}  # nor in the old config.yaml
    changed, notes = check_config(raw, grown, recorded)
    assert changed == ["learner.steps"] and notes == ["options new since the run started, at their defaults: "
                                                      "env.test_fraction."]  # fmt: skip
    changed, notes = check_config(raw, grown, None)  # a run without run.json: a note, not a refusal
    assert changed == [] and "lacks env.test_fraction" in notes[0]
    assert ranges([1, 2, 3, 5, 7, 8]) == "1-3, 5, 7-8"


# ------------------------------------------------------------------------------------------ signals
_CLI = (
    "import sys; sys.path.insert(0, {here!r}); import learner_helpers; learner_helpers.register_test_env(); "
    "from lrmgym.cli.main import main; sys.argv = ['lrmgym', *sys.argv[1:]]; main()"
)


def _start(run_dir: Path, model: Path) -> subprocess.Popen:
    _write(run_dir, _config(run_dir, model, steps=500))
    cmd = [sys.executable, "-c", _CLI.format(here=str(HERE)), "run", "--resume", str(run_dir)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    metrics, deadline = run_dir / "metrics.jsonl", time.monotonic() + 180
    while (not metrics.exists() or len(metrics.read_text().splitlines()) < 2) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        time.sleep(0.02)
    return proc


def test_sigterm_saves_like_ctrl_c(tmp_path, model):
    run = tmp_path / "run"
    proc = _start(run, model)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()[-2000:]
    assert "SIGTERM: finishing the current step" in out.decode() and "Traceback" not in err.decode()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert Checkpointer(run / "checkpoints").load_latest()["step"] == summary["steps"]
    assert [m["step"] for m in _stable(run)] == list(range(1, summary["steps"] + 1))


def test_a_second_interrupt_still_leaves_a_resumable_run(tmp_path, model):
    run = tmp_path / "run"
    proc = _start(run, model)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err.decode(), err.decode()[-2000:]
    text = err.decode()
    assert "resume with: lrmgym run --resume" in text or "nothing to resume" in text
    state = Checkpointer(run / "checkpoints").load_latest()
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["learner"]["steps"] = (state["step"] if state else 0) + 1
    _write(run, cfg)
    result = _resume(run)
    assert result.exit_code == 0, result.output
    assert [m["step"] for m in _stable(run)] == list(range(1, cfg["learner"]["steps"] + 1))
