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

The options are :mod:`~lrmgym.learners.algorithms.distill_config`, the traces and the corpus
:mod:`~lrmgym.learners.algorithms.distill_corpus`; this module holds the training and re-exports the rest.

The self-evaluation prompt and the pruning model are not recovered from the paper; the default prompt is ours
and ``prune="self"`` (the RL-1 model) is our reading.
"""

from __future__ import annotations

import math
import time
from functools import partial
from typing import Any

import numpy as np

from lrmgym.learners.algorithms.distill_config import DEFAULT_PRUNE_PROMPT, SDConfig, pruner_for
from lrmgym.learners.algorithms.distill_corpus import (
    Corpus,
    CorpusReport,
    Trace,
    build_corpus,
    read_traces,
    write_traces,
)
from lrmgym.learners.algorithms.sft import MaskedCE, collate_masked_ce, cosine_lr_factor
from lrmgym.learners.engine.context import RunContext
from lrmgym.learners.engine.loop import Algorithm, Loop, StepResult

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

_SHUFFLE = 0x5344  # "SD": the tag of the per-epoch shuffle seed


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
