"""The ``hf`` policy: any transformers causal LM (local path or hub id), on CPU or GPU, optionally with LoRA.

:class:`HFPolicy` is the trainable policy the learners update in place: it exposes ``model`` and ``tokenizer``,
samples with :func:`lrmgym.policies.sampling.sample_batch` (batched, KV cache, per-token log-probs; see that
module for the exact log-prob convention), and encodes prompts the same way for sampling and for training
(:meth:`HFPolicy.encode_prompt`). It is a :class:`~lrmgym.policies.base.TokenContextPolicy`: it samples from
token-id prompts too (:meth:`HFPolicy.generate_from_ids`) and encodes an env's reply as the tokens that follow a
sampled turn (:meth:`HFPolicy.encode_reply`), so multi-turn contexts are grown as tokens, never re-encoded.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pickle
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from lrmgym.core import Completion, Prompt
from lrmgym.policies.answer_format import AUTO, with_instruction
from lrmgym.policies.base import SamplingParams
from lrmgym.policies.checkpoint import ModelFolderError, adapter_folder, model_folder, tokenizer_folder
from lrmgym.policies.sampling import sample_batch, sequence_logprobs

__all__ = ["HFPolicy", "HFPolicyConfig", "LoraSpec", "render_plain_chat"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_CONTENT_MARK = "\ue000lrmgym-assistant-content\ue001"
"""Stands in for an assistant message's content when rendering what a chat format writes after it."""


def render_plain_chat(messages: Sequence[dict[str, str]]) -> str:
    """Chat messages as plain text, for tokenizers without a chat template: ``role: content`` lines.

    The text ends with ``"assistant: "`` so the model continues as the assistant.
    """
    lines = [f"{m.get('role', 'user')}: {m.get('content', '')}" for m in messages]
    return "\n".join(lines) + "\nassistant: "


def _safetensors_error() -> type[Exception]:
    """The error safetensors raises for a corrupt weight file (a stand-in when safetensors is absent)."""
    try:
        from safetensors import SafetensorError
    except ImportError:
        return OSError
    return SafetensorError


@contextlib.contextmanager
def load_errors(what: str) -> Iterator[None]:
    """Errors of a damaged model folder as one line: a ModelFolderError about ``what``.

    Turns what transformers and safetensors raise while loading (``OSError``, ``SafetensorError``...) into a
    :class:`~lrmgym.policies.checkpoint.ModelFolderError`; ``what`` names the folder (``policy.model='m' from /m``).
    """
    try:
        yield
    except torch.OutOfMemoryError:
        raise
    except (OSError, ValueError, RuntimeError, pickle.UnpicklingError, _safetensors_error()) as err:
        reason = " ".join(str(err).split())[:300]  # transformers' messages span lines; the CLI prints one
        raise ModelFolderError(
            f"Could not load {what}: {reason}. Check that the folder is a complete transformers causal LM (re-save "
            "it with save_pretrained)."
        ) from err


def _check_n(n: Any) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n (samples per prompt) must be a positive integer, got {n!r}.")


def dtype_kwarg() -> str:
    """The ``from_pretrained`` keyword for the dtype: ``dtype`` since transformers 4.56, ``torch_dtype`` before."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def resolve_device(device: str, key: str = "policy.device") -> torch.device:
    """``"auto"`` -> CUDA when available, else CPU; anything else as :class:`torch.device`, if this machine has it.

    Raises:
        ValueError: ``device`` is no device, or one this machine (or this torch build) lacks: one line naming
            ``key``, the value, what is missing and the fix.
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, ValueError) as err:
        raise ValueError(f"{key}={device!r} is not a device; expected auto, cpu, cuda, cuda:N or mps.") from err
    missing = _missing_device(resolved)
    if missing is not None:
        why, fix = missing
        raise ValueError(f"{key}={device!r}: {why}; {fix.format(key=key)}.")
    return resolved


def _missing_device(device: torch.device) -> tuple[str, str] | None:
    """Why this machine cannot run on ``device`` and the fix (with ``{key}``), or ``None`` when it can."""
    use_cpu = "use {key}=cpu, or auto (a GPU when there is one)"
    if device.type == "cpu":
        return None
    if device.type == "cuda":
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            return (
                f"this torch ({torch.__version__}) is built without CUDA",
                use_cpu + ", or install a CUDA build of torch",
            )
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            return "torch sees no CUDA GPU here (none, no driver, or CUDA_VISIBLE_DEVICES hides them)", use_cpu
        if device.index is not None and device.index >= count:
            listed = "cuda:0" if count == 1 else f"cuda:0 to cuda:{count - 1}"
            return (
                f"this machine has {count} CUDA GPU{'s' if count > 1 else ''} ({listed})",
                "use one of them, or {key}=cpu",
            )
        return None
    if device.type == "mps":
        return None if torch.backends.mps.is_available() else ("torch has no MPS (Apple-silicon GPU) here", use_cpu)
    available = getattr(getattr(torch, device.type, None), "is_available", None)
    return None if callable(available) and available() else (f"torch has no {device.type} device here", use_cpu)


class HFPolicy:
    """A transformers causal LM as a :class:`~lrmgym.policies.base.TrainablePolicy`.

    Args:
        model: A transformers causal LM (or a peft model wrapping one). Moved to ``device``.
        tokenizer: Its tokenizer. Needs an EOS token (sampling also stops at ``generation_config.eos_token_id``).
        device: Where to run; ``None`` keeps the model where it is.
        chat_template: Apply the tokenizer's chat template to chat prompts when it has one. Without one (or
            with ``False``), chat prompts are rendered by :func:`render_plain_chat`.
        answer_instruction: With the chat template applied, every prompt goes through it (a text prompt as one
            user message) after a system message with this text (``""``: none), see
            :mod:`lrmgym.policies.answer_format`. ``None``: prompts as the env writes them.
        batch_size: Most sequences (prompt x sample) sampled in one batch.

    Attributes:
        model: The torch model (the learner updates it in place).
        tokenizer: The tokenizer.
        rollout_engine: The engine that samples instead of the lean sampler (``policy.engine=vllm``:
            :class:`~lrmgym.policies.vllm_engine.VLLMRolloutEngine`), or ``None``.
    """

    rollout_engine: Any = None

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        device: str | torch.device | None = None,
        chat_template: bool = True,
        batch_size: int = 64,
        answer_instruction: str | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
        if device is not None:
            model = model.to(resolve_device(device) if isinstance(device, str) else device)
        self.model = model
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.batch_size = batch_size
        self.answer_instruction = answer_instruction
        eos = self.eos_token_ids
        if not eos:
            raise ValueError(
                "The tokenizer has no eos_token and the model's generation_config names none: sampling could "
                "never stop before max_new_tokens. Set tokenizer.eos_token."
            )

    # ---- encoding
    @property
    def device(self) -> torch.device:
        """The device of the model's parameters."""
        return next(self.model.parameters()).device

    @property
    def eos_token_ids(self) -> list[int]:
        """Token ids that end a completion: the tokenizer's EOS plus the generation config's."""
        ids: set[int] = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        gen = getattr(self.model, "generation_config", None)
        extra = getattr(gen, "eos_token_id", None)
        if isinstance(extra, int):
            ids.add(extra)
        elif extra:
            ids.update(int(i) for i in extra)
        return sorted(ids)

    @property
    def pad_token_id(self) -> int:
        """The id used for left padding (the tokenizer's pad, else its EOS)."""
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.eos_token_ids[0])

    def render_prompt(self, prompt: Prompt) -> str:
        """The prompt as the exact text the model is conditioned on (chat template applied for chat prompts)."""
        prompt = self._as_sent(prompt)
        if isinstance(prompt, str):
            return prompt
        if not isinstance(prompt, list) or not all(isinstance(m, dict) and "content" in m for m in prompt):
            raise TypeError(
                f"A prompt must be a str or a list of chat messages {{'role': ..., 'content': ...}}, got "
                f"{type(prompt).__name__}: {prompt!r:.80}."
            )
        if self.chat_template and getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        return render_plain_chat(prompt)

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        """The prompt's token ids, exactly as :meth:`generate` feeds them to the model.

        Text prompts get the tokenizer's special tokens (e.g. BOS); chat prompts rendered by a chat template
        do not (the template writes them itself).
        """
        prompt = self._as_sent(prompt)
        text = self.render_prompt(prompt)
        has_template = bool(getattr(self.tokenizer, "chat_template", None))
        templated = not isinstance(prompt, str) and self.chat_template and has_template
        ids = self.tokenizer(text, add_special_tokens=not templated)["input_ids"]
        if not ids:
            raise ValueError(f"Prompt {text!r:.80} encodes to zero tokens; give the model at least one token.")
        return list(ids)

    def _as_sent(self, prompt: Prompt) -> Prompt:
        """``prompt`` with :attr:`answer_instruction` applied where the chat template is (else as it is)."""
        templated = self.chat_template and bool(getattr(self.tokenizer, "chat_template", None))
        if self.answer_instruction is None or not templated:
            return prompt
        return with_instruction(prompt, self.answer_instruction)

    def decode(self, token_ids: Sequence[int]) -> str:
        """Completion text: EOS and other special tokens dropped."""
        eos = set(self.eos_token_ids)
        return self.tokenizer.decode([t for t in token_ids if t not in eos], skip_special_tokens=True)

    # ---- sampling
    def generate(
        self, prompts: Sequence[Prompt], n: int = 1, sampling: SamplingParams | None = None
    ) -> list[list[Completion]]:
        """Sample ``n`` completions per prompt (see :mod:`lrmgym.policies.sampling` for the log-prob convention).

        Args:
            prompts: Text or chat prompts.
            n: Samples per prompt.
            sampling: Sampling parameters (defaults: temperature 1, 256 new tokens).

        Returns:
            One list of ``n`` :class:`Completion` per prompt, with ``token_ids`` (EOS included when sampled),
            ``logprobs``, ``finish_reason`` and ``prompt_token_ids`` filled.
        """
        _check_n(n)
        if isinstance(prompts, (str, dict)):
            raise TypeError("prompts must be a list of prompts; wrap a single prompt as [prompt].")
        return self._sample([self.encode_prompt(p) for p in prompts], n, sampling or SamplingParams())

    def generate_from_ids(
        self, prompt_ids: Sequence[Sequence[int]], n: int = 1, sampling: SamplingParams | None = None
    ) -> list[list[Completion]]:
        """Sample ``n`` completions per prompt given as token ids, fed to the model exactly as they are.

        Multi-turn rollouts use it to sample a later turn on the trajectory's tokens so far (see
        :meth:`encode_reply`). Returns what :meth:`generate` returns; ``prompt_token_ids`` are the given ids.
        """
        _check_n(n)
        if isinstance(prompt_ids, (str, dict)) or not all(isinstance(p, Sequence) for p in prompt_ids):
            raise TypeError("prompt_ids must be a list of token-id lists, one per prompt.")
        vocab = int(getattr(getattr(self.model, "config", None), "vocab_size", 0) or len(self.tokenizer))
        encoded = [[int(t) for t in ids] for ids in prompt_ids]
        for ids in encoded:
            if not ids or min(ids) < 0 or max(ids) >= vocab:
                raise ValueError(
                    f"A token-id prompt must be non-empty with ids in [0, {vocab}), got {len(ids)} ids: {ids[:8]!r}."
                )
        return self._sample(encoded, n, sampling or SamplingParams())

    def encode_reply(self, prompt: Prompt, completion: Completion, reply: str) -> list[int]:
        """The tokens that follow ``completion.token_ids`` in the next turn's context when the env says ``reply``.

        Text prompts: the reply's own encoding (no special tokens added). Chat prompts: what the chat format
        (the tokenizer's chat template, or :func:`render_plain_chat`) writes after the assistant's content, i.e.
        its end-of-turn marker, the ``user`` message ``reply`` and the generation prompt. When the completion
        ended with an EOS token and the marker starts with that same token, it is not repeated: the sampled EOS
        already closed the turn.
        """
        prompt = self._as_sent(prompt)
        if isinstance(prompt, str):
            text = reply
        else:
            messages = [*prompt, {"role": "assistant", "content": _CONTENT_MARK}, {"role": "user", "content": reply}]
            parts = self.render_prompt(messages).split(_CONTENT_MARK)
            if len(parts) != 2:
                raise ValueError(
                    "The chat template does not render an assistant message's content verbatim (exactly once), so "
                    "the tokens that follow a sampled turn cannot be told apart from it; multi-turn chat needs a "
                    "template that does."
                )
            text = parts[1]
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        sampled = completion.token_ids or []
        if sampled and ids and sampled[-1] in self.eos_token_ids and ids[0] == sampled[-1]:
            ids = ids[1:]
        return ids

    def _sample(self, encoded: list[list[int]], n: int, sampling: SamplingParams) -> list[list[Completion]]:
        """Sample ``n`` continuations of each encoded prompt."""
        if self.rollout_engine is not None:
            by_prompt = self.rollout_engine.generate(self.model, encoded, n, sampling, self.eos_token_ids)
            pairs = zip(encoded, by_prompt, strict=True)
            return [[self._completion(s, ids, sampling.stop) for s in group] for ids, group in pairs]
        rows = [ids for ids in encoded for _ in range(n)]  # prompt i's samples are rows i*n .. i*n+n-1
        generator = torch.Generator(device=self.device)
        seed = sampling.seed if sampling.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
        generator.manual_seed(seed)
        stop_check = self._stop_checker(sampling.stop) if sampling.stop else None
        was_training = self.model.training
        self.model.eval()
        try:
            sampled = []
            for start in range(0, len(rows), self.batch_size):
                sampled += sample_batch(
                    self.model, rows[start : start + self.batch_size], sampling, eos_ids=self.eos_token_ids,
                    pad_id=self.pad_token_id, generator=generator, stop_check=stop_check,
                )  # fmt: skip
        finally:
            self.model.train(was_training)
        out = [self._completion(s, rows[i], sampling.stop) for i, s in enumerate(sampled)]
        return [out[i * n : (i + 1) * n] for i in range(len(encoded))]

    def _stop_checker(self, stops: Sequence[str]):
        """A check that decodes only the tail of a row, enough tokens to contain the longest stop string."""
        tail = max(len(s) for s in stops) + 2

        def check(ids: list[int]) -> bool:
            text = self.tokenizer.decode(ids[-tail:], skip_special_tokens=True)
            return any(s in text for s in stops)

        return check

    def _completion(self, s: Any, prompt_ids: list[int], stops: Sequence[str]) -> Completion:
        text = self.decode(s.token_ids)
        cut = [text.find(x) + len(x) for x in stops if x in text]
        if cut:
            text = text[: min(cut)]
        return Completion(
            text=text, token_ids=s.token_ids, logprobs=s.logprobs, finish_reason=s.finish_reason,
            prompt_token_ids=list(prompt_ids),
        )  # fmt: skip

    def logprobs(
        self, prompt_ids: Sequence[int], completion_ids: Sequence[int], temperature: float = 1.0
    ) -> list[float]:
        """The model's log-probs of ``completion_ids`` after ``prompt_ids`` (one forward pass, no grad)."""
        with torch.inference_mode():
            return sequence_logprobs(self.model, prompt_ids, completion_ids, temperature).tolist()

    def save(self, path: str | Path) -> None:
        """Save model (or LoRA adapter) and tokenizer with ``save_pretrained``."""
        self.model.save_pretrained(str(path))
        self.tokenizer.save_pretrained(str(path))


class LoraSpec(BaseModel):
    """A fresh LoRA adapter to train (through peft)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)

    r: int = Field(16, ge=1)
    """Adapter rank."""
    alpha: float = Field(32.0, gt=0)
    """Scaling numerator (the update is scaled by alpha / r)."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout on the adapter input."""
    target_modules: list[str] | str = "all-linear"
    """Module names to adapt (e.g. ["q_proj", "v_proj"]), or "all-linear"."""


class HFPolicyConfig(BaseModel):
    """A transformers causal LM from a local folder (or a hub id already in the Hugging Face cache)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, protected_namespaces=())

    kind: Literal["hf"] = "hf"
    """Component kind."""
    model: str
    """Local folder with config.json and weights, or a Hugging Face hub id already in the local cache (nothing is
    downloaded at run time)."""
    tokenizer: str | None = None
    """Tokenizer folder or id; None uses `model`."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "float32"
    """Weight dtype; "auto" keeps the checkpoint's."""
    device: str = "auto"
    """"auto" (CUDA if available, else CPU), "cpu", "cuda", "cuda:1", ..."""
    lora: LoraSpec | None = None
    """Train a fresh LoRA adapter instead of all weights."""
    adapter: str | None = None
    """Folder of a saved peft adapter to load on top of the model."""
    chat_template: bool = True
    """Apply the tokenizer's chat template to chat prompts when it has one."""
    answer_instruction: str | None = None
    """With a chat template applied: a system message before every prompt saying how to write the final answer,
    text prompts going through the template too (as a user message). "auto" (policy=hf's preset): the env's own
    instruction where its prompts state none (the math env's compact style), resolved when the run is composed;
    "": the template without a system message; null: prompts as the env writes them (lrmgym.policies.answer_format)."""
    batch_size: int = Field(64, ge=1)
    """Most sequences sampled in one batch."""
    trust_remote_code: bool = False
    """Allow model code from the checkpoint (only for checkpoints you trust)."""
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] | None = None
    """transformers' attention kernel (`from_pretrained(attn_implementation=...)`) for `model.forward`: sampling
    through `generate` and training models the lean forward does not take. None: transformers' choice (sdpa
    where it applies). "flash_attention_2" needs the flash-attn package and a CUDA GPU. The lean training
    forward (Llama, Mistral, Qwen2, Qwen3, Gemma) uses SDPA from 512 positions on whatever this says."""
    engine: Literal["lean", "vllm"] = "lean"
    """What samples rollouts (and evaluations): "lean", this process's torch sampler (lrmgym.policies.sampling), or
    "vllm", a colocated vLLM engine built from the same weights and sent the trained ones after each update (the
    adapter alone for LoRA), sleeping during the update on a GPU (lrmgym.policies.vllm_engine). Needs vLLM."""
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    """With engine=vllm: extra keyword arguments for vllm.LLM (e.g. gpu_memory_utilization, max_model_len)."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward instead of keeping them: less memory for long
    rollouts, about a third more compute in the update. transformers' gradient checkpointing (non-reentrant),
    which the lean training forward applies too."""

    def build(self) -> HFPolicy:
        """Check the folders (:mod:`lrmgym.policies.checkpoint`), then load the model and tokenizer and wrap them.

        Nothing is downloaded: a hub id must already be in the Hugging Face cache. A device this machine lacks is
        refused before any weights are read.
        """
        resolve_device(self.device)
        folder = model_folder(self.model, trust_remote_code=self.trust_remote_code)
        if self.tokenizer is None:
            tokenizer_path = tokenizer_folder(self.model, field="policy.model")  # the model folder's own tokenizer
        else:
            tokenizer_path = tokenizer_folder(self.tokenizer)
        if self.adapter is not None:
            adapter_folder(self.adapter)  # before the model's weights are read
        from transformers import AutoModelForCausalLM, AutoTokenizer

        kwargs: dict[str, Any] = {"trust_remote_code": self.trust_remote_code, "local_files_only": True}
        if self.dtype != "auto":
            kwargs[dtype_kwarg()] = _DTYPES[self.dtype]
        if self.attn_implementation == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
            raise ModelFolderError(
                "policy.attn_implementation='flash_attention_2' needs the flash-attn package (pip install flash-attn, "
                "on a CUDA machine); set policy.attn_implementation=sdpa or leave it unset."
            )
        if self.attn_implementation is not None:
            kwargs["attn_implementation"] = self.attn_implementation
        with load_errors(f"policy.model={self.model!r} from {folder}"):
            model = AutoModelForCausalLM.from_pretrained(str(folder), **kwargs)
            tokenizer = AutoTokenizer.from_pretrained(
                str(tokenizer_path), trust_remote_code=self.trust_remote_code, local_files_only=True
            )
        if self.gradient_checkpointing:  # transformers 5 renamed it activation checkpointing
            if callable(getattr(model, "activation_checkpointing_enable", None)):
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model = self._with_adapter(model)
        instruction = "" if self.answer_instruction == AUTO else self.answer_instruction  # unresolved: no system turn
        policy = HFPolicy(model, tokenizer, device=self.device, chat_template=self.chat_template,
                          batch_size=self.batch_size, answer_instruction=instruction)  # fmt: skip
        if self.engine == "vllm":
            from lrmgym.policies.vllm_engine import VLLMRolloutEngine

            rank = None  # a LoRA policy's engine runs the base model and is sent the adapter alone
            if self.lora is not None or self.adapter is not None:
                rank = self.lora.r if self.lora is not None else int(model.peft_config["default"].r)
            policy.rollout_engine = VLLMRolloutEngine.start(
                str(folder), tokenizer=str(tokenizer_path), dtype=self.dtype, device=policy.device, lora_rank=rank,
                trust_remote_code=self.trust_remote_code, engine_kwargs=self.engine_kwargs,
            )  # fmt: skip
        return policy

    @model_validator(mode="after")
    def _adapter_or_lora(self) -> HFPolicyConfig:
        if self.adapter is not None and self.lora is not None:
            raise ValueError("set policy.adapter (load a trained adapter) or policy.lora (a fresh one), not both")
        return self

    @model_validator(mode="after")
    def _check_engine(self) -> HFPolicyConfig:
        if self.engine == "lean":
            if self.engine_kwargs:
                raise ValueError("policy.engine_kwargs configures policy.engine=vllm; set that or drop engine_kwargs")
            return self
        if self.device not in ("auto", "cpu") and not self.device.startswith("cuda"):
            raise ValueError(f"policy.engine='vllm' runs on cpu or cuda, not policy.device={self.device!r}")
        from lrmgym.policies.vllm_engine import vllm_missing

        missing = vllm_missing()
        if missing is not None:
            raise ValueError(f"policy.engine='vllm' needs vLLM: {missing}")
        return self

    def _with_adapter(self, model: Any) -> Any:
        if self.adapter is not None:
            from peft import PeftModel

            return PeftModel.from_pretrained(model, str(adapter_folder(self.adapter)), is_trainable=True)
        if self.lora is not None:
            from peft import LoraConfig, get_peft_model

            spec = LoraConfig(r=self.lora.r, lora_alpha=self.lora.alpha, lora_dropout=self.lora.dropout,
                              target_modules=self.lora.target_modules, task_type="CAUSAL_LM")  # fmt: skip
            return get_peft_model(model, spec)
        return model
