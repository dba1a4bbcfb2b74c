"""The embedded default model (``policy=tiny``): a sub-million-parameter Llama the project builds itself.

Nothing is downloaded. :func:`build_tokenizer` makes a character-level tokenizer in code (printable ASCII plus
``<think>``, ``</think>``, ``<answer>``, ``</answer>`` as single tokens, so answers are short sequences);
:func:`build_model` makes a ``LlamaForCausalLM`` from a config (head dim 32, so vLLM's CPU attention can
serve it); :func:`lrmgym.learners.algorithms.sft.build_tiny` fits it by supervised learning on the math env's
worked solutions
(``Task.metadata["solution"]``) of its *train* split, to partial competence (61 % held-out accuracy at
temperature 1 on ``env=math``, 79 % greedy), so that most GRPO groups carry signal and sampling has much to
sharpen.

The result is cached under ``$XDG_CACHE_HOME/lrmgym/tiny/<hash>/`` (default ``~/.cache``), where ``<hash>``
is a hash of everything that determines the weights (architecture, data, optimisation, seed, format
version). The folder is a normal Hugging Face checkpoint (``config.json``, ``model.safetensors``,
``tokenizer.json``), loadable by ``AutoModelForCausalLM`` / ``AutoTokenizer`` and by vLLM, plus
``build.json`` with the build's measured facts. The same config and seed give the same weights on the same
torch version and thread count.

The default config's model also ships inside the package (``lrmgym/policies/tiny_default/``, 3.2 MB, the
output of ``lrmgym tiny build`` with the defaults, 1 thread, torch 2.13.0), so that a fresh install trains at
once instead of spending ~7 minutes building it. A cache entry, when present, takes precedence;
``lrmgym tiny build --force`` rebuilds it into the cache, and the slow test
``test_default_build_reproduces_the_shipped_weights`` checks that a rebuild gives the shipped bytes.

Other recipes (``policy.recipe``, :mod:`lrmgym.policies.tiny_recipes`) train other shapes on other data, e.g.
``testbed``, the reasoning testbed's model (README: "Test an RL idea on a laptop"). ``policy.sample_dtype=bfloat16``
samples with a bf16 copy of the fp32 weights the trainer updates, so that a train/infer gap exists.
"""

from __future__ import annotations

import hashlib
import json
import os
import string
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
    "build_tokenizer",
    "load_tiny",
    "tiny_cache_root",
]

FORMAT_VERSION = 1
"""Bumped whenever the tokenizer, the model builder or the training recipe changes meaning (new cache key)."""

SHIPPED_DIR = Path(__file__).with_name("tiny_default")
"""The default config's model, shipped with the package (read-only; used when the cache has no entry)."""

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


# --------------------------------------------------------------------------------------------------- training
class TinyTrainConfig(BaseModel):
    """How the tiny model is trained: data source, optimisation, seed. Part of the cache key."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)

    env: str = "lrmgym/Math-v0"
    """Env whose train split provides the prompts and worked solutions (Task.metadata["solution"])."""
    env_options: dict[str, Any] = Field(
        default_factory=lambda: {"difficulty": 1, "style": "compact", "template": "r1", "split": "train"}
    )
    """Options of that env (must match the `env=math` preset, so train and test prompts look alike)."""
    steps: int = Field(2000, ge=1)
    """Optimiser steps. Held-out accuracy at T=1 (greedy) on `env=math` by recipe length, measured: 1400 steps
    32 % (44 %), 2000 steps 61 % (79 %), 2600 steps 77 %, 4000 steps 82 % (88 %). The default, 2000, leaves GRPO
    the most to gain in 8 minutes of training: with the same learner (16 tasks/step, 3e-4 cosine) +12.5 points at
    T=1 against +11.1 from 1400 steps; with a constant 1e-4, +8.2 against +2.8 from 4000 steps
    (benchmarks/results/default_run.md)."""
    batch_size: int = Field(32, ge=1)
    """Sequences per step."""
    lr: float = Field(3e-3, gt=0)
    """Peak AdamW learning rate (linear warm-up, then cosine decay to 10 %)."""
    warmup: int = Field(30, ge=0)
    """Warm-up steps."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""
    data_seed: int = Field(0, ge=0)
    """Seed of the training-task stream."""
    retry_share: float = Field(0.0, ge=0.0, lt=1.0)
    """Share of examples that are a second attempt: the prompt, a wrong solution (its final result off by 1-9),
    the env's own feedback for it, and then the right solution, which alone is trained on. Without them the
    model has never seen a transcript go on after an answer and cannot use the retry mode (env.max_turns > 1).
    Measured at 0.15 with the 1400-step recipe: a second try then succeeds 11.6 % of the time (0 % without), but
    first-try accuracy at T=1 falls from 34 % to 22 %, so the default model has none;
    `policy.train.retry_share=0.15` builds one."""
    init_from: Literal["default"] | None = None
    """Start from this recipe's trained weights instead of a random initialisation (fine-tuning; the arch must match
    in every weight's shape). None: from scratch."""
    length_batches: bool = False
    """Batch examples of similar length together (sorted within windows of 64 batches, the batches then shuffled
    with data_seed), so that padding costs little when solution lengths vary (the testbed recipe)."""


# --------------------------------------------------------------------------------------------------- cache
def tiny_cache_root() -> Path:
    """``$XDG_CACHE_HOME/lrmgym/tiny`` (``~/.cache/lrmgym/tiny`` when the variable is unset or empty)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lrmgym" / "tiny"


class TinyPolicyConfig(BaseModel):
    """The embedded default model: built on first use (a few minutes on 2 CPU cores), then loaded from the cache."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    kind: Literal["tiny"] = "tiny"
    """Component kind."""
    recipe: Literal["default", "testbed"] = "default"
    """Named shape and training data (lrmgym.policies.tiny_recipes): 'default' (env=math) or 'testbed' (env=testbed);
    arch and train values given explicitly override the recipe's."""
    sample_dtype: Literal["float32", "bfloat16"] = "float32"
    """Dtype of the weights the sampler runs on: 'bfloat16' samples with a bf16 copy of the fp32 weights the trainer
    updates (the lean decoder), so the behaviour log-probs differ from the trainer's (train_infer/* metrics)."""
    seed: int = Field(0, ge=0)
    """Seed of the weight initialisation (with train.data_seed, fixes the weights)."""
    arch: TinyArch = Field(default_factory=TinyArch)
    """Model shape."""
    train: TinyTrainConfig = Field(default_factory=TinyTrainConfig)
    """Training recipe."""
    path: str | None = None
    """Load this checkpoint folder instead of the cache (e.g. a copy of a cache folder)."""
    build_if_missing: bool = True
    """Build the model when it is not cached (lrmgym.compose.build_policy does); False makes a missing model an
    error."""
    threads: int | None = Field(None, ge=1)
    """torch threads for building and, on CPU, for the process that loads the policy; None: 2 only on an idle
    machine (1-min load < cores / 4), else 1. Measured on 2 shared cores: the full build took 286-302 s CPU with
    1 thread but 879 s CPU (735 s wall) with 2 threads at load ~2; the weights were bit-identical either way."""
    device: str = "cpu"
    """Where to run the policy ("cpu", "cuda", "auto")."""
    batch_size: int = Field(256, ge=1)
    """Most sequences sampled in one batch."""

    @model_validator(mode="before")
    @classmethod
    def _apply_recipe(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("recipe", "default") != "default":
            from lrmgym.policies.tiny_recipes import recipe_values

            return recipe_values(data["recipe"], data)
        return data

    def key(self) -> str:
        """The cache key: a hash of everything that determines the weights."""
        train = self.train.model_dump(mode="json")
        for added in (
            "retry_share",
            "length_batches",
            "init_from",
        ):  # added after models were cached and shipped: absent = off
            if not train[added]:
                del train[added]
        spec = {"format": FORMAT_VERSION, "seed": self.seed, "arch": self.arch.model_dump(mode="json"),
                "train": train}  # fmt: skip
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]

    def cache_dir(self) -> Path:
        """The folder this config's model lives in: ``path``, or the cache folder for :meth:`key`."""
        return Path(self.path).expanduser() if self.path else tiny_cache_root() / self.key()

    def shipped_dir(self) -> Path | None:
        """The model shipped with the package, if it is this config's (same cache key), else ``None``."""
        if self.path:
            return None
        try:
            facts = json.loads((SHIPPED_DIR / "build.json").read_text())
        except (OSError, ValueError):
            return None
        return SHIPPED_DIR if facts.get("key") == self.key() else None

    def model_dir(self) -> Path:
        """Where :meth:`build` loads from.

        ``path`` if set, else the cache entry if built, else the shipped model if it is this config's, else the
        (not yet built) cache entry.
        """
        folder = self.cache_dir()
        if self.path or (folder / "build.json").is_file():
            return folder
        return self.shipped_dir() or folder

    def needs_build(self) -> bool:
        """Whether this config's model is neither cached nor shipped (nor at ``path``) and may be built.

        Building trains on an env's data, which a policy does not import: the composition root
        (:func:`lrmgym.compose.build_policy`) builds it with :func:`lrmgym.learners.algorithms.sft.build_tiny`.
        """
        folder = self.model_dir()
        built = (folder / "build.json").is_file() or bool(self.path and (folder / "config.json").is_file())
        return not built and not self.path and self.build_if_missing

    def check_device(self) -> None:
        """Raise ``ValueError`` (one line with the fix) if this machine lacks :attr:`device`."""
        from lrmgym.policies.hf import resolve_device

        resolve_device(self.device)

    def build(self) -> Any:
        """The tiny model as an :class:`~lrmgym.policies.hf.HFPolicy`, from its cache, ``path`` or the package."""
        from lrmgym.policies.checkpoint import model_folder, tokenizer_folder
        from lrmgym.policies.hf import load_errors

        self.check_device()  # before anything is loaded
        folder = self.model_dir()
        if not (folder / "build.json").is_file() and not (self.path and (folder / "config.json").is_file()):
            if self.path:
                raise FileNotFoundError(f"policy.path={self.path!r} holds no tiny model (no config.json).")
            if not self.build_if_missing:
                raise FileNotFoundError(
                    f"The tiny model for this config is not built yet (expected in {folder}). "
                    "Run `lrmgym tiny build` or set policy.build_if_missing=true."
                )
            raise FileNotFoundError(
                f"The tiny model for this config is not built yet (expected in {folder}). Build the policy through "
                "lrmgym.compose.build_policy (as `lrmgym run` and `lrmgym eval` do), which builds and caches it, or "
                "run `lrmgym tiny build` with the same options."
            )
        if self.path:  # a folder the user names: the checks (and messages) of policy=hf's model folders
            model_folder(self.path, field="policy.path")
            tokenizer_folder(self.path, field="policy.path")
        what = f"policy.path={self.path!r}" if self.path else f"the tiny model in {folder}"
        with load_errors(what):
            policy = load_tiny(folder, device=self.device, batch_size=self.batch_size, sample_dtype=self.sample_dtype)
        if policy.device.type == "cpu":
            import torch

            torch.set_num_threads(self.threads or _auto_threads(_loadavg()))
        return policy


def load_tiny(folder: Path, device: str = "cpu", batch_size: int = 256, sample_dtype: str = "float32") -> Any:
    """Load a tiny-model folder (any HF checkpoint works) as an :class:`~lrmgym.policies.hf.HFPolicy`.

    The weights are fp32; ``sample_dtype="bfloat16"`` gives a :class:`~lrmgym.policies.cast_sampling.CastSamplingPolicy`
    that samples with a bf16 copy of them.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lrmgym.policies.hf import HFPolicy, dtype_kwarg

    model = AutoModelForCausalLM.from_pretrained(str(folder), **{dtype_kwarg(): torch.float32})
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    if sample_dtype == "float32":
        return HFPolicy(model.eval(), tokenizer, device=device, chat_template=False, batch_size=batch_size)
    from lrmgym.policies.cast_sampling import CastSamplingPolicy

    return CastSamplingPolicy(
        model.eval(), tokenizer, device=device, chat_template=False, batch_size=batch_size,
        sample_dtype=getattr(torch, sample_dtype),
    )  # fmt: skip


def _auto_threads(load: list[float] | None) -> int:
    cores = os.cpu_count() or 1
    return min(2, cores) if load is not None and load[0] < cores / 4 else 1


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
