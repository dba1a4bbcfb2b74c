"""The bounded verifier: verdicts, pre-filters, cache, hard timeouts, threads/asyncio/processes, no leaks."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import psutil
import pytest

from lrmgym.envs.math import verify as mv
from lrmgym.envs.math.verify import VerifierPool, numeric_value, prefilter, verify_answer, verify_many

SLACK_S = 1.0  # allowed overrun of the bound for process kill + reap on a loaded 2-core machine


@pytest.fixture(scope="module")
def pool():
    p = VerifierPool(size=2)
    p.warm()
    yield p
    p.close()


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_gone(pids, within: float = 5.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if all(_gone(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


# ------------------------------------------------------------------------------------------------ verdicts
@pytest.mark.parametrize(
    ("pred", "gold", "reason"),
    [
        ("0.5", "\\frac12", "correct (equal numbers)"),
        ("1,000", "1000", "correct (equal numbers)"),
        ("-\\dfrac{3}{4}", "-0.75", "correct (equal numbers)"),
        ("32348", "\\$32,\\!348", "correct (equal numbers)"),
        ("\\frac{1}{2}", "\\frac 12", "correct (equal numbers)"),
        ("$147$", "147", "correct (same answer string)"),
        ("146", "147", "incorrect (different numbers)"),
        ("0.3", "1/3", "incorrect (different numbers)"),
    ],
)
def test_fast_path(pred, gold, reason, pool):
    before = pool.stats["checks"]
    v = verify_answer(pred, gold, pool=pool, use_cache=False)
    assert v.reason == reason
    assert v.correct is reason.startswith("correct") and v.score == float(v.correct)
    assert pool.stats["checks"] == before  # the fast path never asks a worker


def test_fast_path_does_not_touch_workers(pool):
    before = pool.stats["checks"]
    verify_answer("0.5", "\\frac{1}{2}", pool=pool, use_cache=False)
    assert pool.stats["checks"] == before


def test_numeric_value_is_exact():
    assert numeric_value("1,234") == (Fraction(1234), False)
    assert numeric_value(".35625") == (Fraction(57, 160), True)
    assert numeric_value("\\dfrac{14}{3}") == (Fraction(14, 3), False)
    assert numeric_value("3/0") is None and numeric_value("\\pi") is None and numeric_value("1,2") is None
    assert numeric_value("9" * 5000) is None  # past the fast path's length cap: never int() it


@pytest.mark.parametrize(
    ("pred", "gold", "correct"),
    [
        ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}", True),
        ("3\\sqrt{13}", "\\sqrt{117}", True),
        ("(3, 4]", "(3,4]", True),
        ("[3, 4]", "(3,4]", False),
        ("\\{1, -2\\}", "1,-2", True),
        ("x=5", "5", True),
        ("90", "90^\\circ", True),
        ("6 - 5 i", "6-5i", True),
        ("6 + 5i", "6-5i", False),
        ("1/3", "0.333333", True),  # math-verify's 6-decimal rule, kept on purpose
        ("\\pi/2", "\\frac{\\pi}{2}", True),
        ("2x+3", "3+2x", True),
        ("\\text{Evelyn}", "\\text{Evelyn}", True),
    ],
)
def test_slow_path_latex(pred, gold, correct, pool):
    v = verify_answer(pred, gold, pool=pool, use_cache=False)
    assert v.correct is correct, v.reason
    assert v.score == (1.0 if correct else 0.0)


def test_tri_state(pool):
    ungradeable = verify_answer("5", "@@@", pool=pool, use_cache=False)
    assert ungradeable.score is None and ungradeable.correct is None
    assert ungradeable.reason == "ungradeable: the reference answer could not be parsed"
    assert verify_answer("5", "   ", pool=pool).reason == "ungradeable: empty reference answer"
    assert verify_answer(None, "5", pool=pool).reason == "no answer"
    unparsed = verify_answer("@@@", "5", pool=pool, use_cache=False)
    assert (unparsed.score, unparsed.reason) == (0.0, "incorrect (the answer could not be parsed as math)")


@pytest.mark.parametrize(
    ("pred", "reason"),
    [
        ("1" * 1001, "answer longer than 1000 characters (1001)"),
        ("\ud800", "answer is not valid Unicode (lone surrogate)"),
        ("1\x00", "answer contains control characters"),
        ("\u202e7", "answer contains control characters"),
        ("  ", "empty answer"),
        ("(" * 65 + "1" + ")" * 65, "answer nested deeper than 64 brackets"),
        ("123 \\bmod 7", "answer uses a modulo operator the reference does not (not evaluated)"),
    ],
)
def test_prefilter_reasons(pred, reason, pool):
    assert prefilter(pred, "7") == reason
    v = verify_answer(pred, "7", pool=pool)
    assert (v.score, v.correct, v.reason) == (0.0, False, f"rejected: {reason}")


def test_modulo_allowed_when_the_gold_uses_it():
    assert prefilter("3 \\pmod 7", "3 \\pmod{7}") is None


def test_bad_worker_count_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("LRMGYM_VERIFIER_WORKERS", "lots")
    msg = "LRMGYM_VERIFIER_WORKERS must be a positive integer, got 'lots'."
    with pytest.raises(ValueError, match=f"^{mv.re.escape(msg)}$"):
        VerifierPool()
    monkeypatch.setenv("LRMGYM_VERIFIER_WORKERS", "3")
    assert VerifierPool().size == 3  # no worker starts before the first check


def test_bad_timeout_is_a_clear_error():
    msg = "timeout_s must be a positive number of seconds, got 0."
    with pytest.raises(ValueError, match=f"^{mv.re.escape(msg)}$"):
        verify_answer("1", "1", timeout_s=0)


# ------------------------------------------------------------------------------------------------ cache
def test_cache_hits_are_marked_and_timeouts_are_not_cached(pool):
    # Observed through the pool's worker-check counter: a miss asks a worker once, a hit asks none.
    mv.clear_cache()
    checks = pool.stats["checks"]
    first = verify_answer("\\sqrt{4}", "2", pool=pool)
    assert pool.stats["checks"] == checks + 1 and len(mv._CACHE) == 1
    second = verify_answer("\\sqrt{4}", "2", pool=pool)
    assert pool.stats["checks"] == checks + 1  # the hit needed no worker
    assert (first.components[0].cached, second.components[0].cached) == (False, True)
    assert (first.score, first.correct, first.reason) == (second.score, second.correct, second.reason)
    assert (second.score, second.correct, second.reason) == (1.0, True, "correct")
    # A pair that differs in one part (the gold, the answer, or the two swapped) misses and gets its own verdict.
    for pred, gold, correct in [("\\sqrt{4}", "3", False), ("\\sqrt{9}", "2", False), ("2", "\\sqrt{4}", True)]:
        checks = pool.stats["checks"]
        v = verify_answer(pred, gold, pool=pool)
        assert not v.components[0].cached and v.correct is correct, (pred, gold, v.reason)
        assert pool.stats["checks"] == checks + 1, (pred, gold)
    # A timeout is not cached: the same pair asks a worker again.
    hostile = "\\int_{0}^{1} e^{x^{2}} \\sin(x^{3}) dx"
    for _ in range(2):
        checks = pool.stats["checks"]
        v = verify_answer(hostile, "1", timeout_s=0.5, pool=pool)
        assert not v.components[0].cached and v.score == 0.0
        assert pool.stats["checks"] == checks + 1
    assert len(mv._CACHE) == 4


# ------------------------------------------------------------------------------------------------ hostile input
@pytest.mark.parametrize(
    "pred",
    [
        "9**9**9",
        "10^{10^{10}}",
        "9^{9^{9}}",
        "10000000!",
        "\\int_{0}^{1} e^{x^{2}} \\sin(x^{3}) dx",
        "(" * 1000 + "1" + ")" * 1000,
        "1" * (1 << 20),
        "\x00" * 100,
        "\udc80\ud800",
        "\\dfrac{5^{\\left(5^{\\left(5^{\\left(5^5\\right)}\\right)} - 4\\right)} - 5}{16}",
    ],
)
def test_hostile_answers_end_within_the_bound_and_the_pool_survives(pred, pool):
    start = time.perf_counter()
    v = verify_answer(pred, "1", timeout_s=1.0, pool=pool, use_cache=False)
    elapsed = time.perf_counter() - start
    assert v.score == 0.0 and v.correct is False, v.reason  # never ungradeable: that would be an opt-out
    assert elapsed < 1.0 + SLACK_S, (v.reason, elapsed)
    assert verify_answer("\\frac{2}{4}", "0.5", pool=pool, use_cache=False).correct  # fast path
    assert verify_answer("\\sqrt{9}", "3", pool=pool, use_cache=False).correct  # a worker still answers


def test_a_worker_stuck_in_c_code_is_killed_and_replaced():
    """A worker that ignores its own timer (as in C code: the ``stall`` test hook) is SIGKILLed at the bound."""
    with VerifierPool(size=1) as private:
        private.warm()
        (old_pid,) = private.worker_pids()
        start = time.perf_counter()
        reply = private._run({"gold": "1", "pred": "1", "budget": 0.1, "stall": 30}, timeout_s=0.5)
        elapsed = time.perf_counter() - start
        assert reply == {"status": "hard_timeout", "equal": False, "phase": "pred"}
        assert elapsed < 0.5 + SLACK_S
        assert private.stats["killed"] == 1 and _wait_gone([old_pid])
        assert verify_answer("\\sqrt{16}", "4", pool=private, use_cache=False).correct
        assert private.worker_pids() and private.worker_pids() != [old_pid]


def test_hard_timeout_on_the_prediction_scores_zero_and_is_not_cached(pool):
    """A timeout the prediction caused is its fault (0, not ungradeable: no opting out), but load-dependent."""
    reply = {"status": "hard_timeout", "equal": False, "phase": "pred"}
    outcome = mv._slow_outcome(reply, 0.5)
    assert (outcome.score, outcome.correct) == (0.0, False)
    assert outcome.reason == "incorrect: the answer exhausted the checker's 0.5 s budget"
    mv.clear_cache()
    v = verify_answer("\\int_{0}^{1} e^{x^{2}} \\sin(x^{3}) dx", "1", timeout_s=0.5, pool=pool)
    assert v.score == 0.0 and v.reason == "incorrect: the answer exhausted the checker's 0.5 s budget"
    assert len(mv._CACHE) == 0


# ------------------------------------------------------------------------------------------------ callers
def test_works_from_many_threads(pool):
    pairs = [(f"\\sqrt{{{n * n}}}", str(n)) for n in range(2, 26)]
    with ThreadPoolExecutor(8) as executor:
        verdicts = list(executor.map(lambda p: verify_answer(*p, pool=pool, use_cache=False), pairs))
    assert all(v.correct for v in verdicts), [v.reason for v in verdicts]


def test_works_from_asyncio(pool):
    async def main():
        return await asyncio.gather(
            *(
                asyncio.to_thread(verify_answer, f"\\frac{{{n}}}{{2}}", f"{n / 2}", pool=pool, use_cache=False)
                for n in range(1, 9)
            )
        )

    assert all(v.correct for v in asyncio.run(main()))


def test_verify_many_keeps_order(pool):
    pairs = [("\\sqrt{4}", "2"), ("3", "2"), ("\\sqrt{9}", "3"), ("1" * 5000, "1")]
    assert [v.score for v in verify_many(pairs, pool=pool, use_cache=False)] == [1.0, 0.0, 1.0, 0.0]


def _verify_in_child(pair):
    verdict = verify_answer(*pair, use_cache=False)
    pids = mv.default_pool().worker_pids()
    return verdict.correct, pids, os.getpid()


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_works_from_worker_processes(method, pool, monkeypatch):
    mv.default_pool()  # the parent has a default pool too: a forked child must not use the parent's workers
    monkeypatch.setenv("LRMGYM_VERIFIER_WORKERS", "1")  # one verifier worker per child keeps the test quick
    ctx = multiprocessing.get_context(method)
    with ctx.Pool(1) as procs:
        results = procs.map(_verify_in_child, [("\\sqrt{4}", "2"), ("\\sqrt{2}", "2")])
    assert [r[0] for r in results] == [True, False]
    parent_pids = set(mv.default_pool().worker_pids()) | set(pool.worker_pids())
    for _, child_pids, _ in results:
        assert child_pids and not set(child_pids) & parent_pids


# ------------------------------------------------------------------------------------------------ leaks
def test_close_leaves_no_process(pool):
    private = VerifierPool(size=1)
    private.warm()
    pids = private.worker_pids()
    assert len(pids) == 1
    private.close()
    assert _wait_gone(pids)
    assert private.worker_pids() == []


_CHILD = textwrap.dedent(
    """
    import sys, time
    from lrmgym.envs.math.verify import default_pool, verify_answer
    assert verify_answer("\\\\sqrt{4}", "2").correct
    default_pool().warm()
    print(" ".join(map(str, default_pool().worker_pids())), flush=True)
    if sys.argv[1] == "hang":
        time.sleep(60)
    """
)


@pytest.mark.parametrize("ending", ["exit", "hang"])
def test_no_worker_outlives_its_interpreter(ending):
    """Normal exit runs the atexit hook; SIGKILL of the parent reaches the workers by the parent-death signal."""
    env = dict(os.environ, LRMGYM_VERIFIER_WORKERS="2")
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, ending], stdout=subprocess.PIPE, text=True, env=env)
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2
    if ending == "hang":
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert _wait_gone(pids), [p for p in pids if not _gone(p)]


def test_no_thread_or_fd_growth_over_many_checks(pool):
    """Repeated checks, including killed workers, do not grow the parent's threads or open files."""
    verify_answer("\\sqrt{4}", "2", pool=pool, use_cache=False)
    me = psutil.Process()
    threads, fds, rss = threading.active_count(), me.num_fds(), me.memory_info().rss
    for n in range(30):
        verify_answer(f"\\sqrt{{{n + 2}}}", "2", pool=pool, use_cache=False)
        verify_answer(str(n) * (1 << 20), "2", pool=pool)  # 1-2 MB answers are rejected, never kept
    verify_answer("9^{9^{9}}", "2", timeout_s=0.5, pool=pool, use_cache=False)
    verify_answer("\\sqrt{4}", "2", pool=pool, use_cache=False)
    assert threading.active_count() <= threads + 1  # the spawner thread may have been (re)started
    assert me.num_fds() <= fds + 2
    assert me.memory_info().rss - rss < 20 << 20
    assert len(pool.worker_pids()) <= pool.size
