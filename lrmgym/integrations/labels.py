"""Task labels: one JSON string that names a task, from which a remote process rebuilds it.

A trainer outside lrmgym (OpenRLHF, verl, or any client of ``lrmgym serve``) holds prompts and opaque labels,
samples completions, and asks for rewards. The label is what lets that happen anywhere lrmgym is installed::

    {"v": 1, "env": {"id": "lrmgym/Math-v0", "difficulty": 1, "split": "train", ...}, "index": 17, "seed": 0}

``env`` is the env's id and its *task* options (which problems, how the prompt reads: difficulty, split, order,
template...), and the task is ``env.task_at(index, seed)``: a pure function of the two numbers (see
:class:`lrmgym.core.TextEnv`). The label is a JSON *string*, not an object, because Hugging Face ``datasets``
(which OpenRLHF reads the data with) coerces an object column into one struct schema across rows. A *short* label
``{"v": 1, "index": i, "seed": s}`` names a task of an env known from elsewhere (a server started with ``env=...``).

A label carries the task, never a setting. Labels come from data rows and HTTP clients, so none of them may choose
the sandbox, a time or memory bound, a worker count, a file or folder, or an endpoint: :func:`decode_label` refuses
every env option of :data:`SETTING_KEYS` (and every key shaped like one, :func:`setting_keys`) and any ``judge``
(judges hold LLM endpoints, timeouts and workers) in one :class:`LabelError`, before anything is built or read.
:func:`encode_label` leaves them out. The settings come from the exporter's config, which ``lrmgym export``
writes into the plug-in it generates (OpenRLHF's ``reward_func.py`` / ``agent_func.py``, verl's ``reward.py``)
and which those files give to a :class:`Scorer` (``Scorer(env, judge)``), or from the server's own ``env=...
judge=...``. A scorer with no such config (``Scorer()``) builds a label's task with this process's defaults for
every setting (the env's verifier alone, the default sandbox and bounds), so procedural envs only: a data set is
named by its ``source``, a setting.

What the label assumes: the remote side has the same lrmgym (label format ``v`` 1), and, with the exporter's config,
the data files it names (paths are resolved there).

:class:`Scorer` grades ``(label, completion)`` items: it builds each distinct env + judges once (a
:class:`World`), groups the items of one task so that group-aware judges (the arena) see them together, and
returns per item a :class:`Score`: ``reward`` (the judged verdict's score), ``score`` (0..1: correctness) and
``extra_logs`` (numbers: each judge's component). It never raises for model output: a huge, binary or looping
completion gets the verifiers' own wall-clock bounds, and a verdict that cannot be graded becomes the env's
failure value with ``verdict/ungradeable = 1`` (a trainer outside lrmgym cannot mask a sample out).

:func:`write_data` writes the prompt files (``train.jsonl``, ``eval.jsonl``) whose rows carry these labels.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from lrmgym.core import Completion, Task, Verdict, learner_env

__all__ = [
    "DEFAULT_STOP_TEXTS",
    "LABEL_VERSION",
    "Label",
    "LabelError",
    "SETTING_KEYS",
    "Score",
    "Scorer",
    "World",
    "completion_from_query",
    "datasource_name",
    "decode_label",
    "encode_label",
    "group_judges",
    "setting_keys",
    "short_label",
    "strip_stop_texts",
    "task_options",
    "write_data",
]

LABEL_VERSION = 1
"""The label format this lrmgym writes and reads."""
MAX_LABEL_CHARS = 256 * 1024
"""Longest label accepted (a label holds configs, never data; a real one is well under 4 KiB)."""
MAX_COMPLETION_CHARS = 16 * 1024 * 1024
"""Default cap of :class:`Scorer`: a longer completion scores the env's failure value without being graded."""
DEFAULT_STOP_TEXTS = (
    "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<|end|>", "<end_of_turn>", "</s>", "<eos>",
    "<pad>", "<|pad|>", "<|finetune_right_pad_id|>",
)  # fmt: skip
"""End-of-sequence and padding texts of common tokenizers, removed from the end of a completion."""
GROUP_JUDGE_KINDS = frozenset({"arena", "llm_pairwise", "rule_pairwise"})
"""Judge kinds that compare the completions of a group: with one completion they cannot do their job."""
_PROMPT_TAIL_CHARS = 256
_LABEL_KEYS = ("v", "env", "index", "seed")
SETTING_KEYS = frozenset({
    # isolation of the code sandbox, and the interpreter it runs
    "sandbox", "warm_sandbox", "python",
    # time, memory, output and size bounds of the verifiers (code sandbox, math checker)
    "timeout_s", "memory_mb", "output_bytes", "max_code_chars", "max_answer_chars",
    # processes and threads
    "workers",
    # files and folders: a data set (a named one or a path), its folder, the 24 puzzles' file
    "source", "data_dir", "data_path",
    # how grading treats the answer: strictness, and what multi-turn feedback reveals (full: the expected values)
    "strict", "feedback", "feedback_chars",
})  # fmt: skip
"""Env options that are settings, not the task, in lrmgym's own envs: a label may not carry them."""
_SETTING_SUFFIXES = ("_s", "_ms", "_mb", "_gb", "_bytes", "_chars", "_dir", "_path", "_file", "_url", "_env", "_key")
_SETTING_WORDS = ("sandbox", "timeout", "memory", "worker", "thread", "python", "path", "url", "endpoint", "model",
                  "api_key", "token", "secret", "source")  # fmt: skip


class LabelError(ValueError):
    """A label that cannot be used; the message names the label, the bad value and how to fix it."""


def _show(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _dump(config: Any, what: str) -> dict[str, Any]:
    """A config (pydantic model or mapping) as plain JSON data."""
    if isinstance(config, BaseModel):
        return config.model_dump(mode="json")
    if isinstance(config, Mapping):
        return json.loads(json.dumps(dict(config), allow_nan=False))
    raise LabelError(f"{what}: expected a config (a pydantic model or a mapping), got {type(config).__name__}.")


def _canonical(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def setting_keys(options: Iterable[str]) -> list[str]:
    """The keys among env ``options`` that are settings, not the task (sorted): a label may not carry them.

    :data:`SETTING_KEYS` lists those of lrmgym's own envs; so that a plug-in env's (or a new) option shaped like a
    bound, a path or an endpoint is refused too, a key that ends in a unit or path suffix (``_s``, ``_mb``,
    ``_bytes``, ``_chars``, ``_dir``, ``_path``, ``_url``...) or contains one of ``sandbox``, ``timeout``,
    ``memory``, ``worker``, ``python``, ``path``, ``url``, ``model``, ``source``... counts as one.
    """
    out = []
    for key in options:
        name = str(key).lower()
        if key in SETTING_KEYS or name.endswith(_SETTING_SUFFIXES) or any(w in name for w in _SETTING_WORDS):
            out.append(str(key))
    return sorted(out)


def task_options(env: Mapping[str, Any]) -> dict[str, Any]:
    """An env config (``{"id": ..., options}``) without its settings (:func:`setting_keys`): what a label carries."""
    drop = set(setting_keys(k for k in env if k != "id"))
    return {k: v for k, v in env.items() if k not in drop}


def _non_negative_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise LabelError(f"{where}: expected a non-negative integer, got {_show(value)}.")
    return value


# --------------------------------------------------------------------------------------------------- the label
@dataclass(frozen=True)
class Label:
    """A decoded label: which task, and (for a full label) which env and task options.

    Attributes:
        index: The task's index in its stream.
        seed: The stream's seed (``env.task_at(index, seed)``).
        env: The env's id and task options (``{"id": ..., options}``, no setting), or ``None`` for a short label.
    """

    index: int
    seed: int
    env: dict[str, Any] | None = None

    @property
    def short(self) -> bool:
        """Whether the label names only the task (the env comes from the scorer)."""
        return self.env is None

    def encode(self) -> str:
        """The label as the JSON string datasets carry."""
        if self.env is None:
            return short_label(self.index, self.seed)
        return encode_label(self.env, self.index, self.seed)


def encode_label(env: Any, index: int, seed: int) -> str:
    """The label of task ``index`` of stream ``seed`` of ``env``, as a JSON string.

    The label holds the env's id and its task options only: every setting (:func:`setting_keys`: sandbox, bounds,
    workers, files) is left out, for the scorer to take from the exporter's config.

    Args:
        env: The env config: a :class:`~lrmgym.configs.schema.EnvConfig` or its dump ``{"id": ..., options}``.
        index: The task's index (non-negative).
        seed: The stream's seed (non-negative).

    Raises:
        LabelError: A value of the wrong type, naming it.
    """
    env_data = _dump(env, "env")
    if not isinstance(env_data.get("id"), str):
        raise LabelError(f"env: the config has no 'id' string (got {_show(env_data.get('id'))}); give an EnvConfig.")
    data = {
        "v": LABEL_VERSION,
        "env": task_options(env_data),
        "index": _non_negative_int(index, "index"),
        "seed": _non_negative_int(seed, "seed"),
    }
    return _canonical(data)


def short_label(index: int, seed: int) -> str:
    """A label that names only a task, for a scorer (a server) that knows its env: ``{"v":1,"index":..,"seed":..}``."""
    index, seed = _non_negative_int(index, "index"), _non_negative_int(seed, "seed")
    return _canonical({"v": LABEL_VERSION, "index": index, "seed": seed})


def decode_label(text: Any, where: str = "label") -> Label:
    """Parse a label (its JSON string, or the already-parsed mapping); ``where`` prefixes error messages.

    Nothing is built and no file is read here: a label that carries a setting (:func:`setting_keys`) or judges is
    refused as it is parsed.

    Raises:
        LabelError: The label is empty, not JSON, not an object, of another format version, a field has the
            wrong type, or it carries settings or judges; the message names the field and the value.
    """
    if isinstance(text, Label):
        return text
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if isinstance(text, str):
        if not text.strip():
            raise LabelError(
                f"{where}: the label is empty. Give each row the label `lrmgym export openrlhf` wrote (OpenRLHF: "
                '--data.label_key label), or a short label {"v": 1, "index": I, "seed": S} for a server '
                "started with env=..."
            )
        if len(text) > MAX_LABEL_CHARS:
            raise LabelError(f"{where}: the label is {len(text)} characters, over the limit of {MAX_LABEL_CHARS}.")
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as err:
            raise LabelError(f"{where}: not a JSON label ({type(err).__name__}: {err}); got {_show(text)}.") from None
    elif isinstance(text, Mapping):
        data = dict(text)
    else:
        raise LabelError(f"{where}: expected a label string (JSON), got {type(text).__name__}: {_show(text)}.")
    if not isinstance(data, dict):
        raise LabelError(f"{where}: expected a JSON object, got {type(data).__name__}: {_show(data)}.")
    if "judge" in data:
        raise LabelError(
            f"{where}.judge: a label names its task, never its judges (LLM endpoints, models, timeouts, workers): "
            "they come from the exporter's config (the plug-in file `lrmgym export` wrote) or the server's judge=...; "
            "export the data again with this lrmgym."
        )
    unknown = sorted(str(k) for k in data if k not in _LABEL_KEYS)
    if unknown:
        raise LabelError(f"{where}.{unknown[0]}: unknown key; a label has only {', '.join(_LABEL_KEYS)}.")
    version = data.get("v")
    if version != LABEL_VERSION:
        raise LabelError(
            f"{where}.v: label format {_show(version)} is not the one this lrmgym reads ({LABEL_VERSION}); "
            "regenerate the data with this lrmgym (`lrmgym export openrlhf`) or install the lrmgym that wrote it."
        )
    for key in ("index", "seed"):
        if key not in data:
            raise LabelError(f"{where}.{key}: missing; a label names its task by index and seed.")
    index = _non_negative_int(data["index"], f"{where}.index")
    seed = _non_negative_int(data["seed"], f"{where}.seed")
    env = data.get("env")
    if env is None:
        return Label(index=index, seed=seed)
    if not isinstance(env, dict) or not isinstance(env.get("id"), str):
        raise LabelError(f"{where}.env: expected an env config object with an 'id' string, got {_show(env)}.")
    settings = setting_keys(k for k in env if k != "id")
    if settings:
        raise LabelError(
            f"{where}.env: {', '.join(settings)}: a label names its task, never a setting (sandbox, time and memory "
            "bounds, workers, files, endpoints); those come from the exporter's config (the plug-in file `lrmgym "
            "export` wrote) or the server's env=... options. Remove them from the label, or export the data again "
            "with this lrmgym."
        )
    return Label(index=index, seed=seed, env=env)


def group_judges(judge: Mapping[str, Any]) -> list[str]:
    """The names of the judges, in a ``{name: config}`` mapping, that need a whole group to score."""
    out = []
    for name, cfg in judge.items():
        kind = cfg.get("kind") if isinstance(cfg, Mapping) else getattr(cfg, "kind", None)
        if kind in GROUP_JUDGE_KINDS:
            out.append(str(name))
    return out


# --------------------------------------------------------------------------------------------------- completions
def strip_stop_texts(text: str, stop_texts: Iterable[str] = DEFAULT_STOP_TEXTS) -> str:
    """``text`` without the end-of-sequence / padding texts (and whitespace between them) at its end.

    Whitespace is removed only where a stop text follows it, so a completion's own trailing newline stays.
    """
    stops = tuple(s for s in stop_texts if s)
    while True:
        trimmed = text.rstrip()
        for stop in stops:
            if trimmed.endswith(stop):
                text = trimmed[: -len(stop)]
                break
        else:
            return text


def completion_from_query(
    query: str, prompt: str | None, stop_texts: Iterable[str] = DEFAULT_STOP_TEXTS
) -> tuple[str, bool]:
    """The completion inside an OpenRLHF query, and whether the prompt was found in it.

    OpenRLHF's query is ``decode(prompt_ids + response_ids)`` with special tokens kept. The completion is what
    follows the prompt: ``query[len(prompt):]`` when the query starts with the prompt; after the prompt's first
    occurrence when text (a BOS) precedes it; after the first occurrence of the prompt's last 256 characters when
    the prompt was cut on the left (OpenRLHF left-truncates prompts that leave no room to generate). If none of
    these is found, the whole query is the completion and the second value is ``False`` (scorers log it as
    ``verdict/prompt_not_found``). Stop texts at the end are removed (:func:`strip_stop_texts`).
    """
    found = True
    if not prompt:
        text = query
    elif query.startswith(prompt):
        text = query[len(prompt) :]
    else:
        at = query.find(prompt)
        if at >= 0:
            text = query[at + len(prompt) :]
        else:
            tail = prompt[-_PROMPT_TAIL_CHARS:]
            at = query.find(tail) if len(tail) == _PROMPT_TAIL_CHARS else -1
            text, found = (query[at + len(tail) :], True) if at >= 0 else (query, False)
    return strip_stop_texts(text, stop_texts), found


def _clean_text(text: Any) -> str:
    """Model output as a ``str`` the verifiers and the sandbox can encode (lone surrogates replaced)."""
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", errors="replace").decode("utf-8")
    return text


# --------------------------------------------------------------------------------------------------- scores
@dataclass(frozen=True)
class Score:
    """What a remote trainer gets for one completion.

    Attributes:
        reward: The judged verdict's score (the env's failure value when ungradeable): the advantage input.
        score: 0..1 for dynamic filtering and pass rates: 1/0 from ``verdict.correct``, else the reward clipped.
        extra_logs: Numbers to log, the same keys for every item of one env + judges: ``judge/<name>`` (each
            judge's component), ``verdict/correct``, ``verdict/format_ok``, ``verdict/ungradeable``,
            ``verdict/oversize`` and ``verdict/prompt_not_found``.
        verdict: The verdict behind the numbers.
    """

    reward: float
    score: float
    extra_logs: dict[str, float] = field(default_factory=dict)
    verdict: Verdict | None = None

    def to_dict(self) -> dict[str, Any]:
        """``{"reward", "score", "extra_logs"}`` as JSON data."""
        return {"reward": self.reward, "score": self.score, "extra_logs": dict(self.extra_logs)}


def _finite(value: float | None, default: float) -> float:
    if value is None or isinstance(value, bool):
        return default
    try:
        value = float(value)
    except (TypeError, ValueError):
        return default
    return value if math.isfinite(value) else default


# --------------------------------------------------------------------------------------------------- worlds
def _normalise(env: Mapping[str, Any], judge: Mapping[str, Any], where: str) -> tuple[Any, dict[str, Any]]:
    """Validate an env config and judge configs as ``lrmgym run`` does: ``(EnvConfig, {name: judge config})``."""
    from lrmgym.configs.errors import ConfigError
    from lrmgym.configs.resolve import validate_component, validate_env

    try:
        env_cfg = validate_env(dict(env))
        judges = {str(name): validate_component("judge", f"judge.{name}", dict(cfg)) for name, cfg in judge.items()}
    except ConfigError as err:
        raise LabelError(f"{where}: {err}") from None
    return env_cfg, judges


def _full_id(env_id: Any) -> Any:
    """A registered env's full id (``Math-v0`` -> ``lrmgym/Math-v0``); an unknown one as it is."""
    from lrmgym.registry import UnknownEnvError, spec

    try:
        return spec(str(env_id)).id
    except UnknownEnvError:
        return env_id


def world_key(env: Mapping[str, Any], judge: Mapping[str, Any]) -> str:
    """The identity of an env + judges: their canonical JSON."""
    return _canonical({"env": dict(env), "judge": dict(judge)})


class World:
    """One env and its judges, built once from their configs, with what grading through them needs.

    Args:
        env: The env config (an :class:`~lrmgym.configs.schema.EnvConfig` or its dump).
        judge: The judge configs by name (models or dumps); empty: the env's own verifier alone.
        max_completion_chars: Longer completions score :attr:`failure_value` without being graded.
        task_cache: Tasks kept (built tasks are reused across the G samples and the turns of an episode).
        where: What error messages call the configs (``labels[3]``).

    Attributes:
        failure_value: The reward of an ungradeable verdict: the env's ``failure_reward`` if it declares one,
            else 0.0 (what :meth:`lrmgym.core.TextEnv.step` pays for one).

    Raises:
        LabelError: A config that does not validate, with the config error's message.
    """

    def __init__(
        self,
        env: Any,
        judge: Mapping[str, Any] | None = None,
        *,
        max_completion_chars: int = MAX_COMPLETION_CHARS,
        task_cache: int = 4096,
        where: str = "config",
    ) -> None:
        from lrmgym.judges.base import check_judges

        env_data = _dump(env, "env")
        judge_data = {str(n): _dump(c, f"judge.{n}") for n, c in (judge or {}).items()}
        env_cfg, judge_cfgs = _normalise(env_data, judge_data, where)
        self.env_config: dict[str, Any] = env_cfg.model_dump(mode="json")
        self.judge_config: dict[str, dict[str, Any]] = {n: c.model_dump(mode="json") for n, c in judge_cfgs.items()}
        self.key = world_key(self.env_config, self.judge_config)
        self.group_judges = group_judges(self.judge_config)
        try:
            self.env: Any = env_cfg.make().unwrapped
        except Exception as err:  # noqa: BLE001 - a data file that went missing since validation, a sandbox
            raise LabelError(f"{where}: env {env_cfg.id} cannot be made: {type(err).__name__}: {err}") from None
        self.judges = check_judges([c.build() for c in judge_cfgs.values()]) if judge_cfgs else []
        self.judge_names = [j.name for j in self.judges]
        self.failure_value = _finite(getattr(self.env, "failure_reward", 0.0), 0.0)
        self.max_turns = learner_env(self.env).max_turns
        self.max_completion_chars = max_completion_chars
        self._tasks: OrderedDict[tuple[int, int], Task] = OrderedDict()
        self._task_cache = task_cache
        self._lock = threading.Lock()

    @property
    def env_id(self) -> str:
        """The env's registered id."""
        return str(self.env_config["id"])

    def label(self, index: int, seed: int) -> str:
        """The full label of task ``index`` of stream ``seed`` in this world (its task options, no setting)."""
        return encode_label(self.env_config, index, seed)

    def task(self, index: int, seed: int, where: str = "label") -> Task:
        """Task ``index`` of stream ``seed`` (cached); a task the env cannot build raises :class:`LabelError`."""
        key = (index, seed)
        with self._lock:
            task = self._tasks.get(key)
            if task is not None:
                self._tasks.move_to_end(key)
                return task
        try:
            task = self.env.task_at(index, seed=seed)
        except (ValueError, IndexError, KeyError, TypeError) as err:
            raise LabelError(f"{where}: {self.env_id} has no task index={index} seed={seed}: {err}") from None
        with self._lock:
            self._tasks[key] = task
            while len(self._tasks) > self._task_cache:
                self._tasks.popitem(last=False)
        return task

    # ---- grading
    def grade(self, task: Task, completions: Sequence[Completion]) -> list[Verdict]:
        """The judged verdicts of a group of completions of ``task`` (as ``lrmgym judge`` grades them); never raises.

        The env's verifier grades the group (``env.score_group``), then every judge sees the whole group
        (:func:`lrmgym.judges.base.judge_group`). An exception from either (a bug: neither may raise) makes the
        group ungradeable, with the exception in the reason.
        """
        from lrmgym.judges.base import judge_group

        completions = list(completions)
        if not completions:
            return []
        try:
            base = list(self.env.score_group(task, completions))
            if len(base) != len(completions):
                raise RuntimeError(f"score_group returned {len(base)} verdicts for {len(completions)} completions")
            return judge_group(self.judges, task, completions, base) if self.judges else base
        except Exception as err:  # noqa: BLE001 - a scorer must not crash its trainer
            reason = f"scoring failed: {type(err).__name__}: {err}"[:300]
            return [Verdict.ungradeable(reason) for _ in completions]

    def result(self, verdict: Verdict, *, oversize: bool = False, prompt_found: bool = True) -> Score:
        """A verdict as the numbers a trainer logs and trains on (see :class:`Score`)."""
        fail = self.failure_value
        ungradeable = verdict.score is None
        reward = fail if ungradeable else _finite(verdict.score, fail)
        if verdict.correct is not None:
            score = 1.0 if verdict.correct else 0.0
        else:
            score = 0.0 if ungradeable else min(1.0, max(0.0, reward))
        by_name = {c.name: c for c in verdict.components}
        logs = {f"judge/{name}": _finite(getattr(by_name.get(name), "score", None), fail) for name in self.judge_names}
        logs.update({
            "verdict/correct": float(verdict.correct is True),
            "verdict/format_ok": float(verdict.format_ok is not False),
            "verdict/ungradeable": float(ungradeable),
            "verdict/oversize": float(oversize),
            "verdict/prompt_not_found": float(not prompt_found),
        })  # fmt: skip
        return Score(reward=reward, score=score, extra_logs=logs, verdict=verdict)

    def score_texts(
        self,
        index: int,
        seed: int,
        texts: Sequence[str],
        prompt_found: Sequence[bool] | None = None,
        where: str = "label",
    ) -> list[Score]:
        """Score completions of one task as one group; never raises for the texts (see :meth:`grade`).

        Raises:
            LabelError: The task cannot be built (:meth:`task`).
        """
        task = self.task(index, seed, where)
        found = list(prompt_found) if prompt_found is not None else [True] * len(texts)
        cleaned = [_clean_text(t) for t in texts]
        oversize = [len(t) > self.max_completion_chars for t in cleaned]
        graded = [Completion(t) for t, big in zip(cleaned, oversize, strict=True) if not big]
        verdicts = iter(self.grade(task, graded))
        out = []
        for text, big, ok in zip(cleaned, oversize, found, strict=True):
            if big:
                reason = f"completion of {len(text)} characters, over the limit of {self.max_completion_chars}"
                verdict = Verdict(score=self.failure_value, correct=False, reason=reason, format_ok=False)
                out.append(self.result(verdict, oversize=True, prompt_found=ok))
            else:
                out.append(self.result(next(verdicts), prompt_found=ok))
        return out

    def close(self) -> None:
        """Close the env (a code env stops its sandbox pool, killing whatever still runs)."""
        close = getattr(self.env, "close", None)
        if callable(close):
            close()


# --------------------------------------------------------------------------------------------------- the scorer
@dataclass(frozen=True)
class Item:
    """One decoded ``(label, completion)`` item: its world, its task and its text."""

    world: World
    index: int
    seed: int
    text: str
    prompt_found: bool = True

    @property
    def group_key(self) -> tuple[str, int, int]:
        """Items with the same key are completions of the same task."""
        return (self.world.key, self.index, self.seed)


class Scorer:
    """Scores ``(label, completion)`` items, building each distinct env + judges once.

    Two modes:

    - ``Scorer(env, judge)`` (``lrmgym serve``, and the plug-ins ``lrmgym export`` writes, with the exporter's
      config): one world, fixed when the scorer is made. A short label names a task of it; a full label's task
      options must be this env's, else it is refused, except that its ``env.split`` may differ (the eval rows of
      :func:`write_data` carry the held-out split): that variant is the fixed config with the label's split, every
      setting (sandbox, bounds, files) and the judges staying the fixed ones.
    - ``Scorer()``: every label is a full label and the worlds are built from the labels' task options (at most
      ``max_worlds`` distinct ones), with this process's defaults for every setting and no judge.

    Either way a label never chooses a setting: :func:`decode_label` refuses one before anything is built, so no
    label (a data row, an HTTP client) can pick, say, a code sandbox without isolation (``sandbox: process``), a
    bound, or a data file on the machine.

    Args:
        env: The fixed env config (an :class:`~lrmgym.configs.schema.EnvConfig` or its dump), or ``None``.
        judge: The fixed judge configs by name, with ``env``.
        max_worlds: Most distinct env + judges built from labels (open mode).
        max_completion_chars: Longer completions score the failure value without being graded.

    Raises:
        LabelError: The fixed configs do not validate.
    """

    def __init__(
        self,
        env: Any = None,
        judge: Mapping[str, Any] | None = None,
        *,
        max_worlds: int = 8,
        max_completion_chars: int = MAX_COMPLETION_CHARS,
    ) -> None:
        self.max_worlds = max_worlds
        self.max_completion_chars = max_completion_chars
        self._worlds: dict[str, World] = {}
        self._keys: dict[str, str] = {}  # raw label configs (canonical JSON) -> world key, or the error message
        self._lock = threading.Lock()
        self.fixed: World | None = None
        if env is not None:
            self.fixed = World(env, judge, max_completion_chars=max_completion_chars)
            self._worlds[self.fixed.key] = self.fixed
        elif judge:
            raise LabelError("judge: a scorer with fixed judges needs the env too (Scorer(env, judge)).")

    @property
    def worlds(self) -> list[World]:
        """The worlds built so far."""
        with self._lock:
            return list(self._worlds.values())

    def world(self, label: Label, where: str = "label") -> World:
        """The world a decoded label scores in (built on first use); raises :class:`LabelError`."""
        if label.env is None:
            if self.fixed is None:
                raise LabelError(
                    f"{where}: a short label (index and seed only) needs a scorer with a fixed env, such as a "
                    "server started with env=...; give the full label `lrmgym export openrlhf` writes."
                )
            return self.fixed
        raw = _canonical(label.env)
        with self._lock:
            key = self._keys.get(raw)
            world = self._worlds.get(key) if key is not None else None
        if world is not None:
            return world
        if self.fixed is not None:
            return self._match_fixed(raw, label, where)
        with self._lock:  # built under the lock: two threads must not build (and leak) the same env twice
            key = self._keys.get(raw)
            if key is not None and key in self._worlds:
                return self._worlds[key]
            if len(self._worlds) >= self.max_worlds:
                raise LabelError(
                    f"{where}: this label's env and judges would be distinct config number {len(self._worlds) + 1}; "
                    f"a scorer builds at most {self.max_worlds} (max_worlds). Split the data per env."
                )
            world = World(label.env, {}, max_completion_chars=self.max_completion_chars, where=where)
            existing = self._worlds.get(world.key)
            if existing is not None:  # the same configs, spelled differently
                world.close()
                world = existing
            self._worlds[world.key] = world
            self._keys[raw] = world.key
            return world

    def _match_fixed(self, raw: str, label: Label, where: str) -> World:
        """The fixed world, or its variant on another ``split`` (the eval rows), for a full label that names it.

        The label's task options are laid over the fixed config (whose settings the label cannot carry), and the
        result may differ from the fixed config in ``split`` only.
        """
        assert self.fixed is not None
        ours = self.fixed.env_config
        judges = self.fixed.judge_config
        if label.env is not None and _full_id(label.env.get("id")) != ours["id"]:
            theirs: dict[str, Any] = {"id": label.env.get("id")}
            diff = ["id"]
        else:
            theirs = _normalise({**ours, **(label.env or {})}, {}, where)[0].model_dump(mode="json")
            diff = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
        if diff not in ([], ["split"]):
            raise LabelError(
                f"{where}: the label describes another env than this one (env option(s) {', '.join(diff)} differ; "
                f"this scorer has {self.fixed.env_id} with judges {sorted(judges) or 'none'}, and accepts another "
                "env.split only). Start the server with the env=... the data was exported with (or use the plug-in "
                'file exported with the data), or send short labels {"v":1,"index":I,"seed":S}.'
            )
        key = world_key(theirs, judges)
        with self._lock:  # the held-out split of the same env (eval rows): a variant the server builds itself
            world = self._worlds.get(key)
            if world is None:
                if len(self._worlds) >= self.max_worlds:
                    raise LabelError(f"{where}: too many env variants (max_worlds={self.max_worlds}).")
                world = World(theirs, judges, max_completion_chars=self.max_completion_chars, where=where)
                self._worlds[key] = world
            self._keys[raw] = key
        return world

    def prepare(
        self,
        labels: Sequence[Any],
        texts: Sequence[str],
        prompt_found: Sequence[bool] | None = None,
        where: str = "labels",
    ) -> list[Item]:
        """Decode every label and find its world: one :class:`Item` per completion.

        Raises:
            LabelError: A label is unusable; the message names it as ``labels[i]``.
        """
        if len(labels) != len(texts):
            raise LabelError(f"{where}: {len(labels)} labels for {len(texts)} completions; give one label each.")
        found = list(prompt_found) if prompt_found is not None else [True] * len(texts)
        items = []
        for i, (raw, text) in enumerate(zip(labels, texts, strict=True)):
            label = decode_label(raw, f"{where}[{i}]")
            world = self.world(label, f"{where}[{i}]")
            items.append(Item(world, label.index, label.seed, text, found[i]))
        return items

    @staticmethod
    def groups(items: Sequence[Item]) -> dict[tuple[str, int, int], list[int]]:
        """The positions of the items of each task, in order of first appearance."""
        out: dict[tuple[str, int, int], list[int]] = {}
        for i, item in enumerate(items):
            out.setdefault(item.group_key, []).append(i)
        return out

    @staticmethod
    def score_group(items: Sequence[Item], where: str = "labels") -> list[Score]:
        """Score items of one task (same :attr:`Item.group_key`) as one group."""
        first = items[0]
        return first.world.score_texts(
            first.index, first.seed, [it.text for it in items], [it.prompt_found for it in items], where
        )

    def score_items(self, items: Sequence[Item]) -> list[Score]:
        """Score prepared items, each task's items as one group, one after the other; results in item order."""
        out: list[Score | None] = [None] * len(items)
        for positions in self.groups(items).values():
            for pos, result in zip(positions, self.score_group([items[p] for p in positions]), strict=True):
                out[pos] = result
        return out  # type: ignore[return-value]

    def score(
        self, labels: Sequence[Any], texts: Sequence[str], prompt_found: Sequence[bool] | None = None
    ) -> list[Score]:
        """Score ``texts[i]`` as a completion of the task ``labels[i]`` names; results in order.

        Items of the same task are graded as one group. Never raises for the texts.

        Raises:
            LabelError: A label is unusable (see :meth:`prepare`).
        """
        return self.score_items(self.prepare(labels, texts, prompt_found))

    def close(self) -> None:
        """Close every world's env (sandbox pools), then the math verifier's worker processes."""
        with self._lock:
            worlds, self._worlds, self._keys = list(self._worlds.values()), {}, {}
        for world in worlds:
            world.close()
        from lrmgym.envs.math.verify import shutdown_pools

        shutdown_pools()


# --------------------------------------------------------------------------------------------------- data files
def datasource_name(env_id: str) -> str:
    """The short env name OpenRLHF reports eval metrics under: ``lrmgym/Math-v0`` -> ``math``."""
    name = env_id.rsplit("/", 1)[-1]
    return re.sub(r"-v\d+$", "", name).lower() or name


def _eval_env_config(grader: Any, env_id: str) -> dict[str, Any]:
    options = getattr(grader, "config", None)
    dumped = options.model_dump(mode="json") if isinstance(options, BaseModel) else {}
    return {"id": env_id, **dumped}


def write_data(cfg: Any, out_dir: str | Path, n_train: int, n_eval: int | None = None) -> dict[str, Any]:
    """Write ``train.jsonl`` and ``eval.jsonl``: one ``{"prompt", "label", "datasource"}`` row per task.

    Train rows are tasks ``0 .. n_train - 1`` of the env as configured (its own split), stream ``cfg.run.seed``.
    Eval rows are the held-out tasks ``lrmgym eval`` would pick (:func:`lrmgym.eval.runner.select_tasks`): the
    env rebuilt with ``cfg.eval.split``, tasks ``0 .. n_eval - 1`` of stream ``cfg.eval.seed`` (fewer when a data
    set is smaller); their labels carry that split. ``prompt`` is the task's prompt (text, or chat messages for
    ``--data.apply_chat_template``). Files are written atomically.

    Args:
        cfg: A resolved :class:`~lrmgym.configs.schema.RunConfig`.
        out_dir: The folder to write into (created).
        n_train: Train rows (at least 1).
        n_eval: Eval rows; ``None``: ``cfg.eval.tasks``; 0: no eval file.

    Returns:
        ``{"train": path, "eval": path or None, "train_rows", "eval_rows", "datasource", "warnings"}``;
        a warning says when the train and eval rows come from the same split and seed (the same tasks).
    """
    from lrmgym.eval.runner import select_tasks
    from lrmgym.files import atomic_write

    if isinstance(n_train, bool) or not isinstance(n_train, int) or n_train < 1:
        raise ValueError(f"n_train must be a positive integer, got {n_train!r}.")
    n_eval = int(cfg.eval.tasks) if n_eval is None else n_eval
    if isinstance(n_eval, bool) or not isinstance(n_eval, int) or n_eval < 0:
        raise ValueError(f"n_eval must be a non-negative integer (0: no eval file), got {n_eval!r}.")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    env_data = cfg.env.model_dump(mode="json")
    env = cfg.env.make().unwrapped
    source = datasource_name(cfg.env.id)
    seed = int(cfg.run.seed)

    def rows(tasks: Iterable[tuple[int, Task]], labels: Any) -> Any:
        def write(fh: Any) -> None:
            for index, task in tasks:
                row = {"prompt": task.prompt, "label": labels(index), "datasource": source}
                fh.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8", "surrogatepass"))

        return write

    result: dict[str, Any] = {"train": out / "train.jsonl", "eval": None, "train_rows": n_train, "eval_rows": 0,
                              "datasource": source, "warnings": []}  # fmt: skip
    try:
        train = ((i, env.task_at(i, seed=seed)) for i in range(n_train))
        atomic_write(result["train"], rows(train, lambda i: encode_label(env_data, i, seed)))
        if n_eval:
            grader, tasks = select_tasks(env, cfg.eval.model_copy(update={"tasks": n_eval}))
            eval_env = _eval_env_config(grader, cfg.env.id)
            eval_seed = int(cfg.eval.seed)
            result["eval"] = out / "eval.jsonl"
            result["eval_rows"] = len(tasks)
            labelled = list(enumerate(tasks))
            atomic_write(result["eval"], rows(labelled, lambda i: encode_label(eval_env, i, eval_seed)))
            if eval_env == env_data and eval_seed == seed:
                result["warnings"].append(
                    f"train and eval rows are the same tasks: both come from split "
                    f"{env_data.get('split', '(none)')!r} with seed {seed}. Set env.split=train (or another run.seed "
                    "/ eval.seed) to hold the eval tasks out."
                )
    finally:
        close = getattr(env, "close", None)
        if callable(close):
            close()
    return result
