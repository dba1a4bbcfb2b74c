"""The in-sandbox test harness: runs untrusted candidate code in one process and grades it from another.

This file is executed inside the sandbox as ``python -S -s -P -B`` (byte-compiled); it must stay standard-library
only and must not import :mod:`lrmgym`. The trusted parent (:mod:`lrmgym.envs.code.sandbox`) reads its text.

Why two processes (hand-written, because no library offers this split): when the unit tests run in the
same interpreter as the candidate's code, the candidate can forge a pass (``sys.exit(0)`` before the tests,
an object whose ``__eq__`` is always true, rebinding builtins, monkeypatching the harness, or reading a
secret from memory). Here the harness process ``H`` never executes candidate code, nor anything named or
shaped by candidate data:

1. ``H`` reads the first message (the candidate program) from stdin, forks the candidate process ``C``,
   and only then reads the second message (the tests), so ``C``'s memory never held the tests.
2. ``C`` closes stdin and the result channel (``H``'s stdout), sends its stdout/stderr into a capped pipe,
   executes the program, and then serves remote calls: ``H`` calls the candidate's functions over a pipe and
   receives **plain data only** (``marshal`` of builtin scalars and containers, validated, capped in size
   and count), or opaque handles for every other object (modules included: ``H`` never imports a name the
   candidate chose, so no module's import-time code, such as ``unittest.__main__``'s test discovery in the
   writable work dir, runs in ``H``).
3. ``H`` evaluates every ``assert`` itself, in a namespace of ``H``'s builtins, the trusted prelude and only
   the candidate's entry points (a candidate's ``abs`` or ``sorted`` changes nothing the tests compute), so
   comparisons run on values ``H`` built. Exceptions rebuilt from ``C`` keep an ordinary builtin type
   (tests may expect ``ValueError``) but never a control-flow one (``StopIteration`` would end a ``map``
   early). A timeout, crash or protocol violation of ``C`` is a ``BaseException`` that stays raised, so a
   test's ``except`` clause cannot turn it into a pass. ``H`` imports lazily only from ``sys.path`` folders
   it cannot write (:func:`_trusted_path`).
4. ``H`` is made non-dumpable, so ``C`` (same uid, no capabilities) can neither ptrace it nor open
   ``/proc/<H>/fd/1`` or ``/proc/<H>/mem``. Killing ``H`` yields no result, which the parent scores 0.
5. Stdio mode: ``H`` forks a zygote ``Z`` before it reads the cases; for each case ``Z`` forks a fresh ``C``
   whose fds 0-2 are that case's pipes (passed by ``H`` over a Unix socket), so a ``C`` holds its own stdin
   and nothing else. Expected outputs never enter the sandbox: ``H`` returns what each case printed and
   the parent compares.
6. ``H`` writes the only result record, after the tests ran, to its stdout, which ``C`` does not hold. The
   parent still believes no count in it (:func:`lrmgym.envs.code.sandbox._decode_report`).

7. Warm server mode (``harness.pyc serve <tmpfs bytes>``, :func:`serve`): the sandbox's pid 1 is a server
   ``S`` that never reads a job; per job it forks ``J``, which takes fresh mount, IPC, network and pid
   namespaces and a fresh tmpfs work dir, and ``J`` forks ``H``, pid 1 of the new pid namespace, which drops
   every capability, installs the keyring filter and then runs :func:`main` as above. ``H`` writes
   ``LRMGYM-READY`` on the result channel before it reads frame 1.

Wire format from the parent: two frames, each an 8-byte big-endian length then a ``marshal`` payload
(trusted data; not JSON: importing ``json`` pulls in ``re`` and ``enum`` and costs more than the rest of
the harness). Frame 1: ``{"code", "mode": "call"|"stdio", "entry": [names], "deadline_s", "out_cap",
"limits": {name: value}}``. Frame 2: call mode ``{"units": [{"src", "test"}...], "prelude", "bind": {alias:
name}}``, stdio mode ``{"stdins": [str...]}``.
The harness writes ``LRMGYM-HARNESS-START`` on stdout once frame 1 has arrived (a pre-started harness
waits for it with its imports done; no marker means the sandbox died before it had a job).
Result (stdout): the line ``LRMGYM-RESULT``, an 8-byte length, then the flat record of
:func:`_pack_report` (status, error, captured output, per-test results or per-case outputs).
"""

import builtins
import marshal
import os
import resource
import select
import sys
import time

_REF, _ITER, _FRAC, _DEC = "\x00lrm-ref", "\x00lrm-iter", "\x00lrm-frac", "\x00lrm-dec"
_RANGE, _BUILTIN = "\x00lrm-range", "\x00lrm-builtin"
_SCALARS = (type(None), bool, int, float, complex, str, bytes)
_CONTAINERS = (list, tuple, set, frozenset, dict)
_MAX_MSG = 32 << 20  # largest reply H accepts from C
_MAX_ITEMS = 1_000_000  # most values H decodes from one reply
_ITER_CAP = 100_000  # most items C materializes from an iterator result
_SIGKILL = 9  # not signal.SIGKILL: importing `signal` imports `enum`, a large share of the start-up time
_MAX_GLOBAL = 1 << 16  # globals whose data is larger are sent as handles
# Builtin exceptions that steer the tests' control flow when raised inside them: a StopIteration from a
# call inside ``map``/``filter``/``zip`` ends the iteration, so ``all(map(candidate, xs))`` would be true.
# A candidate raising one is rebuilt as a plain CandidateError.
_CONTROL_FLOW = {"StopIteration", "StopAsyncIteration"}
_ERR_TAIL = 300  # characters kept from an error message


# ------------------------------------------------------------------------------------------------- framing
def _read_exact(fd, n):
    """Read exactly ``n`` bytes from ``fd`` (unbuffered, so nothing past the frame is consumed)."""
    chunks, left = [], n
    while left:
        b = os.read(fd, left)
        if not b:
            raise EOFError("stream closed")
        chunks.append(b)
        left -= len(b)
    return b"".join(chunks)


def _read_frame(fd):
    return marshal.loads(_read_exact(fd, int.from_bytes(_read_exact(fd, 8), "big")))


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _send(fd, obj):
    data = marshal.dumps(obj)
    _write_all(fd, len(data).to_bytes(8, "big") + data)


# ------------------------------------------------------------------------------------------------- C side
def _c_encode(v, refs, depth=0):
    """Candidate side: turn a value into plain marshal-able data; other objects become handles."""
    if depth > 200:
        raise ValueError("value nested too deeply")
    t = type(v)
    if t in _SCALARS:
        return v
    if t in (list, tuple, set, frozenset):
        return t(_c_encode(x, refs, depth + 1) for x in v)
    if t is dict:
        return {_c_encode(k, refs, depth + 1): _c_encode(x, refs, depth + 1) for k, x in v.items()}
    for base in _SCALARS[1:] + _CONTAINERS:
        if isinstance(v, base):  # a subclass (namedtuple, Counter, IntEnum...): send the base value
            return _c_encode(base(v), refs, depth)
    name = t.__module__ + "." + t.__qualname__
    if name == "fractions.Fraction":
        return (_FRAC, v.numerator, v.denominator)
    if name == "decimal.Decimal":
        return (_DEC, str(v))
    if t is range:
        return (_RANGE, v.start, v.stop, v.step)
    if hasattr(t, "__next__") and hasattr(t, "__iter__"):  # generator, map, zip...: materialize
        items = []
        for x in v:
            if len(items) >= _ITER_CAP:
                raise ValueError(f"iterator result longer than {_ITER_CAP} items")
            items.append(_c_encode(x, refs, depth + 1))
        return (_ITER, items)
    refs.append(v)
    return (_REF, len(refs) - 1)


def _c_decode(v, refs):
    t = type(v)
    if t is tuple and len(v) == 2 and v[0] == _REF:
        return refs[v[1]]
    if t is tuple and len(v) == 2 and v[0] == _BUILTIN:
        return getattr(builtins, v[1])
    if t in (list, tuple, set, frozenset):
        return t(_c_decode(x, refs) for x in v)
    if t is dict:
        return {_c_decode(k, refs): _c_decode(x, refs) for k, x in v.items()}
    return v


def _close_fds_except(*keep):
    """Close every descriptor from 3 up (the limit is ``RLIMIT_NOFILE``, far below 256) but ``keep``.

    ``os.closerange`` is one ``close_range`` call; closing one by one costs about 1 ms (an OSError per fd).
    """
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 256)


def _fork(deadline):
    """``os.fork``, retried while the uid is at ``RLIMIT_NPROC``.

    Kernels that count ``RLIMIT_NPROC`` per host uid (older ones; recent ones count per user namespace)
    also count the tasks of the slot's previous sandbox, killed but maybe not yet reaped, when a
    pre-started harness forks C at once. In stdio mode, an earlier case's leftovers in this sandbox.
    """
    while True:
        try:
            return os.fork()
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise _Abort("timeout") from None
            time.sleep(0.002)


def _candidate(job, rpc_in, rpc_out, out_w):
    """Body of process C: run the candidate program, then serve H's remote calls. Never returns."""
    os.dup2(out_w, 1)
    os.dup2(out_w, 2)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    _close_fds_except(rpc_in, rpc_out)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    sys.stdin = open(0, closefd=False)
    refs = []
    ns = {"__name__": "solution", "__builtins__": builtins}
    try:
        exec(compile(job["code"], "solution.py", "exec"), ns)
        names = {}
        for k in job["entry"]:  # only the entry points: no other candidate name reaches the tests
            if k not in ns:
                continue
            v = ns[k]
            enc = _c_encode(v, refs)
            if type(enc) in _CONTAINERS and len(marshal.dumps(enc)) > _MAX_GLOBAL:
                refs.append(v)  # a big global table stays in C; the tests get a handle
                enc = (_REF, len(refs) - 1)
            names[k] = ("data", enc)
        _send(rpc_out, ("ready", names))
    except BaseException as exc:  # noqa: BLE001 - report any failure of untrusted code, SystemExit included
        try:
            sys.stdout.flush()
        except BaseException:  # noqa: BLE001
            pass
        _send(rpc_out, ("dead", type(exc).__name__, str(exc)[:_ERR_TAIL]))
        os._exit(0)
    while True:
        try:
            req = marshal.loads(_read_exact(rpc_in, int.from_bytes(_read_exact(rpc_in, 8), "big")))
        except EOFError:
            os._exit(0)
        try:
            op, target = req[0], refs[req[1]]
            if op == "call":
                out = target(*_c_decode(req[2], refs), **_c_decode(req[3], refs))
            elif op == "getattr":
                out = getattr(target, req[2])
            elif op == "setattr":
                setattr(target, req[2], _c_decode(req[3], refs))
                out = None
            else:
                raise ValueError("unknown op")
            reply = ("ok", _c_encode(out, refs))
        except BaseException as exc:  # noqa: BLE001 - SystemExit inside a call is a failed call, not an exit
            reply = ("exc", type(exc).__name__, str(exc)[:_ERR_TAIL])
        try:
            sys.stdout.flush()
        except BaseException:  # noqa: BLE001
            pass
        _send(rpc_out, reply)


# ------------------------------------------------------------------------------------------------- H side
class CandidateError(Exception):
    """An exception raised by candidate code whose type is not a builtin exception."""


class Harness:
    """Process H: owns the result channel, talks to C, evaluates the tests."""

    def __init__(self, job):
        self.job = job
        self.deadline = time.monotonic() + float(job["deadline_s"])
        self.out_cap = int(job["out_cap"])
        self.output = bytearray()
        self.output_bytes = 0
        self.status = "ok"
        self.error = ""
        self.aborted = None  # the status of the first _Abort: every later call raises it again
        self.zygote = self.zygote_pid = None
        self.pid = None
        self.out_open = False
        self._stdin_fd = None
        self._stdin_left = memoryview(b"")

    # -- process C
    def spawn(self):
        """Fork C, the call server, wiring its pipes (call mode)."""
        rpc_req_r, rpc_req_w = os.pipe()
        rpc_rep_r, rpc_rep_w = os.pipe()
        out_r, out_w = os.pipe()
        pid = _fork(self.deadline)
        if pid == 0:  # C
            try:
                os.setsid()  # C's own process group: H kills it as a group
                for fd in (rpc_req_w, rpc_rep_r, out_r):
                    os.close(fd)
                _candidate(self.job, rpc_req_r, rpc_rep_w, out_w)
            finally:
                os._exit(1)
        for fd in (rpc_req_r, rpc_rep_w, out_w):
            os.close(fd)
        self.pid, self.req_w, self.rep_r, self.out_r, self.out_open = pid, rpc_req_w, rpc_rep_r, out_r, True

    def start_zygote(self):
        """Stdio mode: fork Z before the cases are read; Z forks each case's C, so no C ever held a case."""
        import _socket

        ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
        pid = _fork(self.deadline)
        if pid == 0:  # Z
            try:
                ours.close()
                _zygote(self.job, theirs)
            finally:
                os._exit(1)
        theirs.close()
        self.zygote, self.zygote_pid = ours, pid

    def spawn_case(self, stdin_data):
        """Stdio mode: have Z fork a fresh C whose stdin is a pipe fed with ``stdin_data`` (and nothing else)."""
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        try:
            self.zygote.sendmsg([b"C"], [(_SOL_SOCKET, _SCM_RIGHTS, _fd_bytes(in_r, out_w))])
        except OSError:
            raise _Abort("crash") from None
        finally:
            os.close(in_r)
            os.close(out_w)
        self.pid = int.from_bytes(self._zygote_reply(8), "big")
        self.req_w, self.rep_r, self.out_r, self.out_open = -1, -1, out_r, True
        self._feed_stdin(in_w, stdin_data.encode("utf-8", "surrogatepass"))

    def _zygote_reply(self, n):
        buf = b""
        fd = self.zygote.fileno()
        while len(buf) < n:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise _Abort("timeout")
            if select.select([fd], [], [], left)[0]:
                b = os.read(fd, n - len(buf))
                if not b:
                    raise _Abort("crash")  # Z was killed (by a candidate: same uid)
                buf += b
        return buf

    def _feed_stdin(self, fd, data):
        os.set_blocking(fd, False)
        self._stdin_fd, self._stdin_left = fd, memoryview(data)
        self._pump_stdin()

    def _pump_stdin(self):
        fd = self._stdin_fd
        if fd is None:
            return
        try:
            while self._stdin_left:
                self._stdin_left = self._stdin_left[os.write(fd, self._stdin_left) :]
        except BlockingIOError:
            return
        except OSError:
            pass
        os.close(fd)
        self._stdin_fd = None

    def kill(self, wait=True):
        """SIGKILL C's process group; ``wait=False`` at exit, where the sandbox teardown reaps it."""
        if self.pid is None:
            return
        try:
            os.killpg(self.pid, _SIGKILL)
        except OSError:
            pass
        try:
            os.kill(self.pid, _SIGKILL)
        except OSError:
            pass
        if wait:
            try:
                os.waitpid(self.pid, 0)
            except OSError:
                pass
        for fd in (self.req_w, self.rep_r, self.out_r):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        if self._stdin_fd is not None:
            os.close(self._stdin_fd)
            self._stdin_fd = None
        self.pid = None

    def _drain_output(self):
        try:
            b = os.read(self.out_r, 1 << 16)
        except OSError:
            b = b""
        if b:
            self.output_bytes += len(b)
            room = self.out_cap - len(self.output)
            if room > 0:
                self.output += b[:room]
            if self.output_bytes > self.out_cap:
                raise _Abort("output_limit")
        return b

    def recv(self):
        """Wait for one reply frame from C, draining its output; raise _Abort on deadline or cap."""
        buf = bytearray()
        need = 8
        header = True
        while True:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise _Abort("timeout")
            fds = [self.rep_r, self.out_r] if self.out_open else [self.rep_r]
            wfds = [self._stdin_fd] if self._stdin_fd is not None else []
            r, w, _ = select.select(fds, wfds, [], left)
            if w:
                self._pump_stdin()
            if self.out_r in r and not self._drain_output():
                self.out_open = False  # C closed its stdout and stderr: stop polling them (no busy loop)
            if self.rep_r in r:
                b = os.read(self.rep_r, need - len(buf))
                if not b:
                    raise _Abort("crash")
                buf += b
                if len(buf) == need:
                    if header:
                        need = int.from_bytes(buf, "big")
                        if need > _MAX_MSG:
                            raise _Abort("protocol")
                        header, buf = False, bytearray()
                        if need == 0:
                            raise _Abort("protocol")
                    else:
                        try:
                            return _h_validate(marshal.loads(bytes(buf)))
                        except Exception:  # noqa: BLE001 - any failure to decode C's data (MemoryError too)
                            raise _Abort("protocol") from None

    def wait_exit(self):
        """Stdio mode: wait for C to exit, collecting its output; returns the captured bytes."""
        while True:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise _Abort("timeout")
            wfds = [self._stdin_fd] if self._stdin_fd is not None else []
            r, w, _ = select.select([self.out_r], wfds, [], left)
            if w:
                self._pump_stdin()
            if r and not self._drain_output():
                return

    # -- remote objects
    def call(self, op, ref, *args):
        """One remote operation on C's object ``ref``; returns H-built data or raises the rebuilt exception."""
        if self.aborted is not None:
            raise _Abort(self.aborted)
        if self.pid is None:
            raise CandidateError("the candidate process is gone")
        try:
            message = (op, ref) + tuple(_h_encode(a) for a in args)
            marshal.dumps(message)
        except ValueError:
            raise TypeError("argument cannot be sent to the candidate (only plain data and its own objects)") from None
        try:
            try:
                _send(self.req_w, message)
            except OSError:
                raise _Abort("crash") from None
            reply = self.recv()
            if reply[0] == "ok" and len(reply) == 2:
                return _h_decode(reply[1], self)
            if reply[0] == "exc" and len(reply) == 3:
                raise _exception(reply[1], reply[2])
            raise _Abort("protocol")
        except _Abort as abort:
            self.aborted = abort.status
            raise


class _Abort(BaseException):
    """H stops talking to C: timeout, output cap, crash or protocol violation.

    A ``BaseException``, so that a test's ``except Exception`` cannot swallow it; and sticky (see
    :meth:`Harness.call`), so that a bare ``except:`` in a test cannot either.
    """

    def __init__(self, status):
        super().__init__(status)
        self.status = status


class Remote:
    """H's handle on an object living in C. Comparisons are by identity: C's ``__eq__`` is never consulted."""

    __slots__ = ("_h", "_ref", "_label")

    def __init__(self, h, ref, label):
        object.__setattr__(self, "_h", h)
        object.__setattr__(self, "_ref", ref)
        object.__setattr__(self, "_label", label)

    def __call__(self, *args, **kwargs):
        """Call the candidate's object in C with plain-data arguments."""
        return self._h.call("call", self._ref, list(args), kwargs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._h.call("getattr", self._ref, name)

    def __setattr__(self, name, value):
        self._h.call("setattr", self._ref, name, value)

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    def __hash__(self):
        return id(self)

    def __bool__(self):
        raise TypeError("a candidate object has no truth value in the tests (return plain data)")

    def __repr__(self):
        return f"<candidate object {self._label}>"


def _exception(name, msg):
    """Rebuild the candidate's exception in H: a builtin exception type by name, else CandidateError.

    Only ordinary errors keep their type (tests may expect ``ValueError``); an assertion error, a
    control-flow exception (:data:`_CONTROL_FLOW`) or a ``BaseException`` becomes a CandidateError.
    """
    cls = getattr(builtins, name, None) if type(name) is str and name not in _CONTROL_FLOW else None
    if isinstance(cls, type) and issubclass(cls, Exception) and cls is not AssertionError:
        try:
            return cls(msg)
        except Exception:  # noqa: BLE001 - exotic constructor signatures (UnicodeDecodeError...)
            pass
    return CandidateError(f"{name}: {msg}")


def _h_validate(v):
    """Check that a reply decoded by marshal holds only builtin data (no code objects), within size caps."""
    count = [0]

    def walk(x, depth):
        count[0] += 1
        if count[0] > _MAX_ITEMS or depth > 500:
            raise _Abort("protocol")
        t = type(x)
        if t in _SCALARS:
            return
        if t in (list, tuple, set, frozenset):
            for y in x:
                walk(y, depth + 1)
            return
        if t is dict:
            for k, y in x.items():
                walk(k, depth + 1)
                walk(y, depth + 1)
            return
        raise _Abort("protocol")

    walk(v, 0)
    return v


def _h_encode(v):
    t = type(v)
    if t is Remote:
        return (_REF, v._ref)
    if t in (list, tuple, set, frozenset):
        return t(_h_encode(x) for x in v)
    if t is dict:
        return {_h_encode(k): _h_encode(x) for k, x in v.items()}
    if t is range:
        return (_RANGE, v.start, v.stop, v.step)
    name = getattr(v, "__name__", None)
    if type(name) is str and getattr(builtins, name, None) is v and t not in _SCALARS:
        return (_BUILTIN, name)  # a builtin type or function passed as an argument (MBPP 533 passes `int`)
    return v


def _h_decode(v, h):
    t = type(v)
    if t is tuple and len(v) >= 2 and type(v[0]) is str and v[0].startswith("\x00lrm-"):
        tag = v[0]
        if tag == _REF and len(v) == 2 and type(v[1]) is int:
            return Remote(h, v[1], f"#{v[1]}")
        if tag == _ITER and len(v) == 2 and type(v[1]) is list:
            return iter([_h_decode(x, h) for x in v[1]])
        if tag == _FRAC and len(v) == 3 and type(v[1]) is int and type(v[2]) is int and v[2] != 0:
            import fractions

            return fractions.Fraction(v[1], v[2])
        if tag == _DEC and len(v) == 2 and type(v[1]) is str and len(v[1]) < 5000:
            import decimal

            return decimal.Decimal(v[1])
        if tag == _RANGE and len(v) == 4 and all(type(x) is int for x in v[1:]) and v[3] != 0:
            return range(v[1], v[2], v[3])
        raise _Abort("protocol")
    if t in (list, tuple, set, frozenset):
        return t(_h_decode(x, h) for x in v)
    if t is dict:
        return {_h_decode(k, h): _h_decode(x, h) for k, x in v.items()}
    return v


_SOL_SOCKET, _SCM_RIGHTS, _INT = 1, 1, 4  # Linux values (importing `socket` costs enum's start-up)


def _fd_bytes(*fds):
    return b"".join(fd.to_bytes(_INT, sys.byteorder) for fd in fds)


def _zygote(job, sock):
    """Body of Z (stdio mode). Never returns.

    Z is forked before H reads the cases and runs no candidate code. For each case H sends it the two
    case pipe ends (the stdin read end, the output write end) over a Unix socket; Z forks C with exactly
    those as fds 0, 1 and 2 and replies with C's pid. So each C's memory holds the program and its own
    stdin, never another case or any expected output (those never enter the sandbox: the parent compares).
    """
    import _socket

    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    _close_fds_except(sock.fileno())
    space = _socket.CMSG_SPACE(2 * _INT)
    deadline = time.monotonic() + float(job["deadline_s"])
    while True:
        try:
            data, anc, _, _ = sock.recvmsg(1, space)
        except OSError:
            os._exit(0)
        fds = [int.from_bytes(d[k : k + _INT], sys.byteorder) for _, _, d in anc for k in range(0, len(d), _INT)]
        if data != b"C" or len(fds) != 2:
            os._exit(0)
        pid = _fork(deadline)
        if pid == 0:  # C
            try:
                os.setsid()
                os.dup2(fds[0], 0)
                os.dup2(fds[1], 1)
                os.dup2(fds[1], 2)
                _close_fds_except()
                _candidate_stdio(job)
            finally:
                os._exit(1)
        for fd in fds:
            os.close(fd)
        sock.send(pid.to_bytes(8, "big"))
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass


def _candidate_stdio(job):
    """Body of C in stdio mode (fds 0-2 wired by Z): run the program as ``__main__``. Never returns."""
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", buffering=1 << 16, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    code = 0
    try:
        exec(compile(job["code"], "solution.py", "exec"), {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - untrusted code
        import traceback

        traceback.print_exc()
        code = 1
    try:
        sys.stdout.flush()
    except BaseException:  # noqa: BLE001
        pass
    os._exit(code)


class _Missing:
    """Stands for a name the tests expect but the candidate did not define; any use fails the test."""

    def __init__(self, name):
        self.name = name

    def __call__(self, *args, **kwargs):
        """Call the candidate's object in C with plain-data arguments."""
        raise NameError(f"name {self.name!r} is not defined by the solution")

    def __getattr__(self, attr):
        raise NameError(f"name {self.name!r} is not defined by the solution")


def _run_stdio_mode(h, stdins, outputs):
    """Run each case in a fresh C; record what it printed (the parent compares it with the expected output)."""
    for data in stdins:
        h.spawn_case(data)
        start = len(h.output)
        try:
            h.wait_exit()
        finally:
            outputs.append(bytes(h.output[start:]).decode("utf-8", "replace"))
        h.kill()


def _set_limits(limits):
    for name, value in limits.items():
        res = getattr(resource, "RLIMIT_" + name.upper())
        soft, hard = resource.getrlimit(res)
        value = int(value)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(res, (value, value))


def _non_dumpable():
    """PR_SET_DUMPABLE 0: same-uid processes can no longer ptrace H or open its /proc files.

    Calls prctl through the ``_ctypes`` extension directly: importing the ``ctypes`` package costs several
    milliseconds of start-up, every run.
    """
    import _ctypes

    prctl = _ctypes.dlsym(_ctypes.dlopen(None), "prctl")
    if _ctypes.call_function(prctl, (4, 0, 0, 0, 0)) != 0 or _ctypes.call_function(prctl, (3, 0, 0, 0, 0)) != 0:
        raise OSError("prctl(PR_SET_DUMPABLE, 0) failed")  # 4 = PR_SET_DUMPABLE, 3 = PR_GET_DUMPABLE


def _private_filesystem(hide, tmpfs_bytes):
    """Unshare fallback: cover host folders with empty tmpfs, then give up every capability.

    H runs as root of its own user namespace (mapped to the unprivileged slot uid on the host), so it may
    mount in its mount namespace. ``/tmp`` becomes a private size-capped writable tmpfs (the work dir);
    the other folders become empty read-only tmpfs. Then the capability bounding set, the permitted,
    effective and inheritable sets are emptied and no_new_privs is set, so C is a uid without any
    capability: host files get the permissions of "other", and the mounts cannot be undone (a nested
    namespace sees them locked).
    """
    import _ctypes

    libc = _ctypes.dlopen(None)
    mount, prctl, capset = (_ctypes.dlsym(libc, name) for name in ("mount", "prctl", "capset"))
    for path in hide:
        if not os.path.isdir(path):
            continue
        writable = path == "/tmp"
        opts = b"size=%d,mode=1777" % tmpfs_bytes if writable else b"size=4096,mode=755"
        flags = 2 | 4 | (0 if writable else 1)  # MS_NOSUID | MS_NODEV, plus MS_RDONLY for the covers
        if _ctypes.call_function(mount, (b"tmpfs", path.encode(), b"tmpfs", flags, opts)) != 0:
            raise OSError(f"cannot cover {path} with a tmpfs")
    os.mkdir("/tmp/work")
    os.chdir("/tmp/work")
    for cap in range(64):
        _ctypes.call_function(prctl, (24, cap, 0, 0, 0))  # PR_CAPBSET_DROP (EINVAL past the last cap)
    if _ctypes.call_function(prctl, (38, 1, 0, 0, 0)) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError("cannot set no_new_privs")
    header = (0x20080522).to_bytes(4, sys.byteorder) + bytes(4)  # _LINUX_CAPABILITY_VERSION_3, this thread
    if _ctypes.call_function(capset, (header, bytes(24))) != 0:
        raise OSError("cannot drop capabilities")
    with open("/proc/self/status") as f:
        caps = [line.split()[1] for line in f if line.startswith(("CapEff", "CapPrm", "CapBnd"))]
    if any(int(c, 16) for c in caps):
        raise OSError(f"capabilities remain after dropping them: {caps}")


def _trusted_path():
    """Keep on ``sys.path`` only folders this process cannot write, checked after every privilege is gone.

    H imports a few standard-library modules lazily (``fractions``, ``decimal``) after C has run; a folder on
    the path that the candidate (same uid) could write would let it plant one. With bubblewrap the whole
    root is read-only and nothing is dropped; without isolation (``process`` backend, a user's own writable
    interpreter) the lazy imports may then fail, which fails those values' tests, never passes them.
    """
    keep = []
    for entry in sys.path:
        if not entry:
            continue
        if os.access(entry, os.W_OK) or os.access(os.path.join(entry, "__pycache__"), os.W_OK):
            continue
        keep.append(entry)
    sys.path[:] = keep


def _put_str(parts, text):
    data = text.encode("utf-8", "replace")
    parts.append(len(data).to_bytes(4, "big"))
    parts.append(data)


def _pack_report(h, results, outputs):
    """The result record: a flat, fixed-order binary format the parent parses with bounded allocation.

    ``"R1"``, then status, error and output (each a 4-byte length and UTF-8), output_bytes (8 bytes), the
    per-test results (4-byte count, then a flag byte and a message each), the per-case outputs (4-byte
    count, then a text each). Not ``marshal``: its decoder allocates what the bytes claim, not what they hold.
    """
    parts = [b"R1"]
    for text in (h.status, h.error, bytes(h.output).decode("utf-8", "replace")):
        _put_str(parts, text)
    parts.append(min(h.output_bytes, (1 << 63) - 1).to_bytes(8, "big"))
    parts.append(len(results).to_bytes(4, "big"))
    for ok, msg in results:
        parts.append(b"\x01" if ok is True else b"\x00")
        _put_str(parts, msg)
    parts.append(len(outputs).to_bytes(4, "big"))
    for text in outputs:
        _put_str(parts, text)
    return b"".join(parts)


# ------------------------------------------------------------------------------------------- warm server
_CLONE_NEWNS, _CLONE_NEWIPC, _CLONE_NEWPID, _CLONE_NEWNET = 0x00020000, 0x08000000, 0x20000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_READY = b"LRMGYM-READY\n"
# Syscalls a warm job may not make (errno ENOSYS): the per-uid keyrings belong to the user namespace, which
# every job of one server shares (a cold sandbox has a user namespace, so a keyring, of its own). Audit
# arch, then the numbers of add_key, request_key and keyctl.
_SECCOMP_ARCH = {"x86_64": (0xC000003E, (248, 249, 250)), "aarch64": (0xC00000B7, (217, 218, 219))}


class _Warm:
    """A warm server's trusted machinery, set up once per server before any job exists (see :func:`serve`)."""

    def __init__(self, tmpfs_bytes):
        import _socket
        import ctypes
        import fcntl

        self.ctypes, self.fcntl, self.socket = ctypes, fcntl, _socket
        self.tmpfs = b"size=%d,mode=755" % int(tmpfs_bytes)
        libc = ctypes.CDLL(None, use_errno=True)
        ul = ctypes.c_ulong
        self.unshare = libc.unshare
        self.unshare.argtypes = [ctypes.c_int]
        self.mount = libc.mount
        self.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ul, ctypes.c_void_p]
        self.prctl = libc.prctl
        self.prctl.argtypes = [ctypes.c_int, ul, ul, ul, ul]
        self.capset = libc.capset
        self.capset.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        arch, denied = _SECCOMP_ARCH[os.uname().machine]  # another machine: the server fails, the pool goes cold
        deny, allow = 0x00050000 | 38, 0x7FFF0000  # SECCOMP_RET_ERRNO | ENOSYS, SECCOMP_RET_ALLOW
        n = len(denied)
        prog = [(0x20, 0, 0, 4), (0x15, 1, 0, arch), (0x06, 0, 0, deny), (0x20, 0, 0, 0)]  # ld arch; other ABI: deny
        prog.append((0x35, n + 1, 0, 0x40000000))  # x32 syscall numbers (same audit arch): deny
        prog += [(0x15, n - i, 0, nr) for i, nr in enumerate(denied)]
        prog += [(0x06, 0, 0, allow), (0x06, 0, 0, deny)]
        order = sys.byteorder
        raw = b"".join(
            c.to_bytes(2, order) + bytes((t, f)) + k.to_bytes(4, order) for c, t, f, k in prog
        )  # struct sock_filter
        self.filter = ctypes.create_string_buffer(raw, len(raw))

        class Fprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

        self.fprog = Fprog(len(prog), ctypes.addressof(self.filter))

    def _check(self, rc, what):
        if rc != 0:
            err = self.ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    def _mount(self, src, target, fstype, flags, data=None):
        self._check(self.mount(src, target, fstype, flags, data), f"mount {target!r}")

    def job(self, out):
        """Body of J, the job process: a fresh private world, then H as its pid 1. Returns H's exit status."""
        self._check(self.unshare(_CLONE_NEWNS | _CLONE_NEWIPC | _CLONE_NEWPID | _CLONE_NEWNET), "unshare")
        self._mount(None, b"/", None, _MS_REC | _MS_PRIVATE)  # nothing mounted here reaches the server
        self._mount(b"tmpfs", b"/tmp", b"tmpfs", _MS_NOSUID | _MS_NODEV, self.tmpfs)
        self._mount(b"tmpfs", b"/dev/shm", b"tmpfs", _MS_NOSUID | _MS_NODEV, b"size=1048576,mode=755")
        for path in (b"/", b"/dev"):  # the server's own writable tmpfs (root, /dev): read-only for the job
            self._mount(None, path, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
        os.mkdir("/tmp/work", 0o755)
        os.chdir("/tmp/work")
        sock = self.socket.socket(2, 2)  # AF_INET, SOCK_DGRAM: bring the new namespace's loopback up, as bwrap does
        try:
            name = b"lo".ljust(16, b"\0")
            got = self.fcntl.ioctl(sock.fileno(), 0x8913, name + bytes(24))  # SIOCGIFFLAGS
            flags = int.from_bytes(got[16:18], sys.byteorder) | 1  # IFF_UP
            self.fcntl.ioctl(sock.fileno(), 0x8914, name + flags.to_bytes(2, sys.byteorder) + bytes(22))
        finally:
            sock.close()
        pid = os.fork()
        if pid == 0:  # H: pid 1 of the job's own pid namespace
            try:
                self.harness(out)
            except BaseException:  # noqa: BLE001 - the set-up or the harness failed: say why (J then ends S)
                import traceback

                traceback.print_exc()
            finally:
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        return 0 if status == 0 else 1

    def harness(self, out):
        """Body of H in a warm job: its own /proc, no capability, the keyring filter, then :func:`main`."""
        self._check(self.prctl(1, _SIGKILL, 0, 0, 0), "parent-death signal")  # PR_SET_PDEATHSIG: dies with J
        self._mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        for cap in range(64):
            self.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP (EINVAL past the last cap)
        self._check(self.prctl(47, 4, 0, 0, 0), "clear ambient capabilities")  # PR_CAP_AMBIENT_CLEAR_ALL
        self._check(self.prctl(38, 1, 0, 0, 0), "no_new_privs")  # PR_SET_NO_NEW_PRIVS
        header = (0x20080522).to_bytes(4, sys.byteorder) + bytes(4)  # _LINUX_CAPABILITY_VERSION_3, this thread
        self._check(self.capset(header, bytes(24)), "capset")
        with open("/proc/self/status") as f:
            caps = [
                line.split()[1] for line in f if line.startswith(("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"))
            ]
        if len(caps) != 5 or any(int(c, 16) for c in caps):
            raise OSError(f"capabilities remain after dropping them: {caps}")
        fprog = self.ctypes.addressof(self.fprog)
        self._check(self.prctl(22, 2, fprog, 0, 0), "seccomp")  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        _non_dumpable()
        stream = os.fdopen(out, "wb")
        stream.write(_READY)  # set up and waiting: the parent may send the job
        stream.flush()
        main(stream)


def serve(tmpfs_bytes):
    """Warm server S: the sandbox's pid 1, forking one fresh job process per job. Never returns.

    S never reads a job and never runs anything a job sent: it forks J, waits for it to end, and forks the next
    one. J (see :meth:`_Warm.job`) unshares a mount, IPC, network and pid namespace, mounts a fresh size-capped
    tmpfs on ``/tmp`` and ``/dev/shm`` and makes the rest read-only, and forks H, pid 1 of the new pid
    namespace, which mounts its own ``/proc``, drops every capability, installs the keyring filter, writes
    ``LRMGYM-READY`` on the result channel and then runs :func:`main` exactly as a cold sandbox does. When H
    exits, the kernel kills every process of its pid namespace before J sees it gone; only then is the next
    J forked, so the next job's frames (sent after its READY) never meet a process of the previous job. If J
    ends in any other way than H's clean exit, S exits: the whole server goes, and the pool starts a fresh one.
    """
    out = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.close(devnull)
    _non_dumpable()
    os.chdir("/")
    warm = _Warm(tmpfs_bytes)
    while True:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = warm.job(out)
            except BaseException:  # noqa: BLE001 - trusted code failed: say why on the sandbox's stderr
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
        while True:
            try:
                done, status = os.waitpid(-1, 0)  # S is the sandbox's pid 1: orphans (none expected) come here
            except ChildProcessError:
                os._exit(1)
            if done == pid:
                break
        if status != 0:
            os._exit(1)


def main(out=None):
    """Run one job: read the frames, grade, write the one result record on the result channel.

    ``out``: the result channel, already set up by a warm server's job process (:func:`serve`); by default
    this process's stdout.
    """
    if out is None:
        out = os.fdopen(os.dup(1), "wb")
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)  # nothing else in H prints on the result channel by accident
        _non_dumpable()
    job = _read_frame(0)  # a pre-started sandbox waits here, everything above already done
    out.write(b"LRMGYM-HARNESS-START\n")  # the job arrived: from here on, no result means the job's fault
    out.flush()
    if job.get("hide"):
        _private_filesystem(job["hide"], int(job["tmpfs_bytes"]))
        _non_dumpable()
    _trusted_path()
    _set_limits(job.get("limits", {}))
    h = Harness(job)
    results, outputs = [], []
    total = 0
    tests = None
    try:
        if job["mode"] == "call":
            # Fork C before reading the tests, so C's copy of memory never contains them.
            h.spawn()
            tests = _read_frame(0)
            total = sum(1 for u in tests["units"] if u["test"])
            _run_call_mode(h, tests, results)
        else:
            h.start_zygote()
            tests = _read_frame(0)
            _run_stdio_mode(h, tests["stdins"], outputs)
    except _Abort as abort:
        h.status = abort.status
        if job["mode"] == "call" and tests is None:
            # C could not be forked before the deadline (RLIMIT_NPROC taken by the uid's other tasks): it never
            # existed, so the tests may be read now, to report each as not run (the parent rejects a record
            # whose result count differs from the job's as malformed, a "protocol" failure).
            total = sum(1 for u in _read_frame(0)["units"] if u["test"])
    finally:
        h.kill(wait=False)
        if h.zygote_pid is not None:
            try:
                os.kill(h.zygote_pid, _SIGKILL)
            except OSError:
                pass
    while len(results) < total:
        results.append([False, f"not run ({h.status})"])
    data = _pack_report(h, results, outputs)
    out.write(b"LRMGYM-RESULT\n" + len(data).to_bytes(8, "big") + data)
    out.flush()
    os._exit(0)  # nothing left to do: skip the interpreter's clean-up


def _run_call_mode(h, tests, results):
    first = h.recv()
    if first[0] == "dead":
        h.status = "error"
        h.error = f"{first[1]}: {first[2]}"
        return
    if first[0] != "ready" or type(first[1]) is not dict:
        raise _Abort("protocol")
    _bind_and_run(h, first[1], tests, results)


def _bind_and_run(h, names, tests, results):
    """Run the test units in H's own namespace.

    The namespace holds H's builtins (a candidate that defines ``abs`` or ``sorted`` changes nothing the
    tests compute), the trusted prelude's names, and of the candidate only its entry points
    (``job["entry"]``; the parent derives them from the tests' free names and the aliases).
    """
    ns = {"__name__": "__tests__", "__builtins__": builtins}
    for name, entry in names.items():
        if type(name) is not str or type(entry) is not tuple or len(entry) != 2 or entry[0] != "data":
            raise _Abort("protocol")
        if name not in h.job["entry"]:
            raise _Abort("protocol")
        value = _h_decode(entry[1], h)
        if type(value) is Remote:
            object.__setattr__(value, "_label", name)
        ns[name] = value
    for name in h.job["entry"]:
        ns.setdefault(name, _Missing(name))
    for alias, name in tests.get("bind", {}).items():
        ns[alias] = ns.get(name, _Missing(name))
    broken = None
    if tests.get("prelude"):
        try:
            exec(compile(tests["prelude"], "tests_prelude.py", "exec"), ns)
        except _Abort:
            raise
        except BaseException as exc:  # noqa: BLE001 - setup that calls candidate code may fail
            broken = f"setup failed: {type(exc).__name__}: {str(exc)[:_ERR_TAIL]}"
        if h.aborted is not None:
            raise _Abort(h.aborted)
    for unit in tests["units"]:
        if broken is not None:
            if unit["test"]:
                results.append([False, broken])
            continue
        try:
            exec(compile(unit["src"], "tests.py", "exec"), ns)
            if h.aborted is not None:  # a bare ``except:`` in the test swallowed the abort
                raise _Abort(h.aborted)
            if unit["test"]:
                results.append([True, ""])
        except _Abort:
            raise
        except BaseException as exc:  # noqa: BLE001 - a test failing in any way is a failed test
            if h.aborted is not None:
                raise _Abort(h.aborted) from None
            msg = f"{type(exc).__name__}: {str(exc)[:_ERR_TAIL]}"
            if unit["test"]:
                results.append([False, msg])
            else:
                broken = "setup failed: " + msg


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        size = int(sys.argv[2])
        del sys.argv[1:]  # the candidate sees the argv of a cold harness
        serve(size)
    else:
        main()
