"""lrmgym envs and judges as reward functions, and prompts as a data set, for TRL's ``GRPOTrainer``.

Example::

    from trl import GRPOConfig, GRPOTrainer
    from lrmgym.adapters import trl as lrmgym_trl

    trainer = GRPOTrainer(
        model="Qwen/Qwen2.5-0.5B-Instruct",
        reward_funcs=lrmgym_trl.reward_funcs(env="gsm8k", judge=["accuracy", "format_strict"]),
        train_dataset=lrmgym_trl.dataset(env="gsm8k", n=2000),
        args=GRPOConfig(output_dir="out", num_generations=8),
    )
    trainer.train()

How it maps onto TRL (read from TRL 1.16.0's ``GRPOTrainer._calculate_rewards`` and
``_generate_and_score_completions``; 1.13.0 is the same in these places):

- TRL calls every reward function with the whole generation batch of one process: ``prompts``, ``completions``,
  ``completion_ids`` and each other data-set column as a keyword list (``label=[...]``), plus ``trainer_state``,
  ``log_extra`` and ``log_metric``. Its reward is the weighted sum of the functions (``GRPOConfig.reward_weights``,
  default 1 each), with a ``None`` skipped; a row where every function returned ``None`` is left out of the group
  baseline and gets no advantage. Each function is logged as ``rewards/<its __name__>/mean`` and ``/std``.
- So :func:`reward_funcs` returns one function per judge, each returning that judge's *weighted* part of lrmgym's
  reward (``weight * score``). With the default weights TRL's ``reward`` is lrmgym's judged score (the verdict
  ``lrmgym judge`` gives), and each judge is logged apart. An ungradeable verdict (a failure that is ours: an
  endpoint down, an unparseable reference) is ``None`` from every function: TRL masks the sample out, as lrmgym's
  own learners do. ``components=False`` gives one function, ``lrmgym``, returning the judged score itself: use it
  with ``multi_objective_aggregation="normalize_then_sum"``, which normalises each function apart (a different
  objective from lrmgym's weighted sum).
- The batch is ``num_generations`` copies of each prompt, in consecutive rows; the completions are grouped by
  their ``label`` column, so group-aware judges (the arena, pairwise judges) see each prompt's whole group. TRL
  splits a group across processes when it trains on several (its ``RepeatSampler`` spreads the copies over the
  processes), so with such a judge the functions refuse to run on more than one process.
- The batch is graded once: the first function called grades it, the others read the same verdicts.
- Completions are strings, or for conversational data sets lists of messages, whose last assistant message is
  graded. Whatever the model wrote, grading never raises: the verifiers' own size caps and wall-clock bounds apply.

Multi-turn envs (code with test feedback, the 24 game in steps) are refused: TRL's ``GRPOTrainer`` has no way to
put an env's feedback text into a rollout as the next user turn. ``environment_factory`` brings an environment in
only as tools, whose results enter the rollout after a tool call the policy makes in its chat template's syntax,
and ``rollout_func`` hands the whole generation to the caller.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lrmgym.configs.errors import ConfigError, show
from lrmgym.integrations.labels import Item, LabelError, Score, Scorer, World, decode_label

__all__ = ["LABEL_KEY", "RewardFunction", "completion_text", "dataset", "resolve_configs", "reward_funcs"]

LABEL_KEY = "label"
"""The data-set column that names each row's task (a label of :mod:`lrmgym.integrations.labels`)."""
TOTAL_NAME = "lrmgym"
"""The name of the one function ``reward_funcs(components=False)`` returns."""
_SECTIONS = ("env", "judge")


# --------------------------------------------------------------------------------------------------- configs
def _set(tree: dict[str, Any], key: str, value: Any) -> None:
    path = key.replace("__", ".").split(".")
    if path[0] not in _SECTIONS or len(path) < 2 or not all(path):
        raise ConfigError(
            f"{key}: not an override of this adapter; give env.KEY=VALUE or judge.NAME.KEY=VALUE as keyword "
            "arguments, e.g. **{'env.difficulty': 2} or judge__format_strict__weight=0.5."
        )
    node = tree
    for i, part in enumerate(path[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{key}: {'.'.join(path[: i + 1])} is {show(child)}, not a section.")
        node = child
    node[path[-1]] = value


def resolve_configs(env: Any = "math", judge: Any = None, **overrides: Any) -> tuple[Any, dict[str, Any]]:
    """The validated env config and judge configs, chosen as ``lrmgym run env=... judge=...`` chooses them.

    Args:
        env: A preset name (``"math"``, ``"gsm8k"``), a registered env id, an :class:`~lrmgym.configs.schema.EnvConfig`
            or its mapping (``{"id": "lrmgym/Math-v0", "difficulty": 2}``).
        judge: ``None`` (the env's verifier alone), a preset name or a list of them (``["accuracy", "format_strict"]``;
            as with ``lrmgym run``, accuracy is added first when neither it nor the arena is listed), or judge configs
            by name (mappings or models, taken as they are).
        **overrides: Dotted settings on top, as keyword arguments: ``**{"env.difficulty": 2}``, or with ``__`` for
            the dots: ``judge__format_strict__weight=0.5``. Values are Python values (validated like YAML ones).

    Raises:
        ConfigError: An unknown preset, key or bad value, named by its dotted path.
    """
    from pydantic import BaseModel

    from lrmgym.configs.resolve import merged_tree, validate_component, validate_env

    if not isinstance(env, (str, Mapping, BaseModel)):
        raise ConfigError(f"env: expected a preset name, an env id, an EnvConfig or a mapping, got {show(env)}.")
    if judge is not None and not isinstance(judge, (str, list, tuple, Mapping)):
        raise ConfigError(f"judge: expected a preset name, a list of them or configs by name, got {show(judge)}.")
    defaults: dict[str, Any] = {"judge": []}
    if isinstance(env, str):
        defaults["env"] = env
    if judge is None or isinstance(judge, (str, list, tuple)):
        defaults["judge"] = list(judge) if isinstance(judge, tuple) else (judge or [])
    tree = merged_tree([], defaults=defaults)
    if not isinstance(env, str):
        tree["env"] = env.model_dump(mode="json") if isinstance(env, BaseModel) else dict(env)
    if isinstance(judge, Mapping):
        tree["judge"] = {
            str(n): c.model_dump(mode="json") if isinstance(c, BaseModel) else dict(c) for n, c in judge.items()
        }
    for key, value in overrides.items():
        _set(tree, key, value)
    judges_raw = tree.get("judge") or {}
    judges = {str(n): validate_component("judge", f"judge.{n}", c) for n, c in judges_raw.items()}
    return validate_env(tree.get("env")), judges


def _refuse_multi_turn(world: World) -> None:
    if world.max_turns > 1:
        raise ConfigError(
            f"env: {world.env_id} is multi-turn here (up to {world.max_turns} policy turns, with the env's feedback "
            "between them), which TRL's GRPOTrainer cannot train: it has no rollout in which an env's feedback text "
            "becomes the next user turn (environment_factory exposes an environment only as tools the policy calls, "
            "rollout_func leaves the generation to you). Set env.max_turns=1 where the env has it, or train this env "
            "with `lrmgym run` or `lrmgym export openrlhf`."
        )


# --------------------------------------------------------------------------------------------------- the data set
def dataset(
    env: Any = "math",
    n: int = 1000,
    split: str | None = None,
    seed: int = 0,
    judge: Any = None,
    **overrides: Any,
) -> Any:
    """A ``datasets.Dataset`` of tasks ``0 .. n - 1`` of stream ``seed``: columns ``prompt``, ``label``, ``task_id``.

    ``prompt`` is the task's prompt: text (TRL's standard format) or chat messages (its conversational format),
    as the env renders it. ``label`` is the task's label (:func:`lrmgym.integrations.labels.encode_label`), which
    the functions of :func:`reward_funcs` read; TRL hands every column but ``prompt`` to them as a keyword list.
    The reference answer is not a column (the label rebuilds the task, answer included).

    Args:
        env: The env, as :func:`resolve_configs` takes it.
        n: How many tasks (a finite data set's held-out split may hold fewer; the data set stops there).
        split: The env's ``split`` option (``"train"``, ``"test"``); ``None`` keeps the env's own.
        seed: The task stream.
        judge: Validated with the env (as :func:`resolve_configs` takes it) but not recorded: a label names its task
            only, and :func:`reward_funcs` grades with its own judges.
        **overrides: Dotted settings, as in :func:`resolve_configs`.

    Raises:
        ConfigError: A bad env, split or override; a multi-turn env.
        ValueError: ``n`` or ``seed`` is not a positive / non-negative integer, or the env yields no task.
    """
    from datasets import Dataset

    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}.")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}.")
    if split is not None:
        overrides = {**overrides, "env.split": split}
    env_cfg, _ = resolve_configs(env, judge, **overrides)
    world = World(env_cfg, {})
    try:
        _refuse_multi_turn(world)
        prompts, labels, ids = [], [], []
        for index in range(n):
            try:
                task = world.env.task_at(index, seed=seed)
            except IndexError:
                break
            prompts.append(task.prompt if isinstance(task.prompt, str) else [dict(m) for m in task.prompt])
            labels.append(world.label(index, seed))
            ids.append(task.id)
    finally:
        world.close()
    if not prompts:
        raise ValueError(f"{env_cfg.id} produced no tasks for split={env_cfg.options.get('split')!r}, seed={seed}.")
    return Dataset.from_dict({"prompt": prompts, LABEL_KEY: labels, "task_id": ids})


# --------------------------------------------------------------------------------------------------- grading
def completion_text(completion: Any) -> str:
    """The text to grade in one TRL completion: a string, or the last assistant message of a conversation.

    Anything else (``None``, a number, a malformed message list) becomes its string form or ``""``; never raises.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        return _content(completion.get("content"))
    if isinstance(completion, (list, tuple)):
        messages = [m for m in completion if isinstance(m, Mapping)]
        assistant = [m for m in messages if m.get("role", "assistant") == "assistant"]
        chosen = assistant or messages
        if chosen:
            return _content(chosen[-1].get("content"))
        return "".join(c for c in completion if isinstance(c, str))
    if completion is None:
        return ""
    try:
        return str(completion)
    except Exception:  # noqa: BLE001 - an object whose __str__ raises is still just a bad completion
        return ""


def _content(content: Any) -> str:
    """A message's content: text, or the text parts of a content list (``[{"type": "text", "text": ...}]``)."""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        parts = [p.get("text") if isinstance(p, Mapping) else p for p in content]
        return "".join(p for p in parts if isinstance(p, str))
    return "" if content is None else completion_text(content)


def _world_size() -> int:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a core dependency
        return 1
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class _Grader:
    """The verdicts of TRL's current batch, graded once for all the functions of one :func:`reward_funcs` call."""

    def __init__(self, scorer: Scorer, names: Sequence[str], label_key: str) -> None:
        self.scorer = scorer
        self.world: World = scorer.fixed  # type: ignore[assignment]
        self.names = tuple(names)
        self.label_key = label_key
        self._lock = threading.Lock()
        self._key: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        self._scores: list[Score] = []
        self._unread: set[str] = set()

    def scores(self, name: str, prompts: Any, completions: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Score]:
        """The batch's scores, grading it when ``name`` already read this batch (or no function did)."""
        labels = kwargs.get(self.label_key)
        if labels is None:
            raise LabelError(
                f"reward function {name!r}: no {self.label_key!r} column arrived with the completions (got "
                f"{sorted(k for k in kwargs if k not in ('trainer_state', 'log_extra', 'log_metric'))}). Train on "
                f"lrmgym.adapters.trl.dataset(...), whose {self.label_key!r} column names each row's task."
            )
        labels, completions = list(labels), list(completions)
        if len(labels) != len(completions) or (prompts is not None and len(prompts) != len(completions)):
            count = "?" if prompts is None else len(prompts)
            raise ValueError(
                f"reward function {name!r}: got {count} prompts, {len(completions)} completions and {len(labels)} "
                f"{self.label_key!r} values; TRL passes one of each per completion."
            )
        texts = [completion_text(c) for c in completions]
        key = (tuple(str(x) for x in labels), tuple(texts))
        with self._lock:
            if key == self._key and name in self._unread:
                self._unread.discard(name)
                return self._scores
            if self.world.group_judges and _world_size() > 1:
                raise RuntimeError(
                    f"judge {self.world.group_judges[0]!r} compares the completions of a prompt, but TRL spreads a "
                    f"prompt's num_generations completions over its {_world_size()} processes, so each process would "
                    "judge part of a group. Train on one process, or drop the group-aware judge."
                )
            scores = self.scorer.score_items(self._items(labels, texts))
            self._key, self._scores, self._unread = key, scores, set(self.names) - {name}
        _log(kwargs, scores)
        return scores

    def _items(self, labels: Sequence[Any], texts: Sequence[str]) -> list[Item]:
        """One item per completion; a label names its task, the env's settings and the judges are this grader's."""
        items = []
        for i, (raw, text) in enumerate(zip(labels, texts, strict=True)):
            where = f"{self.label_key}[{i}]"
            label = decode_label(raw, where)
            items.append(Item(self.scorer.world(label, where), label.index, label.seed, text))
        return items


def _log(kwargs: Mapping[str, Any], scores: Sequence[Score]) -> None:
    """Batch means TRL logs beside its own metrics (``log_metric``), and each verdict's reason (``log_extra``)."""
    log_metric, log_extra = kwargs.get("log_metric"), kwargs.get("log_extra")
    if not scores:
        return
    if callable(log_metric):
        n = len(scores)
        for key in ("verdict/correct", "verdict/format_ok", "verdict/ungradeable"):
            log_metric(f"lrmgym/{key.split('/', 1)[1]}", sum(s.extra_logs.get(key, 0.0) for s in scores) / n)
    if callable(log_extra):
        log_extra("lrmgym/reason", [(s.verdict.reason if s.verdict is not None else "")[:200] for s in scores])


class RewardFunction:
    """One reward function in TRL's signature: a judge's weighted part of the judged score, or the score itself.

    TRL names it by its ``__name__`` (``rewards/<name>/mean``). Called with ``prompts``, ``completions`` and the
    data set's ``label`` column (keyword lists), it returns one float per completion, or ``None`` where the verdict
    is ungradeable.

    Args:
        name: The judge's name, or :data:`TOTAL_NAME` (or the env's short name) for the whole score.
        grader: The shared grader of the batch.
        component: The judge whose ``weight * score`` this returns; ``None``: the verdict's score.
        carries_rest: Whether this function also returns the score of a verdict that has no judge parts (an
            oversized completion is scored without its judges), so that the functions still sum to the score.
    """

    def __init__(self, name: str, grader: _Grader, component: str | None = None, carries_rest: bool = False) -> None:
        self.__name__ = name
        self.grader = grader
        self.component = component
        self.carries_rest = carries_rest

    def __repr__(self) -> str:
        return f"<lrmgym reward function {self.__name__!r} for {self.grader.world.env_id}>"

    def close(self) -> None:
        """Close the env behind the functions (a code env's sandbox pool); they share it, so close any one."""
        self.grader.scorer.close()

    def value(self, score: Score) -> float | None:
        """This function's number for one completion's score."""
        verdict = score.verdict
        if verdict is None or verdict.score is None:
            return None
        if self.component is None:
            return float(verdict.score)
        part = next((c for c in verdict.components if c.name == self.component), None)
        if part is None or part.score is None:
            return float(verdict.score) if self.carries_rest else 0.0
        value = float(part.weight) * float(part.score)
        return value if math.isfinite(value) else None

    def __call__(
        self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] = (), **kwargs: Any
    ) -> list[float | None]:
        """TRL's call: one reward (or ``None``) per completion, in order."""
        return [self.value(s) for s in self.grader.scores(self.__name__, prompts, completions, kwargs)]


def reward_funcs(
    env: Any = "math",
    judge: Any = None,
    *,
    components: bool = True,
    label_key: str = LABEL_KEY,
    **overrides: Any,
) -> list[Callable[..., list[float | None]]]:
    """Reward functions for TRL's ``GRPOTrainer(reward_funcs=...)`` that grade with lrmgym's env and judges.

    With judges and ``components=True``: one function per judge, named after it, returning ``weight * score`` of
    that judge, so TRL's weighted sum with its default ``reward_weights`` is lrmgym's judged score and each judge
    is logged as ``rewards/<judge>/mean``. Without judges, or with ``components=False``: one function (named after
    the env's short name, or ``lrmgym``) returning the judged score. Leave ``GRPOConfig.reward_weights`` at its
    default; scaling all of them by one factor scales the reward. A verdict that cannot be graded is ``None``.

    Args:
        env: The env (preset name, id, or config), as :func:`resolve_configs` takes it.
        judge: The judges (``None``: the env's verifier alone), as :func:`resolve_configs` takes them.
        components: One function per judge (default) or a single one.
        label_key: The data-set column with the task labels.
        **overrides: Dotted settings, as in :func:`resolve_configs`.

    Returns:
        The functions; they share one grader, so each batch is graded once.

    Raises:
        ConfigError: A bad env, judge or override; a multi-turn env.
    """
    from lrmgym.integrations.labels import datasource_name

    env_cfg, judge_cfgs = resolve_configs(env, judge, **overrides)
    scorer = Scorer(env_cfg, judge_cfgs)
    world = scorer.fixed
    assert world is not None
    try:
        _refuse_multi_turn(world)
    except ConfigError:
        scorer.close()
        raise
    if components and world.judge_names:
        names = list(world.judge_names)
        grader = _Grader(scorer, names, label_key)
        return [RewardFunction(n, grader, component=n, carries_rest=i == 0) for i, n in enumerate(names)]
    name = TOTAL_NAME if world.judge_names else datasource_name(world.env_id)
    return [RewardFunction(name, _Grader(scorer, [name], label_key))]
