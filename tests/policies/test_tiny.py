"""The tiny default model: tokenizer, builder, cache, reproducibility. The full build is a slow test."""

from __future__ import annotations

import json
import re

import pytest
import torch
from click.testing import CliRunner
from pydantic import ValidationError
from safetensors.torch import load_file

from lrmgym.learners.algorithms.sft import build_tiny, env_examples
from lrmgym.policies.base import SamplingParams
from lrmgym.policies.hf import HFPolicy
from lrmgym.policies.tiny import (
    SHIPPED_DIR,
    TAG_TOKENS,
    TinyArch,
    TinyPolicyConfig,
    TinyTrainConfig,
    build_tokenizer,
    tiny_cache_root,
)

SMALL = {"arch": {"hidden": 64, "layers": 1, "heads": 2, "mlp": 64},
         "train": {"steps": 4, "batch_size": 4, "warmup": 1}}  # fmt: skip


def _pairs(cfg: TinyTrainConfig, count: int) -> list[tuple[str, str]]:
    return [(f"Q:Compute {i}+1. A:", f"<think>{i}+1={i + 1}</think><answer>{i + 1}</answer>") for i in range(count)]


def test_tokenizer_round_trip_and_single_token_tags(tmp_path):
    from transformers import AutoTokenizer

    tok = build_tokenizer()
    text = "Q:Compute 93+13+41. A:<think>93+13=106;106+41=147</think><answer>147</answer>"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    for tag in TAG_TOKENS:
        assert len(tok(tag)["input_ids"]) == 1
    assert len(ids) == len("Q:Compute 93+13+41. A:") + 4 + len("93+13=106;106+41=147") + len("147")
    assert tok.decode(tok("é")["input_ids"], skip_special_tokens=True) == ""  # unknown characters -> <unk>
    tok.save_pretrained(str(tmp_path))
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    assert loaded(text)["input_ids"] == ids and loaded.eos_token_id == tok.eos_token_id == 1


def test_arch_head_dim_must_suit_vllm():
    msg = ("hidden / heads must be 32 or 64 so vLLM can serve the model, got hidden=128, heads=8 (head dim 16). "
           "E.g. hidden=128, heads=4.")  # fmt: skip
    with pytest.raises(ValidationError, match=re.escape(msg)):
        TinyArch(hidden=128, heads=8)


def test_cache_location_and_key(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tiny_cache_root() == tmp_path / "lrmgym" / "tiny"
    cfg = TinyPolicyConfig()
    assert cfg.cache_dir() == tmp_path / "lrmgym" / "tiny" / cfg.key()
    assert TinyPolicyConfig(seed=1).key() != cfg.key()
    assert TinyPolicyConfig(train={"steps": 5}).key() != cfg.key()
    assert TinyPolicyConfig(device="cuda", threads=2, batch_size=8).key() == cfg.key()  # not weight-relevant
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert tiny_cache_root().parts[-3:] == (".cache", "lrmgym", "tiny")


def test_build_is_cached_reproducible_and_loads(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cfg = TinyPolicyConfig(**SMALL)
    folder = build_tiny(cfg, progress=False, examples=_pairs)
    facts = json.loads((folder / "build.json").read_text())
    assert facts["key"] == cfg.key() and facts["params"] > 0 and facts["weight_bytes"] > 0
    assert facts["first_loss"] > facts["final_loss"] > 0
    first = load_file(str(folder / "model.safetensors"))
    assert build_tiny(cfg, progress=False, examples=_pairs) == folder  # cached: not rebuilt
    assert load_file(str(folder / "model.safetensors")).keys() == first.keys()
    build_tiny(cfg, force=True, progress=False, examples=_pairs)
    again = load_file(str(folder / "model.safetensors"))
    assert all(torch.equal(first[k], again[k]) for k in first)  # same seed, same weights
    other_dir = build_tiny(TinyPolicyConfig(**SMALL, seed=1), progress=False, examples=_pairs)
    other = load_file(str(other_dir / "model.safetensors"))
    assert not torch.equal(other["model.embed_tokens.weight"], first["model.embed_tokens.weight"])
    policy = cfg.build()
    assert isinstance(policy, HFPolicy)
    ((c,),) = policy.generate(["Q:Compute 3+1. A:"], sampling=SamplingParams(max_new_tokens=5, seed=0))
    assert len(c.token_ids) <= 5 and c.logprobs is not None
    assert sorted(p.name for p in folder.iterdir()) == [
        "build.json", "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
        "tokenizer_config.json",
    ]  # fmt: skip


def test_a_forced_rebuild_that_fails_while_writing_keeps_the_old_model(monkeypatch, tmp_path):
    from lrmgym.learners.algorithms import sft

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cfg = TinyPolicyConfig(**SMALL)
    folder = build_tiny(cfg, progress=False, examples=_pairs)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def broken(path):  # the disk fills while the new build's tokenizer config is written
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sft, "_portable_tokenizer_config", broken)
    with pytest.raises(OSError, match="No space left"):
        build_tiny(cfg, force=True, progress=False, examples=_pairs)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # the old model, whole
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]  # no temporary folder left


def test_missing_model_without_building_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cfg = TinyPolicyConfig(seed=1, build_if_missing=False)  # seed 0's model ships with lrmgym
    msg = (f"The tiny model for this config is not built yet (expected in {cfg.cache_dir()}). "
           "Run `lrmgym tiny build` or set policy.build_if_missing=true.")  # fmt: skip
    with pytest.raises(FileNotFoundError, match=f"^{re.escape(msg)}$"):
        cfg.build()


def test_the_composition_root_builds_a_missing_model(monkeypatch, tmp_path):
    # A policy never trains itself (that reads an env's data); lrmgym.compose builds it once, then it loads.
    from types import SimpleNamespace

    from lrmgym.compose import build_policy
    from lrmgym.learners.algorithms import sft

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cfg = TinyPolicyConfig(**SMALL, seed=3)
    assert cfg.needs_build()
    with pytest.raises(FileNotFoundError, match="Build the policy through lrmgym.compose.build_policy"):
        cfg.build()
    built = []
    monkeypatch.setattr(sft, "env_examples", lambda train, count: built.append(count) or _pairs(train, count))
    policy = build_policy(SimpleNamespace(policy=cfg))
    assert built == [SMALL["train"]["steps"] * SMALL["train"]["batch_size"]] and not cfg.needs_build()
    assert isinstance(policy, HFPolicy)
    build_policy(SimpleNamespace(policy=cfg))  # cached: no second build
    assert len(built) == 1
    assert not TinyPolicyConfig(**SMALL, seed=4, build_if_missing=False).needs_build()


def test_training_pairs_come_from_the_math_env_train_split():
    pairs = env_examples(TinyTrainConfig(), 20)
    assert all(p.startswith("Q:") and p.endswith("A:") for p, _ in pairs)
    assert all(s.startswith("<think>") and s.endswith("</answer>") for _, s in pairs)
    with pytest.raises(ValueError, match="has no text prompt with a metadata\\['solution'\\] string"):
        env_examples(TinyTrainConfig(env="lrmgym/Echo-v0", env_options={}), 1)


def test_cli_info_and_bad_option(monkeypatch, tmp_path):
    from lrmgym.cli.tiny_cmd import command

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    result = CliRunner().invoke(command, ["info", "--seed", "1"])
    assert result.exit_code == 0 and result.output.startswith("not built yet (would be ")
    for sub in ("info", "build"):  # the default model is shipped: nothing to build
        result = CliRunner().invoke(command, [sub])
        assert result.exit_code == 0 and "shipped with lrmgym" in result.output
        assert str(SHIPPED_DIR) in result.output and "parameters: 792,576" in result.output
    assert not (tmp_path / "lrmgym").exists()
    result = CliRunner().invoke(command, ["build", "--steps", "0"])
    assert result.exit_code == 2 and "0 is not in the range x>=1" in result.output


@pytest.mark.slow
def test_default_build_is_at_the_edge_of_competence(monkeypatch, tmp_path):
    """The real recipe: build time and held-out accuracy at T=1 in the 20-60 % band (several minutes)."""
    import lrmgym
    from lrmgym.eval import EvalConfig, evaluate

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cfg = TinyPolicyConfig(threads=1)
    policy = cfg.build()
    facts = json.loads((cfg.cache_dir() / "build.json").read_text())
    assert facts["params"] < 1_000_000
    env = lrmgym.make("Math-v0", difficulty=1, style="compact", template="r1")
    report = evaluate(env, policy, EvalConfig(n=4, k=[1, 4], tasks=200, max_new_tokens=64), progress=False)
    assert 0.2 <= report["avg@n"]["value"] <= 0.6


def test_the_default_model_ships_with_the_package(monkeypatch, tmp_path):
    from lrmgym.learners.algorithms import sft

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    facts = json.loads((SHIPPED_DIR / "build.json").read_text())
    cfg = TinyPolicyConfig()
    assert facts["key"] == cfg.key(), "the default recipe changed: rebuild and re-ship lrmgym/policies/tiny_default"
    assert cfg.model_dir() == cfg.shipped_dir() == SHIPPED_DIR
    assert TinyPolicyConfig(seed=1).shipped_dir() is None and TinyPolicyConfig(path=str(tmp_path)).shipped_dir() is None

    def no_build(*a, **k):
        raise AssertionError("the shipped model must load without a build")

    monkeypatch.setattr(sft, "build_tiny", no_build)
    assert not cfg.needs_build()
    policy = cfg.build()
    assert sum(p.numel() for p in policy.model.parameters()) == facts["params"]
    ((c,),) = policy.generate(["Q:Compute 3+1. A:"], sampling=SamplingParams(temperature=0.0, max_new_tokens=40))
    assert c.text.startswith("<think>") and c.text.endswith("</answer>")
    # A cache entry of the same key takes precedence over the shipped copy.
    entry = cfg.cache_dir()
    entry.mkdir(parents=True)
    (entry / "build.json").write_text("{}")
    assert cfg.model_dir() == entry


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the build alone takes ~7 minutes on one idle core
def test_default_build_reproduces_the_shipped_weights(monkeypatch, tmp_path):
    """Rebuild the default model from scratch (about 7 minutes, 1 thread) and compare it with the shipped bytes."""
    import hashlib

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = build_tiny(TinyPolicyConfig(threads=1), progress=False)
    digest = [hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest() for d in (folder, SHIPPED_DIR)]
    assert digest[0] == digest[1]


def test_retry_examples_show_a_wrong_attempt_the_envs_feedback_and_the_right_solution():
    cfg = TinyTrainConfig(retry_share=0.5)
    pairs = env_examples(cfg, 40)
    assert pairs == env_examples(cfg, 40)  # deterministic
    plain = env_examples(TinyTrainConfig(), 40)
    assert [t for _, t in pairs] == [t for _, t in plain]  # the same tasks, the same (right) targets
    retried = [(p, q) for (p, _), (q, _) in zip(pairs, plain, strict=True) if p != q]
    assert 10 <= len(retried) <= 30
    for prompt, original in retried:
        assert prompt.startswith(original) and prompt.endswith(" Try again. A:")
        wrong = prompt[len(original) : prompt.index("\nNot ")]
        assert wrong.startswith("<think>") and wrong.endswith("</answer>")
        wrong_answer = wrong[wrong.index("<answer>") + 8 : -len("</answer>")]
        assert prompt.endswith(f"\nNot {wrong_answer}. Try again. A:")  # the env's own feedback to it
    # The shipped default's cache key does not change with the new field at its default of 0.
    assert TinyPolicyConfig().key() == json.loads((SHIPPED_DIR / "build.json").read_text())["key"]
    assert TinyPolicyConfig(train={"retry_share": 0.15}).key() != TinyPolicyConfig().key()


@pytest.mark.parametrize(
    ("name", "damage", "reason"),
    [
        ("truncated", lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:900]),
         "Error while deserializing header"),
        ("no-weights", lambda d: (d / "model.safetensors").unlink(), "has a config.json but no weight files"),
        ("bad-tokenizer", lambda d: (d / "tokenizer.json").write_text("{bad"), "Expecting property name"),
    ],
)  # fmt: skip
def test_a_damaged_tiny_folder_at_policy_path_is_one_clear_error(tmp_path, name, damage, reason):
    # Before: a 40-line traceback ending in safetensors' SafetensorError or transformers' OSError.
    import shutil

    from lrmgym.policies.checkpoint import ModelFolderError

    folder = tmp_path / name
    shutil.copytree(SHIPPED_DIR, folder)
    damage(folder)
    with pytest.raises(ModelFolderError, match=rf"^.*policy\.path='{re.escape(str(folder))}'.*{reason}") as info:
        TinyPolicyConfig(path=str(folder)).build()
    assert "\n" not in str(info.value)


def test_a_device_this_machine_lacks_is_refused_before_a_missing_model_is_built(monkeypatch, tmp_path):
    # Building the default model takes minutes; a policy.device the machine lacks must not wait for that.
    from types import SimpleNamespace

    from lrmgym.compose import build_policy
    from lrmgym.learners.algorithms import sft

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(sft, "build_tiny", lambda cfg: pytest.fail("built before the device was checked"))
    cfg = TinyPolicyConfig(**SMALL, seed=3, device="cuda")
    assert cfg.needs_build()
    with pytest.raises(ValueError, match=r"^policy.device='cuda': this torch \(.*\) is built without CUDA; "):
        build_policy(SimpleNamespace(policy=cfg))
