"""ReasonMaxxer on the reasoning testbed's style fork: GRPO's curve, equal work, the gate, the oracle, KL-LoRA.

Run: ``python benchmarks/reason_maxxer_testbed.py [--seeds 0,1,2,3,4] [--runs /tmp/rmx/runs]
[--out benchmarks/results/reason_maxxer_testbed.md] [--report-only]``. Resumable: a run whose ``summary.json``
(or an analysis whose ``shift.json``) exists is reused; ``--report-only`` writes the page from what exists.

Setting (``SETTING``): ``env=testbed policy.recipe=testbed env.max_ops=3 env.two_digit_share=0``, one-digit chains
of 1-3 operations, where stepwise work pays (forced: 15.4 against 2.2 % at 2 operations, 7.4 against 0.7 % at 3,
``results/testbed.md``), 27 % of GRPO groups start all wrong and the style fork after ``<think>`` ('Let' stepwise,
'So' direct) is a real choice. Held-out: 128 test-split tasks, T=1 avg@4 and greedy, 96 new tokens at most.

Per seed, each a fresh ``lrmgym run`` process on one thread:

- ``grpo``: the ``learner=grpo`` preset for 150 steps (32 prompts x 8), synchronous rollouts (one process),
  evaluated every 30 steps: GRPO's held-out gain as a function of its work (the curve);
- ``reason_maxxer``: the ``learner=reason_maxxer`` preset (2 048 problems x 8 rollouts of the frozen base, tau
  calibrated to gate 4 % of completion tokens, rank-8 LoRA), its gain compared with GRPO's curve at the same work;
- ``kl_distill``: ``learner=kl_distill`` with that seed's GRPO run as the teacher (``KLD``: the paper's recipe,
  rank 8 as the paper's compressed variant and the data sized for 20-token rollouts);
- ``lrmgym analyze shift --base <the testbed model> --rl <the GRPO run>`` with ``--gate-tau`` at ``TAUS``: the
  oracle and the entropy-gated intervention with the GRPO model as teacher.

Work, as ``results/reason_maxxer_vs_grpo.md`` counts it: generated tokens + forward tokens (with and without
gradient: updates, recomputed log-probs, reference, the base's KL anchor, entropy or teacher scoring) + 2 x backward
tokens. GRPO's work at an evaluation is the sum over the steps before it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SETTING = ["env=testbed", "policy.recipe=testbed", "env.max_ops=3", "env.two_digit_share=0", "eval.tasks=128",
           "eval.max_new_tokens=96"]  # fmt: skip
GRPO = ["learner=grpo", "learner.steps=150", "learner.max_new_tokens=96", "learner.async_rollouts=false",
        "learner.eval_every=30", "learner.checkpoint_every=30", "learner.keep_checkpoints=10"]  # fmt: skip
RM = ["learner=reason_maxxer", "learner.max_new_tokens=96"]
KLD = ["learner=kl_distill", "learner.max_new_tokens=96", "learner.lora_r=8", "learner.lora_alpha=16",
       "learner.problems=1024", "learner.lr=1e-3"]  # fmt: skip
TAUS = [0.3, 0.6, 1.0, 1.2, 1.4, 1.8]
WALL = "benchmark_wall.json"
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
THINK = "<think>"


# --------------------------------------------------------------------------------------------------- running
def _process(argv: list[str], what: str) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run(["nice", "-n", "5", sys.executable, "-m", "lrmgym.cli.main", *argv], capture_output=True,
                          text=True, env=env)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}):\n{done.stderr[-3000:]}")


def run(name: str, seed: int, argv: list[str], runs: Path) -> Path:
    """One ``lrmgym run`` into ``runs/<name>-s<seed>`` (kept when it finished before; resumed when it did not)."""
    folder = runs / f"{name}-s{seed}"
    if (folder / "summary.json").is_file():
        return folder
    cmd = ["--resume", str(folder)] if folder.is_dir() else [
        *SETTING, *argv, f"run.seed={seed}", "learner.progress=false", f"run.output_dir={runs}",
        f"run.name={folder.name}",
    ]  # fmt: skip
    start = time.perf_counter()
    _process(["run", *cmd], folder.name)
    (folder / WALL).write_text(json.dumps({"wall_s": time.perf_counter() - start}))
    return folder


def base_model_folder() -> Path:
    """The testbed model's folder (``lrmgym tiny build --recipe testbed``), the base of every arm."""
    from lrmgym.configs.resolve import resolve

    return resolve(["policy.recipe=testbed"]).policy.cache_dir()


def shift(seed: int, runs: Path) -> Path:
    """``lrmgym analyze shift`` of the seed's GRPO run against the base, with the gates; its ``shift.json``."""
    out = runs / f"shift-s{seed}"
    if not (out / "shift.json").is_file():
        gates = [x for tau in TAUS for x in ("--gate-tau", str(tau))]
        _process(["analyze", "shift", "--base", str(base_model_folder()), "--rl", str(runs / f"grpo-s{seed}"),
                  "--tasks", "128", "--max-new-tokens", "96", *gates, "--out", str(out), "--force",
                  *SETTING[:4]], out.name)  # fmt: skip
    return out / "shift.json"


# --------------------------------------------------------------------------------------------------- facts
def _work(line: dict) -> int:
    fwd = sum(line.get(k) or 0 for k in ("compute/forward_tokens", "compute/nograd_forward_tokens",
                                         "compute/base_forward_tokens", "compute/scoring_tokens"))  # fmt: skip
    return int((line.get("compute/generated_tokens") or 0) + fwd + 2 * (line.get("compute/backward_tokens") or 0))


def _style(samples: Path) -> float | None:
    """Share of the evaluation's completions in the stepwise style ('<think>Let'), among the two styles."""
    if not samples.is_file():
        return None
    texts = [json.loads(x)["completion"] for x in samples.read_text().splitlines()]
    let = sum(t.startswith(f"{THINK}Let") for t in texts)
    so = sum(t.startswith(f"{THINK}So") for t in texts)
    return let / (let + so) if let + so else None


def facts(folder: Path) -> dict:
    """Evaluations by step (with the work done before each), the style share, total work and wall of one run."""
    summary = json.loads((folder / "summary.json").read_text())
    lines = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    cumulative, total = {0: 0}, 0
    for line in lines:
        total += _work(line)
        cumulative[line["step"]] = total
    points = []
    for key, ev in summary["evals"].items():
        tag = "step_0" if key == "before" else f"step_{ev['step']}"
        points.append({
            "step": ev["step"], "work": cumulative.get(ev["step"], total), "greedy": ev["greedy"]["accuracy"],
            "sampled": ev["sampled"]["accuracy"], "stepwise": _style(folder / "eval" / tag / "samples.jsonl"),
        })  # fmt: skip
    points.sort(key=lambda p: p["step"])
    wall = json.loads((folder / WALL).read_text())["wall_s"] if (folder / WALL).is_file() else None
    return {"points": points, "work": total, "wall_s": wall, "train_s": summary["train_wall_s"],
            "steps": summary["steps"], "summary": summary}  # fmt: skip


def rm_gate(folder: Path) -> dict:
    """What ReasonMaxxer's gate selected: the share of its decision tokens at the style fork, and of digits."""
    import torch

    data = folder / "reason_maxxer"
    state = torch.load(data / "selection.pt", map_location="cpu", weights_only=False)
    rollouts = [json.loads(x) for x in (data / "rollouts.jsonl").read_text().splitlines()]
    tok = _tokenizer()
    think = tok.convert_tokens_to_ids(THINK)
    gated = at_fork = forks = digits = 0
    for row, entropy in zip(state["selection"]["rows"], state["entropies"], strict=True):
        ids = rollouts[row]["token_ids"]
        where = set((entropy > state["tau"]).nonzero().flatten().tolist())
        fork = ids.index(think) + 1 if think in ids[:-1] else None
        gated += len(where)
        digits += sum(tok.decode([ids[j]]).strip().isdigit() for j in where)
        if fork is not None:
            forks += 1
            at_fork += fork in where
    return {
        "tau": float(state["tau"]), "gated": gated, "fork_share_of_gated": at_fork / gated if gated else None,
        "digit_share_of_gated": digits / gated if gated else None, "forks_gated": at_fork / forks if forks else None,
        "fork_entropy": _fork_entropy(state, rollouts, tok),
    }  # fmt: skip


def _fork_entropy(state: dict, rollouts: list[dict], tok) -> float | None:
    think = tok.convert_tokens_to_ids(THINK)
    values = []
    for row, entropy in zip(state["selection"]["rows"], state["entropies"], strict=True):
        ids = rollouts[row]["token_ids"]
        if think in ids[:-1]:
            values.append(float(entropy[ids.index(think) + 1]))
    return float(np.mean(values)) if values else None


_TOK = None


def _tokenizer():
    global _TOK
    if _TOK is None:
        from transformers import AutoTokenizer

        _TOK = AutoTokenizer.from_pretrained(str(base_model_folder()))
    return _TOK


def shift_facts(path: Path) -> dict:
    """The oracle and each gate of one ``shift.json``, with the share of gated tokens at the fork (index 1)."""
    report = json.loads(path.read_text())
    out = {"base": report["accuracy"]["base"], "rl": report["accuracy"]["rl"], "oracle": report["accuracy"]["oracle"],
           "oracle_edit_rate": report["oracle_edit_rate"], "reranked": report["rates"]["reranked"],
           "shifted": report["rates"]["shifted"], "gates": {}}  # fmt: skip
    for gate in report["gated"]:
        name = f"gated@{gate['tau']!r}"
        gated = at_fork = 0
        for task in report["tasks"]:
            where = task[name]["gated"]
            gated += len(where)
            at_fork += 1 in where and task[name]["text"].startswith(THINK)
        out["gates"][gate["tau"]] = {**gate, "fork_share_of_gated": at_fork / gated if gated else None,
                                     "fork_gated_tasks": at_fork / len(report["tasks"])}  # fmt: skip
    return out


# --------------------------------------------------------------------------------------------------- statistics
def ci(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % t interval over seeds."""
    v = np.asarray([x for x in values if x is not None], dtype=float)
    if len(v) < 2:
        return (float(v.mean()) if len(v) else math.nan), math.nan
    return float(v.mean()), T975[len(v) - 1] * float(v.std(ddof=1)) / math.sqrt(len(v))


def fmt(values: list[float], scale: float = 100.0, sign: bool = False) -> str:
    m, h = ci(values)
    if math.isnan(m):
        return "-"
    head = f"{scale * m:+.1f}" if sign else f"{scale * m:.1f}"
    return head if math.isnan(h) else f"{head} ± {scale * h:.1f}"


def interp(points: list[dict], work: float, key: str) -> float:
    """GRPO's accuracy at ``work`` by linear interpolation of its curve (its last point beyond the curve)."""
    xs = [p["work"] for p in points]
    ys = [p[key] for p in points]
    return float(np.interp(work, xs, ys))


# --------------------------------------------------------------------------------------------------- the page
def report(seeds: list[int], runs: Path, load: tuple) -> str:
    grpo = {s: facts(runs / f"grpo-s{s}") for s in seeds if (runs / f"grpo-s{s}" / "summary.json").is_file()}
    arms = {name: {s: facts(runs / f"{name}-s{s}") for s in seeds if (runs / f"{name}-s{s}" / "summary.json").is_file()}
            for name in ("reason_maxxer", "kl_distill")}  # fmt: skip
    shifts = {s: shift_facts(runs / f"shift-s{s}" / "shift.json") for s in seeds
              if (runs / f"shift-s{s}" / "shift.json").is_file()}  # fmt: skip
    lines = [
        "# ReasonMaxxer on the reasoning testbed's style fork (issue 38 item 3)",
        "",
        f"`python benchmarks/reason_maxxer_testbed.py --seeds {','.join(map(str, seeds))} --runs {runs}`; "
        f"load average when the page was written: {load}. Seeds (`run.seed`): {sorted(grpo)}. Means over seeds "
        "with 95 % t intervals (t over seeds); accuracies in %, gains in points.",
        "",
        "Setting: `"
        + " ".join(SETTING)
        + "`; GRPO: `"
        + " ".join(GRPO)
        + "`; ReasonMaxxer: `"
        + " ".join(RM)
        + "`; KL-LoRA: `"
        + " ".join(KLD)
        + " learner.teacher=<that seed's GRPO run>`.",
        "",
    ]
    if not grpo:
        return "\n".join([*lines, "No finished GRPO run yet.", ""])
    steps = [p["step"] for p in next(iter(grpo.values()))["points"]]
    lines += ["## GRPO's curve (held-out accuracy against work)", "",
              "| step | work (tokens) | greedy | greedy gain | T=1 avg@4 | T=1 gain | stepwise share (T=1) |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    for i, step in enumerate(steps):
        pts = [g["points"][i] for g in grpo.values()]
        first = [g["points"][0] for g in grpo.values()]
        lines.append(
            f"| {step} | {np.mean([p['work'] for p in pts]):.3g} | {fmt([p['greedy'] for p in pts])} | "
            f"{fmt([p['greedy'] - f['greedy'] for p, f in zip(pts, first, strict=True)], sign=True)} | "
            f"{fmt([p['sampled'] for p in pts])} | "
            f"{fmt([p['sampled'] - f['sampled'] for p, f in zip(pts, first, strict=True)], sign=True)} | "
            f"{fmt([p['stepwise'] for p in pts])} |"
        )
    final_work = np.mean([g["work"] for g in grpo.values()])
    lines += ["", "## ReasonMaxxer and KL-LoRA against GRPO at equal work", "",
              "GRPO at equal work: that seed's GRPO curve interpolated linearly at the arm's own work. Share "
              "recovered: the arm's mean gain over GRPO's mean gain at that work (ratio of means).", "",
              "| arm | work (tokens) | share of GRPO's 150-step work | greedy gain | GRPO's greedy gain at that work "
              "| share of it | T=1 gain | GRPO's T=1 gain at that work | share of it | stepwise share before -> after "
              "(T=1) | train time | wall |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, by_seed in [("grpo (150 steps)", grpo), *arms.items()]:
        if not by_seed:
            continue
        row = [name, f"{np.mean([f['work'] for f in by_seed.values()]):.3g}",
               f"{100 * np.mean([f['work'] for f in by_seed.values()]) / final_work:.1f} %"]  # fmt: skip
        for key in ("greedy", "sampled"):
            gain = [f["points"][-1][key] - f["points"][0][key] for f in by_seed.values()]
            at = [interp(grpo[s]["points"], f["work"], key) - grpo[s]["points"][0][key]
                  for s, f in by_seed.items() if s in grpo]  # fmt: skip
            share = np.mean(gain) / np.mean(at) if at and np.mean(at) else math.nan
            row += [fmt(gain, sign=True), fmt(at, sign=True), f"{100 * share:.0f} %"]
        before = fmt([f["points"][0]["stepwise"] for f in by_seed.values()])
        after = fmt([f["points"][-1]["stepwise"] for f in by_seed.values()])
        row += [f"{before} -> {after}", f"{np.mean([f['train_s'] for f in by_seed.values()]):.0f} s",
                f"{np.mean([f['wall_s'] or math.nan for f in by_seed.values()]):.0f} s"]  # fmt: skip
        lines.append("| " + " | ".join(row) + " |")
    if arms["reason_maxxer"]:
        gates = [rm_gate(runs / f"reason_maxxer-s{s}") for s in arms["reason_maxxer"]]
        lines += ["", "## What ReasonMaxxer's gate selects here", "",
                  "Over the rollouts it trains on (teacher-forced base entropy, tau calibrated to gate 4 % of "
                  "completion tokens); the fork is the token after `<think>`.", "",
                  f"- tau: {fmt([g['tau'] for g in gates], scale=1)} nats; gated tokens per run "
                  f"{np.mean([g['gated'] for g in gates]):.0f}",
                  "- share of gated tokens that are the fork token: "
                  f"{fmt([g['fork_share_of_gated'] for g in gates])} %",
                  f"- share of gated tokens that are digits: {fmt([g['digit_share_of_gated'] for g in gates])} %",
                  f"- share of fork positions that are gated: {fmt([g['forks_gated'] for g in gates])} %",
                  f"- mean base entropy at the fork on these rollouts: {fmt([g['fork_entropy'] for g in gates], 1)} "
                  "nats"]  # fmt: skip
    if shifts:
        lines += ["", "## The oracle and the entropy-gated intervention (GRPO's 150-step model as the teacher)", "",
                  "`lrmgym analyze shift` on the 128 held-out tasks, greedy. gated@tau: the base decodes and takes "
                  "the teacher's argmax wherever the base's own entropy exceeds tau (no teacher information about "
                  "where).", "",
                  f"Base {fmt([x['base'] for x in shifts.values()])}, teacher (GRPO) "
                  f"{fmt([x['rl'] for x in shifts.values()])}, oracle (the teacher's token at reranked positions) "
                  f"{fmt([x['oracle'] for x in shifts.values()])} editing "
                  f"{fmt([x['oracle_edit_rate'] for x in shifts.values()], sign=False)} % of tokens; reranked "
                  f"{fmt([x['reranked'] for x in shifts.values()])} %, shifted "
                  f"{fmt([x['shifted'] for x in shifts.values()], scale=100)} % of the base's positions.", "",
                  "| tau (nats) | accuracy | teacher's | share of the teacher's gain | tokens gated | tokens edited | "
                  "= teacher's greedy decode | share of gated tokens at the fork | tasks with the fork gated |",
                  "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for tau in TAUS:
            g = [x["gates"][tau] for x in shifts.values() if tau in x["gates"]]
            gain = [x["gates"][tau]["accuracy"] - x["base"] for x in shifts.values()]
            teacher_gain = [x["rl"] - x["base"] for x in shifts.values()]
            share = np.mean(gain) / np.mean(teacher_gain) if np.mean(teacher_gain) else math.nan
            lines.append(
                f"| {tau} | {fmt([x['accuracy'] for x in g])} | {fmt([x['rl'] for x in shifts.values()])} | "
                f"{100 * share:.0f} % | {fmt([x['gated_rate'] for x in g])} % | {fmt([x['edit_rate'] for x in g])} % "
                f"| {fmt([x['matches_rl'] for x in g])} % | {fmt([x['fork_share_of_gated'] for x in g])} % | "
                f"{fmt([x['fork_gated_tasks'] for x in g])} % |"
            )
    if arms["kl_distill"]:
        kd = arms["kl_distill"]
        reports = [json.loads((runs / f"kl_distill-s{s}" / "kl_distill" / "report.json").read_text()) for s in kd]
        lines += ["", "## KL-LoRA distillation of the GRPO teacher", "",
                  f"LoRA parameters: {reports[0]['trainable_params']} ({100 * reports[0]['lora_param_share']:.2f} % of "
                  f"the base's {reports[0]['base_params']}); {reports[0]['rollouts_trained']} teacher rollouts, "
                  f"top-{reports[0]['top_k']} cached, {reports[0]['steps']} steps.", "",
                  "| metric | base | teacher (GRPO 150 steps) | distilled | share of the teacher's gain |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for key, label in (("greedy", "greedy"), ("sampled", "T=1 avg@4")):
            base = [kd[s]["points"][0][key] for s in kd]
            teacher = [grpo[s]["points"][-1][key] for s in kd if s in grpo]
            after = [kd[s]["points"][-1][key] for s in kd]
            share = (np.mean(after) - np.mean(base)) / (np.mean(teacher) - np.mean(base))
            lines.append(f"| {label} | {fmt(base)} | {fmt(teacher)} | {fmt(after)} | {100 * share:.0f} % |")
    lines += ["", "## Per seed", "", "| arm | seed | greedy before -> after | T=1 before -> after | work | steps |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for name, by_seed in [("grpo", grpo), *arms.items()]:
        for s, f in by_seed.items():
            a, b = f["points"][0], f["points"][-1]
            lines.append(
                f"| {name} | {s} | {100 * a['greedy']:.1f} -> {100 * b['greedy']:.1f} | "
                f"{100 * a['sampled']:.1f} -> {100 * b['sampled']:.1f} | {f['work']} | {f['steps']} |"
            )
    for s, x in shifts.items():
        gates = ", ".join(f"{t}: {100 * g['accuracy']:.1f}" for t, g in x["gates"].items())
        lines.append(f"| shift | {s} | base {100 * x['base']:.1f}, teacher {100 * x['rl']:.1f}, oracle "
                     f"{100 * x['oracle']:.1f}; gated {gates} | | | |")  # fmt: skip
    return "\n".join([*lines, ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--runs", type=Path, default=Path("/tmp/rmx/runs"))
    parser.add_argument("--arms", default="grpo,reason_maxxer,shift,kl_distill")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "reason_maxxer_testbed.md")
    parser.add_argument("--report-only", action="store_true", help="write the page from the finished runs only")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s]
    arms = [a for a in args.arms.split(",") if a]
    args.runs.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        for name in arms:  # arm by arm over the seeds: every teacher exists before the arms that need one
            for seed in seeds:
                print(f"{time.strftime('%H:%M:%S')} {name} seed {seed}", flush=True)
                if name == "grpo":
                    run("grpo", seed, GRPO, args.runs)
                elif name == "reason_maxxer":
                    run("reason_maxxer", seed, RM, args.runs)
                elif name == "kl_distill":
                    run("kl_distill", seed, [*KLD, f"learner.teacher={args.runs / f'grpo-s{seed}'}"], args.runs)
                elif name == "shift":
                    shift(seed, args.runs)
    load = tuple(round(x, 2) for x in os.getloadavg())
    text = report(seeds, args.runs, load)
    args.out.write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
