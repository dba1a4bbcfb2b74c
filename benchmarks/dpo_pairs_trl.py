"""Exported preference pairs go into TRL's DPOTrainer as they are (issue 19: judged traces as data).

Run: ``PYTHONPATH=/path/to/trl python benchmarks/dpo_pairs_trl.py [--run RUN_DIR] [--out
benchmarks/results/dpo_pairs_trl.md]``. TRL is not a dependency of lrmgym: install it where only this script
sees it, e.g. ``pip install --no-deps --target /tmp/trl trl==1.16.0`` (its own dependencies, transformers,
accelerate and datasets, are those lrmgym's test extras install).

Without ``--run`` it first makes a small run whose groups all go to the arena tournament (``lrmgym run env=math
judge=arena judge.arena.route_when=always``, every group logged). Then ``lrmgym export traces RUN --pairs
pairs.jsonl``; the pairs are loaded with ``datasets.load_dataset("json")``, checked with TRL's own format helpers
(``trl.data_utils.is_conversational``), and trained on for a few steps by ``trl.DPOTrainer`` with the tiny
default model as policy and reference, on CPU. The report records what each step saw.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _cli(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "lrmgym.cli.main", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"lrmgym {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return done.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=None, help="a run directory to export (default: make one)")
    parser.add_argument("--steps", type=int, default=4, help="DPO steps")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "dpo_pairs_trl.md")
    args = parser.parse_args()
    try:
        import trl
        from trl.data_utils import is_conversational
    except ImportError:
        hint = "pip install --no-deps --target /tmp/trl trl, then PYTHONPATH=/tmp/trl"
        raise SystemExit(f"TRL is not importable: {hint}") from None
    import datasets
    import torch

    work = Path(tempfile.mkdtemp(prefix="dpo-pairs-"))
    start = time.perf_counter()
    run = args.run
    if run is None:
        _cli(
            "run", "env=math", "judge=arena", "judge.arena.route_when=always", "learner.steps=3",
            "learner.prompts_per_step=8", "learner.group_size=4", "learner.log_samples=8",
            "learner.eval_before_after=false", "learner.async_rollouts=false", "learner.progress=false",
            f"run.output_dir={work}", "run.name=arena",
        )  # fmt: skip
        run = work / "arena"
    pairs = work / "pairs.jsonl"
    said = _cli("export", "traces", str(run), "--out", str(work / "traces.jsonl"), "--pairs", str(pairs))
    data = datasets.load_dataset("json", data_files=str(pairs), split="train")
    columns = {name: str(feature) for name, feature in data.features.items()}
    conversational = sum(bool(is_conversational(row)) for row in data)

    from lrmgym.configs.resolve import resolve

    model, tokenizer = _tiny(resolve(["env=math"]).policy)
    config = trl.DPOConfig(
        output_dir=str(work / "dpo"), max_steps=args.steps, per_device_train_batch_size=4, learning_rate=1e-4,
        logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, max_length=256, seed=0,
    )  # fmt: skip
    trainer = trl.DPOTrainer(model=model, args=config, train_dataset=data, processing_class=tokenizer)
    trained = trainer.train()
    losses = [(e["step"], e["loss"]) for e in trainer.state.log_history if "loss" in e]
    wall = time.perf_counter() - start
    lines = [
        "# Exported DPO pairs in TRL's DPOTrainer",
        "",
        f"`python benchmarks/dpo_pairs_trl.py` (TRL {trl.__version__}, datasets {datasets.__version__}, torch "
        f"{torch.__version__}; {wall:.0f} s). Run exported: "
        + ("a 3-step GRPO run with every group in the arena, made by this script" if args.run is None else f"`{run}`"),
        "",
        f"- export: {said.replace(str(work) + '/', '')}",
        f"- `datasets.load_dataset('json')`: {len(data)} rows, columns {json.dumps(columns)}",
        f"- `trl.data_utils.is_conversational`: {conversational} of {len(data)} rows conversational",
        f"- `trl.DPOTrainer` on the tiny default model (policy and reference), CPU: {trained.global_step} steps, "
        f"training loss {trained.training_loss:.4f}",
        "",
        "| step | DPO loss |",
        "|---|---|",
        *(f"| {s} | {loss:.4f} |" for s, loss in losses),
        "",
    ]
    args.out.write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))


def _tiny(cfg):  # the default tiny model and its tokenizer, loaded as transformers objects
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = cfg.cache_dir() if (cfg.cache_dir() / "build.json").is_file() else cfg.shipped_dir()
    return AutoModelForCausalLM.from_pretrained(str(folder)), AutoTokenizer.from_pretrained(str(folder))


if __name__ == "__main__":
    main()
