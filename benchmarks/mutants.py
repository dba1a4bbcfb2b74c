"""Plant each mutant of issue 38 item 6, run the test that must kill it, put the file back (issue 38 item 6).

Run: ``python benchmarks/mutants.py [--only SUBSTRING] [--out benchmarks/results/mutants_run.md]`` from the
repository root. Each mutant is one textual replacement that must match its file exactly once; the file's text
is restored from memory afterwards (also on Ctrl-C), so uncommitted edits elsewhere in it are kept. A mutant is
killed when its test fails (pytest exit status 1); any other status is reported as an error, never as killed.
The whole list took about 7 minutes on 2 shared CPU cores (2 of them the serve mutant, which waits out its bound).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
L, E = "lrmgym/learners/", "lrmgym/learners/engine/"
A = L + "algorithms/"
# (file, the text replaced, its replacement, pytest arguments of the test that kills it)
MUTANTS: list[tuple[str, str, str, list[str]]] = [
    (E + "staged.py", "seed = self.ctx.seed if index == 0 else derived_seed(self.ctx.seed, _STAGE_SEED, index)",
     "seed = self.ctx.seed", ["tests/learners/test_staged.py", "-k", "seed_of_its_own"]),
    (E + "staged.py", 'earlier = self.records[-1].summary.get("evals", {}).get("after")',
     'earlier = self.records[-1].summary.get("evals", {}).get("before")',
     ["tests/learners/test_staged.py", "-k", "continuing_stage"]),
    (E + "staged.py", 'v.detach().to("cpu", copy=True)', 'v.detach().to("cpu")',
     ["tests/learners/test_staged.py", "-k", "from_base"]),
    (E + "staged.py", '        self.model.load_state_dict(self.base_state)\n        self.start = "base"',
     '        self.start = "base"', ["tests/learners/test_staged.py", "-k", "from_base"]),
    (E + "staged.py", '        self.model.load_state_dict(self.base_state)\n        self.start = "base"',
     '        self.start = "base"', ["tests/learners/test_ring_zero.py", "-k", "all_four"]),
    (A + "ring_zero.py", "        run.load_base()\n", "", ["tests/learners/test_ring_zero.py", "-k", "all_four"]),
    (A + "ring_zero.py", "known[trace.task_id] = min(trace.tokens", "known[trace.task_id] = max(trace.tokens",
     ["tests/learners/test_ring_zero.py", "-k", "known_lengths"]),
    (A + "ring_zero_rl.py", "if v is None or v.correct is not True or", "if v is None or v.correct is False or",
     ["tests/learners/test_ring_zero.py", "-k", "unknown_correctness"]),
    (A + "distill_corpus.py", '    if verdict.correct is not True:\n        return "wrong", []',
     '    if verdict.correct is False:\n        return "wrong", []',
     ["tests/learners/test_distill.py", "-k", "unknown_correctness"]),
    (A + "distill_corpus.py", "if len(ids) >= len(original):", "if len(ids) > len(original):",
     ["tests/learners/test_distill.py", "-k", "as_long_as"]),
    (A + "reason_maxxer_data.py", "entropy[i, p - 1 : len(rows[i]) - 1]", "entropy[i, p : len(rows[i])]",
     ["tests/learners/test_reason_maxxer.py", "-k", "completion_positions"]),
    (A + "reason_maxxer.py", "key=lambda i: -self._clarity(self.rows[i])", "key=lambda i: self._clarity(self.rows[i])",
     ["tests/learners/test_reason_maxxer.py", "-k", "clarity_order"]),
    (E + "shared_prefix.py", "        if temperature != 1.0:\n            logits = logits / temperature\n", "",
     ["tests/learners/test_update.py", "-k", "plain_unshared"]),
    (A + "ppo.py", "rewards = (-kl_coef * kl.float())", "rewards = (kl_coef * kl.float())",
     ["tests/learners/test_ppo.py", "-k", "kl_reward_is"]),
    (A + "ppo.py", "return old - self.updater.no_grad_logprobs(ref_model, batch)",
     "return self.updater.no_grad_logprobs(ref_model, batch) - old",
     ["tests/learners/test_ppo.py", "-k", "kl_rewards_sample"]),
    (E + "update.py", "old = logp.detach() if reuse_old else old_all[micro, :t]",
     "old = logp.detach() if reuse_old else (ref_all if ref_all is not None else old_all)[micro, :t]",
     ["tests/learners/test_ppo.py", "-k", "ppo_ratio"]),
    (A + "ppo.py", "if self.loop.step > self.cfg.critic_warmup_steps:",
     "if self.loop.step >= self.cfg.critic_warmup_steps:", ["tests/learners/test_ppo.py", "-k", "lr_schedule"]),
    (A + "critic.py", "loss = loss_tok.sum() / mb_tokens", "loss = loss_tok.sum() / max(float(mask.sum()), 1.0)",
     ["tests/learners/test_ppo.py", "-k", "value_fit"]),
    (A + "grpo.py", "keep_zero = cfg.kl_coef > 0 or not cfg.drop_zero_advantage",
     "keep_zero = not cfg.drop_zero_advantage", ["tests/learners/test_mutants.py", "-k", "zero_advantage_rows"]),
    (E + "loop.py", "self.step % self.cfg.eval_every == 0 and self.step < self.cfg.steps:",
     "self.step % self.cfg.eval_every == 0 and self.step <= self.cfg.steps:",
     ["tests/learners/test_mutants.py", "-k", "final_step_is_evaluated"]),
    ("lrmgym/policies/fastdecode.py",
     'if getattr(module, "disable_adapters", False) or getattr(module, "merged", False):',
     'if getattr(module, "disable_adapters", False):',
     ["tests/policies/test_fastdecode.py", "-k", "lora_model_decodes"]),
    ("lrmgym/eval/shift.py", "pick = torch.randint(1, k, (len(where),)", "pick = torch.randint(0, k, (len(where),)",
     ["tests/eval/test_shift.py", "-k", "control_never"]),
    (E + "traces.py", "max(ids) >= vocab_size", "max(ids) > vocab_size",
     ["tests/learners/test_reason_maxxer.py", "-k", "bad_rollouts_file"]),
    (E + "traces.py", "all(_is_int(t) and t >= 0 for t in ids)", "all(_is_int(t) and t > 0 for t in ids)",
     ["tests/learners/test_reason_maxxer.py", "-k", "bad_rollouts_file"]),
    (E + "export.py", "elif margin <= 0:", "elif margin < 0:",
     ["tests/cli/test_export_traces.py", "-k", "margins_at_their_edges"]),
    (E + "export.py", "elif margin < min_margin:", "elif margin <= min_margin:",
     ["tests/cli/test_export_traces.py", "-k", "margins_at_their_edges"]),
    ("lrmgym/judges/arena.py", "if i >= drop and j >= drop]", "if i > drop and j > drop]",
     ["tests/judges/test_arena.py", "-k", "trimmed_pool"]),
    ("lrmgym/judges/arena.py", "drop = max(0, len(self.members) - size)", "drop = max(0, len(self.members) - size + 1)",
     ["tests/judges/test_arena.py", "-k", "trimmed_pool"]),
    ("lrmgym/integrations/serve.py", "if len(bucket.items) >= self.config.group_size:",
     "if len(bucket.items) > self.config.group_size:",
     ["tests/integrations/test_serve.py", "-k", "full_group_is_graded"]),  # ~2 min: waits out its 120 s bound
    (E + "metrics.py", "generated = sum(len(c.token_ids) if c", "generated = sum(len(c.token_ids) // 2 if c",
     ["tests/learners/test_update.py", "-k", "logs_the_tokens_it_generated"]),
    (E + "update.py", '"compute/forward_tokens": int(grad_tokens),', '"compute/forward_tokens": 0,',
     ["tests/learners/test_flops.py", "-k", "logs_flops_and_achieved"]),
]  # fmt: skip


def plant(path: Path, old: str, new: str, args: list[str]) -> tuple[int, str, float]:
    """Replace ``old`` by ``new`` in ``path``, run pytest on ``args``, restore; ``(line, outcome, seconds)``."""
    text = path.read_text(encoding="utf-8")
    if text.count(old) != 1:
        return 0, f"not planted: the text matches {text.count(old)} times", 0.0
    line = text[: text.index(old)].count("\n") + 1
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    try:
        path.write_text(text.replace(old, new), encoding="utf-8")
        rc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *args],
            cwd=ROOT, env=env, capture_output=True, text=True,
        ).returncode  # fmt: skip
    finally:
        path.write_text(text, encoding="utf-8")
    outcome = {0: "SURVIVED", 1: "killed"}.get(rc, f"error (pytest exit {rc})")
    return line, outcome, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--only", default="", help="run only the mutants whose file or test contains this")
    parser.add_argument("--out", type=Path, default=None, help="also write the table to this markdown file")
    args = parser.parse_args()
    rows, bad = ["| mutant | test | outcome | s |", "|---|---|---|---|"], 0
    for file, old, new, test in MUTANTS:
        if args.only and args.only not in file and args.only not in " ".join(test):
            continue
        line, outcome, seconds = plant(ROOT / file, old, new, test)
        bad += outcome != "killed"
        change = f"`{old.strip()[:60]}` -> `{new.strip()[:60]}`".replace("\n", " ")
        rows.append(f"| {file}:{line} {change} | {' '.join(test)} | {outcome} | {seconds:.0f} |")
        print(rows[-1], flush=True)
    if args.out is not None:
        args.out.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
