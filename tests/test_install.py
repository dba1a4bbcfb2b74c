"""Install hygiene: checked in CI (CI=true), where the install is the README's CPU one."""

import importlib.metadata
import os

import pytest

GPU_ONLY = ("nvidia-", "triton", "vllm", "deepspeed", "flash-attn", "flash_attn", "openrlhf")


@pytest.mark.skipif(os.environ.get("CI") != "true", reason="checks the CPU install made by .ci/run")
def test_cpu_install_has_no_cuda_torch_nor_gpu_only_packages():
    import torch

    gpu = sorted(
        d.metadata["Name"]
        for d in importlib.metadata.distributions()
        if d.metadata["Name"].lower().startswith(GPU_ONLY)
    )
    assert torch.version.cuda is None, f"a CUDA build of torch was installed: {torch.__version__}"
    assert gpu == [], f"GPU-only packages were installed: {gpu}"


def test_console_script_is_declared():
    eps = importlib.metadata.entry_points(group="console_scripts")
    assert any(ep.name == "lrmgym" and ep.value == "lrmgym.cli.main:main" for ep in eps)
