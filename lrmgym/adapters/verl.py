"""lrmgym envs and judges as verl's custom reward function, and the parquet files verl trains on.

verl (``python -m verl.trainer.main_ppo``) loads a reward function from a file::

    custom_reward_function.path=DIR/reward.py custom_reward_function.name=compute_score

and calls it once per response as ``compute_score(data_source=..., solution_str=..., ground_truth=...,
extra_info=...)``: ``solution_str`` is the decoded response (special tokens skipped), ``ground_truth`` the row's
``reward_model.ground_truth`` and ``extra_info`` its ``extra_info`` mapping. A float return is the reward; a dict
must hold the reward under ``"score"``, and verl keeps every key of it per sample (``reward_extra_info``) and
reports them in validation as ``val-aux/<data_source>/<key>/mean@N``, with ``acc`` as the core metric when present.
So every response of one env + judges returns the same keys, all numbers. verl's ``batch`` reward manager
(``reward_model.reward_manager=batch``) calls the function once with lists instead: ``compute_score_batch`` here.
These calls are as verl 0.4 to 0.6 make them (``verl/workers/reward_manager/naive.py`` and ``batch.py``,
``verl/trainer/ppo/reward.py::get_custom_reward_fn``); verl is not installed here to check them against.

The ``reward.py`` :func:`export_verl` writes holds the exporter's env and judge configs (fixed at export time) and
binds ``compute_score`` / ``compute_score_batch`` to a :class:`VerlReward` over them: a row's ``extra_info["label"]``
(or a ``ground_truth`` that is itself a label) names only its task, and every setting (the sandbox, time and
memory bounds, workers, data files, judge endpoints) is the exporter's; a label that names one is refused
(:func:`lrmgym.integrations.labels.decode_label`). This module's own :func:`compute_score` and
:func:`compute_score_batch` (no exporter's config) grade a label's task with this process's defaults for every
setting and the env's verifier alone.

``compute_score`` returns ``{"score", "acc", "judge/<name>"..., "verdict/..."}``: the judged verdict's score
(the env's failure value when ungradeable: verl cannot mask a sample out, so ``verdict/ungradeable`` says so),
correctness as 0/1, and each judge's part (:class:`lrmgym.integrations.labels.Score`). Whatever the response holds,
grading never raises; a missing or bad label does (a data problem).

Group-aware judges (the arena, pairwise judges) need all the responses of a prompt at once: verl's default
``naive`` manager hands one at a time, so :func:`compute_score` refuses them and :func:`compute_score_batch`, with
``reward_model.reward_manager=batch``, groups each batch's responses by their label. Multi-turn envs are refused
by the export: a custom reward function grades one response, not a conversation with the env. Tool envs
(``env=math_tool``) too: verl's ``ToolAgentLoop`` could run the tool, but the reward function receives the decoded
response with the tool responses in it and no turn boundaries, so it could not grade only the turn without a call.

:func:`export_verl` (``lrmgym export verl``) writes ``train.parquet`` and ``test.parquet`` in verl's format
(``data_source``, ``prompt`` as chat messages, ``ability``, ``reward_model``, ``extra_info``), ``reward.py`` and
``export.json`` with the overrides that use them.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lrmgym.integrations.labels import (
    LABEL_VERSION,
    LabelError,
    Score,
    Scorer,
    datasource_name,
    decode_label,
    encode_label,
    group_judges,
    strip_stop_texts,
)

__all__ = [
    "REWARD_FILE",
    "VerlExport",
    "VerlReward",
    "compute_score",
    "compute_score_batch",
    "export_verl",
    "reset_scorer",
    "verl_overrides",
]

logger = logging.getLogger(__name__)

REWARD_FILE, TRAIN_FILE, TEST_FILE, EXPORT_FILE = "reward.py", "train.parquet", "test.parquet", "export.json"
"""The files :func:`export_verl` writes."""
_SCORER: Scorer | None = None
_SCORER_LOCK = threading.Lock()


# --------------------------------------------------------------------------------------------------- scoring
def _scorer() -> Scorer:
    """The process's scorer: worlds built from the labels, each once."""
    global _SCORER
    with _SCORER_LOCK:
        if _SCORER is None:
            _SCORER = Scorer()
        return _SCORER


def reset_scorer() -> None:
    """Close the worlds built so far (their envs, the math verifier's worker processes) and start afresh."""
    global _SCORER
    with _SCORER_LOCK:
        scorer, _SCORER = _SCORER, None
    if scorer is not None:
        scorer.close()


def _label(ground_truth: Any, extra_info: Any, where: str) -> Any:
    """The label of a row: ``extra_info["label"]``, else a ``ground_truth`` that is a label."""
    if isinstance(extra_info, Mapping) and extra_info.get("label") is not None:
        return extra_info["label"]
    if isinstance(ground_truth, str) and ground_truth.lstrip().startswith("{") and '"v"' in ground_truth:
        return ground_truth
    keys = sorted(extra_info) if isinstance(extra_info, Mapping) else type(extra_info).__name__
    raise LabelError(
        f"{where}: no lrmgym label in extra_info (got {keys}); train on the parquet files `lrmgym export verl` "
        "writes, whose extra_info.label names each row's task."
    )


def _text(solution: Any) -> str:
    if isinstance(solution, bytes):
        solution = solution.decode("utf-8", errors="replace")
    if not isinstance(solution, str):
        solution = "" if solution is None else str(solution)
    return strip_stop_texts(solution)


def _result(score: Score) -> dict[str, float]:
    return {"score": float(score.reward), "acc": float(score.score), **score.extra_logs}


def _score_one(scorer: Scorer, solution_str: Any, ground_truth: Any, extra_info: Any) -> dict[str, float]:
    label = decode_label(_label(ground_truth, extra_info, "extra_info"), "extra_info.label")
    world = scorer.world(label, "extra_info.label")
    if world.group_judges:
        from lrmgym.configs.errors import ConfigError

        raise ConfigError(
            f"judge.{world.group_judges[0]}: this judge compares the responses of a prompt, but verl's per-response "
            "reward manager hands compute_score one response at a time. Set reward_model.reward_manager=batch and "
            "custom_reward_function.name=compute_score_batch (the responses of a batch are grouped by their label), "
            "or export without the group-aware judge."
        )
    return _result(scorer.score([label], [_text(solution_str)])[0])


def _score_batch(
    scorer: Scorer, solution_strs: Sequence[Any], ground_truths: Sequence[Any] | None, extra_infos: Sequence[Any] | None
) -> list[dict[str, float]]:
    texts = [_text(s) for s in solution_strs]
    n = len(texts)
    truths = list(ground_truths) if ground_truths is not None else [None] * n
    extras = list(extra_infos) if extra_infos is not None else [None] * n
    if len(truths) != n or len(extras) != n:
        raise ValueError(
            f"compute_score_batch got {n} responses, {len(truths)} ground truths and {len(extras)} extra_infos; verl "
            "passes one of each per response."
        )
    labels = [_label(truths[i], extras[i], f"extra_infos[{i}]") for i in range(n)]
    for i, raw in enumerate(labels):  # each error names its row's field: extra_infos[i].label...
        labels[i] = decode_label(raw, f"extra_infos[{i}].label")
    return [_result(s) for s in scorer.score(labels, texts)]


class VerlReward:
    """verl's reward functions over fixed env and judge configs: those of the export (``reward.py`` makes one).

    A row's label names its task only; the settings (sandbox, bounds, workers, data files, judge endpoints) are
    these configs', fixed when the export was written. ``compute_score`` and ``compute_score_batch`` take verl's
    arguments, as the module functions of the same names do.

    Args:
        env: The env config (an :class:`~lrmgym.configs.schema.EnvConfig` or its dump).
        judge: The judge configs by name (models or dumps); empty: the env's verifier alone.
    """

    def __init__(self, env: Any, judge: Mapping[str, Any] | None = None) -> None:
        self.scorer = Scorer(env, judge or {})

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> VerlReward:
        """The reward a generated ``reward.py``'s ``SETTINGS`` describe (``env``, ``judge``, ``label_version``)."""
        if settings.get("label_version") != LABEL_VERSION or "env" not in settings:
            raise RuntimeError(
                f"this reward.py was written for lrmgym label format {settings.get('label_version')!r} without the "
                f"exporter's env config, but the installed lrmgym reads format {LABEL_VERSION} with it; export the "
                "data again with this lrmgym (lrmgym export verl)."
            )
        return cls(settings["env"], settings.get("judge") or {})

    def compute_score(
        self,
        data_source: Any = None,
        solution_str: Any = "",
        ground_truth: Any = None,
        extra_info: Any = None,
        **kwargs: Any,
    ) -> dict[str, float]:
        """Grade one response (see the module's :func:`compute_score`)."""
        return _score_one(self.scorer, solution_str, ground_truth, extra_info)

    def compute_score_batch(
        self,
        data_sources: Sequence[Any] | None = None,
        solution_strs: Sequence[Any] = (),
        ground_truths: Sequence[Any] | None = None,
        extra_infos: Sequence[Any] | None = None,
        **kwargs: Any,
    ) -> list[dict[str, float]]:
        """Grade a batch, each prompt's responses as one group (see the module's :func:`compute_score_batch`)."""
        return _score_batch(self.scorer, solution_strs, ground_truths, extra_infos)

    def close(self) -> None:
        """Close the env (sandboxes) and the math verifier's workers."""
        self.scorer.close()


def compute_score(
    data_source: Any = None, solution_str: Any = "", ground_truth: Any = None, extra_info: Any = None, **kwargs: Any
) -> dict[str, float]:
    """The custom reward verl calls: grade one response against the task its row's label names.

    This module function has no exporter's config: the label's task is graded with this process's defaults for
    every setting and the env's verifier alone. The ``reward.py`` of :func:`export_verl` binds the export's
    configs instead (:class:`VerlReward`).

    Args:
        data_source: The row's ``data_source`` (not used: the label says everything).
        solution_str: The decoded response.
        ground_truth: The row's ``reward_model.ground_truth`` (used only when it is the label itself).
        extra_info: The row's ``extra_info``; its ``label`` names the task, env and judges.
        **kwargs: What newer verl versions add (``reward_kwargs``, rollout details); not used.

    Returns:
        ``{"score": reward, "acc": 0/1, "judge/<name>": ..., "verdict/...": ...}``, all floats.

    Raises:
        LabelError: No usable label in the row.
        ConfigError: The label's judges compare responses within a group (use :func:`compute_score_batch`).
    """
    return _score_one(_scorer(), solution_str, ground_truth, extra_info)


def compute_score_batch(
    data_sources: Sequence[Any] | None = None,
    solution_strs: Sequence[Any] = (),
    ground_truths: Sequence[Any] | None = None,
    extra_infos: Sequence[Any] | None = None,
    **kwargs: Any,
) -> list[dict[str, float]]:
    """The batch reward of verl's ``batch`` manager: every response of a batch, each prompt's as one group.

    The responses whose labels name the same task are graded as one group, so the arena and pairwise judges see
    each prompt's ``rollout.n`` responses together. Arguments are the lists verl passes (see :func:`compute_score`).

    Returns:
        One result per response, in order (see :func:`compute_score`).

    Raises:
        LabelError: A row has no usable label (named by its position).
    """
    return _score_batch(_scorer(), solution_strs, ground_truths, extra_infos)


# --------------------------------------------------------------------------------------------------- the files
def verl_overrides(out_dir: str | os.PathLike, group_aware: bool = False) -> list[str]:
    """The ``main_ppo`` overrides that train on an export folder's data with its reward."""
    root = Path(os.path.abspath(out_dir))
    args = [
        f"data.train_files={root / TRAIN_FILE}",
        f"data.val_files={root / TEST_FILE}",
        "data.prompt_key=prompt",
        f"custom_reward_function.path={root / REWARD_FILE}",
        f"custom_reward_function.name={'compute_score_batch' if group_aware else 'compute_score'}",
    ]
    if group_aware:
        args.append("reward_model.reward_manager=batch")
    return args


_REWARD_TEMPLATE = '''"""verl custom reward function for lrmgym: env {env_id}, judges {judges}.

Generated by `lrmgym export verl` (lrmgym {version}). Train with these python -m verl.trainer.main_ppo overrides:

    {overrides}

Each row's extra_info.label names its task; the env and judges, with every setting (sandbox, time and memory
bounds, workers, data files, judge endpoints), are SETTINGS below, fixed at export time: a label that names a
setting is refused. The installed lrmgym must be importable where verl computes the rewards. compute_score grades
one response (verl's default reward manager); compute_score_batch grades a whole batch, each prompt's responses
as one group (reward_model.reward_manager=batch).
"""

import json

from lrmgym.adapters.verl import VerlReward

SETTINGS = json.loads({settings})
_REWARD = VerlReward.from_settings(SETTINGS)
compute_score = _REWARD.compute_score  # verl looks the functions up by name
compute_score_batch = _REWARD.compute_score_batch
'''


def _messages(prompt: Any) -> list[dict[str, str]]:
    """A task prompt as verl's chat messages: text becomes one user message."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [{"role": str(m.get("role", "user")), "content": str(m.get("content", ""))} for m in prompt]


def _rows(tasks: Sequence[tuple[int, Any]], labels: Any, source: str, split: str, seed: int) -> list[dict]:
    """The verl rows of ``(index, task)`` pairs; ``labels(index)`` is each row's label."""
    ability = source.split("/", 1)[-1]
    return [
        {
            "data_source": source,
            "prompt": _messages(task.prompt),
            "ability": ability,
            "reward_model": {"style": "rule", "ground_truth": "" if task.answer is None else str(task.answer)},
            "extra_info": {"split": split, "index": index, "seed": seed, "label": labels(index), "task_id": task.id},
        }
        for index, task in tasks
    ]


def _write_parquet(path: Path, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)


@dataclass
class VerlExport:
    """What :func:`export_verl` wrote."""

    out_dir: Path
    """The export folder."""
    overrides: list[str]
    """The ``main_ppo`` overrides that train on it."""
    files: dict[str, str]
    """What each file is, by its name."""
    rows: dict[str, int]
    """Rows per parquet file."""
    warnings: list[str] = field(default_factory=list)
    """E.g. train and test rows that are the same tasks."""


def _refuse_multi_turn(cfg: Any, env: Any) -> None:
    """Refuse what verl's reward function cannot grade: an episode of several policy turns."""
    from lrmgym.configs.errors import ConfigError
    from lrmgym.core import learner_env
    from lrmgym.envs.tools import ToolUseEnv

    if isinstance(getattr(env, "unwrapped", env), ToolUseEnv):
        raise ConfigError(
            f"env: {cfg.env.id} calls tools between policy turns; verl's tool agent loop could run the tool, but its "
            "reward function is handed the whole decoded response, tool responses included and without turn "
            "boundaries, so it cannot grade only the turn without a tool call (a tool that prints an answer would be "
            "paid as the policy's). Train it with `lrmgym run`, or `lrmgym export openrlhf` (its agent_func.py grades "
            "each turn)."
        )
    turns = learner_env(env).max_turns
    if turns > 1:
        raise ConfigError(
            f"env: {cfg.env.id} is multi-turn here (up to {turns} policy turns, with the env's feedback between them), "
            "but a verl custom reward function grades one response, not a conversation with the env. Set "
            "env.max_turns=1 where the env has it, or train it with `lrmgym run` or `lrmgym export openrlhf`."
        )


def export_verl(
    cfg: Any,
    out_dir: str | os.PathLike,
    *,
    n_train: int = 1024,
    n_test: int | None = None,
    force: bool = False,
    version: str = "",
) -> VerlExport:
    """Write verl's data and reward for ``cfg``'s env and judges into ``out_dir``, all or nothing.

    ``train.parquet`` holds tasks ``0 .. n_train - 1`` of the env as configured (its own split), stream
    ``cfg.run.seed``; ``test.parquet`` the held-out tasks ``lrmgym eval`` picks (the env rebuilt with
    ``cfg.eval.split``, tasks ``0 .. n_test - 1`` of stream ``cfg.eval.seed``, fewer when a data set is smaller).
    Each row: ``data_source`` (``lrmgym/<env>``), ``prompt`` (chat messages), ``ability``, ``reward_model``
    (``{"style": "rule", "ground_truth": <reference answer as text>}``) and ``extra_info`` (``split``, ``index``,
    ``seed``, ``label``, ``task_id``). Everything is written into a temporary sibling renamed into place at the
    end (as ``lrmgym export openrlhf`` does); on any failure ``out_dir`` is left as it was.

    Args:
        cfg: A resolved :class:`~lrmgym.configs.schema.RunConfig` (its env, judge, run.seed and eval sections).
        out_dir: The export folder: new, or empty, or (with ``force``) replaced.
        n_train: Training rows (at least 1).
        n_test: Test rows; ``None``: ``cfg.eval.tasks``.
        force: Replace a non-empty ``out_dir``.
        version: lrmgym's version, recorded in ``export.json``.

    Raises:
        ConfigError: A multi-turn env (before anything is written).
        ExportError: ``out_dir`` is a file, or not empty without ``force``.
        ValueError: A row count that is not a positive integer.
    """
    from pydantic import BaseModel

    from lrmgym.eval.runner import select_tasks
    from lrmgym.integrations.openrlhf_launch import _swap_into_place, check_out_dir

    for name, value in (("n_train", n_train), ("n_test", n_test)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    n_test = int(cfg.eval.tasks) if n_test is None else n_test
    out_dir = Path(out_dir)
    env_data = cfg.env.model_dump(mode="json")
    judge_data = {name: j.model_dump(mode="json") for name, j in cfg.judge.items()}
    group_aware = bool(group_judges(judge_data))
    source = f"lrmgym/{datasource_name(cfg.env.id)}"
    seed, eval_seed = int(cfg.run.seed), int(cfg.eval.seed)
    env = cfg.env.make().unwrapped
    opened = [env]
    tmp: Path | None = None
    try:
        _refuse_multi_turn(cfg, env)  # every refusal before anything is written
        check_out_dir(out_dir, force)
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = out_dir.with_name(f".{out_dir.name}.tmp-{uuid.uuid4().hex[:8]}")
        tmp.mkdir()
        train = [(i, env.task_at(i, seed=seed)) for i in range(n_train)]
        train_rows = _rows(train, lambda i: encode_label(env_data, i, seed), source, "train", seed)
        _write_parquet(tmp / TRAIN_FILE, train_rows)
        grader, tasks = select_tasks(env, cfg.eval.model_copy(update={"tasks": n_test}))
        opened.append(grader)
        options = getattr(grader, "config", None)  # the env's options with the eval split applied
        eval_env = {**env_data, **(options.model_dump(mode="json") if isinstance(options, BaseModel) else {})}
        eval_env["id"] = cfg.env.id
        eval_label = lambda i: encode_label(eval_env, i, eval_seed)  # noqa: E731
        test_rows = _rows(list(enumerate(tasks)), eval_label, source, "test", eval_seed)
        _write_parquet(tmp / TEST_FILE, test_rows)
        overrides = verl_overrides(out_dir, group_aware)
        text = _REWARD_TEMPLATE.format(
            env_id=cfg.env.id, judges=", ".join(judge_data) or "none (the env's verifier)", version=version or "?",
            overrides=" \\\n    ".join(overrides),
            settings=json.dumps(json.dumps({"label_version": LABEL_VERSION, "env": env_data, "judge": judge_data},
                                           sort_keys=True)),
        )  # fmt: skip
        (tmp / REWARD_FILE).write_text(text, encoding="utf-8")
        files = {
            TRAIN_FILE: "training prompts (data.train_files)",
            TEST_FILE: "held-out prompts (data.val_files)",
            REWARD_FILE: "the reward function (custom_reward_function.path)",
            EXPORT_FILE: "this record",
        }
        warnings = []
        if eval_env == env_data and eval_seed == seed:
            warnings.append(
                f"train and test rows are the same tasks: both come from split {env_data.get('split', '(none)')!r} "
                f"with seed {seed}. Set env.split=train (or another run.seed / eval.seed) to hold the test tasks out."
            )
        rows = {TRAIN_FILE: len(train_rows), TEST_FILE: len(test_rows)}
        record = {
            "lrmgym": version,
            "label_version": LABEL_VERSION,
            "env": env_data,
            "judge": judge_data,
            "group_aware": group_aware,
            "overrides": overrides,
            "files": files,
            "rows": rows,
            "warnings": warnings,
        }
        (tmp / EXPORT_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        _swap_into_place(tmp, out_dir, force)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        for made in {id(e): e for e in opened}.values():  # the env, and the one rebuilt for the eval split
            close = getattr(made, "close", None)
            if callable(close):
                close()
    return VerlExport(out_dir=out_dir, overrides=overrides, files=files, rows=rows, warnings=warnings)
