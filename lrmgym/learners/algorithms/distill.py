"""Ring-Zero's self-distillation stage (SD): fine-tune the base model on the RL-1 model's shortest correct traces.

Between its first and second RL stages Ring-Zero (arXiv 2607.12395) takes, per problem, the shortest correct
trajectory the RL-1 rollouts produced, has the model prune redundant segments from it, and fine-tunes the
*base* model (not the RL checkpoint) on the refined corpus: 3 epochs, lr 7e-5 at the 1T scale. Starting again
from the base resets the drift between the training and the inference engine that RL-1 built up, and the
shorter traces compress the chain of thought.

Here:

- :class:`Trace` is one shortest correct trajectory as the RL stage records it (:func:`write_traces`,
  :func:`read_traces`: JSONL), with what rebuilds its task (``env.task_at(position, seed=stream_seed)``).
- :func:`build_corpus` keeps one trace per task (the shortest) and, with a pruner, offers each to it once with
  :attr:`SDConfig.prune_prompt`. A pruned text is untrusted model output: it is only tokenized and graded by
  the env, and it replaces the original only when it is strictly shorter and still verifies (correct, format
  not broken). Everything else keeps the original, with the reason counted in the :class:`CorpusReport`.
- :class:`SelfDistill` is the stage's :class:`~lrmgym.learners.engine.loop.Algorithm`: seeded shuffled minibatches,
  one :class:`~lrmgym.learners.algorithms.sft.MaskedCE` step each (the masked cross-entropy ``lrmgym tiny build`` trains
  with). The loop around it (checkpoints, resume, evaluation) is :mod:`lrmgym.learners.engine.loop`.

The self-evaluation prompt and the pruning model are not recovered from the paper; the default prompt is ours
and ``prune="self"`` (the RL-1 model) is our reading.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field, ValidationInfo, field_validator

from lrmgym.core import Completion, Prompt, learner_env
from lrmgym.files import atomic_write_text
from lrmgym.learners.algorithms.sft import MaskedCE, collate_masked_ce, cosine_lr_factor, with_eos
from lrmgym.learners.engine.context import RunContext
from lrmgym.learners.engine.loop import Algorithm, Loop, LoopConfig, StepResult

__all__ = [
    "DEFAULT_PRUNE_PROMPT",
    "Corpus",
    "CorpusReport",
    "SDConfig",
    "SelfDistill",
    "Trace",
    "build_corpus",
    "pruner_for",
    "read_traces",
    "self_distill_loop",
    "write_traces",
]

Corpus = list[tuple[list[int], list[int]]]
"""The SD training set: (prompt token ids, target token ids ending in EOS), one per task."""

DEFAULT_PRUNE_PROMPT = """\
Below is a problem and a correct solution to it. The solution may contain redundant segments: repeated \
checks, restated steps, detours that are abandoned later. Rewrite the solution with those segments removed. \
Keep every step that is needed to reach the answer, keep the final answer unchanged, and keep the format \
<think>...</think><answer>...</answer> exactly. Reply with the rewritten solution only.

Problem:
{prompt}

Solution:
{solution}

Rewritten solution:
"""
"""Ours (the paper's self-evaluation prompt is not recovered); ``{prompt}`` and ``{solution}`` are filled in."""

_PLACEHOLDERS = re.compile(r"\{(prompt|solution)\}")
_SHUFFLE = 0x5344  # "SD": the tag of the per-epoch shuffle seed


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
                    "lrmgym.learners.algorithms.distill.write_traces; was it cut short or edited?"
                ) from None
    return traces


# --------------------------------------------------------------------------------------------------- config
class SDConfig(LoopConfig):
    """Options of the self-distillation stage: corpus, pruning and the supervised fine-tune."""

    steps: int | None = Field(None, ge=1, le=10_000_000)
    """Optimizer steps; None: `epochs` passes over the corpus (set once the corpus is built, see for_corpus)."""
    epochs: int = Field(3, ge=1, le=1000)
    """Passes over the corpus when `steps` is None (Ring-Zero: 3)."""
    batch_size: int = Field(32, ge=1, le=65_536)
    """Traces per optimizer step."""
    lr: float = Field(1e-4, gt=0.0, le=1.0)
    """Peak AdamW learning rate (Ring-Zero: 7e-5 on the 1T model). The default suits the tiny model fine-tuned
    from its base: at the tiny build's own 3e-3, or at 1e-3, the fine-tune undoes the build (held-out accuracy
    falls), while 1e-4 keeps it or adds a little."""
    warmup_steps: int = Field(0, ge=0)
    """Linear learning-rate warm-up steps."""
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0)
    """After warm-up the rate follows a cosine down to min_lr_ratio x lr at the last step."""
    weight_decay: float = Field(0.0, ge=0.0, le=1.0)
    """AdamW weight decay."""
    max_grad_norm: float | None = Field(1.0, gt=0.0)
    """Clip the gradient's global norm to this; None disables clipping."""
    prune: Any = "none"
    """Who prunes each trace before training: none; self (the policy as it is when the corpus is built, i.e. the
    RL-1 model); or a policy config, e.g. {kind: openai, base_url: http://127.0.0.1:8000/v1, model: NAME}."""
    prune_prompt: str = DEFAULT_PRUNE_PROMPT
    """What the pruner is asked; must hold {prompt} (the task's prompt) and {solution} (the trace's text)."""
    prune_max_new_tokens: int | None = Field(None, ge=1)
    """Token budget of a pruner reply; None: the longest original trace of the request (a pruned trace must be
    shorter anyway). A reply that hits the budget is refused."""
    prune_batch_size: int = Field(16, ge=1, le=4096)
    """Traces per pruner request (one generate call); a failed request keeps all of its originals."""
    prune_chat: bool = False
    """Send the pruning prompt as one user chat message (True) or as raw text (False, for base models)."""
    min_traces: int = Field(1, ge=1)
    """Fewest tasks with a correct trace the stage trains on; fewer is an error."""

    @field_validator("prune", mode="before")
    @classmethod
    def _validate_prune(cls, value: Any, info: ValidationInfo) -> Any:
        """``"none"``, ``"self"``, or a policy config validated now against its kind's config class.

        A mapping (``{kind: openai, ...}``) becomes its kind's config through the resolver :mod:`lrmgym.configs`
        passes in the validation context (its errors name the dotted path), else through
        :func:`lrmgym.policies.kinds.policy_config`, as an LLM judge's ``policy`` does.
        """
        if isinstance(value, str):
            if value in ("none", "self"):
                return value
            close = difflib.get_close_matches(value.lower(), ["none", "self"], n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"expected 'none', 'self' or a policy config such as {{kind: openai, base_url: ..., model: ...}}, "
                f"got {value!r:.80}.{hint}"
            )
        from lrmgym.policies.kinds import nested_policy_config

        return nested_policy_config(
            value, info.context if info is not None else None, "'none', 'self' or a policy config"
        )

    @field_validator("prune_prompt")
    @classmethod
    def _check_placeholders(cls, prompt: str) -> str:
        missing = [p for p in ("{prompt}", "{solution}") if p not in prompt]
        if missing:
            raise ValueError(
                f"prune_prompt must contain both {{prompt}} and {{solution}}; missing: {', '.join(missing)}. "
                "Put them where the task's prompt and the trace to prune go."
            )
        return prompt

    def for_corpus(self, size: int) -> SDConfig:
        """This config with ``steps`` set: as given, or ``epochs`` passes of ``batch_size`` over ``size`` traces."""
        if self.steps is not None:
            return self
        if size < 1:
            raise ValueError(f"The corpus is empty (size={size}); self-distillation needs at least one trace.")
        return self.model_copy(update={"steps": self.epochs * math.ceil(size / self.batch_size)})

    def fill_prompt(self, prompt: str, solution: str) -> str:
        """:attr:`prune_prompt` with its placeholders filled, in one pass (so braces in the texts stay as they are)."""
        values = {"prompt": prompt, "solution": solution}
        return _PLACEHOLDERS.sub(lambda m: values[m.group(1)], self.prune_prompt)


def pruner_for(cfg: SDConfig, policy: Any) -> Any:
    """The pruner ``cfg.prune`` names: ``None`` (none), ``policy`` (self) or the configured policy, built."""
    if cfg.prune == "none":
        return None
    if cfg.prune == "self":
        return policy
    return cfg.prune.build()


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


# --------------------------------------------------------------------------------------------------- training
class SelfDistill(Algorithm):
    """The SD stage's training: ``steps`` masked cross-entropy steps over seeded shuffles of the corpus.

    Step ``s`` trains on minibatch ``s mod B`` of epoch ``s // B`` (``B`` = minibatches per epoch), each epoch's
    order a permutation drawn from ``derived_seed(ctx.seed, 0x5344, epoch)``: the data position is a function of
    the step, so a resumed run sees exactly the batches an uninterrupted one would. The policy's model must
    already hold the weights to start from (the base model's, for Ring-Zero); it is left in eval mode after
    every step.

    Args:
        cfg: The stage's options, with ``steps`` set (:meth:`SDConfig.for_corpus`).
        corpus: The training pairs (:func:`build_corpus`).
    """

    name = "sd"

    def __init__(self, cfg: SDConfig, corpus: Corpus) -> None:
        if not corpus:
            raise ValueError("SelfDistill needs a non-empty corpus; build it with build_corpus.")
        self.cfg, self.corpus = cfg, list(corpus)
        self.batches_per_epoch = math.ceil(len(self.corpus) / cfg.batch_size)
        self._order: tuple[int, list[int]] | None = None  # (epoch, its permutation)

    def setup(self) -> None:
        """Build the :class:`~lrmgym.learners.algorithms.sft.MaskedCE` trainer on the policy's model."""
        import torch

        from lrmgym.learners.engine.common import check_trainable

        steps = self.loop.cfg.steps
        if steps is None:
            raise ValueError("SDConfig.steps is None: run the loop on cfg.for_corpus(len(corpus)) (self_distill_loop).")
        if self.cfg.torch_threads is not None:
            torch.set_num_threads(self.cfg.torch_threads)
        policy = self.loop.ctx.policy
        check_trainable(policy, self.name)
        tok = policy.tokenizer
        if tok.eos_token_id is None:
            raise ValueError("The policy's tokenizer has no eos_token; SD trains the traces to end in EOS.")
        self.eos_id = int(tok.eos_token_id)
        self.pad_id = int(tok.pad_token_id) if tok.pad_token_id is not None else self.eos_id
        cfg = self.cfg
        schedule = partial(cosine_lr_factor, steps=steps, warmup=cfg.warmup_steps, min_ratio=cfg.min_lr_ratio)
        self.trainer = MaskedCE(
            policy.model, cfg.lr, schedule, weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm, fused=True
        )

    def batch(self, step: int) -> Corpus:
        """The corpus pairs step ``step`` (0-based) trains on."""
        from lrmgym.learners.engine.common import derived_seed

        epoch, index = divmod(step, self.batches_per_epoch)
        if self._order is None or self._order[0] != epoch:
            rng = np.random.default_rng(derived_seed(self.loop.ctx.seed, _SHUFFLE, epoch))
            self._order = (epoch, rng.permutation(len(self.corpus)).tolist())
        size = self.cfg.batch_size
        return [self.corpus[i] for i in self._order[1][index * size : (index + 1) * size]]

    def train_step(self) -> StepResult:
        """One minibatch, one update."""
        step = self.loop.step
        start = time.perf_counter()
        stats = self.trainer.step(*collate_masked_ce(self.batch(step), self.pad_id, self.eos_id))
        train_s = time.perf_counter() - start
        return StepResult({
            **stats, "tokens_per_s": stats["tokens"] / train_s, "epoch": (step + 1) / self.batches_per_epoch,
            "time/train_s": train_s,
        })  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        """Model, optimizer and schedule (the data position is the loop's step)."""
        return self.trainer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.trainer.load_state_dict(state)

    def postfix(self, metrics: dict[str, Any]) -> dict[str, str]:
        """Loss, learning rate, epoch and tokens/s."""
        return {
            "loss": f"{metrics['loss']:.3f}", "lr": f"{metrics['lr']:.1e}", "epoch": f"{metrics['epoch']:.2f}",
            "tok/s": f"{metrics['tokens_per_s']:.0f}",
        }  # fmt: skip


def self_distill_loop(ctx: RunContext, cfg: SDConfig, corpus: Corpus) -> Loop:
    """The run loop of the SD stage over ``ctx`` (its policy holding the starting weights); ``.run()`` trains."""
    cfg = cfg.for_corpus(len(corpus))
    return Loop(ctx, cfg, SelfDistill(cfg, corpus))
