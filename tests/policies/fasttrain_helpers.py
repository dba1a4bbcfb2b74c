"""Tiny random-weight models of the architectures the lean training forward takes, and gradient comparisons:
shared by the lean-forward tests here and the learner tests that need such a model (they put this folder on
``sys.path``)."""

from __future__ import annotations

import torch
import transformers

COMMON = {
    "vocab_size": 40, "hidden_size": 64, "intermediate_size": 80, "num_hidden_layers": 2,
    "num_attention_heads": 4, "max_position_embeddings": 128,
}  # fmt: skip

MODELS = [
    ("llama", {"tie_word_embeddings": True, "pad_token_id": 0}),  # the padding row of the embedding gets no gradient
    ("llama", {"num_key_value_heads": 2, "rope_theta": 500.0}),  # grouped-query attention, untied head
    ("llama", {"attention_bias": True}),
    ("mistral", {"num_key_value_heads": 1, "sliding_window": None}),
    ("qwen2", {"num_key_value_heads": 2}),  # q/k/v biases
    ("qwen3", {"num_key_value_heads": 2, "head_dim": 16, "attention_bias": True}),  # per-head q/k norms
    ("mistral", {"num_key_value_heads": 2, "sliding_window": 4}),  # a window shorter than the rows
    ("qwen2", {"num_key_value_heads": 4, "use_sliding_window": True, "sliding_window": 5, "max_window_layers": 1}),
    ("gemma", {"num_key_value_heads": 2, "head_dim": 16, "pad_token_id": 0}),  # scaled embedding, 1 + w, GeGLU
]
IDS = [f"{k}-{i}" for i, (k, _) in enumerate(MODELS)]


def _model(kind: str, **extra) -> torch.nn.Module:
    config_cls = {
        "llama": transformers.LlamaConfig,
        "mistral": transformers.MistralConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "gemma": transformers.GemmaConfig,
    }[kind]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config_cls(**COMMON, **extra))
    with torch.no_grad():  # random non-zero biases and norm weights, so that a dropped one would show
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
    return model.train()


def _right_padded(rows: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
    return ids, mask


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        scale = b[name].abs().max().clamp(min=1e-6)
        assert float((a[name] - b[name]).abs().max() / scale) < 1e-3, name  # float32 rounding: ~1e-4
