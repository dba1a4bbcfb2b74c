"""``lrmgym serve`` under load on localhost, against scoring the same inputs with ``lrmgym judge`` in-process.

The server (a subprocess: ``lrmgym serve env=math judge=[accuracy,format_strict] --port 0``) gets ``--requests``
requests from ``--clients`` concurrent clients, one sample per request as OpenRLHF 0.11.2 sends them
(``{"query": [prompt + completion + EOS], "prompts": [prompt], "labels": [label]}``, the labels of
``write_data``). ``--hostile`` of the completions (5 %) are the math-verifier cases of the adversarial battery
(``$LRMGYM_SHARED_DATA/adversarial/cases.json``: power towers, a 5 MB response, 100 000-term sums, NUL and bidi
junk, ...), inside ``<answer>`` tags and bare; the rest are worked solutions, wrong answers and format failures.
The benchmark is skipped (exit 0, with the reason) when the battery is absent.

Checked: no failed request (every status 200), every reward equal to ``lrmgym judge``'s
(:func:`lrmgym.judges.scoring.judge_file`) on the same inputs, and no process of the server left after SIGTERM.
Reported: latency p50 / p90 / p99 / max, throughput, and the ratio of the server's throughput to
``judge_file``'s on the same inputs in this run (the baseline pays no HTTP, JSON or label decoding, and grades
each task's completions as one group). The machine's load (``uptime``) is recorded before and after, since
other work may share the CPU. Run from the repository root::

    OMP_NUM_THREADS=1 python benchmarks/serve.py --out benchmarks/results/serve.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from lrmgym.configs.resolve import resolve
from lrmgym.integrations.labels import World, decode_label, write_data
from lrmgym.judges.scoring import judge_file
from lrmgym.testing import adversarial
from lrmgym.testing.procs import alive, descendants

REPO = Path(__file__).resolve().parents[1]
TOKENS = ["env=math", "judge=[accuracy,format_strict]"]


# --------------------------------------------------------------------------------------------------- inputs
def battery() -> list[str] | None:
    """The math-verifier completions of the adversarial battery (decoded), or None when it is absent."""
    cases = adversarial.cases("math_verifier")
    if cases is None:
        return None
    preds = [c["input"]["pred"] for c in cases]
    return [f"<think>x</think><answer>{p}</answer>" for p in preds] + preds


def make_inputs(cfg: Any, folder: Path, requests: int, hostile_share: float, hostile: list[str]) -> list[dict]:
    """``requests`` samples: the task rows of write_data and a completion each (every 1/share-th a hostile one)."""
    tasks = max(1, requests // 8)
    data = write_data(cfg, folder, tasks, 0)
    rows = [json.loads(line) for line in data["train"].read_text().splitlines()]
    first = decode_label(rows[0]["label"])
    world = World(first.env)
    every = round(1 / hostile_share) if hostile_share > 0 else 0
    samples = []
    for i in range(requests):
        row = rows[i % len(rows)]
        label = decode_label(row["label"])
        task = world.task(label.index, label.seed)
        if every and i % every == every - 1:
            text = hostile[(i // every) % len(hostile)]
        else:
            text = [task.metadata["solution"], "<think>3*3=10</think><answer>10</answer>", "I think it is 7.",
                    f"<think>ok</think><answer>{task.answer}</answer> trailing"][i % 4]  # fmt: skip
        samples.append({"task": task, "prompt": row["prompt"], "label": row["label"], "text": text,
                        "hostile": bool(every and i % every == every - 1)})  # fmt: skip
    world.close()
    return samples


# --------------------------------------------------------------------------------------------------- baseline
def judge_baseline(cfg: Any, samples: list[dict], folder: Path) -> tuple[list[float], float]:
    """Rewards and seconds of ``lrmgym judge`` (judge_file) on the same (task, completion) pairs."""
    lines = []
    for s in samples:
        t = s["task"]
        lines.append(json.dumps({"task_id": t.id, "prompt": t.prompt, "answer": t.answer,
                                 "metadata": dict(t.metadata), "completion": s["text"]}, default=list))  # fmt: skip
    source = folder / "completions.jsonl"
    source.write_text("".join(line + "\n" for line in lines))
    os.environ["LRMGYM_MAX_LINE_BYTES"] = str(max(1 << 20, *(len(line) + 1 for line in lines)))
    env = cfg.env.make()
    judges = [j.build() for j in cfg.judge.values()]
    start = time.perf_counter()
    judge_file(source, folder / "verdicts.jsonl", judges, env=env)
    seconds = time.perf_counter() - start
    env.close()
    verdicts = [json.loads(line)["verdict"] for line in (folder / "verdicts.jsonl").read_text().splitlines()]
    return [0.0 if v["score"] is None else v["score"] for v in verdicts], seconds


# --------------------------------------------------------------------------------------------------- the server
def start_server(workers: int | None) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "lrmgym.cli.main", "serve", *TOKENS, "--port", "0", "--deadline-s", "170"]
    if workers:
        cmd += ["--workers", str(workers)]
    return launch(cmd)


def launch(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> tuple[subprocess.Popen, str]:
    """Start an ``lrmgym serve`` command; returns the process and its URL once ``/health`` answers."""
    env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "listening on " in line:
            url = line.split("listening on ", 1)[1].strip().removesuffix("/get_reward")
            break
    else:
        raise SystemExit("lrmgym serve did not start")
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # drain the rest
    for _ in range(300):
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit("lrmgym serve never answered /health")


def load(url: str, samples: list[dict], clients: int) -> tuple[list[dict], list[threading.Thread]]:
    """Start sending every sample as one request from ``clients`` threads; results (status, reward, seconds)."""
    jobs: queue.Queue[int] = queue.Queue()
    for i in range(len(samples)):
        jobs.put(i)
    results: list[dict] = [{} for _ in samples]

    def client() -> None:
        with httpx.Client(timeout=180) as http:
            while True:
                try:
                    i = jobs.get_nowait()
                except queue.Empty:
                    return
                s = samples[i]
                body = json.dumps({"query": [s["prompt"] + s["text"] + "<eos>"], "prompts": [s["prompt"]],
                                   "labels": [s["label"]]})  # fmt: skip
                start = time.perf_counter()
                try:
                    r = http.post(url + "/get_reward", content=body, headers={"content-type": "application/json"})
                    status, reward = r.status_code, (r.json()["rewards"][0] if r.status_code == 200 else None)
                except httpx.HTTPError as err:
                    status, reward = f"{type(err).__name__}", None
                results[i] = {"status": status, "reward": reward, "seconds": time.perf_counter() - start}

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    return results, threads


# --------------------------------------------------------------------------------------------------- main
def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except OSError:
        return "(uptime unavailable)"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--hostile", type=float, default=0.05, help="share of hostile completions")
    parser.add_argument("--workers", type=int, default=None, help="the server's grading threads (default: its own)")
    parser.add_argument("--out", type=Path, default=None, help="Markdown results file")
    args = parser.parse_args()
    hostile = battery()
    if hostile is None:
        print("skipped: the adversarial battery ($LRMGYM_SHARED_DATA/adversarial/cases.json) is absent")
        return
    load_before = uptime()
    cfg = resolve(TOKENS)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        samples = make_inputs(cfg, folder, args.requests, args.hostile, hostile)
        proc, url = start_server(args.workers)
        try:
            start = time.perf_counter()
            results, threads = load(url, samples, args.clients)
            seen: set[tuple[int, int]] = set()
            while any(t.is_alive() for t in threads):
                seen |= descendants(proc.pid)  # the server's worker processes while it works
                time.sleep(0.5)
            wall = time.perf_counter() - start
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=60)
        time.sleep(1.0)
        leaked = sorted(p for p, _ in alive(seen))
        expected, judge_s = judge_baseline(cfg, samples, folder)
    load_after = uptime()

    failed = [r for r in results if r.get("status") != 200]
    wrong = [i for i, r in enumerate(results) if r.get("status") == 200 and r["reward"] != expected[i]]
    latencies = [r["seconds"] for r in results if "seconds" in r]
    hostile_lat = [r["seconds"] for r, s in zip(results, samples, strict=True) if s["hostile"] and "seconds" in r]
    normal_lat = [r["seconds"] for r, s in zip(results, samples, strict=True) if not s["hostile"] and "seconds" in r]
    served = len(samples) / wall
    baseline = len(samples) / judge_s
    row = {
        "requests": len(samples), "clients": args.clients, "hostile": sum(s["hostile"] for s in samples),
        "failed": len(failed), "reward_mismatches": len(wrong), "leaked_processes": len(leaked),
        "server_processes_seen": len(seen), "server_exit_code": code,
        "wall_s": wall, "throughput_rps": served, "p50_ms": 1000 * percentile(latencies, 50),
        "p90_ms": 1000 * percentile(latencies, 90), "p99_ms": 1000 * percentile(latencies, 99),
        "max_ms": 1000 * max(latencies), "mean_ms": 1000 * statistics.fmean(latencies),
        "p50_normal_ms": 1000 * percentile(normal_lat, 50), "p99_normal_ms": 1000 * percentile(normal_lat, 99),
        "p50_hostile_ms": 1000 * percentile(hostile_lat, 50), "max_hostile_ms": 1000 * max(hostile_lat),
        "judge_file_s": judge_s, "judge_file_sps": baseline, "ratio": served / baseline,
    }  # fmt: skip
    row["mismatch_examples"] = [
        {"completion": samples[i]["text"][:80], "served": results[i]["reward"], "judge": expected[i],
         "seconds": round(results[i]["seconds"], 3)}
        for i in wrong[:5]
    ]  # fmt: skip
    print(json.dumps(row, indent=2))
    if args.out is not None:
        write_report(args.out, row, load_before, load_after)
    if failed or wrong or leaked:
        raise SystemExit(f"FAILED: {len(failed)} failed requests, {len(wrong)} wrong rewards, {len(leaked)} leaked")


def write_report(path: Path, row: dict, before: str, after: str) -> None:
    def ms(key: str) -> str:
        return f"{row[key]:.0f}"

    leaked = row["leaked_processes"]
    text = f"""# `lrmgym serve` under load (localhost)

`python benchmarks/serve.py` ({row["requests"]} requests, {row["clients"]} concurrent clients, one sample per
request as OpenRLHF 0.11.2 sends them; `lrmgym serve {" ".join(TOKENS)}`, default limits). {row["hostile"]}
completions ({100 * row["hostile"] / row["requests"]:.0f} %) are the math-verifier cases of the adversarial battery
(`../shared/data/adversarial`), inside `<answer>` tags and bare; the others are worked solutions, wrong answers,
format failures and answers with trailing text. The baseline is `lrmgym judge` (`judge_file`) on the same
(task, completion) pairs in the same run, in-process: no HTTP, no JSON, no label decoding, each task's completions
graded as one group.

| | value |
|---|---|
| failed requests (status other than 200) | {row["failed"]} |
| rewards different from `lrmgym judge`'s | {row["reward_mismatches"]} |
| server processes seen during the load / left after SIGTERM | {row["server_processes_seen"]} / {leaked} |
| server exit code after SIGTERM | {row["server_exit_code"]} |
| wall time of the load | {row["wall_s"]:.1f} s |
| throughput | {row["throughput_rps"]:.1f} requests/s |
| latency p50 / p90 / p99 / max | {ms("p50_ms")} / {ms("p90_ms")} / {ms("p99_ms")} / {ms("max_ms")} ms |
| latency p50 / p99, ordinary completions | {row["p50_normal_ms"]:.0f} / {row["p99_normal_ms"]:.0f} ms |
| latency p50 / max, hostile completions | {row["p50_hostile_ms"]:.0f} / {row["max_hostile_ms"]:.0f} ms |
| `lrmgym judge` on the same inputs | {row["judge_file_s"]:.1f} s ({row["judge_file_sps"]:.1f} samples/s) |
| **throughput ratio, server / `lrmgym judge`** | **{row["ratio"]:.2f}** |

Machine: {os.cpu_count()} CPU cores, {platform.platform()}, Python {platform.python_version()}, run with
`OMP_NUM_THREADS={os.environ.get("OMP_NUM_THREADS", "(unset)")}`. Load (`uptime`), which other benchmarks
running at the same time add to:

- before: `{before}`
- after: `{after}`

Raw figures:

```json
{json.dumps(row, indent=2)}
```
"""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


if __name__ == "__main__":
    main()
