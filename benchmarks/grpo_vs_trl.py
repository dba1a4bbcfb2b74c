"""Seconds per GRPO step: lrmgym's native learner against TRL's GRPOTrainer, same model, same reward.

Setup (identical on both sides): a freshly initialised Llama-config model with the tiny model's character
tokenizer, saved once with ``save_pretrained`` and loaded by both; 8 prompts x group 4 x 32 new tokens per
step, temperature 1, one update per step (no reuse), no KL term, no reference model, lr 1e-4, the same reward
(the fraction of ``a`` characters in the completion, dense so every group has signal), 20 steps. The first
step is warm-up and is left out of the per-step figures; both report the mean and the median of steps 2-20.
The two sides run alternately ``--repeats`` times (default 3) and the run with the median mean counts.

TRL runs as a subprocess of this script (this same file with ``--trl-worker``) in the Python given by
``--trl-python``: lrmgym's own venv when it has the test extra (which installs trl; session 10 measured TRL 1.16.0
with transformers 5.24.0 that way), or a venv of its own, made once with::

    python -m venv /tmp/trlvenv
    /tmp/trlvenv/bin/pip install torch==2.13.0 trl transformers==5.24.0   # the same torch build as .venv

Run (from the repository root, in lrmgym's venv)::

    python benchmarks/grpo_vs_trl.py --trl-python /tmp/trlvenv/bin/python [--sizes tiny,2.6m] [--threads 2] [--async]

``--async`` also times lrmgym with ``learner.async_rollouts`` (the next step's rollouts sampled in a second
process while this step trains; one step off-policy, each process with half of ``--threads``), reported beside
the synchronous ratio. Its env lives in ``bench_env.py`` so that the worker process can import it.

The machine's load matters: each size's ``uptime`` before and after its runs is printed and kept in the JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

PROMPTS_PER_STEP, GROUP, NEW_TOKENS, STEPS, LR = 8, 4, 32, 20, 1e-4
SIZES = {
    # name: (hidden, layers, heads, mlp); head dim 32 like the tiny default model
    "tiny": (128, 4, 4, 336),  # the tiny default model's shape, about 0.79 M parameters
    "2.6m": (256, 3, 8, 768),  # about 2.6 M parameters
    "100m": (768, 14, 12, 2048),  # about 100 M parameters: benchmarks/gpu_step.py's size for a GPU
}


def reward_fraction_a(text: str) -> float:
    """The shared reward: the fraction of characters that are ``a`` (0 for an empty completion)."""
    return text.count("a") / len(text) if text else 0.0


def prompt_text(i: int) -> str:
    """Prompt ``i`` of the shared prompt stream."""
    return f"Q{i % 97}:"


# --------------------------------------------------------------------------------------------------- model
def save_model(folder: Path, size: str, seed: int = 0) -> int:
    """Write a freshly initialised model and the char tokenizer to ``folder``; returns the parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from lrmgym.policies.tiny import build_tokenizer

    hidden, layers, heads, mlp = SIZES[size]
    tok = build_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=heads, intermediate_size=mlp, max_position_embeddings=256, tie_word_embeddings=True,
        pad_token_id=0, bos_token_id=None, eos_token_id=1,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------------------------------- lrmgym
def run_lrmgym(model_dir: Path, out_dir: Path, threads: int, async_rollouts: bool = False) -> list[float]:
    """Seconds of each of the STEPS steps of the native learner (with ``async_rollouts``: one step of lag)."""
    import gymnasium

    import lrmgym
    from lrmgym.compose import train
    from lrmgym.configs.schema import EnvConfig, RunConfig, RunSection
    from lrmgym.eval.config import EvalConfig
    from lrmgym.learners.algorithms.grpo import GRPOConfig
    from lrmgym.policies.hf import HFPolicyConfig

    if "lrmgym/BenchFractionA-v0" not in gymnasium.registry:
        lrmgym.register("lrmgym/BenchFractionA-v0", "bench_env:FractionAEnv")
    # With async rollouts the sampler is a second process with the trainer's thread count: each gets half of
    # ``threads`` (at least 1), so lrmgym uses as many threads as TRL. With 2 each on 2 cores (4 threads), the tiny
    # model's async step took 1.6 s instead of 0.2 s.
    learner = GRPOConfig(
        steps=STEPS, prompts_per_step=PROMPTS_PER_STEP, group_size=GROUP, max_new_tokens=NEW_TOKENS, lr=LR,
        track_kl=False, eval_before_after=False, checkpoint_every=10_000, progress=False,
        async_rollouts=async_rollouts, torch_threads=max(1, threads // 2) if async_rollouts else threads,
    )  # fmt: skip
    config = RunConfig(
        env=EnvConfig(id="lrmgym/BenchFractionA-v0"), policy=HFPolicyConfig(model=str(model_dir), device="cpu"),
        learner=learner, eval=EvalConfig(), run=RunSection(seed=0),
    )  # fmt: skip
    train(config, out_dir, resume=False)
    lines = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [m["time/step_s"] for m in lines]


# --------------------------------------------------------------------------------------------------- TRL
def trl_worker(model_dir: str, threads: int) -> None:
    """Runs in TRL's venv: train STEPS steps with GRPOTrainer and print the step times as JSON."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(threads)
    times: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter() - self.t0)

    def reward(completions, **kwargs):
        return [reward_fraction_a(c) for c in completions]

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    data = Dataset.from_dict({"prompt": [prompt_text(i) for i in range(PROMPTS_PER_STEP * STEPS)]})
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out, max_steps=STEPS, per_device_train_batch_size=PROMPTS_PER_STEP * GROUP,
            num_generations=GROUP, max_completion_length=NEW_TOKENS, learning_rate=LR, beta=0.0,
            num_iterations=1, steps_per_generation=1, gradient_accumulation_steps=1, temperature=1.0,
            use_cpu=True, bf16=False, report_to="none", save_strategy="no", logging_steps=1000,
            disable_tqdm=True, dataloader_num_workers=0, seed=0, loss_type="grpo", shuffle_dataset=False,
        )  # fmt: skip
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tok)
        trainer.add_callback(StepTimer())
        trainer.train()
    print("TRL_TIMES " + json.dumps(times), flush=True)


def run_trl(trl_python: str, model_dir: Path, threads: int) -> list[float]:
    """Run :func:`trl_worker` in TRL's venv and collect its step times."""
    out = subprocess.run(
        [trl_python, __file__, "--trl-worker", str(model_dir), "--threads", str(threads)],
        capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    for line in out.stdout.splitlines():
        if line.startswith("TRL_TIMES "):
            return json.loads(line[len("TRL_TIMES ") :])
    raise RuntimeError(f"TRL worker failed (exit {out.returncode}):\n{out.stderr[-4000:]}")


def _median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    """The run with the median mean step time (of an odd count; the upper middle of an even one)."""
    return sorted(runs, key=lambda r: r["mean_s"])[len(runs) // 2]


def _stats(times: list[float]) -> dict[str, float]:
    steady = times[1:]  # the first step is warm-up
    return {"mean_s": statistics.mean(steady), "median_s": statistics.median(steady), "first_s": times[0]}


def _uptime() -> str:
    """``uptime``'s line (the machine's load), or why there is none."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as err:
        return f"(uptime unavailable: {err})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trl-python", default="/tmp/trlvenv/bin/python", help="python of the venv with trl")
    parser.add_argument("--sizes", default="tiny,2.6m", help=f"comma-separated, from {sorted(SIZES)}")
    parser.add_argument("--threads", type=int, default=2, help="torch threads on both sides")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs per side; the median run counts")
    parser.add_argument(
        "--async", dest="async_", action="store_true",
        help="also time lrmgym with async_rollouts (rollouts one step ahead in a second process: a different "
        "algorithm, one step off-policy, so reported beside the synchronous ratio, not instead of it)",
    )  # fmt: skip
    parser.add_argument("--trl-worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trl_worker:
        trl_worker(args.trl_worker, args.threads)
        return

    import torch

    torch.set_num_threads(args.threads)
    results = {}
    for size in args.sizes.split(","):
        runs: dict[str, list[dict[str, float]]] = {"lrmgym": [], "trl": [], "lrmgym_async": []}
        load_before = _uptime()
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = Path(tmp) / "model"
            params = save_model(model_dir, size)
            # The sides alternate, repeats times: this machine's speed drifts by 20-30 % over minutes, which a
            # single pair of back-to-back runs mistakes for a difference between the learners.
            for rep in range(args.repeats):
                runs["lrmgym"].append(_stats(run_lrmgym(model_dir, Path(tmp) / f"run{rep}", args.threads)))
                if args.async_:
                    lagged = run_lrmgym(model_dir, Path(tmp) / f"run_async{rep}", args.threads, async_rollouts=True)
                    runs["lrmgym_async"].append(_stats(lagged))
                runs["trl"].append(_stats(run_trl(args.trl_python, model_dir, args.threads)))
        ours, trl = _median_run(runs["lrmgym"]), _median_run(runs["trl"])
        ratio = ours["mean_s"] / trl["mean_s"]
        results[size] = {"params": params, "lrmgym": ours, "trl": trl, "ratio_mean": ratio,
                         "ratio_median": ours["median_s"] / trl["median_s"], "repeats": args.repeats,
                         "runs": {k: v for k, v in runs.items() if v}, "threads": args.threads,
                         "uptime_before": load_before, "uptime_after": _uptime()}  # fmt: skip
        print(
            f"{size:>5} ({params / 1e6:.2f} M params): lrmgym {ours['mean_s']:.3f} s/step (median "
            f"{ours['median_s']:.3f}), TRL {trl['mean_s']:.3f} s/step (median {trl['median_s']:.3f}); "
            f"ratio {ratio:.2f}x  [per-run ratios: "
            + ", ".join(f"{a['mean_s'] / b['mean_s']:.2f}" for a, b in zip(runs["lrmgym"], runs["trl"], strict=True))
            + f"]\n      uptime before: {load_before}\n      uptime after:  {results[size]['uptime_after']}",
            flush=True,
        )
        if runs["lrmgym_async"]:
            lagged = _median_run(runs["lrmgym_async"])
            results[size].update(lrmgym_async=lagged, ratio_async_mean=lagged["mean_s"] / trl["mean_s"])
            print(
                f"{size:>5} async rollouts: lrmgym {lagged['mean_s']:.3f} s/step (median {lagged['median_s']:.3f}); "
                f"ratio {lagged['mean_s'] / trl['mean_s']:.2f}x (one step off-policy)",
                flush=True,
            )
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
