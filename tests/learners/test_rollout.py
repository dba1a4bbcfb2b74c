"""Multi-turn rollouts and their token layout: env tokens masked, one reward for every policy turn."""

from __future__ import annotations

import re

import pytest
import torch
from learner_helpers import register_test_env

import lrmgym
from lrmgym.core import Completion, Task, Trajectory, Turn
from lrmgym.learners.algorithms.losses import aggregate, policy_loss
from lrmgym.learners.engine.rollout import collate, extend_prompt, rollout, tokenize_trajectory
from lrmgym.policies.base import SamplingParams
from lrmgym.testing import ScriptedPolicy

register_test_env()


def _echo_script(prompt, sample):
    """Sample 0 is right at once; sample 1 right on the 2nd turn; sample 2 always wrong."""
    text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
    answer = text.split("Repeat exactly: ")[1].split("nope#")[0]
    turn = text.count("Wrong.") + 1
    if sample == 0 or (turn == 2 and "#1" in text):
        return answer
    return f"nope#{sample}"


def test_multi_turn_rollout_on_echo():
    env = lrmgym.make("Echo-v0", max_turns=3, words=1)
    env.reset(seed=5)
    tasks = [env.task_at(0), env.task_at(1)]
    # Later turns are sampled with n=1, so the script must know which trajectory it continues: the
    # trajectory's own earlier text ("nope#1") says so.
    policy = ScriptedPolicy(lambda p, i: _echo_script(p, i if "nope#" not in p else int(p.split("nope#")[1][0])))
    ro = rollout(env, policy, tasks, group_size=3, sampling=SamplingParams())
    for group in ro.groups:
        right_away, second, never = group
        assert [t.role for t in right_away.turns] == ["policy"]
        assert right_away.reward == 1.0
        assert [t.role for t in second.turns] == ["policy", "env", "policy"]
        assert second.reward == 1.0
        assert [t.role for t in never.turns] == ["policy", "env", "policy", "env", "policy"]
        assert never.reward == 0.0 and never.verdict.correct is False
        assert never.turns[1].text == f"Wrong. Repeat exactly: {never.task.answer}"
    assert [len(v) for v in ro.turn_verdicts[0]] == [1, 2, 3]
    # turn 1: one call with n=3 for both tasks; turn 2: the 4 still-running trajectories; turn 3: 2 of them
    assert [(len(p), n) for p, n in policy.calls] == [(2, 3), (4, 1), (2, 1)]
    turn3_prompt = policy.calls[2][0][0]
    assert turn3_prompt.startswith(tasks[0].prompt) and turn3_prompt.count("Wrong. Repeat exactly:") == 2


def test_max_turns_override_and_single_turn():
    env = lrmgym.make("Echo-v0", max_turns=3)
    env.reset(seed=1)
    ro = rollout(env, ScriptedPolicy(["x"]), [env.task_at(0)], group_size=2, sampling=SamplingParams(), max_turns=1)
    assert all([t.role for t in tr.turns] == ["policy"] for tr in ro.groups[0])


def test_ungradeable_trajectory_reward_is_none():
    env = lrmgym.make("LearnerTestA-v0", ungradeable_marker="!")
    env.reset(seed=0)
    ro = rollout(env, ScriptedPolicy(["aa", "a!"]), [env.task_at(0)], group_size=2, sampling=SamplingParams())
    assert [t.reward for t in ro.groups[0]] == [1.0, None]


def test_extend_prompt_text_and_chat():
    assert extend_prompt("Q:", "A1", "|again:") == "Q:A1|again:"
    chat = [{"role": "user", "content": "Q"}]
    assert extend_prompt(chat, "A1", "again") == [
        {"role": "user", "content": "Q"}, {"role": "assistant", "content": "A1"}, {"role": "user", "content": "again"},
    ]  # fmt: skip


class _CharTok:
    """Minimal tokenizer: one id per character (ord); EOS is id 3."""

    eos_token_id = 3

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def _two_turn_trajectory(exact_prefix: bool = True) -> Trajectory:
    p1 = [1, 2]  # prompt
    c1 = Completion(text="ab", token_ids=[10, 11], logprobs=[-0.1, -0.2], prompt_token_ids=p1)
    feedback_ids = [20, 21, 22]
    p2 = p1 + [10, 11] + feedback_ids if exact_prefix else [1, 2, 99, 98, 20, 21, 22]
    c2 = Completion(text="c", token_ids=[12], logprobs=[-0.3], prompt_token_ids=p2)
    task = Task(id="t", prompt="xy")
    turns = [Turn("policy", "ab", c1), Turn("env", "fed", None), Turn("policy", "c", c2)]
    return Trajectory(task=task, turns=turns)


def test_tokenize_masks_env_tokens():
    tt = tokenize_trajectory(_two_turn_trajectory(), _CharTok())
    assert tt.ids == [1, 2, 10, 11, 20, 21, 22, 12]
    assert tt.policy_mask == [False, False, True, True, False, False, False, True]
    assert tt.sampler_logprobs == pytest.approx([0, 0, -0.1, -0.2, 0, 0, 0, -0.3])
    assert tt.retokenized == 0


def test_tokenize_falls_back_when_the_next_prompt_is_not_a_prefix():
    with pytest.warns(RuntimeWarning, match="re-encoded"):
        tt = tokenize_trajectory(_two_turn_trajectory(exact_prefix=False), _CharTok())
    assert tt.ids == [1, 2, 10, 11, ord("f"), ord("e"), ord("d"), 12]
    assert tt.retokenized == 1


def test_eos_ending_a_turn_is_kept_and_counted_when_the_next_prompt_lacks_it():
    tr = _two_turn_trajectory()
    first, second = tr.turns[0].completion, tr.turns[2].completion
    first.token_ids, first.logprobs = [10, 11, 3], [-0.1, -0.2, -0.05]  # the turn ended with EOS (id 3)
    with pytest.warns(RuntimeWarning, match="re-encoded"):
        tt = tokenize_trajectory(tr, _CharTok())
    assert second.prompt_token_ids == [1, 2, 10, 11, 20, 21, 22]  # a re-encoded transcript: no EOS
    assert tt.ids == [1, 2, 10, 11, 3, 20, 21, 22, 12]
    assert tt.policy_mask == [False, False, True, True, True, False, False, False, True]
    # Turn 2 was sampled without the EOS that the trained sequence has: not what the sampler saw.
    assert tt.retokenized == 1


def test_eos_ending_a_turn_appears_once_when_the_next_prompt_nests():
    tr = _two_turn_trajectory()
    first, second = tr.turns[0].completion, tr.turns[2].completion
    first.token_ids, first.logprobs = [10, 11, 3], [-0.1, -0.2, -0.05]
    second.prompt_token_ids = [1, 2, 10, 11, 3, 20, 21, 22]  # sampled on the token context, EOS included
    tt = tokenize_trajectory(tr, _CharTok())
    assert tt.ids == second.prompt_token_ids + second.token_ids
    assert tt.policy_mask == [False, False, True, True, True, False, False, False, True]
    assert tt.retokenized == 0


def test_env_turns_of_a_policy_without_token_ids_are_counted():
    task = Task(id="t", prompt="xy")
    turns = [Turn("policy", "ab", Completion("ab")), Turn("env", "fed"), Turn("policy", "c", Completion("c"))]
    with pytest.warns(RuntimeWarning, match="re-encoded"):
        tt = tokenize_trajectory(Trajectory(task=task, turns=turns), _CharTok())
    assert tt.ids == [ord(c) for c in "xyabfedc"] and tt.retokenized == 1


def test_trailing_env_turn_is_dropped():
    tr = _two_turn_trajectory()
    tr.turns.append(Turn("env", "late feedback"))
    assert tokenize_trajectory(tr, _CharTok()).ids[-1] == 12


def test_trajectory_must_start_with_policy_turn():
    tr = Trajectory(task=Task(id="t", prompt="x"), turns=[Turn("env", "hi")])
    msg = "Trajectory of task 't' must start with a policy turn, got ['env']."
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        tokenize_trajectory(tr, _CharTok())


def test_reward_reaches_every_policy_turn_and_never_env_tokens():
    tt = tokenize_trajectory(_two_turn_trajectory(), _CharTok())
    batch = collate([tt], [2.0], pad_id=0)
    assert batch.loss_mask.tolist() == [[False, True, True, False, False, False, True]]
    logp = torch.zeros(batch.loss_mask.shape, requires_grad=True)  # log-probs of target tokens 1..7
    out = policy_loss(logp, logp.detach(), batch.advantages)
    aggregate(out.loss, batch.loss_mask, "seq_mean_token_mean").backward()
    # -A / (3 policy tokens) on both turns' tokens, exactly 0 on prompt and feedback tokens
    assert logp.grad[0].tolist() == pytest.approx([0, -2 / 3, -2 / 3, 0, 0, 0, -2 / 3])


def test_collate_pads_and_selects():
    a = tokenize_trajectory(_two_turn_trajectory(), _CharTok())
    short = tokenize_trajectory(
        Trajectory(Task(id="s", prompt="q"), [Turn("policy", "z", Completion("z", [5], [-1.0], prompt_token_ids=[3]))]),
        _CharTok(),
    )
    batch = collate([a, short], [1.0, -1.0], pad_id=0)
    assert batch.input_ids.shape == (2, 8)
    assert batch.attention_mask[1].tolist() == [1, 1, 0, 0, 0, 0, 0, 0]
    sub = batch.select([1])
    assert sub.input_ids.tolist() == [[3, 5]] and sub.loss_mask.tolist() == [[True]]
    assert sub.index == [1]
