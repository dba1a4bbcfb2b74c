"""The policy protocol: prompts in, groups of completions out.

A policy is anything with ``generate(prompts, n, sampling) -> list[list[Completion]]``: the outer list has
one entry per prompt, the inner one its ``n`` samples. A *trainable* policy (the ``hf`` and ``tiny``
policies) also exposes its torch ``model`` and ``tokenizer`` to the learner. A :class:`TokenContextPolicy`
(the ``hf`` and ``tiny`` policies) can also sample from token ids, which multi-turn rollouts use so that a
later turn is sampled on exactly the tokens a learner trains it on (see :mod:`lrmgym.learners.engine.rollout`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from lrmgym.core import Completion, Prompt


class MissingPackageError(ImportError):
    """A policy needs an optional package that is not importable here; the message names it and how to install it."""


class EngineStartError(RuntimeError):
    """A rollout engine (vLLM) failed to start for a reason of the machine's (memory, driver): one line, with a fix."""


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


@runtime_checkable
class TokenContextPolicy(Policy, Protocol):
    """A policy that also samples from token ids and encodes an env's reply as the tokens that follow a turn.

    Multi-turn rollouts with such a policy grow each trajectory's context as tokens: the next turn's prompt is
    the previous turn's ``prompt_token_ids + token_ids`` (EOS included when sampled) plus
    :meth:`encode_reply`'s tokens, so the sequence a learner trains on is the one the sampler saw and produced.
    """

    def generate_from_ids(
        self, prompt_ids: Sequence[Sequence[int]], n: int = 1, sampling: SamplingParams | None = None
    ) -> list[list[Completion]]:
        """Like :meth:`Policy.generate`, for prompts given as token ids (fed to the model as they are)."""
        ...

    def encode_reply(self, prompt: Prompt, completion: Completion, reply: str) -> list[int]:
        """The tokens that follow ``completion.token_ids`` in the next turn's context when the env says ``reply``.

        ``prompt`` is the conversation ``completion`` answered (text or chat messages), which tells how the reply
        is rendered: a text prompt appends the reply's own encoding; a chat prompt appends what the chat format
        writes after the assistant's content (its end-of-turn marker, unless the sampled EOS already is that
        token), the ``user`` message and the generation prompt.
        """
        ...
