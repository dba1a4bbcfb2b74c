"""Config messages: finite numbers, full ranges, close-only suggestions, list items as [i], no crash on odd kinds."""

from __future__ import annotations

import re

import pytest

from lrmgym.configs.errors import LIST_AT_MOST, allowed, did_you_mean
from lrmgym.configs.resolve import ConfigError, resolve

BASE = ("env=echo", "policy=mock")


def fail(*tokens):
    with pytest.raises(ConfigError) as err:
        resolve((*BASE, *tokens))
    return str(err.value)


@pytest.mark.parametrize(
    ("token", "message"),
    [
        ("learner.lr=nan", "learner.lr: invalid value nan: must be finite (a number > 0 and <= 1)."),
        ("learner.lr=.nan", "learner.lr: invalid value nan: must be finite (a number > 0 and <= 1)."),
        ("learner.temperature=inf", "learner.temperature: invalid value inf: must be finite (a number > 0 and <= 10)."),
        ("learner.time_budget_s=-.inf", "learner.time_budget_s: invalid value -inf: must be finite (a number > 0)."),
        ("learner.adam_betas=[.nan,0.9]", "learner.adam_betas[0]: invalid value nan: must be finite."),
        ("judge.accuracy.weight=.inf", "judge.accuracy.weight: invalid value inf: must be finite."),
    ],
)
def test_nan_and_inf_must_be_finite(token, message):
    extra = ("judge=accuracy",) if token.startswith("judge.") else ()
    assert fail(*extra, token) == message


@pytest.mark.parametrize("value", ["0", "-3", "1e9", "10000001"])
def test_learner_steps_states_its_limits(value):
    assert fail(f"learner.steps={value}").endswith(": expected an integer from 1 to 10000000.")


def test_a_wrong_type_also_states_the_range():
    assert fail("learner.steps=many") == (
        "learner.steps: invalid value 'many': expected a valid integer, unable to parse string as an integer "
        "(an integer from 1 to 10000000)."
    )


def test_a_long_key_list_is_not_spelled_out_only_close_names():
    message = fail("learner.lrr=1")
    assert re.fullmatch(
        r"learner\.lrr: unknown key \(value 1\)\. Did you mean 'lr'\? `lrmgym config show` shows all \d+ keys of "
        r"learner with their values\.",
        message,
    )
    assert "adam_betas" not in message
    assert "Did you mean" not in fail("learner.zzzzzz=1")
    assert fail("learner.zzzzzz=1").startswith("learner.zzzzzz: unknown key (value 1). No allowed name is close to it.")


def test_suggestions_need_a_close_match():
    assert did_you_mean("words", ["order", "template"]) == ""
    assert did_you_mean("Wrds", ["words", "order"]) == " Did you mean 'words'?"
    many = [f"option_{i}" for i in range(LIST_AT_MOST + 1)]
    assert allowed("option_10x", many, "see {n}") == ". Did you mean 'option_10'? see 11."
    assert allowed("w", ["words"], "unused") == "; allowed: words."


@pytest.mark.parametrize("value", ["[1]", "{a: 1}", "[]"])
def test_an_unhashable_kind_is_a_config_error(value):
    assert fail(f"policy.kind={value}").startswith("policy.kind: unknown kind ")
    assert fail("judge=format_strict", f"judge.format_strict.kind={value}").startswith(
        "judge.format_strict.kind: unknown kind "
    )


def test_dev_null_as_a_data_source():
    with pytest.raises(ConfigError) as err:
        resolve(("env=math", "policy=mock", "env.source=/dev/null"))
    assert str(err.value) == (
        "env: source '/dev/null' is not a regular file (a device or pipe such as /dev/null holds no data); give the "
        "path to a JSONL / JSON / parquet file or a HF dataset folder."
    )
    with pytest.raises(ConfigError, match=r"^env: source '/dev/null' is not a regular file \(a device or pipe"):
        resolve(("env=code", "policy=mock", "env.source=/dev/null"))


@pytest.mark.parametrize(
    ("tokens", "fix"),
    [
        # The README's first command without policy=hf: the default tiny policy has no `model`.
        (
            ("env=math", "judge=arena", "learner=grpo", "policy.model=/path/to/model", "learner.lr=1e-6"),
            "policy.model needs policy=hf (or openai, vllm): add policy=hf.",
        ),
        (("env=math", "learner.critic_lr=1e-5"), "learner.critic_lr needs learner=ppo: add learner=ppo."),
        (
            ("env=math", "backend.gpus_per_node=8"),
            "backend.gpus_per_node needs backend=openrlhf: add backend=openrlhf.",
        ),
        (("env=math", "env.feedback=names"), "env.feedback needs env=code: add env=code."),
        (("env=math", "env.mode=single"), "env.mode needs env=game24: add env=game24."),
    ],
)
def test_a_key_of_another_preset_names_the_preset_to_add(tokens, fix):
    with pytest.raises(ConfigError) as err:
        resolve(tokens)
    message = str(err.value)
    assert message.endswith(f" {fix}") and "\n" not in message
    key = fix.split(" ", 1)[0]
    assert message.startswith(f"{key}: unknown key")
    fixed = (*tokens, fix.rsplit("add ", 1)[1].rstrip("."))
    if key.startswith("backend."):  # OpenRLHF trains a Hugging Face model: it needs one named
        fixed = (*fixed, "policy.model=/path/to/model", "learner.time_budget_s=null", "learner.async_rollouts=false")
    resolve(fixed)  # the named fix is the whole fix


def test_a_key_no_preset_takes_gets_no_preset_hint():
    assert "needs" not in fail("learner.lrr=1") and "needs" not in fail("policy.zzz=1")


def test_arena_pool_keep_best_without_a_prompt_pool_is_one_line_naming_the_fix():
    assert fail("judge=arena", "judge.arena.pool_keep=best") == (
        "judge.arena: pool_keep='best' keeps traces across steps and needs pool='prompt', got pool='group'; set "
        "pool: prompt (judge.arena.pool=prompt) or leave pool_keep at 'recent'."
    )
    assert "Did you mean 'first_error'?" in fail("judge=arena", "judge.arena.pairwise.criteria=[first_err]")
    assert fail("judge=arena", "judge.arena.pool_keep=oldest").startswith(
        "judge.arena.pool_keep: invalid value 'oldest'; allowed: 'recent' or 'best'."
    )
