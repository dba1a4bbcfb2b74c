"""The lean decoder gives the logits of ``model.forward``, and the sampler takes it only for supported models."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers

from lrmgym.policies import sampling as sampling_mod
from lrmgym.policies.base import SamplingParams
from lrmgym.policies.fastdecode import LlamaDecoder
from lrmgym.policies.sampling import compaction_order, sample_batch

COMMON = {
    "vocab_size": 50, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
    "num_attention_heads": 4, "max_position_embeddings": 128,
}  # fmt: skip


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
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.normal_(0, 0.5)
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model.eval()


MODELS = [
    ("llama", {}),
    ("llama", {"num_key_value_heads": 2, "rope_theta": 500.0}),  # grouped-query attention
    ("llama", {"attention_bias": True, "tie_word_embeddings": True}),
    ("mistral", {"num_key_value_heads": 1, "sliding_window": None}),
    ("qwen2", {"num_key_value_heads": 2}),  # q/k/v biases
    ("qwen3", {"num_key_value_heads": 2, "head_dim": 16, "attention_bias": True}),  # per-head q/k norms
    ("mistral", {"num_key_value_heads": 2, "sliding_window": 4}),  # a window shorter than the sequences
    ("qwen2", {"num_key_value_heads": 4, "use_sliding_window": True, "sliding_window": 3, "max_window_layers": 1}),
    ("gemma", {"num_key_value_heads": 2, "head_dim": 16}),  # scaled embedding, 1 + w norms, GeGLU, tied head
    # RoPE angles computed per step (transformers rescales "dynamic" RoPE with the length seen), not from a table
    ("llama", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}}),
]


def _left_padded(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad)
    att = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :] = torch.tensor(p)
        att[row, width - len(p) :] = 1
    return ids, att, (att.cumsum(-1) - 1).clamp(min=0)


@pytest.fixture
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


# With two intra-op threads on a CPU the decoder runs each product as two column blocks (fastdecode._Product).
@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize(("kind", "extra"), MODELS, ids=[f"{k}-{i}" for i, (k, _) in enumerate(MODELS)])
def test_prefill_and_steps_match_model_forward(kind, extra, threads):
    model = _model(kind, **extra)
    assert LlamaDecoder.build(model) is not None
    assert LlamaDecoder.build(model).layers[0].gate_up.blocks == threads
    assert LlamaDecoder.build(model).static_rope == ("rope_parameters" not in extra)
    prompts = [[3, 4, 5, 6, 7, 8], [9, 10], [11, 12, 13, 14], [15], [16, 17, 18]]
    ids, att, pos = _left_padded(prompts, pad=0)
    seqs = [list(p) for p in prompts]
    gen = torch.Generator().manual_seed(1)
    # Row changes between steps, as the sampler makes them: drop finished rows 0 and 2 (rows 3 and 4 move into
    # their slots, in place), drop the middle row, then a general reorder (rebuilt with index_select).
    changes = {1: compaction_order([1, 3, 4]), 2: compaction_order([0, 2]), 3: [1, 0]}
    assert changes[1] == [3, 1, 4] and changes[2] == [0, 2]
    with torch.inference_mode():
        dec = LlamaDecoder.build(model)
        fast = dec.prefill(ids, att, pos, new=6)
        alive = [0, 1, 2, 3, 4]
        for step in range(5):
            # Reference: a full, uncached forward of each row's whole sequence (no padding at all).
            ref = torch.stack([model(input_ids=torch.tensor([seqs[r]])).logits[0, -1] for r in alive])
            torch.testing.assert_close(fast, ref, rtol=1e-4, atol=1e-4)
            token = torch.randint(1, 50, (len(alive),), generator=gen)
            for i, r in enumerate(alive):
                seqs[r].append(int(token[i]))
            if step in changes:
                keep = torch.tensor(changes[step])
                if step == 3:
                    dec.select(keep)  # a general reorder: new buffers
                else:
                    dec.drop(changes[step])  # the sampler's compaction: rows moved in place
                token = token[keep]
                alive = [alive[i] for i in changes[step]]
                assert dec.keys[0].shape[0] == dec.bias.shape[0] == len(alive)
            positions = torch.tensor([len(seqs[r]) - 1 for r in alive])
            fast = dec.step(token, positions)


def test_sampler_gives_the_same_tokens_with_and_without_the_fast_path(monkeypatch):
    model = _model("llama", num_key_value_heads=2)
    prompts = [[3, 4, 5], [6, 7, 8, 9, 10, 11], [12]] * 2
    params = SamplingParams(temperature=1.0, max_new_tokens=12)

    def run() -> list:
        return sample_batch(
            model, prompts, params, eos_ids=[2], pad_id=0, generator=torch.Generator().manual_seed(7)
        )  # fmt: skip

    fast = run()
    monkeypatch.setattr(sampling_mod.LlamaDecoder, "build", classmethod(lambda cls, m: None))
    slow = run()
    assert [s.token_ids for s in fast] == [s.token_ids for s in slow]
    assert [s.finish_reason for s in fast] == [s.finish_reason for s in slow]
    for a, b in zip(fast, slow, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert all(len(s.token_ids) <= 12 for s in fast)


def test_reused_buffers_do_not_leak_between_batches():
    # The decoder keeps its CPU key/value storage for the next batch: a batch run after a larger one (whose
    # stale keys fill that storage) and before a smaller one samples exactly what it samples first.
    model = _model("llama", num_key_value_heads=2)
    params = SamplingParams(temperature=1.0, max_new_tokens=10)
    small = [[3, 4, 5], [6, 7, 8, 9, 10, 11], [12], [13, 14]] * 3

    def run(prompts: list[list[int]], seed: int) -> list:
        out = sample_batch(
            model, prompts, params, eos_ids=[2], pad_id=0, generator=torch.Generator().manual_seed(seed)
        )  # fmt: skip
        return [(s.token_ids, s.finish_reason) for s in out]

    first = run(small, 3)
    run([[20 + i, 21, 22, 23, 24, 25, 26, 27] for i in range(10)] * 4, 4)  # longer prompts, more rows
    assert run(small, 3) == first
    run([[5]], 5)
    assert run(small, 3) == first


def test_the_decoder_follows_weight_updates():
    model = _model("llama")
    ids, att, pos = _left_padded([[3, 4, 5]], pad=0)
    with torch.inference_mode():
        before = LlamaDecoder.build(model).prefill(ids, att, pos, new=1)
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.weight.mul_(3.0)
        model.model.layers[1].mlp.up_proj.weight.add_(0.1)
    with torch.inference_mode():
        after = LlamaDecoder.build(model).prefill(ids, att, pos, new=1)
        ref = model(input_ids=ids).logits[:, -1]
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, ref, rtol=1e-4, atol=1e-4)


def test_unsupported_models_use_model_forward():
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=40))
    assert LlamaDecoder.build(gpt2) is None
    gemma2 = transformers.AutoModelForCausalLM.from_config(transformers.Gemma2Config(**COMMON, head_dim=16))
    assert LlamaDecoder.build(gemma2) is None  # soft-capping, sandwich norms: not the supported layer
    gelu = _model("llama", hidden_act="gelu")
    assert LlamaDecoder.build(gelu) is None
    hooked = _model("llama")
    hooked.lm_head.register_forward_hook(lambda mod, inp, out: out + 1.0)
    assert LlamaDecoder.build(hooked) is None  # hooks must see every forward


def test_a_lora_model_decodes_through_its_effective_weights():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        _model("llama", num_key_value_heads=2),
        peft.LoraConfig(
            r=2, lora_alpha=4, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"], lora_dropout=0.0
        ),
    ).eval()
    with torch.no_grad():  # peft starts B at 0 (no change): make the adapters matter
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.3)
    ids, att, pos = _left_padded([[3, 4, 5, 6], [7, 8]], pad=0)
    with torch.inference_mode():
        ref = model(input_ids=ids, attention_mask=att, position_ids=pos).logits[:, -1]
        dec = LlamaDecoder.build(model)
        assert dec is not None
        torch.testing.assert_close(dec.prefill(ids, att, pos, new=2), ref, rtol=1e-4, atol=1e-4)
        with model.disable_adapter():  # the frozen base, as ReasonMaxxer scores it
            base = model(input_ids=ids, attention_mask=att, position_ids=pos).logits[:, -1]
            torch.testing.assert_close(
                LlamaDecoder.build(model).prefill(ids, att, pos, new=2), base, rtol=1e-4, atol=1e-4
            )
        assert (ref - base).abs().max() > 1e-2  # the adapter changes the logits: the two checks differ
        model.merge_adapter()  # the deltas now sit in W: the decoder must not add them a second time
        merged = model(input_ids=ids, attention_mask=att, position_ids=pos).logits[:, -1]
        torch.testing.assert_close(merged, ref, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(LlamaDecoder.build(model).prefill(ids, att, pos, new=2), ref, rtol=1e-4, atol=1e-4)
        model.unmerge_adapter()
    dora = peft.get_peft_model(_model("llama"), peft.LoraConfig(r=2, target_modules=["q_proj"], use_dora=True))
    assert LlamaDecoder.build(dora) is None  # DoRA rescales the weight: not a plain delta, so model.forward


def test_two_live_decoders_keep_their_own_caches():
    """A decoder's reused CPU storage is its own while it lives: a second decoder (another model, decoded in
    lockstep, as `lrmgym analyze shift` does) must not write into the first one's keys and values."""
    first, second = _model("llama"), _model("llama", num_key_value_heads=2)
    ids, att, pos = _left_padded([[3, 4, 5], [6, 7]], pad=0)
    token, step_pos = torch.tensor([8, 9]), torch.tensor([3, 2])
    with torch.inference_mode():
        alone = LlamaDecoder.build(first)
        alone.prefill(ids, att, pos, new=2)
        expected = alone.step(token, step_pos).clone()
        del alone
        a, b = LlamaDecoder.build(first), LlamaDecoder.build(second)
        a.prefill(ids, att, pos, new=2)
        b.prefill(ids, att, pos, new=2)  # with one shared storage, this overwrote a's cache
        torch.testing.assert_close(a.step(token, step_pos), expected, rtol=0, atol=0)
        assert a.keys[0].data_ptr() != b.keys[0].data_ptr()


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
def test_bfloat16_decodes_as_closely_as_model_forward(threads):
    # bfloat16 has no complex type: RoPE rotates in float32 and is copied back. The lean decoder in bfloat16 must
    # stay as close to the float32 logits as the model's own bfloat16 forward (at most twice its error).
    model = _model("llama", num_key_value_heads=2)
    with torch.no_grad():  # sharp attention, so that positions (RoPE) move the logits well above bfloat16's error
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(20)
            layer.self_attn.k_proj.weight.mul_(20)
    half = copy.deepcopy(model).to(torch.bfloat16)
    prompts = [[3, 4, 5, 6], [7, 8], [9, 10, 11]]
    ids, att, pos = _left_padded(prompts, pad=0)
    with torch.inference_mode():
        dec = LlamaDecoder.build(half)
        outs = [dec.prefill(ids, att, pos, new=4)]
        seqs = [p + [t] for p, t in zip(prompts, [12, 13, 14], strict=True)]
        outs.append(dec.step(torch.tensor([12, 13, 14]), torch.tensor([len(s) - 1 for s in seqs])))
        for fast, rows in zip(outs, (prompts, seqs), strict=True):
            exact = torch.stack([model(input_ids=torch.tensor([r])).logits[0, -1] for r in rows])
            hf = torch.stack([half(input_ids=torch.tensor([r])).logits[0, -1].float() for r in rows])
            assert fast.dtype == torch.float32
            assert (fast - exact).abs().max() <= 2 * (hf - exact).abs().max() + 1e-3


@pytest.mark.parametrize(("kind", "extra"), MODELS[3:9], ids=lambda v: v if isinstance(v, str) else "")
def test_bf16_sampling_copy_runs_every_lean_architecture(kind, extra):
    """``sample_dtype(bfloat16)`` casts every weight the decoder applies (q/k norms, Gemma's embedding scale
    included): the prefill runs, stays near the fp32 model (bf16 rounding, ~3e-3), and is not the fp32 result."""
    from lrmgym.policies.fastdecode import sample_dtype

    model = _model(kind, **extra)
    ids = torch.randint(3, COMMON["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(0))
    att, pos = torch.ones_like(ids), torch.arange(7).expand(2, 7)
    with torch.inference_mode():  # as the sampler runs the decoder (its buffers are reused across decoders)
        ref = torch.log_softmax(model(ids).logits[:, -1].float(), -1)
        with sample_dtype(torch.bfloat16):
            decoder = LlamaDecoder.build(model)
        gap = (torch.log_softmax(decoder.prefill(ids, att, pos, 2), -1) - ref).abs().max()
    assert 1e-5 < float(gap) < 5e-2
