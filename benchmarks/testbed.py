"""What the reasoning testbed offers an RL method at the start of training (README: "Test an RL idea on a laptop").

Run: ``python benchmarks/testbed.py [--tasks 128] [--seed 0] [--out benchmarks/results/testbed.md]``.

On the testbed model (``lrmgym tiny build --recipe testbed``; built if missing) and ``env=testbed``'s held-out
split, it measures and prints as markdown:

1. GRPO's groups at the start (G=8, T=1) at several difficulty settings: the share of all-wrong, all-correct and
   mixed groups, and accuracy.
2. Solution lengths (tokens, EOS included): min / median / max, and the share of samples exactly as long as the
   reference solution of their own style (no re-checks).
3. The style fork: the share of samples in each style (the word after ``<think>``), the model's entropy at that
   token (nats; over the whole vocabulary) against its other completion tokens, and where ReasonMaxxer's entropy
   gate (H > tau) falls: the share of gated positions that are the fork token.
4. Accuracy with and without intermediate steps: every task sampled with ``<think>Let`` and with ``<think>So``
   forced, by chain length.
5. The train/infer gap: the mean |log p_sampler - log p_trainer| and k3 KL per token of ``policy.sample_dtype``
   bfloat16 sampling against fp32 (the metric ``train_infer/*`` of the update, computed here directly).

Seeds: task stream ``--seed`` of the test split; sampling seeds ``--seed`` + 1 (groups), + 2 (forced styles),
+ 3 (dtype gap). Everything runs on one CPU thread.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import torch

import lrmgym
from lrmgym.compose import build_policy
from lrmgym.envs.math.testbed import STYLES, Chain, chain_solution
from lrmgym.policies.base import SamplingParams
from lrmgym.policies.tiny import TinyPolicyConfig

SETTINGS = {
    "training mix (ops 1-8, 50 % two-digit operands)": {"min_ops": 1, "max_ops": 8},
    "ops 1-3, 20 % two-digit": {"min_ops": 1, "max_ops": 3, "two_digit_share": 0.2},
    "ops 1-3, one-digit": {"min_ops": 1, "max_ops": 3, "two_digit_share": 0.0},
    "ops 1-2, one-digit": {"min_ops": 1, "max_ops": 2, "two_digit_share": 0.0},
    "ops 1-4, one-digit": {"min_ops": 1, "max_ops": 4, "two_digit_share": 0.0},
}
"""Difficulty settings of the first table (``env.`` options); the later sections use the first, the training mix."""
G = 8
MAX_NEW = 400
TAU = 1.4  # ReasonMaxxer's tau for its 1.5B model (papers.md 2.2); the gate's share is reported for it


def _chain(task) -> Chain:
    question = task.metadata["question"].removeprefix("Compute ").rstrip(".")
    numbers, ops, current = [], [], ""
    for ch in question:
        if ch in "+-":
            numbers.append(int(current))
            ops.append(ch)
            current = ""
        else:
            current += ch
    numbers.append(int(current))
    return Chain(tuple(numbers), tuple(ops))


def _share(flags: list[bool]) -> str:
    return f"{sum(flags) / len(flags):.1%} (of {len(flags)})" if flags else "n/a (none)"


def _style(text: str) -> str:
    body = text.removeprefix("<think>")
    for style, word in STYLES.items():
        if body.startswith(word + " "):
            return style
    return "other"


def _groups(env, policy, tasks, seed: int, prefix: str = "") -> list[list[tuple[object, object]]]:
    sampling = SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW, seed=seed)
    prompts = [t.prompt + prefix for t in tasks]
    out = []
    for task, group in zip(tasks, policy.generate(prompts, n=G, sampling=sampling), strict=True):
        out.append([(c, env.verify(task, prefix + c.text)) for c in group])
    return out


def _fork_entropy(policy, tasks, groups) -> dict[str, float]:
    """Entropy (nats) at the fork token and elsewhere; the share of H > TAU positions that are the fork."""
    think = policy.tokenizer.convert_tokens_to_ids("<think>")
    fork, other, gated, gated_fork = [], [], 0, 0
    model = policy.model
    with torch.inference_mode():
        for group in groups:
            for c, _ in group[:2]:  # two samples a task: enough for the averages
                ids = list(c.prompt_token_ids) + list(c.token_ids)
                logits = model(input_ids=torch.tensor([ids])).logits[0, len(c.prompt_token_ids) - 1 : -1].float()
                logp = torch.log_softmax(logits, -1)
                entropy = (-(logp.exp() * logp).sum(-1)).tolist()  # at each completion position
                for pos, h in enumerate(entropy):
                    is_fork = pos == 1 and c.token_ids[0] == think
                    (fork if is_fork else other).append(h)
                    if h > TAU:
                        gated += 1
                        gated_fork += is_fork
    return {
        "fork": statistics.mean(fork) if fork else float("nan"),
        "other": statistics.mean(other),
        "gated_share": gated / max(1, len(fork) + len(other)),
        "gated_fork": gated_fork / max(1, gated),
    }


def _gap(policy, tasks, seed: int) -> dict[str, float]:
    sampling = SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW, seed=seed)
    diffs, k3 = [], []
    for group in policy.generate([t.prompt for t in tasks], n=2, sampling=sampling):
        for c in group:
            trainer = policy.logprobs(c.prompt_token_ids, c.token_ids)
            for a, b in zip(c.logprobs, trainer, strict=True):
                r = b - a  # log(p_trainer / p_sampler)
                diffs.append(abs(r))
                k3.append(math.exp(r) - r - 1.0)
    return {"abs": statistics.mean(diffs), "k3": statistics.mean(k3), "max": max(diffs), "tokens": len(diffs)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=128, help="Held-out tasks per setting.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results/testbed.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()

    policy_cfg = TinyPolicyConfig(recipe="testbed", threads=1)
    policy = build_policy(SimpleNamespace(policy=policy_cfg))  # built and cached first if missing
    lines = [
        "# The reasoning testbed at the start of training",
        "",
        f"Model: `lrmgym tiny build --recipe testbed` (key `{policy_cfg.key()}`, "
        f"{sum(p.numel() for p in policy.model.parameters()):,} parameters). Env: `env=testbed` test split, task "
        f"stream seed {args.seed}, {args.tasks} tasks per setting, G={G} samples at T=1 (sampling seed "
        f"{args.seed + 1}), max {MAX_NEW} new tokens. Command: `python benchmarks/testbed.py --tasks {args.tasks} "
        f"--seed {args.seed}`.",
        "",
        "## GRPO groups at the start (G=8)",
        "",
        "| setting | accuracy | all-wrong groups | all-correct groups | mixed groups |",
        "|---|---|---|---|---|",
    ]
    mixture = None
    for name, options in SETTINGS.items():
        env = lrmgym.make("Testbed-v0", split="test", **options).unwrapped
        tasks = [env.task_at(i, seed=args.seed) for i in range(args.tasks)]
        groups = _groups(env, policy, tasks, args.seed + 1)
        correct = [[bool(v.correct) for _, v in g] for g in groups]
        wrong = sum(not any(g) for g in correct) / len(groups)
        right = sum(all(g) for g in correct) / len(groups)
        acc = sum(map(sum, correct)) / (len(groups) * G)
        lines.append(f"| {name} | {acc:.1%} | {wrong:.1%} | {right:.1%} | {1 - wrong - right:.1%} |")
        if mixture is None:
            mixture = (env, tasks, groups)
        print(f"[{time.perf_counter() - start:.0f}s] {name}: acc {acc:.3f} all-wrong {wrong:.3f}", file=sys.stderr)

    env, tasks, groups = mixture
    lengths, at_reference, styles, checks = [], 0, Counter(), []
    for task, group in zip(tasks, groups, strict=True):
        chain = _chain(task)
        for c, verdict in group:
            style = _style(c.text)
            styles[style] += 1
            lengths.append(len(c.token_ids))
            if style != "other":
                reference = policy.tokenizer(chain_solution(chain, style), add_special_tokens=False)["input_ids"]
                at_reference += len(c.token_ids) == len(reference) + 1  # + EOS
            if style == "stepwise":
                checks.append(("chk " in c.text, bool(verdict.correct)))
    n = len(lengths)
    lines += [
        "",
        "## Solution lengths (mixture setting, tokens incl. EOS)",
        "",
        f"min {min(lengths)}, median {statistics.median(lengths):g}, max {max(lengths)}; "
        f"{at_reference / n:.1%} of samples are exactly as long as the reference solution of their style "
        f"(without re-checks). Stepwise samples with a re-check: {_share([c for c, _ in checks])}; accuracy of "
        f"stepwise samples with one {_share([ok for c, ok in checks if c])}, "
        f"without {_share([ok for c, ok in checks if not c])}.",
        "",
        "## The style fork (mixture setting)",
        "",
        f"Samples by style: stepwise ('Let') {styles['stepwise'] / n:.1%}, direct ('So') {styles['direct'] / n:.1%}, "
        f"other {styles['other'] / n:.1%}.",
    ]
    entropy = _fork_entropy(policy, tasks, groups)
    lines += [
        f"Entropy at the fork token (after `<think>`): {entropy['fork']:.3f} nats (ln 2 = 0.693 is a fair coin); "
        f"mean over the other completion tokens: {entropy['other']:.3f} nats. With ReasonMaxxer's gate H > {TAU}, "
        f"{entropy['gated_share']:.2%} of completion tokens are gated and {entropy['gated_fork']:.1%} of the gated "
        "ones are the fork token (two samples a task, teacher-forced on the fp32 model).",
        "",
        "## Accuracy with and without intermediate steps (mixture setting, style forced)",
        "",
        "| ops | stepwise ('<think>Let') | direct ('<think>So') |",
        "|---|---|---|",
    ]
    forced = {}
    for style, word in STYLES.items():
        forced[style] = _groups(env, policy, tasks, args.seed + 2, prefix=f"<think>{word}")
    by_ops: dict[int, dict[str, list[bool]]] = {}
    for i, task in enumerate(tasks):
        row = by_ops.setdefault(task.metadata["ops"], {s: [] for s in STYLES})
        for style in STYLES:
            row[style] += [bool(v.correct) for _, v in forced[style][i]]
    totals = {s: [x for row in by_ops.values() for x in row[s]] for s in STYLES}
    for ops in sorted(by_ops):
        row = by_ops[ops]
        lines.append(f"| {ops} | {sum(row['stepwise']) / len(row['stepwise']):.1%} | "
                     f"{sum(row['direct']) / len(row['direct']):.1%} |")  # fmt: skip
    lines.append(f"| all | {sum(totals['stepwise']) / len(totals['stepwise']):.1%} | "
                 f"{sum(totals['direct']) / len(totals['direct']):.1%} |")  # fmt: skip
    print(f"[{time.perf_counter() - start:.0f}s] forced styles done", file=sys.stderr)

    gap_tasks = tasks[:64]
    fp32 = _gap(policy, gap_tasks, args.seed + 3)
    bf16_policy = TinyPolicyConfig(recipe="testbed", threads=1, sample_dtype="bfloat16").build()
    bf16 = _gap(bf16_policy, gap_tasks, args.seed + 3)
    lines += [
        "",
        "## Train/infer gap (sampler log-prob against the fp32 trainer's, per token)",
        "",
        "| sampler | mean abs diff | k3 KL | max abs diff | tokens |",
        "|---|---|---|---|---|",
        f"| fp32 (policy.sample_dtype=float32) | {fp32['abs']:.2e} | {fp32['k3']:.2e} | {fp32['max']:.2e} | "
        f"{fp32['tokens']} |",
        f"| bf16 (policy.sample_dtype=bfloat16) | {bf16['abs']:.2e} | {bf16['k3']:.2e} | {bf16['max']:.2e} | "
        f"{bf16['tokens']} |",
        "",
        f"({len(gap_tasks)} tasks x 2 samples, sampling seed {args.seed + 3}.) Total time "
        f"{time.perf_counter() - start:.0f} s on one thread of a shared 2-core machine.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
