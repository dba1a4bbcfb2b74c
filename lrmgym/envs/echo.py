"""``lrmgym/Echo-v0``: a trivial env for testing the contract. It is a test env, not a benchmark."""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from lrmgym.core import Completion, Task, TextEnv, Verdict

_WORDS = (
    "apple", "river", "stone", "cloud", "tiger", "maple", "orbit", "pixel", "lemon", "delta",
    "ember", "frost", "glade", "haven", "ivory", "jolly", "karma", "lunar", "mirth", "nexus",
)  # fmt: skip


class EchoConfig(BaseModel):
    """Options of the Echo test env."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    words: int = Field(3, ge=1, le=50)
    """How many words the policy must repeat."""
    max_turns: int = Field(1, ge=1, le=10)
    """Policy turns per episode; above 1, a wrong answer gets feedback and another try."""


class EchoEnv(TextEnv):
    """Test env: the policy must repeat a few words exactly. Exists to exercise the env contract.

    Reward 1.0 for an exact repeat (surrounding whitespace ignored), else 0.0. With ``max_turns > 1`` a
    wrong answer gets the feedback ``"Wrong. Repeat exactly: ..."``. Not a benchmark of anything.
    """

    Config = EchoConfig

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.max_turns = self.config.max_turns

    def make_task(self, index: int, rng: np.random.Generator) -> Task:
        """Task ``index``: ``words`` words drawn from ``rng``, to be repeated exactly."""
        words = " ".join(rng.choice(_WORDS, size=self.config.words))
        return Task(
            id=f"echo/{index}/{words.replace(' ', '-')}",  # content-based: stable whatever the seed source
            prompt=f"Repeat exactly: {words}",
            answer=words,
            metadata={"source": "echo", "index": index, "difficulty": self.config.words},
        )

    def verify(self, task: Task, completion: Completion) -> Verdict:
        """Score 1.0 when the completion, stripped of surrounding whitespace, equals the words; else 0.0."""
        said = completion.text.strip()
        ok = said == task.answer
        return Verdict(score=float(ok), correct=ok, parsed=said[:200], reason="match" if ok else "mismatch")

    def feedback(self, task: Task, completion: Completion, verdict: Verdict, turn: int) -> str | None:
        """After a wrong answer: ``"Wrong. Repeat exactly: <words>"``."""
        return f"Wrong. Repeat exactly: {task.answer}"
