"""Token-shift analysis: where does an RL-tuned model's greedy choice depart from its base model's?

ReasonMaxxer (§3-4 of the paper) decodes the base model greedily and, at every completion position, asks the
RL model for its argmax given the *same base prefix*. Each position falls into one class::

    UNSHIFTED : argmax pi_rl == argmax pi_base
    RERANKED  : argmax pi_rl != argmax pi_base, and argmax pi_rl is in Top-5(pi_base)
    SHIFTED   : argmax pi_rl is not in Top-5(pi_base)

The paper finds 1-4 % of positions reranked, none shifted, the RL token at mean rank ~2.2 under the base, and
5-12x higher base entropy (nats) at reranked positions than at unshifted ones.

Two interventions decode the base model again, continuing from the corrected prefix each time:

- **oracle**: at the RERANKED positions (the RL model's argmax differs but is in the base's top-5), take the
  RL model's token; at SHIFTED ones keep the base's. It asks whether re-ranking the base's own candidates at a
  few positions carries the RL model's accuracy (``oracle_edit_rate``: how few tokens). With no SHIFTED
  position on its path the oracle is the RL model's greedy decode; ``oracle_matches_rl`` counts the tasks
  where the two decodes are identical (the RL model's own greedy run is decoded separately).
- **control**: at the same kind of positions (where the RL model disagrees, on the control's own prefix), a
  uniformly random alternative from the base's top-20 other than its argmax instead.
- **gated** (the paper's §3.3, one decode per threshold ``tau`` in ``gate_taus``): wherever the *base's* entropy
  (nats) on the current prefix exceeds ``tau`` (strictly), take the RL model's argmax, whatever it is; elsewhere
  the base's. The RL model says *what* to write, never *where*: the gate is the base's own uncertainty. Reported
  per ``tau``: accuracy, ``gated_rate`` (share of tokens above the gate), ``edit_rate`` (share whose token
  changed: gated and the RL model disagreed) and ``matches_rl`` (share of tasks decoded exactly as the RL
  model's own greedy decode).

:func:`analyze_shift` takes two model-like objects (transformers causal LMs: ``model(input_ids=...,
attention_mask=..., position_ids=..., cache=...)`` returning ``.logits``), the base's tokenizer and an env's
tasks; :func:`classify_positions` is the classification alone, on logits. Decoding is batched over prompts with
a KV cache (the ``hf`` policy's decoder), stops at EOS or ``max_new_tokens`` (stop strings are not applied),
and covers the first policy turn only (multi-turn feedback is not replayed).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from lrmgym.core import Completion, Prompt, Task, TextEnv, Verdict
from lrmgym.files import atomic_write_bytes
from lrmgym.policies.sampling import BatchForward, compaction_order  # the hf policy's KV-cached decoder

__all__ = [
    "CLASS_NAMES",
    "RERANKED",
    "SHIFTED",
    "UNSHIFTED",
    "PositionStats",
    "ShiftReport",
    "analyze_shift",
    "classify_positions",
    "plot_shift",
    "summarize_positions",
]

UNSHIFTED, RERANKED, SHIFTED = 0, 1, 2
CLASS_NAMES = ("unshifted", "reranked", "shifted")
"""Class names by class id."""
RUNS = ("base", "rl", "oracle", "control")
"""The four greedy decodes of each task (plus one ``gated@TAU`` per gate threshold)."""


# --------------------------------------------------------------------------------------------------- classes
@dataclass(frozen=True)
class PositionStats:
    """What :func:`classify_positions` found at ``N`` positions (every tensor is ``[N]``).

    Attributes:
        classes: ``UNSHIFTED`` (0), ``RERANKED`` (1) or ``SHIFTED`` (2).
        rank: The RL argmax's rank under the base: 1 + the number of tokens the base scores strictly higher
            (1 = the base's argmax).
        entropy: The base distribution's entropy, in nats.
        base_top: The base's argmax.
        rl_top: The RL model's argmax.
    """

    classes: torch.Tensor
    rank: torch.Tensor
    entropy: torch.Tensor
    base_top: torch.Tensor
    rl_top: torch.Tensor


def classify_positions(base_logits: torch.Tensor, rl_logits: torch.Tensor, top_k: int = 5) -> PositionStats:
    """Classify positions by where the RL model's argmax lies in the base model's ranking.

    Args:
        base_logits: ``[N, V]`` the base model's next-token logits.
        rl_logits: ``[N, V]`` the RL model's, at the same prefixes.
        top_k: RERANKED means rank 2 .. ``top_k`` (the paper: 5); a rank beyond it is SHIFTED.

    Returns:
        The class, rank and base entropy of each position.
    """
    if base_logits.shape != rl_logits.shape:
        raise ValueError(
            f"The base logits have shape {tuple(base_logits.shape)} and the RL logits {tuple(rl_logits.shape)}; "
            "both models must score the same vocabulary (the same tokenizer) at the same positions."
        )
    base_logits = base_logits.float()
    base_top = base_logits.argmax(-1)  # [N]
    rl_top = rl_logits.float().argmax(-1)  # [N]
    picked = base_logits.gather(-1, rl_top[:, None])  # [N, 1] the base's logit of the RL token
    rank = (base_logits > picked).sum(-1) + 1  # [N]
    classes = torch.where(rank <= top_k, RERANKED, SHIFTED)
    classes = torch.where(rl_top == base_top, UNSHIFTED, classes)
    logp = torch.log_softmax(base_logits, -1)  # [N, V]
    entropy = -(logp.exp() * logp).nan_to_num().sum(-1)  # 0 * -inf -> 0 for masked tokens
    return PositionStats(classes, rank, entropy, base_top, rl_top)


def summarize_positions(classes: Sequence[int], rank: Sequence[int], entropy: Sequence[float]) -> dict[str, Any]:
    """Rates, mean rank and entropies of classified positions (the paper's Table 1 numbers).

    Returns:
        ``positions``; ``counts`` and ``rates`` by class name; ``reranked_mean_rank`` and ``shifted_mean_rank``
        (the RL token's mean rank under the base at those positions); ``entropy`` (mean base entropy by class,
        nats) and ``entropy_ratio`` (reranked / unshifted). A mean over no position is ``None``.
    """
    cls, rk, ent = np.asarray(classes, dtype=int), np.asarray(rank, dtype=float), np.asarray(entropy, dtype=float)
    n = len(cls)

    def mean(values: np.ndarray) -> float | None:
        return float(values.mean()) if len(values) else None

    counts = {name: int((cls == i).sum()) for i, name in enumerate(CLASS_NAMES)}
    entropies = {name: mean(ent[cls == i]) for i, name in enumerate(CLASS_NAMES)}
    low, high = entropies["unshifted"], entropies["reranked"]
    return {
        "positions": n,
        "counts": counts,
        "rates": {name: (c / n if n else None) for name, c in counts.items()},
        "reranked_mean_rank": mean(rk[cls == RERANKED]),
        "shifted_mean_rank": mean(rk[cls == SHIFTED]),
        "entropy": entropies,
        "entropy_ratio": high / low if high is not None and low else None,
    }


# --------------------------------------------------------------------------------------------------- decoding
@dataclass
class _Path:
    """One greedy decode of one prompt, with the classes of the positions it passed."""

    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    finish_reason: Literal["stop", "length"] = "length"
    classes: list[int] = field(default_factory=list)
    rank: list[int] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    edits: int = 0  # tokens that are not the base's argmax
    touched: list[int] = field(default_factory=list)  # completion indices where the chooser intervened


Chooser = Callable[[torch.Tensor, PositionStats | None], tuple[torch.Tensor, torch.Tensor | None]]
"""``(base_logits [b, V], stats or None) -> (next tokens [b], where it intervened [b] bool or None)``."""


def _device(model: Any) -> torch.device:
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration):
        return torch.device("cpu")


def _start(model: Any, prompts: list[list[int]], pad_id: int, new: int) -> BatchForward:
    """The KV-cached decoder of ``model`` over left-padded ``prompts``."""
    device, width = _device(model), max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[row, width - len(p) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    return BatchForward(model, ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), new)


@torch.inference_mode()
def _lockstep(
    base: Any, rl: Any | None, prompts: list[list[int]], choose: Chooser, *, max_new_tokens: int,
    eos_ids: Sequence[int], pad_id: int, top_k: int,
) -> list[_Path]:  # fmt: skip
    """Decode ``prompts`` with ``choose`` picking each token; both models see every chosen token.

    With ``rl=None`` only ``base`` runs (a model's own greedy decode) and nothing is classified.
    """
    paths = [_Path(list(p)) for p in prompts]
    fb = _start(base, prompts, pad_id, max_new_tokens)
    fr = _start(rl, prompts, pad_id, max_new_tokens) if rl is not None else None
    logits = fb.first()  # [B, V]
    rl_logits = fr.first().to(logits.device) if fr is not None else None
    if rl_logits is not None and rl_logits.shape[-1] != logits.shape[-1]:
        raise ValueError(
            f"The base model scores {logits.shape[-1]} tokens and the RL model {rl_logits.shape[-1]}; the analysis "
            "compares next-token distributions id by id, so both must share one vocabulary (one tokenizer)."
        )
    eos = torch.tensor(sorted(set(eos_ids)), dtype=torch.long, device=logits.device)
    alive = list(range(len(prompts)))  # original row of each row still decoding
    for _ in range(max_new_tokens):
        stats = classify_positions(logits, rl_logits, top_k) if rl_logits is not None else None
        token, touched = choose(logits, stats)  # [b], [b] or None
        done = torch.isin(token, eos).tolist()
        edited = (token != logits.argmax(-1)).tolist()
        touched = touched.tolist() if touched is not None else [False] * len(alive)
        columns = [token.tolist()]
        if stats is not None:
            columns += [stats.classes.tolist(), stats.rank.tolist(), stats.entropy.tolist()]
        keep = []
        for i, row in enumerate(alive):
            path = paths[row]
            if touched[i]:
                path.touched.append(len(path.token_ids))
            path.token_ids.append(columns[0][i])
            path.edits += edited[i]
            if stats is not None:
                path.classes.append(columns[1][i])
                path.rank.append(columns[2][i])
                path.entropy.append(columns[3][i])
            if done[i]:
                path.finish_reason = "stop"
            else:
                keep.append(i)
        if not keep or len(paths[alive[keep[0]]].token_ids) >= max_new_tokens:
            break
        if len(keep) < len(alive):
            order = compaction_order(keep)
            index = fb.drop(order)
            token = token[index]
            if fr is not None:
                fr.drop(order)
            alive = [alive[i] for i in order]
        logits = fb.next(token)
        if fr is not None:
            rl_logits = fr.next(token.to(_device(rl))).to(logits.device)
    return paths


def _greedy(logits: torch.Tensor, stats: PositionStats | None) -> tuple[torch.Tensor, None]:
    return logits.argmax(-1), None


def _oracle(logits: torch.Tensor, stats: PositionStats | None) -> tuple[torch.Tensor, torch.Tensor]:
    assert stats is not None
    # The RL token where it re-ranks the base's top-5 (where the two agree it is the base's argmax anyway).
    where = stats.classes == RERANKED
    return torch.where(where, stats.rl_top, stats.base_top), where


def _gated(tau: float) -> Chooser:
    """The RL model's argmax wherever the base's entropy exceeds ``tau`` (strictly), the base's elsewhere."""

    def choose(logits: torch.Tensor, stats: PositionStats | None) -> tuple[torch.Tensor, torch.Tensor]:
        assert stats is not None
        where = stats.entropy > tau  # [b]: the base's own uncertainty, no information from the RL model
        return torch.where(where, stats.rl_top, stats.base_top), where

    return choose


def _control(generator: torch.Generator, top: int) -> Chooser:
    """Where the RL model disagrees, a uniform pick among the base's top-``top`` other than its argmax."""

    def choose(logits: torch.Tensor, stats: PositionStats | None) -> tuple[torch.Tensor, torch.Tensor]:
        assert stats is not None
        token = stats.base_top.clone()
        disagree = stats.classes != UNSHIFTED
        where = disagree.nonzero()[:, 0]  # [m]
        k = min(top, logits.shape[-1])
        if len(where) and k > 1:
            pick = torch.randint(1, k, (len(where),), generator=generator).to(logits.device)  # [m], never rank 1
            candidates = torch.topk(logits[where], k, dim=-1).indices  # [m, k]
            token[where] = candidates.gather(-1, pick[:, None])[:, 0]
        return token, disagree

    return choose


# --------------------------------------------------------------------------------------------------- report
@dataclass(frozen=True)
class ShiftReport:
    """The analysis of :func:`analyze_shift`.

    Attributes:
        summary: :func:`summarize_positions` over the base's greedy positions.
        accuracy: Share of tasks passed by each greedy decode: ``base``, ``rl``, ``oracle``, ``control``.
        oracle_edit_rate: Share of the oracle's tokens that are not the base's argmax (the RL model's instead).
        control_edit_rate: Share of the control's tokens replaced by a random top-20 alternative.
        oracle_matches_rl: Share of tasks whose oracle tokens equal the RL model's own greedy tokens (1.0 when no
            SHIFTED position lies on the oracle's path, up to floating-point ties).
        gated: One entry per gate threshold (``gate_taus``, in order): ``tau``, ``accuracy``, ``gated_rate``
            (share of the decode's tokens where the base's entropy exceeded tau), ``edit_rate`` (share whose token
            is not the base's argmax), ``matches_rl`` (share of tasks decoded as the RL model's greedy run).
        tasks: One record per task: its id and, for each decode, whether it passed, its tokens and text.
        position_classes: The class of every base position, in task order (for plots; not in :meth:`to_dict`).
        position_entropy: The base entropy of every base position, in nats (likewise).
        config: The settings of the analysis.
        wall_s: Seconds the analysis took.
    """

    summary: dict[str, Any]
    accuracy: dict[str, float]
    oracle_edit_rate: float | None
    control_edit_rate: float | None
    oracle_matches_rl: float
    tasks: list[dict[str, Any]]
    position_classes: list[int]
    position_entropy: list[float]
    config: dict[str, Any]
    wall_s: float
    gated: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Every number and the config, JSON-ready (with an entropy histogram per class, not every position)."""
        return {
            **self.summary,
            "accuracy": self.accuracy,
            "oracle_edit_rate": self.oracle_edit_rate,
            "control_edit_rate": self.control_edit_rate,
            "oracle_matches_rl": self.oracle_matches_rl,
            "gated": self.gated,
            "entropy_histogram": self.entropy_histogram(),
            "config": self.config,
            "wall_s": self.wall_s,
            "tasks": self.tasks,
        }

    def entropy_histogram(self, bins: int = 30) -> dict[str, Any]:
        """Counts of base positions per entropy bin (nats), by class, over shared bin edges."""
        ent, cls = np.asarray(self.position_entropy, dtype=float), np.asarray(self.position_classes, dtype=int)
        top = float(ent.max()) if len(ent) else 1.0
        edges = np.linspace(0.0, max(top, 1e-6), bins + 1)
        counts = {name: np.histogram(ent[cls == i], edges)[0].tolist() for i, name in enumerate(CLASS_NAMES)}
        return {"edges": edges.tolist(), "counts": counts}


def _default_encode(tokenizer: Any) -> Callable[[Prompt], list[int]]:
    """Text prompts with the tokenizer's special tokens; chat prompts through its chat template (if any)."""

    def encode(prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return list(tokenizer(prompt)["input_ids"])
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
            return list(tokenizer(text, add_special_tokens=False)["input_ids"])
        from lrmgym.policies.hf import render_plain_chat

        return list(tokenizer(render_plain_chat(prompt))["input_ids"])

    return encode


def _passes(verdict: Verdict, threshold: float) -> bool:
    if verdict.score is None:
        return False
    return bool(verdict.correct) if verdict.correct is not None else verdict.score >= threshold


def _grade(env: TextEnv, task: Task, completion: Completion, threshold: float) -> bool:
    try:
        return _passes(env.score_group(task, [completion])[0], threshold)
    except Exception:  # noqa: BLE001 - a crashing verifier (a bug) fails that completion, not the analysis
        return False


def analyze_shift(
    base: Any,
    rl: Any,
    tokenizer: Any,
    env: TextEnv,
    tasks: Sequence[Task],
    *,
    max_new_tokens: int = 256,
    batch_size: int = 32,
    top_k: int = 5,
    control_top: int = 20,
    seed: int = 0,
    gate_taus: Sequence[float] = (),
    pass_threshold: float = 1.0,
    eos_ids: Sequence[int] | None = None,
    encode: Callable[[Prompt], list[int]] | None = None,
    decode: Callable[[Sequence[int]], str] | None = None,
    progress: bool = False,
) -> ShiftReport:
    """Compare ``rl`` with ``base`` on ``tasks``: position classes, the oracle, its random control, the gates.

    Args:
        base: The base causal LM (a transformers model; its logits are ``model(...).logits``).
        rl: The RL-tuned model, same vocabulary. May sit on another device.
        tokenizer: The base's tokenizer: encodes prompts, decodes completions for grading.
        env: Grades each decode (``env.score_group(task, [completion])``).
        tasks: The prompts, in order.
        max_new_tokens: Tokens per decode at most.
        batch_size: Prompts decoded together.
        top_k: The base top-k that separates RERANKED from SHIFTED.
        control_top: The control draws from the base's top ``control_top`` (its argmax excluded).
        seed: Seed of the control's draws.
        gate_taus: One entropy-gated decode per threshold (nats): the RL model's argmax wherever the base's entropy
            exceeds it (the paper's §3.3 uses 1.2). Empty: none.
        pass_threshold: A verdict without a ``correct`` flag passes when its score is at least this.
        eos_ids: Tokens that end a decode (default: the tokenizer's EOS and the base's generation config's).
        encode: Prompt -> token ids (default: the tokenizer, with its chat template for chat prompts); pass the
            ``hf`` policy's ``encode_prompt`` to encode exactly as it samples.
        decode: Token ids -> completion text (default: ``tokenizer.decode`` without EOS and special tokens).
        progress: Show a progress bar.

    Returns:
        The :class:`ShiftReport`.
    """
    if not tasks:
        raise ValueError("analyze_shift needs at least one task.")
    taus = list(dict.fromkeys(float(t) for t in gate_taus))  # in order, each once
    bad = [t for t in taus if not t >= 0.0 or t == float("inf")]
    if bad:
        raise ValueError(f"gate tau {bad[0]!r} is not a finite entropy in nats; give values >= 0, e.g. 1.2 or 1.4.")
    start = time.perf_counter()
    eos = sorted(set(eos_ids if eos_ids is not None else _eos_ids(base, tokenizer)))
    if not eos:
        raise ValueError("No EOS token: the tokenizer has no eos_token; pass eos_ids.")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    encode = encode or _default_encode(tokenizer)
    if decode is None:

        def decode(ids: Sequence[int]) -> str:
            return tokenizer.decode([t for t in ids if t not in eos], skip_special_tokens=True)

    generator = torch.Generator().manual_seed(seed)
    kwargs = {"max_new_tokens": max_new_tokens, "eos_ids": eos, "pad_id": int(pad), "top_k": top_k}
    gates = {_gate_name(t): t for t in taus}
    runs: dict[str, list[_Path]] = {name: [] for name in (*RUNS, *gates)}
    bar = _progress(len(tasks), progress)
    for b in range(0, len(tasks), batch_size):
        prompts = [encode(t.prompt) for t in tasks[b : b + batch_size]]
        runs["base"] += _lockstep(base, rl, prompts, _greedy, **kwargs)
        runs["rl"] += _lockstep(rl, None, prompts, _greedy, **kwargs)
        runs["oracle"] += _lockstep(base, rl, prompts, _oracle, **kwargs)
        runs["control"] += _lockstep(base, rl, prompts, _control(generator, control_top), **kwargs)
        for name, tau in gates.items():
            runs[name] += _lockstep(base, rl, prompts, _gated(tau), **kwargs)
        bar.update(len(prompts))
    bar.close()

    records, passed = [], {name: 0 for name in runs}
    for k, task in enumerate(tasks):
        record: dict[str, Any] = {"task_id": task.id}
        for name in runs:
            path = runs[name][k]
            text = decode(path.token_ids)
            completion = Completion(
                text=text, token_ids=path.token_ids, finish_reason=path.finish_reason, prompt_token_ids=path.prompt_ids
            )
            ok = _grade(env, task, completion, pass_threshold)
            passed[name] += ok
            record[name] = {"passed": ok, "tokens": len(path.token_ids), "text": text}
            if name != "base" and name != "rl":
                record[name]["edits"] = path.edits
            if name in gates:
                record[name]["gated"] = path.touched  # completion indices above the gate
        base_path = runs["base"][k]
        record["reranked"] = base_path.classes.count(RERANKED)
        record["shifted"] = base_path.classes.count(SHIFTED)
        records.append(record)

    base_paths = runs["base"]
    classes = [c for p in base_paths for c in p.classes]
    entropy = [e for p in base_paths for e in p.entropy]
    summary = summarize_positions(classes, [r for p in base_paths for r in p.rank], entropy)
    config = {"tasks": len(tasks), "max_new_tokens": max_new_tokens, "batch_size": batch_size, "top_k": top_k,
              "control_top": control_top, "seed": seed, "gate_taus": taus,
              "pass_threshold": pass_threshold}  # fmt: skip
    gated = [
        {"tau": tau, "accuracy": passed[name] / len(tasks), "gated_rate": _touched_rate(runs[name]),
         "edit_rate": _edit_rate(runs[name]), "matches_rl": _matches(runs[name], runs["rl"])}
        for name, tau in gates.items()
    ]  # fmt: skip
    return ShiftReport(
        summary=summary,
        accuracy={name: passed[name] / len(tasks) for name in runs},
        oracle_edit_rate=_edit_rate(runs["oracle"]),
        control_edit_rate=_edit_rate(runs["control"]),
        oracle_matches_rl=_matches(runs["oracle"], runs["rl"]),
        tasks=records,
        position_classes=classes,
        position_entropy=entropy,
        config=config,
        wall_s=time.perf_counter() - start,
        gated=gated,
    )


def _gate_name(tau: float) -> str:
    """The run name of the gated decode at ``tau``: ``gated@1.4``."""
    return f"gated@{tau!r}"


def _matches(paths: list[_Path], reference: list[_Path]) -> float:
    """Share of tasks whose tokens equal the reference decode's."""
    return sum(p.token_ids == r.token_ids for p, r in zip(paths, reference, strict=True)) / len(paths)


def _touched_rate(paths: list[_Path]) -> float | None:
    tokens = sum(len(p.token_ids) for p in paths)
    return sum(len(p.touched) for p in paths) / tokens if tokens else None


def _edit_rate(paths: list[_Path]) -> float | None:
    tokens = sum(len(p.token_ids) for p in paths)
    return sum(p.edits for p in paths) / tokens if tokens else None


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    ids = {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(extra, int):
        ids.add(extra)
    elif extra:
        ids.update(int(i) for i in extra)
    return sorted(ids)


def _progress(total: int, enabled: bool) -> Any:
    from lrmgym.progress import progress_bar

    return progress_bar(total, "shift", "tasks", enabled=enabled, leave=False)


# --------------------------------------------------------------------------------------------------- plot
def plot_shift(report: ShiftReport, out_png: Path | str) -> Path:
    """Two panels into ``out_png`` (atomically): base entropy by class, and the rates and accuracies."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    hist = report.entropy_histogram()
    edges = np.asarray(hist["edges"])
    for i, name in enumerate(CLASS_NAMES):
        counts = np.asarray(hist["counts"][name], dtype=float)
        if counts.sum():
            left.stairs(counts / counts.sum(), edges, label=f"{name} ({int(counts.sum())})", color=f"C{i}", lw=1.6)
    left.set_xlabel("base entropy (nats)")
    left.set_ylabel("share of the class's positions")
    left.set_title("base entropy at each position, by class", fontsize=10)
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    labels = [*(f"{n} rate" for n in CLASS_NAMES), *(f"{n} acc." for n in RUNS)]
    values = [*(report.summary["rates"][n] or 0.0 for n in CLASS_NAMES), *(report.accuracy[n] for n in RUNS)]
    colors = ["C0", "C1", "C2", "C7", "C3", "C4", "C5"]
    bars = right.bar(range(len(values)), [100 * v for v in values], color=colors)
    right.bar_label(bars, labels=[f"{100 * v:.1f}" for v in values], fontsize=8)
    right.set_xticks(range(len(values)), labels, rotation=30, ha="right", fontsize=8)
    right.set_ylabel("%")
    right.set_title(f"{report.summary['positions']} positions, {report.config['tasks']} tasks", fontsize=10)
    right.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    atomic_write_bytes(Path(out_png), buf.getvalue())
    return Path(out_png)
