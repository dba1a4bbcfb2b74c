"""Tiny-model recipes (policy.recipe, `lrmgym tiny build --recipe`) and bf16 sampling of fp32 weights."""

from __future__ import annotations

import json
import re

import pytest
import torch
from click.testing import CliRunner
from pydantic import ValidationError

from lrmgym.learners.algorithms.sft import build_tiny
from lrmgym.policies.base import SamplingParams
from lrmgym.policies.cast_sampling import CastSamplingPolicy
from lrmgym.policies.hf import HFPolicy
from lrmgym.policies.tiny import SHIPPED_DIR, TinyArch, TinyPolicyConfig, TinyTrainConfig, build_model, build_tokenizer
from lrmgym.policies.tiny_recipes import RECIPES, length_batched

DEFAULT_KEY = "e5ccc5651e3b3e01"
"""The default recipe's cache key: the shipped model's. A change here means the default run's result changed."""


def test_the_default_recipe_is_unchanged():
    assert TinyPolicyConfig().key() == DEFAULT_KEY == json.loads((SHIPPED_DIR / "build.json").read_text())["key"]
    assert TinyPolicyConfig(recipe="default").key() == DEFAULT_KEY
    cfg = TinyPolicyConfig(recipe="default")
    assert cfg.train == TinyTrainConfig() and cfg.arch == TinyArch()
    assert TinyPolicyConfig(sample_dtype="bfloat16").key() == DEFAULT_KEY  # how it samples, not the weights
    shipped = json.loads((SHIPPED_DIR / "build.json").read_text())["config"]
    assert cfg.train.model_dump(mode="json") == {**shipped["train"], "length_batches": False, "init_from": None}
    assert RECIPES["default"] == {}


def test_the_testbed_recipe_and_explicit_values_over_it():
    cfg = TinyPolicyConfig(recipe="testbed")
    assert cfg.train.env == "lrmgym/Testbed-v0" and cfg.train.length_batches and cfg.arch.max_positions == 512
    assert cfg.key() != DEFAULT_KEY
    shorter = TinyPolicyConfig(recipe="testbed", train={"steps": 5}, arch={"layers": 2})
    assert shorter.train.steps == 5 and shorter.train.env == "lrmgym/Testbed-v0"
    assert shorter.arch.layers == 2 and shorter.arch.max_positions == 512
    assert shorter.key() != cfg.key()
    # the recipe's values, given explicitly without the recipe, are the same model
    assert TinyPolicyConfig(**RECIPES["testbed"]).key() == cfg.key()
    message = "unknown tiny-model recipe 'nope'; expected one of default, testbed"
    with pytest.raises(ValidationError, match=re.escape(message)):
        TinyPolicyConfig(recipe="nope")


def test_length_batches_keep_every_pair_and_cut_padding():
    pairs = [("Q:", "x" * n) for n in [3, 90, 5, 70, 8, 60, 2, 95] * 16]
    batched = length_batched(pairs, 4, seed=0)
    assert sorted(batched) == sorted(pairs)
    width = lambda ps: sum(max(len(s) for _, s in ps[i : i + 4]) for i in range(0, len(ps), 4))  # noqa: E731
    assert width(batched) < 0.7 * width(pairs)
    assert batched == length_batched(pairs, 4, seed=0) != length_batched(pairs, 4, seed=1)


def test_a_testbed_build_fine_tunes_the_default_model_on_the_testbed(monkeypatch, tmp_path):
    from safetensors.torch import load_file

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cfg = TinyPolicyConfig(recipe="testbed", train={"steps": 1, "batch_size": 2, "warmup": 1, "lr": 1e-12}, threads=1)
    assert cfg.train.init_from == "default"
    folder = build_tiny(cfg, progress=False)
    facts = json.loads((folder / "build.json").read_text())
    assert facts["key"] == cfg.key() and facts["config"]["train"]["env"] == "lrmgym/Testbed-v0"
    assert "recipe" not in facts["config"] and "sample_dtype" not in facts["config"]
    built, shipped = load_file(str(folder / "model.safetensors")), load_file(str(SHIPPED_DIR / "model.safetensors"))
    assert built.keys() == shipped.keys()
    for name, tensor in shipped.items():  # one step at lr 1e-12: still the default model's weights
        torch.testing.assert_close(built[name], tensor, rtol=0, atol=1e-6)
    # from scratch, or an arch the default's weights do not fit
    scratch = TinyPolicyConfig(recipe="testbed", train={"init_from": None, "steps": 1, "batch_size": 2, "warmup": 1})
    assert scratch.key() != cfg.key()
    small = TinyPolicyConfig(recipe="testbed", arch={"hidden": 64, "heads": 2}, train={"steps": 1, "batch_size": 2})
    message = "train.init_from='default': its weights do not fit this arch (first: model.embed_tokens.weight); keep"
    with pytest.raises(ValueError, match=re.escape(message)):
        build_tiny(small, progress=False)


def test_cli_build_and_info_take_a_recipe(monkeypatch, tmp_path):
    from lrmgym.cli.tiny_cmd import command

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    key = TinyPolicyConfig(recipe="testbed").key()
    result = CliRunner().invoke(command, ["info", "--recipe", "testbed"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == (
        f"not built yet (would be {tmp_path / 'lrmgym' / 'tiny' / key}); run `lrmgym tiny build --recipe testbed`"
    )
    result = CliRunner().invoke(command, ["build", "--recipe", "nope"])
    assert result.exit_code == 2 and "'nope' is not one of 'default', 'testbed'" in result.output
    result = CliRunner().invoke(command, ["info", "--recipe", "default"])
    assert result.exit_code == 0 and "shipped with lrmgym" in result.output


def _policy(cast: bool):
    tok = build_tokenizer()
    model = build_model(TinyArch(hidden=64, layers=2, heads=2, mlp=128), len(tok), seed=0).eval()
    with torch.no_grad():  # peaked next-token distributions, as a trained model's (random init is near uniform)
        model.model.embed_tokens.weight.mul_(4.0)
    if cast:
        return CastSamplingPolicy(model, tok, device="cpu", chat_template=False, sample_dtype=torch.bfloat16)
    return HFPolicy(model, tok, device="cpu", chat_template=False)


@pytest.mark.parametrize("cast", [False, True])
def test_bf16_sampling_differs_from_the_fp32_trainer(cast):
    policy = _policy(cast)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=24, seed=7)
    groups = policy.generate(["Q:Compute 3+4. A:", "Q:Compute 12-5+1. A:"], n=4, sampling=sampling)
    diffs = []
    for group in groups:
        for c in group:
            trainer = policy.logprobs(c.prompt_token_ids, c.token_ids)
            diffs += [abs(a - b) for a, b in zip(c.logprobs, trainer, strict=True)]
    gap = sum(diffs) / len(diffs)
    if cast:
        assert gap > 1e-3, gap  # bf16 behaviour log-probs against the fp32 trainer's
        assert policy.model.dtype == torch.float32  # the trained weights stay fp32
    else:
        assert gap < 1e-4, gap
    again = policy.generate(["Q:Compute 3+4. A:", "Q:Compute 12-5+1. A:"], n=4, sampling=sampling)
    assert [c.text for g in again for c in g] == [c.text for g in groups for c in g]  # seeded, as fp32 is


def test_the_tiny_config_builds_a_bf16_sampler(tmp_path):
    policy = _policy(cast=False)
    policy.save(tmp_path)
    built = TinyPolicyConfig(path=str(tmp_path), sample_dtype="bfloat16").build()
    assert isinstance(built, CastSamplingPolicy) and built.sample_dtype == torch.bfloat16
    assert type(TinyPolicyConfig(path=str(tmp_path)).build()) is HFPolicy


def test_a_model_the_lean_decoder_cannot_run_is_a_clear_error():
    policy = _policy(cast=False)
    policy.model.model.layers[0].register_forward_hook(lambda *a: None)
    with pytest.raises(ValueError, match=re.escape("policy.sample_dtype=bfloat16 needs a model the lean decoder")):
        CastSamplingPolicy(policy.model, policy.tokenizer, sample_dtype=torch.bfloat16)


def test_the_lean_decoder_runs_a_cast_copy_only_inside_sample_dtype():
    from lrmgym.policies.fastdecode import LlamaDecoder, sample_dtype

    model = _policy(cast=False).model
    ids = torch.tensor([[5, 9, 12, 40, 41, 42]])
    attention, positions = torch.ones_like(ids), torch.arange(6)[None]
    plain = LlamaDecoder.build(model)
    with sample_dtype(torch.bfloat16):
        cast = LlamaDecoder.build(model)
    assert plain.embed.dtype == torch.float32 and cast.embed.dtype == torch.bfloat16
    assert cast.layers[0].qkv.weight.dtype == torch.bfloat16 and cast.lm_head_w.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the model itself is untouched
    assert LlamaDecoder.build(model).embed.dtype == torch.float32  # the context is over
    with torch.inference_mode():  # as the sampler runs it
        reference = model(input_ids=ids).logits[:, -1].float()
        a = plain.prefill(ids, attention, positions, 2)
        b = cast.prefill(ids, attention, positions, 2)
    torch.testing.assert_close(a, reference, rtol=1e-4, atol=1e-4)
    assert b.dtype == torch.float32 and 1e-3 < (b - reference).abs().max() < 0.5
