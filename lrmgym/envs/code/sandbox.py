"""Run untrusted Python in a fresh, isolated process tree, N at a time.

Layers, outermost first (see ``/work/shared/specs/security.md`` §4.1 for the measurements behind them):

- **A dedicated unprivileged uid per pool slot** (a free block from ``uid_base`` up, reserved with a lock
  file for the pool's lifetime so that concurrent pools never share a uid, when the caller is root). Without it
  ``RLIMIT_NPROC`` binds nothing (root is exempt), file permissions are root's, and a fork bomb is unbounded.
  The sandbox is started with ``Popen(user=..., group=..., extra_groups=[])``.
- **Namespaces.** ``bwrap`` (bubblewrap): ``--unshare-all`` (user, pid, net, ipc, uts, cgroup, mount),
  ``--die-with-parent``, ``--new-session``, ``--as-pid-1`` (the harness is the namespace's pid 1: no bwrap
  reaper, which would run as the slot uid, be dumpable and hold the sandbox's stdin and result pipe, so
  that ``pidfd_getfd``/``ptrace`` from the candidate would hand it the tests and a forged result), a root
  built only from read-only binds of what Python needs,
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

**One sandbox per job, started ahead** (the cold path: ``warm=False``, or any backend but bwrap;
``prestart``, the default for the namespaced backends): when a job
is handed to its sandbox, the slot's next sandbox is started at once and boots (namespaces, interpreter,
harness) on the other core while the job runs; its harness then blocks reading its job from stdin. The
next job in that slot goes to it if it is still alive and was started with the same argv (limits that
change the argv, such as the tmpfs size, get a fresh one); its limits and deadline travel with the job and
count from the hand-over. Each sandbox runs exactly one job and is killed with it, so no two jobs ever
share a process, a file system or an interpreter. A spare that died before it read its job (no start
marker) is replaced by a fresh sandbox and the job rerun there. With a core to spare this takes the
start-up off the job's latency (``benchmarks/sandbox.py``); it does not make a start-up cost less CPU, and
each slot keeps one idle sandbox (an interpreter, about 10 MB) until :meth:`SandboxPool.close`.

**A warm server per slot** (``warm``, the default with bubblewrap; ``warm=False`` gives the cold path
above, and the ``unshare`` and ``process`` backends are always cold): one long-lived bwrap sandbox per slot
(same argv, uid, binds, cleared env as a cold one) whose pid 1 is the harness in server mode
(:func:`lrmgym.envs.code.harness.serve`), which has already loaded the harness and never reads a job. For
each job it forks a job process J that unshares a **fresh mount, IPC, network and pid namespace**, mounts a
fresh size-capped tmpfs on ``/tmp`` (work dir ``/tmp/work``) and on ``/dev/shm``, makes the server's own
writable tmpfs (``/`` and ``/dev``) read-only, brings up its own loopback, and forks H, **pid 1 of the new
pid namespace**, which mounts its own ``/proc``, drops every capability (bounding, permitted, effective,
inheritable, ambient; no_new_privs), installs a seccomp filter that fails ``keyctl``/``add_key``/
``request_key`` (the per-uid keyrings belong to the user namespace, which a server's jobs share), makes
itself non-dumpable, writes ``LRMGYM-READY`` and then runs the job exactly as a cold harness does (same
frames, same rlimits set on itself, same C/Z processes, same record). The server keeps ``CAP_SYS_ADMIN``,
``CAP_NET_ADMIN`` and ``CAP_SETPCAP`` in the sandbox's user namespace only to do this; no process that
runs job code has any, and none can see the server: it is outside the job's pid namespace and ``/proc``.
When H exits, the kernel kills every process of the job's pid namespace, and only then is the next J
forked; this side sends a job only after that job's READY. After any job that did not end cleanly (status
other than ``ok``/``error``, the hard deadline, a record not complete or followed by anything, data not all
sent) the whole server is killed and the slot's spare server (``prestart``) or a fresh one takes over. A
server found dead or not ready (killed from outside, say) gets the job rerun on a freshly started one;
``infra`` only if that one fails too. (Killed from outside *during* a job, the job is ``killed``, as cold.)

What a warm job can and cannot see of the previous jobs on its server:

- **Files**: nothing. Its ``/tmp`` and ``/dev/shm`` are new tmpfs instances in its own mount namespace,
  freed with it; everything else it can reach is read-only (host binds, the server's root and ``/dev``;
  ``/dev/null`` and friends are the usual device nodes; ``/dev/pts`` hands out new ptys only).
- **Processes**: none. Every process of a job is in that job's pid namespace and is dead before the next
  job's data is sent; a job sees only its own pid namespace in its own ``/proc`` (H is its pid 1).
- **Memory and interpreter state**: nothing. J and H are forked from the server, whose interpreter never
  ran or decoded anything of a job (it forks, waits, forks again), so each job starts from the same clean
  state: ``sys.modules``, ``builtins``, ``os.environ``, ``sys.path`` as the server left them after importing
  the harness and ``ctypes``, ``fcntl`` and ``_socket`` (which a cold harness does not import); ``sys.argv``
  is a cold harness's. Whatever a job patches lives in its own processes and dies with them. The tests
  (frame 2) reach only that job's H, after its C was forked, exactly as cold; the server never holds any
  job's data (the tests check its memory).
- **Environment**: the same cleared environment for every job (bwrap ``--clearenv``).
- **Kernel objects**: SysV IPC and POSIX message queues (IPC namespace), sockets, abstract Unix sockets
  and loopback (network namespace) are per job; keyrings are refused (seccomp). What jobs do share: the
  user namespace and uid (so ``RLIMIT_NPROC`` counts per uid there, as cold: a job's tasks are all gone
  before the next starts; the server and J count too, two tasks more than cold), the UTS namespace
  (unchangeable without capabilities), the read-only files, and timing (a busy or idle machine): no
  channel to carry data that the cold path does not also have.

Cost: a warm job pays two forks and a few namespaces and mounts (a few ms of CPU) instead of bwrap, an
interpreter start and the harness's imports (``benchmarks/sandbox.py``); a server and its spare are each
about three idle processes per slot.

The pool runs each sandbox from one of ``workers`` threads with plain blocking ``Popen`` + ``select``: under
CPU contention every hand-off between threads costs a scheduler time slice, and an asyncio loop with a
child-watcher thread needs several per execution (measured: about 80 ms more per run at load 9 on 2 cores).
The sync API (:meth:`SandboxPool.run`, :meth:`SandboxPool.run_many`) and the async API
(:meth:`SandboxPool.arun`, awaiting the thread's future) both submit to it. Backpressure: at most
``max_pending`` jobs are queued or running; ``submit`` (and ``arun``) wait beyond that.
"""

from __future__ import annotations

import ast
import asyncio
import atexit
import builtins
import concurrent.futures
import dataclasses
import logging
import marshal
import os
import queue
import selectors
import shutil
import signal
import stat
import subprocess
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
    "entry_points",
    "free_modules",
]

logger = logging.getLogger("lrmgym.code.sandbox")

Backend = Literal["auto", "bwrap", "unshare", "process"]
BACKENDS: tuple[str, ...] = ("auto", "bwrap", "unshare", "process")

HARNESS_SOURCE = (Path(__file__).with_name("harness.py")).read_text(encoding="utf-8")
_START = b"LRMGYM-HARNESS-START\n"
_READY = b"LRMGYM-READY\n"  # a warm server's next job process is set up and waits for its job
_RESULT = b"LRMGYM-RESULT\n"
_PYTHON_FLAGS = ("-S", "-s", "-P", "-B")  # no site-packages, no user site, no script dir on sys.path, no .pyc
_HIDE = ("/tmp", "/var/tmp", "/dev/shm", "/var", "/home", "/root", "/run", "/mnt", "/media", "/srv", "/opt", "/work")
_HARNESS_INSIDE = "/lrmgym_harness.pyc"  # where bwrap mounts the compiled harness
_GRACE_S = 0.5  # how long past the harness's own deadline the hard kill waits
_STDERR_CAP = 1 << 16  # bytes of the sandbox's own stderr kept (bwrap errors, harness tracebacks)
_READY_WAIT_S = 30.0  # how long a warm server may take to have its next job process ready (boot included)
# Kept by a warm server's pid 1 and its job processes until H drops all of them (no candidate has any).
_WARM_CAPS = ("CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_SETPCAP")
_WARM_REUSE = frozenset({"ok", "error"})  # after any other status the warm server is killed and replaced

ISOLATION = {
    "bwrap": "bubblewrap: user+pid+net+mount+ipc+uts namespaces, read-only minimal root, tmpfs work dir, "
    "cleared env, no capabilities in any process that runs job code (a warm server keeps three inside its user "
    "namespace to give each job fresh namespaces)",
    "unshare": "unshare fallback: user+pid+net+mount+ipc+uts namespaces, cleared env, no capabilities; "
    "/tmp, /var, /home, /root, /run, /mnt, /media, /srv, /opt, /work and the caller's folder are covered by "
    "empty tmpfs, but the REST OF THE HOST FILESYSTEM (/etc, /usr, ...) IS VISIBLE with 'other' permissions. "
    "Install bubblewrap (apt-get install bubblewrap) for a minimal root",
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

    def rlimits(self, nproc_base: int = 0) -> dict[str, int]:
        """The rlimits the harness applies to itself before forking the candidate.

        ``nproc_base``: tasks the sandbox uid already runs elsewhere (``RLIMIT_NPROC`` counts every task of
        the real uid): 0 for a dedicated slot uid, the caller's own count when not running as root.
        """
        return {
            "cpu": int(self.timeout_s) + 2,
            "as": self.memory_mb << 20,
            "fsize": self.fsize_mb << 20,
            "nofile": self.nofile,
            "nproc": nproc_base + self.nproc,
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
        cases: For ``mode="stdio"``: ``{"stdin": str, "stdout": str}`` cases, one test each. Only the stdins
            enter the sandbox; the expected outputs stay here and are compared here.
        mode: ``"call"`` (assert-based tests evaluated by the harness) or ``"stdio"`` (compare stdout).
        entry: The candidate's names the tests may use (its entry points). Default: the aliases' targets
            and every name the tests and prelude use without binding it that is neither a builtin nor a
            standard-library module (:func:`entry_points`). No other name of the candidate reaches the tests'
            namespace.
    """

    code: str
    units: tuple[dict[str, Any], ...] = ()
    prelude: str = ""
    bind: dict[str, str] = field(default_factory=dict)
    cases: tuple[dict[str, str], ...] = ()
    mode: Literal["call", "stdio"] = "call"
    entry: tuple[str, ...] | None = None

    @property
    def entry_names(self) -> tuple[str, ...]:
        """The candidate names bound into the tests' namespace (see ``entry``)."""
        if self.entry is not None:
            return tuple(self.entry)
        return entry_points([u["src"] for u in self.units], self.prelude, self.bind)

    @property
    def modules(self) -> tuple[str, ...]:
        """Standard-library modules the tests and prelude use without importing them (see :func:`free_modules`).

        The harness imports them itself, before the prelude (mbpp/596 calls ``sys.getsizeof``); they are never
        taken from the candidate.
        """
        if self.mode != "call":
            return ()
        return free_modules([u["src"] for u in self.units], self.prelude, self.bind)

    @property
    def n_tests(self) -> int:
        """How many tests the job has."""
        return len(self.cases) if self.mode == "stdio" else sum(1 for u in self.units if u["test"])


def entry_points(sources: Sequence[str], prelude: str = "", bind: dict[str, str] | None = None) -> tuple[str, ...]:
    """The names test code takes from the candidate: free names that are not builtins, plus alias targets.

    A name counts as free when some statement loads it and no statement of the tests or the prelude binds
    it anywhere (assignment, ``def``, ``class``, ``import``, argument, loop or ``with`` target...). This
    over-binds nothing: a name the tests define themselves, a builtin, or a standard-library module
    (:func:`free_modules`, imported by the harness) always resolves to the trusted one, so a candidate that
    defines ``abs``, ``sorted`` or a fake ``sys`` cannot change what an assert computes. A function under test
    named like a builtin or a module is bound explicitly through an alias (``{"sum": "sum"}``).
    """
    aliases = dict(bind or {})
    free = [n for n in _free_names(sources, prelude) if n not in aliases and n not in _STDLIB_MODULES]
    return tuple(dict.fromkeys([*aliases.values(), *free]))


def free_modules(sources: Sequence[str], prelude: str = "", bind: dict[str, str] | None = None) -> tuple[str, ...]:
    """The free names of the tests (see :func:`entry_points`) that are standard-library modules, not aliases."""
    aliases = dict(bind or {})
    return tuple(n for n in _free_names(sources, prelude) if n not in aliases and n in _STDLIB_MODULES)


def _free_names(sources: Sequence[str], prelude: str) -> list[str]:
    """Names some statement loads and none binds, in order of first use, builtins left out."""
    loaded: dict[str, None] = {}
    bound: set[str] = set()
    for src in [prelude, *sources]:
        if not src:
            continue
        try:
            tree = ast.parse(src)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue  # the harness reports the unit's syntax error as a failed test
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                if isinstance(node.ctx, ast.Load):
                    loaded.setdefault(node.id)
                else:
                    bound.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, ast.alias):
                bound.add((node.asname or node.name).partition(".")[0])
            elif isinstance(node, ast.arg):
                bound.add(node.arg)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                bound.add(node.name)
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                bound.update(node.names)
            elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
                bound.add(node.name)
            elif isinstance(node, ast.MatchMapping) and node.rest:
                bound.add(node.rest)
    return [n for n in loaded if n not in bound and n not in _BUILTIN_NAMES]


_BUILTIN_NAMES = frozenset(dir(builtins))
_STDLIB_MODULES = frozenset(n for n in sys.stdlib_module_names if not n.startswith("_"))


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


@dataclass(eq=False)
class _Box:
    """One started sandbox: its session leader, the argv it was started with, its uid and host work dir."""

    proc: subprocess.Popen
    argv: list[str]
    uid: int
    workdir: str | None
    pending: bytes = b""  # a warm server's output read past the last record: the start of the next READY


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


def _bwrap_argv(
    limits: Limits,
    binds: Sequence[str],
    extra: Sequence[str],
    command: Sequence[str],
    caps: Sequence[str] = (),
) -> list[str]:
    """The bubblewrap command line.

    ``caps``: capabilities the sandbox's pid 1 keeps in the sandbox's user namespace (a warm server's, which
    needs them to give each job fresh namespaces; see the module docstring).
    """
    argv = [
        shutil.which("bwrap") or "bwrap",
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",  # no nested user namespaces: less kernel surface for the candidate
        "--die-with-parent",
        "--new-session",
        "--as-pid-1",  # see the module docstring: no reaper process holding the sandbox's stdio
        "--cap-drop",
        "ALL",
        *(arg for cap in caps for arg in ("--cap-add", cap)),
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
        *extra,
        *command,
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
        uid_base: Lowest uid of the per-slot sandbox uids (used when running as root); the pool reserves the
            first free block of ``workers`` uids at or above it.
        prestart: Keep one started sandbox per slot waiting for its job (namespaced backends only): each
            job's hand-over starts the slot's next sandbox, which boots while the job runs. Each sandbox
            still runs exactly one job and is then killed. With ``warm``: one spare warm server per slot,
            ready to replace the slot's server when it is killed.
        warm: Run jobs on a long-lived warm server per slot (bubblewrap only; other backends ignore it), each
            job in fresh namespaces forked from it (see the module docstring). ``False``: one new sandbox
            per job (the cold path). If the warm server fails its start-up probe, the pool logs a warning
            and runs cold.
        hide: More host folders the unshare fallback covers with empty tmpfs, beside its own list (folders that
            hold data the candidate must not read, such as the data set of the task it is graded on). Bubblewrap
            shows no host folder but the system ones it binds read-only (``/usr``, ``/lib``...).

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
        prestart: bool = True,
        warm: bool = True,
        hide: Sequence[str] = (),
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
        self._uid_locks: list[Any] = []
        self.uid_base = _reserve_uids(uid_base, self.workers, self._uid_locks) if _is_root() else uid_base
        self.max_pending = max_pending or 4 * self.workers
        self._pending = threading.BoundedSemaphore(self.max_pending)
        self._executor = concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="lrmgym-sandbox")
        self._slots: queue.SimpleQueue[int] = queue.SimpleQueue()
        for slot in range(self.workers):
            self._slots.put(slot)
        self._procs: set[int] = set()
        self._spares: dict[int, _Box] = {}  # slot -> its pre-started sandbox (warm: its spare server)
        self._servers: dict[int, _Box] = {}  # slot -> its idle warm server (taken out while it runs a job)
        self._procs_lock = threading.Lock()
        self._closed = False
        self.prestart = False  # set once the probe chose a backend
        self.warm = False  # likewise
        self._setpriv = shutil.which("setpriv") if _is_root() else None
        self.python = python or self._pick_python()
        self.hide = tuple(str(Path(p).expanduser().resolve()) for p in hide)
        self._harness_dir = tempfile.mkdtemp(prefix="lrmgym-harness-")
        self._harness_pyc = self._compile_harness()
        _POOLS.add(self)
        failures = []
        for candidate in self._candidates():
            self.backend = candidate
            problem = self._probe()
            if problem is None:
                break
            failures.append(f"{candidate}: {problem}")
        else:
            self.close()
            raise SandboxError(
                "The sandbox failed its start-up probe (" + "; ".join(failures) + "). On Linux this usually "
                "means unprivileged user namespaces are disabled (sysctl kernel.unprivileged_userns_clone, "
                "AppArmor) or a container forbids them; sandbox='process' runs WITHOUT isolation."
            )
        if failures:
            logger.warning("Code sandbox: %s", "; ".join(failures))
        # The process backend has no pid namespace: it kills leftovers by uid, which would take the spare too.
        self.prestart = prestart and self.backend != "process"
        if warm and self.backend == "bwrap":
            self.warm = True
            problem = self._probe()
            if problem is not None:
                self.warm = False
                self._discard_all()
                logger.warning("Code sandbox: the warm server failed its probe, running cold: %s", problem)
        # Loud for 'auto' and for anything weaker than bwrap: with logging unconfigured, Python's last-resort
        # handler prints warnings to stderr, so the user always sees which isolation they got.
        level = logging.WARNING if self.requested == "auto" or self.backend != "bwrap" else logging.INFO
        logger.log(level, "Code sandbox isolation: %s [%s]", self.backend, ISOLATION[self.backend])

    def _candidates(self) -> list[str]:
        """Backends to try in order: for ``auto`` every installed namespaced one, else the one asked for."""
        if self.requested != "auto":
            return [self.backend]
        return [b for b in ("bwrap", "unshare") if _tool_works(b)]

    def _probe(self) -> str | None:
        """Run a trivial job; ``None`` if it passed, else what went wrong."""
        probe = self.run(Job(code="x = 1\n", units=({"src": "assert x == 1", "test": True},)))
        if probe.status == "ok" and probe.passed == 1:
            return None
        return f"status {probe.status!r}: {probe.error.strip()[:300] or probe.output.strip()[:300]}"

    # ---------------------------------------------------------------- describing
    def describe(self) -> dict[str, Any]:
        """Which isolation this pool has, for logs and ``env.describe()``."""
        return {
            "backend": self.backend,
            "isolation": ISOLATION[self.backend],
            "workers": self.workers,
            "prestart": self.prestart,
            "warm": self.warm,
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
        try:
            fut = self._executor.submit(self._execute, job, limits or self.limits)
        except RuntimeError:  # the executor shut down between the check and here
            self._pending.release()
            raise SandboxError("This sandbox pool is closed; create a new one.") from None
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
        if not self._pending.acquire(blocking=False):
            await asyncio.to_thread(self._pending.acquire)
        if self._closed:
            self._pending.release()
            raise SandboxError("This sandbox pool is closed; create a new one.")
        fut = self._executor.submit(self._execute, job, limits or self.limits)
        fut.add_done_callback(lambda _: self._pending.release())
        return await asyncio.wrap_future(fut)

    async def arun_many(self, jobs: Sequence[Job], limits: Limits | None = None) -> list[ExecResult]:
        """Async API: run jobs concurrently; results in input order."""
        return list(await asyncio.gather(*(self.arun(j, limits) for j in jobs)))

    # ---------------------------------------------------------------- one execution
    def _compile_harness(self) -> str | None:
        """Byte-compile the harness once with the sandbox's interpreter; ``None`` to fall back to ``-c``.

        Compiling the 30 kB source on every run costs about 25 ms under load; a ``.pyc`` run as the script
        costs nothing. The folder is world-readable and root-owned: candidates can read it, not change it.
        """
        os.chmod(self._harness_dir, 0o755)
        src = Path(self._harness_dir) / "harness.py"
        dst = Path(self._harness_dir) / "harness.pyc"
        src.write_text(HARNESS_SOURCE, encoding="utf-8")
        compile_it = "import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True)"
        try:
            done = subprocess.run(
                [self.python, "-S", "-c", compile_it, str(src), str(dst)], capture_output=True, timeout=60
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        if done.returncode != 0 or not dst.is_file():
            return None
        os.chmod(dst, 0o644)
        return str(dst)

    def _hidden_folders(self) -> list[str]:
        """Unshare fallback: host folders covered by tmpfs, except those holding the interpreter.

        (The harness file may be covered: the interpreter has read it before the harness mounts anything.)
        """
        keep = [str(Path(self.python).resolve().parents[1])]
        hide = [*_HIDE, os.getcwd(), str(Path.home()), *self.hide]
        out = []
        for path in dict.fromkeys(hide):
            if path == "/" or any(k == path or k.startswith(path.rstrip("/") + "/") for k in keep):
                continue
            out.append(path)
        return out

    def _harness_argv(self, inside_path: str | None) -> list[str]:
        if self._harness_pyc is None:
            return [self.python, *_PYTHON_FLAGS, "-c", HARNESS_SOURCE]
        return [self.python, *_PYTHON_FLAGS, inside_path or self._harness_pyc]

    def _argv(self, limits: Limits) -> list[str]:
        if self.backend == "bwrap":
            binds = ["/usr"]
            prefix = str(Path(self.python).resolve().parents[1])
            if not prefix.startswith("/usr"):
                binds.append(prefix)
            extra = [] if self._harness_pyc is None else ["--ro-bind", self._harness_pyc, _HARNESS_INSIDE]
            if self.warm:
                command = [*self._harness_argv(_HARNESS_INSIDE), "serve", str(limits.tmpfs_mb << 20)]
                return _bwrap_argv(limits, binds, extra, command, _WARM_CAPS)
            return _bwrap_argv(limits, binds, extra, self._harness_argv(_HARNESS_INSIDE))
        if self.backend == "unshare":
            # Root of a fresh user namespace (the host sees the slot uid): the harness covers host folders
            # with tmpfs, then drops every capability before any candidate code runs.
            ns = ["--user", "--map-root-user", "--pid", "--fork", "--kill-child", "--mount-proc", "--net"]
            return ["unshare", *ns, "--ipc", "--uts", "--", *self._harness_argv(None)]
        return self._harness_argv(None)

    def _frames(self, job: Job, limits: Limits) -> bytes:
        first = {
            "code": job.code,
            "mode": job.mode,
            "entry": list(job.entry_names) if job.mode == "call" else [],
            "deadline_s": limits.timeout_s,
            "out_cap": limits.output_bytes,
            "limits": limits.rlimits(0 if _is_root() else _tasks_of_uid(os.getuid())),
        }
        if self.backend == "unshare":
            first.update(hide=self._hidden_folders(), tmpfs_bytes=limits.tmpfs_mb << 20)
        if job.mode == "stdio":
            second: dict[str, Any] = {"stdins": [c["stdin"] for c in job.cases]}  # expected outputs stay here
        else:
            # Modules the tests name without importing them are imported here, in the harness (H imports only
            # from folders the candidate cannot write), so a candidate's ``sys = Fake()`` never reaches them.
            imports = "".join(f"import {name}\n" for name in job.modules)
            second = {"units": list(job.units), "prelude": imports + job.prelude, "bind": job.bind}
        out = b""
        for frame in (first, second):
            data = marshal.dumps(frame)
            out += len(data).to_bytes(8, "big") + data
        return out

    def _execute(self, job: Job, limits: Limits) -> ExecResult:
        slot = self._slots.get()
        try:
            if self.backend == "process" and _is_root():
                _settle_uid(self._uid(slot))  # not the previous job's tasks against this one's RLIMIT_NPROC
            return self._execute_in_slot(job, limits, slot)
        finally:
            self._slots.put(slot)

    def _execute_in_slot(self, job: Job, limits: Limits, slot: int) -> ExecResult:
        start = time.monotonic()
        try:
            data = self._frames(job, limits)
        except ValueError as exc:
            return ExecResult("infra", 0, job.n_tests, error=f"unencodable job: {exc}", backend=self.backend)
        argv = self._slot_argv(slot, limits)
        if self.warm:
            return self._execute_warm(job, data, limits, slot, argv, start)
        box = self._take_spare(slot, argv)
        while True:
            spare = box is not None
            if box is None:
                try:
                    box = self._start(slot, argv)
                except OSError as exc:
                    return self._cannot_start(job, exc)
            out, err, hard_timeout = self._hand_over(box, slot, data, limits)
            if spare and not out.startswith(_START):
                box = None  # the spare died before it read the job (killed from outside): run it on a fresh one
                continue
            return self._parse(job, out, err, hard_timeout, time.monotonic() - start)

    def _cannot_start(self, job: Job, exc: OSError) -> ExecResult:
        return ExecResult("infra", 0, job.n_tests, error=f"cannot start sandbox: {exc}", backend=self.backend)

    def _slot_argv(self, slot: int, limits: Limits) -> list[str]:
        argv = self._argv(limits)
        if _is_root() and self._setpriv:
            # Drop to the slot uid through util-linux setpriv rather than Popen(user=...): with user/group
            # set, CPython cannot use vfork and copies the whole parent (measured: 150 ms per start from
            # a process holding 256 MB, 8 ms through setpriv).
            uid = self._uid(slot)
            argv = [self._setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *argv]
        return argv

    def _start(self, slot: int, argv: list[str]) -> _Box:
        """Start one sandbox for ``slot``; its harness waits for the job on stdin. Raises OSError."""
        uid = self._uid(slot)
        kwargs: dict[str, Any] = {}
        if _is_root() and not self._setpriv:
            kwargs = {"user": uid, "group": uid, "extra_groups": []}
        workdir = None
        if self.backend != "bwrap":
            workdir = tempfile.mkdtemp(prefix=f"lrmgym-sbx{slot}-")
            if _is_root():
                os.chown(workdir, uid, uid)
            os.chmod(workdir, 0o700)
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=_clean_env(workdir or "/tmp"),
                cwd=workdir or "/",
                start_new_session=True,
                close_fds=True,
                **kwargs,
            )
        except OSError:
            if workdir:
                shutil.rmtree(workdir, ignore_errors=True)
            raise
        with self._procs_lock:
            self._procs.add(proc.pid)
        return _Box(proc, argv, uid, workdir)

    def _hand_over(self, box: _Box, slot: int, data: bytes, limits: Limits) -> tuple[bytes, bytes, bool]:
        """Send the job to a started sandbox, start the slot's next spare meanwhile, collect, tear down."""
        deadline = time.monotonic() + limits.timeout_s + _GRACE_S
        try:
            assert box.proc.stdin is not None
            stdin_fd = box.proc.stdin.fileno()
            os.set_blocking(stdin_fd, False)
            try:
                sent = os.write(stdin_fd, data[: 1 << 16])
            except BlockingIOError:
                sent = 0
            except OSError:  # the sandbox is gone; _communicate sees EOF
                sent = len(data)
            if self.prestart:
                self._start_spare(slot, box.argv)  # boots on the other core while this job runs
            return _communicate(box.proc, data[sent:], deadline, limits.output_bytes + (4 << 20))
        finally:
            self._discard(box)

    def _take_spare(self, slot: int, argv: list[str]) -> _Box | None:
        """The slot's pre-started sandbox if it is alive and was started for this argv; else ``None``."""
        with self._procs_lock:
            box = self._spares.pop(slot, None)
        if box is None:
            return None
        if box.argv == argv and box.proc.poll() is None:
            return box
        self._discard(box)
        return None

    def _execute_warm(
        self, job: Job, data: bytes, limits: Limits, slot: int, argv: list[str], start: float
    ) -> ExecResult:
        """Run a job on the slot's warm server (a spare or a fresh one if it has none or it is not usable).

        A server that had no job process ready (killed from outside, or died) gets the job rerun on a freshly
        started one; only if that one fails too is the result ``infra``. After any job that did not end
        cleanly (a status other than ``ok``/``error``, the hard deadline, anything unexpected on the result
        channel) the whole server is killed.
        """
        with self._procs_lock:
            box = self._servers.pop(slot, None)
        if box is not None and (box.argv != argv or box.proc.poll() is not None):
            self._discard(box)
            box = None
        fresh = False
        while True:
            if box is None:
                box = None if fresh else self._take_spare(slot, argv)
                if box is None:
                    try:
                        box = self._start(slot, argv)
                    except OSError as exc:
                        return self._cannot_start(job, exc)
                    fresh = True
            if self.prestart and slot not in self._spares:
                self._start_spare(slot, argv)  # the replacement, booting on the other core
            out, err, hard_timeout, clean = self._warm_exchange(box, data, limits)
            if not out.startswith(_START) and not fresh:
                self._discard(box)  # no job process was ready: rerun the job on a freshly started server
                box, fresh = None, True
                continue
            result = self._parse(job, out, err, hard_timeout, time.monotonic() - start)
            if clean and result.status in _WARM_REUSE and box.proc.poll() is None and not self._closed:
                with self._procs_lock:
                    if not self._closed:
                        self._servers[slot], box = box, None
            if box is not None:
                self._discard(box)
            return result

    def _warm_exchange(self, box: _Box, data: bytes, limits: Limits) -> tuple[bytes, bytes, bool, bool]:
        """One job on a warm server: wait for READY, send the frames, read until the complete record.

        Returns ``(stdout after READY up to the record's end, stderr, hit the hard deadline, clean)``; ``clean``
        is true when the record was complete and nothing but the next READY followed it (the server may be
        reused; what was read of that READY is kept in ``box.pending``).
        """
        proc = box.proc
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        reader = _Streams(proc.stdout.fileno(), proc.stderr.fileno(), limits.output_bytes + (4 << 20))
        reader.out += box.pending  # read with the previous record (the next job process was quick)
        box.pending = b""
        if not reader.read_until(time.monotonic() + _READY_WAIT_S, lambda out: len(out) >= len(_READY)):
            return b"", reader.err, False, False
        if bytes(reader.out[: len(_READY)]) != _READY:
            return b"", reader.err, False, False
        del reader.out[: len(_READY)]
        deadline = time.monotonic() + limits.timeout_s + _GRACE_S
        complete = reader.read_until(deadline, _report_complete, proc.stdin.fileno(), data)
        out = bytes(reader.out)
        hit_deadline = not complete and not reader.eof
        if not complete:
            return out, reader.err, hit_deadline, False
        # Reusable: the whole job was sent (so its harness read it all: no byte of it waits for the next one),
        # the record is complete and nothing follows it but (the start of) the next job process's READY.
        out, box.pending = out[: _record_end(out)], out[_record_end(out) :]
        clean = reader.unsent == 0 and _READY.startswith(box.pending)
        return out, reader.err, False, clean

    def _discard_all(self) -> None:
        """Kill every idle server and spare (a warm probe that failed)."""
        with self._procs_lock:
            boxes = [*self._servers.values(), *self._spares.values()]
            self._servers, self._spares = {}, {}
        for box in boxes:
            self._discard(box)

    def _start_spare(self, slot: int, argv: list[str]) -> None:
        try:
            box = self._start(slot, argv)
        except OSError as exc:
            logger.debug("Code sandbox: cannot pre-start a sandbox: %s", exc)
            return
        with self._procs_lock:
            if not self._closed:
                box, self._spares[slot] = self._spares.get(slot), box  # a retried job has started one already
        if box is not None:
            self._discard(box)

    def _discard(self, box: _Box) -> None:
        """Kill a sandbox's whole tree, reap it, close its pipes, remove its host work dir."""
        self._kill_tree(box.proc.pid, box.uid)
        box.proc.wait()
        for stream in (box.proc.stdin, box.proc.stdout, box.proc.stderr):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        with self._procs_lock:
            self._procs.discard(box.proc.pid)
        if box.workdir:
            shutil.rmtree(box.workdir, ignore_errors=True)

    def spare_pids(self) -> list[int]:
        """Host pids of the idle sandboxes (each a whole tree).

        Pre-started ones wait for their one job; idle warm servers (and their next job process) for the next.
        """
        with self._procs_lock:
            roots = {box.proc.pid for box in [*self._spares.values(), *self._servers.values()]}
        return _descendants(roots)

    def _kill_tree(self, pid: int, uid: int | None) -> None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        if uid is not None and self.backend == "process" and _is_root():
            _kill_uid(uid)

    def _parse(self, job: Job, out: bytes, err: bytes, hard_timeout: bool, wall: float) -> ExecResult:
        """Turn the harness's record into a result, believing nothing in it that can be checked here.

        The record is parsed by :func:`_decode_report` (bounded, schema-checked). Counts are not read from
        it: ``total`` is the job's own test count, ``passed`` is counted here from per-test flags whose
        number must equal it, and stdio outputs are compared here with expected outputs the sandbox never
        saw. A record that claims a status only this side can see (``infra``, ``killed``) or is malformed
        in any way is a ``protocol`` failure: the candidate's, scored 0, never ungradeable.
        """
        common = {"wall_s": wall, "backend": self.backend}
        stderr = err.decode("utf-8", "replace")
        if not out.startswith(_START):
            return ExecResult("infra", 0, job.n_tests, error=f"sandbox did not start: {stderr[:2000]}", **common)
        at = out.find(_RESULT)
        if at < 0:
            status = "timeout" if hard_timeout else "killed"
            return ExecResult(status, 0, job.n_tests, error=stderr[-2000:], **common)
        report = _decode_report(out[at + len(_RESULT) :], job)
        if report is None:  # cut off by the hard deadline mid-write, or malformed
            status = "timeout" if hard_timeout else "protocol"
            return ExecResult(status, 0, job.n_tests, error="incomplete or malformed result record", **common)
        status, error, output, results, outputs = report
        if job.mode == "stdio":
            results = [
                (True, "") if _normalize(got) == _normalize(case["stdout"]) else (False, "wrong output")
                for got, case in zip(outputs, job.cases, strict=False)
            ]
            results += [(False, f"not run ({status})")] * (len(job.cases) - len(results))
        passed = sum(1 for ok, _ in results if ok)
        return ExecResult(
            status=status,
            passed=passed,
            total=job.n_tests,
            results=tuple(results),
            output=output,
            error=error,
            **common,
        )

    # ---------------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Kill anything still running and stop the pool's thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._procs_lock:
            running = list(self._procs)
            spares, self._spares = list(self._spares.values()), {}
            spares += list(self._servers.values())
            self._servers = {}
        for pid in running:
            self._kill_tree(pid, None)
        for box in spares:
            self._discard(box)
        if self.backend == "process" and _is_root():
            for uid in self.slot_uids():
                _kill_uid(uid)
        self._executor.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(self._harness_dir, ignore_errors=True)
        for lock in self._uid_locks:
            lock.close()
        _POOLS.discard(self)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _communicate(proc: subprocess.Popen, data: bytes, deadline: float, cap: int) -> tuple[bytes, bytes, bool]:
    """Feed ``data`` to stdin and read stdout/stderr (each capped) until EOF, the complete report, or ``deadline``.

    Returns ``(stdout, stderr, hit_deadline)``; on the deadline the whole session is SIGKILLed. Stopping at
    the complete report (the harness writes nothing after it) spares waiting for the interpreter's exit and
    the teardown of the namespaces: the caller kills the sandbox anyway.
    """
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    bufs = {out_fd: bytearray(), err_fd: bytearray()}
    limits = {out_fd: cap, err_fd: _STDERR_CAP}
    stdin_fd, view = proc.stdin.fileno(), memoryview(data)
    os.set_blocking(stdin_fd, False)
    hit_deadline = False
    with selectors.DefaultSelector() as sel:
        if view:
            sel.register(stdin_fd, selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        for fd in bufs:
            sel.register(fd, selectors.EVENT_READ)
        while len(sel.get_map()) > (1 if stdin_fd in sel.get_map() else 0):
            left = deadline - time.monotonic()
            if left <= 0:
                hit_deadline = True
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                break
            for key, _ in sel.select(left):
                fd = key.fd
                if fd == stdin_fd:
                    try:
                        view = view[os.write(fd, view[: 1 << 16]) :]
                    except BlockingIOError:
                        continue
                    except OSError:  # the sandbox closed its stdin (killed, or the harness died)
                        view = view[:0]
                    if not view:
                        sel.unregister(fd)
                        proc.stdin.close()
                    continue
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    sel.unregister(fd)
                elif len(bufs[fd]) < limits[fd]:
                    bufs[fd] += chunk[: limits[fd] - len(bufs[fd])]
                    if fd == out_fd and _report_complete(bufs[fd]):
                        return bytes(bufs[out_fd]), bytes(bufs[err_fd]), False
    return bytes(bufs[out_fd]), bytes(bufs[err_fd]), hit_deadline


class _Streams:
    """A warm server's stdout (capped at ``cap``) and stderr (capped at ``_STDERR_CAP``), read across jobs."""

    def __init__(self, out_fd: int, err_fd: int, cap: int) -> None:
        self.out_fd, self.err_fd = out_fd, err_fd
        self.out, self._err = bytearray(), bytearray()
        self.cap = cap
        self.eof = False
        self.unsent = 0  # bytes of the last read_until's data not written

    @property
    def err(self) -> bytes:
        return bytes(self._err)

    def read_until(self, deadline: float, done: Any, stdin_fd: int | None = None, data: bytes = b"") -> bool:
        """Read (and write ``data`` to ``stdin_fd``, which stays open) until ``done(out)``; False on EOF/deadline.

        Afterwards ``unsent`` is the number of bytes of ``data`` not written (-1 if writing failed).
        """
        view = memoryview(data)
        self.unsent = len(view)
        if stdin_fd is not None:
            os.set_blocking(stdin_fd, False)
        with selectors.DefaultSelector() as sel:
            sel.register(self.out_fd, selectors.EVENT_READ)
            sel.register(self.err_fd, selectors.EVENT_READ)
            if view and stdin_fd is not None:
                sel.register(stdin_fd, selectors.EVENT_WRITE)
            while not done(self.out):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                for key, _ in sel.select(left):
                    if key.fd == stdin_fd:
                        try:
                            view = view[os.write(stdin_fd, view[: 1 << 16]) :]
                            self.unsent = len(view)
                        except BlockingIOError:
                            continue
                        except OSError:  # the server is gone: its stdout's EOF says so
                            view, self.unsent = view[:0], -1
                        if not view:
                            sel.unregister(stdin_fd)
                        continue
                    chunk = os.read(key.fd, 1 << 16)
                    if key.fd == self.err_fd:
                        if chunk:
                            self._err += chunk[: _STDERR_CAP - len(self._err)]
                        else:
                            sel.unregister(self.err_fd)
                        continue
                    if not chunk:
                        self.eof = True
                        return False
                    self.out += chunk
                    if len(self.out) > self.cap:
                        return False
        return True


def _record_end(out: bytes) -> int:
    """Where the complete result record in ``out`` ends (call only when :func:`_report_complete` holds)."""
    body = out.find(_RESULT) + len(_RESULT)
    return body + 8 + int.from_bytes(out[body : body + 8], "big")


def _report_complete(out: bytearray) -> bool:
    """Whether the harness's stdout holds the whole result record (marker, length, payload)."""
    at = out.find(_RESULT)
    if at < 0 or len(out) < at + len(_RESULT) + 8:
        return False
    body = at + len(_RESULT)
    return len(out) >= body + 8 + int.from_bytes(out[body : body + 8], "big")


def _descendants(roots: set[int]) -> list[int]:
    """``roots`` and every live descendant of them, read from ``/proc`` (parent pid of each process)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat_line = f.read()
        except OSError:
            continue
        ppid = int(stat_line[stat_line.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return sorted(out)


HARNESS_STATUSES = frozenset({"ok", "error", "timeout", "output_limit", "crash", "protocol"})
"""The statuses a harness record may claim (``infra`` and ``killed`` are only ever decided by this side)."""


class _Reader:
    """A cursor over untrusted bytes: every length is checked against what is left before anything is built.

    Hand-written because the record is tiny and fixed; no general deserialiser bounds its allocation by
    the input size (``marshal``, ``pickle`` and ``json`` build what the bytes describe).
    """

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.data):
            raise ValueError("record truncated")
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def int(self, size: int) -> int:
        return int.from_bytes(self.take(size), "big")

    def text(self) -> str:
        return self.take(self.int(4)).decode("utf-8", "replace")

    def count(self, most: int) -> int:
        n = self.int(4)
        if n > most:
            raise ValueError("more items than the job has")
        return n


def _decode_report(data: bytes, job: Job) -> tuple[str, str, str, list[tuple[bool, str]], list[str]] | None:
    """``(status, error, output, results, outputs)`` from a harness record, or ``None`` if it is malformed.

    Malformed: truncated or trailing bytes, an unknown status, a per-test result count different from the
    job's (call mode) or more outputs than cases (stdio), a flag byte other than 0 or 1.
    """
    if len(data) < 8:
        return None
    size = int.from_bytes(data[:8], "big")
    if size != len(data) - 8:
        return None
    r = _Reader(data[8:])
    try:
        if r.take(2) != b"R1":
            return None
        status, error, output = r.text(), r.text(), r.text()
        r.int(8)  # output_bytes: how much the candidate wrote (informational)
        results = []
        for _ in range(r.count(job.n_tests if job.mode == "call" else 0)):
            flag = r.take(1)
            if flag not in (b"\x00", b"\x01"):
                return None
            results.append((flag == b"\x01", r.text()))
        outputs = [r.text() for _ in range(r.count(len(job.cases) if job.mode == "stdio" else 0))]
    except ValueError:
        return None
    if r.at != len(r.data) or status not in HARNESS_STATUSES:
        return None
    if job.mode == "call" and len(results) != job.n_tests:
        return None
    return status, error[:2000], output, results, outputs


def _normalize(text: str) -> str:
    """Stdio comparison: line endings unified, trailing spaces and trailing blank lines ignored."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


_UID_BLOCKS = 512  # how many blocks above uid_base a pool may take


def _reserve_uids(base: int, count: int, locks: list[Any]) -> int:
    """Reserve ``count`` consecutive uids no other pool holds (flock on ``/tmp/lrmgym-uid-<uid>.lock``).

    The locks are released when their files are closed (or the process dies). Returns the first uid.
    """
    import fcntl

    for first in range(base, base + _UID_BLOCKS * count, count):
        held = []
        for uid in range(first, first + count):
            f = open(f"/tmp/lrmgym-uid-{uid}.lock", "a")  # noqa: SIM115 - kept open while the pool lives
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                f.close()
                break
            held.append(f)
        if len(held) == count and not any(processes_of_uid(u) for u in range(first, first + count)):
            locks.extend(held)
            return first
        for f in held:
            f.close()
    raise SandboxError(f"No free block of {count} sandbox uids between {base} and {base + _UID_BLOCKS * count}.")


def _tasks_of_uid(uid: int) -> int:
    """Processes plus threads of ``uid`` (what ``RLIMIT_NPROC`` counts), read from ``/proc``."""
    total = 0
    for pid in processes_of_uid(uid):
        try:
            with open(f"/proc/{pid}/status", "rb") as f:
                total += next((int(line.split()[1]) for line in f if line.startswith(b"Threads:")), 1)
        except OSError:
            continue
    return total


def processes_of_uid(uid: int, zombies: bool = False) -> list[int]:
    """Live pids whose real uid is ``uid``, read from ``/proc``; with ``zombies``, the unreaped ones too."""
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
        if not zombies and fields.get(b"State", b"").strip().startswith(b"Z"):
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


def _settle_uid(uid: int, wait_s: float = 3.0) -> None:
    """Wait, at most ``wait_s``, until a dedicated sandbox uid has no task left, zombies included.

    A killed fork bomb's orphans stay zombies until the host's init reaps them (measured: 63 of them for 1.2 to
    1.5 s), and until then they count against ``RLIMIT_NPROC`` of the slot's next job, whose harness cannot
    fork its candidate: a correct answer scored 0 (status ``timeout``, or ``protocol`` when the fork deadline
    passes before the tests arrive). Processes still alive (exiting, or forked late) are killed again.
    """
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and processes_of_uid(uid, zombies=True):
        _kill_uid(uid)
        time.sleep(0.01)


_POOLS: weakref.WeakSet[SandboxPool] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for pool in list(_POOLS):
        pool.close()
