"""policy.sample_dtype=bfloat16: the update's train/infer gap metric sees the bf16 sampler against the fp32 trainer."""

from __future__ import annotations

import json

import torch
from learner_helpers import register_test_env, run_config, small_grpo

from lrmgym.compose import train
from lrmgym.policies.tiny import TinyArch, TinyPolicyConfig, build_model, build_tokenizer

register_test_env()


def _gap(tmp_path, model_dir, sample_dtype):
    cfg = run_config(small_grpo(steps=1, max_new_tokens=12))
    cfg = cfg.model_copy(update={"policy": TinyPolicyConfig(path=str(model_dir), sample_dtype=sample_dtype)})
    train(cfg, tmp_path / sample_dtype)
    (line,) = [json.loads(x) for x in (tmp_path / sample_dtype / "metrics.jsonl").read_text().splitlines()]
    return line["train_infer/logp_abs_diff"], line["train_infer/kl"]


def test_bf16_sampling_shows_a_train_infer_gap(tmp_path):
    tok = build_tokenizer()
    model = build_model(TinyArch(hidden=64, layers=2, heads=2, mlp=128), len(tok), seed=0)
    with torch.no_grad():  # peaked next-token distributions, as a trained model's
        model.model.embed_tokens.weight.mul_(4.0)
    model.save_pretrained(str(tmp_path / "model"))
    tok.save_pretrained(str(tmp_path / "model"))
    fp32, fp32_kl = _gap(tmp_path, tmp_path / "model", "float32")
    bf16, bf16_kl = _gap(tmp_path, tmp_path / "model", "bfloat16")
    assert fp32 < 1e-4 and fp32_kl < 1e-6  # one fp32 model samples and trains: no gap
    assert bf16 > 1e-3 and bf16_kl > 1e-6 and bf16 > 20 * fp32, (bf16, fp32)
