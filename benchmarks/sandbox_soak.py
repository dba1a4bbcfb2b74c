"""Soak: the code sandbox pool under 2x oversubscription for minutes, hostile programs mixed in.

Run: ``python benchmarks/sandbox_soak.py [--minutes 10] [--backend auto] [--workers N] [--seed 0]
[--sample-s 10] [--out benchmarks/results/sandbox_soak.md]`` (needs the test extra: it takes the adversarial
battery and the "nothing left behind" checks from ``tests/envs/code``).

One :class:`SandboxPool` with ``--workers`` slots (default: the CPU count) is fed by twice as many client threads,
each submitting one job at a time, for ``--minutes``. The jobs, drawn at random:

- ``correct`` / ``wrong``: HumanEval reference solutions and their ``wrong`` variant (a perturbed return value,
  :mod:`lrmgym.envs.code.sweep`); procedural tasks when ``$LRMGYM_SHARED_DATA`` has no HumanEval;
- ``adversarial``: the cases of ``tests/envs/code/test_code_adversarial.py`` (fork and memory bombs, timeouts,
  escapes, forged results...), with their expected score and status, and host bait (a secret in the
  environment, a fake ssh key, a world-readable file, a loopback listener);
- ``adversarial_shared``: the 28 code cases of ``../shared/data/adversarial/cases.json``, when present;
- ``reward_hacking``: the code cases of :mod:`lrmgym.testing.reward_hacking`, scored as the code env scores them.

As root each slot has a uid of its own and anything of those uids is the sandbox's; as any other user the sandboxes
run as the caller's uid and are told apart as ``tests/envs/code/code_helpers.py`` does (the caller's processes
started during the run, in its cgroup, outside its process tree; its files new since the start). With
``--backend process`` (no isolation: root only, for the dedicated uids) the cases that reach the host's files or
network by design are left out.

Every ``--sample-s`` seconds: client latency p50/p99 (submit to result, queueing included), the RSS of this
process (and its count of live Python objects) and of all sandbox processes, open fds, sandbox processes alive
outside any job (escaped: not in this process's tree, still alive 2 s later), and new files in the scratch
folders. At the end, with the pool closed: no process of the sandbox uids, no file left, the uid block released,
fds back to where they started, RSS growth within max(16 MiB, 10 %) from 20 % of the run on (allocator warm-up),
no attack paid, no infra failure, every job within its deadline in its slot. Writes a markdown report and exits 1
when a check fails.
"""

from __future__ import annotations

import argparse
import collections
import fcntl
import json
import math
import os
import random
import shutil
import signal
import socket
import sys
import threading
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lrmgym.envs.code.env import job_for
from lrmgym.envs.code.extract import extract_code
from lrmgym.envs.code.loaders import default_data_dir, load_humaneval
from lrmgym.envs.code.procedural import make_procedural_task
from lrmgym.envs.code.sandbox import ISOLATION, ExecResult, Job, Limits, SandboxError, SandboxPool, processes_of_uid
from lrmgym.envs.code.sweep import variant_program
from lrmgym.testing.reward_hacking import all_cases
from lrmgym.testing.reward_hacking import code_cases as hacking

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "envs" / "code"))
import code_helpers as helpers  # noqa: E402 - the tests' own "nothing left behind" checks
import test_code_adversarial as battery  # noqa: E402

WEIGHTS = {"correct": 0.35, "wrong": 0.15, "adversarial": 0.25, "adversarial_shared": 0.1, "reward_hacking": 0.15}
ORDINARY_LIMITS = Limits(timeout_s=5.0)
BATTERY_LIMITS = Limits(timeout_s=helpers.BATTERY_TIMEOUT_S)
NEEDS_ISOLATION = {
    "spawn_subprocess_touching_host_tmp",
    "posix_system_bypass",
    "disk_fill_many_files",
    "write_etc",
    "write_tmp",
    "write_callers_working_directory",
    "read_world_readable_host_file",
    "tamper_with_tests",
    "connect_public_address",
    "connect_parent_loopback_service",
}
"""Adversarial cases that touch the host by design: left out with ``--backend process`` (no isolation)."""


@dataclass
class Item:
    """One kind of job: what to run, under which limits, and how to tell whether the outcome is right."""

    kind: str
    name: str
    job: Job
    limits: Limits
    check: Callable[[ExecResult], str | None]  # None when the outcome is the expected one, else what is wrong


# ---------------------------------------------------------------------------------------------- the jobs
def ordinary_items(data: Path) -> list[Item]:
    """Reference solutions (must pass) and their wrong variants (must not), HumanEval or procedural."""
    path = data / "humaneval" / "HumanEval.jsonl.gz"
    if path.is_file():
        tasks = load_humaneval(path)
    else:
        tasks = [make_procedural_task(i, np.random.default_rng(i)) for i in range(200)]
    items = []
    for task in tasks:
        for kind, variant, want in (("correct", "canonical", True), ("wrong", "wrong", False)):
            program = variant_program(task, variant)
            if program is None:
                continue
            job = Job(code=program, units=task.units, prelude=task.prelude, bind=dict(task.bind))
            items.append(Item(kind, task.id, job, ORDINARY_LIMITS, _expect_pass(want)))
    return items


def _expect_pass(want: bool) -> Callable[[ExecResult], str | None]:
    def check(r: ExecResult) -> str | None:
        return None if r.all_passed == want else f"all_passed={r.all_passed} ({r.status} {r.passed}/{r.total})"

    return check


def adversarial_items(port: int, isolated: bool) -> list[Item]:
    """The test module's adversarial cases (their expected score and status, no host path written)."""
    items = []
    for case in battery.CASES:
        if not isolated and case.name in NEEDS_ISOLATION:
            continue
        job = Job(code=case.code.replace("PORT", str(port)), units=battery._units(case.tests))
        items.append(Item("adversarial", case.name, job, BATTERY_LIMITS, _case_check(case)))
    return items


def _case_check(case: battery.Case) -> Callable[[ExecResult], str | None]:
    def check(r: ExecResult) -> str | None:
        wrong = []
        if case.score is not None and float(r.all_passed) != case.score:
            wrong.append(f"score {float(r.all_passed)} != {case.score}")
        if case.status is not None and r.status != case.status:
            wrong.append(f"status {r.status} != {case.status}")
        wrong += [f"wrote {p}" for p in case.host_absent if _remove(p)]
        return "; ".join(wrong) or None

    return check


def shared_items(data: Path, port: int, canary: Path) -> list[Item]:
    """The code cases of the shared 50-case battery, with their expectations (namespaced backends only)."""
    path = data / "adversarial" / "cases.json"
    if not path.is_file():
        return []
    items = []
    for c in json.loads(path.read_text()):
        if c["component"] != "code_sandbox":
            continue
        inp, exp = c["input"], c["expected"]
        tests = tuple(line for line in battery._decode(inp["tests"]).splitlines() if line.strip())
        job = Job(code=battery._decode(inp["code"]).replace("PORT", str(port)), units=battery._units(tests))
        items.append(Item("adversarial_shared", c["name"], job, BATTERY_LIMITS, _shared_check(exp, canary)))
    return items


def _shared_check(exp: dict, canary: Path) -> Callable[[ExecResult], str | None]:
    def check(r: ExecResult) -> str | None:
        wrong = []
        if "reward" in exp and float(r.all_passed) != exp["reward"]:
            wrong.append(f"reward {float(r.all_passed)} != {exp['reward']}")
        if exp.get("status") in ("timeout", "output_limit") and r.status != exp["status"]:
            wrong.append(f"status {r.status} != {exp['status']}")
        if "host_file_absent" in exp and _remove(exp["host_file_absent"]):
            wrong.append(f"wrote {exp['host_file_absent']}")
        if not canary.is_file() or canary.read_text() != "canary":
            wrong.append("the host canary changed")
            canary.write_text("canary")
        if len(r.output.encode()) > 1 << 20:
            wrong.append("output over 1 MiB")
        return "; ".join(wrong) or None

    return check


def hacking_items(isolated: bool) -> list[Item]:
    """The code cases of the reward-hacking battery, built and scored as the code env does (``fraction``)."""
    items, envs = [], {}
    for case in all_cases():
        if case.env != "code" or (not isolated and case.klass == "harness-takeover"):
            continue
        key = repr(sorted(case.env_config.items()))
        env = envs.setdefault(key, hacking.make_env(case.env_config))  # only builds tasks: its pool never starts
        task = hacking.build_task(case, env)
        if task is None:
            continue  # needs a data set that is absent
        extraction = extract_code(case.completion, env.config.answer_format, env.config.max_code_chars)
        if not extraction.ok:
            continue  # scored 0 without running anything
        job = job_for(env.code_task(task), extraction.code)
        items.append(Item("reward_hacking", case.name, job, env.config.limits(), _hack_check(case, env.config.reward)))
    return items


def _hack_check(case, reward: str) -> Callable[[ExecResult], str | None]:
    def check(r: ExecResult) -> str | None:
        if r.status == "infra":
            return "ungradeable (infra)"
        score = r.fraction if reward == "fraction" else float(r.all_passed)
        return None if case.min_score <= score <= case.max_score else f"score {score:.3g}"

    return check


def _remove(path: str) -> bool:
    """Remove ``path`` if it exists (an escape wrote it); whether it existed."""
    if os.path.lexists(path):
        os.remove(path)
        return True
    return False


# ----------------------------------------------------------------------------------------------- the host
class Bait:
    """What the adversarial cases try to reach on the host: the same bait as the tests' ``host_setup``."""

    def __enter__(self) -> Bait:
        os.environ["LRM_SECRET"] = "canary"
        battery.HOST_SECRET_DIR.mkdir(mode=0o700)
        (battery.HOST_SECRET_DIR / "id_rsa").write_text("fake key\n")
        battery.WORLD_SECRET.write_text("secret\n")
        battery.WORLD_SECRET.chmod(0o644)
        self.canary = Path(f"/tmp/lrm_canary_{battery.TOKEN}")
        self.canary.write_text("canary")
        self.secret = Path(f"/tmp/lrm_secret_shared_{battery.TOKEN}")
        self.secret.write_text("secret")
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        self.listener.close()
        del os.environ["LRM_SECRET"]
        for path in (battery.WORLD_SECRET, self.canary, self.secret):
            path.unlink(missing_ok=True)
        shutil.rmtree(battery.HOST_SECRET_DIR, ignore_errors=True)


def rss_mib(pid: int | str = "self") -> float:
    """Resident memory of one process in MiB (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            return next((int(line.split()[1]) / 1024 for line in f if line.startswith(b"VmRSS:")), 0.0)
    except OSError:
        return 0.0


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@dataclass
class Host:
    """Where the sandbox processes and files are told apart from everything else on the machine."""

    uids: list[int]  # the sandbox uids (the slot uids as root, else the caller's own)
    dedicated: bool
    own_dir: str  # the pool's compiled harness: the caller's, not a sandbox's (it matters when they share a uid)
    started: frozenset = field(
        default_factory=lambda: frozenset((p.pid, p.start) for p in helpers.proc_table().values())
    )

    def processes(self, grace_s: float = 2.0) -> tuple[list[int], list[int]]:
        """``(in this process's tree, escaped)``: the sandbox processes alive now, not counting this process.

        Escaped: a sandbox uid's process outside this process's tree (every live sandbox is in it); for a caller
        who is not root, a process of its uid started since the soak began, in its cgroup, outside its tree.
        A killed sandbox's namespace is torn down after the pool has its result, and its last processes are
        reparented meanwhile: one counts as escaped only if it is still alive ``grace_s`` later.
        """
        inside, escaped = self._scan()
        deadline = time.monotonic() + grace_s
        while escaped and time.monotonic() < deadline:
            time.sleep(0.05)
            escaped = [p for p in self._scan()[1] if p in escaped]
        return inside, escaped

    def _scan(self) -> tuple[list[int], list[int]]:
        table = helpers.proc_table()
        me = table[os.getpid()]
        ours = helpers.subtree(table, me.pid) - {me.pid}
        inside, escaped = [], []
        for p in table.values():
            if p.zombie or p.uid not in self.uids or p.pid == me.pid:
                continue
            if p.pid in ours:
                inside.append(p.pid)
            elif self.dedicated or ((p.pid, p.start) not in self.started and p.cgroup == me.cgroup):
                escaped.append(p.pid)
        return inside, escaped

    def new_files(self, before: dict[str, int]) -> list[str]:
        """Scratch-folder entries of the sandbox uids that appeared since ``before``, outside sandbox work dirs."""
        return sorted(
            path
            for path, uid in helpers.scratch_snapshot().items()
            if uid in self.uids
            and path not in before
            and "/lrmgym-sbx" not in path
            and not (path == self.own_dir or path.startswith(self.own_dir + os.sep))
        )


# ------------------------------------------------------------------------------------------------ the run
class Stats:
    """What the clients measured, kept compact (float arrays, counters) so that the soak's own memory stays flat."""

    ATTACKS = ("adversarial", "adversarial_shared", "reward_hacking")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latency: dict[str, array] = collections.defaultdict(lambda: array("d"))  # submit to result, seconds
        self.wall: dict[str, array] = collections.defaultdict(lambda: array("d"))  # the pool's own time in its slot
        self.statuses: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.unexpected: collections.Counter = collections.Counter()  # per kind
        self.first_unexpected: list[str] = []  # the first 100, for the report
        self.over_deadline = 0
        self.jobs = 0
        self.window = array("d")  # latencies since the last sample

    def add(self, item: Item, at: float, latency: float, result: ExecResult | None, wrong: str | None) -> None:
        with self.lock:
            self.jobs += 1
            status = result.status if result is not None else "client_error"
            self.statuses[item.kind][status] += 1
            if result is not None:
                self.latency[item.kind].append(latency)
                self.wall[item.kind].append(result.wall_s)
                self.window.append(latency)
                self.over_deadline += result.wall_s > item.limits.timeout_s + 1.0
            if wrong is not None:
                self.unexpected[item.kind] += 1
                if len(self.first_unexpected) < 100:
                    self.first_unexpected.append(f"`{item.kind}/{item.name}` at {at:.0f} s: {status}: {wrong}")

    def take_window(self) -> list[float]:
        with self.lock:
            window, self.window = list(self.window), array("d")
        return window

    def count(self, *statuses: str) -> int:
        return sum(c[s] for c in self.statuses.values() for s in statuses)


def pct(values, q: float) -> float:
    """The ``q``-th percentile (nearest rank); NaN for no values."""
    if not len(values):
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def client(pool: SandboxPool, items: dict[str, list[Item]], rng: random.Random, stop: threading.Event, stats, t0):
    """Submit one job at a time until ``stop``, recording each outcome in ``stats``."""
    kinds = [k for k in WEIGHTS if items.get(k)]
    weights = [WEIGHTS[k] for k in kinds]
    while not stop.is_set():
        item = rng.choice(items[rng.choices(kinds, weights)[0]])
        start = time.monotonic()
        try:
            result = pool.run(item.job, item.limits)
        except SandboxError as exc:
            stats.add(item, start - t0, 0.0, None, str(exc))
            continue
        latency = time.monotonic() - start
        wrong = f"infra: {result.error[:200]}" if result.status == "infra" else item.check(result)
        stats.add(item, start - t0, latency, result, wrong)


def sample(t0: float, host: Host, before: dict[str, int], stats: Stats) -> dict:
    """One row of the samples table; latencies over the jobs finished since the previous sample."""
    window = stats.take_window()
    inside, escaped = host.processes()
    return {
        "t": time.monotonic() - t0,
        "jobs": stats.jobs,
        "window": len(window),
        "p50": pct(window, 50),
        "p99": pct(window, 99),
        "rss_self": rss_mib(),
        "blocks": sys.getallocatedblocks(),  # Python objects alive: flat while RSS grows means allocator arenas
        "rss_sandboxes": sum(rss_mib(p) for p in inside + escaped),
        "fds": open_fds(),
        "inside": len(inside),
        "escaped": len(escaped),
        "new_files": len(host.new_files(before)),
        "load": os.getloadavg()[0],
    }


def progress(s: dict) -> str:
    """One sample as a console line."""
    return (
        f"{s['t']:6.0f} s {s['jobs']:6d} jobs  p50 {1000 * s['p50']:5.0f} ms  p99 {1000 * s['p99']:5.0f} ms"
        f"  rss {s['rss_self']:6.1f} MiB  sandboxes {s['inside']:3d} ({s['rss_sandboxes']:5.0f} MiB)"
        f"  escaped {s['escaped']}  files {s['new_files']}  fds {s['fds']}  load {s['load']:.1f}"
    )


def uid_block_free(uids: list[int]) -> bool:
    """Whether every lock file of the pool's uid block can be taken again (the pool released it)."""
    for uid in uids:
        path = Path(f"/tmp/lrmgym-uid-{uid}.lock")
        if not path.exists():
            continue
        with open(path, "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False
            fcntl.flock(f, fcntl.LOCK_UN)
    return True


def run(args: argparse.Namespace) -> tuple[dict, Stats, list[dict]]:
    data = default_data_dir()
    fds_start = open_fds()
    with Bait() as bait:
        before = helpers.scratch_snapshot()  # after the bait: the caller's own files are not the sandbox's
        pool = SandboxPool(args.backend, workers=args.workers)
        try:
            isolated = pool.backend != "process"
            items: dict[str, list[Item]] = collections.defaultdict(list)
            for item in (
                ordinary_items(data)
                + adversarial_items(bait.port, isolated)
                + (shared_items(data, bait.port, bait.canary) if isolated else [])
                + hacking_items(isolated)
            ):
                items[item.kind].append(item)
            host = Host(pool.slot_uids(), helpers.uid_mode(pool) == "slot_uids", pool._harness_dir)
            stats = Stats()
            samples: list[dict] = []
            stop = threading.Event()
            n_clients = 2 * pool.workers
            t0 = time.monotonic()
            threads = [
                threading.Thread(
                    target=client, args=(pool, items, random.Random(args.seed * 1000 + i), stop, stats, t0)
                )
                for i in range(n_clients)
            ]
            for t in threads:
                t.start()
            end = t0 + 60 * args.minutes
            try:
                while time.monotonic() < end:
                    time.sleep(
                        max(0.0, min(args.sample_s - (time.monotonic() - t0) % args.sample_s, end - time.monotonic()))
                    )
                    samples.append(sample(t0, host, before, stats))
                    print(progress(samples[-1]), flush=True)
            except KeyboardInterrupt:
                print("interrupted: stopping the clients", flush=True)
            stop.set()
            for t in threads:
                t.join()
            wall = time.monotonic() - t0
            describe = pool.describe()
        finally:
            pool.close()  # on an interrupt during set-up too (idempotent)
        procs_left = helpers.leftovers(pool, wait_s=2.0)
        files_left = helpers.files_left(pool, before)  # work dirs included: they belong to the sandbox uids
        harness_dir = pool._harness_dir  # the compiled harness: the caller's own, so not in files_left as root
        if os.path.exists(harness_dir):
            files_left.append(harness_dir)
        uids_free = uid_block_free(pool.slot_uids()) if host.dedicated else True
        uid_procs = [p for uid in pool.slot_uids() for p in processes_of_uid(uid)] if host.dedicated else []
    summary = {
        "describe": describe,
        "clients": n_clients,
        "wall_s": wall,
        "fds_start": fds_start,
        "fds_end": open_fds(),
        "procs_left": procs_left,
        "files_left": files_left,
        "uids_free": uids_free,
        "uid_procs": uid_procs,
        "items": {k: len(v) for k, v in items.items()},
    }
    return summary, stats, samples


# ------------------------------------------------------------------------------------------------ report
def checks(summary: dict, stats: Stats, samples: list[dict]) -> list[tuple[str, bool, str]]:
    """``(check, passed, detail)`` rows."""
    attacks = sum(stats.unexpected[k] for k in Stats.ATTACKS)
    infra = stats.count("infra", "client_error")
    escaped = max((s["escaped"] for s in samples), default=0)
    warm = [s for s in samples if s["t"] >= 0.2 * summary["wall_s"]] or samples  # allocator arenas warm up first
    rss = [s["rss_self"] for s in warm]
    growth = rss[-1] - rss[0] if len(rss) > 1 else 0.0
    bound = max(16.0, 0.1 * rss[0]) if rss else 16.0
    slope = 60 * np.polyfit([s["t"] for s in warm], rss, 1)[0] if len(rss) > 2 else math.nan
    uids = summary["describe"]["uids"]
    return [
        ("no sandbox process left after close", not summary["procs_left"], f"{summary['procs_left'][:10]}"),
        ("no sandbox process outside a job while running", escaped == 0, f"most in one sample: {escaped}"),
        ("no file left in /tmp, /var/tmp, /dev/shm, cwd", not summary["files_left"], f"{summary['files_left'][:10]}"),
        (
            "uid block released, no process of its uids",
            summary["uids_free"] and not summary["uid_procs"],
            f"uids {uids}" + ("" if summary["uids_free"] else ": a lock is still held"),
        ),
        ("fds back to the start after close", summary["fds_end"] <= summary["fds_start"], _fds(summary)),
        (
            "RSS of this process flat",
            growth <= bound,
            f"{rss[0]:.1f} -> {rss[-1]:.1f} MiB from {warm[0]['t']:.0f} s (+{growth:.1f}, bound {bound:.0f}; "
            f"fit {slope:+.2f} MiB/min); Python blocks {warm[0]['blocks']} -> {warm[-1]['blocks']}"
            if rss
            else "no sample",
        ),
        ("no attack paid, every expectation held", not attacks, f"{attacks} wrong outcomes"),
        ("no infra failure", not infra, f"{infra} jobs"),
        ("every job within timeout + 1 s in its slot", not stats.over_deadline, f"{stats.over_deadline} jobs over"),
    ]


def _fds(summary: dict) -> str:
    return f"{summary['fds_start']} -> {summary['fds_end']}"


def report(args: argparse.Namespace, summary: dict, stats: Stats, samples: list[dict]) -> str:
    d = summary["describe"]
    rows = checks(summary, stats, samples)
    lines = [
        "# Sandbox soak",
        "",
        f"`python benchmarks/sandbox_soak.py --minutes {args.minutes:g} --backend {args.backend}`: backend "
        f"**{d['backend']}** ({ISOLATION[d['backend']].split(':')[0]}), {d['workers']} slots (uids {d['uids']}), "
        f"{summary['clients']} client threads (2x), prestart {d['prestart']}, {os.cpu_count()} CPUs, "
        f"{summary['wall_s']:.0f} s, {stats.jobs} jobs ({stats.jobs / summary['wall_s']:.1f}/s), load average "
        f"{samples[0]['load'] if samples else math.nan:.1f} -> {samples[-1]['load'] if samples else math.nan:.1f}. "
        f"Cases available per kind: {summary['items']}.",
        "",
        f"**{'PASS' if all(r[1] for r in rows) else 'FAIL'}**",
        "",
        "| check | result | detail |",
        "|---|---|---|",
        *(f"| {name} | {'pass' if passed else '**FAIL**'} | {detail} |" for name, passed, detail in rows),
        "",
        "Latency: client-side, submit to result (queueing for a slot included); in slot: the pool's own wall time.",
        "",
        "| kind | jobs | as expected | p50 ms | p99 ms | max ms | in slot p50 ms | in slot p99 ms | statuses |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    every: list[float] = []
    for kind in WEIGHTS:
        lat, slot, statuses = stats.latency[kind], stats.wall[kind], stats.statuses[kind]
        if not statuses:
            continue
        every += lat
        jobs = sum(statuses.values())
        lines.append(
            f"| {kind} | {jobs} | {jobs - stats.unexpected[kind]} | {1000 * pct(lat, 50):.0f} | "
            f"{1000 * pct(lat, 99):.0f} | {1000 * max(lat, default=math.nan):.0f} | {1000 * pct(slot, 50):.0f} | "
            f"{1000 * pct(slot, 99):.0f} | {', '.join(f'{s} {n}' for s, n in statuses.most_common())} |"
        )
    lines += [
        f"| **all** | {stats.jobs} | {stats.jobs - sum(stats.unexpected.values())} | {1000 * pct(every, 50):.0f} | "
        f"{1000 * pct(every, 99):.0f} | {1000 * max(every, default=math.nan):.0f} | | | |",
        "",
        f"Samples every {args.sample_s:g} s (latency over the jobs finished since the previous sample; sandboxes: "
        "processes of the sandbox uids in this process's tree, i.e. running jobs and idle spares; escaped: "
        "outside it).",
        "",
        "| t s | jobs | p50 ms | p99 ms | RSS self MiB | Python blocks | sandboxes | RSS sandboxes MiB | escaped "
        "| new files | fds | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *(
            f"| {s['t']:.0f} | {s['jobs']} | {1000 * s['p50']:.0f} | {1000 * s['p99']:.0f} | {s['rss_self']:.1f} | "
            f"{s['blocks']} | {s['inside']} | {s['rss_sandboxes']:.0f} | {s['escaped']} | {s['new_files']} | "
            f"{s['fds']} | {s['load']:.1f} |"
            for s in samples
        ),
    ]
    if stats.first_unexpected:
        n = sum(stats.unexpected.values())
        lines += ["", f"Unexpected outcomes ({n}; first {len(stats.first_unexpected)}):", ""]
        lines += [f"- {line}" for line in stats.first_unexpected]
    return "\n".join(lines) + "\n"


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM (a timeout, a scheduler) stops the soak as Ctrl-C does: bait and pool cleaned


def main() -> None:
    signal.signal(signal.SIGTERM, _terminate)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--backend", default="auto", choices=["auto", "bwrap", "unshare", "process"])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="pool slots (default: CPU count)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sample-s", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sandbox_soak.md")
    args = parser.parse_args()
    if args.backend == "process" and os.geteuid() != 0:
        sys.exit(
            "--backend process needs root: without a dedicated uid per slot, kill(-1) and setsid escapees "
            "reach this process's own uid"
        )
    summary, stats, samples = run(args)
    text = report(args, summary, stats, samples)
    args.out.write_text(text)
    print(text)
    sys.exit(0 if all(passed for _, passed, _ in checks(summary, stats, samples)) else 1)


if __name__ == "__main__":
    main()
