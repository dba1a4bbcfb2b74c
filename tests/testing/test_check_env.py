"""check_env must pass good envs and catch each typical bug with a message naming its probable cause."""

import random
import time

import pytest

import lrmgym
from lrmgym.core import Task, Verdict
from lrmgym.envs.echo import EchoEnv
from lrmgym.testing import EnvCheckError, check_env


def test_echo_passes_single_and_multi_turn():
    check_env(lrmgym.make("Echo-v0"), reference=lambda t: t.answer)
    check_env(lrmgym.make("Echo-v0", max_turns=3), reference=lambda t: t.answer)


class SeedPlusIndex(EchoEnv):
    def make_task(self, index, rng):
        r = random.Random(self.stream_seed + index)
        word = str(r.randint(0, 10**9))
        return Task(id=f"bad/{index}", prompt=f"Repeat exactly: {word}", answer=word)


class GlobalRandom(EchoEnv):
    def make_task(self, index, rng):
        word = str(random.randint(0, 10**9))
        return Task(id=f"bad/{index}", prompt=f"Repeat exactly: {word}", answer=word)


class IgnoresSeed(EchoEnv):
    def make_task(self, index, rng):
        return Task(id=f"bad/{index}", prompt=f"Repeat exactly: {index}", answer=str(index))


class RaisesOnGarbage(EchoEnv):
    def verify(self, task, completion):
        return Verdict(score=float(int(completion.text) == int(task.answer)))


class NaNReward(EchoEnv):
    def verify(self, task, completion):
        return Verdict(score=None, reason="ungradeable") if completion.text else Verdict(score=0.0)

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, float("nan"), terminated, truncated, info


class NeverEnds(EchoEnv):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.max_turns = 2

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        self._done = False
        return "again", reward, False, False, info


class NoVerdict(EchoEnv):
    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        del info["verdict"]
        return obs, reward, terminated, truncated, info


class Slow(EchoEnv):
    def verify(self, task, completion):
        if len(completion.text) > 10000:
            time.sleep(0.5)
        return super().verify(task, completion)


class WrongReference(EchoEnv):
    def verify(self, task, completion):
        return Verdict(score=0.0, correct=False, reason="always wrong")


@pytest.mark.parametrize(
    ("env_cls", "kwargs", "message"),
    [
        (SeedPlusIndex, {}, "Task 0 of seed 1 equals task 1 of seed 0: tasks are seeded with seed + index."),
        (GlobalRandom, {}, "reset(seed=0) twice gave different task sequences."),
        (IgnoresSeed, {}, "Seeds 0 and 1 gave the same tasks: the seed does not reach make_task."),
        (RaisesOnGarbage, {}, "step() raised ValueError("),
        (NaNReward, {}, "reward nan is not finite; an ungradeable answer must have verdict.score None."),
        (NeverEnds, {}, "the episode did not end after max_turns=2 policy turns"),
        (NoVerdict, {}, "step() must put a lrmgym.Verdict in info['verdict']."),
        (Slow, {"step_timeout_s": 0.2}, "step() took "),
        (WrongReference, {}, "The reference answer to task"),
    ],
)
def test_check_env_catches_bugs(env_cls, kwargs, message):
    with pytest.raises(EnvCheckError) as err:
        check_env(env_cls(), reference=lambda t: t.answer, **kwargs)
    assert message in str(err.value)


def test_check_env_rejects_non_text_envs():
    import gymnasium

    with pytest.raises(EnvCheckError, match="expects a lrmgym.TextEnv"):
        check_env(gymnasium.make("CartPole-v1"))


def test_seed_insensitive_envs_can_opt_out():
    check_env(IgnoresSeed(), seed_sensitive=False, reference=lambda t: t.answer)
