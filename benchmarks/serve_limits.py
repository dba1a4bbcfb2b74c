"""``lrmgym serve`` against slow senders and timed-out requests: what a fast client sees, and when the pool is free.

Two scenarios, each against a fresh server subprocess on localhost:

1. **Slow senders.** ``lrmgym serve env=math --max-concurrency 8 --read-timeout-s 2``. ``--slow`` clients open a
   request each and send its body a byte every 0.1 s (Content-Length 10 000), and as many send their *headers* a
   line every 0.1 s, for up to 20 s. Meanwhile a fast client posts ``--fast`` one-sample requests one after the
   other, retrying a 503 the way OpenRLHF's remote-reward client does (5 tries, 1 s apart). Reported: the fast
   requests answered 200 and their latency (retries included), and how long each slow connection was held before
   the server cut it.
2. **A timed-out request.** ``lrmgym serve env=code env.timeout_s=1 env.workers=1 --deadline-s 5 --workers 2``. One
   request of 20 completions that loop forever (each stopped by the sandbox's 1 s bound) gets its 504 at 5 s; then
   a probe request (one ordinary completion) is sent at once. Reported: the probe's status and latency, and (when
   the server's ``/health`` has a ``grading`` count) how long after the 504 the grading pool was idle.

``--src DIR`` runs the server from another lrmgym checkout (e.g. an older commit, ``git archive <commit> | tar -x
-C DIR``); ``--no-read-timeout`` leaves the ``--read-timeout-s`` flag out for a server that predates it. Run from
the repository root::

    OMP_NUM_THREADS=1 python benchmarks/serve_limits.py --out benchmarks/results/serve_limits.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from serve import launch  # benchmarks/serve.py, beside this script

SHORT = json.dumps({"v": 1, "index": 0, "seed": 0})
LOOP = "```python\nwhile True:\n    pass\n```"


def start_server(args: list[str], src: Path | None) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    cmd = [sys.executable, "-m", "lrmgym.cli.main", "serve", *args, "--port", "0"]
    return launch(cmd, env, cwd=src)  # `python -m` puts the working folder first on sys.path


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def post(url: str, body: dict, timeout: float = 60) -> httpx.Response:
    return httpx.post(url + "/get_reward", content=json.dumps(body), timeout=timeout)


# --------------------------------------------------------------------------------------------------- slow senders
def slow_senders(src: Path | None, slow: int, fast: int, read_timeout: bool) -> dict[str, Any]:
    args = ["env=math", "--max-concurrency", "8", "--deadline-s", "60"]
    if read_timeout:
        args += ["--read-timeout-s", "2"]
    proc, url = start_server(args, src)
    host, port = url.removeprefix("http://").rsplit(":", 1)
    held: list[float] = []
    lock = threading.Lock()

    def hold(first: bytes, drip: bytes) -> None:
        start = time.monotonic()
        sock = socket.create_connection((host, int(port)), timeout=30)
        try:
            sock.sendall(first)
            while time.monotonic() - start < 20:
                sock.sendall(drip)
                time.sleep(0.1)
        except OSError:
            pass
        finally:
            sock.close()
            with lock:
                held.append(time.monotonic() - start)

    body_head = b"POST /get_reward HTTP/1.1\r\nHost: x\r\nContent-Length: 10000\r\n\r\n"
    threads = [threading.Thread(target=hold, args=(body_head, b" ")) for _ in range(slow)]
    threads += [
        threading.Thread(target=hold, args=(b"POST /get_reward HTTP/1.1\r\nHost: x\r\n", b"X-Slow: 1\r\n"))
        for _ in range(slow)
    ]
    for t in threads:
        t.start()
    time.sleep(0.5)  # the slow ones are in
    latencies, ok, gave_up = [], 0, 0
    body = {"query": ["<think>x</think><answer>1</answer>"], "labels": [SHORT]}
    for _ in range(fast):
        start = time.monotonic()
        for attempt in range(5):
            r = post(url, body)
            if r.status_code != 503:
                break
            if attempt < 4:
                time.sleep(1)
        if r.status_code == 200:
            ok += 1
            latencies.append(time.monotonic() - start)
        else:
            gave_up += 1
    for t in threads:
        t.join()
    stop(proc)
    return {
        "fast_ok": ok,
        "fast_gave_up": gave_up,
        "fast_p50_s": statistics.median(latencies) if latencies else None,
        "fast_max_s": max(latencies) if latencies else None,
        "held_p50_s": statistics.median(held),
        "held_max_s": max(held),
        "slow_connections": len(held),
    }


# --------------------------------------------------------------------------------------------------- a 504
def timed_out(src: Path | None) -> dict[str, Any]:
    tokens = ["env=code", "env.timeout_s=1", "env.workers=1", "--deadline-s", "5", "--workers", "2"]
    proc, url = start_server(tokens, src)
    post(url, {"query": ["```python\nprint(1)\n```"], "labels": [SHORT]})  # warm the sandbox
    start = time.monotonic()
    first = post(url, {"query": [LOOP] * 20, "labels": [SHORT] * 20})
    after = time.monotonic()
    probe_start = time.monotonic()
    probe = post(url, {"query": ["```python\nprint(1)\n```"], "labels": [SHORT]})
    probe_s = time.monotonic() - probe_start
    idle_s = None
    if "grading" in httpx.get(url + "/health").json():
        while httpx.get(url + "/health").json()["grading"] > 0 and time.monotonic() - after < 120:
            time.sleep(0.02)
        idle_s = time.monotonic() - after
    stop(proc)
    return {"first_status": first.status_code, "first_s": after - start, "probe_status": probe.status_code,
            "probe_s": probe_s, "idle_after_504_s": idle_s}  # fmt: skip


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except OSError:
        return "(uptime unavailable)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow", type=int, default=8, help="slow-body senders (and as many slow-header ones)")
    parser.add_argument("--fast", type=int, default=20, help="fast requests, one after the other")
    parser.add_argument("--src", type=Path, default=None, help="run the server from this lrmgym checkout")
    parser.add_argument("--no-read-timeout", action="store_true", help="leave --read-timeout-s out (older servers)")
    parser.add_argument("--out", type=Path, default=None, help="JSON results file")
    args = parser.parse_args()
    before = uptime()
    slow = slow_senders(args.src, args.slow, args.fast, not args.no_read_timeout)
    late = timed_out(args.src)
    after = uptime()
    result = {"slow_senders": slow, "timed_out": late, "load_before": before, "load_after": after}
    print(json.dumps(result, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
