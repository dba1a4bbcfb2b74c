r"""Tool use for any text env: Hermes/Qwen-style tool calls, a sandboxed ``python`` tool, and the env wrapper.

The policy calls a tool by writing, anywhere in its turn (inside its reasoning is fine)::

    <tool_call>
    {"name": "python", "arguments": {"code": "print(12 * 34)"}}
    </tool_call>

and ending the turn there (sample with the stop string ``</tool_call>``; chat models trained on this format end
the turn by themselves). The env runs the tool and its result comes back as the next env turn::

    <tool_response>
    408
    </tool_response>

This is the format of the Hermes function-calling models and of the Qwen2.5 / Qwen3 chat templates, whose ``tool``
role renders as a ``user`` turn holding ``<tool_response>\n...\n</tool_response>``: lrmgym's episodes send env turns
as ``user`` messages, so with those templates the tokens the policy sees are the ones the ``tool`` role would give
(:mod:`lrmgym.episodes` keeps them token-exact and masked out of the loss).

Rules (one place, for every tool env):

- **A turn with a tool call is not an answer.** It scores 0 (``reason="tool call"``, ``correct=False``), so the
  episode goes on: the env runs the call and replies. Whatever else the turn holds (an answer before or after the
  call, a call inside the answer tags) is not graded. Only a turn without ``<tool_call>`` is graded, by the wrapped
  env's own verifier, on that turn's text alone: never on the tool's output, which is env text.
- **One call per turn.** The first call of a turn runs; further calls in it are reported as not run.
- **A cap:** ``max_tool_calls`` per episode (the env's ``max_turns`` is that plus one, the answer's turn). A call
  past the cap is not run and the episode ends with that turn's 0.
- **Malformed calls** (not JSON, no ``name``, an unknown tool, bad arguments, an unclosed tag) get an error turn
  that says what was wrong and shows the expected form; they count against the cap.
- **Bounded output:** the tool's output is cut to ``max_output_chars`` (head and tail kept, the cut said), and
  tags that would change how a transcript reads (``<tool_call>``, ``<tool_response>``, ``<think>``, ``<answer>``
  and their closings) are defused (``<`` written ``&lt;``) so tool output can never pose as a turn, a call or an
  answer.

The ``python`` tool (:class:`PythonTool`) runs each call's code in a fresh process of the code env's sandbox
(:mod:`lrmgym.envs.code.sandbox`: bubblewrap or the unshare fallback, its own unprivileged uid, no network, a
cleared environment, rlimits on memory, CPU, processes and file size, a wall-clock kill from this side, an output
cap). The job it sends holds the call's code and nothing else: no task, no gold answer, no grading data, so no
environment variable, file, ``/proc`` entry or frame of the tool process can hold them. Nothing persists between
calls (each is a new interpreter with an empty ``/tmp``).

Wrapping another env (the pattern ``env=math_tool`` follows)::

    class MyToolConfig(MyConfig, ToolOptions):      # the inner env's options plus the tool options
        model_config = ConfigDict(extra="forbid")

    class MyToolEnv(ToolUseEnv):
        Config = MyToolConfig

        def build_inner(self) -> TextEnv:            # the env whose verifier grades the final answer
            return MyEnv(**self.config.inner_options())

        def build_tools(self) -> dict[str, Tool]:   # the tools, by the name the policy calls
            return {"python": self.config.python_tool()}

    lrmgym.register("MyTool-v0", "my_package.envs:MyToolEnv")

The inner env makes the tasks (the tool instructions are added to their prompts) and grades every turn that has
no tool call; this class does the rest (``tests/envs/math_tool/test_math_tool.py`` wraps the echo env this way).
Keep the tools away from the grading data: pass the folders of a data set the inner env reads as
``python_tool(hide=...)`` (the unshare fallback shows host folders it does not cover; see
:func:`lrmgym.envs.math_tool.env.data_folders`).

Sampling: with ``lrmgym run``, set ``learner.stop=[</tool_call>]`` so that a call ends its turn (a chat model
trained on this format ends it with its end-of-turn token anyway); text after the call in the same turn is not
graded either way.

Trainers:

- **lrmgym's learners** run tool episodes like any multi-turn env (:mod:`lrmgym.episodes`): the tool response is an
  env turn, its tokens are the policy's own encoding of it, masked out of the loss.
- **OpenRLHF** (``lrmgym export openrlhf env=math_tool``): the env is multi-turn, so the export writes
  ``agent_func.py``, whose ``step`` grades each turn and returns the tool's response as the environment feedback
  (OpenRLHF keeps it out of the action mask). OpenRLHF's sampler takes no stop strings: the model must end its turn
  after the call (Hermes/Qwen chat models do).
- **verl** is refused (``lrmgym export verl``): its ``ToolAgentLoop`` (``multi_turn.tool_config_path``, a
  ``BaseTool`` per tool, ``max_user_turns`` as the cap) could run this tool, but its reward function is handed the
  whole decoded response, tool responses included and with no turn boundaries, so it cannot grade only the turn
  without a call: a tool that prints an answer block would be paid as the policy's answer.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from lrmgym.core import Completion, Prompt, Task, TextEnv, Verdict

__all__ = [
    "CALL_CLOSE",
    "CALL_OPEN",
    "PythonTool",
    "Tool",
    "ToolCall",
    "ToolOptions",
    "ToolResult",
    "ToolUseEnv",
    "defuse",
    "has_tool_call",
    "parse_tool_call",
    "tool_instructions",
    "tool_response",
    "truncate_middle",
]

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
TOOL_CALL_REASON = "tool call"
"""The reason of a tool-call turn's verdict (it scores 0 and the episode goes on)."""

_KEPT = 256
"""Tool runs kept between grading (which starts them) and feedback (which reads them); each holds at most the
tool's output cap."""
_DEFUSED_TAGS = re.compile(r"<(/?\s*(?:tool_call|tool_response|think|answer)\b)", re.IGNORECASE)


# --------------------------------------------------------------------------------------------------- parsing
@dataclass(frozen=True)
class ToolCall:
    """The first tool call of a turn, parsed or not.

    Attributes:
        name: The tool named (``""`` when the call could not be parsed that far).
        arguments: The call's arguments (``None`` when not parsed).
        error: Why the call is malformed (``""`` for a well-formed call): the error turn's text.
        extra_calls: How many further calls the turn made (not run: one call per turn).
    """

    name: str = ""
    arguments: Mapping[str, Any] | None = None
    error: str = ""
    extra_calls: int = 0

    @property
    def ok(self) -> bool:
        """Whether the call is well formed (its tool and arguments still have to be checked)."""
        return not self.error


def has_tool_call(text: str) -> bool:
    """Whether ``text`` opens a tool call (closed or not): such a turn is never graded as an answer."""
    return CALL_OPEN in text


def parse_tool_call(text: str, example: str = "") -> ToolCall | None:
    """The first tool call of ``text``; ``None`` when it has none.

    The call's body must be one JSON object ``{"name": str, "arguments": {...}}`` (whitespace around it allowed).

    Args:
        text: The policy's turn.
        example: A well-formed call, shown in error messages.
    """
    start = text.find(CALL_OPEN)
    if start < 0:
        return None
    hint = f" Expected {example}" if example else ""
    body_start = start + len(CALL_OPEN)
    end = text.find(CALL_CLOSE, body_start)
    extra = text.count(CALL_OPEN) - 1
    if end < 0:
        return ToolCall(error=f"the {CALL_OPEN} is not closed by {CALL_CLOSE}.{hint}", extra_calls=extra)
    body = text[body_start:end].strip()
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as err:
        reason = str(err).split(":")[0] if isinstance(err, ValueError) else "nested too deeply"
        return ToolCall(error=f"the tool call is not valid JSON ({reason}).{hint}", extra_calls=extra)
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return ToolCall(error=f'the tool call must be a JSON object with a string "name".{hint}', extra_calls=extra)
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string, as OpenAI's API does
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            pass
    if not isinstance(arguments, dict):
        return ToolCall(name=value["name"], error=f'"arguments" must be a JSON object.{hint}', extra_calls=extra)
    unknown = sorted(set(value) - {"name", "arguments"})
    if unknown:
        return ToolCall(
            name=value["name"],
            error=f"the tool call has unknown key(s) {', '.join(map(repr, unknown))}; it takes name and arguments."
            f"{hint}",
            extra_calls=extra,
        )
    return ToolCall(name=value["name"], arguments=arguments, extra_calls=extra)


# --------------------------------------------------------------------------------------------------- output
def truncate_middle(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters: its head and tail, with how much was left out between them."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    dropped = len(text) - head - tail
    return f"{text[:head]}\n...({dropped} characters cut)...\n{text[len(text) - tail :] if tail else ''}"


def defuse(text: str) -> str:
    """``text`` with turn, call and answer tags written with ``&lt;``, so tool output cannot pose as any of them."""
    return _DEFUSED_TAGS.sub(r"&lt;\1", text)


def tool_response(text: str, chat: bool) -> str:
    r"""The env turn that carries a tool's result (already bounded and defused).

    Chat prompts: the content of the next message (``<tool_response>\n...\n</tool_response>``, what the Qwen
    templates render for the ``tool`` role). Text prompts: the same block on lines of its own, so the transcript
    reads ``...</tool_call>\n<tool_response>\n...\n</tool_response>\n`` and the policy continues after it.
    """
    block = f"{RESPONSE_OPEN}\n{text}\n{RESPONSE_CLOSE}"
    return block if chat else f"\n{block}\n"


# --------------------------------------------------------------------------------------------------- tools
@dataclass(frozen=True)
class ToolResult:
    """What one tool call gave back.

    Attributes:
        text: The text for the policy (before truncation and defusing, which the env applies).
        status: ``ok``, ``error`` (the call or its code failed), ``timeout``, ``output_limit``, ``rejected`` (not run:
            malformed, unknown tool, over the cap) or ``infra`` (the tool could not run: not the policy's fault).
    """

    text: str
    status: str = "ok"


class Tool(Protocol):
    """A tool the policy can call: a name, a JSON schema for the prompt, an example call, and ``submit``."""

    name: str

    def schema(self) -> dict[str, Any]:
        """The OpenAI/Hermes function schema: ``{"type": "function", "function": {name, description, parameters}}``."""
        ...

    def example(self) -> str:
        """A well-formed call of this tool, for the instructions and error turns."""
        ...

    def submit(self, arguments: Mapping[str, Any]) -> concurrent.futures.Future[ToolResult]:
        """Start the call; never raises for the policy's arguments (a bad one gives a ``rejected`` result)."""
        ...

    def close(self) -> None:
        """Release what the tool holds (its sandbox pool)."""
        ...


def _done(result: ToolResult) -> concurrent.futures.Future[ToolResult]:
    future: concurrent.futures.Future[ToolResult] = concurrent.futures.Future()
    future.set_result(result)
    return future


class PythonTool:
    """Runs the call's Python code in the code env's sandbox and returns what it printed.

    Args:
        limits: The sandbox bounds of one call (wall clock, memory, output bytes, processes, file size).
        sandbox: The isolation backend (``auto``: bubblewrap, else the unshare fallback; see
            :class:`~lrmgym.envs.code.sandbox.SandboxPool`).
        workers: Calls run at once.
        max_code_chars: Longer code is rejected without being run.
        python: The interpreter inside the sandbox (standard library only); ``None``: the pool's choice.
        hide: Host folders the unshare fallback must also cover (the task's data set: it holds the gold answers).
    """

    name = "python"

    def __init__(
        self,
        limits: Any = None,
        sandbox: str = "auto",
        workers: int | None = None,
        max_code_chars: int = 20_000,
        python: str | None = None,
        hide: Sequence[str] = (),
    ) -> None:
        from lrmgym.envs.code.sandbox import Limits

        self.limits = limits or Limits(timeout_s=5.0, memory_mb=512, output_bytes=1 << 16, tmpfs_mb=16)
        self.sandbox, self.workers, self.python = sandbox, workers, python
        self.max_code_chars = max_code_chars
        self.hide = tuple(hide)
        self._pool: Any = None
        self._lock = threading.Lock()

    @property
    def pool(self) -> Any:
        """The sandbox pool, started on first use (that is when ``auto`` logs which isolation it got)."""
        from lrmgym.envs.code.sandbox import SandboxPool

        with self._lock:
            if self._pool is None:
                self._pool = SandboxPool(
                    self.sandbox, workers=self.workers, limits=self.limits, python=self.python, hide=self.hide
                )
            return self._pool

    def schema(self) -> dict[str, Any]:
        """The function schema of the ``python`` tool."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": "Run Python 3 code (standard library only) in a fresh process and return what it "
                "printed to stdout and stderr. No files or network; state does not carry over between calls.",
                "parameters": {
                    "type": "object",
                    "properties": {"code": {"type": "string", "description": "The program; print() what you need."}},
                    "required": ["code"],
                },
            },
        }

    def example(self) -> str:
        """``<tool_call>{"name": "python", "arguments": {"code": "print(12 * 34)"}}</tool_call>``."""
        return f'{CALL_OPEN}{{"name": "python", "arguments": {{"code": "print(12 * 34)"}}}}{CALL_CLOSE}'

    def submit(self, arguments: Mapping[str, Any]) -> concurrent.futures.Future[ToolResult]:
        """Check the arguments and start the run on the pool."""
        from lrmgym.envs.code.sandbox import Job

        unknown = sorted(set(arguments) - {"code"})
        code = arguments.get("code")
        if unknown or not isinstance(code, str):
            what = f"unknown argument(s) {', '.join(map(repr, unknown))}" if unknown else 'no string argument "code"'
            return _done(ToolResult(f'error: {what}; python takes {{"code": "..."}}. {self.example()}', "rejected"))
        if len(code) > self.max_code_chars:
            return _done(ToolResult(f"error: the code has {len(code)} characters, more than {self.max_code_chars}.",
                                    "rejected"))  # fmt: skip
        outer: concurrent.futures.Future[ToolResult] = concurrent.futures.Future()
        try:
            inner = self.pool.submit(Job(code=code))
        except Exception as err:  # noqa: BLE001 - the sandbox could not start: ours, not the policy's
            return _done(ToolResult(f"error: the python tool could not run ({type(err).__name__}).", "infra"))

        def finish(f: concurrent.futures.Future) -> None:
            try:
                outer.set_result(self._result(f.result()))
            except Exception as err:  # noqa: BLE001 - a pool failure becomes a result, never an exception
                outer.set_result(ToolResult(f"error: the python tool failed ({type(err).__name__}).", "infra"))

        inner.add_done_callback(finish)
        return outer

    def _result(self, run: Any) -> ToolResult:
        """The policy's view of one sandbox run: its output, then what stopped it."""
        out = run.output
        timeout = self.limits.timeout_s
        if run.status == "ok":
            return ToolResult(out if out.strip() else "(no output: print() the values you need)", "ok")
        if run.status == "error":
            return ToolResult(f"{out}{'' if not out or out.endswith(chr(10)) else chr(10)}{run.error}".strip(), "error")
        if run.status in ("timeout", "killed"):
            return ToolResult(f"{out}\nerror: the code ran past the {timeout:g} s limit and was stopped.".strip(),
                              "timeout")  # fmt: skip
        if run.status == "output_limit":
            cap = self.limits.output_bytes
            return ToolResult(f"{out}\nerror: the output passed {cap} bytes; the code was stopped.", "output_limit")
        if run.status == "infra":
            return ToolResult("error: the python tool could not run (not your code's fault).", "infra")
        return ToolResult(f"{out}\nerror: the code crashed ({run.status}).".strip(), "error")

    def close(self) -> None:
        """Stop the sandbox pool."""
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None


# --------------------------------------------------------------------------------------------------- options
class ToolOptions(BaseModel):
    """The tool-use options every tool env takes (mixed into its config)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    max_tool_calls: int = Field(2, ge=0, le=20)
    """Tool calls allowed per episode; the episode has max_tool_calls + 1 policy turns. A call past the cap is not
    run and the episode ends with 0."""
    tool_timeout_s: float = Field(5.0, gt=0, le=60)
    """Wall-clock seconds of one tool call (the process tree is killed at the limit)."""
    tool_memory_mb: int = Field(512, ge=128, le=16384)
    """Address-space limit (RLIMIT_AS) of one tool call, in MiB."""
    tool_output_bytes: int = Field(1 << 16, ge=1024, le=1 << 24)
    """Most bytes a tool call may print; printing more stops it (status output_limit)."""
    max_output_chars: int = Field(2000, ge=100, le=100_000)
    """Most characters of a tool's output shown to the policy (head and tail; the cut is said)."""
    max_code_chars: int = Field(20_000, ge=100, le=1_000_000)
    """Longer code in a python call is rejected without being run."""
    sandbox: Literal["auto", "bwrap", "unshare", "process"] = "auto"
    """Isolation of tool calls: 'auto' (bubblewrap, else the unshare fallback; logged), 'bwrap', 'unshare', or
    'process' (NO isolation: trusted code and tests only)."""
    tool_workers: int | None = Field(None, ge=1, le=64)
    """Tool calls run at once; default: the number of CPU cores (at most 8)."""

    def inner_options(self) -> dict[str, Any]:
        """The options of the wrapped env: every field of a config that mixes these in, except these."""
        return {k: v for k, v in self.model_dump().items() if k not in ToolOptions.model_fields}

    def tool_limits(self) -> Any:
        """The sandbox limits of one call."""
        from lrmgym.envs.code.sandbox import Limits

        return Limits(
            timeout_s=self.tool_timeout_s, memory_mb=self.tool_memory_mb, output_bytes=self.tool_output_bytes,
            tmpfs_mb=16,
        )  # fmt: skip

    def python_tool(self, hide: Sequence[str] = ()) -> PythonTool:
        """The ``python`` tool these options describe; ``hide``: data folders the sandbox must not show."""
        return PythonTool(self.tool_limits(), self.sandbox, self.tool_workers, self.max_code_chars, hide=hide)


def tool_instructions(tools: Mapping[str, Tool], max_calls: int, timeout_s: float) -> str:
    """What the prompt says about the tools: how to call them, what comes back, the cap; Hermes/Qwen wording."""
    example = next(iter(tools.values())).example()
    schemas = "\n".join(json.dumps(t.schema(), sort_keys=True) for t in tools.values())
    return (
        "# Tools\n\nYou may call a tool to help you. The tools are described inside <tools></tools>:\n"
        f"<tools>\n{schemas}\n</tools>\n\n"
        "To call one, write a JSON object with the tool's name and arguments inside <tool_call></tool_call> tags, "
        f"then stop and wait for the result, for example:\n{example}\n"
        "The result comes back inside <tool_response></tool_response> tags. Python calls run in a fresh process "
        f"(standard library only, no files, no network, {timeout_s:g} s each). You may make at most {max_calls} "
        "call(s), one per turn. Give your final answer in a turn without a tool call, in the format the problem "
        "asks for; text in a turn with a tool call is not graded."
    )


# --------------------------------------------------------------------------------------------------- the env
class ToolUseEnv(TextEnv):
    """An env whose policy may call tools before its final answer; the inner env makes the tasks and grades.

    Subclasses set ``Config`` (a model with :class:`ToolOptions`' fields) and implement :meth:`build_inner` and
    :meth:`build_tools`. See the module docstring for the rules.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.inner: TextEnv = self.build_inner()
        self.tools: dict[str, Tool] = self.build_tools()
        if not self.tools:
            raise ValueError(f"{type(self).__name__}.build_tools() returned no tool; a tool env needs one.")
        self.max_tool_calls: int = self.config.max_tool_calls
        self.max_turns = self.max_tool_calls + 1
        self._runs: OrderedDict[tuple[str, str], concurrent.futures.Future[ToolResult]] = OrderedDict()
        self._runs_lock = threading.Lock()

    # ---- to implement
    def build_inner(self) -> TextEnv:
        """The env that makes the tasks and grades every turn without a tool call."""
        raise NotImplementedError(f"{type(self).__name__} must implement build_inner().")

    def build_tools(self) -> dict[str, Tool]:
        """The tools by the name the policy calls them."""
        raise NotImplementedError(f"{type(self).__name__} must implement build_tools().")

    # ---- tasks
    @property
    def compact(self) -> bool:
        """Whether the inner env writes compact prompts (``Q:... A:``, for the tiny model): they get no instructions.

        A small model trained on those prompts cannot read instructions, and a preamble pushes its prompt off the
        distribution it knows (measured: the tiny model answered none of 48 such prompts right); the tools still
        answer a call it writes.
        """
        return getattr(self.inner.config, "style", None) == "compact"

    def with_tools(self, task: Task) -> Task:
        """``task`` with the tool instructions in its prompt: a system message (chat) or a preamble (text).

        Compact prompts stay as they are (see :attr:`compact`).
        """
        prompt: Prompt = task.prompt
        if not self.compact:
            text = tool_instructions(self.tools, self.max_tool_calls, self.config.tool_timeout_s)
            if isinstance(prompt, list):
                prompt = [{"role": "system", "content": text}, *prompt]
            else:
                prompt = f"{text}\n\n{prompt}"
        metadata = dict(task.metadata, tools=sorted(self.tools), max_tool_calls=self.max_tool_calls)
        return replace(task, id=f"tool/{task.id}", prompt=prompt, metadata=metadata)

    def make_task(self, index: int, rng: np.random.Generator) -> Task:
        """The inner env's task ``index``, with the tool instructions in its prompt."""
        return self.with_tools(self.inner.make_task(index, rng))

    # ---- grading
    def _tool_verdict(self, task: Task, completion: Completion) -> Verdict:
        """A tool-call turn: 0, not correct (so the episode goes on), and its run started."""
        self._start(task, completion.text)
        return Verdict(score=0.0, correct=False, reason=TOOL_CALL_REASON, format_ok=None)

    def verify(self, task: Task, completion: Completion) -> Verdict:
        """A tool-call turn scores 0 (its call starts running); any other turn is graded by the inner env."""
        completion = Completion.coerce(completion)
        if has_tool_call(completion.text):
            return self._tool_verdict(task, completion)
        return self.inner.verify(task, completion)

    def score_group(self, task: Task, completions: Sequence[Completion | str]) -> list[Verdict]:
        """Tool-call turns start their calls (they run at once on the pool); the others go to the inner env."""
        completions = [Completion.coerce(c) for c in completions]
        out: list[Verdict | None] = [None] * len(completions)
        answers = []
        for i, c in enumerate(completions):
            if has_tool_call(c.text):
                out[i] = self._tool_verdict(task, c)
            else:
                answers.append(i)
        if answers:
            graded = self.inner.score_group(task, [completions[i] for i in answers])
            for i, v in zip(answers, graded, strict=True):
                out[i] = v
        return [v for v in out if v is not None]

    # ---- tool runs
    def _call(self, text: str) -> tuple[Tool | None, Mapping[str, Any] | str]:
        """The tool a turn calls and its arguments, or ``None`` and the error turn's text."""
        example = next(iter(self.tools.values())).example()
        call = parse_tool_call(text, example)
        if call is None:  # not reached: callers check has_tool_call first
            return None, "error: no tool call found."
        if not call.ok:
            return None, f"error: {call.error}"
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(map(repr, sorted(self.tools)))
            return None, f"error: there is no tool {call.name!r}; the tools are {known}. {example}"
        return tool, call.arguments or {}

    def _start(self, task: Task, text: str) -> concurrent.futures.Future[ToolResult]:
        """Start (or find) the run of the tool call in ``text`` for ``task``."""
        key = (task.id, text)
        with self._runs_lock:
            if key in self._runs:
                self._runs.move_to_end(key)
                return self._runs[key]
        tool, arguments = self._call(text)
        if tool is None:
            future = _done(ToolResult(str(arguments), "rejected"))
        else:
            future = tool.submit(arguments)  # type: ignore[arg-type]
        with self._runs_lock:
            self._runs[key] = future
            while len(self._runs) > _KEPT:
                self._runs.popitem(last=False)
        return future

    def run_tool(self, task: Task, text: str) -> ToolResult:
        """The result of the tool call in ``text`` (started by grading, else now), waited for.

        Runs are kept by ``(task id, turn text)`` (the latest ``_KEPT``), so the G identical calls of a group run once.
        """
        return self._start(task, text).result()

    def feedback(self, task: Task, completion: Completion, verdict: Verdict, turn: int) -> str | None:
        """The tool's result after a tool-call turn within the cap; ``None`` (the end) after anything else."""
        text = Completion.coerce(completion).text
        if not has_tool_call(text) or turn > self.max_tool_calls:
            return None
        result = self.run_tool(task, text)
        shown = result.text.rstrip()
        call = parse_tool_call(text)
        if call is not None and call.extra_calls:
            shown += f"\n(note: {call.extra_calls} more tool call(s) in that turn were not run: one call per turn)"
        shown = defuse(truncate_middle(shown, self.config.max_output_chars))
        left = self.max_tool_calls - turn
        if left == 0:
            shown += "\n(no tool calls left: answer now)"
        return tool_response(shown, chat=isinstance(task.prompt, list))

    # ---- lifecycle
    def describe(self) -> dict[str, Any]:
        """The base description plus the tools and the wrapped env."""
        out = super().describe()
        out["tools"] = sorted(self.tools)
        out["inner"] = f"{type(self.inner).__module__}.{type(self.inner).__qualname__}"
        return out

    def close(self) -> None:
        """Close the tools and the inner env."""
        for tool in self.tools.values():
            tool.close()
        close: Callable[[], None] | None = getattr(self.inner, "close", None)
        if callable(close):
            close()
