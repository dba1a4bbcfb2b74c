"""`lrmgym export hf` and `policy.path=RUN`: a trained run's model out as a transformers folder and back in.

Round trips on real runs (the tiny model trained a few GRPO steps; a tiny random Llama with LoRA under policy=hf):
the exported folder loads with transformers offline and gives the log-probs of the run's own policy, and
`lrmgym eval` of `policy.path=RUN` and of `policy=hf policy.model=DIR` sample the same greedy completions.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from lrmgym.cli.main import cli
from lrmgym.integrations.hf_export import EXPORT_RECORD, load_run_policy

SMALL = ("eval.tasks=3", "eval.n=1", "eval.max_new_tokens=40", "learner.prompts_per_step=4", "learner.group_size=4",
         "learner.async_rollouts=false", "learner.progress=false", "learner.eval_greedy=false")  # fmt: skip
PROMPTS = ["Q:Compute 10-3+67. A:", "Q:Compute 4*5. A:", "Q:Compute 81-9. A:"]


def invoke(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


OUTPUTS: dict[str, str] = {}
"""What each run of :func:`_run` printed, by run name."""


def _run(tmp: Path, name: str, *tokens: str) -> Path:
    result = invoke("run", "env=math", "learner=grpo", *SMALL, *tokens, f"run.output_dir={tmp}", f"run.name={name}")
    assert result.exit_code == 0, result.output
    OUTPUTS[name] = result.output
    return tmp / name


def _logprobs(model, tokenizer, texts: list[str]) -> torch.Tensor:
    """The log-probs each text's tokens get from ``model`` (fp32, teacher-forced), concatenated."""
    out = []
    with torch.inference_mode():
        for text in texts:
            ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
            logits = model(input_ids=ids).logits.float()
            out.append(torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0])
    return torch.cat(out)


def _texts(policy) -> list[str]:
    """The prompts followed by the policy's greedy continuations (what the round trip compares on)."""
    from lrmgym.policies.base import SamplingParams

    done = policy.generate(PROMPTS, 1, SamplingParams(temperature=0.0, max_new_tokens=24))
    return [p + group[0].text for p, group in zip(PROMPTS, done, strict=True)]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    return _run(tmp_path_factory.mktemp("runs"), "tiny", "policy=tiny", "learner.steps=3", "learner.lr=3e-3")


def _hf_folder(path: Path) -> Path:
    """A tiny random Llama with the tiny model's tokenizer, saved with save_pretrained (a policy=hf base model)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from lrmgym.policies.tiny import build_tokenizer

    tok = build_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, intermediate_size=96, max_position_embeddings=256,
                      tie_word_embeddings=True, pad_token_id=0, bos_token_id=None, eos_token_id=1)  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


def test_tiny_run_exports_a_transformers_folder_with_the_runs_weights(tiny_run, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "exported"
    result = invoke("export", "hf", tiny_run, f"out={out}")
    assert result.exit_code == 0, result.output
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", EXPORT_RECORD} <= {
        p.name for p in out.iterdir()
    }
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left
    record = json.loads((out / EXPORT_RECORD).read_text())
    assert (record["step"], record["form"]) == (3, "full")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]

    run_policy = load_run_policy(tiny_run)
    texts = _texts(run_policy)
    model = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    expected = _logprobs(run_policy.model, run_policy.tokenizer, texts)
    torch.testing.assert_close(_logprobs(model, tokenizer, texts), expected, atol=1e-5, rtol=1e-5)
    # ... and they are the trained weights, not the model the run started from (its step-0 checkpoint)
    start = load_run_policy(tiny_run, step=0)
    assert (_logprobs(start.model, start.tokenizer, texts) - expected).abs().max() > 1e-3


def test_eval_of_the_run_and_of_its_export_sample_the_same_greedy_completions(tiny_run, tmp_path):
    out = tmp_path / "exported"
    assert invoke("export", "hf", tiny_run, f"out={out}").exit_code == 0
    completions = {}
    for name, tokens in (("run", [f"policy.path={tiny_run}"]),
                         ("export", ["policy=hf", f"policy.model={out}", "policy.device=cpu"])):  # fmt: skip
        result = invoke("eval", "env=math", "eval.tasks=4", "eval.n=1", "eval.temperature=0", "eval.max_new_tokens=40",
                        *tokens, f"run.output_dir={tmp_path}", f"run.name=eval-{name}")  # fmt: skip
        assert result.exit_code == 0, result.output
        lines = (tmp_path / f"eval-{name}" / "samples.jsonl").read_text().splitlines()
        completions[name] = [json.loads(line)["completion"] for line in lines]
    assert len(completions["run"]) == 4
    assert completions["run"] == completions["export"]


def test_lora_run_round_trips_merged_and_as_an_adapter(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = _hf_folder(tmp_path / "base")
    run = _run(tmp_path, "lora", "policy=hf", f"policy.model={base}", "policy.device=cpu", "policy.lora.r=4",
               "learner.steps=1", "learner.eval_before_after=false")  # fmt: skip
    # A random model earns no reward, so its LoRA update is zero; give the checkpoint's adapter real weights, so
    # the round trip can tell a merged adapter from the base model.
    ckpt = sorted((run / "checkpoints").glob("step_*.pt"))[-1]
    state = torch.load(ckpt, weights_only=False)
    torch.manual_seed(1)
    lora_b = [k for k in state["model"] if "lora_B" in k]
    assert lora_b
    for key in lora_b:
        state["model"][key] = torch.randn_like(state["model"][key]) * 0.2
    torch.save(state, ckpt)

    run_policy = load_run_policy(run)
    texts = [p + " <think>1+1=2</think><answer>2</answer>" for p in PROMPTS]
    expected = _logprobs(run_policy.model, run_policy.tokenizer, texts)
    plain = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).eval()
    assert (_logprobs(plain, run_policy.tokenizer, texts) - expected).abs().max() > 1e-3

    merged, adapter = tmp_path / "merged", tmp_path / "adapter"
    assert invoke("export", "hf", run, f"out={merged}").exit_code == 0
    assert invoke("export", "hf", run, f"out={adapter}", "--adapter").exit_code == 0
    assert json.loads((merged / EXPORT_RECORD).read_text())["form"] == "merged"
    assert not (merged / "adapter_config.json").exists()
    model = AutoModelForCausalLM.from_pretrained(str(merged), local_files_only=True, dtype=torch.float32).eval()
    torch.testing.assert_close(_logprobs(model, run_policy.tokenizer, texts), expected, atol=1e-5, rtol=1e-5)

    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(base.resolve())
    assert not (adapter / "model.safetensors").exists()
    fresh = AutoModelForCausalLM.from_pretrained(config["base_model_name_or_path"], dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(fresh, str(adapter)).eval()
    torch.testing.assert_close(_logprobs(peft_model, run_policy.tokenizer, texts), expected, atol=1e-5, rtol=1e-5)

    # the adapter folder is what policy=hf policy.adapter=DIR loads
    from lrmgym.policies.hf import HFPolicyConfig

    loaded = HFPolicyConfig(model=str(base), adapter=str(adapter), device="cpu").build()
    torch.testing.assert_close(_logprobs(loaded.model, loaded.tokenizer, texts), expected, atol=1e-5, rtol=1e-5)


def _error_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, result.output
    return lines[0]


def test_refusals_are_one_line_and_write_nothing(tiny_run, tmp_path):
    out = tmp_path / "out"
    line = _error_line(invoke("export", "hf", tmp_path, f"out={out}"))
    assert "is not a run directory" in line
    no_ckpt = tmp_path / "fresh"
    (no_ckpt / "checkpoints").mkdir(parents=True)
    (no_ckpt / "config.yaml").write_text("policy: {kind: tiny}\n")
    assert "has no checkpoint" in _error_line(invoke("export", "hf", no_ckpt, f"out={out}"))
    assert "has no checkpoint of that step" in _error_line(invoke("export", "hf", tiny_run, f"out={out}", "--step", 2))
    assert "no LoRA" in _error_line(invoke("export", "hf", tiny_run, f"out={out}", "--adapter"))
    assert "out=DIR" in _error_line(invoke("export", "hf", tiny_run))
    assert not out.exists()
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert "already exists; pass --force" in _error_line(invoke("export", "hf", tiny_run, f"out={out}"))
    assert (out / "keep.txt").read_text() == "mine"
    assert invoke("export", "hf", tiny_run, f"out={out}", "--force").exit_code == 0
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").is_file()
    line = _error_line(invoke("eval", "env=math", "policy=hf", f"policy.model={tiny_run}"))
    assert f"policy.path={tiny_run}" in line and "lrmgym export hf" in line


def test_the_run_summary_says_how_to_evaluate_and_export_the_model_and_its_commands_work(
    tiny_run, tmp_path, monkeypatch
):
    import shlex

    commands = json.loads((tiny_run / "summary.json").read_text())["model_commands"]
    assert commands["eval"] == (f"lrmgym eval env=math eval.n=1 eval.tasks=3 eval.max_new_tokens=40 "
                                f"policy.path={tiny_run}")  # fmt: skip
    printed = OUTPUTS["tiny"]
    assert f"evaluate the trained model: {commands['eval']}" in printed
    assert f"export it (transformers folder): {commands['export']}" in printed
    monkeypatch.chdir(tmp_path)  # the export goes to exports/ and the evaluations to runs/ here
    for key in ("export", "eval", "eval_export"):
        argv = shlex.split(commands[key])
        assert argv[0] == "lrmgym"
        result = invoke(*argv[1:])
        assert result.exit_code == 0, (key, result.output)
    assert (tmp_path / "exports" / f"{tiny_run.name}-hf" / "model.safetensors").is_file()
    evals = sorted((tmp_path / "runs").glob("eval-*/eval.json"))
    assert len(evals) == 2
    first, second = (json.loads(p.read_text()) for p in evals)
    assert first["avg@n"] == second["avg@n"]
