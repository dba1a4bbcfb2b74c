"""Helpers of the integration tests: reference scores from ``lrmgym judge``, adversarial inputs, a server process.

- :func:`reference_verdicts` grades completions the way ``lrmgym judge`` does (:func:`lrmgym.judges.scoring.judge_file`
  on a JSONL written from the tasks), with a fresh env and fresh judges built from the same config: the numbers
  every plug-in and the server must reproduce.
- :func:`adversarial_cases` reads ``$LRMGYM_SHARED_DATA/adversarial/cases.json`` (skipping the test when absent)
  and decodes its compact long strings.
- :class:`ServeProcess` runs ``lrmgym serve`` in a subprocess on a free port and stops it with a signal;
  :func:`~lrmgym.testing.procs.descendants` and :func:`~lrmgym.testing.procs.alive` check that nothing it
  started is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from lrmgym.core import Task
from lrmgym.testing import adversarial as battery
from lrmgym.testing.judging import judge_rows, task_row

REPO = Path(__file__).resolve().parents[2]


def shared_data_dir() -> Path:
    return Path(os.environ.get("LRMGYM_SHARED_DATA", REPO.parent / "shared" / "data"))


# ------------------------------------------------------------------------------------------------ references
def reference_verdicts(cfg: Any, groups: Sequence[tuple[Task, Sequence[str]]], tmp_path: Path) -> list[list[dict]]:
    """The verdicts ``lrmgym judge`` gives each group's completions, in order."""
    rows = [task_row(task, text) for task, texts in groups for text in texts]
    verdicts = judge_rows(rows, [j.build() for j in cfg.judge.values()], cfg.env.make(), tmp_path)
    it = iter(verdicts)
    return [[next(it) for _ in texts] for _, texts in groups]


def reference_rewards(cfg: Any, groups: Sequence[tuple[Task, Sequence[str]]], tmp_path: Path) -> list[list[float]]:
    """:func:`reference_verdicts`' scores (0.0 for an ungradeable verdict, the env's failure value)."""
    return [[0.0 if v["score"] is None else v["score"] for v in g] for g in reference_verdicts(cfg, groups, tmp_path)]


# ------------------------------------------------------------------------------------------------ adversarial
def adversarial_cases(component: str) -> list[dict]:
    """The battery's cases of one component (``math_verifier``, ``code_sandbox``, ``game24_checker``), decoded."""
    found = battery.cases(component, shared_data_dir())
    if found is None:
        pytest.skip(
            f"adversarial battery not found at {battery.battery_path(shared_data_dir())} (set LRMGYM_SHARED_DATA)"
        )
    return found


class ServeProcess:
    """``lrmgym serve TOKENS --port 0 ...`` in a subprocess: ``url`` once it answers ``/health``.

    Use as a context manager; leaving it sends SIGTERM (if still running) and waits for the exit.
    """

    def __init__(self, tokens: Sequence[str], *options: str, start_timeout_s: float = 60.0) -> None:
        cmd = [sys.executable, "-m", "lrmgym.cli.main", "serve", *tokens, "--port", "0", *options]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines: list[str] = []
        self.url = ""
        deadline = time.monotonic() + start_timeout_s
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            if "listening on " in line:
                self.url = line.split("listening on ", 1)[1].strip().removesuffix("/get_reward")
                break
        if not self.url:
            self.stop()
            raise AssertionError(f"lrmgym serve did not start: {''.join(self.lines)}")
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        self.stop()
        raise AssertionError(f"lrmgym serve never answered /health: {''.join(self.lines)}")

    def post(self, body: Any, timeout: float = 60.0, path: str = "/get_reward") -> httpx.Response:
        if not isinstance(body, (bytes, str)):  # as aiohttp's json=: json.dumps, ASCII escapes (lone surrogates too)
            body = json.dumps(body)
        headers = {"content-type": "application/json"}
        return httpx.post(self.url + path, content=body, headers=headers, timeout=timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
            raise AssertionError(
                f"lrmgym serve did not stop within {timeout} s after {signal.Signals(sig).name}"
            ) from None
        self.lines.append(out or "")
        return self.proc.returncode

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc.poll() is None:
            self.stop()
