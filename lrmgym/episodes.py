r"""Episodes: groups of (possibly multi-turn) trajectories sampled and graded, the one place that drives them.

A trajectory interleaves policy turns (sampled) and env turns (feedback). Its reward is the final verdict's
score. Learners (:mod:`lrmgym.learners`), ``lrmgym eval`` (:mod:`lrmgym.eval`) and trainer adapters all sample
episodes here, so the multi-turn rule lives once: after a policy turn whose verdict is not correct, the env's
``feedback`` is the next observation (:func:`lrmgym.core.feedback_after`, which :meth:`lrmgym.core.TextEnv.step`
applies too), unless it is ``None`` or ``max_turns`` is used up.

Why the episodes are driven here rather than through ``env.step``: ``step`` keeps one episode's state in the
env object, while a GRPO step runs ``B x G`` episodes at once and samples each turn for all of them in one
batched ``generate`` call. So this module keeps the per-episode state itself. Grading always goes through
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
prompt for chat prompts). So the prompts nest, and :func:`lrmgym.learners.engine.rollout.tokenize_trajectory` lays the
trajectory out as the last turn's prompt plus its completion. Re-encoding text instead drops the EOS (decoding
removes it) or, with a chat template, writes a second end-of-turn token, and every later token would be trained
on a context the sampler never saw. Other policies (``openai``, ``vllm``, scripted ones) still get the text or
chat transcript.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lrmgym.core import Completion, Prompt, Task, Trajectory, Turn, Verdict, feedback_after, learner_env
from lrmgym.policies.base import Policy, SamplingParams, TokenContextPolicy

__all__ = ["Rollout", "env_attr", "extend_prompt", "rollout"]


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
    env = learner_env(env)
    turns_allowed = int(max_turns if max_turns is not None else env.max_turns or 1)
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
            reply = feedback_after(env, tasks[b], completion, verdict, turn) if turn < turns_allowed else None
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
