"""Peak memory of one training pass at real-model lengths: the lean forward against ``model.forward`` with SDPA.

Run: ``python benchmarks/memory_real.py [--tokens 1024 4096] [--out benchmarks/results/memory_real.md]``
(``--thresholds``, ``--sft``: the A/Bs described below, appended to ``--out``).

One pass is what the GRPO update does per micro-batch: log-probs of one right-padded row (and, as in an update's
first epoch, the entropies), a loss on them, the backward. Each configuration runs in a fresh subprocess (CPU,
float32, one thread) on the same random-weight model, a Qwen2 of small depth but real width where memory goes:
hidden 512, 8 query and 2 key/value heads of 64, MLP 1 408, 2 layers, a 32 768-token vocabulary. The reading
is the process's peak resident set (``getrusage``'s ``ru_maxrss``) minus its resident set just before the pass
(model built, one warm-up pass at 16 tokens done), so the model's own weights do not count. Configurations:

- ``model.forward (sdpa)``: transformers' forward with ``attn_implementation="sdpa"``, whole logits, then
  ``token_logprobs``/``token_entropy`` (what a trainer on ``model.forward`` does): the reference.
- ``lean, products``: the lean forward as it was before SDPA and chunks (attention as two batched products and a
  softmax per row, whole logits), by raising :data:`~lrmgym.policies.fasttrain.SDPA_MIN_KEYS` and
  :data:`~lrmgym.policies.fasttrain.LOGIT_CHUNK` past the pass.
- ``lean``: the lean forward as it runs now (SDPA from 512 positions on, log-probs in chunks).

The goal the project set (issue 37): the lean pass at most 1.2x the SDPA ``model.forward``'s peak.

``--thresholds`` measures the other side of the size switches, on the tiny default model (what ``lrmgym run``
trains): one default-sized update pass (12 rows x 85 tokens, forward and backward of the log-probs), in one
process, one thread, the variants interleaved, thread CPU time, best and median of ``--repeats``: as it runs by
default (products and whole logits: below both thresholds), with SDPA forced (``SDPA_MIN_KEYS=1``), and with the
chunked log-probs forced (``LOGIT_CHUNK`` of 8 tokens).

``--sft`` measures SFT's step (:class:`~lrmgym.learners.algorithms.sft.MaskedCE`: masked cross-entropy, backward,
AdamW) on the same model, one ``--sft-tokens`` row (a 64-token prompt, the rest labelled), peak resident set above
the one before the step as above, fresh process each: ``whole logits`` (the cross-entropy over ``[B, T, V]``
logits, as SFT computed it before: forced by raising ``LOGIT_CHUNK`` past the pass) against ``chunked`` (as it runs
now: log-probs with the head in chunks). It appends its table to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

CONFIG = {
    "vocab_size": 32768, "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 2,
    "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 8192,
}  # fmt: skip
KINDS = ("model.forward (sdpa)", "lean, products", "lean")


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def one_pass(kind: str, tokens: int) -> dict:
    """In this process: build the model, warm up, run one pass; the peak above the resident set before it."""
    import torch
    import transformers

    from lrmgym.learners.engine.shared_prefix import forward_logprobs
    from lrmgym.policies import fasttrain

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = transformers.Qwen2Config(**CONFIG, attn_implementation="sdpa")
    model = transformers.AutoModelForCausalLM.from_config(config).train()
    if kind == "lean, products":
        fasttrain.SDPA_MIN_KEYS, fasttrain.LOGIT_CHUNK = 10**12, 10**18
    lean = kind != "model.forward (sdpa)"

    def run(t: int) -> float:
        ids = torch.randint(1, CONFIG["vocab_size"], (1, t))
        mask = torch.ones_like(ids)
        logp, ent = forward_logprobs(model, ids, mask, None, 0, entropy=True, lean=lean)
        loss = -logp.mean()
        loss.backward()
        model.zero_grad(set_to_none=True)
        return float(loss) + float(ent.mean())

    run(16)  # warm-up: kernels, allocator
    before = _rss_mb()
    start = time.perf_counter()
    check = run(tokens)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"kind": kind, "tokens": tokens, "peak_mb": peak - before, "seconds": seconds, "check": check}


SFT_KINDS = ("whole logits", "chunked")


def one_sft_step(kind: str, tokens: int) -> dict:
    """In this process: one MaskedCE step on a ``tokens``-long row; the peak above the resident set before it."""
    import torch
    import transformers

    from lrmgym.learners.algorithms.sft import MaskedCE, collate_masked_ce
    from lrmgym.policies import fasttrain

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = transformers.Qwen2Config(**CONFIG, attn_implementation="sdpa")
    model = transformers.AutoModelForCausalLM.from_config(config)
    if kind == "whole logits":
        fasttrain.LOGIT_CHUNK = 10**18
    trainer = MaskedCE(model, lr=1e-5, lr_factor=lambda s: 1.0)

    def run(t: int) -> float:
        ids = torch.randint(2, CONFIG["vocab_size"], (t,)).tolist()
        return trainer.step(*collate_masked_ce([(ids[:64], ids[64:])], pad_id=0, eos_id=1))["loss"]

    run(80)  # warm-up: kernels, allocator, AdamW's state
    before = _rss_mb()
    start = time.perf_counter()
    loss = run(tokens)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"kind": kind, "tokens": tokens, "peak_mb": peak - before, "seconds": seconds, "loss": loss}


def sft_table(tokens: list[int], env: dict) -> str:
    """The ``--sft`` A/B (module docstring), each step in a fresh subprocess, as Markdown lines."""
    rows = []
    for t in tokens:
        for kind in SFT_KINDS:
            command = [sys.executable, __file__, "--one-sft", kind, str(t)]
            out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
            print(rows[-1], flush=True)
    lines = [
        "",
        f"## SFT's step: whole logits against chunked log-probs (`--sft --sft-tokens {' '.join(map(str, tokens))}`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; the model above (vocabulary 32 768), one "
        "row (64 prompt tokens, the rest labelled), `MaskedCE.step` (masked cross-entropy, backward, AdamW), peak "
        "resident set above the one before the step (after a warm-up step, so AdamW's state exists already).",
        "",
        "| tokens | SFT loss computed from | peak MB | loss | seconds |",
        "|---:|---|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['tokens']} | {row['kind']} | {row['peak_mb']:.0f} | {row['loss']:.6f} | {row['seconds']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def thresholds(repeats: int) -> str:
    """The A/B of ``--thresholds`` (module docstring), as Markdown lines."""
    import statistics
    from importlib import resources

    import torch
    import transformers

    from lrmgym.learners.engine.shared_prefix import forward_logprobs
    from lrmgym.policies import fasttrain

    torch.set_num_threads(1)
    folder = resources.files("lrmgym.policies") / "tiny_default"
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder)).train()
    torch.manual_seed(0)
    ids = torch.randint(2, model.config.vocab_size, (12, 85))
    mask = torch.ones_like(ids)
    variants = {
        "default (products, whole logits)": {},
        "SDPA forced": {"SDPA_MIN_KEYS": 1},
        "chunked log-probs forced": {"LOGIT_CHUNK": 8 * model.config.vocab_size},
    }
    defaults = {"SDPA_MIN_KEYS": fasttrain.SDPA_MIN_KEYS, "LOGIT_CHUNK": fasttrain.LOGIT_CHUNK}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, patch in variants.items():
            for key, value in {**defaults, **patch}.items():
                setattr(fasttrain, key, value)
            start = time.thread_time()
            logp, _ = forward_logprobs(model, ids, mask, None, 0, entropy=True)
            logp.sum().backward()
            times[name].append(time.thread_time() - start)
            model.zero_grad(set_to_none=True)
    for key, value in defaults.items():
        setattr(fasttrain, key, value)
    lines = [
        "",
        f"## Both sides of the switches on the tiny default model (`--thresholds --repeats {repeats}`)",
        "",
        "| variant | best ms | median ms |",
        "|---|---:|---:|",
    ]
    for name, values in times.items():
        lines.append(f"| {name} | {1e3 * min(values):.1f} | {1e3 * statistics.median(values):.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "memory_real.md"))
    parser.add_argument("--thresholds", action="store_true", help="time the tiny default model across the switches")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--sft", action="store_true", help="SFT's step: whole logits against chunked log-probs")
    parser.add_argument("--sft-tokens", type=int, nargs="+", default=[2048])
    parser.add_argument("--one", nargs=2, metavar=("KIND", "TOKENS"), help=argparse.SUPPRESS)  # the subprocess
    parser.add_argument("--one-sft", nargs=2, metavar=("KIND", "TOKENS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_pass(args.one[0], int(args.one[1]))))
        return
    if args.one_sft:
        print(json.dumps(one_sft_step(args.one_sft[0], int(args.one_sft[1]))))
        return
    if args.thresholds:
        text = thresholds(args.repeats)
        with open(args.out, "a") as f:
            f.write(text)
        print(text)
        return
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    if args.sft:
        text = sft_table(args.sft_tokens, env)
        with open(args.out, "a") as f:
            f.write(text)
        print(text)
        return
    rows = []
    for tokens in args.tokens:
        for kind in KINDS:
            command = [sys.executable, __file__, "--one", kind, str(tokens)]
            out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
            print(rows[-1], flush=True)
    import torch
    import transformers

    lines = [
        "# Peak memory of one training pass: the lean forward against `model.forward` (SDPA)",
        "",
        f"Reproduce: `python benchmarks/memory_real.py --tokens {' '.join(map(str, args.tokens))}`. Measured "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, torch {torch.__version__}, transformers "
        f"{transformers.__version__}, {platform.machine()}, CPU, float32, one thread; the machine may be shared "
        "(seconds are indicative only, the memory is not affected).",
        "",
        f"Model (random weights): Qwen2, {json.dumps(CONFIG)}. One row, log-probs and entropies, `-mean(logp)`, "
        "backward. Peak = max resident set during the pass minus the resident set before it (fresh process per "
        "row of the table, after a 16-token warm-up).",
        "",
        "| tokens | pass | peak MB | x SDPA's | seconds |",
        "|---:|---|---:|---:|---:|",
    ]
    for row in rows:
        ref = next(r for r in rows if r["tokens"] == row["tokens"] and r["kind"] == KINDS[0])
        lines.append(
            f"| {row['tokens']} | {row['kind']} | {row['peak_mb']:.0f} | {row['peak_mb'] / ref['peak_mb']:.2f} "
            f"| {row['seconds']:.2f} |"
        )
    lines += ["", "Goal (issue 37): `lean` at most 1.2x `model.forward (sdpa)`.", ""]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
