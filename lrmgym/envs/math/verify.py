"""Bounded math-answer verification: ``verify_answer(prediction, gold) -> Verdict``.

One call grades an already-extracted answer string against a gold answer string. It is meant to be reused
(the math env, a judge's accuracy component, the eval command) and is safe on hostile input:

1. **Pre-filters** (microseconds): the answer must be valid Unicode without control characters, at most
   ``max_answer_chars`` long, nested at most 64 brackets deep, and must not use a modulo operator the gold
   does not use (math-verify reads ``123 \\bmod 7`` as 7). Failing one is *incorrect*, with the reason.
2. **Verdict cache** keyed by the SHA-256 of ``(gold, prediction)``.
3. **Fast path** (microseconds): identical normalised strings, or two plain numbers (integers with optional
   thousands separators, decimals, ``a/b``, ``\\frac{a}{b}``) compared exactly as :class:`fractions.Fraction`.
   It only decides what math-verify would decide the same way; near-equal decimals (``0.333333`` vs
   ``1/3``, which math-verify accepts at 6 decimals) go to the slow path.
4. **Slow path**: math-verify (which uses sympy) in a pool of worker processes. Each worker enforces a
   soft budget with an interval timer in its own main thread; the parent enforces the hard bound
   ``timeout_s`` by SIGKILLing a worker that has not answered and starting a replacement. No SIGALRM in
   the caller, so it works from threads, asyncio (via ``asyncio.to_thread``) and worker processes.

Verdicts are tri-state: ``score=1.0`` correct, ``0.0`` incorrect, ``None`` ungradeable (timeout, a gold
answer math-verify cannot parse, a crashed worker). The trusted process never builds a sympy object from
model text, so it never stringifies one (``str()`` of a parsed power tower hangs: math-verify issue #65).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import queue
import re
import select
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from lrmgym.cache import ContentCache
from lrmgym.core import Component, Verdict

__all__ = [
    "DEFAULT_MAX_ANSWER_CHARS",
    "DEFAULT_TIMEOUT_S",
    "MAX_NESTING",
    "VerifierPool",
    "clear_cache",
    "default_pool",
    "numeric_value",
    "prefilter",
    "shutdown_pools",
    "verify_answer",
    "verify_many",
]

DEFAULT_TIMEOUT_S = 2.0
"""Hard wall-clock bound of one slow-path check, in seconds."""
DEFAULT_MAX_ANSWER_CHARS = 1000
"""Longest answer string that is checked at all; longer ones are incorrect."""
MAX_NESTING = 64
"""Deepest bracket nesting an answer may have."""
_SOFT_BUDGET_FRACTION = 0.75
"""Share of ``timeout_s`` the worker's own timer allows before it gives up (cheaper than a kill)."""
_CACHE_SIZE = 1 << 16
_FAST_PATH_MAX_CHARS = 200
_WORKER_START_TIMEOUT_S = 120.0
_WORKER_SCRIPT = Path(__file__).with_name("_worker.py")
# Run the worker script by path, with the script's folder and the cwd removed from sys.path, so that no
# file in either can shadow a module that math-verify or sympy imports.
_BOOTSTRAP = (
    "import runpy, sys; script = sys.argv[1]; "
    "sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
    "runpy.run_path(script, run_name='__main__')"
)

_CONTROL_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\u202a-\u202e\u2066-\u2069]")
_MOD_RE = re.compile(r"\\(?:bmod|pmod|mod)\b|\\operatorname\s*\{\s*mod\s*\}|\bmod\b")
_STRIP_RE = re.compile(r"\\[!,;: ]|\\left|\\right|\s+")
_INT_RE = re.compile(r"[+-]?(?:[1-9]\d{0,2}(?:,\d{3})+|\d+)")  # "0,111" is not a thousands number
_DEC_RE = re.compile(r"[+-]?\d*\.\d+")
_SLASH_RE = re.compile(r"([+-]?)(\d+)/(\d+)")
_FRAC_RE = re.compile(r"([+-]?)\\[dt]?frac(?:\{(\d+)\}\{(\d+)\}|(\d)(\d))")


# --------------------------------------------------------------------------------------------------- pre-filters
def prefilter(prediction: str, gold: str, max_answer_chars: int = DEFAULT_MAX_ANSWER_CHARS) -> str | None:
    """Why ``prediction`` is rejected before any parsing, or ``None`` when it may be checked.

    Args:
        prediction: The extracted answer.
        gold: The reference answer (a modulo operator is allowed when the gold uses one).
        max_answer_chars: The length cap.

    Returns:
        A short reason such as ``"answer longer than 1000 characters"``, or ``None``.
    """
    if len(prediction) > max_answer_chars:
        return f"answer longer than {max_answer_chars} characters ({len(prediction)})"
    try:
        prediction.encode("utf-8")
    except UnicodeEncodeError:
        return "answer is not valid Unicode (lone surrogate)"
    if _CONTROL_RE.search(prediction):
        return "answer contains control characters"
    if not prediction.strip():
        return "empty answer"
    depth = deepest = 0
    for ch in prediction:
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}":
            depth -= 1
    if deepest > MAX_NESTING:
        return f"answer nested deeper than {MAX_NESTING} brackets"
    if _MOD_RE.search(prediction) and not _MOD_RE.search(gold):
        return "answer uses a modulo operator the reference does not (not evaluated)"
    return None


# --------------------------------------------------------------------------------------------------- fast path
def _normalise(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == "$" and text[-1] == "$":
        text = text.strip("$")
    text = _STRIP_RE.sub("", text).replace("\\$", "")
    return text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")


def numeric_value(text: str) -> tuple[Fraction, bool] | None:
    """The exact value of a plain number, and whether it was written as a decimal; else ``None``.

    Accepts integers (with optional ``1,000`` thousands separators), decimals (``.35``, ``-2.50``), ``a/b``
    and ``\\frac{a}{b}`` / ``\\dfrac`` / ``\\frac ab``, with an optional sign. Anything else (units, ``\\pi``,
    percentages, expressions) is left to math-verify. Hand-written because it must run in microseconds on
    every answer before a worker round trip; sympy is the slow path it avoids.
    """
    text = _normalise(text)
    if not text or len(text) > _FAST_PATH_MAX_CHARS:
        return None
    try:
        if _INT_RE.fullmatch(text):
            return Fraction(int(text.replace(",", ""))), False
        if _DEC_RE.fullmatch(text):
            return Fraction(text), True
        match = _SLASH_RE.fullmatch(text) or _FRAC_RE.fullmatch(text)
        if match:
            sign, *parts = match.groups()
            num, den = [int(p) for p in parts if p is not None]
            if den == 0:
                return None
            return Fraction(-num if sign == "-" else num, den), False
    except (ValueError, ZeroDivisionError):  # over 4300 digits, or a malformed literal
        return None
    return None


def _fast_verdict(prediction: str, gold: str) -> tuple[bool, str] | None:
    """``(correct, reason)`` when the cheap checks decide, else ``None``."""
    if _normalise(prediction) == _normalise(gold):
        return True, "correct (same answer string)"
    pred_num, gold_num = numeric_value(prediction), numeric_value(gold)
    if pred_num is None or gold_num is None:
        return None
    (p, p_dec), (g, g_dec) = pred_num, gold_num
    if p == g:
        return True, "correct (equal numbers)"
    # math-verify compares at 6 decimals when one side is a decimal; only decide when that cannot matter.
    if (p_dec or g_dec) and abs(p - g) <= Fraction(2, 10**6):
        return None
    return False, "incorrect (different numbers)"


# --------------------------------------------------------------------------------------------------- cache
_CACHE = ContentCache(_CACHE_SIZE)


def clear_cache() -> None:
    """Forget every cached verdict (benchmarks call this between runs)."""
    _CACHE.clear()


def _cache_key(prediction: str, gold: str) -> str:
    data = f"{len(gold)}:{gold}\x00{prediction}".encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------------------------------- workers
class _Worker:
    """One verifier process and the parent's end of its pipes."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self._buffer = b""

    @classmethod
    def start(cls) -> _Worker:
        env = dict(os.environ, LRMGYM_VERIFIER_PARENT=str(os.getpid()))
        proc = subprocess.Popen(
            [sys.executable, "-c", _BOOTSTRAP, str(_WORKER_SCRIPT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            env=env,
        )
        worker = cls(proc)
        ready = worker._read_reply(time.monotonic() + _WORKER_START_TIMEOUT_S)
        if ready is None or ready.get("status") != "ready":
            worker.kill()
            raise RuntimeError(
                f"The math verifier worker did not start within {_WORKER_START_TIMEOUT_S:.0f} s "
                f"(exit code {proc.poll()}). Check that `{sys.executable} -c 'import math_verify'` works."
            )
        return worker

    def request(self, payload: bytes, deadline: float) -> dict[str, Any] | None:
        """Send one request; the reply, or ``None`` when the worker died or missed the deadline."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(payload)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            return None
        return self._read_reply(deadline)

    def _read_reply(self, deadline: float) -> dict[str, Any] | None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not poller.poll(remaining * 1000):
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            return None

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the worker, reap it and close the pipes."""
        try:
            self.proc.kill()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass


_POOLS: weakref.WeakSet[VerifierPool] = weakref.WeakSet()


class VerifierPool:
    """A bounded pool of math-verify worker processes that are killed and replaced when they overrun.

    Workers start lazily (about 1-3 s each: they import sympy) from one long-lived spawner thread, so that
    Linux's parent-death signal ties them to this process. Any thread may call :meth:`check`; at most
    ``size`` checks run at once and the others wait for a free worker. :meth:`close` (also run at
    interpreter exit and in a forked child's copy, without touching the parent's workers) leaves no process.

    Args:
        size: How many workers at most. Default: ``$LRMGYM_VERIFIER_WORKERS``, else the number of CPUs, at
            least 2 and at most 8.
    """

    def __init__(self, size: int | None = None) -> None:
        if size is None and os.environ.get("LRMGYM_VERIFIER_WORKERS"):
            raw = os.environ["LRMGYM_VERIFIER_WORKERS"]
            if not raw.isdigit() or int(raw) < 1:
                raise ValueError(f"LRMGYM_VERIFIER_WORKERS must be a positive integer, got {raw!r}.")
            size = int(raw)
        if size is not None and (not isinstance(size, int) or size < 1):
            raise ValueError(f"VerifierPool size must be a positive integer, got {size!r}.")
        self.size = size or max(2, min(8, os.cpu_count() or 2))
        self._init_state()
        _POOLS.add(self)

    def _init_state(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(self.size)
        self._idle: list[_Worker] = []
        self._live: set[_Worker] = set()
        self._spawn_requests: queue.SimpleQueue[tuple[list, threading.Event] | None] = queue.SimpleQueue()
        self._spawner: threading.Thread | None = None
        self._closed = False
        self.stats = {"spawned": 0, "killed": 0, "checks": 0}

    # ---- spawning, always from the same long-lived thread
    def _spawner_loop(self) -> None:
        while True:
            item = self._spawn_requests.get()
            if item is None:
                return
            box, done = item
            try:
                box.append(_Worker.start())
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
                box.append(exc)
            done.set()

    def _spawn(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise RuntimeError("This VerifierPool is closed; create a new one.")
            if self._spawner is None or not self._spawner.is_alive():
                self._spawner = threading.Thread(target=self._spawner_loop, name="lrmgym-verifier-spawner", daemon=True)
                self._spawner.start()
        box: list = []
        done = threading.Event()
        self._spawn_requests.put((box, done))
        done.wait()
        result = box[0]
        if isinstance(result, BaseException):
            raise result
        with self._lock:
            if self._closed:
                result.kill()
                raise RuntimeError("This VerifierPool was closed while a worker was starting.")
            self._live.add(result)
            self.stats["spawned"] += 1
        return result

    def _take(self) -> _Worker:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.alive:
                    return worker
                self._live.discard(worker)
        return self._spawn()

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(worker)
                return
        worker.kill()

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._live.discard(worker)
            self.stats["killed"] += 1

    def _check_fork(self) -> None:
        if os.getpid() != self._pid:  # a forked child: the workers belong to the parent; start afresh
            self._init_state()

    # ---- public
    def warm(self, n: int | None = None) -> None:
        """Start ``n`` workers now (default: all), so that the first checks do not pay the start-up."""
        self._check_fork()
        workers = [self._take() for _ in range(min(n or self.size, self.size))]
        for worker in workers:
            self._give_back(worker)

    def check(self, gold: str, prediction: str, timeout_s: float) -> dict[str, Any]:
        """Run math-verify on one pair under the hard bound ``timeout_s`` (counted once a worker is ready).

        Returns:
            The worker's reply ``{"status": ..., "equal": bool}``; ``status`` is ``"hard_timeout"`` when the
            worker was killed at the bound and ``"crashed"`` when it died.
        """
        request = {"gold": gold, "pred": prediction, "budget": timeout_s * _SOFT_BUDGET_FRACTION}
        return self._run(request, timeout_s)

    def _run(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        self._check_fork()
        payload = (json.dumps(request) + "\n").encode()
        with self._slots:
            worker = self._take()
            deadline = time.monotonic() + timeout_s
            reply = worker.request(payload, deadline)
            with self._lock:
                self.stats["checks"] += 1
            if reply is None:
                status = "hard_timeout" if worker.alive and time.monotonic() >= deadline else "crashed"
                self._discard(worker)
                return {"status": status, "equal": False}
            self._give_back(worker)
            return reply

    def worker_pids(self) -> list[int]:
        """Process ids of the live workers (tests use this to check for leaks)."""
        with self._lock:
            return [w.proc.pid for w in self._live if w.alive]

    def close(self) -> None:
        """Kill every worker and stop the spawner. Safe to call twice; a forked child's copy kills nothing."""
        if os.getpid() != self._pid:
            self._init_state()
            self._closed = True
            return
        with self._lock:
            self._closed = True
            workers = list(self._live)
            self._live.clear()
            self._idle.clear()
        for worker in workers:
            worker.kill()
        self._spawn_requests.put(None)

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_DEFAULT_POOL: VerifierPool | None = None
_DEFAULT_LOCK = threading.Lock()


def default_pool() -> VerifierPool:
    """The module-level pool shared by every caller in this process (created on first use)."""
    global _DEFAULT_POOL
    with _DEFAULT_LOCK:
        if _DEFAULT_POOL is None or _DEFAULT_POOL._closed or _DEFAULT_POOL._pid != os.getpid():
            _DEFAULT_POOL = VerifierPool()
        return _DEFAULT_POOL


def shutdown_pools() -> None:
    """Close every pool of this process. Registered with :mod:`atexit`; tests call it to check for leaks."""
    for pool in list(_POOLS):
        pool.close()


atexit.register(shutdown_pools)


def _after_fork_in_child() -> None:
    global _DEFAULT_POOL, _DEFAULT_LOCK
    _DEFAULT_POOL = None
    _DEFAULT_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


# --------------------------------------------------------------------------------------------------- the API
@dataclass(frozen=True)
class _Outcome:
    score: float | None
    correct: bool | None
    reason: str


def _incorrect(reason: str) -> _Outcome:
    return _Outcome(0.0, False, reason)


def _slow_outcome(reply: dict[str, Any], timeout_s: float) -> _Outcome:
    status = reply.get("status")
    if status == "ok":
        return _Outcome(1.0, True, "correct") if reply.get("equal") else _incorrect("incorrect")
    if status == "pred_unparsed":
        return _incorrect("incorrect (the answer could not be parsed as math)")
    if status == "gold_unparsed":
        return _Outcome(None, None, "ungradeable: the reference answer could not be parsed")
    if status in ("timeout", "hard_timeout"):
        return _Outcome(None, None, f"ungradeable: timeout after {timeout_s:g} s")
    if status == "crashed":
        return _Outcome(None, None, "ungradeable: the verifier worker crashed")
    return _Outcome(None, None, f"ungradeable: verifier error {reply.get('error', status)}")


def verify_answer(
    prediction: str | None,
    gold: Any,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_answer_chars: int = DEFAULT_MAX_ANSWER_CHARS,
    use_cache: bool = True,
    pool: VerifierPool | None = None,
) -> Verdict:
    """Grade an extracted answer against the gold answer. Never raises for any ``prediction``.

    Args:
        prediction: The answer the model gave (already extracted from its format), or ``None`` if none.
        gold: The reference answer; non-strings (ints, Fractions) are converted with ``str``.
        timeout_s: Hard wall-clock bound of the slow path, in seconds (counted once a worker is free).
        max_answer_chars: Answers longer than this are incorrect without being parsed.
        use_cache: Reuse and store verdicts keyed by the content hash of the pair.
        pool: The worker pool to use; default: the module-level :func:`default_pool`.

    Returns:
        A :class:`~lrmgym.core.Verdict` with ``score`` 1.0 / 0.0 / ``None`` (ungradeable), ``parsed`` the
        (truncated) answer and one ``"math_verify"`` component that records latency and cache use.
    """
    if not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}.")
    start = time.perf_counter()
    gold_text = "" if gold is None else str(gold)
    # What the verdict shows: at most 200 characters, lone surrogates escaped so logs and JSON never choke.
    shown = None if not isinstance(prediction, str) else prediction[:200].encode("utf-8", "backslashreplace").decode()
    cached = False
    if not gold_text.strip():
        outcome = _Outcome(None, None, "ungradeable: empty reference answer")
    elif prediction is None:
        outcome = _incorrect("no answer")
    elif not isinstance(prediction, str):
        outcome = _incorrect(f"answer is a {type(prediction).__name__}, not text")
    elif (why := prefilter(prediction, gold_text, max_answer_chars)) is not None:
        outcome = _incorrect(f"rejected: {why}")
    else:
        key = _cache_key(prediction, gold_text) if use_cache else ""
        cached, hit = _CACHE.get(key) if use_cache else (False, None)
        if cached:
            outcome = _Outcome(*hit)
        else:
            fast = _fast_verdict(prediction, gold_text)
            if fast is not None:
                outcome = _Outcome(float(fast[0]), fast[0], fast[1])
            else:
                try:
                    reply = (pool or default_pool()).check(gold_text, prediction, timeout_s)
                except (RuntimeError, OSError) as exc:  # no worker could be started: infrastructure, not the model
                    reply = {"status": "unavailable", "error": str(exc)[:200]}
                outcome = _slow_outcome(reply, timeout_s)
            # Timeouts and crashes may be load-dependent: do not remember them.
            transient = outcome.score is None and ("timeout" in outcome.reason or "crashed" in outcome.reason)
            if use_cache and not transient:
                _CACHE.put(key, (outcome.score, outcome.correct, outcome.reason))
    latency = time.perf_counter() - start
    component = Component(name="math_verify", score=outcome.score, latency_s=latency, cached=cached, reason=outcome.reason)
    return Verdict(
        score=outcome.score,
        correct=outcome.correct,
        parsed=shown,
        reason=outcome.reason,
        components=(component,),
        latency_s=latency,
    )


def verify_many(
    pairs: Iterable[tuple[str | None, Any]],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_answer_chars: int = DEFAULT_MAX_ANSWER_CHARS,
    use_cache: bool = True,
    pool: VerifierPool | None = None,
) -> list[Verdict]:
    """Grade many ``(prediction, gold)`` pairs concurrently, one verdict each, in order.

    Each pair is graded by :func:`verify_answer` in a thread pool with as many threads as the verifier pool
    has workers, so slow-path checks run in parallel and the cheap ones do not wait behind them.
    """
    pairs = list(pairs)
    pool = pool or default_pool()
    kwargs = {"timeout_s": timeout_s, "max_answer_chars": max_answer_chars, "use_cache": use_cache, "pool": pool}
    with ThreadPoolExecutor(max_workers=pool.size, thread_name_prefix="lrmgym-verify") as executor:
        futures = [executor.submit(verify_answer, pred, gold, **kwargs) for pred, gold in pairs]
        return [f.result() for f in futures]
