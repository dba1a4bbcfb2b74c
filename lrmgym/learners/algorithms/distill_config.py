"""The self-distillation stage's options (:class:`SDConfig`) and its pruner (:func:`pruner_for`)."""

from __future__ import annotations

import difflib
import math
import re
from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from lrmgym.learners.engine.loop import LoopConfig

__all__ = ["DEFAULT_PRUNE_PROMPT", "SDConfig", "pruner_for"]

DEFAULT_PRUNE_PROMPT = """\
Below is a problem and a correct solution to it. The solution may contain redundant segments: repeated \
checks, restated steps, detours that are abandoned later. Rewrite the solution with those segments removed. \
Keep every step that is needed to reach the answer, keep the final answer unchanged, and keep the format \
<think>...</think><answer>...</answer> exactly. Reply with the rewritten solution only.

Problem:
{prompt}

Solution:
{solution}

Rewritten solution:
"""
"""Ours (the paper's self-evaluation prompt is not recovered); ``{prompt}`` and ``{solution}`` are filled in."""

_PLACEHOLDERS = re.compile(r"\{(prompt|solution)\}")


class SDConfig(LoopConfig):
    """Options of the self-distillation stage: corpus, pruning and the supervised fine-tune."""

    steps: int | None = Field(None, ge=1, le=10_000_000)
    """Optimizer steps; None: `epochs` passes over the corpus (set once the corpus is built, see for_corpus)."""
    epochs: int = Field(3, ge=1, le=1000)
    """Passes over the corpus when `steps` is None (Ring-Zero: 3)."""
    batch_size: int = Field(32, ge=1, le=65_536)
    """Traces per optimizer step."""
    lr: float = Field(1e-4, gt=0.0, le=1.0)
    """Peak AdamW learning rate (Ring-Zero: 7e-5 on the 1T model). The default suits the tiny model fine-tuned
    from its base: at the tiny build's own 3e-3, or at 1e-3, the fine-tune undoes the build (held-out accuracy
    falls), while 1e-4 keeps it or adds a little."""
    warmup_steps: int = Field(0, ge=0)
    """Linear learning-rate warm-up steps."""
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0)
    """After warm-up the rate follows a cosine down to min_lr_ratio x lr at the last step."""
    weight_decay: float = Field(0.0, ge=0.0, le=1.0)
    """AdamW weight decay."""
    max_grad_norm: float | None = Field(1.0, gt=0.0)
    """Clip the gradient's global norm to this; None disables clipping."""
    prune: Any = "none"
    """Who prunes each trace before training: none; self (the policy as it is when the corpus is built, i.e. the
    RL-1 model); or a policy config, e.g. {kind: openai, base_url: http://127.0.0.1:8000/v1, model: NAME}."""
    prune_prompt: str = DEFAULT_PRUNE_PROMPT
    """What the pruner is asked; must hold {prompt} (the task's prompt) and {solution} (the trace's text)."""
    prune_max_new_tokens: int | None = Field(None, ge=1)
    """Token budget of a pruner reply; None: the longest original trace of the request (a pruned trace must be
    shorter anyway). A reply that hits the budget is refused."""
    prune_batch_size: int = Field(16, ge=1, le=4096)
    """Traces per pruner request (one generate call); a failed request keeps all of its originals."""
    prune_chat: bool = False
    """Send the pruning prompt as one user chat message (True) or as raw text (False, for base models)."""
    min_traces: int = Field(1, ge=1)
    """Fewest tasks with a correct trace the stage trains on; fewer is an error."""

    @field_validator("prune", mode="before")
    @classmethod
    def _validate_prune(cls, value: Any, info: ValidationInfo) -> Any:
        """``"none"``, ``"self"``, or a policy config validated now against its kind's config class.

        A mapping (``{kind: openai, ...}``) becomes its kind's config through the resolver :mod:`lrmgym.configs`
        passes in the validation context (its errors name the dotted path), else through
        :func:`lrmgym.policies.kinds.policy_config`, as an LLM judge's ``policy`` does.
        """
        if isinstance(value, str):
            if value in ("none", "self"):
                return value
            close = difflib.get_close_matches(value.lower(), ["none", "self"], n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"expected 'none', 'self' or a policy config such as {{kind: openai, base_url: ..., model: ...}}, "
                f"got {value!r:.80}.{hint}"
            )
        from lrmgym.policies.kinds import nested_policy_config

        return nested_policy_config(
            value, info.context if info is not None else None, "'none', 'self' or a policy config"
        )

    @field_validator("prune_prompt")
    @classmethod
    def _check_placeholders(cls, prompt: str) -> str:
        missing = [p for p in ("{prompt}", "{solution}") if p not in prompt]
        if missing:
            raise ValueError(
                f"prune_prompt must contain both {{prompt}} and {{solution}}; missing: {', '.join(missing)}. "
                "Put them where the task's prompt and the trace to prune go."
            )
        return prompt

    def for_corpus(self, size: int) -> SDConfig:
        """This config with ``steps`` set: as given, or ``epochs`` passes of ``batch_size`` over ``size`` traces."""
        if self.steps is not None:
            return self
        if size < 1:
            raise ValueError(f"The corpus is empty (size={size}); self-distillation needs at least one trace.")
        return self.model_copy(update={"steps": self.epochs * math.ceil(size / self.batch_size)})

    def fill_prompt(self, prompt: str, solution: str) -> str:
        """:attr:`prune_prompt` with its placeholders filled, in one pass (so braces in the texts stay as they are)."""
        values = {"prompt": prompt, "solution": solution}
        return _PLACEHOLDERS.sub(lambda m: values[m.group(1)], self.prune_prompt)


def pruner_for(cfg: SDConfig, policy: Any) -> Any:
    """The pruner ``cfg.prune`` names: ``None`` (none), ``policy`` (self) or the configured policy, built."""
    if cfg.prune == "none":
        return None
    if cfg.prune == "self":
        return policy
    return cfg.prune.build()
