import json
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
    from lrmgym.learners import update

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


def test_analyze_shift_names_the_merged_model_of_a_reason_maxxer_run(tmp_path):
    import torch

    from lrmgym.configs.resolve import resolve

    run = tmp_path / "rm"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(resolve(("env=math", "learner=reason_maxxer", "policy=tiny")).to_yaml())
    torch.save({"adapter": {}, "step": 4}, run / "checkpoints" / "step_000004.pt")
    result = CliRunner().invoke(cli, ["analyze", "shift", "--base", "tiny", "--rl", str(run), "env=math"])
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]
    assert line == (
        f"Error: --rl: {str(run)!r} is a reason_maxxer run, whose checkpoints hold only its LoRA adapter; it has no "
        f"merged model ({run / 'merged'}): train it with learner.merge=true, then give --rl {run / 'merged'}."
    )
    (run / "merged").mkdir()
    (run / "merged" / "config.json").write_text("{}")
    result = CliRunner().invoke(cli, ["analyze", "shift", "--base", "tiny", "--rl", str(run), "env=math"])
    line = result.output.strip().splitlines()[-1]
    assert line == (
        f"Error: --rl: {str(run)!r} is a reason_maxxer run, whose checkpoints hold only its LoRA adapter; give its "
        f"merged model: --rl {run / 'merged'}."
    )
