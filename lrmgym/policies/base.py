"""The policy protocol: prompts in, groups of completions out.

A policy is anything with ``generate(prompts, n, sampling) -> list[list[Completion]]``: the outer list has
one entry per prompt, the inner one its ``n`` samples. A *trainable* policy (the ``hf`` and ``tiny``
policies) also exposes its torch ``model`` and ``tokenizer`` to the learner.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from lrmgym.core import Completion, Prompt


class SamplingParams(BaseModel):
    """How to sample. Shared by every policy; a policy that cannot honour a field says so when it is set."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)

    temperature: float = Field(1.0, ge=0.0)
    """Softmax temperature; 0 means greedy decoding."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p."""
    top_k: int = Field(0, ge=0)
    """Keep only the k most likely tokens; 0 disables the filter."""
    max_new_tokens: int = Field(256, ge=1)
    """Upper bound on generated tokens per completion."""
    stop: tuple[str, ...] = ()
    """Stop strings: generation ends after the first one (it is kept in the text)."""
    seed: int | None = None
    """Seed for reproducible sampling; None draws fresh randomness."""


@runtime_checkable
class Policy(Protocol):
    """Produces completions for prompts."""

    def generate(
        self, prompts: Sequence[Prompt], n: int = 1, sampling: SamplingParams | None = None
    ) -> list[list[Completion]]:
        """Sample ``n`` completions for each prompt; returns one list of ``n`` per prompt, in order."""
        ...


@runtime_checkable
class TrainablePolicy(Policy, Protocol):
    """A policy whose weights a learner can update: it exposes a torch model and its tokenizer."""

    model: Any
    tokenizer: Any
