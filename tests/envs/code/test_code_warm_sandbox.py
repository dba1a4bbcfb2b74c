"""The warm server (bubblewrap only): one long-lived sandbox per slot forking fresh namespaces for each job.

Each test runs hostile jobs on one server and checks that the next job on the *same* server (its pid is
checked) sees nothing of them: files, processes, interpreter state, kernel keyrings, the previous job's tests;
that the server cannot be reached from a job; that a server killed from outside costs nothing but a rerun;
and that warm and cold give the same results. No timing assertions; generous timeouts.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
import uuid

import pytest
from code_helpers import NPROC_PROBE as COLD_NPROC_PROBE
from code_helpers import leftovers

from lrmgym.envs.code import sandbox
from lrmgym.envs.code.sandbox import Job, Limits, SandboxError, SandboxPool
from lrmgym.testing.procs import proc_table

TIMEOUT_S = 5.0
OK = "def probe():\n    return 'ok'\n"


def one_test(code: str, test: str = "assert probe() == 'ok'") -> Job:
    return Job(code=code, units=({"src": test, "test": True},))


def _warm_pool(workers: int = 1) -> SandboxPool:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")
    try:
        pool = SandboxPool("bwrap", workers=workers, limits=Limits(timeout_s=TIMEOUT_S))
    except SandboxError as err:
        pytest.skip(f"the bwrap sandbox cannot start here: {err}")
    if not pool.warm:
        pool.close()
        pytest.skip("the warm server cannot start here (the pool runs cold; see its warning)")
    return pool


@pytest.fixture
def warm_pool():
    pool = _warm_pool()
    assert pool.run(one_test(OK)).passed == 1
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def cold_pool():
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")
    pool = SandboxPool("bwrap", workers=1, limits=Limits(timeout_s=TIMEOUT_S), warm=False)
    yield pool
    pool.close()


def _server(pool: SandboxPool) -> int:
    """Host pid of the slot's idle warm server (its bwrap process)."""
    assert list(pool._servers) == [0], pool._servers
    return pool._servers[0].proc.pid


def _children(pid: int) -> list[int]:
    return [child for child, (parent, _, zombie) in proc_table().items() if parent == pid and not zombie]


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True
    return stat[stat.rindex(b")") + 2 :][:1] == b"Z"


def _server_tree(pool: SandboxPool, wait_s: float = 10.0) -> tuple[int, int, int]:
    """``(S, J, H)``: the idle server's pid 1 and its ready job process and harness, once it has exactly those.

    Waits (with a deadline) until the tree is bwrap -> S -> J -> H and nothing else, the same over 0.2 s (the
    previous job's J and H may still be exiting): whatever the previous job left has died with its pid
    namespace.
    """
    root = _server(pool)
    deadline = time.monotonic() + wait_s
    seen = None
    while True:
        tree = [root]
        for _ in range(3):
            kids = _children(tree[-1])
            if len(kids) != 1:
                break
            tree.append(kids[0])
        if len(tree) == 4 and not _children(tree[-1]):
            if seen == tree:
                return tree[1], tree[2], tree[3]
            seen = tree
            time.sleep(0.2)
            continue
        seen = None
        assert time.monotonic() < deadline, f"the idle server's tree is not S -> J -> H: {pool.spare_pids()}"
        time.sleep(0.02)


def _same_server(pool: SandboxPool, before: int) -> None:
    assert _server(pool) == before, "the job should have run on the same warm server"


def test_a_warm_pool_reuses_one_server_and_says_so(warm_pool):
    root = _server(warm_pool)
    for _ in range(3):
        assert warm_pool.run(one_test(OK)).passed == 1
        _same_server(warm_pool, root)
    assert warm_pool.describe()["warm"] is True
    _server_tree(warm_pool)


FILES = """
import os
def probe():
    seen = [p for p in ('/tmp/work/mark', '/tmp/mark', '/dev/shm/mark') if os.path.exists(p)]
    seen += [p for p in os.listdir('.') + os.listdir('/tmp') + os.listdir('/dev/shm') if p != 'work']
    blocked = []
    for p in ('/tmp/work/mark', '/tmp/mark', '/dev/shm/mark', '/mark', '/dev/mark', '/usr/mark'):
        try:
            open(p, 'w').write('x')
        except OSError:
            blocked.append(p)
    if blocked != ['/mark', '/dev/mark', '/usr/mark']:
        return 'writable: %s' % blocked
    return 'ok' if not seen else 'saw the previous job: %s' % seen
"""


def test_files_of_a_job_do_not_reach_the_next(warm_pool):
    root = _server(warm_pool)
    for _ in range(3):  # each job writes its marks; none sees the previous job's
        result = warm_pool.run(one_test(FILES))
        assert result.results[0] == (True, ""), result
        _same_server(warm_pool, root)


BACKGROUND = """
import os, time
for _ in range(3):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(120)
        os._exit(0)
time.sleep(0.2)
def probe():
    return 'ok'
"""
ALONE = """
import os
def probe():
    pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
    return 'ok' if pids == [1, os.getpid()] and os.getppid() == 1 else 'not alone: %s' % pids
"""


def test_a_background_process_dies_with_its_job(warm_pool):
    root = _server(warm_pool)
    assert warm_pool.run(one_test(BACKGROUND)).passed == 1
    _same_server(warm_pool, root)
    _server_tree(warm_pool)  # S, J, H of the next job and nothing else: the sleepers are gone
    assert leftovers(warm_pool) == []
    result = warm_pool.run(one_test(ALONE))
    assert result.results[0] == (True, ""), result
    _same_server(warm_pool, root)


PATCH = """
import builtins, sys, os
builtins.MARK = 1
builtins.abs = lambda x: 42
builtins.sorted = lambda x: [0]
sys.modules['json'] = 'poisoned'
sys.path.insert(0, '/tmp/work')
os.environ['MARK'] = '1'
def probe():
    return 'ok'
"""
CLEAN = """
import builtins, sys, os
def probe():
    bad = [hasattr(builtins, 'MARK'), abs(-2) != 2, sorted([2, 1]) != [1, 2], os.environ.get('MARK'),
           sys.modules.get('json', sys) == 'poisoned', '/tmp/work' in sys.path]
    import json
    return 'ok' if not any(bad) and json.loads('[1]') == [1] else 'patched: %s' % bad
"""


def test_interpreter_state_patched_by_a_job_does_not_reach_the_next(warm_pool):
    root = _server(warm_pool)
    assert warm_pool.run(one_test(PATCH)).passed == 1
    _same_server(warm_pool, root)
    result = warm_pool.run(one_test(CLEAN, "assert probe() == 'ok' and abs(-1) == 1 and sorted([2, 1]) == [1, 2]"))
    assert result.results[0] == (True, ""), result
    _same_server(warm_pool, root)


REACH = """
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
def probe():
    got = []
    if os.getppid() != 1:
        got.append('parent %d' % os.getppid())
    if libc.ptrace(16, 1, 0, 0) == 0:  # PTRACE_ATTACH to the harness
        got.append('ptrace')
    for p in ('/proc/1/mem', '/proc/1/environ', '/proc/1/fd/0', '/proc/1/fd/1', '/proc/1/fd/3', '/proc/1/fd/4'):
        try:
            open(p, 'rb').close()
            got.append(p)
        except OSError:
            pass
    try:
        pidfd = os.pidfd_open(1)
        for fd in range(8):
            if libc.syscall(438, pidfd, fd, 0) >= 0:
                got.append('pidfd_getfd %d' % fd)
    except OSError:
        pass
    pids = [int(p) for p in os.listdir('/proc') if p.isdigit()]
    if sorted(pids) != [1, os.getpid()]:
        got.append('sees %s' % pids)
    status = dict(l.split(':', 1) for l in open('/proc/self/status') if ':' in l)
    caps = [k for k in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb') if int(status[k], 16)]
    if caps or status['NoNewPrivs'].strip() != '1' or status['Seccomp'].strip() != '2':
        got.append('status %s %s %s' % (caps, status['NoNewPrivs'].strip(), status['Seccomp'].strip()))
    if libc.syscall(250, 0, -4, 1) != -1 or ctypes.get_errno() != 38:  # keyctl(GET_KEYRING_ID, user keyring)
        got.append('keyctl')
    if libc.unshare(0x10000000) == 0:  # CLONE_NEWUSER
        got.append('userns')
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass
    return 'ok' if not got else 'reached: %s' % got
"""


def test_a_job_cannot_reach_the_server_or_its_harness(warm_pool):
    root = _server(warm_pool)
    result = warm_pool.run(one_test(REACH))
    assert result.results[0] == (True, ""), result
    _same_server(warm_pool, root)
    assert warm_pool.run(one_test(OK)).passed == 1
    _same_server(warm_pool, root)


@pytest.mark.parametrize("victim", ["bwrap", "server", "job process", "harness"])
def test_a_server_killed_from_outside_costs_only_a_rerun(warm_pool, victim):
    s, j, h = _server_tree(warm_pool)
    root = _server(warm_pool)
    pid = {"bwrap": root, "server": s, "job process": j, "harness": h}[victim]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not _dead(pid):  # gone, not merely signalled: otherwise it is a server killed during the job
        assert time.monotonic() < deadline
        time.sleep(0.01)
    result = warm_pool.run(one_test(OK))
    assert (result.status, result.passed) == ("ok", 1), result
    assert _server(warm_pool) != root  # a fresh server ran it
    assert leftovers(warm_pool) == []


def test_the_next_ready_read_with_a_record_is_kept_for_the_next_job(warm_pool, monkeypatch):
    """A busy parent may read a record and the next job process's READY in one chunk (seen under load)."""
    real = sandbox._report_complete
    held = []

    def late(out):  # the first time the record is complete, wait for more: the next READY
        if real(out) and not held:
            held.append(1)
            return False
        return real(out)

    monkeypatch.setattr(sandbox, "_report_complete", late)
    root = _server(warm_pool)
    for _ in range(3):
        held.clear()
        result = warm_pool.run(one_test(OK))
        assert (result.status, result.passed) == ("ok", 1), result
        _same_server(warm_pool, root)
        assert warm_pool._servers[0].pending == sandbox._READY  # read with the record, kept for the next job


def test_a_server_is_replaced_after_a_job_that_did_not_end_cleanly(warm_pool):
    root = _server(warm_pool)
    result = warm_pool.run(one_test("import time\ndef probe():\n    time.sleep(60)\n"), Limits(timeout_s=1.0))
    assert (result.status, result.passed) == ("timeout", 0)
    assert 0 not in warm_pool._servers or _server(warm_pool) != root
    assert warm_pool.run(one_test(OK)).passed == 1
    assert _server(warm_pool) != root


# The cold test's probe, also with a floor: the server and its job process count against the uid's RLIMIT_NPROC
# too, but the limit must not cut the candidate's forks below 32.
NPROC_PROBE = COLD_NPROC_PROBE.replace("'ok' if n < 64", "'ok' if 32 <= n < 64")
BOMB = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="RLIMIT_NPROC binds only with a dedicated slot uid (root caller)")
def test_nproc_binds_on_every_job_and_nothing_accumulates(warm_pool):
    root = _server(warm_pool)
    for _ in range(3):  # a job's 60 sleepers are gone before the next job counts its tasks
        result = warm_pool.run(one_test(NPROC_PROBE))
        assert result.results[0] == (True, ""), result
        _same_server(warm_pool, root)
    bomb = warm_pool.run(one_test(BOMB))
    assert bomb.passed == 0
    result = warm_pool.run(one_test(NPROC_PROBE))
    assert result.results[0] == (True, ""), result
    assert leftovers(warm_pool) == []


def _memory_holds(pid: int, token: bytes) -> bool:
    """Whether any readable mapping of ``pid`` holds ``token`` (read as root through /proc/<pid>/mem)."""
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("r") or "[vvar" in line or "[vsyscall" in line:
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(start)
                if token in mem.read(end - start):
                    return True
            except OSError:
                continue
    return False


SCAN_OWN_MEMORY = """
import ctypes, os
HALVES = (HALF1, HALF2)  # never joined here: only the previous job could have put the whole token in memory
def found():
    # The candidate is not dumpable (forked from the harness), so /proc/self/mem is closed to it: it reads
    # its own anonymous memory (heap, arenas, stack) directly.
    with open('/proc/self/maps') as maps:
        spans = [line.split() for line in maps]
    for fields in spans:
        if not fields[1].startswith('rw') or (len(fields) > 5 and fields[5] not in ('[heap]', '[stack]')):
            continue
        start, end = (int(x, 16) for x in fields[0].split('-'))
        data = ctypes.string_at(start, end - start)
        at = data.find(HALVES[0])
        while at >= 0:
            if data[at + len(HALVES[0]) : at + len(HALVES[0]) + len(HALVES[1])] == HALVES[1]:
                return True
            at = data.find(HALVES[0], at + 1)
    for root, _, files in os.walk('/tmp'):
        for f in files:
            if HALVES[1] in open(os.path.join(root, f), 'rb').read():
                return True
    return False
def probe():
    return 'found the previous job' if found() else 'ok'
"""


def test_a_job_never_holds_the_previous_jobs_tests_nor_does_the_server(warm_pool):
    token = ("lrmsecret" + uuid.uuid4().hex).encode()
    half1, half2 = token[:12], token[12:]
    root = _server(warm_pool)
    secret_job = Job(
        code="def add(a, b):\n    return a + b\n",
        units=({"src": f"assert add(1, 2) == 3, {token.decode()!r}", "test": True},),
        prelude=f"SECRET = {token.decode()!r}",
    )
    assert warm_pool.run(secret_job).passed == 1
    stdio = Job(
        code="print(input())\n", cases=({"stdin": token.decode() + "\n", "stdout": token.decode()},), mode="stdio"
    )
    assert warm_pool.run(stdio).passed == 1
    _same_server(warm_pool, root)
    if os.geteuid() == 0:  # the server and the next job's processes, read from outside
        for pid in _server_tree(warm_pool):
            assert not _memory_holds(pid, token), f"process {pid} of the warm server holds a previous job's data"
    code = SCAN_OWN_MEMORY.replace("HALF1", repr(half1)).replace("HALF2", repr(half2))
    result = warm_pool.run(one_test(code))
    assert result.results[0] == (True, ""), result
    _same_server(warm_pool, root)
    # Positive controls: the scans do find the token where it is.
    control = code + "KEEP = [HALVES[0] + HALVES[1]]\n"
    assert warm_pool.run(one_test(control, "assert probe() == 'found the previous job'")).passed == 1
    if os.geteuid() == 0:
        assert _memory_holds(os.getpid(), token)


PROGRAMS = [
    one_test(OK),
    one_test("def probe():\n    return 'no'\n"),
    one_test("print('hello')\nimport sys\nprint('err', file=sys.stderr)\n" + OK),
    one_test("raise ValueError('at import')\n"),
    one_test("def probe():\n    raise KeyError('k')\n"),
    one_test("import sys\nsys.exit(0)\n"),
    one_test("import sys\ndef probe():\n    return 'ok' if len(sys.argv) == 1 else repr(sys.argv)\n"),
    one_test(
        "import socket\ndef probe():\n    s = socket.socket()\n    s.bind(('127.0.0.1', 0))\n    s.listen(1)\n"
        "    c = socket.create_connection(s.getsockname(), timeout=2)\n    a, _ = s.accept()\n"
        "    c.sendall(b'ok')\n    return a.recv(2).decode()\n"
    ),
    one_test("x = [1, 2, 3]\ndef probe():\n    return 'ok' if sum(x) == 6 else 'no'\n"),
    Job(
        code="def f(a):\n    return sorted(a)\n",
        units=(
            {"src": "xs = [3, 1, 2]", "test": False},
            {"src": "assert f(xs) == [1, 2, 3]", "test": True},
            {"src": "assert f([]) == [1]", "test": True},
        ),
    ),
    one_test("BIG = %r\n" % ("x" * 300_000) + "def probe():\n    return 'ok' if len(BIG) == 300000 else 'no'\n"),
    Job(
        code="import sys\nprint(len(sys.stdin.read()))\n",
        cases=({"stdin": "y" * 200_000, "stdout": "200000"}, {"stdin": "", "stdout": "0"}),
        mode="stdio",
    ),
    Job(
        code="n = int(input())\nprint(n * 2)\n",
        cases=({"stdin": "2\n", "stdout": "4"}, {"stdin": "5\n", "stdout": "11"}),
        mode="stdio",
    ),
]


def test_warm_and_cold_give_the_same_results(warm_pool, cold_pool):
    for job in PROGRAMS:
        warm, cold = warm_pool.run(job), cold_pool.run(job)
        assert (warm.status, warm.passed, warm.total, warm.results, warm.output, warm.error) == (
            cold.status,
            cold.passed,
            cold.total,
            cold.results,
            cold.output,
            cold.error,
        ), job
        assert warm.backend == cold.backend == "bwrap"
    timed = one_test("import time\ndef probe():\n    time.sleep(60)\n")
    warm, cold = warm_pool.run(timed, Limits(timeout_s=1.0)), cold_pool.run(timed, Limits(timeout_s=1.0))
    assert (warm.status, warm.passed) == (cold.status, cold.passed) == ("timeout", 0)


def test_other_limits_get_a_server_started_for_them(warm_pool):
    size = "import os\ndef probe():\n    s = os.statvfs('/tmp')\n"
    size += "    return 'ok' if s.f_blocks * s.f_frsize <= 8 << 20 else 'big'\n"
    root = _server(warm_pool)
    result = warm_pool.run(one_test(size), Limits(timeout_s=TIMEOUT_S, tmpfs_mb=8))
    assert result.results[0] == (True, ""), result
    assert _server(warm_pool) != root
    assert warm_pool.run(one_test(OK)).passed == 1


def test_two_workers_and_close():
    pool = _warm_pool(workers=2)
    results = pool.run_many([one_test(FILES)] * 10 + [one_test(ALONE)] * 4)
    assert all(r.results[0] == (True, "") for r in results), results
    tree = pool.spare_pids()
    assert len(pool._servers) == 2 and tree
    pool.close()
    assert pool.spare_pids() == [] and leftovers(pool) == []
    deadline = time.monotonic() + 10
    while not all(_dead(p) for p in tree):
        assert time.monotonic() < deadline, "the servers outlived close()"
        time.sleep(0.02)


@pytest.mark.parametrize("backend", ["unshare", "process"])
def test_other_backends_run_cold(backend):
    if backend == "unshare" and shutil.which("unshare") is None:
        pytest.skip("util-linux unshare is not installed")
    try:
        pool = SandboxPool(backend, workers=1, limits=Limits(timeout_s=TIMEOUT_S))
    except SandboxError as err:
        pytest.skip(f"the {backend} sandbox cannot start here: {err}")
    with pool:
        assert pool.warm is False and pool.describe()["warm"] is False
        assert pool.run(one_test(OK)).passed == 1
