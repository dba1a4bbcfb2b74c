"""lrmgym.adapters.trl: reward functions in TRL's signature, the data set, and TRL's GRPOTrainer training on them."""

from __future__ import annotations

import json
import math

import pytest
from adapter_helpers import adversarial_math_completions, build_judges, contributions, judge_verdicts

from lrmgym.adapters import trl as adapter
from lrmgym.configs.errors import ConfigError
from lrmgym.core import Verdict
from lrmgym.integrations.labels import LabelError, decode_label

MATH_JUDGES = ["accuracy", "format_strict"]


def _r1(answer: str) -> str:
    return f"<think>working</think><answer>{answer}</answer>"


@pytest.fixture(scope="module")
def math_rows():
    """Three math tasks: their labels, and for each a correct, a wrong, an unformatted and an empty completion."""
    data = adapter.dataset(env="math", n=3)
    env_cfg, _ = adapter.resolve_configs("math")
    env = env_cfg.make().unwrapped
    labels, texts = [], []
    for label in data["label"]:
        task = env.task_at(decode_label(label).index, seed=0)
        for text in (_r1(task.answer), _r1(str(int(task.answer) + 1)), f"the answer is {task.answer}", ""):
            labels.append(label)
            texts.append(text)
    return labels, texts


@pytest.fixture(scope="module")
def math_funcs():
    funcs = adapter.reward_funcs(env="math", judge=MATH_JUDGES)
    yield funcs
    funcs[0].close()


def _reference(judge, labels, texts, tmp_path, **overrides):
    env_cfg, judge_cfgs = adapter.resolve_configs("math", judge, **overrides)
    return judge_verdicts(env_cfg, build_judges(judge_cfgs), labels, texts, tmp_path)


# ------------------------------------------------------------------------------------------------ the functions
def test_one_function_per_judge_each_its_weighted_part_summing_to_lrmgym_judge(math_funcs, math_rows, tmp_path):
    labels, texts = math_rows
    assert [f.__name__ for f in math_funcs] == MATH_JUDGES  # TRL logs rewards/accuracy/mean, rewards/format_strict/mean
    outputs = [f(prompts=[""] * len(texts), completions=texts, label=labels) for f in math_funcs]
    verdicts = _reference(MATH_JUDGES, labels, texts, tmp_path)
    for k, verdict in enumerate(verdicts):
        parts = contributions(verdict, MATH_JUDGES)
        assert [out[k] for out in outputs] == pytest.approx([parts[n] for n in MATH_JUDGES])
        assert sum(out[k] for out in outputs) == pytest.approx(verdict["score"])
    assert outputs[0][:4] == [1.0, 0.0, 0.0, 0.0]  # correct, wrong, unformatted, empty
    assert outputs[1][:4] == [1.0, 1.0, 0.0, 0.0]


def test_weights_come_from_the_judges_as_dotted_or_double_underscore_overrides(math_rows, tmp_path):
    labels, texts = math_rows
    dotted = adapter.reward_funcs(env="math", judge=MATH_JUDGES, **{"judge.format_strict.weight": 0.5})
    under = adapter.reward_funcs(env="math", judge=MATH_JUDGES, judge__format_strict__weight=0.5)
    a = [f(None, texts, label=labels) for f in dotted]
    b = [f(None, texts, label=labels) for f in under]
    assert a == b
    verdicts = _reference(MATH_JUDGES, labels, texts, tmp_path, **{"judge.format_strict.weight": 0.5})
    assert a[1] == pytest.approx([contributions(v, MATH_JUDGES)["format_strict"] for v in verdicts])
    assert set(a[1]) == {0.0, 0.5}  # format_strict scores 1 or 0, weighted 0.5
    assert [x + y for x, y in zip(*a, strict=True)] == pytest.approx([v["score"] for v in verdicts])
    dotted[0].close()
    under[0].close()


def test_one_function_with_components_false_or_without_judges(math_rows, tmp_path):
    labels, texts = math_rows
    (total,) = adapter.reward_funcs(env="math", judge=MATH_JUDGES, components=False)
    (alone,) = adapter.reward_funcs(env="math")
    assert total.__name__ == "lrmgym" and alone.__name__ == "math"
    judged = _reference(MATH_JUDGES, labels, texts, tmp_path)
    assert total(None, texts, label=labels) == pytest.approx([v["score"] for v in judged])
    env_cfg, _ = adapter.resolve_configs("math")
    plain = judge_verdicts(env_cfg, build_judges({"accuracy": {"kind": "accuracy"}}), labels, texts, tmp_path)
    assert alone(None, texts, label=labels) == pytest.approx([v["score"] for v in plain])
    total.close()
    alone.close()


def test_conversational_completions_grade_their_last_assistant_message(math_funcs, math_rows):
    labels, texts = math_rows
    standard = [f(None, texts, label=labels) for f in math_funcs]
    messages = [[{"role": "assistant", "content": t}] for t in texts]
    parts = [[{"role": "assistant", "content": [{"type": "text", "text": t[:5]}, {"type": "text", "text": t[5:]}]}]
             for t in texts]  # fmt: skip
    tools = [[{"role": "assistant", "content": "", "tool_calls": [{"name": "x"}]}, {"role": "tool", "content": "42"},
              {"role": "assistant", "content": t}] for t in texts]  # fmt: skip
    prompts = [[{"role": "user", "content": "Q"}]] * len(texts)
    for completions in (messages, parts, tools):
        assert [f(prompts, completions, label=labels) for f in math_funcs] == standard


def test_extra_columns_arrive_as_keywords_and_the_batch_is_graded_once(math_funcs, math_rows, monkeypatch):
    labels, texts = math_rows
    world = math_funcs[0].grader.world
    calls, metrics, extra = [], [], []
    grade = world.grade
    monkeypatch.setattr(world, "grade", lambda task, completions: calls.append(task.id) or grade(task, completions))
    kwargs = dict(
        label=labels, task_id=["t"] * len(texts), answer=["x"] * len(texts), completion_ids=[[1]] * len(texts),
        trainer_state=object(), log_metric=lambda name, value: metrics.append((name, value)),
        log_extra=lambda column, values: extra.append((column, len(values))),
    )  # fmt: skip
    first = [f([""] * len(texts), texts, **kwargs) for f in math_funcs]
    assert len(calls) == 3  # three tasks, each graded once for both functions
    again = [f([""] * len(texts), texts, **kwargs) for f in math_funcs]  # the next step, the same batch
    assert len(calls) == 6 and again == first
    assert {name for name, _ in metrics} == {"lrmgym/correct", "lrmgym/format_ok", "lrmgym/ungradeable"}
    assert dict(metrics)["lrmgym/correct"] == pytest.approx(3 / 12)
    assert extra == [("lrmgym/reason", len(texts))] * 2  # once per batch, not once per function


def test_an_ungradeable_verdict_is_none_from_every_function(math_funcs, math_rows, monkeypatch):
    labels, texts = math_rows
    world = math_funcs[0].grader.world
    grade = world.grade

    def failing(task, completions):
        out = grade(task, completions)
        return [Verdict.ungradeable("judge endpoint down")] + out[1:]

    monkeypatch.setattr(world, "grade", failing)
    outputs = [f(None, texts, label=labels) for f in math_funcs]
    for k in (0, 4, 8):  # the first completion of each task: TRL turns None into NaN and masks the row out
        assert [out[k] for out in outputs] == [None, None]
    assert all(out[1] is not None for out in outputs)


def test_hostile_completions_never_raise(math_funcs, math_rows):
    labels, _ = math_rows

    class Evil:
        def __str__(self):
            raise RuntimeError("no")

    hostile = [
        None, 123, 4.5, {}, [], [{}], [{"role": "assistant"}], [{"role": "assistant", "content": None}],
        [{"content": ["x", 1, {"text": 2}]}], {"content": _r1("22")}, [["nested", ["deeper"]]], Evil(),
        "\ud800" + _r1("1"), "\x00\xff" * 1000, "<answer>" * 20000, "x" * (17 * 1024 * 1024),
    ]  # fmt: skip
    for start in range(0, len(hostile), 4):
        batch = hostile[start : start + 4]
        for f in math_funcs:
            out = f([""] * len(batch), batch, label=labels[: len(batch)])
            assert len(out) == len(batch)
            assert all(v is None or (isinstance(v, float) and math.isfinite(v)) for v in out)


def test_adversarial_math_completions_score_as_lrmgym_judge_scores_them(math_funcs, tmp_path):
    texts = adversarial_math_completions()
    labels = [adapter.dataset(env="math", n=1)["label"][0]] * len(texts)
    ours = [f(None, texts, label=labels) for f in math_funcs]
    assert all(v is not None and math.isfinite(v) for out in ours for v in out)
    verdicts = _reference(MATH_JUDGES, labels, texts, tmp_path)
    assert [a + b for a, b in zip(*ours, strict=True)] == pytest.approx([v["score"] for v in verdicts])


def test_call_problems_are_clear_errors(math_funcs, math_rows):
    labels, texts = math_rows
    with pytest.raises(LabelError, match=r"no 'label' column arrived .* lrmgym\.adapters\.trl\.dataset"):
        math_funcs[0](None, texts, task_id=labels)
    with pytest.raises(ValueError, match=r"got 2 prompts, 12 completions and 12 'label' values"):
        math_funcs[0](["a", "b"], texts, label=labels)
    with pytest.raises(LabelError, match=r"label\[0\]: not a JSON label"):
        math_funcs[0](None, ["x"], label=["not json"])
    other = adapter.dataset(env="game24", n=1, split="train")["label"]  # generated puzzles: no data file needed
    with pytest.raises(LabelError, match="another env than this one"):
        math_funcs[0](None, ["x"], label=other)


def test_a_label_cannot_choose_a_setting(math_funcs):
    env = {"id": "lrmgym/Math-v0", "timeout_s": 60, "workers": 64}
    hostile = json.dumps({"v": 1, "env": env, "index": 0, "seed": 0})
    with pytest.raises(LabelError, match=r"^label\[0\]\.env: timeout_s, workers: a label names its task, never a "):
        math_funcs[0](None, ["x"], label=[hostile])


def test_labels_of_the_held_out_split_grade_the_held_out_tasks(math_funcs, tmp_path):
    test = adapter.dataset(env="math", n=2, split="test")
    assert {decode_label(x).env["split"] for x in test["label"]} == {"test"}
    labels = [x for x in test["label"] for _ in range(2)]
    env_cfg, _ = adapter.resolve_configs("math", None, **{"env.split": "test"})
    tasks = [env_cfg.make().unwrapped.task_at(decode_label(x).index, seed=0) for x in labels]
    texts = [_r1(t.answer) if k % 2 == 0 else _r1("nope") for k, t in enumerate(tasks)]
    outputs = [f(None, texts, label=labels) for f in math_funcs]
    assert outputs[0] == [1.0, 0.0, 1.0, 0.0]
    verdicts = _reference(MATH_JUDGES, labels, texts, tmp_path, **{"env.split": "test"})
    assert [a + b for a, b in zip(*outputs, strict=True)] == pytest.approx([v["score"] for v in verdicts])


def test_group_judges_see_each_prompts_group_in_any_order(tmp_path):
    data = adapter.dataset(env="math", n=3)
    env_cfg, judge_cfgs = adapter.resolve_configs("math", ["arena", "format_strict"])
    env = env_cfg.make().unwrapped
    labels, texts = [], []
    for label in data["label"]:
        task = env.task_at(decode_label(label).index, seed=0)
        for text in (_r1(task.answer), f"<think>{task.answer} maybe</think><answer>{task.answer}</answer>",
                     f"<think>long {'x' * 40}</think><answer>{task.answer}</answer>", _r1("0")):  # fmt: skip
            labels.append(label)
            texts.append(text)
    order = [0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11]  # the groups interleaved
    funcs = adapter.reward_funcs(env="math", judge=["arena", "format_strict"])
    assert [f.__name__ for f in funcs] == ["arena", "format_strict"]
    shuffled = [[f(None, [texts[i] for i in order], label=[labels[i] for i in order])] for f in funcs]
    verdicts = judge_verdicts(env_cfg, build_judges(judge_cfgs), labels, texts, tmp_path)
    for pos, i in enumerate(order):
        parts = contributions(verdicts[i], ["arena", "format_strict"])
        assert [s[0][pos] for s in shuffled] == pytest.approx([parts["arena"], parts["format_strict"]])
    funcs[0].close()


def test_group_judges_refuse_a_group_split_over_processes(math_rows, monkeypatch):
    labels, texts = math_rows
    funcs = adapter.reward_funcs(env="math", judge="arena")
    monkeypatch.setattr(adapter, "_world_size", lambda: 2)
    with pytest.raises(RuntimeError, match="spreads a prompt's num_generations completions over its 2 processes"):
        funcs[0](None, texts, label=labels)
    (plain,) = adapter.reward_funcs(env="math")
    assert len(plain(None, texts, label=labels)) == len(texts)  # pointwise grading is per completion: fine
    funcs[0].close()
    plain.close()


def test_multi_turn_envs_are_refused_naming_what_trl_lacks():
    message = r"env: lrmgym/Game24-v0 is multi-turn here .* TRL's GRPOTrainer cannot train: .*environment_factory"
    with pytest.raises(ConfigError, match=message):
        adapter.reward_funcs(env="game24", **{"env.mode": "steps", "env.split": "train"})
    with pytest.raises(ConfigError, match=message):
        adapter.dataset(env="game24", n=2, **{"env.mode": "steps", "env.split": "train"})


# ------------------------------------------------------------------------------------------------ configs and data
def test_config_choices_and_their_errors():
    env_cfg, judges = adapter.resolve_configs("math", "format_strict")
    assert env_cfg.id == "lrmgym/Math-v0" and list(judges) == ["accuracy", "format_strict"]  # as `lrmgym run` adds it
    env_cfg2, judges2 = adapter.resolve_configs(env_cfg, {n: j for n, j in judges.items()})
    assert env_cfg2 == env_cfg and judges2 == judges
    assert adapter.resolve_configs({"id": "lrmgym/Math-v0", "difficulty": 2})[0].options["difficulty"] == 2
    with pytest.raises(ConfigError, match=r"learner\.lr: not an override of this adapter"):
        adapter.resolve_configs("math", **{"learner.lr": 1.0})
    with pytest.raises(ConfigError, match=r"env\.difficultee: unknown key"):
        adapter.resolve_configs("math", env__difficultee=2)
    with pytest.raises(ConfigError, match="judge: unknown preset 'acuracy'"):
        adapter.resolve_configs("math", "acuracy")
    with pytest.raises(ConfigError, match="env: expected a preset name, an env id, an EnvConfig or a mapping"):
        adapter.resolve_configs(None)
    with pytest.raises(ConfigError, match="judge: expected a preset name, a list of them or configs by name"):
        adapter.resolve_configs("math", 3)


def test_dataset_columns_prompts_and_labels():
    data = adapter.dataset(env="math", n=5, seed=3)
    assert data.column_names == ["prompt", "label", "task_id"] and len(data) == 5
    env = adapter.resolve_configs("math")[0].make().unwrapped
    for i, row in enumerate(data):
        label = decode_label(row["label"])
        assert (label.index, label.seed) == (i, 3) and "timeout_s" not in label.env
        task = env.task_at(i, seed=3)
        assert row["prompt"] == task.prompt and row["task_id"] == task.id
    judged = adapter.dataset(env="math", n=1, judge=MATH_JUDGES)  # judges are the grader's: never in a label
    assert "judge" not in json.loads(judged["label"][0])
    assert decode_label(judged["label"][0]).env == decode_label(data["label"][0]).env
    with pytest.raises(ValueError, match="n must be a positive integer"):
        adapter.dataset(env="math", n=0)
    with pytest.raises(ConfigError, match=r"env\.split"):
        adapter.dataset(env="echo", n=1, split="test")


def test_a_chat_env_gives_conversational_prompts(shared_data):
    chat = adapter.dataset(env="gsm8k", n=2)  # GSM8K (shared data): TRL's conversational format
    assert isinstance(chat["prompt"][0], list) and chat["prompt"][0][0]["role"] == "user"


# ------------------------------------------------------------------------------------------------ the real trainer
@pytest.mark.filterwarnings("ignore:.*checkpointing.*:FutureWarning")  # transformers 5 renames, called inside TRL
def test_trl_grpo_trainer_trains_on_the_adapter_with_lrmgym_judges_rewards(tmp_path):
    """TRL's GRPOTrainer, 3 steps on CPU; the completions it generated and the rewards it computed are lrmgym's."""
    pytest.importorskip("trl", reason="TRL is not installed (pip install -e '.[test]' or '.[trl]')")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from lrmgym.policies.tiny import SHIPPED_DIR

    judges = ["arena", "format_strict"]  # a group-aware judge: it must see each prompt's 4 completions together
    tokenizer = AutoTokenizer.from_pretrained(str(SHIPPED_DIR))
    tokenizer.padding_side = "left"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(SHIPPED_DIR))  # the shipped tiny Llama: at the edge of competence
    funcs = adapter.reward_funcs(env="math", judge=judges)
    calls: dict[str, list[tuple[list, list, list]]] = {f.__name__: [] for f in funcs}

    def recording(func):
        def reward(prompts, completions, **kwargs):
            out = func(prompts, completions, **kwargs)
            calls[func.__name__].append((list(completions), list(kwargs["label"]), out))
            return out

        reward.__name__ = func.__name__
        return reward

    args = GRPOConfig(
        output_dir=str(tmp_path / "grpo"), use_cpu=True, report_to=[], seed=0, max_steps=3, logging_steps=1,
        per_device_train_batch_size=8, num_generations=4, max_completion_length=32, temperature=1.2,
        learning_rate=1e-3, save_strategy="no", bf16=False, dataloader_num_workers=0,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=model, reward_funcs=[recording(f) for f in funcs], args=args,
        train_dataset=adapter.dataset(env="math", n=16), processing_class=tokenizer,
    )  # fmt: skip
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 3
    steps = [h for h in trainer.state.log_history if "reward" in h]
    assert len(steps) == 3 and all(len(calls[n]) == 3 for n in calls)  # one generation batch per step

    env_cfg, judge_cfgs = adapter.resolve_configs("math", judges)
    reference = build_judges(judge_cfgs)  # one set across the steps, as the trainer's judges are
    for step, logged in enumerate(steps):
        completions, labels, _ = calls["arena"][step]
        assert calls["format_strict"][step][0] == completions and len(completions) == 8
        assert all(isinstance(c, str) for c in completions)  # standard (text) prompts: text completions
        assert [labels[k] == labels[k - k % 4] for k in range(8)] == [True] * 8  # 2 prompts x 4 generations
        verdicts = judge_verdicts(env_cfg, reference, labels, completions, tmp_path)
        for name in judges:
            expected = [contributions(v, judges)[name] for v in verdicts]
            assert calls[name][step][2] == pytest.approx(expected)  # what the functions gave TRL ...
            assert logged[f"rewards/{name}/mean"] == pytest.approx(sum(expected) / len(expected), abs=1e-6)
        totals = [v["score"] for v in verdicts]
        assert logged["reward"] == pytest.approx(sum(totals) / len(totals), abs=1e-6)  # ... and what TRL summed
    assert all(math.isfinite(h["loss"]) for h in steps)
    assert any(h["frac_reward_zero_std"] < 1 for h in steps)  # some group's rewards differed: the policy moved
    assert any(not torch.equal(before[n], p.detach()) for n, p in trainer.model.named_parameters())
    funcs[0].close()
