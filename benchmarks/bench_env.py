"""The reward of ``grpo_vs_trl.py`` as an lrmgym env.

A module of its own, so that a rollout worker process can import it by name, while ``grpo_vs_trl.py`` itself
stays importable in TRL's venv, which has no lrmgym.
"""

from __future__ import annotations

import numpy as np
from grpo_vs_trl import prompt_text, reward_fraction_a

from lrmgym.core import Completion, Task, TextEnv, Verdict


class FractionAEnv(TextEnv):
    """Prompts ``Q<i>:``; reward = the fraction of ``a`` characters in the completion."""

    def make_task(self, index: int, rng: np.random.Generator) -> Task:
        return Task(id=f"bench/{index}", prompt=prompt_text(index))

    def verify(self, task: Task, completion: Completion) -> Verdict:
        score = reward_fraction_a(completion.text)
        return Verdict(score=score, correct=score >= 0.5)
