"""SIGKILL a training run at random moments, resume it each time, and check that nothing was lost or repeated.

Run: ``python benchmarks/fault_injection.py [--kills 20] [--seed 0] [--out benchmarks/results/fault_injection.md]``.

One ``lrmgym run env=math learner=grpo`` on the shipped tiny model (small steps, a checkpoint every step, a
held-out evaluation before and after) is killed with SIGKILL ``--kills`` times and resumed with ``lrmgym run
--resume`` after each. The moments are spread over the run's timeline: each kill has a random target step (0 is
start-up and the "before" evaluation, the last is the "after" evaluation), and lands a random delay after the
run reaches it (or, when the run is already past it, while the resumed process starts up), so kills hit
start-up, the evaluations, rollouts, updates and checkpoint writes.
With ``--async`` (the preset's async rollouts), every third kill hits the rollout worker instead of the trainer.
After every kill the newest checkpoint must load; after the last resume the run must have finished with every
step in ``metrics.jsonl`` exactly once, and (synchronous runs) the final weights must equal those of the same
run uninterrupted, bit for bit. Where each kill landed is read from the run directory at the moment of the kill.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

STEPS = 24


def _argv(run_dir: Path, resume: bool, use_async: bool) -> list[str]:
    if resume:
        return [sys.executable, "-m", "lrmgym.cli.main", "run", "--resume", str(run_dir)]
    return [
        sys.executable, "-m", "lrmgym.cli.main", "run", "env=math", "learner=grpo", f"learner.steps={STEPS}",
        "learner.time_budget_s=null", "learner.prompts_per_step=8", "learner.group_size=4",
        "learner.checkpoint_every=1", f"learner.async_rollouts={str(use_async).lower()}", "learner.progress=false",
        "eval.tasks=24",
        f"run.output_dir={run_dir.parent}", f"run.name={run_dir.name}",
    ]  # fmt: skip


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _phase(run_dir: Path, stdout: Path, lines_at_start: int) -> str:
    """What the run was doing, as far as its directory and its output tell."""
    ckpt = run_dir / "checkpoints"
    if ckpt.is_dir() and any(p.name.endswith(".tmp") for p in ckpt.iterdir()):
        return "checkpoint write"
    if "run directory:" not in (stdout.read_text() if stdout.exists() else ""):
        return "start-up (build, load)"
    lines = _lines(run_dir / "metrics.jsonl")
    if lines == 0:
        return "before-eval" if not (run_dir / "eval" / "step_0_greedy" / "eval.json").exists() else "first step"
    if lines >= STEPS:
        return "after-eval / finish"
    if lines == lines_at_start:
        return f"training (step {lines + 1}, the first after resume)"
    return f"training (step {lines + 1})"


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _rollout_worker(pid: int) -> int | None:
    """The trainer's rollout worker: its child that runs a spawned interpreter and holds the most memory (the
    model's copy), not multiprocessing's resource tracker (killing that one would only test the tracker)."""
    best, best_rss = None, -1
    for child in _children(pid):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
            rss = int(Path(f"/proc/{child}/statm").read_text().split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if b"resource_tracker" in cmdline or b"spawn_main" not in cmdline:
            continue
        if rss > best_rss:
            best, best_rss = child, rss
    return best


def _final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    ckpt = run_dir / "checkpoints"
    newest = sorted(p for p in ckpt.iterdir() if p.name.startswith("step_") and p.suffix == ".pt")[-1]
    return torch.load(newest, map_location="cpu", weights_only=False)["model"]


def _steps(run_dir: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def run(kills: int, seed: int, use_async: bool, root: Path) -> dict:
    rng = np.random.default_rng(seed)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    reference, victim = root / "reference", root / "victim"
    start = time.perf_counter()
    done = subprocess.run(_argv(reference, False, use_async), capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    full_s = time.perf_counter() - start
    # The kill moments, spread over the run's timeline: a target step each (0: start-up and the "before"
    # evaluation; STEPS: the "after" evaluation and the end), sorted so that the run moves on between kills, plus
    # a random delay once the target is reached (within about one step, or within start-up).
    step_s = full_s / (STEPS + 8)  # the evaluations and the start take about 8 steps' time
    # Distinct targets while there are enough steps: a repeated one finds the run already there, and its kill
    # lands in the resumed process's start-up instead of in training.
    distinct = kills <= STEPS + 1
    targets = sorted(int(t) for t in rng.choice(STEPS + 1, size=kills, replace=not distinct))
    events, resume, workers_seen = [], False, set()
    for k, target in enumerate(targets):
        if not resume and victim.is_dir():  # killed between making the folder and writing its config.yaml
            shutil.rmtree(victim)
        stdout, lines_at_start = root / f"attempt{k + 1}.out", _lines(victim / "metrics.jsonl")
        started = time.perf_counter()
        with open(stdout, "w") as sink:
            proc = subprocess.Popen(
                _argv(victim, resume, use_async), stdout=sink, stderr=subprocess.PIPE, text=True, env=env
            )
        if target > lines_at_start:
            while _lines(victim / "metrics.jsonl") < target and proc.poll() is None:
                time.sleep(0.01)
            extra = float(rng.uniform(0.0, 1.5 * step_s))
        else:  # the run is already past this step: kill it while it starts up (or right after)
            extra = float(rng.uniform(0.2, 6 * step_s))
        deadline = time.perf_counter() + extra
        while time.perf_counter() < deadline and proc.poll() is None:
            time.sleep(0.01)
        delay = time.perf_counter() - started
        if proc.poll() is not None:  # finished (or failed) before the kill: a failure is a finding
            out, err = proc.communicate()
            events.append({"kill": k + 1, "delay_s": delay, "phase": "ended first", "rc": proc.returncode})
            if proc.returncode != 0:
                events[-1]["error"] = err.strip().splitlines()[-1] if err.strip() else "?"
            resume = True
            if proc.returncode == 0:
                break
            continue
        target, who = proc.pid, "trainer"
        workers = _children(proc.pid)
        workers_seen.update(workers)
        worker = _rollout_worker(proc.pid) if use_async and k % 3 == 2 else None
        if worker is not None:
            target, who = worker, "rollout worker"
        phase = _phase(victim, stdout, lines_at_start)
        os.kill(target, signal.SIGKILL)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        event = {"kill": k + 1, "delay_s": delay, "phase": phase, "who": who, "rc": proc.returncode}
        if who != "trainer":  # the trainer must notice and stop with a clear message
            event["trainer_said"] = err.strip().splitlines()[-1][:160] if err.strip() else ""
        state = None
        if (victim / "checkpoints").is_dir() and any((victim / "checkpoints").glob("step_*.pt")):
            state = torch.load(sorted((victim / "checkpoints").glob("step_*.pt"))[-1], weights_only=False)
        event["checkpoint_step"] = None if state is None else state["step"]
        events.append(event)
        resume = (victim / "config.yaml").exists()
    final = subprocess.run(_argv(victim, resume, use_async), capture_output=True, text=True, env=env)
    time.sleep(2)  # a worker whose trainer was killed exits when it sees its pipe close
    summary = json.loads((victim / "summary.json").read_text())
    steps = _steps(victim)
    result = {
        "async": use_async,
        "kills": len([e for e in events if e["phase"] != "ended first"]),
        "events": events,
        "final_rc": final.returncode,
        "status": summary["status"],
        "steps_logged_once": steps == list(range(1, STEPS + 1)),
        "uninterrupted_s": full_s,
        "leaked_workers": sorted(pid for pid in workers_seen if Path(f"/proc/{pid}").exists()),
    }
    a, b = _final_weights(reference), _final_weights(victim)
    result["same_final_weights"] = all(torch.equal(a[k], b[k]) for k in a)
    result["max_weight_diff"] = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    return result


def report(results: list[dict], kills: int, seed: int) -> str:
    rows = []
    for r in results:
        phases: dict[str, int] = {}
        for e in r["events"]:
            key = e["phase"].split(" (")[0] + (" [worker]" if e.get("who") == "rollout worker" else "")
            phases[key] = phases.get(key, 0) + 1
        rows.append(
            f"| {'async' if r['async'] else 'sync'} | {r['kills']} | "
            + ", ".join(f"{k}: {v}" for k, v in sorted(phases.items()))
            + f" | {r['status']} (rc {r['final_rc']}) | {'yes' if r['steps_logged_once'] else 'NO'} | "
            f"{'yes' if r['same_final_weights'] else 'no'} (max diff {r['max_weight_diff']:.2e}) | "
            f"{len(r['leaked_workers'])} | {r['uninterrupted_s']:.0f} s |"
        )
    detail = []
    for r in results:
        for e in r["events"]:
            said = f" trainer said: {e['trainer_said']}" if e.get("trainer_said") else ""
            detail.append(
                f"| {'async' if r['async'] else 'sync'} | {e['kill']} | {e['delay_s']:.1f} | {e['phase']} | "
                f"{e.get('who', '-')} | {e.get('checkpoint_step', '-')} | {e['rc']}{said} |"
            )
    return "\n".join([
        "# Fault injection: SIGKILL at random moments, then resume",
        "",
        f"`python benchmarks/fault_injection.py --kills {kills} --seed {seed}` (and `--async`): one {STEPS}-step run "
        "of `lrmgym run env=math learner=grpo` (tiny model, 8 tasks x 4, a checkpoint every step, 24-task "
        "evaluation before and after), killed with SIGKILL at moments spread over its timeline (a random target "
        "step, then a random delay) and resumed each time.",
        "",
        "| rollouts | kills | where they landed | final | every step logged once | same final weights as "
        "uninterrupted | workers left alive | uninterrupted run |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "| rollouts | kill | after (s) | phase | killed | newest checkpoint after | exit code |",
        "|---|---|---|---|---|---|---|",
        *detail,
        "",
    ])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", default="sync,async", help="sync, async or both (comma-separated)")
    parser.add_argument("--root", type=Path, default=Path("runs/fault_injection"))
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "fault_injection.md")
    args = parser.parse_args()
    results = []
    for mode in args.modes.split(","):
        root = args.root / f"{mode}-{int(time.time())}"
        root.mkdir(parents=True)
        results.append(run(args.kills, args.seed, mode == "async", root))
        print(json.dumps({k: v for k, v in results[-1].items() if k != "events"}), flush=True)
    text = report(results, args.kills, args.seed)
    args.out.write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
