"""Multi-turn: the token sequence a learner trains on is exactly the one the sampler saw and produced.

With frozen weights, the trainer's log-prob of every policy token of a 3-turn trajectory (``collate`` +
``forward_logprobs``, temperature 1) must equal the sampler's ``Completion.logprobs``: any difference in a
turn's context (an EOS dropped by re-encoding text, a chat template's end-of-turn token written twice) moves
the later turns' log-probs by whole nats, far above the 1e-4 tolerance.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from learner_helpers import register_test_env, tiny_hf_policy

import lrmgym
from lrmgym.core import Task
from lrmgym.learners.engine.rollout import collate, rollout, tokenize_trajectory
from lrmgym.learners.engine.shared_prefix import forward_logprobs
from lrmgym.policies.base import SamplingParams, TokenContextPolicy
from lrmgym.policies.fastdecode import LlamaDecoder

register_test_env()

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}:{{ m['content'] }}<eos>\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
"""A small chat template for the tiny char tokenizer; like most templates it closes a turn with the EOS token."""

TURNS = 3


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _rms_norm_in_model_dtype(self, hidden):
    return torch.nn.functional.rms_norm(hidden, (hidden.shape[-1],), self.weight, self.variance_epsilon)


def _policy(kind: str, chat: bool, monkeypatch=None):
    """A frozen policy: the trained tiny default model, or a random tiny Llama (fast decoder or model.forward)."""
    if kind == "tiny":
        from transformers.models.llama import modeling_llama

        from lrmgym.policies.tiny import TinyPolicyConfig, load_tiny

        policy = load_tiny(TinyPolicyConfig().model_dir())
        # In float32 the trained model's sampler and trainer kernels differ by up to 2e-4 nats on a few tokens
        # of its ~100-token later-turn contexts (rounding amplified at rare sensitive positions, not a context
        # difference). So: float64, with transformers' RMSNorm (float32 whatever the model dtype) run in float64
        # too; what is left is the float32 logits' rounding (~1e-6), and a context mismatch costs whole nats.
        policy.model.double()
        monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", _rms_norm_in_model_dtype)
    else:
        policy = tiny_hf_policy(seed=1, hidden=64, layers=2)
        if kind == "hf-forward":  # a hook on the model sends the sampler through model.forward with a KV cache
            policy.model.register_forward_pre_hook(lambda module, args: None)
            assert LlamaDecoder.build(policy.model) is None
        else:
            assert LlamaDecoder.build(policy.model) is not None
    if chat:
        policy.tokenizer.chat_template = CHAT_TEMPLATE
        policy.chat_template = True
    return policy


def _env_and_tasks(kind: str, chat: bool) -> tuple[object, list[Task]]:
    """Math for the trained model (wrong answers get feedback); count-a (always feedback) for random ones."""
    if kind == "tiny":
        env = lrmgym.make("lrmgym/Math-v0", difficulty=1, template="r1", style="compact", max_turns=TURNS)
        tasks = [env.unwrapped.task_at(i, seed=11) for i in range(8)]
    else:
        env = lrmgym.make("LearnerTestA-v0", max_turns=TURNS)
        env.reset(seed=0)
        tasks = [env.unwrapped.task_at(i) for i in range(4)]
    if chat:
        tasks = [dataclasses.replace(t, prompt=[{"role": "user", "content": t.prompt}]) for t in tasks]
    return env, tasks


@pytest.mark.parametrize("chat", [False, True], ids=["plain", "chat-template"])
@pytest.mark.parametrize("kind", ["tiny", "hf-fast", "hf-forward"])
def test_trainer_logprobs_equal_the_samplers_on_every_turn(kind, chat, monkeypatch):
    policy = _policy(kind, chat, monkeypatch)
    assert isinstance(policy, TokenContextPolicy)
    env, tasks = _env_and_tasks(kind, chat)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=48 if kind == "tiny" else 20, seed=3)
    trajs = [t for g in rollout(env, policy, tasks, 4, sampling).groups for t in g]
    eos = policy.tokenizer.eos_token_id
    completions = [[t.completion for t in tr.turns if t.role == "policy"] for tr in trajs]
    full = [cs for cs in completions if len(cs) == TURNS]
    # The case that broke: a later turn sampled after a turn that ended with the EOS token.
    assert any(c.token_ids[-1] == eos for cs in full for c in cs[:-1]), "no EOS-ended turn before a later turn"
    seqs = [tokenize_trajectory(t, policy.tokenizer) for t in trajs]
    assert [s.retokenized for s in seqs] == [0] * len(seqs)

    batch = collate(seqs, [0.0] * len(seqs), policy.pad_token_id)
    with torch.no_grad():
        logp, _ = forward_logprobs(
            policy.model, batch.input_ids, batch.attention_mask, batch.prompt_len, policy.pad_token_id
        )
    for row, cs in enumerate(completions):
        trainer = logp[row][batch.loss_mask[row]]
        sampler = torch.tensor([lp for c in cs for lp in c.logprobs], dtype=trainer.dtype)
        assert len(trainer) == sum(len(c.token_ids) for c in cs)
        # The trainer's lean forward (products + softmax) rounds differently from the sampler's SDPA prefill: up to
        # 1.9e-4 nats measured on 196-token rows with logits up to 32. A misaligned token is off by order 1.
        torch.testing.assert_close(trainer, sampler, rtol=0, atol=1e-3)


@pytest.mark.parametrize("chat", [False, True], ids=["plain", "chat-template"])
def test_each_turns_context_nests_in_the_trained_sequence(chat):
    policy = _policy("hf-fast", chat)
    env, tasks = _env_and_tasks("hf-fast", chat)
    ro = rollout(env, policy, tasks, 4, SamplingParams(max_new_tokens=20, seed=5))
    eos = policy.tokenizer.eos_token_id
    endings = set()
    for tr in (t for g in ro.groups for t in g):
        tt = tokenize_trajectory(tr, policy.tokenizer)
        cs = [t.completion for t in tr.turns if t.role == "policy"]
        assert len(cs) == TURNS  # count-a gives feedback after every turn
        assert cs[0].prompt_token_ids == policy.encode_prompt(tr.task.prompt)
        for prev, nxt, reply in zip(cs, cs[1:], [t.text for t in tr.turns if t.role == "env"], strict=False):
            sampled = prev.prompt_token_ids + prev.token_ids
            # the next turn was sampled on everything the last one saw and produced, then the env's reply
            assert nxt.prompt_token_ids == sampled + policy.encode_reply(tr.task.prompt, prev, reply)
            assert nxt.prompt_token_ids[: len(sampled)] == sampled
            ended_eos = prev.token_ids[-1] == eos
            endings.add(ended_eos)
            if chat:  # the template's end-of-turn token is the EOS: written once, by the sampler or the format
                after = nxt.prompt_token_ids[len(sampled)]
                assert after != eos if ended_eos else after == eos
        for k, c in enumerate(cs):  # turn k's tokens sit right after its prompt in the trained sequence
            start = len(c.prompt_token_ids)
            assert tt.ids[: start + len(c.token_ids)] == c.prompt_token_ids + c.token_ids
            assert tt.policy_mask[start : start + len(c.token_ids)] == [True] * len(c.token_ids)
            nxt_start = len(cs[k + 1].prompt_token_ids) if k + 1 < len(cs) else len(tt.ids)
            assert tt.policy_mask[start + len(c.token_ids) : nxt_start] == [False] * (
                nxt_start - start - len(c.token_ids)
            )
        assert tt.ids == cs[-1].prompt_token_ids + cs[-1].token_ids and tt.retokenized == 0
    assert endings == {True, False}  # both EOS-ended and length-ended turns were exercised


def test_single_turn_rollout_samples_the_task_prompts_as_before():
    policy = _policy("hf-fast", chat=False)
    env, tasks = _env_and_tasks("hf-fast", chat=False)
    sampling = SamplingParams(max_new_tokens=12, seed=9)
    ro = rollout(env, policy, tasks, 3, sampling, max_turns=1)
    direct = policy.generate([t.prompt for t in tasks], n=3, sampling=sampling)
    for group, expected in zip(ro.groups, direct, strict=True):
        for tr, c in zip(group, expected, strict=True):
            assert [t.role for t in tr.turns] == ["policy"]
            assert tr.turns[0].completion == c
            tt = tokenize_trajectory(tr, policy.tokenizer)
            assert tt.ids == c.prompt_token_ids + c.token_ids
            assert tt.sampler_logprobs == [0.0] * len(c.prompt_token_ids) + c.logprobs
