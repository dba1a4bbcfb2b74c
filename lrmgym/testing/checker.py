"""``check_env``: run a text env through its contract and report the first breach with its probable cause.

Gymnasium's own ``check_env`` is written for array spaces; this one checks what matters for text envs:
the reset/step contract and types, determinism under a seed, that different and adjacent seeds give
different tasks (the ``seed + index`` bug), index and task pinning, ``info["verdict"]`` after every step,
finite rewards unless ungradeable, the end-of-episode error, ``score_group``, and that hostile model
outputs end in a verdict within a time bound instead of an exception.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import gymnasium

from lrmgym.core import Completion, ResetNeeded, Task, TextEnv, Verdict
from lrmgym.testing.mock import ADVERSARIAL_OUTPUTS

__all__ = ["EnvCheckError", "check_env"]


class EnvCheckError(AssertionError):
    """A breach of the text-env contract found by :func:`check_env`."""


def _fail(message: str) -> None:
    raise EnvCheckError(message)


def _unwrap(env: gymnasium.Env) -> TextEnv:
    base = env.unwrapped
    if not isinstance(base, TextEnv):
        _fail(f"check_env expects a lrmgym.TextEnv (possibly wrapped), got {type(base).__name__}.")
    return base


def _first_tasks(env: gymnasium.Env, seed: int, n: int) -> list[Task]:
    tasks = []
    for i in range(n):
        prompt, info = env.reset(seed=seed) if i == 0 else env.reset()
        task = info.get("task")
        if not isinstance(task, Task):
            _fail(f"reset() must return info['task'] as a lrmgym.Task, got {type(task).__name__}.")
        if prompt != task.prompt:
            _fail("reset() must return the task's prompt as the observation (it returned something else).")
        tasks.append(task)
    return tasks


def _check_step_result(result: Any, where: str) -> tuple[Any, float, bool, bool, dict]:
    if not (isinstance(result, tuple) and len(result) == 5):
        _fail(f"{where}: step() must return a 5-tuple (obs, reward, terminated, truncated, info).")
    obs, reward, terminated, truncated, info = result
    if not isinstance(terminated, bool) or not isinstance(truncated, bool):
        _fail(f"{where}: terminated and truncated must be bools, got {terminated!r}, {truncated!r}.")
    if not isinstance(info, dict) or not isinstance(info.get("verdict"), Verdict):
        _fail(f"{where}: step() must put a lrmgym.Verdict in info['verdict'].")
    verdict: Verdict = info["verdict"]
    if not isinstance(reward, (int, float)) or isinstance(reward, bool):
        _fail(f"{where}: reward must be a float, got {type(reward).__name__}.")
    if not math.isfinite(reward):
        _fail(f"{where}: reward {reward!r} is not finite; an ungradeable answer must have verdict.score None.")
    if verdict.score is not None and float(reward) != float(verdict.score):
        _fail(f"{where}: reward {reward} differs from info['verdict'].score {verdict.score}.")
    if not (isinstance(obs, (str, list))):
        _fail(f"{where}: the observation must be text or chat messages, got {type(obs).__name__}.")
    return obs, float(reward), terminated, truncated, info


def _step(env: gymnasium.Env, text: str, where: str) -> tuple[Any, float, bool, bool, dict]:
    try:
        result = env.step(text)
    except Exception as err:  # noqa: BLE001 - we report which exception it was
        _fail(f"step() raised {err!r} on the {where}; it must return a verdict for any model output.")
    return _check_step_result(result, where)


def _run_episode(env: gymnasium.Env, answer: Callable[[Task, int], str], max_turns: int, where: str) -> Verdict:
    _, info = env.reset()
    task = info["task"]
    for turn in range(1, max_turns + 1):
        obs, _, terminated, truncated, step_info = _step(env, answer(task, turn), where)
        if terminated or truncated:
            break
    else:
        _fail(f"{where}: the episode did not end after max_turns={max_turns} policy turns (truncate it).")
    try:
        env.step("one step too many")
    except ResetNeeded:
        pass
    except Exception as err:  # noqa: BLE001 - we report which exception it was
        _fail(f"{where}: a step after the episode ended must raise lrmgym.core.ResetNeeded, got {err!r}.")
    else:
        _fail(f"{where}: a step after the episode ended must raise ResetNeeded; it returned normally.")
    return step_info["verdict"]


def check_env(
    env: gymnasium.Env,
    *,
    seed: int = 0,
    n_tasks: int = 5,
    seed_sensitive: bool = True,
    reference: Callable[[Task], str] | None = None,
    adversarial: bool = True,
    step_timeout_s: float = 10.0,
) -> None:
    """Run ``env`` through the text-env contract; raise :class:`EnvCheckError` at the first breach.

    Args:
        env: A :class:`~lrmgym.core.TextEnv`, possibly wrapped (``JudgedEnv``, gymnasium wrappers).
        seed: The seed of the stream to check.
        n_tasks: How many tasks of a stream to compare between runs.
        seed_sensitive: Whether different seeds must give different task sequences. Set ``False`` for an env
            over a fixed data set in a fixed order.
        reference: Optional ``task -> completion text`` that must be graded correct (``verdict.correct``).
        adversarial: Also step every output of :data:`~lrmgym.testing.mock.ADVERSARIAL_OUTPUTS` and require
            a verdict (no exception) within ``step_timeout_s`` each.
        step_timeout_s: The bound on one ``step`` with hostile input, in seconds.
    """
    base = _unwrap(env)
    max_turns = int(getattr(base, "max_turns", 1))
    if max_turns < 1:
        _fail(f"max_turns must be >= 1, got {max_turns}.")

    fresh = type(base)(**({} if base.config is None else base.config.model_dump()))
    try:
        fresh.step("too early")
    except ResetNeeded:
        pass
    except Exception as err:  # noqa: BLE001
        _fail(f"step() before reset() must raise lrmgym.core.ResetNeeded, got {err!r}.")
    else:
        _fail("step() before reset() must raise lrmgym.core.ResetNeeded; it returned normally.")
    finally:
        fresh.close()

    # Determinism: the same seed gives the same task sequence.
    first = _first_tasks(env, seed, n_tasks)
    again = _first_tasks(env, seed, n_tasks)
    if [t.prompt for t in first] != [t.prompt for t in again] or [t.id for t in first] != [t.id for t in again]:
        _fail(
            f"reset(seed={seed}) twice gave different task sequences. Most likely make_task uses a random source "
            "other than the rng it is given (global random, time), or reset() does not restart the stream."
        )
    if len({t.prompt if isinstance(t.prompt, str) else repr(t.prompt) for t in first}) < min(2, n_tasks):
        _fail(f"The first {n_tasks} tasks of seed {seed} are all identical: reset() does not advance the stream.")

    if seed_sensitive:
        other = _first_tasks(env, seed + 1, n_tasks)
        if [t.prompt for t in other] == [t.prompt for t in first]:
            _fail(f"Seeds {seed} and {seed + 1} gave the same tasks: the seed does not reach make_task.")
        if n_tasks >= 2 and other[0].prompt == first[1].prompt:
            _fail(
                f"Task 0 of seed {seed + 1} equals task 1 of seed {seed}: tasks are seeded with seed + index. "
                "Use lrmgym.task_rng(seed, index) (a SeedSequence over the pair)."
            )

    # Pinning: options index / task.
    env.reset(seed=seed)
    _, info_a = env.reset(options={"index": 3})
    _, info_b = env.reset(options={"index": 3})
    if info_a["task"].prompt != info_b["task"].prompt:
        _fail("reset(options={'index': 3}) twice gave different tasks: pinning by index must be deterministic.")
    if info_a["task"].prompt != base.task_at(3).prompt:
        _fail("reset(options={'index': 3}) did not give task_at(3).")
    pinned = first[0]
    prompt, info_c = env.reset(options={"task": pinned})
    if info_c["task"] is not pinned or prompt != pinned.prompt:
        _fail("reset(options={'task': task}) must pin exactly that task.")

    # Stepping: the contract over whole episodes, a correct reference, and the end-of-episode error.
    env.reset(seed=seed)
    _run_episode(env, lambda task, turn: "", max_turns, "empty answer")
    if reference is not None:
        env.reset(seed=seed)
        for i in range(n_tasks):
            _, info = env.reset(options={"index": i})
            _, _, _, _, step_info = _step(env, reference(info["task"]), "reference answer")
            if step_info["verdict"].correct is not True:
                _fail(
                    f"The reference answer to task {info['task'].id!r} was not graded correct: "
                    f"{step_info['verdict'].reason!r}."
                )

    # score_group: one verdict per completion, in order.
    verdicts = base.score_group(first[0], [Completion(text=""), "x", Completion(text="y")])
    if len(verdicts) != 3 or not all(isinstance(v, Verdict) for v in verdicts):
        _fail("score_group(task, completions) must return one lrmgym.Verdict per completion, in order.")

    if adversarial:
        env.reset(seed=seed)
        for name, text in ADVERSARIAL_OUTPUTS:
            env.reset(options={"index": 0})
            start = time.perf_counter()
            _step(env, text, f"adversarial output {name!r}")
            elapsed = time.perf_counter() - start
            if elapsed > step_timeout_s:
                _fail(f"step() took {elapsed:.1f} s on the adversarial output {name!r} (bound {step_timeout_s} s).")
