"""A policy that samples in another dtype than it trains in: the train/infer gap of an inference engine, on a CPU.

Large-scale RL samples with an inference engine (vLLM, SGLang: often bf16, other kernels) and trains with fp32
master weights, so the behaviour log-probs the sampler returns differ from the trainer's for the same tokens.
Ring-Zero's ratio correction and the ``train_infer/*`` metrics exist for that gap; with one fp32 model for both
there is none. :class:`CastSamplingPolicy` makes one: the lean decoder
(:mod:`lrmgym.policies.fastdecode`) runs on a ``sample_dtype`` copy of the weights, rebuilt from the current
weights for every batch, while the learner computes log-probs and gradients on the fp32 model as before.
"""

from __future__ import annotations

from typing import Any

import torch

from lrmgym.core import Completion
from lrmgym.policies.base import SamplingParams
from lrmgym.policies.fastdecode import llama_like, sample_dtype
from lrmgym.policies.hf import HFPolicy

__all__ = ["CastSamplingPolicy"]


class CastSamplingPolicy(HFPolicy):
    """An :class:`~lrmgym.policies.hf.HFPolicy` whose sampler runs on a ``sample_dtype`` copy of the weights.

    Only the sampling (``generate``, ``generate_from_ids``) changes; :meth:`logprobs`, training and saving use
    the model as it is.

    Raises:
        ValueError: The model does not qualify for the lean decoder (:func:`~lrmgym.policies.fastdecode.llama_like`),
            which alone casts: ``model.forward`` would sample in the model's own dtype, with no gap.
    """

    def __init__(self, model: Any, tokenizer: Any, *, sample_dtype: torch.dtype, **kwargs: Any) -> None:
        super().__init__(model, tokenizer, **kwargs)
        if llama_like(self.model) is None:
            raise ValueError(
                f"policy.sample_dtype={str(sample_dtype).removeprefix('torch.')} needs a model the lean decoder "
                f"runs (llama, mistral, qwen2 without hooks), got {type(self.model).__name__}; use float32."
            )
        self.sample_dtype = sample_dtype

    def _sample(self, encoded: list[list[int]], n: int, sampling: SamplingParams) -> list[list[Completion]]:
        with sample_dtype(self.sample_dtype):
            return super()._sample(encoded, n, sampling)
