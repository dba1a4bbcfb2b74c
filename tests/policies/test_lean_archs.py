"""Qwen3, sliding-window and Gemma models through the lean sampler and the lean training forward.

Each architecture's log-probs match ``model.forward``'s to 1e-5 in float32, and dropping what the architecture adds
(the q/k norms, the window, the embedding scale, Gemma's ``1 + w``) breaks that match, so the comparisons can fail.
Gemma2/3 and MoE models fall back to ``model.forward``, the reason logged once.
"""

from __future__ import annotations

import logging

import pytest
import torch
import transformers
from fasttrain_helpers import COMMON, _model, _right_padded

from lrmgym.policies import fastdecode
from lrmgym.policies.fastdecode import FALLBACK_REASONS, LlamaDecoder, layer_windows
from lrmgym.policies.fasttrain import LlamaTrainer

QWEN3 = ("qwen3", {"num_key_value_heads": 2, "head_dim": 16})
MISTRAL = ("mistral", {"num_key_value_heads": 2, "sliding_window": 3})
QWEN2_SLIDING = (
    "qwen2",
    {"num_key_value_heads": 4, "use_sliding_window": True, "sliding_window": 3, "max_window_layers": 1},
)  # layer 1 slides
GEMMA = ("gemma", {"num_key_value_heads": 2, "head_dim": 16})
ARCHS = [QWEN3, MISTRAL, QWEN2_SLIDING, GEMMA]
ROWS = [[3, 4, 5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [15, 16, 17, 18, 19, 20]]


def _decoded_logprobs(model: torch.nn.Module, decoder: LlamaDecoder, steps: int = 4) -> tuple:
    """Log-probs of the lean decoder (left-padded prefill, then ``steps`` tokens) and of model.forward per row."""
    width = max(map(len, ROWS))
    ids = torch.zeros(len(ROWS), width, dtype=torch.long)
    att = torch.zeros_like(ids)
    for i, r in enumerate(ROWS):
        ids[i, width - len(r) :], att[i, width - len(r) :] = torch.tensor(r), 1
    seqs = [list(r) for r in ROWS]
    fast, ref = [], []
    with torch.inference_mode():
        out = decoder.prefill(ids, att, (att.cumsum(-1) - 1).clamp(min=0), new=steps)
        for step in range(steps + 1):
            fast.append(torch.log_softmax(out, -1))
            whole = [model(input_ids=torch.tensor([s])).logits[0, -1] for s in seqs]  # each row alone, unpadded
            ref.append(torch.log_softmax(torch.stack(whole), -1))
            if step == steps:
                break
            token = torch.tensor([21 + step + i for i in range(len(ROWS))])
            for s, tok in zip(seqs, token.tolist(), strict=True):
                s.append(tok)
            out = decoder.step(token, torch.tensor([len(s) - 1 for s in seqs]))
    return torch.stack(fast), torch.stack(ref)


def _trained_logprobs(model: torch.nn.Module, trainer: LlamaTrainer) -> tuple:
    """Next-token log-probs on the real targets: the lean training forward's and model.forward's."""
    ids, mask = _right_padded(ROWS)
    real = mask[:, 1:].bool()
    with torch.no_grad():
        lean, _ = trainer.logprobs(trainer.hidden(ids)[:, :-1], ids[:, 1:])
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
    ref = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return lean[real], ref[real]


@pytest.mark.parametrize(("kind", "extra"), ARCHS, ids=[k for k, _ in ARCHS])
def test_lean_logprobs_match_model_forward(kind, extra):
    model = _model(kind, **extra).eval()
    decoder, trainer = LlamaDecoder.build(model), LlamaTrainer.build(model)
    assert decoder is not None and trainer is not None
    torch.testing.assert_close(*_decoded_logprobs(model, decoder), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(*_trained_logprobs(model, trainer), rtol=1e-5, atol=1e-5)


def test_the_windows_are_where_the_config_puts_them():
    assert layer_windows(_model(MISTRAL[0], **MISTRAL[1])) == [3, 3]
    assert layer_windows(_model(QWEN2_SLIDING[0], **QWEN2_SLIDING[1])) == [None, 3]  # from max_window_layers on
    assert layer_windows(_model("mistral", sliding_window=None)) == [None, None]
    assert layer_windows(_model("qwen3", head_dim=16, sliding_window=3)) == [None, None]  # use_sliding_window off


def _differs(pair: tuple) -> bool:
    return not torch.allclose(pair[0], pair[1], rtol=1e-3, atol=1e-3)


def _without_qk_norms(part) -> None:
    for layer in part.layers:
        (q_w, q_eps), (k_w, k_eps) = layer.qk_norms
        layer.qk_norms = ((torch.ones_like(q_w) * 0.25, q_eps), (torch.ones_like(k_w), k_eps))  # plain 1/sqrt(D) scale


def _without_window(part) -> None:
    part.windows = [None] * len(part.windows)
    for layer in part.layers:
        if hasattr(layer, "window"):
            layer.window = None


def _without_embed_scale(part) -> None:
    part.embed_scale = None


def _without_unit_offset(part) -> None:
    part.final_scale = part.final_norm.weight  # the final norm's weight alone, not 1 + weight


@pytest.mark.parametrize(
    ("arch", "break_it"),
    [
        (QWEN3, _without_qk_norms),
        (MISTRAL, _without_window),
        (QWEN2_SLIDING, _without_window),
        (GEMMA, _without_embed_scale),
        (GEMMA, _without_unit_offset),
    ],
    ids=["qwen3-qk-norm", "mistral-window", "qwen2-window", "gemma-embed-scale", "gemma-1+w"],
)
def test_a_missing_piece_breaks_the_match(arch, break_it):
    model = _model(arch[0], **arch[1]).eval()
    decoder, trainer = LlamaDecoder.build(model), LlamaTrainer.build(model)
    break_it(decoder)
    break_it(trainer)
    assert _differs(_decoded_logprobs(model, decoder))
    assert _differs(_trained_logprobs(model, trainer))


@pytest.mark.parametrize(
    ("config_cls", "model_type", "extra"),
    [
        (transformers.Gemma2Config, "gemma2", {}),
        (transformers.Gemma3TextConfig, "gemma3_text", {}),
        (transformers.Qwen3MoeConfig, "qwen3_moe", {"num_experts": 4, "num_experts_per_tok": 2}),
    ],
)
def test_near_architectures_fall_back_with_a_reason_logged_once(config_cls, model_type, extra, caplog, monkeypatch):
    monkeypatch.setattr(fastdecode, "_LOGGED", set())
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        config_cls(**COMMON, num_key_value_heads=2, head_dim=16, **extra)
    )
    assert model.config.model_type == model_type
    with caplog.at_level(logging.WARNING, logger="lrmgym.policies.fastdecode"):
        assert LlamaDecoder.build(model) is None
        assert LlamaTrainer.build(model) is None
        assert LlamaDecoder.build(model) is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and FALLBACK_REASONS[model_type] in lines[0], lines
    # and model.forward's log-probs are what the sampler and the update then use: nothing to compare, no error
    ids, mask = _right_padded(ROWS)
    assert torch.isfinite(model(input_ids=ids, attention_mask=mask).logits).all()
