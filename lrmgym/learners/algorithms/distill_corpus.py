"""The self-distillation corpus: the RL stage's trace records, and the corpus built from them.

:class:`Trace` is one shortest correct trajectory as the RL stage records it (:func:`write_traces`,
:func:`read_traces`: JSONL). :func:`build_corpus` keeps the shortest per task and, with a pruner, offers each to
it once; a pruned text is untrusted model output, accepted only when strictly shorter and still verified.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lrmgym.core import Completion, Prompt, learner_env
from lrmgym.files import atomic_write_text
from lrmgym.learners.algorithms.distill_config import SDConfig
from lrmgym.learners.algorithms.sft import with_eos

__all__ = ["Corpus", "CorpusReport", "Trace", "build_corpus", "read_traces", "write_traces"]

Corpus = list[tuple[list[int], list[int]]]
"""The SD training set: (prompt token ids, target token ids ending in EOS), one per task."""


# --------------------------------------------------------------------------------------------------- traces
@dataclass(frozen=True)
class Trace:
    """One shortest correct trajectory of a training task, as the RL stage records it.

    Attributes:
        task_id: The task's id (``Task.id``); the corpus keeps one trace per id.
        position: The task's index in its training stream.
        stream_seed: The stream's seed: ``env.task_at(position, seed=stream_seed)`` rebuilds the task.
        prompt_token_ids: The prompt as the policy encoded it (what SD trains on).
        token_ids: The sampled completion's ids, EOS included when it was sampled.
        text: The completion's decoded text (what a pruner reads).
        tokens: The completion's length, ``len(token_ids)``.
    """

    task_id: str
    position: int
    stream_seed: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    tokens: int

    def __post_init__(self) -> None:
        if self.tokens != len(self.token_ids):
            raise ValueError(
                f"Trace {self.task_id!r}: tokens={self.tokens} but token_ids has {len(self.token_ids)}; "
                "tokens must be len(token_ids)."
            )

    def to_json(self) -> str:
        """One JSON line (no newline)."""
        return json.dumps(dataclasses.asdict(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> Trace:
        """Parse :meth:`to_json`'s output; raises ``ValueError`` naming what is wrong."""
        try:
            data = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"not JSON ({err})") from None
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, got {type(data).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        missing, extra = [n for n in names if n not in data], sorted(set(data) - set(names))
        if missing or extra:
            raise ValueError(f"expected the keys {', '.join(names)}; missing: {missing}, unknown: {extra}")
        for name in ("position", "stream_seed", "tokens"):
            if not _is_int(data[name]):
                raise ValueError(f"{name} must be an integer, got {data[name]!r:.40}")
        for name in ("prompt_token_ids", "token_ids"):
            if not isinstance(data[name], list) or not all(_is_int(t) for t in data[name]):
                raise ValueError(f"{name} must be a list of integers")
        for name in ("task_id", "text"):
            if not isinstance(data[name], str):
                raise ValueError(f"{name} must be a string, got {type(data[name]).__name__}")
        return cls(**data)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def write_traces(path: str | Path, traces: Iterable[Trace]) -> None:
    """Write ``traces`` to ``path`` as JSONL, atomically (a crash leaves the old file or the new one)."""
    atomic_write_text(path, "".join(t.to_json() + "\n" for t in traces))


def read_traces(path: str | Path) -> list[Trace]:
    """The traces :func:`write_traces` wrote (blank lines skipped).

    Raises:
        ValueError: A line is not a trace; the message names the file and the line.
    """
    traces = []
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                traces.append(Trace.from_json(line))
            except ValueError as err:
                raise ValueError(
                    f"{path}, line {number}: not a trace: {err}. The file is written by "
                    "lrmgym.learners.algorithms.distill_corpus.write_traces; was it cut short or edited?"
                ) from None
    return traces


# --------------------------------------------------------------------------------------------------- corpus
@dataclass(frozen=True)
class CorpusReport:
    """What :func:`build_corpus` did.

    Attributes:
        traces: Traces given.
        kept: Corpus entries: tasks with a trace (the shortest of each).
        pruned_accepted: Entries whose pruned text replaced the original.
        pruned_rejected: Entries offered to the pruner that kept the original.
        rejected: Why, counted: ``error`` (the pruner request raised or returned no reply), ``truncated`` (the
            reply hit its token budget), ``empty``, ``unencodable`` (the tokenizer refuses the text),
            ``special_tokens`` (the text encodes to a special token such as EOS), ``not_shorter``, ``format``
            (the env's format check failed), ``ungradeable`` (the env could not grade it), ``wrong`` (not
            correct).
        mean_tokens_before: Mean target length of the entries before pruning (tokens, EOS included).
        mean_tokens_after: Mean target length trained on.
        first_error: The first pruner error, ``"Type: message"``, or ``None``.
    """

    traces: int
    kept: int
    pruned_accepted: int = 0
    pruned_rejected: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    mean_tokens_before: float = 0.0
    mean_tokens_after: float = 0.0
    first_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return dataclasses.asdict(self)


def build_corpus(
    traces: Sequence[Trace], env: Any, tokenizer: Any, cfg: SDConfig, pruner: Any = None
) -> tuple[Corpus, CorpusReport]:
    """The SD corpus: per task id the shortest trace (ties: the first seen), pruned where that is accepted.

    Args:
        traces: The RL stage's correct traces.
        env: The training env (judges included): rebuilds each task (``task_at``) and grades pruned texts
            (``score_group``). Only used with a pruner.
        tokenizer: The trained model's tokenizer (``eos_token_id``; encodes pruned texts).
        cfg: The stage's options (``min_traces``, the ``prune_*`` options).
        pruner: A policy (``generate``) asked once per entry with :attr:`SDConfig.prune_prompt`, greedily;
            ``None``: no pruning (see :func:`pruner_for`).

    Returns:
        The corpus, in the order tasks were first seen, and the report.

    Raises:
        ValueError: Fewer than ``cfg.min_traces`` tasks have a trace, or a rebuilt task's id differs from its
            trace's (the env is not the one the traces were recorded in).
    """
    shortest: dict[str, Trace] = {}
    for trace in traces:
        best = shortest.get(trace.task_id)
        if best is None or trace.tokens < best.tokens:
            shortest[trace.task_id] = trace
    if len(shortest) < cfg.min_traces:
        raise ValueError(
            f"Self-distillation needs correct traces of at least min_traces={cfg.min_traces} tasks, got "
            f"{len(shortest)} (from {len(traces)} traces). Train RL-1 longer or on easier tasks so that more "
            "tasks are solved, or lower min_traces."
        )
    eos = int(tokenizer.eos_token_id)
    entries = list(shortest.values())
    before = [with_eos(t.token_ids, eos) for t in entries]
    after, rejected, first_error = list(before), Counter[str](), None
    if pruner is not None:
        after, rejected, first_error = _prune(entries, before, learner_env(env), tokenizer, cfg, pruner)
    accepted = sum(a is not b for a, b in zip(after, before, strict=True))
    corpus = [(list(t.prompt_token_ids), target) for t, target in zip(entries, after, strict=True)]
    report = CorpusReport(
        traces=len(traces), kept=len(corpus), pruned_accepted=accepted,
        pruned_rejected=len(corpus) - accepted if pruner is not None else 0, rejected=dict(sorted(rejected.items())),
        mean_tokens_before=sum(map(len, before)) / len(before), mean_tokens_after=sum(map(len, after)) / len(after),
        first_error=first_error,
    )  # fmt: skip
    return corpus, report


def _prune(
    entries: list[Trace], targets: list[list[int]], env: Any, tokenizer: Any, cfg: SDConfig, pruner: Any
) -> tuple[list[list[int]], Counter[str], str | None]:
    """Each entry's target after pruning (the original object where refused), the refusals' reasons, the first error."""
    from lrmgym.judges.base import prompt_text
    from lrmgym.policies.base import SamplingParams

    special = {int(i) for i in getattr(tokenizer, "all_special_ids", ())}
    eos = int(tokenizer.eos_token_id)
    out, reasons, first_error = list(targets), Counter[str](), None
    for start in range(0, len(entries), cfg.prune_batch_size):
        chunk = range(start, min(start + cfg.prune_batch_size, len(entries)))
        tasks = [_rebuild(env, entries[i]) for i in chunk]
        texts = [cfg.fill_prompt(prompt_text(tasks[k].prompt), entries[i].text) for k, i in enumerate(chunk)]
        prompts: list[Prompt] = [[{"role": "user", "content": t}] if cfg.prune_chat else t for t in texts]
        budget = cfg.prune_max_new_tokens or max(len(targets[i]) for i in chunk)
        try:
            groups = pruner.generate(prompts, n=1, sampling=SamplingParams(temperature=0.0, max_new_tokens=budget))
            replies = [Completion.coerce(group[0]) for group in groups]
            if len(replies) != len(prompts):
                raise ValueError(f"{len(replies)} replies to {len(prompts)} prompts")
        except Exception as err:  # an untrusted, possibly remote model: its failure keeps the originals
            reasons["error"] += len(chunk)
            first_error = first_error or f"{type(err).__name__}: {err}"[:300]
            continue
        for i, task, reply in zip(chunk, tasks, replies, strict=True):
            why, ids = _judge_pruned(reply, task, entries[i].text, targets[i], env, tokenizer, special, eos)
            if why is None:
                out[i] = ids
            else:
                reasons[why] += 1
    return out, reasons, first_error


def _rebuild(env: Any, trace: Trace) -> Any:
    task = env.task_at(trace.position, seed=trace.stream_seed)
    if task.id != trace.task_id:
        raise ValueError(
            f"Trace of task {trace.task_id!r} (position {trace.position}, stream seed {trace.stream_seed}) rebuilds "
            f"as task {task.id!r}: the env is not the one the traces were recorded in. Use the RL stage's env."
        )
    return task


def _judge_pruned(
    reply: Completion,
    task: Any,
    original_text: str,
    original: list[int],
    env: Any,
    tokenizer: Any,
    special: set[int],
    eos: int,
) -> tuple[str | None, list[int]]:
    """``(None, target ids)`` when the pruned reply is accepted, else ``(reason, [])``."""
    if reply.finish_reason == "length":
        return "truncated", []
    text = reply.text.strip()
    if not text:
        return "empty", []
    if len(text) > 4 * len(original_text) + 256:
        # Four times the characters cannot be fewer tokens in any practical tokenizer: spare tokenizing a
        # runaway reply (a server that ignores its token budget can send megabytes).
        return "not_shorter", []
    try:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    except (TypeError, ValueError, UnicodeError):  # e.g. a lone surrogate, which no tokenizer encodes
        return "unencodable", []
    if special.intersection(ids):
        return "special_tokens", []
    ids = with_eos(ids, eos)
    if len(ids) >= len(original):
        return "not_shorter", []
    verdict = env.score_group(task, [Completion(text=text)])[0]
    if verdict.format_ok is False:
        return "format", []
    if verdict.score is None:
        return "ungradeable", []
    if verdict.correct is not True:
        return "wrong", []
    return None, ids
