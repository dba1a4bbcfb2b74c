"""Native GRPO steps on one CUDA GPU: tokens per second and model FLOP utilisation against the card's bf16 peak.

Run on a GPU machine (one prepared call, no network needed; about 2-4 minutes on a recent card)::

    python benchmarks/gpu_step.py [--size 100m] [--steps 20] [--json benchmarks/results/gpu_step.json]

In one process:

1. The card's measured bf16 matmul peak: ``torch.matmul`` of square bf16 matrices (4096, 8192), the best of a few
   timed repeats (CUDA events) after a warm-up. MFU is reported against this measured figure, not the datasheet.
2. A Llama built from a config (``--size 100m``: hidden 768, 14 layers, 12 heads, MLP 2048, about 100 M
   parameters with the tiny character tokenizer; ``grpo_vs_trl.save_model``), saved once and loaded as
   ``policy=hf`` in bf16 on ``cuda``.
3. ``--steps`` native GRPO steps (``learner=grpo``, synchronous, no KL, no evaluation) on the dense benchmark
   reward of ``grpo_vs_trl.py`` (the fraction of ``a`` characters, so every group has signal and every step
   updates), ``--prompts`` x ``--group`` samples of up to ``--new-tokens`` tokens each.
4. The report, from the run's own ``metrics.jsonl`` (first step left out as warm-up): seconds per step and its
   parts, generated tokens/s, trained tokens/s, the step's FLOPs (``compute/flops_*``, matmuls only:
   :mod:`lrmgym.learners.engine.flops`), achieved TFLOP/s and MFU = achieved / measured peak, for the update and for
   the whole step.

``--real-shape`` measures instead, in the same process, one training pass and the sampler on a random-weight
model of Qwen2.5-1.5B's real shape (152k vocabulary, 28 layers, hidden 1536, 12 query and 2 key/value heads, MLP
8960, tied embeddings: :data:`QWEN25_15B`), bf16 on ``cuda``:

- a training pass (log-probs and entropies of one row, ``-mean(logp)``, backward) at ``--lengths`` tokens (1k and
  4k) through the lean forward (SDPA + chunked log-probs) and through ``model.forward`` (transformers' SDPA, whole
  logits): seconds, tokens/s, TFLOP/s and MFU (:func:`lrmgym.learners.engine.flops.chunk_flops`, backward twice the
  forward), and ``torch.cuda.max_memory_allocated`` above the model's own memory;
- the lean sampler (:func:`lrmgym.policies.sampling.sample_batch`) against ``model.generate``: ``--sample-rows``
  rows of a 64-token prompt, ``--sample-tokens`` new tokens each (no EOS: every row runs to the budget), tokens/s.

Self-contained: ``PYTHONPATH=. python benchmarks/gpu_step.py --real-shape --md benchmarks/results/gpu_real_shape.md``
needs torch (CUDA build), transformers and this repository (``lrmgym`` from ``PYTHONPATH``), nothing downloaded;
the wheels imported besides (carry them where the machine has none): numpy, pydantic (+ pydantic-core,
annotated-types, typing-inspection), gymnasium (+ farama-notifications), pyyaml, huggingface-hub, tokenizers,
safetensors, regex, tqdm, jinja2, dill.
About 1-2 minutes on an H100-class card. ``--shape '{"num_hidden_layers": 2, ...}'`` overrides the config's keys
(the CPU test runs a toy shape).

The parameters are bf16 (the optimizer steps float32 master copies, `learner.fp32_master`, the default).
On a machine without CUDA, ``--device cpu --size tiny --dtype float32`` runs the same code path at toy size (the
tests do); the "peak" is then the CPU's fp32 matmul rate.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_env, when run from anywhere

from grpo_vs_trl import SIZES, save_model  # noqa: E402  (the path above)

DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def matmul_peak(device: str, dtype: str, sizes: tuple[int, ...] = (4096, 8192), repeats: int = 5) -> float:
    """Best TFLOP/s of square ``torch.matmul`` in ``dtype`` on ``device`` (CUDA events on a GPU)."""
    import torch

    torch_dtype = getattr(torch, dtype)
    best = 0.0
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=torch_dtype)
        b = torch.randn(n, n, device=device, dtype=torch_dtype)
        iters = 20 if device == "cuda" else 2
        for _ in range(3):  # warm-up (clocks, cuBLAS heuristics)
            torch.matmul(a, b)
        for _ in range(repeats):
            if device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(iters):
                    torch.matmul(a, b)
                end.record()
                torch.cuda.synchronize()
                seconds = start.elapsed_time(end) / 1e3
            else:
                t0 = time.perf_counter()
                for _ in range(iters):
                    torch.matmul(a, b)
                seconds = time.perf_counter() - t0
            best = max(best, 2.0 * n**3 * iters / seconds / 1e12)
        del a, b
    return best


QWEN25_15B = {
    "vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
    "num_attention_heads": 12, "num_key_value_heads": 2, "max_position_embeddings": 32768, "rope_theta": 1e6,
    "tie_word_embeddings": True, "rms_norm_eps": 1e-6,
}  # fmt: skip
"""Qwen2.5-1.5B's config.json values that set its shape (random weights here)."""


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def real_shape(args: argparse.Namespace, peak_tflops: float) -> dict:
    """Training passes at ``args.lengths`` (lean and ``model.forward``) and the sampler against ``generate``."""
    import torch
    import transformers

    from lrmgym.learners.engine.flops import LlamaShape, chunk_flops
    from lrmgym.learners.engine.shared_prefix import forward_logprobs
    from lrmgym.policies.base import SamplingParams
    from lrmgym.policies.sampling import sample_batch

    dtype, device = getattr(torch, args.dtype), args.device
    keys = {**QWEN25_15B, **json.loads(args.shape)}
    config = transformers.Qwen2Config(**keys, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype).to(device).train()
    shape = LlamaShape.of_model(model)
    params = sum(p.numel() for p in model.parameters())
    on_gpu = device == "cuda"
    out: dict = {
        "params": params,
        "config": {**QWEN25_15B, **json.loads(args.shape)},
        "passes": [],
        "peak": peak_tflops,
    }

    def one_pass(tokens: int, lean: bool) -> tuple[float, float]:
        ids = torch.randint(1, config.vocab_size, (1, tokens), device=device)
        mask = torch.ones_like(ids)
        if on_gpu:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() if on_gpu else 0
        _sync(device)
        start = time.perf_counter()
        logp, _ = forward_logprobs(model, ids, mask, None, 0, entropy=True, lean=lean)
        (-logp.float().mean()).backward()
        _sync(device)
        seconds = time.perf_counter() - start
        model.zero_grad(set_to_none=True)
        extra = (torch.cuda.max_memory_allocated() - before) / 2**30 if on_gpu else float("nan")
        return seconds, extra

    for tokens in args.lengths:
        for lean in (True, False):
            one_pass(min(tokens, 256), lean)  # warm-up (kernels, cuBLAS heuristics)
            seconds, extra = min(one_pass(tokens, lean) for _ in range(2))
            flops = 3 * chunk_flops(shape, tokens)  # forward + backward (twice the forward)
            out["passes"].append({
                "tokens": tokens, "kind": "lean" if lean else "model.forward", "seconds": seconds,
                "tokens_per_s": tokens / seconds, "tflops_per_s": flops / seconds / 1e12,
                "mfu": flops / seconds / 1e12 / peak_tflops, "peak_gib": extra,
            })  # fmt: skip
            print(out["passes"][-1], flush=True)

    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    prompt = torch.randint(1, config.vocab_size, (64,)).tolist()
    rows, new = args.sample_rows, args.sample_tokens
    sampled = {}
    for kind in ("lean sampler", "model.generate"):
        for attempt in range(2):  # the first is warm-up
            _sync(device)
            start = time.perf_counter()
            with torch.no_grad():
                if kind == "lean sampler":
                    g = torch.Generator(device=device).manual_seed(attempt)
                    sample_batch(model, [prompt] * rows, SamplingParams(temperature=1.0, max_new_tokens=new),
                                 eos_ids=[], pad_id=0, generator=g)  # fmt: skip
                else:
                    ids = torch.tensor([prompt] * rows, device=device)
                    model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, top_k=0,
                                   max_new_tokens=new, min_new_tokens=new)  # fmt: skip
            _sync(device)
            sampled[kind] = rows * new / (time.perf_counter() - start)
    out["sampling"] = {"rows": rows, "new_tokens": new, **{k: v for k, v in sampled.items()}}
    print(out["sampling"], flush=True)
    return out


def real_shape_report(result: dict, meta: dict) -> str:
    """:func:`real_shape`'s figures as Markdown."""
    lines = [
        f"# Training pass and sampler at Qwen2.5-1.5B's shape on {meta['device_name']} "
        f"({result['params'] / 1e9:.2f} B parameters, random weights, {DTYPES[meta['dtype']]})",
        "",
        f"Reproduce: `{meta['command']}`. torch {meta['torch']}, {meta['date']}.",
        f"Config: `{json.dumps(result['config'])}`.",
        "",
        f"Measured {DTYPES[meta['dtype']]} matmul peak: **{result['peak']:.1f} TFLOP/s**. One row per pass: "
        "log-probs and entropies, `-mean(logp)`, backward; the best of 2 after a warm-up. Memory: "
        "`torch.cuda.max_memory_allocated` during the pass minus the memory allocated before it (weights).",
        "",
        "| tokens | pass | s | tokens/s | TFLOP/s | MFU | peak GiB above weights |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for p in result["passes"]:
        lines.append(
            f"| {p['tokens']} | {p['kind']} | {p['seconds']:.3f} | {p['tokens_per_s']:,.0f} | "
            f"{p['tflops_per_s']:.1f} | {100 * p['mfu']:.1f} % | {p['peak_gib']:.2f} |"
        )
    s = result["sampling"]
    lines += [
        "",
        f"Sampling {s['rows']} rows x {s['new_tokens']} new tokens after a 64-token prompt: lean sampler "
        f"{s['lean sampler']:,.0f} tokens/s, `model.generate` {s['model.generate']:,.0f} tokens/s "
        f"({s['lean sampler'] / s['model.generate']:.2f}x).",
    ]
    return "\n".join(lines) + "\n"


def train_steps(model_dir: Path, out_dir: Path, args: argparse.Namespace) -> list[dict]:
    """``args.steps`` native GRPO steps on the dense bench reward; the run's metrics lines."""
    import gymnasium

    import lrmgym
    from lrmgym.compose import train
    from lrmgym.configs.schema import EnvConfig, RunConfig, RunSection
    from lrmgym.eval.config import EvalConfig
    from lrmgym.learners.algorithms.grpo import GRPOConfig
    from lrmgym.policies.hf import HFPolicyConfig

    if "lrmgym/BenchFractionA-v0" not in gymnasium.registry:
        lrmgym.register("lrmgym/BenchFractionA-v0", "bench_env:FractionAEnv")
    learner = GRPOConfig(
        steps=args.steps, prompts_per_step=args.prompts, group_size=args.group, max_new_tokens=args.new_tokens,
        lr=1e-5, kl_coef=0.0, track_kl=False, eval_before_after=False, checkpoint_every=1_000_000, progress=False,
        async_rollouts=False, micro_batch_tokens=args.micro_batch_tokens,
    )  # fmt: skip
    policy = HFPolicyConfig(model=str(model_dir), device=args.device, dtype=args.dtype, batch_size=1024)
    config = RunConfig(
        env=EnvConfig(id="lrmgym/BenchFractionA-v0"), policy=policy, learner=learner, eval=EvalConfig(),
        run=RunSection(seed=0),
    )  # fmt: skip
    train(config, out_dir, resume=False)
    return [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]


def summarize(lines: list[dict], peak_tflops: float) -> dict:
    """Per-step means of the timed steps (the first is warm-up) and the rates they give."""
    timed = lines[1:] if len(lines) > 1 else lines

    def mean(key: str) -> float:
        return statistics.fmean(float(m.get(key) or 0.0) for m in timed)

    step_s, train_s, gen_s = mean("time/step_s"), mean("time/train_s"), mean("time/generate_s")
    update_flops = mean("compute/flops_forward") + mean("compute/flops_backward")
    step_flops = update_flops + mean("compute/flops_generate")
    generated = mean("compute/generated_tokens") if "compute/generated_tokens" in timed[0] else None
    trained = mean("compute/forward_tokens")
    out = {
        "steps_timed": len(timed),
        "step_s": step_s,
        "generate_s": gen_s,
        "train_s": train_s,
        "update_tflop": update_flops / 1e12,
        "step_tflop": step_flops / 1e12,
        "update_tflops_per_s": update_flops / max(train_s, 1e-9) / 1e12,
        "step_tflops_per_s": step_flops / max(step_s, 1e-9) / 1e12,
        "trained_tokens_per_s": trained / max(train_s, 1e-9),
        "peak_tflops": peak_tflops,
    }
    out["update_mfu"] = out["update_tflops_per_s"] / peak_tflops
    out["step_mfu"] = out["step_tflops_per_s"] / peak_tflops
    if generated is not None:
        out["generated_tokens_per_s"] = generated / max(gen_s, 1e-9)
    if "compute/executed_flops_forward" in timed[0]:  # what the update's kernels ran (prefix sharing runs less)
        executed = mean("compute/executed_flops_forward") + mean("compute/executed_flops_backward")
        out["update_executed_tflops_per_s"] = executed / max(train_s, 1e-9) / 1e12
        out["update_hfu"] = out["update_executed_tflops_per_s"] / peak_tflops
    return out


def report(result: dict, meta: dict) -> str:
    """The figures as Markdown."""
    r = result
    gen = r.get("generated_tokens_per_s")
    lines = [
        f"# Native GRPO on {meta['device_name']} ({meta['size']}, {meta['params'] / 1e6:.1f} M parameters, "
        f"{DTYPES[meta['dtype']]})",
        "",
        f"Reproduce: `{meta['command']}`. torch {meta['torch']}, {meta['date']}.",
        "",
        f"Measured {DTYPES[meta['dtype']]} matmul peak: **{r['peak_tflops']:.1f} TFLOP/s**. "
        f"{meta['prompts']} prompts x {meta['group']} samples x up to {meta['new_tokens']} new tokens per step; "
        f"{r['steps_timed']} steps timed (the first left out).",
        "",
        "| measure | value |",
        "|---|---:|",
        f"| step (s) | {r['step_s']:.3f} |",
        f"| generation (s) | {r['generate_s']:.3f} |",
        f"| update (s) | {r['train_s']:.3f} |",
        f"| generated tokens/s | {gen:,.0f} |" if gen is not None else "| generated tokens/s | (not logged) |",
        f"| trained tokens/s (forward+backward) | {r['trained_tokens_per_s']:,.0f} |",
        f"| update FLOPs per step (TFLOP) | {r['update_tflop']:.3f} |",
        f"| update TFLOP/s, MFU | {r['update_tflops_per_s']:.2f}, {100 * r['update_mfu']:.1f} % |",
        f"| whole step TFLOP/s, MFU (with generation) | {r['step_tflops_per_s']:.2f}, {100 * r['step_mfu']:.1f} % |",
    ]
    if "update_hfu" in r:
        lines.append(
            f"| update, executed FLOPs: TFLOP/s, share of the peak | {r['update_executed_tflops_per_s']:.2f}, "
            f"{100 * r['update_hfu']:.1f} % |"
        )
    lines += [
        "",
        "MFU counts model FLOPs (`compute/flops_*`: each row its own prompt, padding left out); the update's "
        "executed row counts what its kernels ran (`compute/executed_flops_*`: each group's prompt once, padding "
        "included).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    """Parse the options, measure, train, print (and write) the report; returns the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="100m", help="a model shape of grpo_vs_trl.SIZES")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--prompts", type=int, default=32, help="prompts per step")
    parser.add_argument("--group", type=int, default=8, help="samples per prompt")
    parser.add_argument("--new-tokens", type=int, default=128, help="most new tokens per sample")
    parser.add_argument("--micro-batch-tokens", type=int, default=16384, help="padded tokens per update pass")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--real-shape", action="store_true", help="passes and sampler at Qwen2.5-1.5B's shape")
    parser.add_argument("--shape", default="{}", help="JSON: config keys over QWEN25_15B (with --real-shape)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096], help="tokens per pass")
    parser.add_argument("--sample-rows", type=int, default=64, help="rows sampled at once (with --real-shape)")
    parser.add_argument("--sample-tokens", type=int, default=256, help="new tokens per row (with --real-shape)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures as JSON here")
    parser.add_argument("--md", type=Path, default=None, help="also write the report as Markdown here")
    args = parser.parse_args(argv)
    import torch

    if args.steps < 2:
        parser.error(f"--steps must be at least 2 (the first is warm-up), got {args.steps}.")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no CUDA device; on a CPU use --device cpu --size tiny.")
    peak = matmul_peak(args.device, args.dtype, sizes=(4096, 8192) if args.device == "cuda" else (256,))
    if args.real_shape:
        return _real_shape_main(args, argv, peak)
    with tempfile.TemporaryDirectory() as tmp:
        params = save_model(Path(tmp) / "model", args.size)
        lines = train_steps(Path(tmp) / "model", Path(tmp) / "run", args)
    result = summarize(lines, peak)
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else f"CPU ({os.cpu_count()} cores)"
    meta = {
        "device_name": name, "size": args.size, "params": params, "dtype": args.dtype, "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "prompts": args.prompts, "group": args.group,
        "new_tokens": args.new_tokens, "command": "python benchmarks/gpu_step.py " + " ".join(argv or sys.argv[1:]),
    }  # fmt: skip
    text = report(result, meta)
    print(text)
    if args.device == "cuda":
        print(subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip())
    if args.json:
        args.json.write_text(json.dumps({**meta, **result}, indent=1) + "\n")
    if args.md:
        args.md.write_text(text)
    return result


def _real_shape_main(args: argparse.Namespace, argv: list[str] | None, peak: float) -> dict:
    import torch

    result = real_shape(args, peak)
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else f"CPU ({os.cpu_count()} cores)"
    meta = {
        "device_name": name, "dtype": args.dtype, "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "PYTHONPATH=. python benchmarks/gpu_step.py " + shlex.join(argv or sys.argv[1:]),
    }  # fmt: skip
    text = real_shape_report(result, meta)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({**meta, **result}, indent=1) + "\n")
    if args.md:
        args.md.write_text(text)
    return result


if __name__ == "__main__":
    main()
