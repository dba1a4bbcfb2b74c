"""``EvalConfig``: the ``eval.*`` options of ``lrmgym eval`` and of a run's periodic evaluations."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lrmgym.policies.base import SamplingParams

__all__ = ["EvalConfig"]


class EvalConfig(BaseModel):
    """How to evaluate a policy on an env: which tasks, how many samples, how to sample, what to report."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)

    n: int = Field(4, ge=1)
    """Samples per task."""
    k: list[int] = Field(default_factory=lambda: [1])
    """pass@k values to report; each must be between 1 and n."""
    tasks: int = Field(500, ge=1)
    """How many tasks (indices 0 .. tasks-1 of the stream `seed`; fewer if the env's data set is smaller)."""
    split: str | None = "test"
    """Data split, for envs with a `split` option (the env is rebuilt with it); None keeps the env's own."""
    temperature: float = Field(1.0, ge=0.0)
    """Sampling temperature; 0 is greedy (then n > 1 repeats the same answer)."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling threshold."""
    top_k: int = Field(0, ge=0)
    """Top-k filter; 0 disables it."""
    max_new_tokens: int = Field(256, ge=1)
    """Token budget per completion."""
    stop: list[str] = Field(default_factory=list)
    """Stop strings."""
    seed: int = Field(0, ge=0)
    """Seed of the task stream and of sampling."""
    batch_size: int = Field(32, ge=1)
    """Prompts per policy call (each with its n samples)."""
    pass_threshold: float = 1.0
    """A sample whose verdict has no `correct` flag passes when its score is at least this."""
    confidence: float = Field(0.95, gt=0.0, lt=1.0)
    """Confidence level of the reported intervals (percentile bootstrap over tasks)."""
    bootstrap: int = Field(2000, ge=100)
    """Bootstrap resamples."""

    @field_validator("k", mode="before")
    @classmethod
    def _k_list(cls, value: object) -> object:
        return [value] if isinstance(value, int) and not isinstance(value, bool) else value

    @model_validator(mode="after")
    def _k_le_n(self) -> EvalConfig:
        if not self.k:
            raise ValueError("eval.k is empty; list at least one k, e.g. eval.k=[1].")
        for k in self.k:
            if k < 1:
                raise ValueError(f"eval.k contains {k}; every k must be >= 1.")
            if k > self.n:
                raise ValueError(
                    f"eval.k contains {k} but eval.n is {self.n}: pass@{k} needs at least {k} samples per task. "
                    f"Raise eval.n to {k} or more, or drop {k} from eval.k."
                )
        if len(set(self.k)) != len(self.k):
            raise ValueError(f"eval.k has duplicates: {self.k}; list each k once.")
        return self

    def sampling(self, seed: int | None = None) -> SamplingParams:
        """The sampling parameters of this evaluation (``seed`` overrides :attr:`seed`)."""
        return SamplingParams(
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, max_new_tokens=self.max_new_tokens,
            stop=tuple(self.stop), seed=self.seed if seed is None else seed,
        )  # fmt: skip
