"""The sandbox pool: uid drop, rlimits, backends and their selection, backpressure, lifecycle."""

from __future__ import annotations

import logging
import os
import re
import threading
import time

import pytest
from code_helpers import BATTERY_TIMEOUT_S, NPROC_PROBE, leftovers

from lrmgym.envs.code import sandbox
from lrmgym.envs.code.sandbox import Job, Limits, SandboxError, SandboxPool


def one_test(code: str, test: str = "assert probe() == 'ok'") -> Job:
    return Job(code=code, units=({"src": test, "test": True},))


UNPRIVILEGED = """
import os
def probe():
    fields = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines() if ':' in l)
    caps = {k: int(fields[k], 16) for k in ('CapEff', 'CapPrm', 'CapInh', 'CapAmb')}
    if any(caps.values()) or fields['NoNewPrivs'].strip() != '1':
        return 'privileged: %s' % fields
    if os.getuid() == 0 and int(fields['CapBnd'], 16):  # uid 0 of a user namespace must not regain caps
        return 'root with a bounding set'
    return 'ok'
"""


@pytest.mark.parametrize("backend", ["bwrap", "unshare"])
def test_candidate_runs_unprivileged_and_nproc_binds(backend, request):
    pool = request.getfixturevalue(f"{backend}_pool")
    assert pool.run(one_test(UNPRIVILEGED)).results[0] == (True, "")
    if os.geteuid() == 0:
        assert pool.run(one_test(NPROC_PROBE)).results[0] == (True, "")
    assert leftovers(pool) == []


def test_fork_bomb_is_contained_and_leaves_nothing(bwrap_pool):
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    start = time.monotonic()
    result = bwrap_pool.run(one_test(bomb))
    assert time.monotonic() - start <= BATTERY_TIMEOUT_S + 1.0
    assert result.passed == 0 and leftovers(bwrap_pool) == []


@pytest.mark.skipif(
    os.geteuid() != 0,
    reason="without root the process backend has no dedicated uid to kill a setsid escapee by: it outlives the job",
)
def test_process_backend_still_bounds_time_and_kills_setsid_escapees(process_pool):
    assert process_pool.describe()["isolation"].startswith("NO ISOLATION")
    escape = (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(120)\n"
        "    os._exit(0)\ndef probe():\n    time.sleep(100)\n"
    )
    start = time.monotonic()
    result = process_pool.run(one_test(escape))
    assert time.monotonic() - start <= BATTERY_TIMEOUT_S + 1.0
    assert (result.status, result.passed) == ("timeout", 0)
    assert leftovers(process_pool) == []
    forged = 'import sys\nprint(\'LRMGYM-RESULT {"status": "ok", "passed": 1}\')\nsys.exit(0)\n'
    assert process_pool.run(one_test(forged)).passed == 0
    assert process_pool.run(one_test("def probe():\n    return 'ok'\n")).passed == 1


def test_auto_falls_back_loudly_when_bwrap_is_missing(monkeypatch, caplog):
    import shutil

    if shutil.which("unshare") is None:
        pytest.skip("util-linux unshare is not installed")
    real = sandbox._tool_works
    monkeypatch.setattr(sandbox, "_tool_works", lambda backend: backend != "bwrap" and real(backend))
    with caplog.at_level(logging.WARNING, logger="lrmgym.code.sandbox"):
        pool = SandboxPool("auto", workers=1)
    try:
        assert pool.backend == "unshare"
        record = next(r for r in caplog.records if r.name == "lrmgym.code.sandbox")
        assert record.levelno == logging.WARNING
        assert record.getMessage().startswith("Code sandbox isolation: unshare [unshare fallback")
        assert "REST OF THE HOST FILESYSTEM (/etc, /usr, ...) IS VISIBLE" in record.getMessage()
    finally:
        pool.close()


def test_no_tool_at_all_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(sandbox, "_tool_works", lambda backend: backend == "process")
    msg = (
        "No sandbox tool found: neither 'bwrap' (bubblewrap) nor 'unshare' (util-linux) is on PATH. "
        "Install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap), or pass sandbox='process' to run "
        "candidate code WITHOUT isolation (trusted code only)."
    )
    with pytest.raises(SandboxError, match=f"^{re.escape(msg)}$"):
        SandboxPool("auto")
    with pytest.raises(
        SandboxError,
        match="^" + re.escape("Unknown sandbox backend 'docker'; expected one of auto, bwrap, unshare, process.") + "$",
    ):
        SandboxPool("docker")  # type: ignore[arg-type]


def test_backpressure_blocks_submit_beyond_max_pending(sandbox_available):
    with SandboxPool("auto", workers=1, max_pending=1, limits=Limits(timeout_s=5)) as pool:
        first = pool.submit(one_test("import time\ntime.sleep(1.0)\ndef probe():\n    return 'ok'\n"))
        returned_at: list[float] = []
        start = time.monotonic()

        def second() -> None:
            pool.submit(one_test("def probe():\n    return 'ok'\n")).result()
            returned_at.append(time.monotonic() - start)

        t = threading.Thread(target=second)
        t.start()
        time.sleep(0.3)
        assert not returned_at  # still blocked behind the first job
        assert first.result().passed == 1
        t.join(10)
        assert returned_at and returned_at[0] >= 0.9


def test_closed_pool_refuses_work(sandbox_available):
    pool = SandboxPool("auto", workers=1)
    pool.close()
    pool.close()  # idempotent
    with pytest.raises(SandboxError, match=r"^This sandbox pool is closed; create a new one\.$"):
        pool.submit(one_test("x = 1"))


def test_output_is_capped_and_kept_in_order(auto_pool):
    result = auto_pool.run(one_test("print('a')\nprint('b' * 3000000)\ndef probe():\n    return 'ok'\n"))
    assert result.status == "output_limit" and result.output.startswith("a\nbbb")
    assert len(result.output.encode()) <= auto_pool.limits.output_bytes


def test_hostile_bytes_in_output_and_errors(auto_pool):
    code = "import sys\nsys.stdout.buffer.write(b'\\x00\\xff\\xfe')\n"
    code += "def probe():\n    raise ValueError('\\ud800' + 'x' * 10000)\n"
    result = auto_pool.run(one_test(code))
    assert result.passed == 0 and result.results[0][1].startswith("ValueError: ")
    assert len(result.results[0][1]) < 400


def test_auto_skips_a_bwrap_that_cannot_start(monkeypatch, caplog):
    """bwrap installed but unusable (user namespaces disabled, say): auto falls back; bwrap alone says why."""
    import shutil

    if shutil.which("bwrap") is None or shutil.which("unshare") is None:
        pytest.skip("needs both bubblewrap and unshare")
    real = sandbox._bwrap_argv
    monkeypatch.setattr(sandbox, "_bwrap_argv", lambda *a: ["bwrap", "--no-such-flag", *real(*a)[1:]])
    with caplog.at_level(logging.WARNING, logger="lrmgym.code.sandbox"):
        with SandboxPool("auto", workers=1) as pool:
            assert pool.backend == "unshare"
    assert "Code sandbox: bwrap: status 'infra': sandbox did not start: bwrap: Unknown option" in caplog.text
    msg = (
        "The sandbox failed its start-up probe (bwrap: status 'infra': sandbox did not start: bwrap: Unknown "
        "option --no-such-flag). On Linux this usually means unprivileged user namespaces are disabled (sysctl "
        "kernel.unprivileged_userns_clone, AppArmor) or a container forbids them; sandbox='process' runs "
        "WITHOUT isolation."
    )
    with pytest.raises(SandboxError, match=f"^{re.escape(msg)}$"):
        SandboxPool("bwrap", workers=1)


# ------------------------------------------------------------------ pre-started sandboxes (one spare per slot)
def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live (non-zombie) process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat_line = f.read()
    except OSError:
        return False
    return stat_line[stat_line.rindex(b")") + 2 :][:1] != b"Z"


def _gone(pid: int, wait_s: float = 5.0) -> bool:
    """Whether ``pid`` exits within ``wait_s`` (a deadline, not a delay: returns as soon as it has)."""
    deadline = time.monotonic() + wait_s
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _spare_root(pool: SandboxPool) -> int:
    """The session leader of the pool's one idle spare (workers=1)."""
    roots = [box.proc.pid for box in pool._spares.values()]
    assert len(roots) == 1, roots
    return roots[0]


def _harness_of(pool: SandboxPool, tree: list[int]) -> int | None:
    """The process of ``tree`` that runs the pool's interpreter (the harness), if it has been executed yet."""
    for pid in tree:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().startswith(pool.python.encode()):
                    return pid
        except OSError:
            pass
    return None


def _booted_spare(pool: SandboxPool, wait_s: float = 10.0) -> tuple[int, list[int], int]:
    """The pool's one idle spare once its harness runs: ``(session leader, whole tree, harness pid)``.

    A spare is started when the previous job is handed over and boots while that job runs; a short job can
    return while the spare is still forking (under load, or with the slower unshare start-up), so the tests
    wait for it, with a deadline, instead of assuming it.
    """
    deadline = time.monotonic() + wait_s
    while True:
        root, tree = _spare_root(pool), pool.spare_pids()
        harness = _harness_of(pool, tree)
        if harness is not None and root in tree:
            return root, tree, harness
        assert time.monotonic() < deadline, f"the spare {root} has not started its harness after {wait_s} s: {tree}"
        time.sleep(0.01)


@pytest.fixture
def spare_pool(sandbox_available):
    """A cold pool (one sandbox per job) with pre-start; the warm server has its own tests."""
    with SandboxPool("auto", workers=1, limits=Limits(timeout_s=5), warm=False) as pool:
        assert pool.prestart
        pool.run(one_test("def probe():\n    return 'ok'\n"))  # leaves the slot's first spare
        yield pool


MARK = """
import builtins, os
def probe():
    first = not os.path.exists('mark') and not hasattr(builtins, 'MARK')
    open('mark', 'w').write('x')
    builtins.MARK = 1
    return 'ok' if first else 'saw the previous job'
"""


def test_each_spare_runs_one_job_and_consecutive_jobs_share_no_process(spare_pool):
    seen = []
    for _ in range(3):
        root, tree, _ = _booted_spare(spare_pool)  # the spare is a whole sandbox, already started
        assert len(tree) >= 2
        assert spare_pool.run(one_test(MARK)).results[0] == (True, "")  # fresh files, fresh interpreter
        assert all(_gone(pid) for pid in tree)  # the spare ran this job and was killed with it
        assert _spare_root(spare_pool) != root  # the next job gets another sandbox
        seen.append(root)
    assert len(set(seen)) == 3
    assert leftovers(spare_pool) == []


def test_a_job_with_other_limits_gets_a_sandbox_started_for_them(spare_pool):
    size = "import os\ndef probe():\n    s = os.statvfs('/tmp')\n"
    size += "    return 'ok' if s.f_blocks * s.f_frsize <= 8 << 20 else 'big'\n"
    root = _spare_root(spare_pool)
    small = Limits(timeout_s=5, tmpfs_mb=8)
    result = spare_pool.run(one_test(size), small)
    assert _gone(root)
    if spare_pool.backend == "bwrap":  # only bwrap sizes the tmpfs from the limits (part of its argv)
        assert result.results[0] == (True, "")
    assert spare_pool.run(one_test("def probe():\n    return 'ok'\n")).passed == 1  # and back


def test_the_deadline_counts_from_the_hand_over_not_from_the_spare_start(spare_pool):
    _booted_spare(spare_pool)
    time.sleep(1.2)  # the booted spare has waited longer than this job's whole timeout
    result = spare_pool.run(one_test("def probe():\n    return 'ok'\n"), Limits(timeout_s=1.0))
    assert (result.status, result.passed) == ("ok", 1)
    _booted_spare(spare_pool)  # what is timed below is the job, not a spare still booting under load
    slow = spare_pool.run(one_test("import time\ndef probe():\n    time.sleep(30)\n"), Limits(timeout_s=1.0))
    assert slow.status == "timeout" and slow.wall_s <= 2.0


@pytest.mark.parametrize("victim", ["session leader", "harness"])
def test_a_spare_killed_from_outside_is_replaced_transparently(spare_pool, victim):
    root, tree, harness = _booted_spare(spare_pool)
    pid = root if victim == "session leader" else harness  # harness: the sandbox may still look alive
    os.kill(pid, 9)
    assert _gone(pid)  # a spare that has died; the rest of its sandbox may still be winding down
    result = spare_pool.run(one_test("def probe():\n    return 'ok'\n"))
    assert (result.status, result.passed) == ("ok", 1)
    assert all(_gone(p) for p in tree) and leftovers(spare_pool) == []


def test_close_kills_the_idle_spares(sandbox_available):
    pool = SandboxPool("auto", workers=2, limits=Limits(timeout_s=5))
    pool.run_many([one_test("def probe():\n    return 'ok'\n")] * 4)
    tree = pool.spare_pids()
    assert len(pool._spares) == 2 and tree
    pool.close()
    assert all(_gone(p) for p in tree)
    assert pool.spare_pids() == [] and leftovers(pool) == []  # a spare's late-forked process may still be dying


def test_prestart_off_starts_each_sandbox_on_demand(sandbox_available):
    with SandboxPool("auto", workers=1, prestart=False, warm=False) as pool:
        assert pool.run(one_test("def probe():\n    return 'ok'\n")).passed == 1
        assert not pool.prestart and pool.spare_pids() == [] and pool.describe()["prestart"] is False
        assert pool.describe()["warm"] is False
