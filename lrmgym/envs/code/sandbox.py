"""Run untrusted Python in a fresh, isolated process tree, N at a time.

Layers, outermost first (see ``/work/shared/specs/security.md`` §4.1 for the measurements behind them):

- **A dedicated unprivileged uid per pool slot** (``uid_base + slot``, when the caller is root). Without it
  ``RLIMIT_NPROC`` binds nothing (root is exempt), file permissions are root's, and a fork bomb is unbounded.
  The sandbox is started with ``Popen(user=..., group=..., extra_groups=[])``.
- **Namespaces.** ``bwrap`` (bubblewrap): ``--unshare-all`` (user, pid, net, ipc, uts, cgroup, mount),
  ``--die-with-parent``, ``--new-session``, a root built only from read-only binds of what Python needs,
  a size-capped tmpfs as the work dir, ``--clearenv``, ``--cap-drop ALL``. Fallback ``unshare``
  (util-linux): user, pid, net, mount, ipc and uts namespaces with ``--kill-child``, but the host
  filesystem stays visible with the slot uid's permissions (world-readable files, world-writable ``/tmp``).
  ``process``: no namespaces at all (explicit opt-in only, for machines without either tool).
- **rlimits** set by the harness on itself before it forks the candidate: CPU seconds, address space,
  file size, open files, processes, core size 0.
- **A wall-clock deadline enforced here**, outside the sandbox: ``killpg(SIGKILL)`` of the whole session,
  and the pid namespace takes every descendant (including ``setsid`` escapees) with it. In the
  ``process`` backend, leftovers are found and killed by uid.
- **Output caps**: the harness keeps at most ``output_bytes`` of the candidate's output and stops it when
  it writes more; this side reads at most a fixed budget from the harness.
- **The result channel**: see :mod:`lrmgym.envs.code.harness`; only the harness process can write it.

The pool keeps one asyncio event loop in a background thread that owns every child process; the sync API
(:meth:`SandboxPool.run`, :meth:`SandboxPool.run_many`) and the async API (:meth:`SandboxPool.arun`) both
submit to it. Backpressure: at most ``max_pending`` jobs are queued or running; ``submit`` blocks beyond.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import dataclasses
import json
import logging
import os
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "BACKENDS",
    "ExecResult",
    "Job",
    "Limits",
    "SandboxError",
    "SandboxPool",
    "detect_backend",
]

logger = logging.getLogger("lrmgym.code.sandbox")

Backend = Literal["auto", "bwrap", "unshare", "process"]
BACKENDS: tuple[str, ...] = ("auto", "bwrap", "unshare", "process")

HARNESS_SOURCE = (Path(__file__).with_name("harness.py")).read_text(encoding="utf-8")
_START = b"LRMGYM-HARNESS-START\n"
_RESULT = b"LRMGYM-RESULT "
_PYTHON_FLAGS = ("-S", "-s", "-P", "-B")  # no site-packages, no user site, no script dir on sys.path, no .pyc
_GRACE_S = 0.5  # how long past the harness's own deadline the hard kill waits
_STDERR_CAP = 1 << 16  # bytes of the sandbox's own stderr kept (bwrap errors, harness tracebacks)

ISOLATION = {
    "bwrap": "bubblewrap: user+pid+net+mount+ipc+uts namespaces, read-only minimal root, tmpfs work dir, "
    "cleared env, no capabilities",
    "unshare": "unshare fallback: user+pid+net+mount namespaces, cleared env; the host filesystem is VISIBLE "
    "with the sandbox uid's permissions (world-readable files readable, world-writable dirs such as /tmp "
    "writable). Install bubblewrap (apt-get install bubblewrap) for full isolation",
    "process": "NO ISOLATION beyond a separate process: no namespaces, host filesystem and network reachable; "
    "rlimits, cleared env and the wall-clock kill only. Use only for trusted code or tests",
}


class SandboxError(RuntimeError):
    """The sandbox could not be set up (missing tool, bad configuration). Never raised for candidate behaviour."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one execution.

    Attributes:
        timeout_s: Wall-clock seconds for the whole run (program load plus every test).
        memory_mb: Address-space limit (``RLIMIT_AS``) in MiB.
        output_bytes: Most bytes of the candidate's stdout+stderr kept; writing more stops it.
        nproc: ``RLIMIT_NPROC`` for the sandbox uid (counts every process and thread of that uid).
        nofile: ``RLIMIT_NOFILE``.
        fsize_mb: ``RLIMIT_FSIZE`` in MiB: the largest file the candidate may write.
        tmpfs_mb: Size of the writable tmpfs work dir (bwrap only).
    """

    timeout_s: float = 5.0
    memory_mb: int = 1024
    output_bytes: int = 1 << 20
    nproc: int = 64
    nofile: int = 64
    fsize_mb: int = 16
    tmpfs_mb: int = 64

    def rlimits(self) -> dict[str, int]:
        """The rlimits the harness applies to itself before forking the candidate."""
        return {
            "cpu": int(self.timeout_s) + 2,
            "as": self.memory_mb << 20,
            "fsize": self.fsize_mb << 20,
            "nofile": self.nofile,
            "nproc": self.nproc,
            "core": 0,
        }


@dataclass(frozen=True)
class Job:
    """One program to run against its tests.

    Attributes:
        code: The full candidate program (trusted prefix included).
        units: For ``mode="call"``: the test statements in order, ``{"src": str, "test": bool}``;
            ``test=False`` marks setup statements. Each test unit is one test.
        prelude: Trusted code run in the tests' namespace after the candidate's names are bound.
        bind: Extra names for the tests: alias -> name defined by the candidate (``{"candidate": "f"}``).
        cases: For ``mode="stdio"``: ``{"stdin": str, "stdout": str}`` cases, one test each.
        mode: ``"call"`` (assert-based tests evaluated by the harness) or ``"stdio"`` (compare stdout).
    """

    code: str
    units: tuple[dict[str, Any], ...] = ()
    prelude: str = ""
    bind: dict[str, str] = field(default_factory=dict)
    cases: tuple[dict[str, str], ...] = ()
    mode: Literal["call", "stdio"] = "call"

    @property
    def n_tests(self) -> int:
        """How many tests the job has."""
        return len(self.cases) if self.mode == "stdio" else sum(1 for u in self.units if u["test"])


@dataclass(frozen=True)
class ExecResult:
    """What one sandboxed execution produced.

    Attributes:
        status: ``ok`` (every test ran), ``error`` (the program raised before any test), ``timeout``,
            ``output_limit``, ``crash`` (the candidate process died mid-tests), ``protocol`` (the candidate
            sent malformed data), ``killed`` (the harness produced no result: it was killed or the hard
            deadline hit), or ``infra`` (the sandbox itself failed to start: not the candidate's fault).
        passed: Tests passed.
        total: Tests run or due.
        results: Per test ``(passed, message)``.
        output: The candidate's captured stdout+stderr (truncated to the output cap).
        error: The program's top-level exception, or the infrastructure error.
        wall_s: Wall-clock seconds of the whole execution, sandbox start-up included.
        backend: The isolation backend used.
    """

    status: str
    passed: int
    total: int
    results: tuple[tuple[bool, str], ...] = ()
    output: str = ""
    error: str = ""
    wall_s: float = 0.0
    backend: str = ""

    @property
    def all_passed(self) -> bool:
        """True when there was at least one test and every test passed."""
        return self.total > 0 and self.passed == self.total

    @property
    def fraction(self) -> float:
        """Passed / total (0 when there are no tests)."""
        return self.passed / self.total if self.total else 0.0


# --------------------------------------------------------------------------------------------------- backends
def _is_root() -> bool:
    return os.geteuid() == 0


def _others_can_execute(path: Path) -> bool:
    """Whether a non-root uid can reach and run ``path`` (every ancestor others-executable)."""
    try:
        real = path.resolve(strict=True)
    except OSError:
        return False
    for p in [real, *real.parents]:
        try:
            if not os.stat(p).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    return True


def _bwrap_argv(python: str, limits: Limits, binds: Sequence[str]) -> list[str]:
    argv = [
        shutil.which("bwrap") or "bwrap",
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--hostname",
        "sandbox",
        "--clearenv",
        "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
        "--setenv", "HOME", "/tmp",
        "--setenv", "LANG", "C.UTF-8",
        "--setenv", "PYTHONHASHSEED", "0",
        "--setenv", "PYTHONIOENCODING", "utf-8",
    ]  # fmt: skip
    # bwrap is started as the (unprivileged) slot uid, so --unshare-all's user namespace maps that uid to
    # itself: the candidate's real uid on the host is the slot uid, and RLIMIT_NPROC binds.
    for src in binds:
        argv += ["--ro-bind", src, src]
    for name in ("bin", "lib", "lib32", "lib64", "sbin", "libx32"):
        host = Path("/") / name
        if host.is_symlink():
            argv += ["--symlink", os.readlink(host), f"/{name}"]
        elif host.is_dir():
            argv += ["--ro-bind", str(host), f"/{name}"]
    for etc in ("/etc/ld.so.cache", "/etc/localtime"):
        if os.path.exists(etc):
            argv += ["--ro-bind", etc, etc]
    argv += [
        "--proc", "/proc",
        "--dev", "/dev",
        "--size", str(limits.tmpfs_mb << 20), "--tmpfs", "/tmp",
        "--size", str(1 << 20), "--tmpfs", "/dev/shm",
        "--dir", "/tmp/work",
        "--chdir", "/tmp/work",
        python, *_PYTHON_FLAGS, "-c", HARNESS_SOURCE,
    ]  # fmt: skip
    return argv


def _clean_env(home: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "LANG": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONIOENCODING": "utf-8",
    }


def _tool_works(backend: str) -> bool:
    tool = {"bwrap": "bwrap", "unshare": "unshare", "process": None}[backend]
    return tool is None or shutil.which(tool) is not None


def detect_backend() -> str:
    """The strongest backend whose tool is installed: ``bwrap``, else ``unshare``; never ``process``.

    Raises:
        SandboxError: Neither bubblewrap nor util-linux ``unshare`` is on PATH.
    """
    for backend in ("bwrap", "unshare"):
        if _tool_works(backend):
            return backend
    raise SandboxError(
        "No sandbox tool found: neither 'bwrap' (bubblewrap) nor 'unshare' (util-linux) is on PATH. "
        "Install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap), or pass sandbox='process' to run "
        "candidate code WITHOUT isolation (trusted code only)."
    )


# --------------------------------------------------------------------------------------------------- the pool
class SandboxPool:
    """Runs :class:`Job` objects in isolated sandboxes, ``workers`` at a time.

    Args:
        backend: ``auto`` (bwrap, else unshare; logs which it got), ``bwrap``, ``unshare`` or ``process``.
        workers: How many sandboxes run at once.
        limits: Default resource limits of each execution.
        python: The interpreter run inside the sandbox; ``None`` picks this interpreter when the sandbox
            uid can reach it, else ``/usr/bin/python3``. Only its standard library is available.
        max_pending: Most jobs queued or running; :meth:`submit` blocks beyond (backpressure).
        uid_base: First uid of the per-slot sandbox uids (used when running as root).

    Raises:
        SandboxError: The backend is unknown or unavailable, or the probe execution failed.
    """

    def __init__(
        self,
        backend: Backend = "auto",
        workers: int | None = None,
        limits: Limits | None = None,
        python: str | None = None,
        max_pending: int | None = None,
        uid_base: int = 60000,
    ) -> None:
        if backend not in BACKENDS:
            raise SandboxError(f"Unknown sandbox backend {backend!r}; expected one of {', '.join(BACKENDS)}.")
        self.requested = backend
        self.backend = detect_backend() if backend == "auto" else backend
        if not _tool_works(self.backend):
            tool = "bwrap (apt-get install bubblewrap)" if self.backend == "bwrap" else "unshare (util-linux)"
            raise SandboxError(
                f"Sandbox backend {self.backend!r} needs {tool}, which is not on PATH. "
                "Use sandbox='auto' to pick what is installed."
            )
        self.workers = max(1, workers if workers is not None else min(os.cpu_count() or 1, 8))
        self.limits = limits or Limits()
        self.uid_base = uid_base
        self.max_pending = max_pending or 4 * self.workers
        self._pending = threading.BoundedSemaphore(self.max_pending)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="lrmgym-sandbox", daemon=True)
        self._thread.start()
        self._slots: asyncio.Queue[int] = asyncio.Queue()
        for slot in range(self.workers):
            self._slots.put_nowait(slot)
        self._procs: set[int] = set()
        self._closed = False
        self.python = python or self._pick_python()
        _POOLS.add(self)
        probe = self.run(Job(code="x = 1\n", units=({"src": "assert x == 1", "test": True},)))
        if probe.status != "ok" or probe.passed != 1:
            self.close()
            raise SandboxError(
                f"The {self.backend!r} sandbox failed its start-up probe (status {probe.status!r}): "
                f"{probe.error.strip()[:500] or probe.output.strip()[:500]}"
            )
        level = logging.INFO if self.backend == "bwrap" else logging.WARNING
        logger.log(level, "Code sandbox isolation: %s [%s]", self.backend, ISOLATION[self.backend])
        if self.requested == "auto" and self.backend != "bwrap":
            print(f"lrmgym code sandbox: {ISOLATION[self.backend]}", file=sys.stderr)

    # ---------------------------------------------------------------- describing
    def describe(self) -> dict[str, Any]:
        """Which isolation this pool has, for logs and ``env.describe()``."""
        return {
            "backend": self.backend,
            "isolation": ISOLATION[self.backend],
            "workers": self.workers,
            "python": self.python,
            "uids": f"{self.uid_base}-{self.uid_base + self.workers - 1}" if _is_root() else str(os.getuid()),
            "limits": dataclasses.asdict(self.limits),
        }

    def slot_uids(self) -> list[int]:
        """The uids sandboxes of this pool run as (the caller's uid when not root)."""
        return [self._uid(s) for s in range(self.workers)] if _is_root() else [os.getuid()]

    def _uid(self, slot: int) -> int:
        return self.uid_base + slot if _is_root() else os.getuid()

    def _pick_python(self) -> str:
        here = Path(sys.executable)
        try:
            base = Path(os.path.realpath(here))
        except OSError:
            base = here
        if not _is_root() or _others_can_execute(base):
            return str(base)
        for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
            if _others_can_execute(Path(candidate)):
                return candidate
        raise SandboxError(
            f"No Python interpreter that the sandbox uid can run: {base} is not reachable by other users. "
            "Pass python='/path/to/python3' (a world-readable interpreter)."
        )

    # ---------------------------------------------------------------- submitting
    def submit(self, job: Job, limits: Limits | None = None) -> concurrent.futures.Future[ExecResult]:
        """Queue a job; blocks while ``max_pending`` jobs are already queued or running."""
        if self._closed:
            raise SandboxError("This sandbox pool is closed; create a new one.")
        self._pending.acquire()
        fut = asyncio.run_coroutine_threadsafe(self._execute(job, limits or self.limits), self._loop)
        fut.add_done_callback(lambda _: self._pending.release())
        return fut

    def run(self, job: Job, limits: Limits | None = None) -> ExecResult:
        """Run one job and wait for its result."""
        return self.submit(job, limits).result()

    def run_many(self, jobs: Sequence[Job], limits: Limits | None = None) -> list[ExecResult]:
        """Run jobs concurrently (``workers`` at a time); results in input order."""
        futures: list[concurrent.futures.Future[ExecResult]] = []
        for job in jobs:
            futures.append(self.submit(job, limits))
        return [f.result() for f in futures]

    async def arun(self, job: Job, limits: Limits | None = None) -> ExecResult:
        """Async API: run one job from any event loop (the work happens on the pool's own loop)."""
        await asyncio.to_thread(self._pending.acquire)
        if self._closed:
            self._pending.release()
            raise SandboxError("This sandbox pool is closed; create a new one.")
        fut = asyncio.run_coroutine_threadsafe(self._execute(job, limits or self.limits), self._loop)
        fut.add_done_callback(lambda _: self._pending.release())
        return await asyncio.wrap_future(fut)

    async def arun_many(self, jobs: Sequence[Job], limits: Limits | None = None) -> list[ExecResult]:
        """Async API: run jobs concurrently; results in input order."""
        return list(await asyncio.gather(*(self.arun(j, limits) for j in jobs)))

    # ---------------------------------------------------------------- one execution
    def _argv(self, limits: Limits) -> list[str]:
        harness = [self.python, *_PYTHON_FLAGS, "-c", HARNESS_SOURCE]
        if self.backend == "bwrap":
            binds = ["/usr"]
            prefix = str(Path(self.python).resolve().parents[1])
            if not prefix.startswith("/usr"):
                binds.append(prefix)
            return _bwrap_argv(self.python, limits, binds)
        if self.backend == "unshare":
            ns = ["--user", "--map-current-user", "--pid", "--fork", "--kill-child", "--mount-proc", "--net"]
            return ["unshare", *ns, "--ipc", "--uts", "--", *harness]
        return harness

    def _frames(self, job: Job, limits: Limits) -> bytes:
        first = {
            "code": job.code,
            "mode": job.mode,
            "deadline_s": limits.timeout_s,
            "out_cap": limits.output_bytes,
            "limits": limits.rlimits(),
        }
        second = {"units": list(job.units), "prelude": job.prelude, "bind": job.bind, "cases": list(job.cases)}
        out = b""
        for frame in (first, second):
            data = json.dumps(frame).encode("utf-8", "surrogatepass")
            out += len(data).to_bytes(8, "big") + data
        return out

    async def _execute(self, job: Job, limits: Limits) -> ExecResult:
        slot = await self._slots.get()
        try:
            return await self._execute_in_slot(job, limits, slot)
        finally:
            self._slots.put_nowait(slot)

    async def _execute_in_slot(self, job: Job, limits: Limits, slot: int) -> ExecResult:
        start = time.monotonic()
        uid = self._uid(slot)
        workdir = None
        kwargs: dict[str, Any] = {}
        if _is_root():
            kwargs = {"user": uid, "group": uid, "extra_groups": []}
        if self.backend != "bwrap":
            workdir = tempfile.mkdtemp(prefix=f"lrmgym-sbx{slot}-")
            if _is_root():
                os.chown(workdir, uid, uid)
            os.chmod(workdir, 0o700)
        try:
            data = self._frames(job, limits)
        except UnicodeEncodeError as exc:
            return ExecResult("infra", 0, job.n_tests, error=f"unencodable job: {exc}", backend=self.backend)
        try:
            proc = await asyncio.create_subprocess_exec(
                *self._argv(limits),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=_clean_env(workdir or "/tmp"),
                cwd=workdir or "/",
                start_new_session=True,
                close_fds=True,
                **kwargs,
            )
        except OSError as exc:
            if workdir:
                shutil.rmtree(workdir, ignore_errors=True)
            return ExecResult("infra", 0, job.n_tests, error=f"cannot start sandbox: {exc}", backend=self.backend)
        self._procs.add(proc.pid)
        stdout_cap = limits.output_bytes + (4 << 20)
        try:
            out, err, hard_timeout = await self._communicate(proc, data, limits.timeout_s + _GRACE_S, stdout_cap)
        finally:
            self._kill_tree(proc.pid, uid)
            await proc.wait()
            self._procs.discard(proc.pid)
            if workdir:
                self._kill_tree(proc.pid, uid)
                shutil.rmtree(workdir, ignore_errors=True)
        wall = time.monotonic() - start
        return self._parse(job, out, err, hard_timeout, wall)

    async def _communicate(
        self, proc: asyncio.subprocess.Process, data: bytes, deadline_s: float, cap: int
    ) -> tuple[bytes, bytes, bool]:
        async def feed() -> None:
            assert proc.stdin is not None
            try:
                proc.stdin.write(data)
                await proc.stdin.drain()
                proc.stdin.close()
            except (BrokenPipeError, ConnectionResetError):
                pass

        async def read(stream: asyncio.StreamReader | None, limit: int) -> bytes:
            buf = bytearray()
            assert stream is not None
            while True:
                chunk = await stream.read(1 << 16)
                if not chunk:
                    return bytes(buf)
                if len(buf) < limit:
                    buf += chunk[: limit - len(buf)]

        tasks = [asyncio.ensure_future(feed()), asyncio.ensure_future(read(proc.stdout, cap))]
        tasks.append(asyncio.ensure_future(read(proc.stderr, _STDERR_CAP)))
        done, _ = await asyncio.wait(tasks[1:], timeout=deadline_s)
        hard_timeout = len(done) < 2
        if hard_timeout:
            self._kill_tree(proc.pid, None)
            await asyncio.wait(tasks, timeout=1.0)
        for t in tasks:
            if not t.done():
                t.cancel()
        out = tasks[1].result() if tasks[1].done() and not tasks[1].cancelled() else b""
        err = tasks[2].result() if tasks[2].done() and not tasks[2].cancelled() else b""
        return out, err, hard_timeout

    def _kill_tree(self, pid: int, uid: int | None) -> None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        if uid is not None and self.backend == "process" and _is_root():
            _kill_uid(uid)

    def _parse(self, job: Job, out: bytes, err: bytes, hard_timeout: bool, wall: float) -> ExecResult:
        common = {"wall_s": wall, "backend": self.backend}
        stderr = err.decode("utf-8", "replace")
        if not out.startswith(_START):
            return ExecResult("infra", 0, job.n_tests, error=f"sandbox did not start: {stderr[:2000]}", **common)
        for line in out.split(b"\n"):
            if line.startswith(_RESULT):
                try:
                    report = json.loads(line[len(_RESULT) :])
                except ValueError:
                    break
                results = tuple((bool(ok), str(msg)) for ok, msg in report["results"])
                return ExecResult(
                    status=report["status"],
                    passed=int(report["passed"]),
                    total=int(report["total"]),
                    results=results,
                    output=report["output"],
                    error=report["error"],
                    **common,
                )
        status = "timeout" if hard_timeout else "killed"
        return ExecResult(status, 0, job.n_tests, error=stderr[-2000:], **common)

    # ---------------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Kill anything still running and stop the pool's thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for pid in list(self._procs):
            self._kill_tree(pid, None)
        if self.backend == "process" and _is_root():
            for uid in self.slot_uids():
                _kill_uid(uid)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._loop.is_running():
            self._loop.close()
        _POOLS.discard(self)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def processes_of_uid(uid: int) -> list[int]:
    """Live (non-zombie) pids whose real uid is ``uid``, read from ``/proc``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", "rb") as f:
                status = f.read()
        except OSError:
            continue
        fields = dict(line.split(b":", 1) for line in status.splitlines() if b":" in line)
        if fields.get(b"State", b"").strip().startswith(b"Z"):
            continue
        if int(fields.get(b"Uid", b"-1").split()[0]) == uid:
            pids.append(int(entry))
    return pids


def _kill_uid(uid: int) -> None:
    """Kill every process of a dedicated sandbox uid (the ``process`` backend has no pid namespace)."""
    if uid == 0:
        raise SandboxError("refusing to kill the processes of uid 0")
    for _ in range(3):
        pids = processes_of_uid(uid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)


_POOLS: weakref.WeakSet[SandboxPool] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for pool in list(_POOLS):
        pool.close()
