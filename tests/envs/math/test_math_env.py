"""The Math-v0 env: contract, seeding, sources, templates, multi-turn retry, config errors, presets."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pydantic
import pytest
import yaml

import lrmgym
from lrmgym.core import Completion
from lrmgym.envs.math.env import MathEnv
from lrmgym.envs.math.templates import INSTRUCTIONS
from lrmgym.testing import ADVERSARIAL_OUTPUTS, AdversarialPolicy, ScriptedPolicy, check_env

PRESETS = Path(lrmgym.__file__).parent / "configs" / "presets" / "env"


def _r1(answer: str) -> str:
    return f"<think>work</think><answer>{answer}</answer>"


# ------------------------------------------------------------------------------------------------ contract
@pytest.mark.parametrize("template", ["r1", "boxed", "plain"])
def test_check_env_procedural(template):
    env = lrmgym.make("lrmgym/Math-v0", template=template, difficulty=[1, 3, 5])
    check_env(env, reference=lambda task: task.metadata["solution"])


def test_check_env_multi_turn():
    check_env(MathEnv(max_turns=2, style="compact"), reference=lambda task: task.metadata["solution"])


def test_same_seed_same_tasks_adjacent_seeds_differ():
    env = MathEnv(style="compact")
    first = [env.reset(seed=5)[1]["task"].id] + [env.reset()[1]["task"].id for _ in range(9)]
    again = [env.reset(seed=5)[1]["task"].id] + [env.reset()[1]["task"].id for _ in range(9)]
    neighbour = [env.task_at(i, seed=6).id for i in range(10)]
    shifted = [env.task_at(i, seed=4).id for i in range(1, 11)]
    assert first == again
    assert len(set(first) & set(neighbour)) <= 1 and first[1:] != shifted[:9]
    assert env.task_at(3, seed=5) == env.task_at(3, seed=5)


def test_task_metadata_and_solution():
    env = MathEnv(style="compact", template="r1", difficulty=1)
    task = env.task_at(0, seed=0)
    assert task.prompt.startswith("Q:") and task.prompt.endswith(" A:")
    assert {"source", "split", "difficulty", "solution", "steps", "kind", "question"} <= set(task.metadata)
    assert (task.metadata["source"], task.metadata["split"], task.metadata["difficulty"]) == ("procedural", "train", 1)
    assert (
        task.metadata["solution"] == f"<think>{';'.join(task.metadata['steps'])}</think><answer>{task.answer}</answer>"
    )
    assert env.solution(task, "boxed").endswith(f"\\boxed{{{task.answer}}}")
    assert re.fullmatch(r"math/gen/1/train/[0-9a-f]{12}", task.id)


@pytest.mark.parametrize("template", ["r1", "boxed", "plain"])
def test_every_worked_solution_is_graded_correct(template):
    """The SFT targets: 250 tasks over all levels, each solution verified correct through the full pipeline."""
    env = MathEnv(template=template, difficulty=[1, 2, 3, 4, 5], style="compact")
    tasks = [env.task_at(i, seed=9) for i in range(250)]
    verdicts = [env.verify(t, Completion(t.metadata["solution"])) for t in tasks]
    wrong = [
        (t.prompt, t.metadata["solution"], v.reason) for t, v in zip(tasks, verdicts, strict=True) if not v.correct
    ]
    assert not wrong
    assert {t.difficulty for t in tasks} == {1, 2, 3, 4, 5}


def test_test_split_tasks_never_in_train_stream():
    train = {MathEnv(split="train").task_at(i, seed=s).id for s in range(3) for i in range(2000)}
    test = {MathEnv(split="test").task_at(i, seed=0).id for i in range(1000)}
    assert not train & test
    assert all("/test/" in t for t in test)


def test_instruct_chat_prompt():
    env = MathEnv(style="instruct", template="boxed", chat=True, difficulty=5)
    prompt = env.task_at(0, seed=0).prompt
    assert isinstance(prompt, list) and prompt[0]["role"] == "user"
    assert prompt[0]["content"].endswith(INSTRUCTIONS["boxed"])


# ------------------------------------------------------------------------------------------------ grading
def test_step_grades_format_and_answer():
    env = MathEnv(style="compact")
    _, info = env.reset(seed=0)
    task = info["task"]
    _, reward, terminated, truncated, info = env.step(_r1(task.answer))
    assert (reward, terminated, truncated, info["verdict"].format_ok) == (1.0, True, False, True)
    env.reset(seed=0)
    _, reward, _, _, info = env.step(f"The answer is {task.answer}")
    verdict = info["verdict"]
    assert (reward, verdict.correct, verdict.format_ok, verdict.reason) == (
        0.0,
        False,
        False,
        "format: no <answer> tag",
    )
    env.reset(seed=0)
    verdict = env.step(f"<think>a</think><answer>{task.answer}</answer><answer>0</answer>")[4]["verdict"]
    assert verdict.reason == "format: 2 <answer> tags, expected exactly one"


def test_multi_turn_retry_with_feedback():
    env = MathEnv(max_turns=2, style="compact")
    _, info = env.reset(seed=1)
    task = info["task"]
    obs, reward, terminated, truncated, _ = env.step(_r1("-999"))
    assert obs == "\nNot -999. Try again. A:"  # compact: short, ending in the answer cue
    assert (reward, terminated, truncated) == (0.0, False, False)
    obs, reward, terminated, truncated, _ = env.step(_r1(task.answer))
    assert (reward, terminated, truncated) == (1.0, True, False)
    env = MathEnv(max_turns=2, style="instruct")
    env.reset(seed=1)
    obs = env.step(_r1("-999"))[0]
    assert obs == f"Your answer -999 is not correct. Try again. {INSTRUCTIONS['r1']}"
    compact = MathEnv(max_turns=2, style="compact")
    compact.reset(seed=1)
    assert compact.step("no tags")[0] == "\nBad format. Try again. A:"


def test_multi_turn_format_feedback_and_truncation():
    env = MathEnv(max_turns=2)
    env.reset(seed=1)
    obs, *_ = env.step("no tags")
    assert obs == f"Your response did not follow the required format (no <answer> tag). {INSTRUCTIONS['r1']}"
    _, _, terminated, truncated, _ = env.step("still no tags")
    assert (terminated, truncated) == (False, True)


def test_single_turn_by_default():
    env = MathEnv()
    env.reset(seed=0)
    assert env.step("wrong")[2] is True


def test_score_group_matches_verify_with_a_scripted_policy():
    env = MathEnv(style="compact", difficulty=3)
    task = env.task_at(0, seed=2)
    wrong = str(int(task.answer.split("/")[0]) + 1)
    policy = ScriptedPolicy({task.prompt: [task.metadata["solution"], _r1(wrong), "junk", _r1("\\sqrt{2}")]})
    completions = policy.generate([task.prompt], n=4)[0]
    verdicts = env.score_group(task, completions)
    assert [v.score for v in verdicts] == [1.0, 0.0, 0.0, 0.0]
    assert [v.reason for v in verdicts] == [env.verify(task, c).reason for c in completions]


def test_adversarial_policy_outputs_end_in_verdicts():
    env = MathEnv(template="boxed")
    task = env.task_at(0, seed=0)
    completions = AdversarialPolicy().generate([task.prompt], n=len(ADVERSARIAL_OUTPUTS))[0]
    verdicts = env.score_group(task, completions)
    assert len(verdicts) == len(completions) and all(v.correct is not True for v in verdicts)


# ------------------------------------------------------------------------------------------------ data sources
def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_local_jsonl_with_custom_fields(tmp_path):
    path = _write_jsonl(
        tmp_path / "mine.jsonl", [{"q": "1+1?", "a": "2"}, {"q": "half of 1?", "a": "\\boxed{\\frac12}"}]
    )
    env = MathEnv(
        source=str(path), question_field="q", answer_field="a", order="sequential", template="boxed", test_fraction=0.0
    )
    assert env.num_items == 2
    tasks = [env.task_at(i, seed=0) for i in range(3)]
    assert [t.answer for t in tasks] == ["2", "\\frac12", "2"]
    assert tasks[0].id == "mine.jsonl/train/0" and tasks[0].metadata["source"] == str(path)
    assert env.verify(tasks[1], Completion("\\boxed{0.5}")).correct
    check_env(env, seed_sensitive=False, reference=lambda t: f"\\boxed{{{t.answer}}}")


def test_local_gzip_parquet_and_hf_folder(tmp_path):
    rows = [{"question": f"{n}+{n}?", "answer": f"#### {2 * n:,}"} for n in (1, 600, 7)]
    gz = tmp_path / "d.jsonl.gz"
    with gzip.open(gz, "wt") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in rows)
    import datasets
    import pyarrow
    import pyarrow.parquet

    pq = tmp_path / "d.parquet"
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), pq)
    hf = tmp_path / "hf"
    datasets.Dataset.from_list(rows).save_to_disk(str(hf))
    for path in (gz, pq, hf):
        env = MathEnv(source=str(path), order="sequential", test_fraction=0.0)
        assert [env.task_at(i, seed=0).answer for i in range(3)] == ["2", "1200", "14"], path


def test_data_errors_are_clear(tmp_path):
    path = _write_jsonl(tmp_path / "bad.jsonl", [{"problem": "x", "answer": "1"}])
    msg = (
        f"{path}:1: missing field(s) ['question']; it has ['answer', 'problem']. "
        "Set question_field / answer_field (env.question_field=... on the command line) to the fields that hold them."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        MathEnv(source=str(path))
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "a", "answer": "1"}\n{oops\n')
    with pytest.raises(ValueError, match=re.escape(f"{broken}:2: not valid JSON")):
        MathEnv(source=str(broken))


def test_gsm8k_and_math500_sources(shared_data):
    gsm = MathEnv(source="gsm8k", split="test", order="sequential", data_dir=str(shared_data))
    assert gsm.num_items == 1319
    task = gsm.task_at(0, seed=0)
    assert task.id == "gsm8k/test/0" and task.answer == "18" and task.metadata["source"] == "gsm8k"
    assert "<<" not in task.metadata["reference_solution"]
    assert all("," not in gsm.task_at(i, seed=0).answer for i in range(1319))
    train = MathEnv(source="gsm8k", split="train", data_dir=str(shared_data))
    assert train.num_items == 7473
    test_questions = {gsm.task_at(i, seed=0).metadata["question"].strip() for i in range(1319)}
    assert not test_questions & {item.question.strip() for item in train._items}  # the splits do not overlap
    m5 = MathEnv(source="math500", split="test", order="sequential", data_dir=str(shared_data), template="boxed")
    assert m5.num_items == 500
    first = m5.task_at(0, seed=0)
    assert first.metadata["difficulty"] in (1, 2, 3, 4, 5) and first.metadata["subject"]
    assert first.id == "math500/test/0"
    check_env(m5, seed_sensitive=False, reference=lambda t: f"\\boxed{{{t.answer}}}", n_tasks=3)


def test_missing_data_file_message(tmp_path):
    with pytest.raises(
        ValueError, match=re.escape(f"gsm8k test split not found at {tmp_path / 'gsm8k' / 'test.jsonl'}")
    ):
        MathEnv(source="gsm8k", split="test", data_dir=str(tmp_path))


# ------------------------------------------------------------------------------------------------ config
@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"difficulty": 7}, "difficulty must be a level from 1 to 5 or a non-empty list of them, got 7"),
        ({"difficulty": []}, "difficulty must be a level from 1 to 5 or a non-empty list of them, got []"),
        ({"template": "latex"}, "Input should be 'plain', 'boxed' or 'r1'"),
        ({"source": "gsm9k"}, "source 'gsm9k' is neither one of procedural, gsm8k, math500 nor an existing file"),
        ({"source": "math500"}, "source 'math500' has only the 'test' split; set split: test"),
        ({"timeout_s": 0}, "Input should be greater than 0"),
        ({"tempalte": "r1"}, "Extra inputs are not permitted"),
    ],
)
def test_config_errors_name_the_value(kwargs, fragment):
    with pytest.raises(pydantic.ValidationError, match=re.escape(fragment)):
        MathEnv(**kwargs)


def test_every_config_field_is_documented():
    for name, field in MathEnv.Config.model_fields.items():
        assert field.description, name


@pytest.mark.parametrize("name", ["math", "gsm8k", "math500"])
def test_presets_are_valid_configs(name, shared_data):
    preset = yaml.safe_load((PRESETS / f"{name}.yaml").read_text())
    assert preset.pop("id") == "lrmgym/Math-v0"
    env = MathEnv(**preset, **({} if name == "math" else {"data_dir": str(shared_data)}))
    if name == "math":
        assert (env.config.source, env.config.difficulty, env.config.template, env.config.style) == (
            "procedural",
            1,
            "r1",
            "compact",
        )
        assert env.task_at(0, seed=0).prompt.startswith("Q:")
