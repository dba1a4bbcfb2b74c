"""A short GRPO run on env=math_tool on CPU: rollouts with real tool turns (the sandbox), masked out of the loss.

The policy is a tiny random Llama whose first turn is, for half of each group, a scripted tool call (its tokens and
the model's own log-probs of them, so the update trains on them as on sampled ones): a random model never writes a
well-formed call, and the point here is the path, not learning to call tools.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Literal

import pytest
import torch
from pydantic import BaseModel, ConfigDict

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "learners"))  # the learners' tiny test policy

from learner_helpers import tiny_hf_policy  # noqa: E402
from tool_helpers import call  # noqa: E402

import lrmgym.learners.algorithms.grpo as grpo_module  # noqa: E402
from lrmgym.compose import train  # noqa: E402
from lrmgym.core import Completion  # noqa: E402
from lrmgym.learners.algorithms.grpo import GRPOConfig  # noqa: E402

CALL = call("print(6 * 7)")


def force_tool_calls(policy):
    """Make even-numbered first-turn samples a tool call (turn 1: a context that does not hold the call yet)."""
    sample = policy._sample
    text_ids = policy.tokenizer(CALL, add_special_tokens=False)["input_ids"]
    call_ids = [*text_ids, policy.tokenizer.eos_token_id]

    def first_turn(ids: list[int]) -> bool:
        return not any(ids[i : i + len(text_ids)] == text_ids for i in range(len(ids) - len(text_ids) + 1))

    def forced(encoded, n, sampling):
        out = sample(encoded, n, sampling)
        for prompt, completions in zip(encoded, out, strict=True):
            if not first_turn(list(prompt)):
                continue
            for k in range(0, len(completions), 2):
                logprobs = policy.logprobs(prompt, call_ids)
                completions[k] = Completion(CALL, list(call_ids), logprobs, "stop", list(prompt))
        return out

    policy._sample = forced
    return policy


class ToolCallingTestPolicyConfig(BaseModel):
    """A fresh tiny random Llama whose first turn is a tool call for half of each group."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["tooltest"] = "tooltest"
    seed: int = 0

    def build(self):
        return force_tool_calls(tiny_hf_policy(self.seed))


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_grpo_trains_on_math_tool_with_the_tool_turns_masked(tmp_path, monkeypatch):
    from lrmgym.configs.schema import EnvConfig, RunConfig, RunSection
    from lrmgym.eval.config import EvalConfig

    seen = []
    tokenize = grpo_module.tokenize_trajectory

    def spy(traj, tokenizer):
        out = tokenize(traj, tokenizer)
        seen.append((traj, out))
        return out

    monkeypatch.setattr(grpo_module, "tokenize_trajectory", spy)
    learner = GRPOConfig(
        steps=2, prompts_per_step=2, group_size=4, max_new_tokens=8, eval_before_after=False, progress=False,
        lr=1e-3, checkpoint_every=10,
    )  # fmt: skip
    cfg = RunConfig(
        env=EnvConfig(id="lrmgym/MathTool-v0", style="compact", max_tool_calls=1, tool_timeout_s=5.0),
        policy=ToolCallingTestPolicyConfig(),
        learner=learner,
        eval=EvalConfig(tasks=4, n=1, max_new_tokens=8, split=None),
        run=RunSection(seed=0),
    )
    train(cfg, tmp_path, resume=False)

    metrics = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2
    assert all(m["turns/mean"] == 1.5 and m["retokenized_turns"] == 0 for m in metrics)
    from lrmgym.policies.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    tooled = [(t, s) for t, s in seen if [x.role for x in t.turns] == ["policy", "env", "policy"]]
    assert len(tooled) == 2 * 2 * 2  # steps x prompts x half of each group
    for traj, seq in tooled:
        response = traj.turns[1].text
        assert response == "\n<tool_response>\n42\n(no tool calls left: answer now)\n</tool_response>\n"
        first, second = (t.completion for t in traj.policy_turns)
        start, end = len(first.prompt_token_ids) + len(first.token_ids), len(second.prompt_token_ids)
        assert seq.ids[:end] == list(second.prompt_token_ids)  # the second turn was sampled on exactly these
        assert tokenizer.decode(seq.ids[start:end]) == response and not any(seq.policy_mask[start:end])
        assert all(seq.policy_mask[end : end + len(second.token_ids)]) and traj.turns[0].text == CALL
    sample = json.loads((tmp_path / "samples.jsonl").read_text().splitlines()[0])
    assert any("<tool_response>" in t["text"] for traj in sample["trajectories"] for t in traj["turns"])


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""A ChatML template, as Qwen's renders user turns (its ``tool`` role renders as a user turn holding the same
``<tool_response>`` block, so these tokens are what that role would give)."""


def test_chat_prompts_get_the_tool_response_as_a_templated_turn_token_exact():
    from lrmgym.episodes import rollout
    from lrmgym.learners.engine.rollout import tokenize_trajectory
    from lrmgym.policies.base import SamplingParams
    from lrmgym.registry import make

    policy = force_tool_calls(tiny_hf_policy(seed=1))
    policy.tokenizer.chat_template = CHATML
    policy.chat_template = True
    env = make("lrmgym/MathTool-v0", style="instruct", chat=True, max_tool_calls=1)
    try:
        task = env.unwrapped.task_at(0, seed=0)
        assert [m["role"] for m in task.prompt] == ["system", "user"] and "<tool_call>" in task.prompt[0]["content"]
        result = rollout(env, policy, [task], 2, SamplingParams(max_new_tokens=6, seed=0))
        traj = result.groups[0][0]  # sample 0: the forced call
        assert [t.role for t in traj.turns] == ["policy", "env", "policy"]
        assert traj.turns[1].text == "<tool_response>\n42\n(no tool calls left: answer now)\n</tool_response>"
        seq = tokenize_trajectory(traj, policy.tokenizer)
        first, second = (t.completion for t in traj.policy_turns)
        start, end = len(first.prompt_token_ids) + len(first.token_ids), len(second.prompt_token_ids)
        between = policy.tokenizer.decode(seq.ids[start:end], skip_special_tokens=False)
        # The template's end of the assistant turn (the model's EOS is not <|im_end|>), the tool's turn, the opener.
        assert between == f"<|im_end|>\n<|im_start|>user\n{traj.turns[1].text}<|im_end|>\n<|im_start|>assistant\n"
        assert seq.retokenized == 0 and not any(seq.policy_mask[start:end]) and seq.ids[:end] == second.prompt_token_ids
    finally:
        env.close()
