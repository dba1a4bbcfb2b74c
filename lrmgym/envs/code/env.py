"""``lrmgym/Code-v0``: the policy writes Python; the env runs it against unit tests in an isolated sandbox."""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from lrmgym.core import Completion, Component, Task, TextEnv, Verdict
from lrmgym.envs.code import heldout, loaders
from lrmgym.envs.code.extract import extract_code
from lrmgym.envs.code.livecodebench import load_livecodebench
from lrmgym.envs.code.loaders import CodeTask
from lrmgym.envs.code.procedural import make_procedural_task
from lrmgym.envs.code.sandbox import ExecResult, Job, Limits, SandboxPool

__all__ = ["CodeConfig", "CodeEnv", "job_for"]

_NAMED_SOURCES = ("procedural", "humaneval", "mbpp")
_KEPT_RESULTS = 256
"""Executions kept for :meth:`CodeEnv.feedback` (each holds at most ``output_bytes`` of program output)."""

INSTRUCTIONS = {
    "fenced": "Write your solution as a complete Python program in a single ```python code block. "
    "Only the standard library is available.",
    "whole": "Reply with only the Python code of your solution, with no explanation. "
    "Only the standard library is available.",
}


class CodeConfig(BaseModel):
    """Options of the code env."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    source: str = "procedural"
    """Where tasks come from: 'procedural' (generated functions with generated asserts, no data needed),
    'humaneval', 'mbpp', or a path to a JSONL file of tasks (see lrmgym/envs/code/loaders.py for its fields)."""
    data_format: Literal["tasks", "livecodebench"] = "tasks"
    """For a file source: 'tasks' (lrmgym's JSONL fields, see lrmgym/envs/code/loaders.py) or 'livecodebench'
    (records of livecodebench/code_generation_lite: stdio tasks graded on their private tests only, the public ones
    shown as examples; see lrmgym/envs/code/livecodebench.py)."""
    split: str = "test"
    """MBPP: 'test' (11-510), 'train' (601-974), 'validation' (511-600), 'prompt' (1-10) or 'all'.
    HumanEval has only 'test'. Ignored for 'procedural' and JSONL sources (taken whole)."""
    data_dir: str | None = None
    """Folder holding humaneval/ and mbpp/; default $LRMGYM_SHARED_DATA, else <checkout>/../shared/data."""
    order: Literal["random", "sequential"] = "sequential"
    """Data-set sources: task i is item i mod N ('sequential', for evaluation) or a random item ('random')."""
    tests: Literal["hidden", "original"] = "hidden"
    """HumanEval/MBPP: grade on tests the prompt does not show ('hidden': the data set's tests minus those the
    prompt shows, plus held-out tests generated from the reference solution on new inputs, cached under
    $XDG_CACHE_HOME/lrmgym/code_heldout; the first load of a data set generates them: 46 s for HumanEval, 171 s
    for MBPP on 2 busy cores; tasks left with no hidden test are dropped; see lrmgym/envs/code/heldout.py), or on
    the data set's own tests
    ('original': comparable with published scores, but a lookup table of the tests MBPP's prompt lists earns
    full marks: never for training). Procedural tasks always grade on tests other than the example they show;
    JSONL tasks on their tests as given (keep the tests you grade on out of their prompt)."""
    reward: Literal["fraction", "all_or_nothing"] = "fraction"
    """Reward: the fraction of tests passed, or 1 only when every test passes."""
    answer_format: Literal["fenced", "whole"] = "fenced"
    """Where the code is: the last closed ```python block ('fenced', strict) or the whole answer ('whole')."""
    chat: bool = False
    """Give prompts as chat messages ([{'role': 'user', ...}]) instead of raw text."""
    timeout_s: float = Field(5.0, gt=0, le=120)
    """Wall-clock seconds for one run of a candidate (loading the program and every test); the whole process
    tree is killed at timeout_s + 0.5 s at the latest."""
    memory_mb: int = Field(1024, ge=128, le=65536)
    """Address-space limit (RLIMIT_AS) of the candidate, in MiB."""
    output_bytes: int = Field(1 << 20, ge=1024, le=64 << 20)
    """Most bytes of the candidate's stdout+stderr kept; writing more stops it (status output_limit)."""
    max_turns: int = Field(1, ge=1, le=10)
    """Policy turns per episode; above 1, failing code gets feedback on what failed (see feedback)."""
    sandbox: Literal["auto", "bwrap", "unshare", "process"] = "auto"
    """Isolation: 'auto' (bubblewrap if installed, else the unshare fallback; logs which), 'bwrap',
    'unshare', or 'process' (NO isolation: trusted code and tests only)."""
    warm_sandbox: bool = True
    """With bubblewrap: run each job in fresh namespaces forked from a long-lived server per worker (no
    interpreter start per job; a job sees nothing of the previous ones: lrmgym/envs/code/sandbox.py says what
    exactly). False: one new bubblewrap sandbox per job. Other backends are always one per job."""
    workers: int | None = Field(None, ge=1, le=256)
    """Sandboxes run at once by score_group; default: the number of CPU cores (at most 8)."""
    python: str | None = None
    """Interpreter run inside the sandbox (standard library only); default: this one if the sandbox uid can
    reach it, else /usr/bin/python3."""
    max_code_chars: int = Field(100_000, ge=100, le=10_000_000)
    """Longer extracted code is rejected without being run."""
    procedural_tests: int = Field(5, ge=1, le=50)
    """Procedural source: graded units per task, each joining two asserts with different answers (fewer units when
    the template's answers allow fewer pairs); the example the prompt shows is never graded."""
    feedback_chars: int = Field(2000, ge=100, le=100_000)
    """Multi-turn: most characters of failing-test feedback."""
    feedback: Literal["errors_only", "names", "full"] = "errors_only"
    """Multi-turn: what the feedback on failing code reveals. Every mode gives the verdict ('2/7 tests passed', or
    the program's own top-level exception, a timeout...). 'errors_only': how many tests failed and, per failing
    test, its number and the kind of failure only ('wrong answer' for a failed assert, 'error: ValueError' for a
    builtin exception, 'error: an exception (raised by your code)' for the program's own classes, whose names it
    chooses, 'not run (timeout)'...): never a test's source, assertion message or literals, a stdio case's stdin or
    expected stdout, nor the program's printed output (echoed inputs plus per-test pass/fail made a lookup table
    of the answers). It leaks which test numbers pass, and per test a few bits the program encodes in its choice
    of builtin exception, but never an input with its expected value. 'names': also, per failing test, its
    inputs: the call an 'assert <call> == <expected>' makes, without the expected side
    ('has_close_elements([1.0, 2.8], 0.3)'), else only the names the test calls ('math.fabs, poly'); for stdio,
    the case's stdin. No expected value, though a failing input of a boolean (or few-valued) function implies
    its answer. 'full': the failing tests' source verbatim with their error messages and the program's output:
    LEAKS the expected values (a second turn can be a lookup table of them); for debugging only."""

    @model_validator(mode="after")
    def _check_source(self) -> CodeConfig:
        source = Path(self.source).expanduser()
        if self.source not in _NAMED_SOURCES and source.exists() and not source.is_file():
            kind = "a folder" if source.is_dir() else "not a regular file (a device or pipe such as /dev/null)"
            raise ValueError(f"source {self.source!r} is {kind}; give the path to a JSONL file of code tasks")
        if self.source not in _NAMED_SOURCES and not source.is_file():
            raise ValueError(
                f"source {self.source!r} is neither one of {', '.join(_NAMED_SOURCES)} nor an existing file; "
                "give a named source or the path to a JSONL file of code tasks"
            )
        if self.data_format != "tasks" and self.source in _NAMED_SOURCES:
            raise ValueError(
                f"data_format {self.data_format!r} reads a local file, but source is {self.source!r}; give source the "
                "path of that file"
            )
        if self.source == "humaneval" and self.split != "test":
            raise ValueError(f"source 'humaneval' has only the 'test' split, got split {self.split!r}; set split: test")
        if self.source == "mbpp" and self.split not in ("all", *loaders.MBPP_SPLITS):
            raise ValueError(
                f"unknown MBPP split {self.split!r}; expected one of all, {', '.join(loaders.MBPP_SPLITS)}"
            )
        return self

    def limits(self) -> Limits:
        """The sandbox limits these options describe."""
        return Limits(timeout_s=self.timeout_s, memory_mb=self.memory_mb, output_bytes=self.output_bytes)


_DATA_CACHE: dict[tuple[Any, ...], list[CodeTask]] = {}
_DATA_LOCK = threading.Lock()


def _load_tasks(config: CodeConfig) -> list[CodeTask]:
    base = Path(config.data_dir).expanduser() if config.data_dir else loaders.default_data_dir()
    if config.source == "humaneval":
        path = base / "humaneval" / "HumanEval.jsonl.gz"
    elif config.source == "mbpp":
        path = base / "mbpp" / "mbpp.jsonl"
    else:
        path = Path(config.source).expanduser()
    stat = path.stat() if path.is_file() else None
    held_out = config.tests == "hidden" and config.source in ("humaneval", "mbpp")
    key = (str(path.resolve()), config.split, stat and (stat.st_mtime_ns, stat.st_size), held_out, config.data_format)
    with _DATA_LOCK:
        if key not in _DATA_CACHE:
            if config.source == "humaneval":
                tasks = loaders.load_humaneval(path)
            elif config.source == "mbpp":
                tasks = loaders.mbpp_split(loaders.load_mbpp(path), config.split)
            elif config.data_format == "livecodebench":
                tasks = load_livecodebench(path)
            else:
                tasks = loaders.load_jsonl(path)
            if held_out:
                tasks = heldout.graded_tasks(tasks, lambda: heldout_pool(config))
            _DATA_CACHE[key] = tasks
        return _DATA_CACHE[key]


def heldout_pool(config: CodeConfig) -> SandboxPool:
    """The pool that generates held-out tests: one fresh interpreter per run (``warm=False``).

    So two runs of the reference differ wherever its value depends on the process (the order of a set of strings).
    """
    return SandboxPool(config.sandbox, workers=config.workers, limits=config.limits(), python=config.python, warm=False)


def job_for(task: CodeTask, code: str) -> Job:
    """The sandbox job that runs candidate ``code`` against ``task``'s tests."""
    return Job(
        code=task.program(code),
        units=task.units,
        prelude=task.prelude,
        bind=dict(task.bind),
        cases=task.cases,
        mode="stdio" if task.cases else "call",
    )


class CodeEnv(TextEnv):
    """Python programming tasks graded by running unit tests in a sandbox (HumanEval, MBPP, JSONL, procedural).

    The prompt states the task and the answer format; the code is extracted strictly (``answer_format``),
    run in a fresh isolated process tree (:mod:`lrmgym.envs.code.sandbox`), and graded by a harness the
    candidate cannot forge (:mod:`lrmgym.envs.code.harness`). Reward: the fraction of tests passed, or all
    or nothing. A format failure scores 0 with ``format_ok=False``; a sandbox that fails to start is
    ungradeable (``score=None``). The tests graded are never those the prompt shows (``CodeConfig.tests``,
    :mod:`lrmgym.envs.code.heldout`), so a lookup table of the shown examples or a constant earns nothing. With
    ``max_turns > 1``, failing code gets feedback on what failed (by default only the kind of each failure: never a
    test's input or expected value, nor the program's own output, which could echo the inputs; see
    ``CodeConfig.feedback`` for what each mode leaks).

    Task metadata holds the :class:`~lrmgym.envs.code.loaders.CodeTask` fields (``units``, ``prelude``,
    ``entry_point``, ``solution``...), so a task is self-contained once built.
    """

    Config = CodeConfig

    @classmethod
    def preflight(cls, config: CodeConfig) -> None:
        """Read a JSONL task file when the config is resolved, so that a bad file stops a run before it starts.

        The tasks are cached for the env. HumanEval and MBPP are read only when the env is made.
        """
        if config.source not in _NAMED_SOURCES:
            _load_tasks(config)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config: CodeConfig
        self.max_turns = self.config.max_turns
        self._tasks = None if self.config.source == "procedural" else _load_tasks(self.config)
        self._pool: SandboxPool | None = None
        self._pool_lock = threading.Lock()
        # The latest executions by (task id, code), for feedback(): a dict, not one slot, so that concurrent
        # episodes (OpenRLHF runs a prompt's G samples at once) and a group's G completions each find their own.
        self._results: OrderedDict[tuple[str, str], ExecResult] = OrderedDict()
        self._results_lock = threading.Lock()

    @property
    def num_items(self) -> int | None:
        """How many tasks a data-set source has; ``None`` for the procedural generator."""
        return None if self._tasks is None else len(self._tasks)

    @property
    def pool(self) -> SandboxPool:
        """The sandbox pool, started on first use (that is when ``auto`` logs which isolation it got)."""
        with self._pool_lock:
            if self._pool is None:
                cfg = self.config
                self._pool = SandboxPool(
                    cfg.sandbox, workers=cfg.workers, limits=cfg.limits(), python=cfg.python, warm=cfg.warm_sandbox
                )
            return self._pool

    # ---- tasks
    def make_task(self, index: int, rng: np.random.Generator) -> Task:
        """Procedural task ``index`` from ``rng``, or item ``index`` of the data set (see ``order``)."""
        cfg = self.config
        if self._tasks is None:
            code_task = make_procedural_task(index, rng, cfg.procedural_tests)
        else:
            n = len(self._tasks)
            code_task = self._tasks[index % n if cfg.order == "sequential" else int(rng.integers(n))]
        return self.task_from(code_task, index)

    def task_from(self, code_task: CodeTask, index: int | None = None) -> Task:
        """Wrap a :class:`CodeTask` as a :class:`Task` with this env's prompt format."""
        text = f"{code_task.text.rstrip()}\n\n{INSTRUCTIONS[self.config.answer_format]}"
        if code_task.stub:
            text = (
                "Complete the following Python function. Repeat the whole function (with its imports) in "
                f"your answer.\n\n{code_task.text.rstrip()}\n\n{INSTRUCTIONS[self.config.answer_format]}"
            )
        prompt: Any = [{"role": "user", "content": text}] if self.config.chat else text
        metadata = asdict(code_task)
        metadata.update(index=index, difficulty=None, mode=code_task.mode)
        return Task(id=code_task.id, prompt=prompt, answer=code_task.solution, metadata=metadata)

    @staticmethod
    def code_task(task: Task) -> CodeTask:
        """The :class:`CodeTask` stored in a task built by this env."""
        fields = {k: v for k, v in task.metadata.items() if k in CodeTask.__dataclass_fields__}
        fields["units"] = tuple(fields.get("units", ()))
        fields["cases"] = tuple(fields.get("cases", ()))
        fields["hidden"] = tuple(fields.get("hidden", ()))
        return CodeTask(**fields)

    # ---- grading
    def _prepare(self, task: Task, completion: Completion) -> tuple[Job | None, str, Verdict | None]:
        extraction = extract_code(completion.text, self.config.answer_format, self.config.max_code_chars)
        if not extraction.ok:
            reason = extraction.reason
            verdict = Verdict(
                score=0.0,
                correct=False,
                reason=reason,
                components=(Component(name="format", score=0.0, reason=reason),),
                format_ok=False,
            )
            return None, "", verdict
        assert extraction.code is not None
        return job_for(self.code_task(task), extraction.code), extraction.code, None

    def _verdict(self, task: Task, code: str, result: ExecResult) -> Verdict:
        with self._results_lock:
            self._results[(task.id, code)] = result
            self._results.move_to_end((task.id, code))
            while len(self._results) > _KEPT_RESULTS:
                self._results.popitem(last=False)
        summary = f"{result.passed}/{result.total} tests passed"
        if result.status == "infra":
            return Verdict.ungradeable(
                f"sandbox failure: {result.error[:300]}", parsed=code, latency_s=result.wall_s, format_ok=True
            )
        if result.status != "ok":
            detail = {
                "timeout": f"timeout after {self.config.timeout_s:g} s",
                "output_limit": f"output over {self.config.output_bytes} bytes",
                "error": f"the program raised {result.error[:200]}",
                "crash": "the program died during the tests",
                "killed": "the harness was killed",
                "protocol": "the program sent malformed data",
            }.get(result.status, result.status)
            summary = f"{detail} ({summary})"
        fraction = result.fraction
        score = fraction if self.config.reward == "fraction" else float(result.all_passed)
        component = Component(name="tests", score=fraction, latency_s=result.wall_s, reason=result.status)
        return Verdict(
            score=score,
            correct=result.all_passed,
            parsed=code,
            reason=summary,
            components=(component,),
            latency_s=result.wall_s,
            format_ok=True,
        )

    def verify(self, task: Task, completion: Completion) -> Verdict:
        """Extract the code, run it against the task's tests in the sandbox, score the outcome."""
        job, code, failed = self._prepare(task, Completion.coerce(completion))
        if failed is not None:
            return failed
        assert job is not None
        return self._verdict(task, code, self.pool.run(job))

    def score_group(self, task: Task, completions: Sequence[Completion | str]) -> list[Verdict]:
        """Grade G completions of one task, running their sandboxes concurrently on the pool."""
        prepared = [self._prepare(task, Completion.coerce(c)) for c in completions]
        futures = {i: self.pool.submit(job) for i, (job, _, _) in enumerate(prepared) if job is not None}
        verdicts = []
        for i, (_, code, failed) in enumerate(prepared):
            verdicts.append(failed if failed is not None else self._verdict(task, code, futures[i].result()))
        return verdicts

    async def averify(self, task: Task, completion: Completion | str) -> Verdict:
        """Async :meth:`verify`: awaits the sandbox without blocking the caller's event loop."""
        job, code, failed = self._prepare(task, Completion.coerce(completion))
        if failed is not None:
            return failed
        assert job is not None
        return self._verdict(task, code, await self.pool.arun(job))

    async def ascore_group(self, task: Task, completions: Sequence[Completion | str]) -> list[Verdict]:
        """Async :meth:`score_group`."""
        return list(await asyncio.gather(*(self.averify(task, c) for c in completions)))

    def feedback(self, task: Task, completion: Completion, verdict: Verdict, turn: int) -> str | None:
        """What failed (or the format problem), as much as the ``feedback`` option reveals; ``None`` if ungradeable.

        The per-test lines come from the execution of this code on this task, while it is among the latest 256.
        """
        if verdict.score is None:
            return None
        if verdict.format_ok is False:
            return f"Your answer could not be used ({verdict.reason}). {INSTRUCTIONS[self.config.answer_format]}"
        mode = self.config.feedback
        lines = [f"Your code did not pass all tests: {verdict.reason}."]
        with self._results_lock:
            result = self._results.get((task.id, verdict.parsed))  # type: ignore[arg-type]
        if result is not None:
            units = [u for u in task.metadata.get("units", ()) if u["test"]] or list(task.metadata.get("cases", ()))
            failed = [(i, u, m) for i, (u, (ok, m)) in enumerate(zip(units, result.results, strict=False)) if not ok]
            if mode != "full" and failed:
                lines.append(f"{len(failed)} of {len(result.results)} tests failed:")
            bind = task.metadata.get("bind") or {}
            trusted = loaders.defined_names(task.metadata.get("prelude") or "") if mode == "names" else set()
            for i, unit, message in failed:
                if mode == "full":
                    shown = unit["src"] if "src" in unit else f"stdin: {unit['stdin']!r}"
                    lines.append(f"Failed: {shown}\n  -> {message or 'failed'}")
                    continue
                line = f"Test {i + 1}: {loaders.failure_kind(message)}"
                if mode == "names":
                    if "src" in unit:
                        checked, called = loaders.unit_inputs(unit["src"], bind, trusted)
                        if checked:
                            line += ("; tested call: " if len(checked) == 1 else "; tested calls: ") + ", ".join(
                                checked
                            )
                        elif called:
                            line += "; names called: " + ", ".join(called)
                    else:
                        line += f"; stdin: {loaders.shorten(repr(unit['stdin']))}"
                lines.append(line)
            if mode == "full" and result.output.strip():
                # Not in the other modes: the program's own output may echo the inputs it was given, in the
                # order of the tests, and with the per-test verdicts that is a lookup table of the answers.
                lines.append("Program output:\n" + result.output.strip())
        lines.append("Fix the code and answer again. " + INSTRUCTIONS[self.config.answer_format])
        text = "\n".join(lines)
        limit = self.config.feedback_chars
        return text if len(text) <= limit else text[: limit - 20] + "\n...(truncated)"

    def describe(self) -> dict[str, Any]:
        """The base description plus the sandbox's isolation (once the pool has started)."""
        out = super().describe()
        out["sandbox"] = self._pool.describe() if self._pool is not None else f"{self.config.sandbox} (not started)"
        return out

    def close(self) -> None:
        """Stop the sandbox pool (killing anything still running)."""
        with self._pool_lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None
        super().close()
