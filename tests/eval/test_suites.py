"""Eval suites (``lrmgym eval eval=NAME``): presets over the made-up fixtures in tests/fixtures/evals, their scores
and intervals under scripted policies, and the one-line errors for a missing or wrong data file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from lrmgym.cli.main import cli
from lrmgym.compose import build_env
from lrmgym.configs.resolve import resolve
from lrmgym.configs.suites import load_suite, split_suite_tokens, suite_tokens
from lrmgym.eval.config import EvalConfig
from lrmgym.eval.passk import bootstrap_interval
from lrmgym.eval.runner import evaluate
from lrmgym.eval.suites import SuiteError, check_items
from lrmgym.testing.mock import ScriptedPolicy

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "evals"
FILES = {
    "aime24": "aime24.jsonl",
    "aime25": "aime25.jsonl",
    "gpqa_diamond": "gpqa_diamond.csv",
    "livecodebench": "livecodebench.jsonl",
}
COUNTS = {"aime24": 4, "aime25": 3, "gpqa_diamond": 4, "livecodebench": 3}


def suite_env(name: str, *extra: str, path: Path | None = None):
    suite = load_suite(name)
    cfg = resolve(suite_tokens(suite, str(path or FIXTURES / FILES[name]), list(extra)))
    return suite, cfg, build_env(cfg)


def key(task) -> str:
    prompt = task.prompt
    return prompt if isinstance(prompt, str) else prompt[-1]["content"]


def small(n: int, k: list[int]) -> EvalConfig:
    return EvalConfig(n=n, k=k, tasks=100, split="test")


# ---------------------------------------------------------------------------------------------- presets load
@pytest.mark.parametrize("name", sorted(FILES))
def test_each_preset_loads_its_fixture_in_the_published_format(name):
    suite, cfg, env = suite_env(name)
    assert check_items(suite, env) == COUNTS[name]
    assert cfg.eval.n >= 8 and cfg.eval.n in cfg.eval.k  # a real model's budget: avg@n and pass@n
    ids = [env.unwrapped.task_at(i, seed=0).id for i in range(COUNTS[name])]
    assert len(set(ids)) == COUNTS[name]  # sequential over the file, each problem once


def test_aime_presets_take_32_samples_and_grade_integer_answers_in_number_form():
    for name in ("aime24", "aime25"):
        suite, cfg, env = suite_env(name)
        assert (cfg.eval.n, cfg.eval.k) == (32, [1, 8, 32])
        tasks = [env.unwrapped.task_at(i, seed=0) for i in range(COUNTS[name])]
        assert all(t.metadata["answer_form"] == "number" and re.fullmatch(r"\d{1,3}", t.answer) for t in tasks)


def test_aime_parquet_file_loads_as_published(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    rows = [json.loads(line) for line in (FIXTURES / "aime24.jsonl").read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "aime.parquet")
    suite, _, env = suite_env("aime24", path=tmp_path / "aime.parquet")
    assert check_items(suite, env) == 4


def test_aime_refuses_a_file_whose_answers_are_not_integers_0_to_999(tmp_path):
    bad = tmp_path / "aime.jsonl"
    bad.write_text(json.dumps({"problem": "Made up: what is half of 3?", "answer": "3/2"}) + "\n")
    suite, _, env = suite_env("aime24", path=bad)
    with pytest.raises(SuiteError, match=r"^eval=aime24: problem .* has the answer '3/2'; AIME 2024 answers are "):
        check_items(suite, env)


# ---------------------------------------------------------------------------------------------- scores
def test_aime_scripted_policies_get_the_expected_avg_pass_and_intervals():
    _, _, env = suite_env("aime24")
    tasks = [env.unwrapped.task_at(i, seed=0) for i in range(4)]
    gold = {key(t): t.answer for t in tasks}

    right = ScriptedPolicy(lambda p, i: f"The answer is \\boxed{{{gold[key_of(p)]}}}.")
    report = evaluate(env, right, small(4, [1, 4]), progress=False)
    assert report["avg@n"] == {"value": 1.0, "ci": [1.0, 1.0]}
    assert report["pass@k"]["pass@4"]["value"] == 1.0

    wrong = ScriptedPolicy(lambda p, i: f"\\boxed{{{int(gold[key_of(p)]) + 1}}}")
    report = evaluate(env, wrong, small(4, [1, 4]), progress=False)
    assert report["avg@n"] == {"value": 0.0, "ci": [0.0, 0.0]}

    first_only = ScriptedPolicy(lambda p, i: f"\\boxed{{{gold[key_of(p)] if i == 0 else 1000}}}")
    report = evaluate(env, first_only, small(4, [1, 2, 4]), progress=False)
    assert report["avg@n"] == {"value": 0.25, "ci": [0.25, 0.25]}  # every problem alike: no spread over problems
    assert [report["pass@k"][f"pass@{k}"]["value"] for k in (1, 2, 4)] == pytest.approx([0.25, 0.5, 1.0])

    half = {key(t) for t in tasks[:2]}
    two_of_four = ScriptedPolicy(lambda p, i: f"\\boxed{{{gold[key_of(p)] if key_of(p) in half else 1000}}}")
    report = evaluate(env, two_of_four, small(4, [1]), progress=False)
    expected = bootstrap_interval([1.0, 1.0, 0.0, 0.0], confidence=0.95, resamples=2000, seed=0)
    assert report["avg@n"]["value"] == 0.5 and report["avg@n"]["ci"] == pytest.approx(list(expected))
    assert report["avg@n"]["ci"][0] < 0.5 < report["avg@n"]["ci"][1]
    assert report["interval"]["method"] == "percentile bootstrap over tasks"


def key_of(prompt) -> str:
    return prompt if isinstance(prompt, str) else prompt[-1]["content"]


def test_gpqa_scripted_policies_score_the_letter_only():
    _, _, env = suite_env("gpqa_diamond")
    tasks = [env.unwrapped.task_at(i, seed=0) for i in range(4)]
    letter = {key(t): t.answer for t in tasks}
    other = {key(t): next(x for x in "ABCD" if x != t.answer) for t in tasks}
    right = evaluate(env, ScriptedPolicy(lambda p, i: f"<answer>{letter[key_of(p)]}</answer>"), small(2, [1, 2]),
                     progress=False)  # fmt: skip
    assert right["avg@n"] == {"value": 1.0, "ci": [1.0, 1.0]}
    wrong = evaluate(env, ScriptedPolicy(lambda p, i: f"<answer>{other[key_of(p)]}</answer>"), small(2, [1]),
                     progress=False)  # fmt: skip
    assert wrong["avg@n"]["value"] == 0.0 and wrong["format_failure_rate"]["value"] == 0.0
    hedge = evaluate(env, ScriptedPolicy(lambda p, i: "<answer>A or B or C or D</answer>"), small(1, [1]),
                     progress=False)  # fmt: skip
    assert hedge["avg@n"]["value"] == 0.0 and hedge["format_failure_rate"]["value"] == 1.0


# ---------------------------------------------------------------------------------------------- tokens
def test_suite_tokens_come_before_the_users_so_user_overrides_win():
    suite = load_suite("aime24")
    cfg = resolve(suite_tokens(suite, str(FIXTURES / FILES["aime24"]), ["eval.n=4", "eval.k=[1,4]"]))
    assert (cfg.eval.n, cfg.eval.k) == (4, [1, 4])
    assert cfg.env.options["source"] == str(FIXTURES / FILES["aime24"])


def test_env_data_option_points_at_the_file_too():
    suites, paths, rest = split_suite_tokens(["eval=gpqa_diamond", f"env.data_path={FIXTURES / FILES['gpqa_diamond']}"])
    cfg = resolve(suite_tokens(suites[0], paths.get("gpqa_diamond"), rest))
    assert cfg.env.options["data_path"] == str(FIXTURES / FILES["gpqa_diamond"])


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        (["eval=aime42"], "eval: unknown suite 'aime42'; allowed: aime24, aime25, gpqa_diamond, livecodebench. "
                          "Did you mean 'aime25'?"),
        (["eval=aime24", "env=math"], "env=math: eval=aime24 sets the env itself; drop env=math (set an env option "
                                      "with env.KEY=VALUE instead)."),
        (["eval.data_path=x.jsonl"], "eval.data_path is set but no suite is chosen; add eval=NAME (suites: aime24, "
                                     "aime25, gpqa_diamond, livecodebench)."),
        (["eval=[aime24,aime25]", "eval.data_path=x.jsonl"],
         "eval.data_path='x.jsonl' names one file but 2 suites are chosen; give one per suite: "
         "eval.data_path.aime24=PATH eval.data_path.aime25=PATH."),
        (["eval=[aime24,aime24]"], "eval: aime24 is listed twice in ['aime24', 'aime24']; name each suite once."),
        (["eval=aime24", "eval.data_path.gpqa=x"],
         "eval.data_path.gpqa: 'gpqa' is not a chosen suite; chosen: aime24."),
    ],
)  # fmt: skip
def test_suite_token_mistakes_are_one_clear_error(tokens, message):
    with pytest.raises(SuiteError, match=f"^{re.escape(message)}$"):
        split_suite_tokens(tokens)


# ---------------------------------------------------------------------------------------------- CLI
def _error_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    return lines[0]


@pytest.mark.parametrize("name", sorted(FILES))
def test_missing_data_file_is_one_error_naming_the_preset_and_the_format_exit_2(name, tmp_path):
    suite = load_suite(name)
    runs = tmp_path / "runs"
    line = _error_line(CliRunner().invoke(cli, ["eval", f"eval={name}", f"run.output_dir={runs}"]))
    assert line == (
        f"Error: eval={name}: no data file. {suite.title} is read from a local file and never downloaded: give "
        f"eval.data_path=PATH (beside other suites eval.data_path.{name}=PATH), PATH being {suite.expects}."
    )
    gone = tmp_path / "nope.jsonl"
    line = _error_line(CliRunner().invoke(cli, ["eval", f"eval={name}", f"eval.data_path={gone}",
                                                f"run.output_dir={runs}"]))  # fmt: skip
    assert line == (
        f"Error: eval={name}: the data file '{gone}' does not exist. Expected {suite.expects}; point "
        "eval.data_path at the file you downloaded (nothing is downloaded at run time)."
    )
    assert not runs.exists()


def test_cli_writes_each_suite_and_a_summary_with_intervals(tmp_path):
    _, _, env = suite_env("gpqa_diamond")
    letters = [env.unwrapped.task_at(i, seed=0).answer for i in range(4)]
    runs = tmp_path / "runs"
    args = ["eval", "eval=[gpqa_diamond,aime25]", f"eval.data_path.gpqa_diamond={FIXTURES / FILES['gpqa_diamond']}",
            f"eval.data_path.aime25={FIXTURES / FILES['aime25']}", "policy=mock", "policy.mode=scripted",
            "policy.responses=['<answer>A</answer>']", "eval.n=2", "eval.k=[1,2]", f"run.output_dir={runs}",
            "run.name=suites"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    out = runs / "suites"
    for name in ("gpqa_diamond", "aime25"):
        assert {p.name for p in (out / name).iterdir()} == {"config.yaml", "eval.json", "samples.jsonl"}
    summary = json.loads((out / "suites.json").read_text())
    rows = {row["suite"]: row for row in summary["suites"]}
    assert rows["gpqa_diamond"]["tasks"] == 4 and rows["aime25"]["tasks"] == 3
    assert rows["gpqa_diamond"]["avg@2"]["value"] == letters.count("A") / 4
    assert rows["aime25"]["avg@2"] == {"value": 0.0, "ci": [0.0, 0.0]}
    assert rows["gpqa_diamond"]["interval"]["method"] == "percentile bootstrap over tasks"
    low, high = rows["gpqa_diamond"]["avg@2"]["ci"]
    assert low <= rows["gpqa_diamond"]["avg@2"]["value"] <= high
    assert "eval suites: mean over problems [95% interval, percentile bootstrap over" in result.output
    assert "eval=gpqa_diamond on lrmgym/MultipleChoice-v0 (test): 4 tasks x n=2" in " ".join(result.output.split())
    assert f"results: {out}" in result.output


def test_a_file_served_in_order_is_evaluated_once_per_problem_however_many_tasks_are_asked():
    _, _, env = suite_env("aime25")
    report = evaluate(env, ScriptedPolicy(lambda p, i: "\\boxed{0}"), small(1, [1]), progress=False)
    assert report["tasks"] == 3  # not 100 tasks cycling over 3 problems


def test_a_file_of_another_benchmark_is_one_error_naming_the_suite(tmp_path):
    args = ["eval", "eval=gpqa_diamond", f"eval.data_path={FIXTURES / FILES['aime24']}", f"run.output_dir={tmp_path}"]
    line = _error_line(CliRunner().invoke(cli, args))
    assert line.startswith(f"Error: eval=gpqa_diamond: env: {FIXTURES / FILES['aime24']}:1: missing column(s) ")
    args = ["eval", "eval=aime24", f"eval.data_path={FIXTURES / FILES['aime24']}", "eval.n=abc"]
    assert _error_line(CliRunner().invoke(cli, args)).startswith("Error: eval=aime24: eval.n: invalid value 'abc'")


@pytest.mark.parametrize("command", [["run"], ["config", "show"]])
def test_other_commands_say_a_suite_is_for_lrmgym_eval(command, tmp_path):
    line = _error_line(CliRunner().invoke(cli, [*command, "eval=aime24", f"run.output_dir={tmp_path}"]))
    assert line == (
        "Error: eval=aime24: an evaluation suite is run by `lrmgym eval eval=aime24 eval.data_path=PATH`; this "
        "command does not take it."
    )
