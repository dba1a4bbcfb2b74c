"""Ring-Zero on the reasoning testbed with a bf16 sampler (issue 38 item 4; papers.md section 3).

Run: ``python benchmarks/ring_zero_testbed.py [--seeds 0,1,2,3,4] [--rl1-steps 40] [--rl2-steps 20]
[--runs /tmp/ring/runs] [--out benchmarks/results/ring_zero_testbed.md] [--report-only]``.

Every run is ``lrmgym run env=testbed policy.recipe=testbed policy.sample_dtype=bfloat16`` in a fresh process
(one thread, synchronous rollouts, generation budgets instead of time budgets), so that the sampler is a bf16
copy of the fp32 weights the trainer updates and the ratio correction has a gap to correct. Per seed:

- ``token``: RL-1 as the stage's defaults (clipped IS, cap 5, the sampler's log-probs as the ratio's
  denominator, token-level loss, k3 KL 1e-4, format B, the response window from the longest reference);
- ``sample``: the same with the sample-level loss;
- ``noratio``: the same as ``token`` with ``behavior_logprobs=recompute`` (the ratio's denominator is the trainer's
  own log-prob, so the weight is 1: no correction of the bf16 sampler's gap);
- ``token`` resumed with ``[rl1, sd, rl2]``: self-distillation of the base on RL-1's shortest correct traces,
  then RL-2 (sample-level, no KL) from the distilled model at the preset's lr 4e-4; ``lowlr``, a copy of that run
  made after SD, runs RL-2 at SD's lr 1e-4 (the same SD weights, tasks and sampling seeds);
- ``grpo``: plain GRPO from the base for the same number of completions as RL-1 + RL-2.

``--env math`` runs the ``token`` -> SD -> RL-2 (both rates) part in the env=math study's setting instead.

Resumable: a run with a ``summary.json`` is not made again, one stopped part-way is resumed. ``--report-only``
rebuilds the page from the runs. Means carry 95 % intervals, t over seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml
from scipy import stats

from lrmgym.learners.engine.resume import config_sha256

SETTING = ["env=testbed", "env.max_ops=3", "env.two_digit_share=0.2", "policy.recipe=testbed",
           "policy.sample_dtype=bfloat16"]  # fmt: skip
VARIANTS = {"token": [], "sample": ["learner.rl1.loss_agg=seq_mean_token_mean"],
            "noratio": ["learner.rl1.behavior_logprobs=recompute"]}  # fmt: skip
PROMPTS, GROUP, MAX_NEW = 16, 8, 128
WINDOW_EVERY = 10  # RL-1's window: the longest reference (41 tokens here), doubled every 10 steps up to 128
LOW_LR = 1e-4  # the SD stage's learning rate (the RL stages' preset: 4e-4)
WALL = "benchmark_wall.json"
ARMS = ("token", "sample", "noratio")  # the RL-1 runs the report reads (those not made are left out)


def _cli(argv: list[str]) -> float:
    start = time.perf_counter()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "lrmgym.cli.main", "run", *argv], capture_output=True, text=True,
                          env=env)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"lrmgym run {' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def _stage(stage: str, steps: int, args: argparse.Namespace) -> list[str]:
    k = f"learner.{stage}"
    return [f"{k}.time_budget_s=null", f"{k}.steps=1000000", f"{k}.generation_budget={steps * PROMPTS * GROUP}",
            f"{k}.progress=false", f"{k}.async_rollouts=false", f"{k}.prompts_per_step={PROMPTS}",
            f"{k}.group_size={GROUP}", f"{k}.max_new_tokens={MAX_NEW}", f"{k}.eval_greedy=false",
            f"{k}.torch_threads=1", f"{k}.checkpoint_every=10"]  # fmt: skip


def _common(args: argparse.Namespace) -> list[str]:
    return [*SETTING, f"eval.tasks={args.eval_tasks}", "eval.n=4", f"eval.max_new_tokens={MAX_NEW}",
            f"run.output_dir={args.runs}"]  # fmt: skip


def _walls(folder: Path, key: str, wall: float) -> None:
    walls = json.loads((folder / WALL).read_text()) if (folder / WALL).is_file() else {}
    walls[key] = wall
    (folder / WALL).write_text(json.dumps(walls))


def run_rl1(name: str, seed: int, args: argparse.Namespace) -> Path:
    folder = args.runs / f"{name}-s{seed}"
    if (folder / "summary.json").is_file():
        return folder
    if folder.is_dir():
        _walls(folder, "rl1-resumed", _cli(["--resume", str(folder)]))
        return folder
    argv = [*_common(args), "learner=ring_zero", "learner.stages=[rl1]", f"run.seed={seed}",
            *_stage("rl1", args.rl1_steps, args), f"learner.rl1.window_every_steps={WINDOW_EVERY}", *VARIANTS[name],
            f"run.name={folder.name}"]  # fmt: skip
    _walls(folder, "rl1", _cli(argv))
    return folder


def extend(folder: Path, stages: list[str], args: argparse.Namespace, rl2: dict | None = None) -> None:
    """Resume a run with ``stages`` (learner.stages is a key a resume may change); ``rl2`` overrides RL-2's options."""
    summary = json.loads((folder / "summary.json").read_text())
    if [s["stage"] for s in summary["stages"]] == stages:
        return
    config = yaml.safe_load((folder / "config.yaml").read_text())
    config["learner"]["stages"] = stages
    opts = dict(a.split("=", 1) for a in _stage("rl2", args.rl2_steps, args))
    for key, value in opts.items():
        config["learner"]["rl2"][key.split(".")[-1]] = yaml.safe_load(value)
    config["learner"]["rl2"].update(rl2 or {})
    config["learner"]["sd"].update({"progress": False, "eval_greedy": False})
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    # The stages appended have not run: their options go into the run's record too (run.json, against which a
    # resume checks config.yaml), as if the run had been started with them. RL-1's options are left as they were.
    record = json.loads((folder / "run.json").read_text())
    for stage in ("sd", "rl2"):
        record["config"]["learner"][stage] = {**record["config"]["learner"][stage], **config["learner"][stage]}
    record["config_sha256"] = config_sha256(record["config"])
    (folder / "run.json").write_text(json.dumps(record, indent=1, sort_keys=True, default=str) + "\n")
    _walls(folder, "+".join(stages), _cli(["--resume", str(folder)]))


def pipeline(seed: int, args: argparse.Namespace) -> None:
    """``token`` + SD + RL-2; and a copy made after SD whose RL-2 runs at SD's learning rate (``lowlr``)."""
    folder = args.runs / f"token-s{seed}"
    extend(folder, ["rl1", "sd"], args)
    low = args.runs / f"lowlr-s{seed}"
    if not low.is_dir():
        tmp = args.runs / f".lowlr-s{seed}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(folder, tmp)
        tmp.rename(low)
    extend(folder, ["rl1", "sd", "rl2"], args)
    extend(low, ["rl1", "sd", "rl2"], args, {"lr": LOW_LR})


def run_grpo(seed: int, args: argparse.Namespace) -> Path:
    folder = args.runs / f"grpo-s{seed}"
    if (folder / "summary.json").is_file():
        return folder
    if folder.is_dir():
        _walls(folder, "grpo-resumed", _cli(["--resume", str(folder)]))
        return folder
    steps = args.rl1_steps + args.rl2_steps
    opts = [a.replace("learner.rl1.", "learner.") for a in _stage("rl1", steps, args)]
    _walls(folder, "grpo", _cli([*_common(args), "learner=grpo", f"run.seed={seed}", *opts, f"run.name={folder.name}"]))
    return folder


# --------------------------------------------------------------------------------------------------- reading
def _metrics(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []


def _part(lines: list[dict], key: str, lo: float, hi: float) -> float:
    n = len(lines)
    part = [m.get(key) for m in lines[int(lo * n) : max(int(hi * n), int(lo * n) + 1)]]
    vals = [v for v in part if v is not None]
    return float(np.mean(vals)) if vals else float("nan")


def _acc(entry: dict | None) -> float:
    part = (entry or {}).get("sampled")
    return 100 * part["accuracy"] if part else float("nan")


def _tok(entry: dict | None) -> float:
    part = (entry or {}).get("sampled") or {}
    return part["mean_tokens"] if part.get("mean_tokens") is not None else float("nan")


def _stages(folder: Path) -> dict[str, dict]:
    path = folder / "summary.json"
    if not path.is_file():
        return {}
    return {s["stage"]: s for s in json.loads(path.read_text())["stages"]}


def ci(values: list[float], digits: int = 1) -> str:
    """Mean and its 95 % interval, t over the seeds."""
    vals = [v for v in values if v is not None and not np.isnan(v)]
    if not vals:
        return "-"
    mean = float(np.mean(vals))
    if len(vals) < 2:
        return f"{mean:.{digits}f}"
    half = stats.t.ppf(0.975, len(vals) - 1) * np.std(vals, ddof=1) / np.sqrt(len(vals))
    return f"{mean:.{digits}f} [{mean - half:.{digits}f}, {mean + half:.{digits}f}]"


def _interval(values: list[float]) -> tuple[float, float, float]:
    vals = [v for v in values if not np.isnan(v)]
    mean = float(np.mean(vals))
    half = stats.t.ppf(0.975, len(vals) - 1) * np.std(vals, ddof=1) / np.sqrt(len(vals)) if len(vals) > 1 else np.inf
    return mean, mean - half, mean + half


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def _f(x: float, digits: int = 1) -> str:
    return "-" if x is None or np.isnan(x) else f"{x:.{digits}f}"


def verdict(values: list[float], claim_positive: bool = True) -> str:
    """held / did not hold / not shown, for 'the mean is above 0' (or below 0 when ``claim_positive`` is false)."""
    vals = [v for v in values if not np.isnan(v)]
    if len(vals) < 2:
        return "not measured"
    mean, lo, hi = _interval(vals)
    if (lo > 0) if claim_positive else (hi < 0):
        return "held"
    if (hi < 0) if claim_positive else (lo > 0):
        return "did not hold (the opposite is significant)"
    return "not shown (the interval holds 0)"


# --------------------------------------------------------------------------------------------------- report
def report(args: argparse.Namespace, seeds: list[int], load: str) -> str:
    rl1 = {(v, s): _metrics(args.runs / f"{v}-s{s}" / "stages" / "01-rl1" / "metrics.jsonl")
           for v in ARMS for s in seeds}  # fmt: skip
    st = {(v, s): _stages(args.runs / f"{v}-s{s}") for v in ARMS for s in seeds}
    walls = {}
    for s in seeds:
        for name in [*ARMS, "grpo"]:
            path = args.runs / f"{name}-s{s}" / WALL
            walls[(name, s)] = json.loads(path.read_text()) if path.is_file() else {}
    out = [
        "# Ring-Zero on the reasoning testbed, bf16 sampler"
        if args.env == "testbed"
        else "# Ring-Zero's RL-2 on env=math",
        "",
        f"Reproduce: `python benchmarks/ring_zero_testbed.py --env {args.env} --seeds {','.join(map(str, seeds))} "
        f"--rl1-steps {args.rl1_steps} --rl2-steps {args.rl2_steps} --eval-tasks {args.eval_tasks} --runs RUNS` "
        "(resumable; `--report-only` rebuilds this page). Setting: "
        f"`{' '.join(SETTING)}`, every RL stage {PROMPTS} tasks x {GROUP} samples a step at T=1, "
        f"max_new_tokens {MAX_NEW}, synchronous rollouts, one thread; RL-1 {args.rl1_steps} steps "
        f"({args.rl1_steps * PROMPTS * GROUP} completions), RL-2 {args.rl2_steps} steps, GRPO "
        f"{args.rl1_steps + args.rl2_steps} steps (the pipeline's RL completions). Held-out: {args.eval_tasks} "
        "test-split tasks x 4 samples at T=1 (avg@4, eval seed 0: the same tasks and sampling seeds for every run). "
        f"Means over seeds with 95 % intervals (t over seeds). Load: {load}.",
        "",
    ]

    def col(v: str, fn) -> list[float]:
        return [fn(rl1[(v, s)], st[(v, s)]) for s in seeds if rl1[(v, s)]]

    # 1. token vs sample
    rows, growth = [], {}
    for v in ("token", "sample"):
        for s in seeds:
            m = rl1[(v, s)]
            if not m:
                continue
            early, late = _part(m, "length/mean", 0, 0.2), _part(m, "length/mean", 0.8, 1.0)
            growth.setdefault(v, {})[s] = late - early
            after = st[(v, s)].get("rl1", {}).get("after")
            rows.append([v, str(s), _f(early), _f(late), _f(late - early), _f(_part(m, "window", 0.8, 1.0), 0),
                         _f(_acc(after)), _f(_tok(after))])  # fmt: skip
    out += ["## 1. Token-level vs sample-level loss (RL-1)", "",
            *_table(["loss", "seed", "length first fifth", "length last fifth", "growth", "window last fifth",
                     "held-out after (%)", "held-out tokens"], rows), ""]  # fmt: skip
    both = [s for s in seeds if s in growth.get("token", {}) and s in growth.get("sample", {})]
    diff = [growth["token"][s] - growth["sample"][s] for s in both]
    acc_diff = [_acc(st[("token", s)]["rl1"]["after"]) - _acc(st[("sample", s)]["rl1"]["after"]) for s in both]
    out += [f"Length growth, token-level: {ci([growth['token'][s] for s in both])} tokens; sample-level: "
            f"{ci([growth['sample'][s] for s in both])}; token minus sample, paired by seed: {ci(diff)}. "
            f"Held-out, token minus sample: {ci(acc_diff)} points.",
            f"- The paper's claim that the token-level loss lets length grow more: **{verdict(diff)}**.",
            ""]  # fmt: skip

    # 2. ratio correction on vs off
    rows = []
    keys = [("train_infer/logp_abs_diff", 4), ("train_infer/kl", 6), ("entropy", 3)]
    for v in ("token", "noratio"):
        for s in seeds:
            m = rl1[(v, s)]
            if not m:
                continue
            rew = [x.get("reward/mean") for x in m[len(m) // 2 :] if x.get("reward/mean") is not None]
            after = st[(v, s)].get("rl1", {}).get("after")
            rows.append([v, str(s), *(_f(_part(m, k, 0.8, 1.0), d) for k, d in keys),
                         _f(_part(m, "entropy", 0, 0.2), 3), _f(float(np.std(rew)) if rew else np.nan, 3),
                         _f(max((x.get("ratio_max") or 0) for x in m), 2), _f(100 * _part(m, "clip_frac", 0, 1), 2),
                         _f(100 * _part(m, "accuracy", 0.8, 1.0)), _f(_acc(after))])  # fmt: skip
    out += ["## 2. Ratio correction on vs off (RL-1, bf16 sampler)", "",
            "`noratio` is `learner.rl1.behavior_logprobs=recompute`: the ratio's denominator is the trainer's own "
            "log-prob, so every token's weight is 1 and the bf16 sampler's gap goes uncorrected.", "",
            *_table(["ratio", "seed", "mean abs Δ log p, last fifth", "train/infer k3 last fifth", "entropy last fifth",
                     "entropy first fifth", "reward sd, 2nd half", "max ratio", "capped tokens (%)",
                     "train acc last fifth (%)", "held-out after (%)"], rows), ""]  # fmt: skip
    both = [s for s in seeds if rl1[("token", s)] and rl1[("noratio", s)]]
    d_acc = [_acc(st[("token", s)]["rl1"]["after"]) - _acc(st[("noratio", s)]["rl1"]["after"]) for s in both]
    d_ent = [_part(rl1[("token", s)], "entropy", 0.8, 1) - _part(rl1[("noratio", s)], "entropy", 0.8, 1)
             for s in both]  # fmt: skip
    out += [f"Held-out, corrected minus uncorrected: {ci(d_acc)} points; entropy in the last fifth, corrected minus "
            f"uncorrected: {ci(d_ent, 3)}.",
            f"- The paper's claim that the uncorrected run does worse (it collapses in the paper): "
            f"**{verdict(d_acc)}** (held-out accuracy).", ""]  # fmt: skip

    # 3. the pipeline
    rows, d_sd, d_rl2, d_grpo, d_low, d_low_hi = [], [], [], [], [], []
    diag = []
    for s in seeds:
        by = st[("token", s)]
        gpath = args.runs / f"grpo-s{s}" / "summary.json"
        gsum = json.loads(gpath.read_text()) if gpath.is_file() else None
        if "rl2" not in by:
            continue
        r1, sd, r2 = _acc(by["rl1"]["after"]), _acc(by["sd"]["after"]), _acc(by["rl2"]["after"])
        before = _acc(by["rl1"]["before"])
        ga = _acc(gsum["evals"].get("after")) if gsum else float("nan")
        d_sd.append(sd - r1)
        d_rl2.append(r2 - sd)
        d_grpo.append(r2 - ga)
        low = _stages(args.runs / f"lowlr-s{s}").get("rl2")
        r2_low = _acc(low["after"]) if low else float("nan")
        d_low.append(r2_low - sd)
        d_low_hi.append(r2_low - r2)
        corpus = (by["sd"].get("outputs") or {}).get("corpus") or {}
        wall = sum(v for v in walls[("token", s)].values())
        gwall = sum(v for v in walls[("grpo", s)].values())
        rows.append([str(s), _f(before), _f(r1), _f(sd), _f(r2), _f(r2_low), _f(ga), _f(_tok(by["rl1"]["after"])),
                     _f(_tok(by["sd"]["after"])), _f(_tok(by["rl2"]["after"])), str(corpus.get("kept", "-")),
                     f"{wall:.0f} s / {gwall:.0f} s"])  # fmt: skip
        for arm, name in (("4e-4", "token"), (f"{LOW_LR:g}", "lowlr")):
            m2 = _metrics(args.runs / f"{name}-s{s}" / "stages" / "03-rl2" / "metrics.jsonl")
            if not m2:
                continue
            diag.append(
                [
                    str(s),
                    arm,
                    _f(_part(m2, "entropy", 0, 0.2), 3),
                    _f(_part(m2, "entropy", 0.8, 1), 3),
                    _f(100 * _part(m2, "accuracy", 0, 0.2)),
                    _f(100 * _part(m2, "accuracy", 0.8, 1)),
                    _f(_part(m2, "length/mean", 0, 0.2)),
                    _f(_part(m2, "length/mean", 0.8, 1)),
                    _f(_part(m2, "train_infer/logp_abs_diff", 0, 1), 4),
                    _f(100 * _part(m2, "format_ok_frac", 0, 1)),
                    _f(100 * _part(m2, "all_failed_frac", 0, 1)),
                ]
            )
    out += ["## 3. RL-1 -> SD -> RL-2 against GRPO at the same RL completions", "",
            *_table(["seed", "base (%)", "RL-1 (%)", "SD (%)", "RL-2 (%)", f"RL-2 at lr {LOW_LR:g} (%)", "GRPO (%)",
                     "RL-1 tokens", "SD tokens",
                     "RL-2 tokens", "SD corpus", "wall: pipeline / GRPO"], rows), "",
            f"SD minus RL-1: {ci(d_sd)} points; RL-2 minus SD: {ci(d_rl2)}; RL-2 (the pipeline's end) minus GRPO: "
            f"{ci(d_grpo)}.",
            f"- SD above the RL-1 model it distils: **{verdict(d_sd)}**.",
            f"RL-2 at SD's learning rate ({LOW_LR:g}) minus SD: {ci(d_low)}; minus RL-2 at the preset's 4e-4: "
            f"{ci(d_low_hi)}.",
            f"- RL-2 at or above SD (the paper: RL-2 improves on SD): **{verdict(d_rl2)}**; at lr {LOW_LR:g}: "
            f"**{verdict(d_low)}**.",
            f"- The pipeline above plain GRPO at the same RL completions: **{verdict(d_grpo)}**.", "",
            "RL-2's training (first / last fifth of its steps):", "",
            *_table(["seed", "RL-2 lr", "entropy first", "entropy last", "train acc first (%)", "train acc last (%)",
                     "length first", "length last", "abs Δ log p", "format ok (%)", "all-failed groups (%)"], diag),
            ""]  # fmt: skip
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--rl1-steps", type=int, default=40)
    parser.add_argument("--rl2-steps", type=int, default=20)
    parser.add_argument("--eval-tasks", type=int, default=128)
    parser.add_argument("--runs", type=Path, default=Path("/tmp/ring/runs"))
    parser.add_argument("--report-only", action="store_true", help="only rebuild the page from --runs")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "ring_zero_testbed.md")
    parser.add_argument("--env", choices=["testbed", "math"], default="testbed",
                        help="math: env=math with the tiny default model, RL-1 ('token') -> SD -> RL-2 at both "
                        "learning rates only (the setting of benchmarks/results/ring_zero.md)")  # fmt: skip
    args = parser.parse_args()
    if args.env == "math":  # the env=math study's batch and budget (ring_zero.md), fp32 sampling
        global SETTING, PROMPTS, MAX_NEW, WINDOW_EVERY, VARIANTS
        SETTING, PROMPTS, MAX_NEW, WINDOW_EVERY = ["env=math"], 32, 48, 150
        VARIANTS = {"token": []}
    seeds = [int(s) for s in args.seeds.split(",") if s]
    args.runs.mkdir(parents=True, exist_ok=True)
    load_path = args.runs / "load.txt"
    if not args.report_only:
        with load_path.open("a") as f:
            f.write(f"{time.strftime('%H:%M:%S', time.gmtime())} {os.getloadavg()[0]:.2f}\n")
        for seed in seeds:
            for name in VARIANTS:
                start = time.perf_counter()
                run_rl1(name, seed, args)
                print(f"{name:8} seed {seed}: {time.perf_counter() - start:.0f} s", flush=True)
            start = time.perf_counter()
            pipeline(seed, args)
            if args.env == "testbed":
                run_grpo(seed, args)
            print(f"pipeline+grpo seed {seed}: {time.perf_counter() - start:.0f} s", flush=True)
            with load_path.open("a") as f:
                f.write(f"{time.strftime('%H:%M:%S', time.gmtime())} {os.getloadavg()[0]:.2f}\n")
    loads = load_path.read_text().split() if load_path.is_file() else []
    load = "1-min load average at the start and after each seed: " + ", ".join(
        f"{loads[i]} {loads[i + 1]}" for i in range(0, len(loads) - 1, 2)
    )
    text = report(args, seeds, load)
    args.out.write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
