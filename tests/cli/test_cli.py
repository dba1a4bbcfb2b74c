import json
import re
import shutil
import subprocess

import pytest
from click.testing import CliRunner

from lrmgym.cli.main import cli


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_console_script_help():
    exe = shutil.which("lrmgym")
    assert exe, "the lrmgym console script is not installed"
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    for command in ("run", "eval", "envs", "config"):
        assert f"  {command}" in out.stdout


def test_envs_list_and_show():
    result = invoke("envs", "list")
    assert result.exit_code == 0
    assert any(line.startswith("lrmgym/Echo-v0 ") and "[env=echo]" in line for line in result.output.splitlines())
    shown = invoke("envs", "show", "Echo-v0")
    assert shown.exit_code == 0
    assert "words = 3" in shown.output and "How many words the policy must repeat." in shown.output


def test_envs_sample_is_deterministic_and_json():
    a = invoke("envs", "sample", "Echo-v0", "--seed", "4", "-n", "2", "--json", "words=2")
    b = invoke("envs", "sample", "Echo-v0", "--seed", "4", "-n", "2", "--json", "words=2")
    assert a.exit_code == 0 and a.output == b.output
    rows = [json.loads(line) for line in a.output.splitlines()]
    assert len(rows) == 2 and len(rows[0]["answer"].split()) == 2
    assert invoke("envs", "sample", "Echo-v0", "--seed", "5", "-n", "2", "--json").output != a.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("envs", "show", "Ecoh-v0"), "Error: Unknown environment id 'Ecoh-v0'. Did you mean 'lrmgym/Echo-v0'?"),
        (
            ("envs", "sample", "Echo-v0", "words=0"),
            "Error: env.words: invalid value 0: expected an integer from 1 to 50.",
        ),
        (
            ("envs", "sample", "Echo-v0", "wrds=2"),
            "Error: env.wrds: unknown key (value 2); allowed: max_turns, words. Did you mean 'words'?",
        ),
        (
            ("envs", "sample", "Echo-v0", "oops"),
            "Error: 'oops' is not an env option: expected KEY=VALUE, e.g. difficulty=2.",
        ),
        (("config", "show", "env=echo", "policy=mock", "bogus"), "Error: 'bogus' is not an override"),
        (
            ("run", "--resume", "/nonexistent/run"),
            "Error: --resume: '/nonexistent/run/config.yaml' not found; expected a run directory made by `lrmgym run`.",
        ),
        (
            ("run", "--resume", "/tmp", "env=echo"),
            "Error: --resume continues a run with its saved config; remove the overrides env=echo",
        ),
    ],
)
def test_user_mistakes_exit_2_with_one_error_line(args, message):
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 2, result.output
    assert result.output.startswith(message), result.output
    assert "Traceback" not in result.output and result.output.count("\n") == 1


def test_config_show_prints_resolved_yaml():
    import yaml

    result = invoke("config", "show", "env=echo", "policy=mock", "env.words=4", "run.seed=9")
    assert result.exit_code == 0, result.output
    data = yaml.safe_load(result.output)
    assert data["env"] == {"id": "lrmgym/Echo-v0", "words": 4, "max_turns": 1}
    assert data["run"]["seed"] == 9 and data["policy"]["kind"] == "mock"


def test_config_presets_lists_groups():
    result = invoke("config", "presets")
    assert result.exit_code == 0 and result.output.splitlines()[0].startswith("env: ")


def test_missing_model_folder_is_a_user_error_and_leaves_no_run_behind(tmp_path):
    missing = tmp_path / "no-such-model"
    for args in (
        ["run", "env=echo", "policy=hf", f"policy.model={missing}", f"run.output_dir={tmp_path / 'runs'}"],
        ["eval", "env=echo", "policy=hf", f"policy.model={missing}", f"run.output_dir={tmp_path / 'runs'}"],
    ):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output
        assert result.output.splitlines()[-1].startswith(f"Error: policy.model='{missing}' is not a folder.")
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").iterdir()) == []


def test_judge_command_scores_exactly_the_listed_judges(tmp_path):
    """`lrmgym judge` adds no accuracy judge: a file without a verifier is still graded by format alone."""
    src = tmp_path / "in.jsonl"
    src.write_text(
        json.dumps({"prompt": "Q:1+1. A:", "completion": "<think>1+1=2</think><answer>2</answer>"})
        + "\n"
        + json.dumps({"prompt": "Q:1+1. A:", "completion": "<answer>2</answer> and more"})
        + "\n"
    )
    result = CliRunner().invoke(
        cli, ["judge", "--input", str(src), "--output", str(tmp_path / "out.jsonl"), "judge=format_strict"]
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["verdict"]["score"] for r in rows] == [1.0, 0.0]
    assert [c["name"] for c in rows[0]["verdict"]["components"]] == ["format_strict"]


def test_a_learner_setup_error_is_a_user_error_and_leaves_no_run_behind(tmp_path, monkeypatch):
    # The updater's own checks run in the learner's setup (learner.update_threads with a policy off the CPU: a
    # GPU this machine lacks, so the check's error is raised here as it would be there).
    from lrmgym.learners.engine import update

    def refuse(self, cfg, *args, **kwargs):
        raise ValueError(
            "learner.update_threads=2 runs the update's passes on CPU threads, but the policy is on cuda:0"
        )

    monkeypatch.setattr(update.PolicyUpdater, "__init__", refuse)
    runs = tmp_path / "runs"
    result = CliRunner().invoke(cli, ["run", "env=echo", "learner=grpo", "learner.steps=1", f"run.output_dir={runs}"])
    assert result.exit_code == 2, result.output
    assert (
        "Traceback" not in result.output and result.exception is not None and isinstance(result.exception, SystemExit)
    )
    assert result.output.splitlines()[-1].startswith("Error: learner.update_threads=2 runs the update's passes")
    assert not runs.exists() or list(runs.iterdir()) == []


def test_a_learner_with_a_policy_it_cannot_train_is_a_user_error(tmp_path):
    runs = tmp_path / "runs"
    args = ["run", "env=echo", "learner=grpo", "policy=openai", "policy.model=some-model", f"run.output_dir={runs}"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.output.splitlines()[-1].startswith("Error: learner=grpo needs a trainable policy")
    assert "Use policy=tiny or policy=hf." in result.output
    assert not runs.exists() or list(runs.iterdir()) == []


def test_a_refused_run_leaves_no_output_folder_it_made(tmp_path):
    runs = tmp_path / "new" / "runs"
    missing = tmp_path / "no-such-model"
    result = CliRunner().invoke(
        cli, ["run", "env=echo", "policy=hf", f"policy.model={missing}", f"run.output_dir={runs}"]
    )
    assert result.exit_code == 2 and "is not a folder" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # neither runs/ nor the new/ above it
    kept = tmp_path / "kept"
    kept.mkdir()
    result = CliRunner().invoke(
        cli, ["run", "env=echo", "policy=hf", f"policy.model={missing}", f"run.output_dir={kept}"]
    )
    assert result.exit_code == 2 and kept.is_dir()  # a folder that was there stays


@pytest.mark.parametrize(
    "text, where",
    [("env: {id: lrmgym/Math-v0\nlearner: [\n", "line 2, column 8"), ("env:\n  id: x\nlearner:\n  lr: [1\n", "line 5")],
)
def test_a_broken_config_yaml_on_resume_is_one_clear_line(tmp_path, text, where):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(text)
    result = CliRunner().invoke(cli, ["run", "--resume", str(run)])
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1, result.output
    line = result.output.strip()
    assert line.startswith(f"Error: --resume: {run / 'config.yaml'} is not valid YAML (") and where in line, line
    assert line.endswith("fix the file; run.json beside it holds the config the run was started with.")
    # analyze shift reads a run's config.yaml too
    result = CliRunner().invoke(cli, ["analyze", "shift", "--base", "tiny", "--rl", str(run), "env=math"])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert "is not valid YAML (" in result.output and where in result.output


@pytest.mark.parametrize(
    ("kind", "learner"),
    [("reason_maxxer", ("learner=reason_maxxer",)), ("kl_distill", ("learner=kl_distill", "learner.teacher=tiny"))],
)
def test_analyze_shift_names_the_merged_model_of_a_lora_learner_s_run(tmp_path, kind, learner):
    import torch

    from lrmgym.configs.resolve import resolve

    run = tmp_path / "rm"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(resolve(("env=math", *learner, "policy=tiny")).to_yaml())
    torch.save({"adapter": {}, "step": 4}, run / "checkpoints" / "step_000004.pt")
    result = CliRunner().invoke(cli, ["analyze", "shift", "--base", "tiny", "--rl", str(run), "env=math"])
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]
    assert line == (
        f"Error: --rl: {str(run)!r} is a {kind} run, whose checkpoints hold only its LoRA adapter; it has no "
        f"merged model ({run / 'merged'}): train it with learner.merge=true, then give --rl {run / 'merged'}."
    )
    (run / "merged").mkdir()
    (run / "merged" / "config.json").write_text("{}")
    result = CliRunner().invoke(cli, ["analyze", "shift", "--base", "tiny", "--rl", str(run), "env=math"])
    line = result.output.strip().splitlines()[-1]
    assert line == (
        f"Error: --rl: {str(run)!r} is a {kind} run, whose checkpoints hold only its LoRA adapter; give its "
        f"merged model: --rl {run / 'merged'}."
    )


# ------------------------------------------------------------------------------------------------ the environment
def _one_error_line(result, code: int, start: str) -> str:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit), result.output
    last = result.output.splitlines()[-1]
    assert last.startswith(start), last
    return last


def _cpu_only_torch(monkeypatch) -> None:
    import torch

    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.mark.parametrize("command", ["run", "eval"])
@pytest.mark.parametrize("device", ["cuda", "cuda:7", "mps"])
def test_a_device_this_machine_lacks_is_one_error_line(tmp_path, monkeypatch, command, device):
    # Before: a 64-line traceback ending in torch's AssertionError "Torch not compiled with CUDA enabled".
    import torch

    _cpu_only_torch(monkeypatch)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    runs = tmp_path / "runs"
    args = [command, "env=echo", f"policy.device={device}", f"run.output_dir={runs}"]
    _one_error_line(CliRunner().invoke(cli, args), 2, f"Error: policy.device='{device}': ")
    assert not runs.exists() or list(runs.iterdir()) == []


def test_eval_against_a_dead_openai_server_is_one_error_line(tmp_path):
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    runs = tmp_path / "runs"
    args = ["eval", "env=echo", "policy=openai", "policy.model=m", f"policy.base_url={url}", "policy.max_retries=0",
            "eval.tasks=2", "eval.n=1", f"run.output_dir={runs}"]  # fmt: skip
    last = _one_error_line(CliRunner().invoke(cli, args), 1, f"Error: policy=openai: {url}/completions failed")
    assert last.endswith(f"Is a server running at policy.base_url='{url}'? No results were kept."), last
    assert not runs.exists()  # the runs/ folder this eval made is removed with its results


@pytest.mark.parametrize("command", ["run", "eval"])
def test_a_policy_whose_package_is_missing_is_one_error_line(tmp_path, monkeypatch, command):
    import sys

    monkeypatch.setitem(sys.modules, "vllm", None)  # not importable, whether or not it is installed here
    runs = tmp_path / "runs"
    args = [command, "env=echo", "policy=vllm", "policy.model=m", f"run.output_dir={runs}"]
    last = _one_error_line(CliRunner().invoke(cli, args), 1, "Error: The vllm policy needs vLLM, which is not")
    assert "pip install 'lrmgym[vllm]'" in last
    assert not runs.exists() or list(runs.iterdir()) == []


def test_a_closed_stdout_is_said_on_stderr_and_not_taken_for_anything_else(tmp_path):
    # `lrmgym ... | head`: click ends with exit 1 and no word; one line on stderr says why (not a dead worker).
    import os
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    args = [sys.executable, "-m", "lrmgym.cli.main", "envs", "sample", "Echo-v0", "-n", "1000"]
    with open(tmp_path / "stderr.txt", "w+b") as err:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, env=env)
        proc.stdout.readline()
        proc.stdout.close()  # what `| head -1` does after its line
        assert proc.wait(timeout=120) == 1
        err.seek(0)
        text = err.read().decode()
    assert text == (
        "lrmgym stopped: its standard output was closed (its reader, e.g. `| head`, exited); redirect it to a file "
        "(> out.txt) to keep all of it.\n"
    ), text


# ------------------------------------------------------------------------------------------------ a lost rollout worker
_ASYNC_RUN = (
    "env=echo", "learner=grpo", "learner.async_rollouts=true", "learner.steps=4", "learner.prompts_per_step=2",
    "learner.group_size=2", "learner.max_new_tokens=6", "learner.eval_before_after=false", "learner.progress=false",
    "learner.checkpoint_every=1", "learner.time_budget_s=null", "learner.track_kl=false",
)  # fmt: skip


def test_a_killed_rollout_worker_is_one_error_line_with_the_resume_command(tmp_path, monkeypatch):
    # SIGKILL of the async worker (what the out-of-memory killer does) during step 3's collection: one line, exit
    # 1, naming what happened, the newest checkpoint and the exact resume command; and that command finishes it.
    import os
    import signal

    from lrmgym.learners.engine import onpolicy
    from lrmgym.learners.engine.async_rollout import RolloutWorker

    monkeypatch.setattr(onpolicy, "usable_cpus", lambda: 2)  # async even where this process may use one CPU
    results = {"calls": 0}
    original = RolloutWorker.result

    def result_then_kill(self):
        results["calls"] += 1
        if results["calls"] == 3:
            os.kill(self.pid, signal.SIGKILL)
        return original(self)

    monkeypatch.setattr(RolloutWorker, "result", result_then_kill)
    run_dir = tmp_path / "runs" / "r"
    result = CliRunner().invoke(cli, ["run", *_ASYNC_RUN, f"run.output_dir={tmp_path / 'runs'}", "run.name=r"])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    last = result.output.splitlines()[-1]
    assert re.fullmatch(
        r"Error: The rollout worker \(pid \d+\) was killed by SIGKILL during (rollout|sending a rollout request) "
        r"\(the out-of-memory killer, or a kill -9\)\. The run in (\S+) stopped; its newest checkpoint \(step 2\) is "
        rf"intact\. Resume with: lrmgym run --resume {re.escape(str(run_dir))}",
        last,
    ), last
    monkeypatch.setattr(RolloutWorker, "result", original)
    resumed = CliRunner().invoke(cli, ["run", "--resume", str(run_dir)])
    assert resumed.exit_code == 0, resumed.output
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_rollout_worker_killed_at_random_moments_always_gives_the_resume_line(tmp_path):
    # The real console entry point, the worker SIGKILLed at 10 seeded random moments of a run: every time exit 1
    # and, last on stderr, the one Error line with the resume command (before: a 40-line traceback, and in 3 of
    # 24 tries exit 1 with no message); then the last run folder resumes to the end.
    import os
    import random
    import signal
    import sys
    import time
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, "-m", "lrmgym.cli.main"]
    rng = random.Random(36)
    for attempt in range(10):
        run_dir = tmp_path / f"r{attempt}"
        args = [*command, "run", *_ASYNC_RUN, "learner.steps=40", f"run.output_dir={tmp_path}", f"run.name=r{attempt}"]
        with open(tmp_path / "stderr.txt", "w+b") as err:
            proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, env=env, text=True)
            for line in proc.stdout:
                if line.startswith("run directory:"):
                    break
            time.sleep(rng.uniform(0.0, 3.0))
            workers = _spawned_children(proc.pid)
            assert len(workers) == 1, workers
            os.kill(workers[0], signal.SIGKILL)
            proc.stdout.read()
            assert proc.wait(timeout=300) == 1
            err.seek(0)
            text = err.read().decode()
        assert "Traceback" not in text, text
        assert re.search(r"Error: The rollout worker \(pid \d+\) was killed by SIGKILL during .*\. Resume with: "
                         rf"lrmgym run --resume {re.escape(str(run_dir))}\n$", text), text  # fmt: skip
    resumed = subprocess.run([*command, "run", "--resume", str(run_dir)], capture_output=True, text=True, env=env)
    assert resumed.returncode == 0, resumed.stderr
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 41))


def _spawned_children(pid: int) -> list[int]:
    """The pids of ``pid``'s children started by multiprocessing's spawn (the rollout worker)."""
    from pathlib import Path

    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and b"spawn_main" in cmdline:
            found.append(int(stat.parent.name))
    return found
