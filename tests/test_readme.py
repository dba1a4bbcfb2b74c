"""Every code block of README.md, as written: run (with a small budget where the real one takes minutes) or resolved
and parsed, with the output it states; or listed in :data:`SKIPPED` with the reason.

A block is known by its first line (:data:`BLOCKS`); a block that matches nothing fails
:func:`test_every_readme_block_is_tested_or_skipped_with_a_reason`, so a new example cannot go untested.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from lrmgym.cli.main import cli
from lrmgym.configs.resolve import resolve

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
RESULTS = REPO / "benchmarks" / "results" / "default_run.md"

SETUP_RUN = (
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 -e . "
    "&& lrmgym run env=math learner=grpo"
)
SETUP_TESTS = 'python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 -e ".[test]" && pytest -q'

BLOCKS: dict[str, Callable[[str], bool]] = {
    "first_example": lambda first: first.startswith("lrmgym run env=math judge=arena learner=grpo "),
    "setup_run": lambda first: first == SETUP_RUN,
    "setup_tests": lambda first: first == SETUP_TESTS,
    "tour": lambda first: first.startswith("lrmgym envs list "),
    "gymnasium": lambda first: first == "import gymnasium, lrmgym",
    "tool_use": lambda first: first == "import lrmgym",
    "python_training": lambda first: first.startswith("from lrmgym.compose import "),
    "openrlhf_export": lambda first: first.startswith("lrmgym export openrlhf "),
    "serve": lambda first: first.startswith("lrmgym serve "),
    "config_error": lambda first: first.startswith("$ lrmgym run env=math learner.lrr="),
    "own_data": lambda first: first.startswith("$ lrmgym run env=math env.source="),
    "eval_suites": lambda first: first.startswith("lrmgym eval eval=aime24 "),
    "entry_point_toml": lambda first: first == '[project.entry-points."lrmgym.envs"]',
    "layout": lambda first: first.startswith("lrmgym/core.py "),
    "rg": lambda first: first.startswith("lrmgym envs sample rg "),
    "testbed": lambda first: first.startswith("lrmgym tiny build --recipe testbed "),
}
"""Each README block by its first line; the test named after it runs it."""
SKIPPED = {
    "setup_run": "a fresh venv and pip install; its `lrmgym run env=math learner=grpo` (10 minutes) is pinned by "
    "test_readme_default_run_trains_the_steps_the_readme_states and the loop's tests",
    "setup_tests": "a fresh venv and pip install; .ci/run runs it word for word on a fresh clone",
    "rg": "needs reasoning-gym (the rg extra): tests/envs/rg/test_rg_cli.py::test_readme_rg_block runs it",
}
"""Blocks not executed here, with the reason."""
TINY_RUN = (
    "learner.steps=1", "learner.prompts_per_step=2", "learner.group_size=2", "learner.max_new_tokens=8",
    "learner.progress=false",
)  # fmt: skip
"""Overrides that shrink a README training command to one small step (the commands themselves take minutes)."""


def readme_blocks() -> list[tuple[str, str]]:
    """``(language, text)`` of each fenced block of README.md, in order."""
    text = README.read_text(encoding="utf-8")
    return [(m["lang"], m["body"]) for m in re.finditer(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```$", text, re.M | re.S)]


def _first_line(text: str) -> str:
    return next(line.strip() for line in text.splitlines() if line.strip())


def block(name: str) -> str:
    """The README block called ``name`` in :data:`BLOCKS` (exactly one must match)."""
    found = [text for _, text in readme_blocks() if BLOCKS[name](_first_line(text))]
    assert len(found) == 1, f"README.md has {len(found)} blocks matching {name!r}"
    return found[0]


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_every_readme_block_is_tested_or_skipped_with_a_reason():
    blocks = readme_blocks()
    assert len(blocks) >= len(BLOCKS)
    for _, text in blocks:
        names = [name for name, matches in BLOCKS.items() if matches(_first_line(text))]
        assert len(names) == 1, f"README block starting {_first_line(text)!r} is neither tested nor skipped"
    for name in BLOCKS:
        assert name in SKIPPED or callable(globals().get(f"test_readme_{name}")), name
        block(name)


def test_readme_setup_commands_are_word_for_word():
    texts = [text.strip() for _, text in readme_blocks()]
    assert SETUP_RUN in texts and SETUP_TESTS in texts


# ------------------------------------------------------------------------------------------------ the commands
@pytest.mark.timeout(900)  # whole training runs in subprocesses: minutes on a loaded 2-core machine
def test_readme_first_example(tmp_path):
    args = shlex.split(block("first_example"))
    assert args[:2] == ["lrmgym", "run"] and "policy=hf" in args
    out = f"run.output_dir={tmp_path / 'runs'}"
    # As written: /path/to/model is a placeholder, and the message says what to put there.
    done = CliRunner().invoke(cli, [*args[1:], out])
    assert done.exit_code == 2 and done.output.splitlines()[-1].startswith(
        "Error: policy.model='/path/to/model' is not a folder. Point it at a folder with config.json and the weights"
    )
    # Without policy=hf (the README's old first line) the message names the token to add.
    done = CliRunner().invoke(cli, [*(a for a in args[1:] if a != "policy=hf"), out])
    assert done.exit_code == 2 and done.output.splitlines()[-1].startswith("Error: policy.model: unknown key")
    assert done.output.splitlines()[-1].endswith("policy.model needs policy=hf (or openai, vllm): add policy=hf.")
    # With a model folder in its place: one small step, arena judge and all.
    sys.path.insert(0, str(REPO / "tests" / "learners"))
    from learner_helpers import save_tiny_hf

    model = save_tiny_hf(tmp_path / "model")
    tokens = [a.replace("/path/to/model", str(model)) for a in args[2:]]
    small = (*TINY_RUN, "learner.eval_before_after=false", "learner.async_rollouts=false")
    done = CliRunner().invoke(cli, ["run", *tokens, *small, out, "run.name=x"])
    assert done.exit_code == 0, done.output
    summary = json.loads((tmp_path / "runs" / "x" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == 1


def test_readme_default_run_trains_the_steps_the_readme_states():
    tokens = SETUP_RUN.split("lrmgym run ", 1)[1].split()
    learner = resolve(tokens).learner
    tour = README.read_text(encoding="utf-8").split("## A tour", 1)[1]
    stated = re.search(r"trains the tiny model .*? for ([\d ]+) GRPO steps", tour, re.S)
    assert stated, "the tour no longer states the default run's step count"
    assert learner.steps == int(stated[1].replace(" ", "")) and learner.time_budget_s is None


def test_readme_starting_accuracy_is_the_measured_one():
    # The tour's "From X % accuracy at temperature 1 (Y % greedy)" against the newest full default run recorded.
    tables = re.findall(r"^\| 500 held-out tasks \(test split\) \|.*?(?=^$)", RESULTS.read_text(), re.M | re.S)
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in tables[-1].splitlines()}
    t1 = re.match(r"([\d.]+) %", rows["temperature 1, avg@4 (95 % CI)"])[1]
    greedy = re.match(r"([\d.]+) %", rows["greedy"])[1]
    tour = README.read_text(encoding="utf-8").split("## A tour", 1)[1]
    assert f"From {t1} % accuracy at temperature 1 ({greedy} % greedy)" in " ".join(tour.split())


def _parse(args: list[str]) -> Any:
    """Parse ``lrmgym ARGS`` with click down to the leaf command, as the shell would run it; returns its context."""
    ctx = cli.make_context("lrmgym", list(args), resilient_parsing=False)
    command = cli
    while hasattr(command, "resolve_command"):
        name, command, rest = command.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
        ctx = command.make_context(name, rest, parent=ctx)
    return ctx


def _overrides(args: list[str]) -> list[str]:
    return [a for a in args if re.match(r"^[A-Za-z_][\w.-]*=", a) and not a.startswith("-")]


RUN_AS_WRITTEN = {("envs", "list"), ("envs", "show"), ("envs", "sample"), ("config", "presets"), ("config", "show")}
"""Tour lines that run in a second as written."""


def test_readme_tour(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lines = [line for line in block("tour").splitlines() if line.strip()]
    for line in lines:
        args = shlex.split(line, comments=True)
        assert args[0] == "lrmgym", line
        ctx = _parse(args[1:])  # every line parses: its command and options exist
        assert ctx.command.name, line
        if tuple(args[1:3]) in RUN_AS_WRITTEN:
            done = invoke(*args[1:])
            assert done.exit_code == 0 and done.output.strip(), line
            if args[1:3] == ["config", "show"]:
                assert yaml.safe_load(done.output)["learner"]["lr"] == 1e-4
        elif _overrides(args) and args[1] in ("run", "eval", "judge", "analyze"):
            resolve(_overrides(args))  # the config of the line resolves as written
    eval_line = next(shlex.split(line, comments=True) for line in lines if line.startswith("lrmgym eval "))
    done = invoke(*eval_line[1:], "eval.tasks=2", f"run.output_dir={tmp_path}", "run.name=e")
    assert done.exit_code == 0, done.output
    report = json.loads((tmp_path / "e" / "eval.json").read_text())
    assert report["n"] == 8 and sorted(report["pass@k"]) == ["pass@1", "pass@4", "pass@8"]


@pytest.mark.timeout(900)
def test_readme_testbed(tmp_path, monkeypatch):
    # Every line parses; the sample runs as written; the runs resolve to the testbed model and env; one small GRPO
    # step of the first run (with a small model folder in place of the testbed model's 12-minute build).
    monkeypatch.chdir(tmp_path)
    lines = [shlex.split(line, comments=True) for line in block("testbed").splitlines() if line.strip()]
    runs = []
    for args in lines:
        if args[0] == "python":
            script = REPO / args[1]
            done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=300,
                                  env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
            assert done.returncode == 0 and all(a in done.stdout for a in args[2:] if a.startswith("--")), done
            continue
        assert args[0] == "lrmgym" and _parse(args[1:]).command.name
        if args[1:3] == ["envs", "sample"]:
            done = invoke(*args[1:])
            assert done.exit_code == 0 and done.output.count("prompt: Q:Compute ") == 3, done.output
        if args[1] == "run":
            cfg = resolve(_overrides(args))
            assert cfg.env.id == "lrmgym/Testbed-v0" and cfg.policy.train.env == "lrmgym/Testbed-v0"
            runs.append(args)
    assert any(resolve(_overrides(a)).policy.sample_dtype == "bfloat16" for a in runs)
    sys.path.insert(0, str(REPO / "tests" / "learners"))
    from learner_helpers import save_tiny_hf

    model = save_tiny_hf(tmp_path / "model")
    small = (*TINY_RUN, "learner.eval_before_after=false", "learner.async_rollouts=false", f"policy.path={model}")
    done = invoke(*runs[0][1:], *small, f"run.output_dir={tmp_path}", "run.name=t")
    assert done.exit_code == 0, done.output
    assert json.loads((tmp_path / "t" / "summary.json").read_text())["steps"] == 1


def test_readme_config_error(tmp_path):
    command, stated = block("config_error").strip().splitlines()
    args = shlex.split(command.removeprefix("$ "))
    done = CliRunner().invoke(cli, [*args[1:], f"run.output_dir={tmp_path}"])
    assert done.exit_code == 2
    pattern = ".*".join(re.escape(part) for part in stated.split("..."))
    assert re.fullmatch(pattern, done.output.strip().splitlines()[-1]), done.output


def test_readme_own_data(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = shlex.split(block("own_data").strip().removeprefix("$ "))
    rows = [{"problem": f"What is {i} + {i}?", "solution": str(2 * i)} for i in range(40)]
    (tmp_path / "my.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = resolve(args[2:])
    assert cfg.env.options["question_field"] == "problem" and cfg.env.options["answer_field"] == "solution"
    done = invoke("config", "show", *args[2:])
    assert done.exit_code == 0 and yaml.safe_load(done.output)["env"]["source"] == "my.jsonl"


def test_readme_eval_suites(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the commands read the fixtures by their path from the checkout's root
    lines = [line for line in block("eval_suites").splitlines() if line.strip()]
    assert len(lines) == 4
    for i, line in enumerate(lines):
        args = shlex.split(line)
        done = invoke(*args[1:], f"run.output_dir={tmp_path}", f"run.name=s{i}")  # as written, into tmp_path
        assert done.exit_code == 0, done.output
        summary = json.loads((tmp_path / f"s{i}" / "suites.json").read_text())
        suites = [row["suite"] for row in summary["suites"]]
        assert suites == (["aime24", "aime25"] if i == 3 else [args[2].removeprefix("eval=")])
        assert all(len(row[f"avg@{row['n']}"]["ci"]) == 2 for row in summary["suites"])


def test_readme_openrlhf_export(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    export, launch = block("openrlhf_export").replace("\\\n", " ").strip().splitlines()
    args = shlex.split(export, comments=True)
    # The README's learner trains 3000 x 32 prompts: the same command with 2 steps writes 64 rows, not 96 000.
    done = invoke(*args[1:], "learner.steps=2")
    assert done.exit_code == 0, done.output
    assert done.output.strip().endswith("launch it with: bash orl/launch.sh")
    assert shlex.split(launch, comments=True) == ["bash", "orl/launch.sh"]  # needs GPUs and openrlhf: parsed only
    assert subprocess.run(["bash", "-n", "orl/launch.sh"]).returncode == 0
    assert len((tmp_path / "orl" / "train.jsonl").read_text().splitlines()) == 64


# ------------------------------------------------------------------------------------------------ Python
def test_readme_gymnasium(capsys):
    code = block("gymnasium")
    scope: dict[str, Any] = {}
    exec(compile(code, "README.md", "exec"), scope)
    reset_line = next(line for line in code.splitlines() if "env.reset(" in line)
    shown = re.search(r'"(.*?) \.\.\."', reset_line)[1]
    assert scope["prompt"].startswith(shown)
    verdict_line = next(line for line in code.splitlines() if line.startswith('info["verdict"]'))
    stated = dict(re.findall(r"(\w+)=([^,)]+)", verdict_line.split("# ", 1)[1]))
    verdict = scope["info"]["verdict"]
    assert verdict.score == float(stated["score"]) and verdict.correct is (stated["correct"] == "True")
    assert repr(verdict.parsed) == stated["parsed"] and scope["reward"] == verdict.score


def test_readme_tool_use():
    code = block("tool_use")
    lines = code.splitlines()
    scope: dict[str, Any] = {}
    try:
        for i, line in enumerate(lines):  # line by line, to check each step's stated values where it is stated
            exec(compile("\n".join(lines[: i + 1]) if i == 0 else line, "README.md", "exec"), scope)
            if "env.reset(" in line:
                shown = re.search(r'"(.*?) \.\.\."', line)[1]
                assert shown in scope["prompt"] and "<tool_call>" in scope["prompt"]
            elif "env.step(call)" in line:
                stated = re.search(r'reward ([\d.]+), obs "(.*)"$', line)
                assert scope["reward"] == float(stated[1])
                assert scope["obs"] == stated[2].encode().decode("unicode_escape")
            elif "env.step(" in line:
                assert scope["reward"] == float(re.search(r"reward ([\d.]+)", line)[1]) and scope["terminated"]
    finally:
        if "env" in scope:
            scope["env"].close()


@pytest.mark.timeout(900)  # whole training runs in subprocesses: minutes on a loaded 2-core machine
def test_readme_python_training(tmp_path):
    code = block("python_training")
    # As a script, without `if __name__ == "__main__":`, and one small step instead of the 60-s budget.
    budget = '"learner.time_budget_s=60"'
    assert code.count(budget) == 1
    small = ", ".join(f'"{t}"' for t in (*TINY_RUN, "learner.eval_before_after=false"))
    script = code.replace(budget, f"{budget}, {small}") + 'print("steps", summary["steps"])\n'
    (tmp_path / "mine.py").write_text(script)
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "mine.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": pythonpath},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "steps 1"
    for run in ("mine", "mine-2"):
        assert json.loads((tmp_path / "runs" / run / "summary.json").read_text())["steps"] == 1


# ------------------------------------------------------------------------------------------------ the rest
def test_readme_serve():
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    import httpx

    sys.path.insert(0, str(REPO / "tests" / "integrations"))
    from integration_helpers import ServeProcess

    lines = [line for line in block("serve").splitlines() if line.strip()]
    serve, curl, stated = lines
    args = shlex.split(serve)
    port = args.index("--port")
    args[port + 1] = "0"  # any free port
    body = shlex.split(curl)[shlex.split(curl).index("-d") + 1]
    assert stated.startswith("# ")
    expected = json.loads(stated[2:].replace(",...}", "}"))
    with ServeProcess(args[2:port], *args[port + 2 :]) as server:
        answer = httpx.post(server.url + "/get_reward", content=body, timeout=60).json()
    assert answer["rewards"] == expected["rewards"] and answer["scores"] == expected["scores"]
    assert expected["extra_logs"].items() <= answer["extra_logs"].items()


def test_readme_entry_point_toml():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    from lrmgym.registry import ENTRY_POINT_GROUP

    data = tomllib.loads(block("entry_point_toml"))
    (group,) = data["project"]["entry-points"]
    assert group == ENTRY_POINT_GROUP
    for name, target in data["project"]["entry-points"][group].items():
        assert re.fullmatch(r"[A-Z]\w*-v\d+", name) and re.fullmatch(r"[\w.]+:\w+", target)


def test_readme_layout():
    for line in block("layout").splitlines():
        path = line.split()[0] if line.strip() and not line.startswith(" ") else ""
        if path:
            assert (REPO / path).exists(), path
