"""`lrmgym judge` and judge_file: scoring a JSONL outside training; presets; input errors."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest
from click.testing import CliRunner

import lrmgym
from lrmgym.cli.judge_cmd import command
from lrmgym.configs.resolve import list_presets, load_preset, validate_component
from lrmgym.judges.arena import ArenaJudge
from lrmgym.judges.pairwise_rule import RulePairwiseJudge
from lrmgym.judges.rule import AccuracyJudge, FormatJudge
from lrmgym.judges.scoring import JudgeInputError, judge_file


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _read(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture
def math_rows():
    env = lrmgym.make("Math-v0")
    env.reset(seed=0)
    task = env.task
    base = {"task_id": task.id, "prompt": task.prompt, "answer": task.answer, "metadata": dict(task.metadata)}
    good = task.metadata["solution"]
    return [
        {**base, "completions": [good, good + " and more text"]},
        {**base, "completion": "<think>1+1=3</think><answer>-1</answer>"},
    ]


def test_judge_file_with_an_env_writes_one_verdict_per_completion(tmp_path, math_rows):
    stats = judge_file(_write(tmp_path / "in.jsonl", math_rows), tmp_path / "out.jsonl",
                       [AccuracyJudge(), FormatJudge("strict")], env=lrmgym.make("Math-v0"))  # fmt: skip
    rows = _read(tmp_path / "out.jsonl")
    assert [(r["line"], r["index"]) for r in rows] == [(1, 0), (1, 1), (2, 0)]
    assert [r["verdict"]["components"][1]["score"] for r in rows] == [1.0, 0.0, 1.0]
    assert rows[0]["verdict"]["score"] == 2.0 and rows[2]["verdict"]["correct"] is False
    assert (stats["records"], stats["groups"], stats["completions"], stats["ungradeable"]) == (2, 1, 3, 0)
    assert stats["judges"]["format_strict"]["calls"] == 3


def test_without_an_env_the_records_score_is_the_verifiable_reward(tmp_path):
    rows = [
        {"task_id": "a", "prompt": "p", "completion": "9", "score": 0.0},
        {"task_id": "a", "prompt": "p", "completion": "2", "score": 0.0},
        {"task_id": "a", "prompt": "p", "completion": "5", "score": 0.0},
        {"task_id": "b", "prompt": "q", "completion": "<think>x</think>"},
    ]
    judges = [AccuracyJudge(), ArenaJudge(RulePairwiseJudge(("format",))), FormatJudge("loose")]
    stats = judge_file(_write(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl", judges)
    out = _read(tmp_path / "out.jsonl")
    assert out[3]["verdict"]["score"] is None
    assert out[3]["verdict"]["reason"].startswith("ungradeable by accuracy, arena;")
    assert "no verifier: pass env=... or give each record a numeric 'score'" in out[3]["verdict"]["reason"]
    assert stats["arena"]["arena"]["groups_routed"] == 1  # lines 1-3 formed one all-wrong group
    assert stats["ungradeable"] == 1


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "in.jsonl: the file is empty (no JSON lines). Give a JSONL file: one JSON object per line."),
        ('{"prompt": "p"\n',
         "in.jsonl:1: not valid JSON (Expecting ',' delimiter at column 15). Each line must be one complete JSON "
         "object; fix or remove this line."),
        ("[1, 2]\n", "in.jsonl:1: expected a JSON object, got list."),
        ('\n{"prompt": "p"}\n',
         "in.jsonl:2: expected a 'completion' string or a 'completions' list, got keys ['prompt']."),
        ('{"prompt": "p", "completions": []}\n', "in.jsonl:1: 'completions' must be a non-empty list of strings."),
        ('{"prompt": 3, "completion": "x"}\n',
         "in.jsonl:1: 'prompt' must be a string or a list of chat messages."),
        ('{"prompt": "p", "completion": "x", "metadata": 1}\n', "in.jsonl:1: 'metadata' must be a JSON object."),
    ],
)  # fmt: skip
def test_bad_input_names_the_line(tmp_path, content, message):
    path = tmp_path / "in.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(JudgeInputError, match=re.escape(message) + "$"):
        judge_file(path, tmp_path / "out.jsonl", AccuracyJudge())


def test_cli_scores_a_file_with_presets_and_overrides(tmp_path, math_rows):
    src = _write(tmp_path / "c.jsonl", math_rows)
    result = CliRunner().invoke(command, ["--input", str(src), "env=math", "judge=[accuracy,format_strict]",
                                          "judge.format_strict.weight=0.5"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "scored 3 completions in 1 groups: 3 gradeable, 0 ungradeable" in result.output
    rows = _read(tmp_path / "c.verdicts.jsonl")
    assert [r["verdict"]["score"] for r in rows] == [1.5, 0.0, 0.5]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["judge=acuracy"], "Error: judge: unknown preset 'acuracy'; allowed: "),
        ([], "Error: judge: no judge chosen; add judge=PRESET or judge=[A,B] (presets: "),
        (["judge=accuracy", "learner.lr=1"],
         "Error: learner: not used by `lrmgym judge`, which reads only env=... and judge=... settings."),
        (["judge=format_strict", "judge.format_strict.mode=lenient"],
         "Error: judge.format_strict.mode: invalid value 'lenient'"),
    ],
)  # fmt: skip
def test_cli_errors_are_one_line_with_exit_code_2(tmp_path, math_rows, args, message):
    src = _write(tmp_path / "c.jsonl", math_rows)
    result = CliRunner().invoke(command, ["--input", str(src), *args])
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output


def test_cli_missing_input_file(tmp_path):
    result = CliRunner().invoke(command, ["--input", str(tmp_path / "none.jsonl"), "judge=accuracy"])
    assert result.exit_code == 2
    assert (
        f"Error: --input: '{tmp_path / 'none.jsonl'}' not found; expected a JSONL file of completions." in result.output
    )


def test_cli_keeps_going_when_an_llm_judge_fails(tmp_path, math_rows):
    src = _write(tmp_path / "c.jsonl", math_rows)
    # a mock judge model whose replies never parse: every call fails, is retried, and is counted
    result = CliRunner().invoke(command, [
        "--input", str(src), "judge=[accuracy,llm_pointwise]", "judge.llm_pointwise.policy={kind: mock, mode: random}",
        "judge.llm_pointwise.max_retries=1", "judge.llm_pointwise.backoff_s=0",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "0 gradeable, 3 ungradeable" in result.output
    assert "llm_failures=3" in result.output and "llm_parse_errors=6" in result.output


@pytest.mark.parametrize("name", list_presets("judge"))
def test_every_judge_preset_validates_and_builds(name):
    data = load_preset("judge", name)
    uses_openai = "openai" in json.dumps(data)
    if uses_openai and importlib.util.find_spec("lrmgym.policies.openai") is None:
        pytest.skip("the openai policy is not in this build yet")
    config = validate_component("judge", f"judge.{name}", data)
    judge = config.build()
    assert judge.weight == data.get("weight", 1.0)
