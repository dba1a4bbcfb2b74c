"""Labels, the Scorer and the prompt data files: what lets a remote trainer rebuild a task, its env and judges."""

from __future__ import annotations

import json
import re
import time

import pytest
from integration_helpers import adversarial_cases, reference_rewards

from lrmgym.configs.resolve import resolve
from lrmgym.eval.runner import select_tasks
from lrmgym.integrations.labels import (
    LABEL_VERSION,
    MAX_LABEL_CHARS,
    Label,
    LabelError,
    Scorer,
    World,
    completion_from_query,
    datasource_name,
    decode_label,
    encode_label,
    short_label,
    strip_stop_texts,
    write_data,
)

MATH = ["env=math", "judge=[accuracy,format_strict]"]
LONG = "Q: " + " ".join(f"n{i}" for i in range(200)) + " A:"


@pytest.fixture(scope="module")
def math_cfg():
    return resolve(MATH)


@pytest.fixture(scope="module")
def math_world(math_cfg):
    world = World(math_cfg.env, math_cfg.judge)
    yield world
    world.close()


def _r1(answer: str) -> str:
    return f"<think>working</think><answer>{answer}</answer>"


# ------------------------------------------------------------------------------------------------ encode / decode
def test_label_round_trip_is_canonical_json(math_cfg):
    text = encode_label(math_cfg.env, 17, 3)
    assert isinstance(text, str)
    data = json.loads(text)
    assert data["v"] == LABEL_VERSION and data["index"] == 17 and data["seed"] == 3
    settings = {"timeout_s", "max_answer_chars", "source", "data_dir", "strict"}
    assert data["env"] == {k: v for k, v in math_cfg.env.model_dump(mode="json").items() if k not in settings}
    # the same configs as dumps give the same string: labels can be compared and cached as text
    assert encode_label(data["env"], 17, 3) == text
    label = decode_label(text)
    assert (label.index, label.seed, label.env) == (17, 3, data["env"])
    assert decode_label(label) is label and decode_label(data) == label and label.encode() == text


def test_short_label_round_trip():
    label = decode_label(short_label(4, 9))
    assert label == Label(index=4, seed=9) and label.short and label.encode() == short_label(4, 9)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "label: the label is empty. Give each row the label `lrmgym export openrlhf` wrote (OpenRLHF: "
             "--data.label_key label)"),
        ("{nope", "label: not a JSON label (JSONDecodeError"),
        ("[1, 2]", "label: expected a JSON object, got list: [1, 2]."),
        ('{"v": 1, "index": 0, "seed": 0, "task": 3}', "label.task: unknown key; a label has only v, env, index, "
                                                       "seed."),
        ('{"v": 2, "index": 0, "seed": 0}', "label.v: label format 2 is not the one this lrmgym reads (1)"),
        ('{"index": 0, "seed": 0}', "label.v: label format None is not the one this lrmgym reads (1)"),
        ('{"v": 1, "seed": 0}', "label.index: missing; a label names its task by index and seed."),
        ('{"v": 1, "index": -1, "seed": 0}', "label.index: expected a non-negative integer, got -1."),
        ('{"v": 1, "index": true, "seed": 0}', "label.index: expected a non-negative integer, got True."),
        ('{"v": 1, "index": 0, "seed": "0"}', "label.seed: expected a non-negative integer, got '0'."),
        ('{"v": 1, "index": 0, "seed": 0, "env": {"difficulty": 1}}', "label.env: expected an env config object "
                                                                      "with an 'id' string"),
        ('{"v": 1, "index": 0, "seed": 0, "judge": {}}', "label.judge: a label names its task, never its judges"),
        (7, "label: expected a label string (JSON), got int: 7."),
        ("[" * 100_000, "label: not a JSON label (RecursionError"),
    ],
)  # fmt: skip
def test_decode_errors_name_the_field_and_value(text, message):
    with pytest.raises(LabelError) as err:
        decode_label(text)
    assert str(err.value).startswith(message)


def test_decode_refuses_an_oversized_label():
    with pytest.raises(LabelError, match=rf"^label: the label is {MAX_LABEL_CHARS + 1} characters, over the limit"):
        decode_label("x" * (MAX_LABEL_CHARS + 1))


def test_encode_refuses_bad_values(math_cfg):
    with pytest.raises(LabelError, match=r"^index: expected a non-negative integer, got -2\.$"):
        encode_label(math_cfg.env, -2, 0)
    with pytest.raises(LabelError, match=r"^env: the config has no 'id' string"):
        encode_label({"difficulty": 1}, 0, 0)


def test_a_label_with_an_invalid_env_option_names_it():
    label = encode_label({"id": "lrmgym/Math-v0", "difficulty": 9}, 0, 0)
    with pytest.raises(LabelError, match=r"^labels\[0\]: env\.difficulty: "):
        Scorer().score([label], ["x"])


# ------------------------------------------------------------------------------------------------ completions
@pytest.mark.parametrize(
    ("query", "prompt", "expected"),
    [
        ("Q:1+1. A:<think>2</think><answer>2</answer><eos>", "Q:1+1. A:", ("<think>2</think><answer>2</answer>", True)),
        ("<s>Q: hi A: yes</s>", "Q: hi A:", (" yes", True)),  # a BOS text before the prompt
        ("only the model wrote this", "a prompt that is not there", ("only the model wrote this", False)),
        ("answer\n", "", ("answer\n", True)),  # the completion's own trailing newline stays
        (LONG[200:] + "ok<|im_end|>\n<|endoftext|>", LONG, ("ok", True)),  # a prompt cut on the left
    ],
)
def test_completion_from_query(query, prompt, expected):
    assert completion_from_query(query, prompt) == expected


def test_strip_stop_texts():
    assert strip_stop_texts("ans<|im_end|>  <pad><pad>") == "ans"
    assert strip_stop_texts("ans\n") == "ans\n"
    assert strip_stop_texts("ans</s>", stop_texts=()) == "ans</s>"


# ------------------------------------------------------------------------------------------------ the scorer
def test_scorer_matches_lrmgym_judge_on_normal_and_hostile_completions(math_cfg, math_world, tmp_path):
    math = [c["input"]["pred"] for c in adversarial_cases("math_verifier")]
    slow = {"power_tower_plain", "huge_factorial"}  # two that run into the 2 s bound; the rest are pre-filtered
    bounded = [c["input"]["pred"] for c in adversarial_cases("math_verifier") if c["name"] in slow]
    tasks = [math_world.task(i, 0) for i in range(3)]
    texts = [
        [tasks[0].metadata["solution"], _r1("-1"), "no format at all", "\x00\udcff\x7f binary", "A" * 2_000_000],
        [_r1(p) for p in bounded] + [p for p in math if len(p) < 50_000],
        [_r1(str(tasks[2].answer)) + " trailing text", _r1(str(tasks[2].answer)) + "<eos>"],
    ]
    labels = [encode_label(math_cfg.env, i, 0) for i, t in enumerate(texts) for _ in t]
    flat = [x for t in texts for x in t]
    start = time.perf_counter()
    scores = Scorer(math_cfg.env, math_cfg.judge).score(labels, flat)
    assert time.perf_counter() - start < 120  # the verifier's bounds hold (a hang never ends); load only slows
    expected = reference_rewards(math_cfg, list(zip(tasks, texts, strict=True)), tmp_path)
    assert [s.reward for s in scores] == [r for group in expected for r in group]
    assert scores[0].reward == 2.0 and scores[0].score == 1.0  # accuracy + strict format
    assert {tuple(s.extra_logs) for s in scores} == {tuple(scores[0].extra_logs)}  # the same keys for every item
    assert set(scores[0].extra_logs) == {
        "judge/accuracy", "judge/format_strict", "verdict/correct", "verdict/format_ok", "verdict/ungradeable",
        "verdict/oversize", "verdict/prompt_not_found",
    }  # fmt: skip
    assert all(isinstance(v, float) for s in scores for v in s.extra_logs.values())


def test_scorer_groups_items_of_one_task_for_group_judges(tmp_path):
    cfg = resolve(["env=math", "judge=arena"])
    world = World(cfg.env, cfg.judge)
    task = world.task(0, 0)
    answer = int(task.answer)
    near, far = _r1(str(answer + 1)), _r1(str(answer + 50))  # both wrong: a zero-variance group, routed
    label = world.label(0, 0)
    scorer = Scorer(cfg.env, cfg.judge)
    together = scorer.score([label, label], [near, far])
    apart = [scorer.score([label], [text])[0] for text in (near, far)]
    expected = reference_rewards(cfg, [(task, [near, far])], tmp_path)[0]
    assert [s.reward for s in together] == expected == [1.0, 0.0]  # the nearer one wins the tournament
    assert [s.reward for s in apart] == [0.0, 0.0]  # alone, a trace is never routed
    scorer.close()
    world.close()


def test_ungradeable_verdicts_get_the_failure_value_and_a_flag():
    cfg = resolve([
        "env=math", "judge=[accuracy,llm_pointwise]", "judge.llm_pointwise.policy.base_url=http://127.0.0.1:9/v1",
        "judge.llm_pointwise.max_retries=0", "judge.llm_pointwise.policy.max_retries=0",
        "judge.accuracy.weight=0",  # the LLM judge alone decides: its failure leaves the sample ungradeable
    ])  # fmt: skip
    world = World(cfg.env, cfg.judge)
    (score,) = world.score_texts(0, 0, [_r1("1")])
    assert score.verdict.score is None
    assert score.reward == world.failure_value == 0.0 and score.score == 0.0
    assert score.extra_logs["verdict/ungradeable"] == 1.0 and score.extra_logs["judge/llm_pointwise"] == 0.0


def test_oversized_completions_fail_without_being_graded(math_cfg):
    world = World(math_cfg.env, math_cfg.judge, max_completion_chars=1000)
    task = world.task(0, 0)
    big, ok = world.score_texts(0, 0, [task.metadata["solution"] + " " * 2000, task.metadata["solution"]])
    assert (big.reward, big.extra_logs["verdict/oversize"], ok.reward) == (0.0, 1.0, 2.0)


def test_scorer_builds_each_world_once_and_caps_them(math_cfg):
    scorer = Scorer(max_worlds=1)
    label = encode_label(math_cfg.env, 0, 0)
    scorer.score([label, label], ["a", "b"])
    scorer.score([label], ["c"])
    assert len(scorer.worlds) == 1
    other = encode_label({**math_cfg.env.model_dump(mode="json"), "difficulty": 2}, 0, 0)
    with pytest.raises(LabelError, match=r"^labels\[1\]: this label's env and judges would be distinct config "):
        scorer.score([label, other], ["a", "b"])
    with pytest.raises(LabelError, match=r"^labels\[0\]: a short label \(index and seed only\) needs a scorer with "):
        scorer.score([short_label(0, 0)], ["a"])
    with pytest.raises(LabelError, match=r"^labels: 2 labels for 1 completions; give one label each\.$"):
        scorer.score([label, label], ["a"])
    scorer.close()


def test_a_fixed_scorer_takes_short_labels_its_own_and_its_eval_split(math_cfg):
    scorer = Scorer(math_cfg.env, math_cfg.judge)
    env = math_cfg.env.model_dump(mode="json")
    own = encode_label(env, 1, 0)
    held_out = encode_label({**env, "split": "test"}, 1, 0)
    a, b, c = scorer.score([short_label(1, 0), own, held_out], ["x", "x", "x"])
    assert a.reward == b.reward == c.reward == 0.0
    assert len(scorer.worlds) == 2  # the server's env and its test split
    variant = [w for w in scorer.worlds if w is not scorer.fixed][0]
    assert variant.judge_config == scorer.fixed.judge_config and variant.env_config["split"] == "test"
    other = encode_label({**env, "difficulty": 3}, 0, 0)
    with pytest.raises(LabelError) as err:
        scorer.score([other], ["x"])
    assert re.match(r"labels\[0\]: the label describes another env than this one \(env option\(s\) "
                    r"difficulty differ", str(err.value))  # fmt: skip
    with pytest.raises(LabelError, match=r"\(env option\(s\) id differ;"):
        scorer.score([encode_label({"id": "lrmgym/Echo-v0"}, 0, 0)], ["x"])
    scorer.close()


# ------------------------------------------------------------------------------------------------ data files
def test_write_data_rows_rebuild_their_tasks(math_cfg, tmp_path):
    cfg = resolve([*MATH, "run.seed=5", "eval.seed=2"])
    info = write_data(cfg, tmp_path, 6, 4)
    assert (info["train_rows"], info["eval_rows"], info["datasource"], info["warnings"]) == (6, 4, "math", [])
    train = [json.loads(line) for line in info["train"].read_text().splitlines()]
    held_out = [json.loads(line) for line in info["eval"].read_text().splitlines()]
    assert len(train) == 6 and len(held_out) == 4
    assert all(set(r) == {"prompt", "label", "datasource"} and isinstance(r["label"], str) for r in train + held_out)
    scorer = Scorer()
    env = cfg.env.make()
    for i, row in enumerate(train):
        label = decode_label(row["label"])
        task = scorer.world(label).task(label.index, label.seed)
        assert (label.index, label.seed) == (i, 5)
        assert task == env.task_at(i, seed=5) and row["prompt"] == task.prompt
    grader, tasks = select_tasks(env, cfg.eval.model_copy(update={"tasks": 4}))
    for row, task in zip(held_out, tasks, strict=True):  # the tasks `lrmgym eval` picks: the test split, eval.seed
        label = decode_label(row["label"])
        assert label.env["split"] == "test" and label.seed == 2
        assert scorer.world(label).task(label.index, label.seed) == task and row["prompt"] == task.prompt
    scorer.close()


def test_write_data_warns_when_train_and_eval_are_the_same_tasks(tmp_path):
    cfg = resolve([*MATH, "env.split=test"])
    info = write_data(cfg, tmp_path, 2, 2)
    assert len(info["warnings"]) == 1 and info["warnings"][0].startswith("train and eval rows are the same tasks")
    assert write_data(cfg, tmp_path / "no-eval", 2, 0)["eval"] is None


def test_write_data_refuses_bad_counts(math_cfg, tmp_path):
    with pytest.raises(ValueError, match=r"^n_train must be a positive integer, got 0\.$"):
        write_data(math_cfg, tmp_path, 0)
    with pytest.raises(ValueError, match=r"^n_eval must be a non-negative integer \(0: no eval file\), got -1\.$"):
        write_data(math_cfg, tmp_path, 1, -1)


def test_datasource_name():
    assert [datasource_name(i) for i in ("lrmgym/Math-v0", "lrmgym/Game24-v0", "acme/Sudoku-v12")] == [
        "math", "game24", "sudoku",
    ]  # fmt: skip


# ------------------------------------------------------------------------------------------ labels carry no settings
SETTINGS = [
    ({"id": "lrmgym/Code-v0", "sandbox": "process"}, "sandbox"),
    ({"id": "lrmgym/Code-v0", "warm_sandbox": False}, "warm_sandbox"),
    ({"id": "lrmgym/Code-v0", "timeout_s": 60}, "timeout_s"),
    ({"id": "lrmgym/Code-v0", "memory_mb": 65536, "output_bytes": 1 << 26}, "memory_mb, output_bytes"),
    ({"id": "lrmgym/Code-v0", "workers": 256}, "workers"),
    ({"id": "lrmgym/Code-v0", "python": "/bin/sh"}, "python"),
    ({"id": "lrmgym/Code-v0", "feedback": "full"}, "feedback"),
    ({"id": "lrmgym/Math-v0", "timeout_s": 60, "max_answer_chars": 100000}, "max_answer_chars, timeout_s"),
    ({"id": "lrmgym/Math-v0", "source": "/etc/passwd"}, "source"),
    ({"id": "lrmgym/Math-v0", "data_dir": "/"}, "data_dir"),
    ({"id": "lrmgym/Game24-v0", "data_path": "/etc/shadow"}, "data_path"),
    ({"id": "lrmgym/Math-v0", "strict": False}, "strict"),
    ({"id": "lrmgym/Plugin-v0", "judge_url": "http://x", "cache_path": "/x", "max_wait_s": 9},
     "cache_path, judge_url, max_wait_s"),  # a plug-in env's options shaped like settings
]  # fmt: skip


@pytest.mark.parametrize(("env", "keys"), SETTINGS)
def test_a_label_that_names_a_setting_is_refused_in_one_error(env, keys):
    text = json.dumps({"v": 1, "env": env, "index": 0, "seed": 0})
    with pytest.raises(LabelError) as err:
        decode_label(text, "labels[2]")
    assert str(err.value).startswith(
        f"labels[2].env: {keys}: a label names its task, never a setting (sandbox, time and memory bounds, workers, "
        "files, endpoints); those come from the exporter's config"
    )


def test_a_label_with_judges_is_refused(math_cfg):
    judge = {"j": {"kind": "llm_pointwise", "policy": {"kind": "openai", "base_url": "http://evil:1/v1", "model": "m"}}}
    text = json.dumps({"v": 1, "env": {"id": "lrmgym/Math-v0"}, "judge": judge, "index": 0, "seed": 0})
    with pytest.raises(LabelError, match=r"^label\.judge: a label names its task, never its judges \(LLM endpoints, "):
        decode_label(text)


def test_labels_are_written_without_settings_and_rebuild_with_the_exporters(math_cfg, tmp_path):
    cfg = resolve(["env=code", "env.timeout_s=7", "env.memory_mb=512", "env.order=random"])
    world = World(cfg.env, {})
    label = json.loads(world.label(3, 1))
    assert set(label) == {"v", "env", "index", "seed"}
    assert label["env"]["order"] == "random" and "timeout_s" not in label["env"] and "sandbox" not in label["env"]
    assert "source" not in label["env"]  # a data source is the exporter's: a path in a label would name a file
    scorer = Scorer(cfg.env, {})  # the exporter's config gives the settings back
    built = scorer.world(decode_label(world.label(3, 1)))
    assert built is scorer.fixed and built.env.config.timeout_s == 7 and built.env.config.memory_mb == 512
    scorer.close()
    world.close()
    # an open scorer (no exporter's config) builds the label's task with this process's own defaults
    open_scorer = Scorer()
    code = json.dumps({"v": 1, "env": {"id": "lrmgym/Code-v0"}, "index": 0, "seed": 0})
    opened = open_scorer.world(decode_label(code))
    assert opened.env.config.sandbox == "auto" and opened.env.config.timeout_s == 5.0
    open_scorer.close()


def test_a_label_naming_a_source_is_refused_before_any_file_is_touched(math_cfg, monkeypatch):
    import lrmgym.configs.resolve as resolve_module

    scorer = Scorer(math_cfg.env, math_cfg.judge)

    def no_files(*args, **kwargs):
        raise AssertionError("the label's env was validated (files opened) before it was refused")

    monkeypatch.setattr(resolve_module, "validate_env", no_files)
    big = json.dumps({"v": 1, "env": {"id": "lrmgym/Math-v0", "source": "/some/260MB.jsonl"}, "index": 0, "seed": 0})
    with pytest.raises(LabelError, match=r"^labels\[0\]\.env: source: a label names its task, never a setting"):
        scorer.prepare([big], ["x"])
    scorer.close()
