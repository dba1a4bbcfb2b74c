"""lrmgym.adapters.verl: compute_score in verl's signature, the parquet files, and `lrmgym export verl`."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
from adapter_helpers import adversarial_math_completions, build_judges, judge_verdicts
from click.testing import CliRunner

from lrmgym.adapters import verl
from lrmgym.cli.main import cli
from lrmgym.configs.errors import ConfigError
from lrmgym.configs.resolve import resolve
from lrmgym.integrations.labels import LabelError, decode_label

MATH = ["env=math", "judge=[accuracy,format_strict]"]
COLUMNS = ["data_source", "prompt", "ability", "reward_model", "extra_info"]


def _r1(answer: str) -> str:
    return f"<think>working</think><answer>{answer}</answer>"


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture(autouse=True)
def _fresh_scorer():
    yield
    verl.reset_scorer()


@pytest.fixture(scope="module")
def math_export(tmp_path_factory):
    out = tmp_path_factory.mktemp("verl") / "math"
    result = verl.export_verl(resolve(MATH), out, n_train=4, n_test=3, version="test")
    return result


def _load_reward(out_dir):
    """The export's reward.py, loaded as verl's get_custom_reward_fn loads it."""
    spec = importlib.util.spec_from_file_location("custom_module", out_dir / "reward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reward(math_export):
    module = _load_reward(math_export.out_dir)
    yield module
    module._REWARD.close()


def _rows(path):
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def _completions(rows):
    """Per row: a correct, a wrong, an unformatted and an empty response."""
    out = []
    for row in rows:
        answer = row["reward_model"]["ground_truth"]
        for text in (_r1(answer), _r1(answer + "1"), f"the answer is {answer}", ""):
            out.append((row, text))
    return out


# ------------------------------------------------------------------------------------------------ compute_score
def test_compute_score_in_verls_call_gives_lrmgym_judges_rewards(math_export, reward, tmp_path):
    cfg = resolve(MATH)
    pairs = _completions(_rows(math_export.out_dir / "train.parquet"))
    results = [
        reward.compute_score(
            data_source=row["data_source"],
            solution_str=text,
            ground_truth=row["reward_model"]["ground_truth"],
            extra_info=row["extra_info"],
        )  # fmt: skip  -- keyword by keyword, as verl's naive reward manager calls it
        for row, text in pairs
    ]
    labels = [row["extra_info"]["label"] for row, _ in pairs]
    verdicts = judge_verdicts(cfg.env, build_judges(cfg.judge), labels, [t for _, t in pairs], tmp_path)
    assert [r["score"] for r in results] == pytest.approx([v["score"] for v in verdicts])
    assert [r["acc"] for r in results][:4] == [1.0, 0.0, 0.0, 0.0]
    keys = {tuple(r) for r in results}
    assert len(keys) == 1  # verl keeps each key per sample: every response returns the same keys ...
    assert all(isinstance(v, float) and math.isfinite(v) for r in results for v in r.values())  # ... all numbers
    assert {"score", "acc", "judge/accuracy", "judge/format_strict", "verdict/ungradeable"} <= set(results[0])


def test_positional_call_and_a_label_as_ground_truth(math_export, reward):
    row = _rows(math_export.out_dir / "train.parquet")[0]
    text = _r1(row["reward_model"]["ground_truth"])
    by_position = reward.compute_score(row["data_source"], text, row["reward_model"]["ground_truth"], row["extra_info"])
    by_truth = reward.compute_score("lrmgym/math", text, row["extra_info"]["label"], None)
    assert by_position == by_truth and by_position["score"] == 2.0


def test_the_held_out_rows_grade_the_held_out_tasks(math_export, reward, tmp_path):
    cfg = resolve([*MATH, "env.split=test"])
    pairs = _completions(_rows(math_export.out_dir / "test.parquet"))
    assert {decode_label(row["extra_info"]["label"]).env["split"] for row, _ in pairs} == {"test"}
    results = [reward.compute_score(r["data_source"], t, r["reward_model"]["ground_truth"], r["extra_info"])
               for r, t in pairs]  # fmt: skip
    labels = [row["extra_info"]["label"] for row, _ in pairs]
    verdicts = judge_verdicts(cfg.env, build_judges(cfg.judge), labels, [t for _, t in pairs], tmp_path)
    assert [r["score"] for r in results] == pytest.approx([v["score"] for v in verdicts])


def test_hostile_responses_never_raise(math_export, reward):
    row = _rows(math_export.out_dir / "train.parquet")[0]
    hostile = [None, b"\xff\xfe<answer>1</answer>", 7, "\ud800", "\x00" * 10_000, "x" * (17 * 1024 * 1024),
               *adversarial_math_completions()]  # fmt: skip
    for text in hostile:
        result = reward.compute_score(row["data_source"], text, row["reward_model"]["ground_truth"], row["extra_info"])
        assert all(isinstance(v, float) and math.isfinite(v) for v in result.values())


def test_rows_without_a_label_are_a_clear_error():
    with pytest.raises(LabelError, match=r"extra_info: no lrmgym label in extra_info \(got \['index'\]\)"):
        verl.compute_score("lrmgym/math", "x", "22", {"index": 0})
    with pytest.raises(LabelError, match="no lrmgym label"):
        verl.compute_score("lrmgym/math", "x", "22", None)
    with pytest.raises(ValueError, match="got 2 responses, 1 ground truths"):
        verl.compute_score_batch(["a", "b"], ["x", "y"], ["1"], None)


def test_group_judges_need_the_batch_manager(tmp_path):
    cfg = resolve(["env=math", "judge=[arena,format_strict]"])
    result = verl.export_verl(cfg, tmp_path / "arena", n_train=3, n_test=1)
    assert "reward_model.reward_manager=batch" in result.overrides
    assert "custom_reward_function.name=compute_score_batch" in result.overrides
    rows = _rows(tmp_path / "arena" / "train.parquet")
    reward = _load_reward(tmp_path / "arena")
    with pytest.raises(ConfigError, match="reward_model.reward_manager=batch and custom_reward_function.name="):
        reward.compute_score(rows[0]["data_source"], "x", None, rows[0]["extra_info"])
    env = cfg.env.make().unwrapped
    groups = []
    for row in rows:  # four right answers: a tie the arena's tournament breaks, on the reasoning
        task = env.task_at(row["extra_info"]["index"], seed=0)
        a = task.answer
        thoughts = ("1+1=3", "x" * 30, f"{a}={a}")
        texts = (task.metadata["solution"], *(f"<think>{t}</think><answer>{a}</answer>" for t in thoughts))
        groups.append([(row, t) for t in texts])
    batch = [group[k] for k in range(4) for group in groups]  # the groups interleaved
    results = reward.compute_score_batch(
        data_sources=[r["data_source"] for r, _ in batch],
        solution_strs=[t for _, t in batch],
        ground_truths=[r["reward_model"]["ground_truth"] for r, _ in batch],
        extra_infos=[r["extra_info"] for r, _ in batch],
    )
    labels = [r["extra_info"]["label"] for r, _ in batch]
    verdicts = judge_verdicts(cfg.env, build_judges(cfg.judge), labels, [t for _, t in batch], tmp_path)
    assert [r["score"] for r in results] == pytest.approx([v["score"] for v in verdicts])
    assert {(r["acc"], r["judge/arena"]) for r in results[3:6]} == {(1.0, 0.0)}  # right, yet last of its group
    reward._REWARD.close()


# ------------------------------------------------------------------------------------------------ the files
def test_parquet_files_have_verls_columns(math_export):
    from datasets import Dataset

    train = _rows(math_export.out_dir / "train.parquet")
    assert [list(r) for r in train] == [COLUMNS] * 4
    env = resolve(MATH).env.make().unwrapped
    for i, row in enumerate(train):
        task = env.task_at(i, seed=0)
        assert row["data_source"] == "lrmgym/math" and row["ability"] == "math"
        assert row["prompt"] == [{"role": "user", "content": task.prompt}]  # verl applies the chat template itself
        assert row["reward_model"] == {"style": "rule", "ground_truth": task.answer}
        info = row["extra_info"]
        assert (info["split"], info["index"], info["seed"], info["task_id"]) == ("train", i, 0, task.id)
        label = decode_label(info["label"])
        assert (label.index, label.seed) == (i, 0) and "judge" not in json.loads(info["label"])
    test = Dataset.from_parquet(str(math_export.out_dir / "test.parquet"))  # as verl's RLHFDataset reads it
    assert test.column_names == COLUMNS and len(test) == 3
    assert test[0]["extra_info"]["split"] == "test" and test[0]["prompt"][0]["role"] == "user"
    record = json.loads((math_export.out_dir / "export.json").read_text())
    assert record["rows"] == {"train.parquet": 4, "test.parquet": 3} and record["group_aware"] is False


def test_the_written_reward_py_loads_the_way_verl_loads_it(math_export, reward):
    path = math_export.out_dir / "reward.py"
    assert f"custom_reward_function.path={path}" in path.read_text()
    module = reward
    row = _rows(math_export.out_dir / "train.parquet")[1]
    fn = module.compute_score
    result = fn(data_source=row["data_source"], solution_str=_r1(row["reward_model"]["ground_truth"]),
                ground_truth=row["reward_model"]["ground_truth"], extra_info=row["extra_info"])  # fmt: skip
    assert result["score"] == 2.0 and callable(module.compute_score_batch)


def test_multi_turn_envs_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ConfigError, match=r"env: lrmgym/Game24-v0 is multi-turn here .* grades one response"):
        config = resolve(["env=game24", "env.mode=steps", "env.split=train"])  # train: no data file needed
        verl.export_verl(config, tmp_path / "g", n_train=2, n_test=1)
    assert not (tmp_path / "g").exists() and list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------------ the command
def test_export_verl_end_to_end_refuses_a_full_dir_without_force(tmp_path):
    out = tmp_path / "exports" / "math"
    args = ["export", "verl", *MATH, f"out={out}", "--train-tasks", "5", "--test-tasks", "2"]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["export.json", "reward.py", "test.parquet", "train.parquet"]
    assert f"custom_reward_function.path={out / 'reward.py'}" in result.output
    assert len(_rows(out / "train.parquet")) == 5 and len(_rows(out / "test.parquet")) == 2
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temporary sibling left

    (out / "mine.txt").write_text("keep me")
    again = invoke(*args[:-1], "3")
    assert again.exit_code == 2 and "exists and is not empty" in again.output and "--force" in again.output
    assert (out / "mine.txt").read_text() == "keep me" and len(_rows(out / "test.parquet")) == 2
    forced = invoke(*args[:-1], "3", "--force")
    assert forced.exit_code == 0, forced.output
    assert not (out / "mine.txt").exists() and len(_rows(out / "test.parquet")) == 3


def test_export_verl_refusals(tmp_path):
    learner = invoke("export", "verl", "env=math", "learner.lr=1e-6", f"out={tmp_path / 'a'}")
    assert learner.exit_code == 2 and "learner.lr: not used by `lrmgym export verl`" in learner.output
    no_out = invoke("export", "verl", "env=math")
    assert no_out.exit_code == 2 and "out=DIR: name the export folder once" in no_out.output
    multi = invoke("export", "verl", "env=game24", "env.mode=steps", "env.split=train", f"out={tmp_path / 'b'}")
    assert multi.exit_code == 2 and "is multi-turn here" in multi.output
    bad = invoke("export", "verl", "env=math", "env.difficultee=2", f"out={tmp_path / 'c'}")
    assert bad.exit_code == 2 and "env.difficultee" in bad.output
    assert list(tmp_path.iterdir()) == []


def test_a_missing_data_file_is_the_users_error_not_a_failed_write(tmp_path, monkeypatch):
    # Game24's held-out split reads the ToT puzzle file: absent, the export says so (exit 2) instead of calling it a
    # failed write of the output folder (exit 1), and writes nothing.
    monkeypatch.setenv("LRMGYM_SHARED_DATA", str(tmp_path / "no-data"))
    out = tmp_path / "out"
    result = invoke("export", "verl", "env=game24", f"out={out}")
    assert result.exit_code == 2, result.output
    assert "24.csv" in result.output and "LRMGYM_SHARED_DATA" in result.output and "cannot write" not in result.output
    assert not out.exists()


# ------------------------------------------------------------------------------------------ settings: the exporter's
SANDBOX_LABEL = json.dumps({"v": 1, "env": {"id": "lrmgym/Code-v0", "sandbox": "process"}, "index": 0, "seed": 0})


def test_a_label_cannot_choose_the_sandbox_or_the_bounds():
    with pytest.raises(LabelError, match=r"^extra_info\.label\.env: sandbox: a label names its task, never a setting"):
        verl.compute_score("lrmgym/code", "x", None, {"label": SANDBOX_LABEL})
    slow = json.dumps({"v": 1, "env": {"id": "lrmgym/Math-v0", "timeout_s": 60}, "index": 0, "seed": 0})
    with pytest.raises(LabelError, match=r"^extra_infos\[0\]\.label\.env: timeout_s: a label names its task"):
        verl.compute_score_batch(["lrmgym/math"], ["x"], [None], [{"label": slow}])


def test_the_written_reward_py_grades_with_the_exporters_settings(tmp_path):
    cfg = resolve(["env=code", "env.timeout_s=1.5", "env.memory_mb=256", "env.workers=1"])
    export = verl.export_verl(cfg, tmp_path / "code", n_train=2, n_test=1)
    spec = importlib.util.spec_from_file_location("custom_module", export.out_dir / "reward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    row = _rows(export.out_dir / "train.parquet")[0]
    assert "timeout_s" not in decode_label(row["extra_info"]["label"]).env
    loop = "```python\nwhile True:\n    pass\n```"
    result = module.compute_score(row["data_source"], loop, None, row["extra_info"])
    assert result["score"] == 0.0
    world = module.compute_score.__self__.scorer.fixed
    assert (world.env.config.timeout_s, world.env.config.memory_mb, world.env.config.workers) == (1.5, 256, 1)
    with pytest.raises(LabelError, match=r"sandbox: a label names its task, never a setting"):
        module.compute_score("lrmgym/code", "x", None, {"label": SANDBOX_LABEL})
    module.compute_score.__self__.close()
