r"""Rollouts: groups of (possibly multi-turn) trajectories, and their conversion to token tensors.

A trajectory interleaves policy turns (sampled, trained on) and env turns (feedback, masked out of the loss
and the KL). Its reward is the final verdict's score, and that one reward reaches every policy turn: each
policy token of the trajectory gets the trajectory's advantage.

Why the episodes are driven here rather than through ``env.step``: ``step`` keeps one episode's state in the
env object, while a GRPO step runs ``B x G`` episodes at once and samples each turn for all of them in one
batched ``generate`` call. So this module keeps the per-episode state itself and applies the same rule as
:meth:`lrmgym.core.TextEnv.step`: after a policy turn whose verdict is not correct, the env's ``feedback`` is
the next observation, unless it is ``None`` or ``max_turns`` is used up. Grading always goes through
``env.score_group`` (one call per task and turn), so judges that wrap the env see every graded completion.

Transcripts of text prompts are plain concatenations: ``prompt + completion + feedback + completion ...``;
an env's feedback therefore carries its own separators (``"\nWrong, try again.\nA:"``). Chat prompts grow
by an ``assistant`` message per policy turn and a ``user`` message per env turn.

The token sequence a learner trains on is exactly the one the sampler saw and produced. With a
:class:`~lrmgym.policies.base.TokenContextPolicy` (the ``hf`` and ``tiny`` policies) later turns are sampled
from token ids, not from a re-encoded transcript: turn ``k + 1``'s prompt is turn ``k``'s ``prompt_token_ids +
token_ids`` (the EOS that ended it included) plus the policy's encoding of the env's reply
(:meth:`~lrmgym.policies.base.TokenContextPolicy.encode_reply`: the reply's tokens for text prompts; the chat
format's end-of-turn marker, unless the sampled EOS is that token, the ``user`` message and the generation
prompt for chat prompts). So the prompts nest, and :func:`tokenize_trajectory` lays the trajectory out as the
last turn's prompt plus its completion. Re-encoding text instead drops the EOS (decoding removes it) or, with a
chat template, writes a second end-of-turn token, and every later token would be trained on a context the
sampler never saw. Other policies (``openai``, ``vllm``, scripted ones) still get the text or chat transcript;
their env turns are re-encoded and counted in :attr:`TokenizedTrajectory.retokenized`.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from lrmgym.core import Completion, Prompt, Task, Trajectory, Turn, Verdict
from lrmgym.policies.base import Policy, SamplingParams, TokenContextPolicy

__all__ = [
    "Rollout",
    "TokenBatch",
    "TokenizedTrajectory",
    "collate",
    "env_attr",
    "extend_prompt",
    "rollout",
    "tokenize_trajectory",
]


def env_attr(env: Any, name: str, default: Any = None) -> Any:
    """An attribute of ``env`` or, for gymnasium wrappers that do not forward it, of ``env.unwrapped``."""
    if hasattr(env, name):
        return getattr(env, name)
    return getattr(getattr(env, "unwrapped", None), name, default)


def extend_prompt(prompt: Prompt, completion_text: str, feedback: str) -> Prompt:
    """The transcript of the next policy turn: the transcript so far plus the env's feedback.

    Policies that sample from token ids are given the exact token context instead (see the module docstring);
    the transcript is what other policies are prompted with.
    """
    if isinstance(prompt, str):
        return prompt + completion_text + feedback
    return [*prompt, {"role": "assistant", "content": completion_text}, {"role": "user", "content": feedback}]


@dataclass
class Rollout:
    """What one rollout produced.

    Attributes:
        groups: ``[B][G]`` trajectories; ``groups[b][g].verdict`` is the final verdict (its score is the reward).
        turn_verdicts: ``[B][G][turns]`` the verdict of every policy turn, in order.
        generate_s: Seconds spent in ``policy.generate``.
        score_s: Seconds spent in ``env.score_group``.
    """

    groups: list[list[Trajectory]]
    turn_verdicts: list[list[list[Verdict]]]
    generate_s: float = 0.0
    score_s: float = 0.0


def rollout(
    env: Any,
    policy: Policy,
    tasks: Sequence[Task],
    group_size: int,
    sampling: SamplingParams,
    max_turns: int | None = None,
) -> Rollout:
    """Sample ``group_size`` trajectories for each task and grade them.

    Args:
        env: The (possibly judge-wrapped) text env; needs ``score_group`` and, for multi-turn, ``feedback``.
        policy: Samples completions; turn 1 asks for ``group_size`` samples per task in one call, later turns
            one sample per still-running trajectory, also in one call (``generate_from_ids`` on the
            trajectories' token contexts for a :class:`~lrmgym.policies.base.TokenContextPolicy`).
        tasks: The B tasks.
        group_size: G, the samples per task.
        sampling: Sampling parameters; when ``sampling.seed`` is set, turn ``k`` uses ``seed + k - 1``.
        max_turns: Policy turns per episode; ``None`` uses the env's ``max_turns``.

    Returns:
        The trajectories with their final and per-turn verdicts.
    """
    turns_allowed = int(max_turns if max_turns is not None else env_attr(env, "max_turns", 1) or 1)
    groups = [[Trajectory(task=t) for _ in range(group_size)] for t in tasks]
    verdicts: list[list[list[Verdict]]] = [[[] for _ in range(group_size)] for _ in tasks]
    prompts: dict[tuple[int, int], Prompt] = {(b, g): t.prompt for b, t in enumerate(tasks) for g in range(group_size)}
    # The exact token context of each running trajectory's next turn, when the policy samples from token ids
    # and reported the ids of the turn before; other trajectories are prompted with their transcript.
    contexts: dict[tuple[int, int], list[int]] = {}
    by_ids = isinstance(policy, TokenContextPolicy)
    active = sorted(prompts)
    result = Rollout(groups=groups, turn_verdicts=verdicts)
    for turn in range(1, turns_allowed + 1):
        if not active:
            break
        turn_sampling = (
            sampling if sampling.seed is None else sampling.model_copy(update={"seed": sampling.seed + turn - 1})
        )
        start = time.perf_counter()
        if turn == 1:
            sampled = policy.generate([t.prompt for t in tasks], n=group_size, sampling=turn_sampling)
            new = {(b, g): sampled[b][g] for b, g in active}
        else:
            new = _sample_later_turn(policy, active, prompts, contexts, turn_sampling)
        result.generate_s += time.perf_counter() - start
        start = time.perf_counter()
        graded = _grade(env, tasks, new)
        result.score_s += time.perf_counter() - start
        still_active = []
        for key in active:
            b, g = key
            completion, verdict = new[key], graded[key]
            traj = groups[b][g]
            traj.turns.append(Turn(role="policy", text=completion.text, completion=completion))
            traj.verdict = verdict
            verdicts[b][g].append(verdict)
            if turn < turns_allowed and verdict.correct is not True:
                reply = env_attr(env, "feedback")(tasks[b], completion, verdict, turn)
                if reply is not None:
                    traj.turns.append(Turn(role="env", text=reply))
                    if by_ids and completion.prompt_token_ids is not None and completion.token_ids is not None:
                        contexts[key] = [
                            *completion.prompt_token_ids, *completion.token_ids,
                            *policy.encode_reply(prompts[key], completion, reply),
                        ]  # fmt: skip
                    else:
                        contexts.pop(key, None)
                    prompts[key] = extend_prompt(prompts[key], completion.text, reply)
                    still_active.append(key)
        active = still_active
    return result


def _sample_later_turn(
    policy: Any,
    active: list[tuple[int, int]],
    prompts: dict[tuple[int, int], Prompt],
    contexts: dict[tuple[int, int], list[int]],
    sampling: SamplingParams,
) -> dict[tuple[int, int], Completion]:
    """One sample per running trajectory: from its token context when it has one, else from its transcript."""
    from_ids = [k for k in active if k in contexts]
    from_text = [k for k in active if k not in contexts]
    new: dict[tuple[int, int], Completion] = {}
    if from_ids:
        sampled = policy.generate_from_ids([contexts[k] for k in from_ids], n=1, sampling=sampling)
        new.update((k, s[0]) for k, s in zip(from_ids, sampled, strict=True))
    if from_text:
        sampled = policy.generate([prompts[k] for k in from_text], n=1, sampling=sampling)
        new.update((k, s[0]) for k, s in zip(from_text, sampled, strict=True))
    return {k: new[k] for k in active}


def _grade(env: Any, tasks: Sequence[Task], new: dict[tuple[int, int], Completion]) -> dict[tuple[int, int], Verdict]:
    """One ``score_group`` call per task over the completions sampled for it this turn."""
    by_task: dict[int, list[tuple[int, int]]] = {}
    for key in new:
        by_task.setdefault(key[0], []).append(key)
    out = {}
    for b, keys in by_task.items():
        got = env.score_group(tasks[b], [new[k] for k in keys])
        if len(got) != len(keys):
            raise RuntimeError(
                f"env.score_group returned {len(got)} verdicts for {len(keys)} completions of task {tasks[b].id!r}; "
                "it must return one verdict per completion."
            )
        out.update(zip(keys, got, strict=True))
    return out


# --------------------------------------------------------------------------------------------------- tokens
@dataclass
class TokenizedTrajectory:
    """One trajectory as a flat token sequence.

    Attributes:
        ids: All tokens: prompt, then policy and env turns in order.
        policy_mask: Per token, whether the policy sampled it (trained on); prompt and env tokens are False.
        sampler_logprobs: Per token, the sampler's log-prob for policy tokens when it reported them, else 0.
        retokenized: How many env turns before a policy turn were not an exact continuation: the next turn's
            ``prompt_token_ids`` did not start with the sequence so far (a policy prompted with a re-encoded
            transcript), or were not reported. Their tokens were taken from the next prompt after the turn's
            EOS, or encoded from the env's text; the trained sequence then differs from what was sampled.
    """

    ids: list[int]
    policy_mask: list[bool]
    sampler_logprobs: list[float]
    retokenized: int = 0


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _prompt_ids(completion: Completion, prompt: Prompt, tokenizer: Any) -> list[int]:
    if completion.prompt_token_ids is not None:
        return list(completion.prompt_token_ids)
    if isinstance(prompt, str):
        return _encode(tokenizer, prompt)
    return list(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True))


def tokenize_trajectory(traj: Trajectory, tokenizer: Any) -> TokenizedTrajectory:
    """Lay a trajectory out as one token sequence with its policy mask.

    The prompt and each policy turn use the token ids the policy reported (``prompt_token_ids``,
    ``token_ids``); a policy that reports none is re-encoded with ``tokenizer``. An env turn's tokens are
    the rest of the next policy turn's ``prompt_token_ids`` when the sequence so far is a prefix of them, as it
    is for a policy that samples from token contexts (see :func:`rollout`): the layout is then exactly what
    the sampler saw and produced. Otherwise (a policy prompted with a re-encoded transcript) the env turn is
    counted in ``retokenized``, with a warning: its tokens are the next prompt's after the sequence so far
    minus the EOS that ended the previous turn (decoded text drops it), else the env's text encoded on its own.
    """
    turns = traj.turns
    if not turns or turns[0].role != "policy":
        raise ValueError(
            f"Trajectory of task {traj.task.id!r} must start with a policy turn, got {[t.role for t in turns]}."
        )
    ids = _prompt_ids(turns[0].completion or Completion(text=""), traj.task.prompt, tokenizer)
    mask = [False] * len(ids)
    lps = [0.0] * len(ids)
    retokenized = 0
    for i, turn in enumerate(turns):
        if turn.role == "policy":
            c = turn.completion or Completion(text=turn.text)
            tok = list(c.token_ids) if c.token_ids is not None else _encode(tokenizer, c.text)
            lp = list(c.logprobs) if c.logprobs is not None and c.token_ids is not None else [0.0] * len(tok)
            ids += tok
            mask += [True] * len(tok)
            lps += lp
            continue
        nxt_turn = turns[i + 1] if i + 1 < len(turns) else None
        nxt = None if nxt_turn is None else nxt_turn.completion
        nxt_prompt = None if nxt is None or nxt.prompt_token_ids is None else list(nxt.prompt_token_ids)
        if nxt_prompt is not None and nxt_prompt[: len(ids)] == ids:
            env_ids = nxt_prompt[len(ids) :]  # exact: the next turn was sampled on these very tokens
        else:
            # A re-encoded transcript lacks the EOS that ended the previous turn (decoding drops it); the EOS
            # stays in the trained sequence as the policy's action of ending its turn, so the context differs.
            ends_eos = ids[-1] == getattr(tokenizer, "eos_token_id", None)
            shared = len(ids) - 1 if ends_eos else len(ids)
            if nxt_prompt is not None and nxt_prompt[:shared] == ids[:shared]:
                env_ids = nxt_prompt[shared:]
            else:
                env_ids = _encode(tokenizer, turn.text)
            retokenized += nxt_turn is not None and nxt_turn.role == "policy"
        ids += env_ids
        mask += [False] * len(env_ids)
        lps += [0.0] * len(env_ids)
    # A trailing env turn (feedback after the last allowed turn) is never followed by a policy turn and
    # carries no loss; drop it so that it costs no compute.
    while mask and not mask[-1]:
        ids.pop(), mask.pop(), lps.pop()
    if retokenized:
        warnings.warn(
            "Multi-turn trajectory re-encoded: an env turn was not an exact continuation of the sampled tokens "
            "(the policy was prompted with a text transcript), so later turns are trained on a context the "
            "sampler did not see. Policies that sample from token ids (hf, tiny) avoid this; the count is "
            "TokenizedTrajectory.retokenized (the `retokenized_turns` metric).",
            RuntimeWarning,
            stacklevel=2,
        )
    return TokenizedTrajectory(ids=ids, policy_mask=mask, sampler_logprobs=lps, retokenized=retokenized)


@dataclass
class TokenBatch:
    """Padded token tensors for a list of trajectories (right padding).

    Attributes:
        input_ids: ``[N, T]`` tokens.
        attention_mask: ``[N, T]`` 1 on real tokens.
        loss_mask: ``[N, T - 1]`` 1 where the *target* token ``t + 1`` was sampled by the policy.
        sampler_logprobs: ``[N, T - 1]`` the sampler's log-prob of target token ``t + 1`` (0 off the mask).
        advantages: ``[N]`` the trajectory advantages.
        prompt_len: ``[N]`` tokens before each row's first policy token (its prompt).
        index: Which input trajectories (positions in the list given to :func:`collate`) the rows are.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    sampler_logprobs: torch.Tensor
    advantages: torch.Tensor
    prompt_len: torch.Tensor
    index: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, rows: Sequence[int]) -> TokenBatch:
        """The sub-batch of the given rows, trimmed to its longest sequence."""
        r = torch.as_tensor(list(rows), dtype=torch.long)
        length = int(self.attention_mask[r].sum(-1).max().item()) if len(r) else 1
        return TokenBatch(
            input_ids=self.input_ids[r, :length],
            attention_mask=self.attention_mask[r, :length],
            loss_mask=self.loss_mask[r, : length - 1],
            sampler_logprobs=self.sampler_logprobs[r, : length - 1],
            advantages=self.advantages[r],
            prompt_len=self.prompt_len[r],
            index=[self.index[i] for i in rows],
        )


def _prompt_len(policy_mask: list[bool]) -> int:
    return policy_mask.index(True) if True in policy_mask else len(policy_mask)


def collate(seqs: Sequence[TokenizedTrajectory], advantages: Sequence[float], pad_id: int) -> TokenBatch:
    """Pad tokenized trajectories into a :class:`TokenBatch`."""
    if not seqs:
        raise ValueError("collate() needs at least one trajectory.")
    width = max(len(s.ids) for s in seqs)
    n = len(seqs)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    loss_mask = torch.zeros((n, width), dtype=torch.bool)
    lps = torch.zeros((n, width), dtype=torch.float32)
    for i, s in enumerate(seqs):
        k = len(s.ids)
        input_ids[i, :k] = torch.tensor(s.ids, dtype=torch.long)
        attention[i, :k] = 1
        loss_mask[i, :k] = torch.tensor(s.policy_mask, dtype=torch.bool)
        lps[i, :k] = torch.tensor(s.sampler_logprobs, dtype=torch.float32)
    return TokenBatch(
        input_ids=input_ids,
        attention_mask=attention,
        loss_mask=loss_mask[:, 1:],  # aligned to targets: position t predicts token t + 1
        sampler_logprobs=lps[:, 1:],
        advantages=torch.tensor(list(advantages), dtype=torch.float32),
        prompt_len=torch.tensor([_prompt_len(s.policy_mask) for s in seqs], dtype=torch.long),
        index=list(range(n)),
    )
