r"""Trajectories as token tensors: a learner's view of the episodes of :mod:`lrmgym.episodes`.

Each policy token of a trajectory gets the trajectory's advantage; prompt and env tokens are masked out of the
loss and the KL. :func:`tokenize_trajectory` lays a trajectory out as one token sequence (the exact ids the
sampler saw and produced: see :mod:`lrmgym.episodes`), :func:`collate` pads a list of them. The episode driver
itself (:func:`rollout`, :class:`Rollout`) lives in :mod:`lrmgym.episodes` and is re-exported here.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from lrmgym.core import Completion, Prompt, Trajectory
from lrmgym.episodes import Rollout, env_attr, extend_prompt, rollout

__all__ = [
    "Rollout",
    "TokenBatch",
    "TokenizedTrajectory",
    "collate",
    "collate_advantages",
    "env_attr",
    "extend_prompt",
    "prompt_length",
    "rollout",
    "tokenize_trajectory",
]


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


def prompt_length(policy_mask: list[bool]) -> int:
    """Tokens before a trajectory's first sampled one (its whole length when the policy sampled none)."""
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
        prompt_len=torch.tensor([prompt_length(s.policy_mask) for s in seqs], dtype=torch.long),
        index=list(range(n)),
    )


def collate_advantages(
    seqs: Sequence[Any], advantages: Sequence[float] | Sequence[Sequence[float]], pad_id: int
) -> TokenBatch:
    """:func:`~lrmgym.learners.engine.rollout.collate`, where the advantages may also be given per token.

    One float per trajectory gives ``batch.advantages [N]`` (collate's own). A list per trajectory, as long as its
    ``ids``, gives ``batch.advantages [N, T - 1]`` aligned to the target tokens like ``loss_mask`` (entry ``t``
    is the advantage of token ``t + 1``; 0 on padding).
    """
    per_token = [np.ndim(a) > 0 for a in advantages]
    if not any(per_token):
        return collate(seqs, advantages, pad_id)
    if not all(per_token) or len(advantages) != len(seqs):
        raise ValueError("advantages must be one float per trajectory or one list per trajectory, not a mix.")
    batch = collate(seqs, [0.0] * len(seqs), pad_id)
    adv = torch.zeros(batch.input_ids.shape, dtype=torch.float32)  # [N, T], laid out like ids
    for i, (s, a) in enumerate(zip(seqs, advantages, strict=True)):
        if len(a) != len(s.ids):
            raise ValueError(f"Per-token advantages of trajectory {i}: {len(a)} values for its {len(s.ids)} tokens.")
        adv[i, : len(a)] = torch.as_tensor(a, dtype=torch.float32)
    batch.advantages = adv[:, 1:]  # aligned to targets: position t predicts token t + 1
    return batch
