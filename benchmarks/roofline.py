"""The default GRPO step against this machine's fp32 matmul peak: how far from its FLOP floor is it?

Run: ``python benchmarks/roofline.py [--steps 40] [--skip 5] [--repeats 7] [--compile] [--out FILE]``.

In one run, on one machine:

1. The fp32 matmul peak: ``torch.matmul`` on square matrices (256, 512, 1024) and on the default run's own
   shapes (the update's micro-batches of ``micro_batch_tokens`` rows and the sampler's decode steps of
   ``prompts_per_step x group_size`` rows, times each weight of the tiny Llama: q/k/v/o, gate/up, down,
   lm_head), with 1 and with 2 threads; each is the best of ``--repeats`` timed repeats after a warm-up. The peak
   of a thread count is the best rate over all those shapes.
2. A short default training, ``lrmgym run env=math learner=grpo`` (the README's command) with a fixed number of
   steps, no time budget and no evaluation, in a fresh process as a user runs it. Its ``metrics.jsonl`` carries
   the FLOPs of each step (``compute/flops_*``, :mod:`lrmgym.learners.engine.flops`) and the seconds of its parts.
3. The update alone: the batches of a short synchronous run of the same configuration, replayed through a fresh
   updater (:func:`replayed_update`) with the other core idle, so the in-run figure's share lost to the rollout
   worker beside it shows; and the same batches with ``learner.update_threads=2`` (both cores, as a synchronous
   run can use them), against the 2-thread peak.
4. With ``--compile``, the run and the replay set ``learner.compile=true`` (the lean forward through
   ``torch.compile``), and the report gives the first step's time, which pays the compilation; the default
   output is then ``results/roofline_compile.md``.
5. The report: the update's achieved GFLOP/s and its share of the single-thread peak (the default update runs
   on one thread, the rollout worker on the other core), and the whole step's time against its FLOP floor on two
   cores (step FLOPs / 2-thread peak). The issue's targets: update >= 75 % of the single-thread peak, whole step
   <= 2x its floor. ``uptime`` is printed before and after, since the machine may be shared.

Two FLOP counts, matmuls only. **Counted** is what :mod:`lrmgym.learners.engine.flops` logs (``compute/flops_*``): the
work of a plain trainer and sampler, a shared prompt once per row and padding left out. **Executed** is what the
kernels computed: the update logs it (``compute/executed_flops_*``, exact for the lean forward, checked against
``torch.utils.flop_counter`` in the tests); for generation, ``FlopCounterMode`` counts one sampled step of the
default configuration (:func:`generation_executed_share`) and its share of the counted is applied to the run.
Prefix sharing runs each group's prompt once in the update and in the sampler, so the executed count is the
smaller (padding, which it includes, adds a little back). A rate over counted FLOPs credits the work prefix
sharing skipped, so the targets are judged on executed FLOPs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from lrmgym.learners.engine.flops import LlamaShape, generate_flops
from lrmgym.learners.engine.rollout import prompt_length


def uptime() -> str:
    """The output of ``uptime`` (load averages), or a note where it is missing."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as err:
        return f"(uptime unavailable: {err})"


def matmul_gflops(m: int, k: int, n: int, threads: int, repeats: int) -> float:
    """Best GFLOP/s of ``[m, k] @ [k, n]`` in fp32 over ``repeats`` timed repeats (each >= ~50 ms) after a warm-up."""
    torch.set_num_threads(threads)
    a, b = torch.randn(m, k), torch.randn(k, n)
    out = torch.empty(m, n)
    flops = 2.0 * m * k * n
    start = time.perf_counter()
    torch.matmul(a, b, out=out)
    once = max(time.perf_counter() - start, 1e-6)
    iters = max(1, int(0.05 / once))
    for _ in range(iters):  # warm-up
        torch.matmul(a, b, out=out)
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            torch.matmul(a, b, out=out)
        best = max(best, flops * iters / (time.perf_counter() - start) / 1e9)
    return best


def run_shapes(shape: LlamaShape, update_rows: int, decode_rows: int) -> dict[str, tuple[int, int, int]]:
    """The distinct (m, k, n) of the default run's weight matmuls: the update's micro-batches, the decode steps."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    weights = {"q/o": (h, q), "k/v": (h, kv), "gate/up": (h, shape.intermediate), "down": (shape.intermediate, h)}
    weights["lm_head"] = (h, shape.vocab)
    names: dict[tuple[int, int, int], list[str]] = {}  # weights of one shape (q/o and k/v without GQA) merged
    for where, m in (("update", update_rows), ("decode", decode_rows)):
        for name, (k, n) in weights.items():
            names.setdefault((m, k, n), [where]).append(name)
    return {f"{w[0]} {', '.join(w[1:])} [{m}x{k}]@[{k}x{n}]": (m, k, n) for (m, k, n), w in names.items()}


def default_run(steps: int, runs: Path, extra: list[str]) -> tuple[list[dict], float]:
    """The README's ``learner=grpo`` for ``steps`` steps (no time budget, no evaluation); its metrics and wall time."""
    argv = [
        sys.executable, "-m", "lrmgym.cli.main", "run", "env=math", "learner=grpo", "learner.time_budget_s=null",
        f"learner.steps={steps}", "learner.eval_before_after=false", "learner.progress=false",
        f"run.output_dir={runs}", "run.name=roofline", *extra,
    ]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"the GRPO run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    lines = (runs / "roofline" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines], wall


def replayed_update(steps: int, skip: int, repeats: int, extra: list[str]) -> dict[str, float]:
    """The default run's update alone: its own batches, captured from a short synchronous run, replayed.

    The in-run figure has the rollout worker busy on the other core (cache and memory traffic beside the update);
    this one is the update's kernel on its own: the same ``learner=grpo`` configuration, the batches of steps
    ``skip .. steps-1`` of a synchronous run, each replayed ``repeats`` times through a fresh
    :class:`~lrmgym.learners.engine.update.PolicyUpdater` as the async default runs it (pi_old from the sampler); the
    best time of each batch counts. Each batch is also replayed with ``learner.update_threads=2`` (two passes at
    once, one per core: what a synchronous run on this machine can use), alternating with the one-thread replay.
    Returns seconds (``seconds``, ``seconds_2threads``) and FLOPs per update.
    """
    from lrmgym.compose import train
    from lrmgym.configs.resolve import resolve
    from lrmgym.learners.engine import update as update_mod

    captured: list[tuple] = []
    real = update_mod.PolicyUpdater.update

    def spy(self, seqs, advantages, measure_kl, behavior, **kwargs):  # noqa: ANN001, ANN202
        captured.append((list(seqs), list(advantages), kwargs))
        return real(self, seqs, advantages, measure_kl, behavior, **kwargs)

    tokens = [
        "env=math", "learner=grpo", "learner.async_rollouts=false", "learner.time_budget_s=null",
        f"learner.steps={steps}", "learner.eval_before_after=false", "learner.progress=false", *extra,
    ]  # fmt: skip
    update_mod.PolicyUpdater.update = spy
    try:
        with tempfile.TemporaryDirectory() as tmp:
            train(resolve(tokens), Path(tmp) / "run", resume=False)
    finally:
        update_mod.PolicyUpdater.update = real
    cfg = resolve(tokens)
    torch.set_num_threads(1)
    updater = update_mod.PolicyUpdater(cfg.learner, cfg.policy.build(), lambda: 0.0, cfg.learner.max_new_tokens)
    batches = captured[skip:]
    configs = {k: cfg.learner.model_copy(update={"update_threads": k}) for k in (1, 2)}
    best = {k: [math.inf] * len(batches) for k in configs}
    flops = [0.0] * len(batches)
    executed = [0.0] * len(batches)
    for k in configs:  # warm-up, untimed (the second also starts the update thread)
        seqs, advantages, kwargs = batches[0]
        updater.cfg = configs[k]
        updater.update(seqs, advantages, False, "sampler", **{**kwargs, "sampler_known": True})
    for r in range(repeats):
        for i, (seqs, advantages, kwargs) in enumerate(batches):
            for k in (1, 2) if (r + i) % 2 == 0 else (2, 1):
                updater.cfg = configs[k]
                start = time.perf_counter()
                stats = updater.update(seqs, advantages, False, "sampler", **{**kwargs, "sampler_known": True})
                best[k][i] = min(best[k][i], time.perf_counter() - start)
            flops[i] = float(stats["compute/flops_forward"] + stats["compute/flops_backward"])
            executed[i] = float(stats["compute/executed_flops_forward"] + stats["compute/executed_flops_backward"])
    updater.close()
    prompts = dict.fromkeys(tuple(s.ids[: prompt_length(s.policy_mask)]) for b in batches for s in b[0])
    return {
        "seconds": float(np.mean(best[1])), "seconds_2threads": float(np.mean(best[2])),
        "flops": float(np.mean(flops)), "executed_flops": float(np.mean(executed)), "batches": len(batches),
        "prompts": [list(p) for p in prompts],
    }  # fmt: skip


def generation_executed_share(prompts: list[list[int]], shape: LlamaShape) -> float:
    """Matmul FLOPs the sampler executes over those :mod:`lrmgym.learners.engine.flops` counts, for one default step.

    Samples ``group_size`` completions for each of ``prompts_per_step`` of the replayed prompts with the default
    policy and sampling settings, once under ``torch.utils.flop_counter.FlopCounterMode`` (which counts the
    products the kernels run: each distinct prompt prefilled once, the decode attention over the whole key
    buffer), and divides by :func:`~lrmgym.learners.engine.flops.generate_flops` of the same completions (each
    completion paying its own prefill, as the metrics count it).
    """
    from lrmgym.configs.resolve import resolve
    from lrmgym.policies.base import SamplingParams

    cfg = resolve(["env=math", "learner=grpo"])
    learner = cfg.learner
    policy = cfg.policy.build()
    torch.set_num_threads(1)
    chosen = prompts[: learner.prompts_per_step]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=learner.max_new_tokens)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        groups = policy.generate_from_ids(chosen, n=learner.group_size, sampling=sampling)
    counted = sum(
        generate_flops(shape, len(prompt), len(c.token_ids or []))
        for prompt, group in zip(chosen, groups, strict=True)
        for c in group
    )
    return float(counter.get_total_flops()) / max(counted, 1)


def default_shape_and_rows() -> tuple[LlamaShape, int, int]:
    """The default model's shape, the update's micro-batch rows and the decode rows of ``learner=grpo``."""
    from lrmgym.configs.resolve import resolve

    cfg = resolve(["env=math", "learner=grpo"])
    policy = cfg.policy.build()
    shape = LlamaShape.of_model(policy.model)
    if shape is None:
        raise RuntimeError("The default policy's model is not one lrmgym.learners.engine.flops counts.")
    learner = cfg.learner
    return shape, int(learner.micro_batch_tokens or 1024), learner.prompts_per_step * learner.group_size


def report(args: argparse.Namespace) -> str:
    """Measure, train, and return the report in Markdown."""
    before = uptime()
    shape, update_rows, decode_rows = default_shape_and_rows()
    shapes = {f"square {n}": (n, n, n) for n in (256, 512, 1024)}
    shapes.update(run_shapes(shape, update_rows, decode_rows))
    rates = {t: {name: matmul_gflops(*mkn, t, args.repeats) for name, mkn in shapes.items()} for t in (1, 2)}
    peak = {t: max(r.values()) for t, r in rates.items()}
    torch.set_num_threads(1)

    extra = ["learner.compile=true"] if args.compile else []
    with tempfile.TemporaryDirectory() as tmp:
        lines, wall = default_run(args.steps, Path(tmp), extra)
    after_run = uptime()
    alone = replayed_update(args.replay_steps, args.skip, args.repeats, extra)
    alone_rate = alone["flops"] / alone["seconds"] / 1e9
    # Executed FLOPs: what the kernels computed. compute/flops_* count a plain trainer's work (a shared prompt
    # once per row, padding left out), which prefix sharing does not all do; the targets are judged on what was
    # executed. The update logs its executed FLOPs; generation's share is measured on one sampled step.
    generate_share = generation_executed_share(alone["prompts"], shape)
    exec_rate = alone["executed_flops"] / alone["seconds"] / 1e9
    exec_rate2 = alone["executed_flops"] / alone["seconds_2threads"] / 1e9
    after_replay = uptime()
    kept = lines[args.skip :]  # the first steps warm up (allocator, the worker's start)
    total = {k: float(sum(m[k] for m in kept)) for k in ("compute/flops_forward", "compute/flops_backward")}
    generate = float(sum(m["compute/flops_generate"] for m in kept))
    train_s = float(sum(m["time/train_s"] for m in kept))
    step_s = float(sum(m["time/step_s"] for m in kept))
    update_flops = total["compute/flops_forward"] + total["compute/flops_backward"]
    update_executed = float(
        sum(m["compute/executed_flops_forward"] + m["compute/executed_flops_backward"] for m in kept)
    )
    update_share = update_executed / update_flops
    update_rate = update_flops / train_s / 1e9
    step_flops = update_flops + generate
    floor_s = step_flops / (peak[2] * 1e9)
    exec_step_flops = update_executed + generate * generate_share
    exec_floor_s = exec_step_flops / (peak[2] * 1e9)
    n = len(kept)
    per_step = {
        "update": train_s / n, "step": step_s / n,
        "generate": float(np.mean([m["time/generate_s"] for m in kept])),
        "wait": float(np.mean([m.get("time/wait_s", 0.0) for m in kept])),
    }  # fmt: skip

    title = "`lrmgym run env=math learner=grpo" + (" learner.compile=true`" if args.compile else "`")
    out = [
        f"# Roofline of the default GRPO step ({title})",
        "",
        f"Reproduce: `python benchmarks/roofline.py --steps {args.steps} --skip {args.skip} --repeats {args.repeats}"
        + (" --compile`." if args.compile else "`.")
        + f" Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, torch {torch.__version__}, "
        f"{os.cpu_count()} CPUs.",
        "",
        f"- `uptime` before: `{before}`",
        f"- `uptime` after the run: `{after_run}`",
        f"- `uptime` after the replay: `{after_replay}`",
        "",
        f"Model: hidden {shape.hidden}, {shape.layers} layers, {shape.heads} heads ({shape.kv_heads} KV), MLP "
        f"{shape.intermediate}, vocab {shape.vocab}.",
        "",
        "Two FLOP counts, matmuls only: **executed**, what the kernels computed (each group's prompt once, padding "
        "included: the update's `compute/executed_flops_*`, and generation's share measured with "
        "`torch.utils.flop_counter` on one sampled step of the default configuration), and **counted**, what "
        "`lrmgym/learners/engine/flops.py` logs as `compute/flops_*` (the work of a plain trainer and sampler: "
        "a shared "
        "prompt once per row, padding left out). Prefix sharing makes the executed count the smaller; rates "
        "against the peak are judged on it.",
        "",
        f"## fp32 matmul rate (GFLOP/s, best of {args.repeats} after warm-up)",
        "",
        "| shape | 1 thread | 2 threads |",
        "|---|---:|---:|",
        *[f"| {name} | {rates[1][name]:.1f} | {rates[2][name]:.1f} |" for name in shapes],
        f"| **peak (best of the above)** | **{peak[1]:.1f}** | **{peak[2]:.1f}** |",
        "",
        f"## The run: {len(lines)} steps, the first {args.skip} left out ({n} kept), wall {wall:.0f} s",
        "",
        f"Per step (mean): update {per_step['update']:.3f} s, step {per_step['step']:.3f} s, generation "
        f"{per_step['generate']:.3f} s (async worker), waiting for the worker {per_step['wait']:.3f} s."
        + (f" The first step, which compiles, took {lines[0]['time/step_s']:.0f} s." if args.compile else ""),
        f"Counted FLOPs per step: update {update_flops / n / 1e9:.2f} GFLOP (forward "
        f"{total['compute/flops_forward'] / n / 1e9:.2f}, backward {total['compute/flops_backward'] / n / 1e9:.2f}),"
        f" generation {generate / n / 1e9:.2f} GFLOP. Executed: {100 * update_share:.1f} % of the counted in the "
        f"update (its `compute/executed_flops_*`), {100 * generate_share:.1f} % in generation (one sampled "
        f"step); so about {update_executed / n / 1e9:.2f} and {generate * generate_share / n / 1e9:.2f} "
        "GFLOP per step.",
        "",
        "| measure | executed FLOPs | counted FLOPs | target |",
        "|---|---:|---:|---:|",
        f"| update in the run: GFLOP/s | {update_rate * update_share:.1f} | {update_rate:.1f} | |",
        f"| update in the run (worker busy on the other core): share of the 1-thread peak ({peak[1]:.1f}) | "
        f"{100 * update_rate * update_share / peak[1]:.1f} % | {100 * update_rate / peak[1]:.1f} % | >= 75 % |",
        f"| update alone ({alone['batches']} of the run's batches replayed, best of {args.repeats}; "
        f"{alone['seconds'] * 1e3:.0f} ms): GFLOP/s | {exec_rate:.1f} | {alone_rate:.1f} | |",
        f"| update alone: share of the 1-thread peak | {100 * exec_rate / peak[1]:.1f} % | "
        f"{100 * alone_rate / peak[1]:.1f} % | >= 75 % |",
        f"| update alone on both cores (`learner.update_threads=2`, for synchronous runs; "
        f"{alone['seconds_2threads'] * 1e3:.0f} ms, {alone['seconds'] / alone['seconds_2threads']:.2f}x one thread): "
        f"share of the 2-thread peak ({peak[2]:.1f}) | {100 * exec_rate2 / peak[2]:.1f} % | "
        f"{100 * alone['flops'] / alone['seconds_2threads'] / 1e9 / peak[2]:.1f} % | |",
        f"| step: FLOP floor on 2 cores (step FLOPs / {peak[2]:.1f} GFLOP/s) | {exec_floor_s / n * 1e3:.1f} ms | "
        f"{floor_s / n * 1e3:.1f} ms | |",
        f"| step: time / floor | {step_s / exec_floor_s:.1f}x | {step_s / floor_s:.1f}x | <= 2x |",
        f"| step: GFLOP/s (FLOPs / step time) | {exec_step_flops / step_s / 1e9:.1f} | {step_flops / step_s / 1e9:.1f} "
        "| |",
    ]
    return "\n".join(out) + "\n"


def main() -> None:
    """Parse the options, run, print and write the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="GRPO steps of the run")
    parser.add_argument("--skip", type=int, default=5, help="first steps left out of the figures (warm-up)")
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats per matmul shape (best kept)")
    parser.add_argument("--replay-steps", type=int, default=12, help="steps of the synchronous run replayed")
    parser.add_argument("--compile", action="store_true", help="the run and the replay with learner.compile=true")
    parser.add_argument("--out", type=Path, default=None, help="default: results/roofline.md (roofline_compile.md)")
    args = parser.parse_args()
    if args.out is None:
        args.out = Path(__file__).parent / "results" / ("roofline_compile.md" if args.compile else "roofline.md")
    if args.skip >= min(args.steps, args.replay_steps):
        parser.error(
            f"--skip ({args.skip}) must be below --steps ({args.steps}) and --replay-steps ({args.replay_steps})."
        )
    text = report(args)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
