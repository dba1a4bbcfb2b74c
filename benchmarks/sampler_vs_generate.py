"""Our batched KV-cache sampler vs ``transformers`` ``model.generate`` on the tiny model (CPU).

Both sample the same prompts (64 math prompts x n=8, temperature 1, <= 48 new tokens) and both return the
sampled tokens' log-probs (for ``generate``: ``output_logits=True`` and a log-softmax + gather afterwards,
which is what a learner would have to do). Prints tokens/s of each, median of ``--repeats`` runs.

    python benchmarks/sampler_vs_generate.py [--threads 1] [--repeats 3] [--random-init]

Uses the cached default tiny model (``lrmgym tiny build``) unless ``--random-init``; a trained model stops
at EOS, which is where dropping finished rows pays off.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import lrmgym
from lrmgym.policies.base import SamplingParams
from lrmgym.policies.hf import HFPolicy
from lrmgym.policies.tiny import TinyArch, TinyPolicyConfig, build_model, build_tokenizer


def _generate_hf(policy: HFPolicy, prompts: list[str], n: int, sampling: SamplingParams) -> int:
    """model.generate with per-token log-probs; returns the number of generated (non-pad) tokens."""
    tok = policy.tokenizer
    tok.padding_side = "left"
    batch = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    ids = batch["input_ids"].repeat_interleave(n, 0)
    mask = batch["attention_mask"].repeat_interleave(n, 0)
    torch.manual_seed(sampling.seed or 0)
    out = policy.model.generate(
        ids,
        attention_mask=mask,
        do_sample=True,
        temperature=sampling.temperature,
        top_k=0,
        top_p=1.0,
        max_new_tokens=sampling.max_new_tokens,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        output_logits=True,
        return_dict_in_generate=True,
    )
    new = out.sequences[:, ids.shape[1] :]  # [B*n, T]
    logits = torch.stack(out.logits, 1).float()  # [B*n, T, V]
    torch.log_softmax(logits, -1).gather(-1, new[..., None])  # the log-probs a learner needs
    eos_seen = (new == tok.eos_token_id).cumsum(1)
    return int(((eos_seen == 0) | ((eos_seen == 1) & (new == tok.eos_token_id))).sum())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--random-init", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.random_init:
        tok = build_tokenizer()
        policy = HFPolicy(build_model(TinyArch(), len(tok), 0), tok)
    else:
        policy = TinyPolicyConfig(build_if_missing=False, batch_size=args.prompts * args.n).build()
    env = lrmgym.make("Math-v0", difficulty=1, style="compact", template="r1", split="test").unwrapped
    prompts = [env.task_at(i, seed=0).prompt for i in range(args.prompts)]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=48, seed=0)
    ours, theirs = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        out = policy.generate(prompts, n=args.n, sampling=sampling)
        tokens = sum(len(c.token_ids) for g in out for c in g)
        ours.append(tokens / (time.perf_counter() - start))
        start = time.perf_counter()
        tokens = _generate_hf(policy, prompts, args.n, sampling)
        theirs.append(tokens / (time.perf_counter() - start))
    load = [round(x, 1) for x in __import__("os").getloadavg()]
    print(f"{args.prompts} prompts x n={args.n}, <=48 new tokens, {args.threads} thread(s), load {load}")
    print(f"  lrmgym sampler : {statistics.median(ours):8.0f} tokens/s  (runs: {[round(x) for x in ours]})")
    print(f"  model.generate : {statistics.median(theirs):8.0f} tokens/s  (runs: {[round(x) for x in theirs]})")
    print(f"  ratio          : {statistics.median(ours) / statistics.median(theirs):.2f}x")


if __name__ == "__main__":
    main()
