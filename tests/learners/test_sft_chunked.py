"""SFT's masked cross-entropy on long rows: log-probs with the head in chunks, the same loss, no whole logits kept.

:class:`~lrmgym.learners.algorithms.sft.MaskedCE` computes ``[B, T, V]`` logits only where they fit in one
:data:`~lrmgym.policies.fasttrain.LOGIT_CHUNK`; the tests lower that threshold so that tiny models take the long-row
path, through the lean forward (Llama, Gemma) and through ``model.forward``'s decoder (Qwen3-MoE).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "policies"))  # the lean-forward tests' models

import pytest
import torch
import transformers
from fasttrain_helpers import COMMON, _close, _grads, _model

from lrmgym.learners.algorithms.sft import MaskedCE, collate_masked_ce
from lrmgym.policies import fasttrain

PAIRS = [([3, 4, 5, 6], [7, 8, 9]), ([10, 11], [12, 13, 14, 15, 16]), ([17, 18, 19], [20])]


def _moe() -> torch.nn.Module:
    config = transformers.Qwen3MoeConfig(
        **COMMON, num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config)


def _step(model: torch.nn.Module, chunk: int | None) -> tuple[float, int, dict[str, torch.Tensor]]:
    """One MaskedCE step (``LOGIT_CHUNK`` set to ``chunk`` logit elements): its loss, the most logit elements one
    tensor kept for the backward holds (tensors whose last dim is the vocabulary), the gradients."""
    model = copy.deepcopy(model)
    trainer = MaskedCE(model, lr=1e-2, lr_factor=lambda s: 1.0, max_grad_norm=None)
    ids, labels = collate_masked_ce(PAIRS, pad_id=0, eos_id=1)
    sizes = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.dim() and t.shape[-1] == model.config.vocab_size:  # logits (the weights' last dim is the hidden size)
            sizes.append(t.numel())
        return t

    with pytest.MonkeyPatch.context() as mp:
        if chunk is not None:
            mp.setattr(fasttrain, "LOGIT_CHUNK", chunk)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            stats = trainer.step(ids, labels)
    return stats["loss"], max(sizes), _grads(model)  # the step leaves its (unclipped) gradient on the parameters


@pytest.mark.parametrize(
    "make",
    [lambda: _model("llama"), lambda: _model("gemma", num_key_value_heads=2, head_dim=16), _moe],
    ids=["llama-lean", "gemma-lean", "qwen3_moe-model.forward"],
)
def test_long_rows_take_chunked_logprobs_with_the_same_loss(make):
    model = make()
    vocab = model.config.vocab_size
    ids, _ = collate_masked_ce(PAIRS, pad_id=0, eos_id=1)
    whole_loss, whole_saved, whole_grads = _step(model, None)  # the logits fit: whole, F.cross_entropy
    assert whole_saved >= (ids.shape[1] - 1) * vocab * ids.shape[0]  # the [B, T-1, V] logits are kept
    loss, saved, grads = _step(model, 3 * vocab)  # 3 tokens per chunk
    assert loss == pytest.approx(whole_loss, rel=1e-6, abs=1e-6)
    assert saved == 0  # no logits kept for the backward at all: each chunk's are recomputed there
    _close(grads, whole_grads)  # the same gradient through either path (float32 rounding)
