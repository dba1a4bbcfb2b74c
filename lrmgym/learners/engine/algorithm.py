"""What a learner hands the run loop: its options, its steps and their results.

:class:`LoopConfig` (the loop's options), :class:`Algorithm` (what a learner implements) and :class:`StepResult`
(one step's metrics and samples); the loop itself is :class:`lrmgym.learners.engine.loop.Loop`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from lrmgym.learners.engine.loop import Loop

__all__ = ["Algorithm", "LoopConfig", "StepResult"]


class LoopConfig(BaseModel):
    """Options of the run loop, shared by every native learner."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    steps: int = Field(150, ge=1, le=10_000_000)
    """Training steps."""
    time_budget_s: float | None = Field(None, gt=0.0)
    """Stop after this many seconds of training (summed over resumes), even before `steps`; None: no limit.
    Keeps a run's wall time bounded on a busy machine, at the price of a load-dependent step count."""
    generation_budget: int | None = Field(None, ge=1)
    """Stop once this many completions have been sampled for training (the steps' `generations`, summed over
    resumes), even before `steps`; None: no limit. Compares learners at equal sampling cost (DAPO's dynamic
    sampling draws more per step than GRPO)."""
    eval_before_after: bool = True
    """Evaluate on the held-out tasks of `eval` before training and after the last step."""
    eval_greedy: bool = True
    """Beside the `eval` settings, also report greedy (temperature 0, one sample) held-out accuracy."""
    eval_every: int = Field(0, ge=0)
    """Also evaluate every this many steps (0: only before and after)."""
    checkpoint_every: int = Field(25, ge=1)
    """Save a checkpoint every this many steps (and at the end, and on Ctrl-C)."""
    keep_checkpoints: int = Field(2, ge=1, le=1000)
    """How many of the newest checkpoints to keep."""
    log_samples: int = Field(2, ge=0)
    """Groups per step written to samples.jsonl (all their trajectories, with verdicts)."""
    torch_threads: int | None = Field(None, ge=1, le=1024)
    """torch intra-op threads; None keeps torch's default. On a busy 2-core machine 1 can be faster."""
    progress: bool = True
    """Show a progress bar with reward and tokens/s."""
    idle_steps_per_s: float | None = Field(None, gt=0.0)
    """The steps per second this configuration was measured at on an idle 2-core machine (the default run's preset
    sets it, and the resolver drops it for runs it does not describe): the run prints when it expects to finish,
    and its summary says when the machine ran slower. It informs only; None: no expectation."""
    max_failed_steps: int = Field(3, ge=0, le=1_000_000)
    """Stop (checkpoint saved, exit 1, the resume command printed) after this many steps in a row in which every
    sample was ungradeable or a judge failed on every sample, e.g. a dead LLM-judge endpoint; 0: only warn."""


@dataclass
class StepResult:
    """What one algorithm step produced: its metrics line (without ``step``) and its sample records."""

    metrics: dict[str, Any]
    samples: list[dict[str, Any]] = field(default_factory=list)


class Algorithm:
    """The part of a learner that is not the loop. Subclasses implement :meth:`setup` and :meth:`train_step`.

    ``self.loop`` is set before :meth:`setup`; the algorithm reads ``loop.step`` (steps done),
    ``loop.progress()`` and ``loop.ctx`` from it.
    """

    name = "learner"
    loop: Loop

    def setup(self) -> None:
        """Build what training needs (optimizer, reference model, workers) from ``self.loop.ctx``."""

    def train_step(self) -> StepResult:
        """Run one training step."""
        raise NotImplementedError

    def end_step(self) -> None:
        """Called once the loop has counted the step and its time (learning-rate schedules step here)."""

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must hold to resume this algorithm exactly."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""

    def postfix(self, metrics: dict[str, Any]) -> dict[str, str]:
        """What the progress bar shows of a step's metrics."""
        return {}

    def summary(self) -> dict[str, Any]:
        """What ``summary.json`` records of this algorithm beyond the loop's keys (under the algorithm's name)."""
        return {}

    def close(self) -> None:
        """Release workers and other resources (called once, also after an error)."""
