r"""Bounded math-answer verification: ``verify_answer(prediction, gold) -> Verdict``.

One call grades an already-extracted answer string against a gold answer string. It is meant to be reused
(the math env, a judge's accuracy component, the eval command) and is safe on hostile input.

**What a verdict guarantees.** A policy trained on this reward optimises whatever it pays for, so:

- *Correct* means the whole answer states one value and that value equals the gold. An answer that offers
  several values or a step (``3 = 4``, ``3 \to 4``, ``3 \\ 4``, ``\begin{cases}``, ``\cancel{3} 4``,
  ``3 \quad 4``, ``4. Actually no: 3``) or asserts a false equation is incorrect, whichever value the gold is.
- *Ungradeable* (``score=None``, masked by learners) means we failed: the gold is empty or cannot be read,
  or no worker can run. It never means the prediction made the checker fail: an answer that exhausts the
  time budget, kills its worker (a crash, the memory cap) or makes the checker raise scores 0, with the
  reason (``"incorrect: the answer exhausted the checker's 2 s budget"``). The worker reports when it has
  read the gold, so the parent knows which side a failure came from, even for a worker it had to kill.
  (A check that overruns only because the machine is overloaded also scores 0; such verdicts are not
  cached, so the pair is checked afresh next time. Size ``timeout_s`` and the pool for the load.)
- *Correct* also means the answer is in the form the task asks for, when the caller passes the task's
  declared ``form`` (:mod:`.forms`: a plain number, a fraction in lowest terms, a percentage, a simplified
  radical, a factored form, or any expression) and its ``question``: ``11 \times 9 - 52`` for "Compute
  11 × 9 - 52.", ``\sqrt{242}`` for "Simplify √242" or ``4/6`` for 2/3 are incorrect although equal in
  value, and so is any answer that restates an expression of the question.
- *Percent* has one reading per task: a final ``%`` (``\%``, ``\text{ percent}``) marks the number of
  percent when the task asks for a percentage (``form="percent"``, or a gold written with ``%``), so
  ``50\%`` and ``50`` are both 50; for every other task ``%`` means hundredths, so ``50\%`` is 1/2 and
  never 50.

Layers, cheapest first:

1. **Pre-filters** (microseconds): the answer must be valid Unicode without control characters, at most
   ``max_answer_chars`` long, nested at most 64 brackets deep, and must not use a modulo operator the gold
   does not use (math-verify reads ``123 \bmod 7`` as 7). Failing one is *incorrect*, with the reason.
2. **Verdict cache** keyed by the SHA-256 of ``(gold, form, question, prediction)``; then the declared form
   (:func:`.forms.form_reason`, linear string work) and the percent reading.
3. **String rules** (:mod:`.shape`, microseconds): a sentence around one ``$...$``/``\boxed{}`` is reduced
   to it; the shapes that carry more than one value are rejected; numerals with a base subscript
   (``52_8``) are compared with their base, which math-verify drops (it accepts ``52`` and ``204_5``).
4. **Fast path** (microseconds): identical normalised strings, or two plain numbers (integers with optional
   thousands separators, decimals, ``a/b``, ``\frac{a}{b}``, ``3e3``, ``6.72 \times 10^{-5}``) compared
   exactly as :class:`fractions.Fraction`; brackets around the whole number (``(0.5)``, ``{0.5}``,
   ``[0.5]``, ``\{0.5\}``, ``-(-0.5)``) are read through, so a wrapper never skips the rounding rule.
   A decimal is accepted for a different exact value only when it is that value correctly rounded at the
   places it was written with, to at least 6 places and 6 significant figures: math-verify's 6-decimal rule
   accepts ``0.0000672`` for ``0.0000674`` and ``0.1500004`` for ``0.15``; we do not (``0.333333`` for 1/3
   stays correct). The same rule is applied after the slow path when one side is a plain decimal.
5. **Slow path**: math-verify (which uses sympy) in a pool of worker processes (see :mod:`._worker` for
   what the worker adds: whole-answer LaTeX parsing, true equations, ``3e3``, ``e^{i\pi}``). Each worker
   enforces a soft budget with an interval timer in its own main thread; the parent enforces the hard
   bound ``timeout_s`` by SIGKILLing a worker that has not answered and starting a replacement. No
   SIGALRM in the caller, so it works from threads, asyncio (via ``asyncio.to_thread``) and processes.

The trusted process never builds a sympy object from model text, so it never stringifies one (``str()``
of a parsed power tower hangs: math-verify issue #65).
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
from lrmgym.envs.math.forms import FORMS, form_reason, number_text, strip_percent
from lrmgym.envs.math.shape import base_numeral, hedge_reason, sole_block, value_part

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
_DEC_RE = re.compile(r"[+-]?(?:[1-9]\d{0,2}(?:,\d{3})+|\d*)\.\d+")  # 1,000.99 too
_SLASH_RE = re.compile(r"([+-]?)(\d+)/(\d+)")
_FRAC_RE = re.compile(r"([+-]?)\\[dt]?frac(?:\{([+-]?\d+)\}\{(\d+)\}|(\d)(\d))")
# A number wrapped whole in brackets, with an optional sign: (0.5), -{0.5}, [0.5], \{0.5\}
_WRAPPED_RE = re.compile(r"([+-]?)(\\\{|[(\[{])(.*?)(\\\}|[)\]}])")
_BRACKET_PAIRS = {"(": ")", "[": "]", "{": "}", "\\{": "\\}"}
# 3e3, 1.5E-3, 6.72\times10^{-5}, 2\cdot 10^3: the exponent is capped at 3 digits so no literal is huge
_SCI_RE = re.compile(r"([+-]?)(\d+(?:\.\d*)?|\.\d+)(?:[eE]([+-]?\d{1,3})|\\(?:times|cdot)10\^(\{[+-]?\d{1,3}\}|\d))")


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
    r"""The exact value of a plain number, and whether it was written as a decimal; else ``None``.

    Accepts integers (with optional ``1,000`` thousands separators), decimals (``.35``, ``-2.50``), ``a/b``,
    ``\frac{a}{b}`` / ``\dfrac`` / ``\frac ab`` and scientific notation (``3e3``, ``1.5e-3``,
    ``6.72 \times 10^{-5}``; the exponent at most 3 digits), with an optional sign. Anything else (units,
    ``\pi``, percentages, expressions) is left to math-verify. Hand-written because it must run in
    microseconds on every answer before a worker round trip; sympy is the slow path it avoids.
    """
    number = _plain_number(text)
    return None if number is None else (number.value, number.decimal)


@dataclass(frozen=True)
class _Number:
    """A plain number as written: its exact value and, for a decimal, the precision it was written with."""

    value: Fraction
    decimal: bool  # written with a decimal point or an exponent: a rounded value, not an exact one
    places: int = 0  # digits after the point (``6.72e-5``: 7); negative for ``3e3``
    figures: int = 0  # significant figures as written (``0.150`` has 3)


def _decimal(sign: str, mantissa: str, exponent: int) -> _Number:
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0")
    value = Fraction(f"{sign}{mantissa or '0'}") * Fraction(10) ** exponent
    return _Number(value, True, len(frac) - exponent, len(digits))


def _unwrap(text: str) -> str:
    r"""``text`` without brackets around the whole of it, signs kept: ``-(-0.5)`` -> ``0.5``, ``\{3\}`` -> ``3``.

    One rule for every wrapper: a bracketed number is read, and rounded, as the number itself (math-verify
    read ``(0.0000667)`` with its 6-decimal tolerance, so the rounding rule never saw it).
    """
    negative, unwrapped = False, False
    while (match := _WRAPPED_RE.fullmatch(text)) and _BRACKET_PAIRS[match.group(2)] == match.group(4):
        inner, depth = match.group(3), 0
        for ch in inner:
            depth += (ch in "([{") - (ch in ")]}")
            if depth < 0:
                return _signed(text, negative) if unwrapped else text
        if depth != 0:
            break
        negative ^= match.group(1) == "-"
        text, unwrapped = inner, True
    return _signed(text, negative) if unwrapped else text


def _signed(text: str, negative: bool) -> str:
    if not negative:
        return text
    return text[1:] if text.startswith("-") else "-" + text.removeprefix("+")


def _plain_number(text: str) -> _Number | None:
    text = _normalise(text)
    if not text or len(text) > _FAST_PATH_MAX_CHARS:
        return None
    text = _unwrap(text)
    try:
        if _INT_RE.fullmatch(text):
            return _Number(Fraction(int(text.replace(",", ""))), False)
        if _DEC_RE.fullmatch(text):
            text = text.replace(",", "")
            sign, mantissa = (text[0], text[1:]) if text[0] in "+-" else ("", text)
            return _decimal(sign, mantissa, 0)
        match = _SCI_RE.fullmatch(text)
        if match:
            sign, mantissa, exponent = match.group(1), match.group(2), match.group(3) or match.group(4)
            number = _decimal(sign, mantissa, int(exponent.replace("{", "").replace("}", "")))
            # 3e3 and 3\times10^3 are exact integers when the mantissa has no decimals
            return number if "." in mantissa or number.value.denominator != 1 else _Number(number.value, False)
        match = _SLASH_RE.fullmatch(text) or _FRAC_RE.fullmatch(text)
        if match:
            sign, *parts = match.groups()
            num, den = [int(p) for p in parts if p is not None]
            if den == 0:
                return None
            return _Number(Fraction(-num if sign == "-" else num, den), False)
    except (ValueError, ZeroDivisionError):  # over 4300 digits, or a malformed literal
        return None
    return None


def _rounds_to(rounded: _Number, value: Fraction) -> bool:
    """Whether the decimal ``rounded`` is ``value`` correctly rounded at its own written precision.

    math-verify compares floats at 6 *decimal places*, which on small magnitudes is no precision at all
    (``0.0000672`` and ``0.0000674`` agree at 6 places) and which accepts ``0.1500004`` for the exact
    ``0.15``. We accept a decimal for a different exact value only when it is that value rounded to the
    places it was written with, and it carries at least 6 places and 6 significant figures (so
    ``0.333333`` stays right for 1/3, as in math-verify, and ``0.3`` stays wrong).
    """
    if rounded.value == value:
        return True
    if rounded.places < 6 or rounded.figures < 6:
        return False
    return abs(value - rounded.value) * 2 <= Fraction(1, 10**rounded.places)


def _numbers_agree(pred: _Number, gold: _Number) -> bool:
    if pred.value == gold.value:
        return True
    if not (pred.decimal or gold.decimal):
        return False
    decimals = [n for n in (pred, gold) if n.decimal]
    rounded = min(decimals, key=lambda n: n.places)  # the coarser decimal; the other side is the value
    other = gold if rounded is pred else pred
    return _rounds_to(rounded, other.value)


def _fast_verdict(prediction: str, gold: str) -> tuple[bool, str] | None:
    """``(correct, reason)`` when the cheap checks decide, else ``None``."""
    if _normalise(prediction) == _normalise(gold):
        return True, "correct (same answer string)"
    if "=" not in gold:
        prediction = value_part(prediction)  # "x = 0.5": the number behind a one-letter label
    pred_num, gold_num = _plain_number(prediction), _plain_number(gold)
    if pred_num is None or gold_num is None:
        return None
    if pred_num.value == gold_num.value:
        return True, "correct (equal numbers)"
    if _numbers_agree(pred_num, gold_num):
        return True, "correct (equal at the precision written)"
    return False, "incorrect (different numbers)"


def _base_verdict(prediction: str, gold: str) -> tuple[bool, str] | None:
    """Numerals with a base subscript (``52_8``), which math-verify reads without the subscript."""
    gold_base, pred_base = base_numeral(gold), base_numeral(prediction)
    if gold_base is not None:
        if pred_base is None:
            return False, f"incorrect (the answer is not written in base {gold_base[1]})"
        if pred_base[1] != gold_base[1]:
            return False, f"incorrect (the answer is in base {pred_base[1]}, not {gold_base[1]})"
        return (
            (True, "correct (equal numerals)") if pred_base == gold_base else (False, "incorrect (different numbers)")
        )
    if pred_base is not None and pred_base[1] != 10:
        gold_num = _plain_number(gold)
        if gold_num is not None and gold_num.value == pred_base[0]:
            return True, "correct (equal numbers)"
        return False, f"incorrect (the answer is written in base {pred_base[1]})"
    return None


# --------------------------------------------------------------------------------------------------- cache
_CACHE = ContentCache(_CACHE_SIZE)


def clear_cache() -> None:
    """Forget every cached verdict (benchmarks call this between runs)."""
    _CACHE.clear()


def _cache_key(prediction: str, gold: str, form: str | None = None, question: str = "") -> str:
    data = f"{len(gold)}:{gold}\x00{form}\x00{len(question)}:{question}\x00{prediction}"
    data = data.encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------------------------------- workers
class _Worker:
    """One verifier process and the parent's end of its pipes."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self._buffer = b""
        self.phase = "gold"  # how far the current request got: "gold" until the worker has read the gold

    @classmethod
    def start(cls, script: Path = _WORKER_SCRIPT) -> _Worker:
        env = dict(os.environ, LRMGYM_VERIFIER_PARENT=str(os.getpid()))
        proc = subprocess.Popen(
            [sys.executable, "-c", _BOOTSTRAP, str(script)],
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
                f"The verifier worker {script.name} did not start within {_WORKER_START_TIMEOUT_S:.0f} s (exit "
                f"code {proc.poll()}). Check that `{sys.executable} {script}` starts (its imports are installed)."
            )
        return worker

    def request(self, payload: bytes, deadline: float) -> dict[str, Any] | None:
        """Send one request; the reply, or ``None`` when the worker died or missed the deadline.

        :attr:`phase` says afterwards how far the worker got: ``"pred"`` once it reported that the gold was
        read, so that a worker that dies or overruns later is known to have died on the prediction.
        """
        self.phase = "gold"
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
        while True:
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
                message = json.loads(line)
            except ValueError:
                return None
            if not isinstance(message, dict):
                return None
            if "status" in message:
                return message
            if message.get("phase") in ("gold", "pred"):  # a progress line; the reply follows
                self.phase = message["phase"]

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
        worker_script: The worker program (default: math-verify's, :mod:`._worker`). Another checker (the
            reasoning-gym env's) passes its own script speaking the same protocol: one JSON request per line,
            ``{"status": "ready"}`` once started, then one JSON reply with a ``"status"`` per request.
    """

    def __init__(self, size: int | None = None, *, worker_script: Path | None = None) -> None:
        if size is None and os.environ.get("LRMGYM_VERIFIER_WORKERS"):
            raw = os.environ["LRMGYM_VERIFIER_WORKERS"]
            if not raw.isdigit() or int(raw) < 1:
                raise ValueError(f"LRMGYM_VERIFIER_WORKERS must be a positive integer, got {raw!r}.")
            size = int(raw)
        if size is not None and (not isinstance(size, int) or size < 1):
            raise ValueError(f"VerifierPool size must be a positive integer, got {size!r}.")
        self.size = size or max(2, min(8, os.cpu_count() or 2))
        self.worker_script = Path(worker_script) if worker_script is not None else _WORKER_SCRIPT
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
                box.append(_Worker.start(self.worker_script))
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

    def check(self, gold: str, prediction: str, timeout_s: float, numeric_of: str | None = None) -> dict[str, Any]:
        """Run math-verify on one pair under the hard bound ``timeout_s`` (counted once a worker is ready).

        Args:
            gold: The reference answer.
            prediction: The extracted answer.
            timeout_s: The hard wall-clock bound.
            numeric_of: ``"gold"`` or ``"pred"``: when the pair is equal, also return that side's value to 50
                significant digits as a string (for the rounding rule; never a parsed expression).

        Returns:
            The worker's reply ``{"status": ..., "equal": bool, "phase": ...}``; ``status`` is
            ``"hard_timeout"`` when the worker was killed at the bound and ``"crashed"`` when it died, and
            ``phase`` is ``"pred"`` once the worker had read the gold (so the prediction caused the failure).
        """
        request: dict[str, Any] = {"gold": gold, "pred": prediction, "budget": timeout_s * _SOFT_BUDGET_FRACTION}
        if numeric_of is not None:
            request["numeric_of"] = numeric_of
        return self._run(request, timeout_s)

    def send(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send one request (any JSON object the worker script understands) under the hard bound ``timeout_s``.

        Returns:
            The worker's reply, or ``{"status": "hard_timeout" | "crashed", "equal": False, "phase": ...}`` when
            the worker was killed at the bound or died (it is then replaced).
        """
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
                return {"status": status, "equal": False, "phase": worker.phase}
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


def _ungradeable(reason: str) -> _Outcome:
    return _Outcome(None, None, f"ungradeable: {reason}")


def _slow_outcome(reply: dict[str, Any], timeout_s: float) -> _Outcome:
    """The verdict of a worker reply. Ungradeable only when *we* failed, never because of the prediction.

    The worker reports ``phase="pred"`` once it has read the gold (parsed, memoised per worker). A timeout,
    crash or error after that point was caused by the prediction, which must not be able to opt out of a
    wrong verdict by making the checker fail: it scores 0 with the reason. Before that point (the gold
    cannot be read, a worker stalls on it) and when no worker can run at all, the sample is ungradeable.
    """
    status = reply.get("status")
    on_pred = reply.get("phase") == "pred"
    if status == "ok":
        if reply.get("equal"):
            return _Outcome(1.0, True, "correct")
        if reply.get("why") == "false_relation":
            return _incorrect("incorrect: the answer asserts an equation that does not hold")
        return _incorrect("incorrect")
    if status == "pred_unparsed":
        return _incorrect("incorrect (the answer could not be parsed as math)")
    if status == "gold_unparsed":
        return _ungradeable("the reference answer could not be parsed")
    if status in ("timeout", "hard_timeout"):
        if on_pred:
            return _incorrect(f"incorrect: the answer exhausted the checker's {timeout_s:g} s budget")
        return _ungradeable(f"the reference answer could not be read within {timeout_s:g} s")
    if status == "crashed":
        if on_pred:
            return _incorrect("incorrect: the checker's worker died on the answer")
        return _ungradeable("the verifier worker crashed before reading the answer")
    if status == "error" and "phase" in reply:
        if on_pred:
            return _incorrect(f"incorrect: the checker failed on the answer ({reply.get('error', 'error')})")
        return _ungradeable(f"the reference answer could not be read ({reply.get('error', 'error')})")
    if status == "unavailable":
        return _ungradeable(f"verifier unavailable ({reply.get('error', '')})")
    return _ungradeable(f"verifier error {reply.get('error', status)}")


def _decimal_text(value: Fraction, places: int) -> str:
    """``value`` written with ``places`` decimals (it must have no more); an integer or ``a/b`` when ``places <= 0``."""
    if places <= 0:
        return f"{value.numerator}" if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
    scaled = value * 10**places
    digits = str(abs(scaled.numerator // scaled.denominator)).rjust(places + 1, "0")
    return f"{'-' if value < 0 else ''}{digits[:-places]}.{digits[-places:]}"


def _read_percent(prediction: str, gold: str, percent: bool) -> tuple[str, str]:
    r"""The pair with a final percent sign read one way.

    As the number of percent when ``percent`` (the task asks for a percentage), else as hundredths
    (``50\%`` is ``1/2``, ``12.5\%`` is ``0.125``, ``\frac{1}{2}\%`` is ``\frac{\frac{1}{2}}{100}``).
    """
    body, had = strip_percent(value_part(prediction))
    if percent:
        return (body if had else prediction), strip_percent(gold)[0]
    if not had:
        return prediction, gold
    number = _plain_number(body)
    if number is None:
        return f"\\frac{{{body}}}{{100}}", gold
    if number.decimal:
        return _decimal_text(number.value / 100, number.places + 2), gold
    return _decimal_text(number.value / 100, 0), gold


def _decide(
    prediction: str, gold: str, timeout_s: float, pool: VerifierPool | None, form: str | None = None, question: str = ""
) -> tuple[_Outcome, bool]:
    """``(outcome, cacheable)`` of a pre-filtered pair: the form, string rules, the fast path, then a worker."""
    prediction = sole_block(prediction)
    if form is not None:
        try:
            why = form_reason(prediction, form, question, gold)
        except ValueError:  # a numeral past Python's 4300-digit int limit (max_answer_chars may be raised)
            why = "the answer cannot be read in the declared form"
        if why is not None:
            return _incorrect(f"incorrect: {why}"), True
    prediction, gold = _read_percent(prediction, gold, form == "percent" or strip_percent(gold)[1])
    fast = _fast_verdict(prediction, gold)
    if fast is not None and fast[0] and fast[1] == "correct (same answer string)":
        return _Outcome(1.0, True, fast[1]), True
    base = _base_verdict(prediction, gold)
    if base is not None:
        return _Outcome(float(base[0]), base[0], base[1]), True
    hedge = hedge_reason(prediction, gold)
    if hedge is not None:
        return _incorrect(f"incorrect: {hedge}"), True
    if fast is not None:
        return _Outcome(float(fast[0]), fast[0], fast[1]), True
    # One side a plain decimal, the other an expression (0.707107 vs \frac{\sqrt2}{2}): math-verify's
    # 6-decimal rule decides, then the rounding rule is applied to the expression's value.
    pred_num = _plain_number(number_text(prediction) if "=" not in gold else prediction)
    gold_num = _plain_number(gold)
    rounded, numeric_of = None, None
    if pred_num is not None and pred_num.decimal and gold_num is None:
        rounded, numeric_of = pred_num, "gold"
    elif gold_num is not None and gold_num.decimal and pred_num is None:
        rounded, numeric_of = gold_num, "pred"
    try:
        reply = (pool or default_pool()).check(gold, prediction, timeout_s, numeric_of=numeric_of)
    except (RuntimeError, OSError) as exc:  # no worker could be started: infrastructure, not the model
        reply = {"status": "unavailable", "error": str(exc)[:200]}
    outcome = _slow_outcome(reply, timeout_s)
    if outcome.correct and pred_num is not None and gold_num is not None and not _numbers_agree(pred_num, gold_num):
        # a number math-verify read through a wrapper (units, \approx, a final period): the same rounding rule
        outcome = _incorrect("incorrect (not equal at the precision written)")
    if outcome.correct and rounded is not None and isinstance(reply.get("value"), str):
        try:
            value = Fraction(reply["value"])
        except (ValueError, ZeroDivisionError):
            value = None
        # evalf to 50 digits: a difference below 1e-40 is the evaluation's, not the answer's
        if value is not None and abs(value - rounded.value) > Fraction(1, 10**40) and not _rounds_to(rounded, value):
            outcome = _incorrect("incorrect (not equal at the precision written)")
    # A timeout or crash may depend on the machine's load: score it, but do not remember it.
    cacheable = reply.get("status") not in ("timeout", "hard_timeout", "crashed", "unavailable")
    return outcome, cacheable


def verify_answer(
    prediction: str | None,
    gold: Any,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_answer_chars: int = DEFAULT_MAX_ANSWER_CHARS,
    use_cache: bool = True,
    pool: VerifierPool | None = None,
    form: str | None = None,
    question: str = "",
) -> Verdict:
    """Grade an extracted answer against the gold answer. Never raises for any ``prediction``.

    Guarantees: a correct verdict means the whole answer states one value equal to the gold (see the module
    docstring); ``score=None`` (ungradeable) means we failed (empty or unreadable gold, no worker), never
    that the prediction made the checker time out, crash or raise, which scores 0 with the reason.

    Args:
        prediction: The answer the model gave (already extracted from its format), or ``None`` if none.
        gold: The reference answer; non-strings (ints, Fractions) are converted with ``str``.
        timeout_s: Hard wall-clock bound of the slow path, in seconds (counted once a worker is free).
        max_answer_chars: Answers longer than this are incorrect without being parsed.
        use_cache: Reuse and store verdicts keyed by the content hash of the pair.
        pool: The worker pool to use; default: the module-level :func:`default_pool`.
        form: The answer form the task declares (:data:`lrmgym.envs.math.forms.FORMS`); an answer not in it
            is incorrect. ``None``: values only (the percent sign is still read one way, see the module
            docstring).
        question: The task's question: an answer that restates an expression of it is incorrect.

    Raises:
        ValueError: ``timeout_s`` is not positive, or ``form`` is not a known form.

    Returns:
        A :class:`~lrmgym.core.Verdict` with ``score`` 1.0 / 0.0 / ``None`` (ungradeable), ``parsed`` the
        (truncated) answer and one ``"math_verify"`` component that records latency and cache use.
    """
    if not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}.")
    if form is not None and form not in FORMS:
        raise ValueError(f"form must be one of {', '.join(FORMS)} or None, got {form!r}.")
    question = question if isinstance(question, str) else ""
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
        key = _cache_key(prediction, gold_text, form, question) if use_cache else ""
        cached, hit = _CACHE.get(key) if use_cache else (False, None)
        if cached:
            outcome = _Outcome(*hit)
        else:
            outcome, cacheable = _decide(prediction, gold_text, timeout_s, pool, form, question)
            if use_cache and cacheable:
                _CACHE.put(key, (outcome.score, outcome.correct, outcome.reason))
    latency = time.perf_counter() - start
    component = Component(
        name="math_verify", score=outcome.score, latency_s=latency, cached=cached, reason=outcome.reason
    )
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
