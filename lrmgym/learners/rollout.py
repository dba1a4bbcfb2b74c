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
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from lrmgym.core import Completion, Prompt, Task, Trajectory, Turn, Verdict
from lrmgym.policies.base import Policy, SamplingParams

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
    """The prompt of the next policy turn: the transcript so far plus the env's feedback."""
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
            one sample per still-running trajectory, also in one call.
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
            sampled = policy.generate([prompts[k] for k in active], n=1, sampling=turn_sampling)
            new = {k: s[0] for k, s in zip(active, sampled, strict=True)}
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
                    prompts[key] = extend_prompt(prompts[key], completion.text, reply)
                    still_active.append(key)
        active = still_active
    return result


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
        retokenized: How many env turns could not be taken from the policy's own encoding of the next prompt
            and were encoded separately (the trained sequence then differs slightly from what was sampled).
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
    taken from the next policy turn's ``prompt_token_ids`` when the sequence so far is a prefix of it (exact:
    what the model was conditioned on), else the feedback text is encoded on its own.
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
        nxt = turns[i + 1].completion if i + 1 < len(turns) else None
        nxt_prompt = None if nxt is None else nxt.prompt_token_ids
        # The EOS that ended the previous policy turn is not in the next prompt (the transcript is text, and
        # decoding drops EOS); it stays in the trained sequence as the policy's action of ending its turn.
        ends_eos = ids[-1] == getattr(tokenizer, "eos_token_id", None)
        shared = len(ids) - 1 if ends_eos else len(ids)
        if nxt_prompt is not None and len(nxt_prompt) >= shared and list(nxt_prompt[:shared]) == ids[:shared]:
            env_ids = list(nxt_prompt[shared:])
        else:
            env_ids = _encode(tokenizer, turn.text)
            retokenized += nxt_prompt is not None
        ids += env_ids
        mask += [False] * len(env_ids)
        lps += [0.0] * len(env_ids)
    # A trailing env turn (feedback after the last allowed turn) is never followed by a policy turn and
    # carries no loss; drop it so that it costs no compute.
    while mask and not mask[-1]:
        ids.pop(), mask.pop(), lps.pop()
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
