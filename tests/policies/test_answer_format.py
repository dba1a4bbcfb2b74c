"""policy=hf with a chat template: prompts go through it after a system message stating the env's answer format.

The tokenizer is the tiny default model's, copied into a temporary folder with a chat template added to its
``tokenizer_config.json`` (nothing downloaded).
"""

from __future__ import annotations

import json
import shutil
from importlib import resources
from pathlib import Path

import pytest

from lrmgym.compose import build_env, build_policy, env_answer_instruction
from lrmgym.configs.resolve import load_preset, resolve
from lrmgym.core import Completion
from lrmgym.envs.math.templates import INSTRUCTIONS
from lrmgym.policies.answer_format import with_instruction

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """The tiny default model's folder twice: with a chat template, and as shipped (none)."""
    source = Path(str(resources.files("lrmgym.policies") / "tiny_default"))
    out = {}
    for name in ("templated", "plain"):
        folder = tmp_path_factory.mktemp(name) / "model"
        shutil.copytree(source, folder)
        if name == "templated":
            config_path = folder / "tokenizer_config.json"
            config = json.loads(config_path.read_text())
            config_path.write_text(json.dumps({**config, "chat_template": TEMPLATE}))
        out[name] = folder
    return out


def _prompt(env) -> object:
    obs, info = env.reset(seed=3)
    return info["task"].prompt if "task" in info else obs


def test_the_preset_turns_it_on_for_hf_only():
    assert load_preset("policy", "hf")["answer_instruction"] == "auto"
    assert "answer_instruction" not in type(resolve(["env=math"]).policy).model_fields  # the tiny policy: off


def test_math_prompts_go_through_the_template_after_the_answer_format(folders):
    config = resolve(["env=math", "policy=hf", f"policy.model={folders['templated']}", "policy.device=cpu"])
    assert config.env.style == "compact" and config.env.template == "r1"
    policy, prompt = build_policy(config), _prompt(build_env(config))
    assert isinstance(prompt, str) and prompt.startswith("Q:")  # the env's compact text prompt
    expected = f"<|system|>{INSTRUCTIONS['r1']}<|end|><|user|>{prompt}<|end|><|assistant|>"
    assert policy.render_prompt(prompt) == expected
    assert policy.encode_prompt(prompt) == policy.tokenizer(expected, add_special_tokens=False)["input_ids"]
    (completion,) = policy.generate([prompt], n=1)[0]
    assert completion.prompt_token_ids == policy.encode_prompt(prompt)
    # the next turn's tokens follow the same chat layout (multi-turn envs)
    reply = policy.encode_reply(prompt, Completion(text="x", token_ids=[5]), "again")
    assert reply == policy.tokenizer("<|end|><|user|>again<|end|><|assistant|>", add_special_tokens=False)["input_ids"]


def test_the_boxed_template_gets_the_boxed_instruction(folders):
    config = resolve(["env=math", "env.template=boxed", "policy=hf", f"policy.model={folders['templated']}"])
    assert env_answer_instruction(config.env) == INSTRUCTIONS["boxed"] and "\\boxed{}" in INSTRUCTIONS["boxed"]
    policy = build_policy(config)
    assert policy.render_prompt("Q:1+1. A:").startswith(f"<|system|>{INSTRUCTIONS['boxed']}<|end|>")


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        (["policy.answer_instruction=null"], "Q:1+1. A:"),  # off: the env's text as it is
        (
            ["policy.answer_instruction=Answer in <answer> tags."],
            "<|system|>Answer in <answer> tags.<|end|><|user|>Q:1+1. A:<|end|><|assistant|>",
        ),  # a text of your own
        (['policy.answer_instruction=""'], "<|user|>Q:1+1. A:<|end|><|assistant|>"),  # the template, no system turn
        # instruct prompts state the format themselves: auto adds no system message
        (["env.style=instruct"], "<|user|>Q:1+1. A:<|end|><|assistant|>"),
    ],
    ids=["null", "own-text", "empty", "instruct-env"],
)
def test_it_is_overridable(folders, tokens, expected):
    config = resolve(["env=math", "policy=hf", f"policy.model={folders['templated']}", *tokens])
    assert build_policy(config).render_prompt("Q:1+1. A:") == expected


def test_without_a_chat_template_prompts_stay_as_they_are(folders):
    config = resolve(["env=math", "policy=hf", f"policy.model={folders['plain']}"])
    policy = build_policy(config)
    assert policy.render_prompt("Q:1+1. A:") == "Q:1+1. A:"
    assert policy.encode_prompt("Q:1+1. A:") == policy.tokenizer("Q:1+1. A:")["input_ids"]


def test_with_instruction_keeps_a_system_message_and_is_idempotent():
    once = with_instruction("Q:1+1. A:", "Use tags.")
    assert once == [{"role": "system", "content": "Use tags."}, {"role": "user", "content": "Q:1+1. A:"}]
    assert with_instruction(once, "Use tags.") == once
    own = [{"role": "system", "content": "the env's"}, {"role": "user", "content": "q"}]
    assert with_instruction(own, "Use tags.") == own
    assert with_instruction([{"role": "user", "content": "q"}], "") == [{"role": "user", "content": "q"}]
