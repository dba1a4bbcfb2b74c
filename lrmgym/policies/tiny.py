"""The embedded default model (``policy=tiny``): a sub-million-parameter Llama the project builds itself.

Nothing is downloaded. :func:`build_tokenizer` makes a character-level tokenizer in code (printable ASCII plus
``<think>``, ``</think>``, ``<answer>``, ``</answer>`` as single tokens, so answers are short sequences);
:func:`build_model` makes a ``LlamaForCausalLM`` from a config (head dim 32, so vLLM's CPU attention can
serve it); :func:`train_tiny` fits it by supervised learning on the math env's worked solutions
(``Task.metadata["solution"]``) of its *train* split, to the edge of competence (20-60 % held-out accuracy at
temperature 1 on ``env=math``), so that RL has signal from the first step.

The result is cached under ``$XDG_CACHE_HOME/lrmgym/tiny/<hash>/`` (default ``~/.cache``), where ``<hash>``
is a hash of everything that determines the weights (architecture, data, optimisation, seed, format
version). The folder is a normal Hugging Face checkpoint (``config.json``, ``model.safetensors``,
``tokenizer.json``), loadable by ``AutoModelForCausalLM`` / ``AutoTokenizer`` and by vLLM, plus
``build.json`` with the build's measured facts. The same config and seed give the same weights on the same
torch version and thread count.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import string
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "SPECIAL_TOKENS",
    "TAG_TOKENS",
    "TinyArch",
    "TinyPolicyConfig",
    "TinyTrainConfig",
    "build_model",
    "build_tiny",
    "build_tokenizer",
    "load_tiny",
    "tiny_cache_root",
]

FORMAT_VERSION = 1
"""Bumped whenever the tokenizer, the model builder or the training recipe changes meaning (new cache key)."""

SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")
"""Special tokens (ids 0, 1, 2): padding, end of sequence, unknown character."""
TAG_TOKENS = ("<think>", "</think>", "<answer>", "</answer>")
"""The answer-format tags, one token each (ordinary tokens: they stay in decoded text)."""
CHARACTERS = tuple(c for c in string.printable if c not in "\t\r\x0b\x0c")
"""Every other token is one character: printable ASCII and newline. Anything else is <unk>."""


# --------------------------------------------------------------------------------------------------- builders
def build_tokenizer() -> Any:
    """The tiny model's character tokenizer, as a ``transformers.PreTrainedTokenizerFast``.

    A ``tokenizers`` word-level model over single characters (a regex pre-tokenizer splits every character)
    with a ``Fuse`` decoder, so ``decode`` concatenates without spaces; saved as ``tokenizer.json`` it loads
    with ``AutoTokenizer.from_pretrained`` and in vLLM.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + TAG_TOKENS + CHARACTERS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    core.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", model_max_length=1024
    )


class TinyArch(BaseModel):
    """Shape of the tiny Llama."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)

    hidden: int = Field(128, ge=8)
    """Hidden size."""
    layers: int = Field(4, ge=1)
    """Decoder layers."""
    heads: int = Field(4, ge=1)
    """Attention heads; hidden / heads must be 32 or 64 (head sizes vLLM's CPU attention supports)."""
    mlp: int = Field(336, ge=8)
    """MLP intermediate size."""
    max_positions: int = Field(256, ge=16)
    """Longest sequence (prompt + completion) in tokens."""

    @model_validator(mode="after")
    def _head_dim(self) -> TinyArch:
        if self.hidden % self.heads or self.hidden // self.heads not in (32, 64):
            raise ValueError(
                f"hidden / heads must be 32 or 64 so vLLM can serve the model, got hidden={self.hidden}, "
                f"heads={self.heads} (head dim {self.hidden / self.heads:g}). E.g. hidden=128, heads=4."
            )
        return self


def build_model(arch: TinyArch, vocab_size: int, seed: int) -> Any:
    """A freshly initialised ``LlamaForCausalLM`` (tied embeddings), seeded for reproducibility."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=arch.hidden, num_hidden_layers=arch.layers,
        num_attention_heads=arch.heads, num_key_value_heads=arch.heads, intermediate_size=arch.mlp,
        max_position_embeddings=arch.max_positions, tie_word_embeddings=True, pad_token_id=0, bos_token_id=None,
        eos_token_id=1, rope_theta=10000.0,
    )  # fmt: skip
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)
