"""The adversarial battery: hostile candidate programs against every namespaced sandbox backend.

For each case: the expected score (all-or-nothing: every test must pass), done within timeout + 1 s,
nothing written outside the sandbox, the caller and the pool alive (a control job passes afterwards), and no
process of the sandbox uids left behind. Both backends hold every case: the unshare fallback covers /tmp,
/var, /home, /root, /run, /mnt, /media, /srv, /opt, /work and the caller's folder with tmpfs.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from code_helpers import BATTERY_TIMEOUT_S, files_left, leftovers, scratch_snapshot

from lrmgym.envs.code.sandbox import Job, SandboxPool
from lrmgym.testing.adversarial import decode

ADD_TESTS = ("assert add(2, 3) == 5", "assert add(-1, 1) == 0")
CORRECT_ADD = "def add(a, b):\n    return a + b\n"
TOKEN = uuid.uuid4().hex[:10]
"""Per-session suffix of every host path the cases try to create, so stale files cannot fake a pass."""


@dataclass
class Case:
    """One hostile program and what must hold after running it."""

    name: str
    code: str
    score: float | None
    tests: tuple[str, ...] = ADD_TESTS
    status: str | None = None
    host_absent: tuple[str, ...] = ()


def _units(tests: tuple[str, ...]) -> tuple[dict, ...]:
    return tuple({"src": t, "test": True} for t in tests)


HOST_SECRET_DIR = Path(f"/root/.lrm-fake-ssh-{TOKEN}") if os.geteuid() == 0 else Path.home() / f".lrm-fake-ssh-{TOKEN}"
WORLD_SECRET = Path(f"/tmp/lrm_secret_{TOKEN}")
CALLER_CWD = Path.cwd()

CASES = [
    Case("control_correct", CORRECT_ADD, 1.0, status="ok"),
    Case("control_wrong", "def add(a, b):\n    return a - b\n", 0.0, status="ok"),
    # ---- time
    Case(
        "infinite_loop_ignoring_sigterm",
        "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ndef add(a, b):\n    while True:\n        pass\n",
        0.0,
        status="timeout",
    ),
    Case("sleep_forever", "import time\ndef add(a, b):\n    time.sleep(10**6)\n", 0.0, status="timeout"),
    Case("uninterruptible_c_loop", "def add(a, b):\n    return sum(range(10**12))\n", 0.0, status="timeout"),
    Case("huge_power_at_import", "x = 9**9**9\n" + CORRECT_ADD, 0.0),
    # ---- processes
    Case("fork_bomb", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n", 0.0),
    Case(
        "fork_bomb_inside_a_call",
        "import os\ndef add(a, b):\n    while True:\n        try:\n            os.fork()\n"
        "        except OSError:\n            pass\n",
        0.0,
    ),
    Case(
        "thread_bomb",
        "import threading, time\nfor i in range(100000):\n"
        "    threading.Thread(target=time.sleep, args=(60,)).start()\n",
        0.0,
    ),
    Case(
        "setsid_child_sleeps_past_timeout",
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(120)\n"
        "    os._exit(0)\n" + CORRECT_ADD,
        1.0,
    ),
    Case(
        "spawn_subprocess_touching_host_tmp",
        f"import subprocess\nsubprocess.run('touch /tmp/lrm_pwned_sub_{TOKEN}', shell=True)\n" + CORRECT_ADD,
        None,
        host_absent=(f"/tmp/lrm_pwned_sub_{TOKEN}",),
    ),
    Case(
        "posix_system_bypass",
        f"import posix\nposix.system('touch /tmp/lrm_pwned_posix_{TOKEN}')\n" + CORRECT_ADD,
        None,
        host_absent=(f"/tmp/lrm_pwned_posix_{TOKEN}",),
    ),
    # Killing the harness must never pass a wrong answer. (With both backends the harness is pid 1 of the
    # namespace and ignores the signal; the score is 0.)
    Case(
        "kill_the_harness_at_import",
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\ndef add(a, b):\n    return 0\n",
        0.0,
    ),
    Case(
        "kill_the_harness_inside_a_call",
        "import os, signal\ndef add(a, b):\n    os.kill(os.getppid(), signal.SIGKILL)\n    return 0\n",
        0.0,
    ),
    Case(
        "kill_everything", "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass\n", 0.0
    ),
    # ---- memory, output, disk
    Case("memory_bomb_instant", "x = bytearray(16 * 1024**3)\n" + CORRECT_ADD, 0.0),
    Case("memory_bomb_gradual", "l = []\nwhile True:\n    l.append(' ' * 10**7)\n", 0.0),
    Case(
        "ten_gb_of_stdout",
        "import sys\nblock = 'A' * (1 << 20)\nfor _ in range(10240):\n    sys.stdout.write(block)\n" + CORRECT_ADD,
        0.0,
        status="output_limit",
    ),
    Case("stderr_single_300mb_write", "import sys\nsys.stderr.write('E' * 300_000_000)\n" + CORRECT_ADD, 0.0),
    Case("recursion_segfault", "import sys\nsys.setrecursionlimit(10**7)\ndef f(n):\n    return f(n + 1)\nf(0)\n", 0.0),
    Case(
        "disk_fill_many_files",
        "i = 0\nwhile True:\n    open('f%d' % i, 'wb').write(b'x' * (8 << 20)); i += 1\n",
        0.0,
    ),
    # ---- filesystem
    Case(
        "write_etc",
        f"try:\n    open('/etc/lrm_pwned_{TOKEN}', 'w').write('x')\nexcept OSError:\n    pass\n" + CORRECT_ADD,
        1.0,
        host_absent=(f"/etc/lrm_pwned_{TOKEN}",),
    ),
    Case(
        "write_tmp",
        f"open('/tmp/lrm_pwned_tmp_{TOKEN}', 'w').write('x')\n" + CORRECT_ADD,
        1.0,
        host_absent=(f"/tmp/lrm_pwned_tmp_{TOKEN}",),
    ),
    Case(
        "write_callers_working_directory",
        f"for p in ({str(CALLER_CWD / ('lrm_pwned_cwd_' + TOKEN))!r}, 'lrm_pwned_rel_{TOKEN}'):\n"
        "    try:\n        open(p, 'w').write('x')\n    except OSError:\n        pass\n" + CORRECT_ADD,
        1.0,
        host_absent=(str(CALLER_CWD / f"lrm_pwned_cwd_{TOKEN}"), str(CALLER_CWD / f"lrm_pwned_rel_{TOKEN}")),
    ),
    Case(
        "read_ssh_keys",
        "import os\ndef add(a, b):\n"
        f"    for p in (os.path.expanduser('~/.ssh'), '/root/.ssh', {str(HOST_SECRET_DIR)!r}):\n"
        "        try:\n            os.listdir(p); return 0\n        except OSError:\n            pass\n"
        f"    try:\n        open({str(HOST_SECRET_DIR / 'id_rsa')!r}).read(); return 0\n    except OSError:\n"
        "        return a + b\n",
        1.0,
    ),
    Case(
        "read_world_readable_host_file",
        f"def add(a, b):\n    try:\n        open({str(WORLD_SECRET)!r}).read(); return 0\n    except OSError:\n"
        "        return a + b\n",
        1.0,
    ),
    Case(
        "read_environment_secret",
        "import os\ndef add(a, b):\n    if 'LRM_SECRET' in os.environ:\n        return 0\n"
        "    for p in ('/proc/1/environ', '/proc/%d/environ' % os.getppid()):\n        try:\n"
        "            if b'LRM_SECRET' in open(p, 'rb').read():\n                return 0\n"
        "        except OSError:\n            pass\n    return a + b\n",
        1.0,
    ),
    Case(
        "tamper_with_tests",
        "import glob\nfor p in glob.glob('/input/*') + glob.glob('*.py') + glob.glob('/tmp/*'):\n    try:\n"
        "        open(p, 'w').write('pass\\n')\n    except OSError:\n        pass\ndef add(a, b):\n    return 0\n",
        0.0,
    ),
    # ---- network
    Case(
        "connect_public_address",
        "import socket\ndef add(a, b):\n    if [n for _, n in socket.if_nameindex() if n != 'lo']:\n        return 0\n"
        "    try:\n        socket.create_connection(('1.1.1.1', 80), timeout=1); return 0\n    except OSError:\n"
        "        return a + b\n",
        1.0,
    ),
    Case(
        "connect_parent_loopback_service",
        "import socket\ndef add(a, b):\n    try:\n        socket.create_connection(('127.0.0.1', PORT), timeout=1)"
        "\n        return 0\n    except OSError:\n        return a + b\n",
        1.0,
    ),
    # ---- forging the result
    Case("sys_exit_zero_before_tests", "import sys\nsys.exit(0)\n" + CORRECT_ADD, 0.0),
    Case("os_exit_zero_before_tests", "import os\nos._exit(0)\n", 0.0),
    Case("raise_systemexit_inside_a_test", "def add(a, b):\n    raise SystemExit(0)\n", 0.0),
    Case(
        "rebind_assert_related_builtins",
        "import builtins\nbuiltins.AssertionError = type('Nope', (Exception,), {})\n"
        "builtins.abs = lambda x: 0\nbuiltins.isinstance = lambda *a: True\nbuiltins.all = lambda x: True\n"
        "builtins.len = lambda x: 3\ndef add(a, b):\n    return 0.5\n",
        0.0,
        tests=(
            "assert abs(add(2, 3) - 5) < 1e-9",
            "assert isinstance(add(1, 1), int)",
            "assert all([add(1, 1) == 2])",
            "assert len([add(1, 2)]) == 1 and add(1, 2) == 3",
        ),
    ),
    Case(
        "always_equal_int_subclass",
        "class Y(int):\n    def __eq__(self, o):\n        return True\n    __hash__ = int.__hash__\n"
        "def add(a, b):\n    return Y(0)\n",
        0.0,
    ),
    Case(
        "always_equal_plain_object",
        "class Eq:\n    def __eq__(self, o):\n        return True\n    def __ne__(self, o):\n        return False\n"
        "    __hash__ = object.__hash__\ndef add(a, b):\n    return Eq()\n",
        0.0,
        tests=("assert add(2, 3) == 5", "assert 0 == add(-1, 1)", "assert not (add(1, 1) != 2)"),
    ),
    Case(
        "truthy_object_for_boolean_tests",
        "class T:\n    def __bool__(self):\n        return True\ndef is_even(n):\n    return T()\n",
        0.0,
        tests=("assert is_even(2)", "assert is_even(3) is False or not is_even(3)"),
    ),
    Case(
        "print_fake_success_and_result_line",
        'print("ALL TESTS PASSED")\nprint(\'LRMGYM-RESULT {"status": "ok", "passed": 2, "total": 2, "results": '
        '[[true, ""], [true, ""]], "error": "", "output": "", "output_bytes": 0}\')\n'
        "def add(a, b):\n    return 0\n",
        0.0,
    ),
    Case(
        "forge_result_through_proc_fd",
        'import os\nline = \'LRMGYM-RESULT {"status": "ok", "passed": 2, "total": 2, "results": [[true, ""], '
        '[true, ""]], "error": "", "output": "", "output_bytes": 0}\\n\'\n'
        "for fd in range(0, 8):\n    try:\n        with open('/proc/%d/fd/%d' % (os.getppid(), fd), 'w') as f:\n"
        "            f.write(line)\n    except OSError:\n        pass\ndef add(a, b):\n    return 0\n",
        0.0,
    ),
    Case(
        "read_harness_memory",
        "import os\ndef add(a, b):\n    for p in ('mem', 'environ', 'fd/1'):\n        try:\n"
        "            open('/proc/%d/%s' % (os.getppid(), p), 'rb').read(1); return 0\n"
        "        except OSError:\n            pass\n    return a + b\n",
        1.0,
    ),
    Case(
        "zero_length_frame_on_the_rpc_pipe",
        "import os\ndef add(a, b):\n    for fd in range(3, 20):\n        try:\n            os.write(fd, bytes(8))\n"
        "        except OSError:\n            pass\n    return a + b\n",
        0.0,
        status="protocol",
    ),
    Case(
        "close_own_output_then_sleep",
        "import os, time\ndef add(a, b):\n    os.close(1)\n    os.close(2)\n    time.sleep(100)\n",
        0.0,
        status="timeout",
    ),
    Case(
        "malformed_reply_on_the_rpc_pipe",
        "import os\ndef add(a, b):\n    for fd in range(3, 20):\n        try:\n"
        "            os.write(fd, (1 << 40).to_bytes(8, 'big'))\n        except OSError:\n            pass\n"
        "    return a + b\n",
        0.0,
    ),
]


@pytest.fixture(scope="module")
def host_setup():
    """Host-side bait: a secret env var, a fake ssh key, a world-readable file, a loopback listener."""
    os.environ["LRM_SECRET"] = "canary"
    HOST_SECRET_DIR.mkdir(mode=0o700)
    (HOST_SECRET_DIR / "id_rsa").write_text("fake key\n")
    WORLD_SECRET.write_text("secret\n")
    WORLD_SECRET.chmod(0o644)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    yield listener.getsockname()[1]
    listener.close()
    del os.environ["LRM_SECRET"]
    (HOST_SECRET_DIR / "id_rsa").unlink()
    HOST_SECRET_DIR.rmdir()
    WORLD_SECRET.unlink()


def run_case(pool: SandboxPool, case: Case, port: int) -> None:
    """Run one case and assert every guarantee of the battery."""
    code = case.code.replace("PORT", str(port))
    before = scratch_snapshot()
    start = time.monotonic()
    result = pool.run(Job(code=code, units=_units(case.tests)))
    wall = time.monotonic() - start
    try:
        assert wall <= BATTERY_TIMEOUT_S + 1.0, f"{case.name}: took {wall:.2f} s"
        assert result.status != "infra", result.error
        if case.score is not None:
            assert float(result.all_passed) == case.score, (case.name, result)
        if case.status is not None:
            assert result.status == case.status, (case.name, result)
        for path in case.host_absent:
            assert not os.path.exists(path), f"{case.name}: {path} was written on the host"
        assert leftovers(pool) == [], f"{case.name}: processes left behind"
        assert files_left(pool, before) == [], f"{case.name}: files left on the host"
        control = pool.run(Job(code=CORRECT_ADD, units=_units(ADD_TESTS)))
        assert control.all_passed, f"pool unusable after {case.name}: {control}"
    finally:
        for path in case.host_absent:
            if os.path.exists(path):
                os.remove(path)


def test_battery_has_at_least_30_cases():
    assert len(CASES) >= 30
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_bwrap_battery(bwrap_pool, host_setup, case):
    run_case(bwrap_pool, case, host_setup)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_unshare_fallback_battery(unshare_pool, host_setup, case):
    run_case(unshare_pool, case, host_setup)


def test_shared_battery_code_cases(bwrap_pool, host_setup, shared_data, tmp_path):
    """The 28 code cases of ../shared/data/adversarial/cases.json, with their expectations, under bwrap."""
    cases = [
        c
        for c in json.loads((shared_data / "adversarial" / "cases.json").read_text())
        if c["component"] == "code_sandbox"
    ]
    assert len(cases) >= 27
    canary = Path(f"/tmp/lrm_canary_{TOKEN}")
    canary.write_text("canary")
    secret = Path(f"/tmp/lrm_secret_shared_{TOKEN}")
    secret.write_text("secret")
    try:
        for c in cases:
            inp, exp = c["input"], c["expected"]
            code = decode(inp["code"]).replace("PORT", str(host_setup))
            tests = tuple(line for line in decode(inp["tests"]).splitlines() if line.strip())
            before = scratch_snapshot()
            start = time.monotonic()
            result = bwrap_pool.run(Job(code=code, units=_units(tests)))
            wall = time.monotonic() - start
            assert wall <= min(exp.get("max_wall_s", 99), BATTERY_TIMEOUT_S + 1.0), (c["name"], wall)
            if "reward" in exp:
                assert float(result.all_passed) == exp["reward"], (c["name"], result)
            if exp.get("status") in ("timeout", "output_limit"):
                assert result.status == exp["status"], (c["name"], result)
            if "host_file_absent" in exp:
                assert not os.path.exists(exp["host_file_absent"]), c["name"]
            assert canary.read_text() == "canary", c["name"]
            assert len(result.output.encode()) <= 1 << 20, c["name"]
            assert leftovers(bwrap_pool) == [], c["name"]
            assert files_left(bwrap_pool, before) == [], c["name"]
    finally:
        canary.unlink(missing_ok=True)
        secret.unlink(missing_ok=True)
    assert bwrap_pool.run(Job(code=CORRECT_ADD, units=_units(ADD_TESTS))).all_passed


# Another process of the sandbox that holds its stdin (the tests, frame 2) and stdout (the result channel) would
# hand both to the candidate through pidfd_getfd(2) or ptrace if it ran as the candidate's uid and were dumpable:
# bubblewrap's reaper did, before --as-pid-1 made the non-dumpable harness the sandbox's pid 1.
STDIO_HOLDERS = (
    "import ctypes, os\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "def stdio_of_another_process():\n"
    "    got = []\n"
    "    for pid in (1, os.getppid()):\n"
    "        try:\n            pidfd = os.pidfd_open(pid)\n        except (OSError, AttributeError):\n"
    "            continue\n"
    "        for target in (0, 1, 2):\n"
    "            fd = libc.syscall(438, pidfd, target, 0)  # pidfd_getfd: 438 on every Linux architecture\n"
    "            if fd >= 0:\n                got.append((pid, target, fd))\n"
    "    for pid in (1, os.getppid()):\n        for target, mode in ((0, 'rb'), (1, 'wb')):\n            try:\n"
    "                got.append((pid, target, open('/proc/%d/fd/%d' % (pid, target), mode, buffering=0)))\n"
    "            except OSError:\n                pass\n"
    "    return got\n"
)
FORGED_RECORD = (  # the harness's record format (see harness._pack_report): "ok", both tests passed
    "def s(t):\n    return len(t).to_bytes(4, 'big') + t\n"
    "rep = b'R1' + s(b'ok') + s(b'') + s(b'') + bytes(8)\n"
    "rep += (2).to_bytes(4, 'big') + (b'\\x01' + s(b'')) * 2 + bytes(4)\n"
    "RECORD = b'LRMGYM-RESULT\\n' + len(rep).to_bytes(8, 'big') + rep\n"
)


@pytest.mark.parametrize("backend", ["bwrap", "unshare"])
def test_no_process_of_the_sandbox_hands_the_candidate_its_stdio(backend, request):
    code = STDIO_HOLDERS + "def add(a, b):\n    got = stdio_of_another_process()\n    return 0 if got else a + b\n"
    result = request.getfixturevalue(f"{backend}_pool").run(Job(code=code, units=_units(ADD_TESTS)))
    assert result.all_passed, result


@pytest.mark.parametrize("backend", ["bwrap", "unshare"])
def test_a_record_forged_through_another_process_is_not_believed(backend, request):
    code = STDIO_HOLDERS + FORGED_RECORD
    code += "for _, target, f in stdio_of_another_process():\n    if target == 1:\n"
    code += "        os.write(f if isinstance(f, int) else f.fileno(), RECORD)\n        break\n"  # one record only
    code += "def add(a, b):\n    return 0\n"
    result = request.getfixturevalue(f"{backend}_pool").run(Job(code=code, units=_units(ADD_TESTS)))
    assert not result.all_passed, result  # return 0 passes one of the two tests honestly; the forgery claims both


def test_bwrap_the_harness_is_pid_1_and_survives_the_candidate(bwrap_pool):
    """Under bwrap the harness is the sandbox's pid 1: the candidate's SIGKILL is ignored and grading goes on."""
    code = "import os, signal\nassert os.getppid() == 1\nos.kill(os.getppid(), signal.SIGKILL)\n" + CORRECT_ADD
    result = bwrap_pool.run(Job(code=code, units=_units(ADD_TESTS)))
    assert (result.status, result.passed) == ("ok", 2)


def test_always_equal_gets_only_what_the_honest_value_gets(bwrap_pool):
    """Fraction view: Y(0) with an always-true __eq__ passes exactly the tests that a plain 0 passes."""
    cheat = "class Y(int):\n    def __eq__(self, o):\n        return True\n    __hash__ = int.__hash__\n"
    cheat += "def add(a, b):\n    return Y(0)\n"
    honest = "def add(a, b):\n    return 0\n"
    got = [bwrap_pool.run(Job(code=c, units=_units(ADD_TESTS))).results for c in (cheat, honest)]
    assert [ok for ok, _ in got[0]] == [ok for ok, _ in got[1]] == [False, True]
