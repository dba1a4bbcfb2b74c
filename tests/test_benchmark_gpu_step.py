"""benchmarks/gpu_step.py runs its whole path on a CPU at toy size (a GPU machine runs it at 100 M parameters)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_step.py"
_SPEC = importlib.util.spec_from_file_location("benchmark_gpu_step", _PATH)
gpu_step = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(gpu_step)


def test_the_100m_config_is_about_100m_parameters(tmp_path):
    hidden, layers, heads, mlp = gpu_step.SIZES["100m"]
    per_layer = 4 * hidden * hidden + 3 * hidden * mlp + 2 * hidden  # q/k/v/o, gate/up/down, two norms
    assert 90e6 < layers * per_layer < 110e6


def test_summary_rates_by_hand():
    lines = [
        {"time/step_s": 9.0, "time/train_s": 9.0, "time/generate_s": 0.0},  # warm-up: left out
        *[
            {
                "time/step_s": 2.0,
                "time/train_s": 1.0,
                "time/generate_s": 0.5,
                "compute/flops_forward": 1e12,
                "compute/flops_backward": 2e12,
                "compute/flops_generate": 1e12,
                "compute/generated_tokens": 1000,
                "compute/forward_tokens": 4000,
            }  # fmt: skip
            for _ in range(2)
        ],
    ]
    out = gpu_step.summarize(lines, peak_tflops=10.0)
    assert out["steps_timed"] == 2
    assert out["update_tflops_per_s"] == pytest.approx(3.0)  # 3 TFLOP in 1 s
    assert out["update_mfu"] == pytest.approx(0.3)
    assert out["step_tflops_per_s"] == pytest.approx(2.0)  # 4 TFLOP in 2 s
    assert out["step_mfu"] == pytest.approx(0.2)
    assert out["generated_tokens_per_s"] == pytest.approx(2000.0)
    assert out["trained_tokens_per_s"] == pytest.approx(4000.0)


def test_runs_end_to_end_on_cpu_at_toy_size(tmp_path):
    out_json, out_md = tmp_path / "gpu_step.json", tmp_path / "gpu_step.md"
    argv = ["--device", "cpu", "--size", "tiny", "--dtype", "float32", "--steps", "2", "--prompts", "2",
            "--group", "4", "--new-tokens", "8", "--json", str(out_json), "--md", str(out_md)]  # fmt: skip
    result = gpu_step.main(argv)
    assert result["steps_timed"] == 1
    assert result["update_tflop"] > 0 and result["peak_tflops"] > 0  # the FLOPs were counted, the peak measured
    assert 0 < result["update_mfu"]
    saved = json.loads(out_json.read_text())
    assert saved["size"] == "tiny" and saved["params"] > 0
    assert "MFU" in out_md.read_text()


def test_cuda_without_a_gpu_is_a_clear_error(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(SystemExit) as err:
        gpu_step.main(["--steps", "2"])
    assert err.value.code == 2
    assert "torch sees no CUDA device" in capsys.readouterr().err


def test_the_real_shape_is_qwen25_15b_and_its_passes_run_on_cpu_at_toy_size(tmp_path):
    shape = gpu_step.QWEN25_15B
    assert (shape["vocab_size"], shape["hidden_size"], shape["num_hidden_layers"]) == (151936, 1536, 28)
    toy = {"vocab_size": 300, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
           "num_attention_heads": 2, "num_key_value_heads": 1}  # fmt: skip
    out_md = tmp_path / "real.md"
    argv = ["--real-shape", "--device", "cpu", "--dtype", "float32", "--shape", json.dumps(toy), "--lengths", "16",
            "520", "--sample-rows", "2", "--sample-tokens", "4", "--md", str(out_md)]  # fmt: skip
    result = gpu_step.main(argv)
    kinds = [(p["tokens"], p["kind"]) for p in result["passes"]]
    assert kinds == [(16, "lean"), (16, "model.forward"), (520, "lean"), (520, "model.forward")]  # 520: SDPA
    assert all(p["tokens_per_s"] > 0 and p["mfu"] > 0 for p in result["passes"])
    assert result["sampling"]["lean sampler"] > 0 and result["sampling"]["model.generate"] > 0
    text = out_md.read_text()
    assert "| 520 | lean |" in text and "model.generate" in text and "--shape" in text
