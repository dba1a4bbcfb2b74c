"""OpenRLHF plug-ins: the ``reward_func.py`` / ``agent_func.py`` files OpenRLHF 0.11.2 loads, and the code they run.

:func:`write_plugins` writes one small Python module per export. The module imports the installed lrmgym and holds
the exporter's env and judge configs (``SETTINGS``, fixed at export time): every row's label
(:mod:`lrmgym.integrations.labels`) names only its task, which the Ray actor that loads the file rebuilds in that
env. Every setting (the sandbox, time and memory bounds, workers, data files, judge endpoints) is the exporter's:
a label that names one is refused.

- Single-turn envs get ``reward_func.py`` (``--reward.remote_url reward_func.py``). OpenRLHF's
  ``SingleTurnAgentExecutor`` calls the module's ``reward_func(queries, prompts, labels)`` once per sample, with
  lists of length 1, in a thread (``asyncio.to_thread``), so the call may block. The completion is the query
  after the prompt (:func:`~lrmgym.integrations.labels.completion_from_query`) with end-of-sequence texts removed.
- Multi-turn envs (code with feedback, the 24 game in steps mode) get ``agent_func.py``
  (``--train.agent_func_path agent_func.py``): an ``AgentInstance`` per sample, driven by OpenRLHF's
  ``MultiTurnAgentExecutor``. Each ``step`` grades the turn in a worker thread (``asyncio.to_thread``: the sandbox,
  sympy and HTTP judges never block the actor's event loop), asks the env for feedback the way lrmgym's own
  episodes do (:func:`lrmgym.core.feedback_after`), and returns a reward such that the rewards OpenRLHF sums over
  the steps equal the latest verdict's score: the trajectory reward of :mod:`lrmgym.episodes`, also when the
  token budget ends the episode early.

Feedback and turn markers: OpenRLHF appends the feedback text to the token stream as it is (it applies no chat
template between turns). With text prompts the feedback is appended unchanged, as lrmgym's episodes do (each
env's feedback carries its own separators). With ``--data.apply_chat_template`` the feedback must open a user
turn and end with the assistant opener: :class:`TurnFormat` does that, derived from the model's tokenizer when
:func:`write_plugins` is given one (:func:`turn_format_from_tokenizer`), else recognised from the prompt at run
time (ChatML and Llama-3 templates; anything else falls back to plain text, with a warning).

Group-aware judges (the arena, pairwise judges) are refused: OpenRLHF 0.11.2 hands a plug-in one sample at a
time (see :func:`write_plugins`).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lrmgym.integrations.labels import (
    DEFAULT_STOP_TEXTS,
    LABEL_VERSION,
    Score,
    Scorer,
    World,
    completion_from_query,
    decode_label,
    group_judges,
    strip_stop_texts,
)

__all__ = [
    "OPENRLHF_VERSION",
    "AgentRuntime",
    "Episode",
    "RewardRuntime",
    "TurnFormat",
    "detect_turn_format",
    "turn_format_from_tokenizer",
    "write_plugins",
]

logger = logging.getLogger(__name__)

OPENRLHF_VERSION = "0.11.2"
"""The OpenRLHF release whose plug-in contract these files follow (``openrlhf/utils/agent.py``)."""
REWARD_FILE = "reward_func.py"
AGENT_FILE = "agent_func.py"


# --------------------------------------------------------------------------------------------------- turns
@dataclass(frozen=True)
class TurnFormat:
    """How env feedback goes between two policy turns of a transcript.

    The feedback text becomes ``[close] + before + feedback + after``, where ``close`` (the end-of-turn text) is
    added only when the policy's turn did not end with it (a turn cut at the token budget).

    Attributes:
        name: ``text`` (plain concatenation), ``chatml``, ``llama3`` or ``tokenizer`` (derived from a template).
        close: The text that ends an assistant turn (``<|im_end|>``).
        before: The text between the closed assistant turn and the feedback (a newline, then ``<|im_start|>user``).
        after: The text after the feedback: the end of the user turn and the assistant opener.
    """

    name: str = "text"
    close: str = ""
    before: str = ""
    after: str = ""

    def wrap(self, feedback: str, action_text: str) -> str:
        """The text to append after ``action_text`` so that the next turn answers ``feedback``."""
        if self.name == "text":
            return feedback
        closing = self.close if self.close and not action_text.rstrip().endswith(self.close) else ""
        return f"{closing}{self.before}{feedback}{self.after}"


TEXT = TurnFormat()
CHATML = TurnFormat("chatml", "<|im_end|>", "\n<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n")
LLAMA3 = TurnFormat(
    "llama3", "<|eot_id|>", "<|start_header_id|>user<|end_header_id|>\n\n",
    "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
)  # fmt: skip
_OPENERS = ((CHATML, ("<|im_start|>assistant\n", "<|im_start|>assistant\n<think>\n")),
            (LLAMA3, ("<|start_header_id|>assistant<|end_header_id|>\n\n",)))  # fmt: skip
_SENTINELS = ("LRMGYMUSERONE", "LRMGYMASSISTANTONE", "LRMGYMUSERTWO")


def turn_format_from_tokenizer(tokenizer: Any) -> TurnFormat | None:
    """The turn markers of a Hugging Face tokenizer's chat template; ``None`` without a usable template.

    Renders ``user, assistant, user`` with sentinel texts and the generation prompt, and reads what the template
    puts after the assistant's text: its end-of-turn text, the user opener, and after the user's text the end of
    the user turn and the assistant opener.
    """
    if not getattr(tokenizer, "chat_template", None):
        return None
    u1, a1, u2 = _SENTINELS
    messages = [{"role": "user", "content": u1}, {"role": "assistant", "content": a1}, {"role": "user", "content": u2}]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as err:  # noqa: BLE001 - a template that cannot render this conversation
        logger.warning("The chat template cannot render a user/assistant/user conversation (%s).", err)
        return None
    if not isinstance(text, str) or a1 not in text or u2 not in text.split(a1, 1)[1]:
        return None
    between, after = text.split(a1, 1)[1].split(u2, 1)
    stops = [t for t in (getattr(tokenizer, "eos_token", None), *DEFAULT_STOP_TEXTS) if isinstance(t, str) and t]
    close = next((s for s in stops if between.startswith(s)), "")
    return TurnFormat("tokenizer", close, between[len(close) :], after)


def detect_turn_format(observation: str, prompt: Any) -> TurnFormat:
    """The turn format of an OpenRLHF observation (the prompt as rendered), given the task's own prompt.

    Plain text when the observation ends with the task's text prompt, else the chat template its ending shows
    (ChatML, Llama 3); an unrecognised template falls back to plain text, with a warning.
    """
    if isinstance(prompt, str) and observation.endswith(prompt):
        return TEXT
    for fmt, openers in _OPENERS:
        if any(observation.endswith(o) for o in openers):
            return fmt
    logger.warning(
        "lrmgym agent: the prompt is not the task's text and ends in no known chat template's assistant opener; "
        "env feedback is appended as plain text. Pass the model's tokenizer to write_plugins(tokenizer=...) to "
        "wrap it in that template's turn markers."
    )
    return TEXT


# --------------------------------------------------------------------------------------------------- runtimes
def _check_version(settings: Mapping[str, Any], what: str) -> None:
    import lrmgym

    if settings.get("label_version", LABEL_VERSION) != LABEL_VERSION:
        raise RuntimeError(
            f"{what} was written for lrmgym label format {settings.get('label_version')}, but the installed lrmgym "
            f"{lrmgym.__version__} reads format {LABEL_VERSION}; regenerate the export with this lrmgym."
        )
    if settings.get("lrmgym_version") not in (None, lrmgym.__version__):
        logger.warning(
            "%s was generated by lrmgym %s; the installed lrmgym is %s.",
            what, settings.get("lrmgym_version"), lrmgym.__version__,
        )  # fmt: skip


def _tensor(values: Sequence[float]) -> Any:
    import torch

    return torch.tensor(list(values), dtype=torch.float32)


def _fixed_scorer(settings: Mapping[str, Any], what: str, max_worlds: int) -> Scorer:
    """The scorer over the exporter's env and judge configs that a generated file's ``SETTINGS`` hold."""
    if not isinstance(settings.get("env"), Mapping):
        raise RuntimeError(
            f"{what} holds no env config (written by an lrmgym whose labels carried the env's settings); regenerate "
            "the export with this lrmgym (lrmgym export openrlhf)."
        )
    return Scorer(settings["env"], settings.get("judge") or {}, max_worlds=max_worlds)


class RewardRuntime:
    """What a generated ``reward_func.py`` calls: scores OpenRLHF's ``(queries, prompts, labels)`` with lrmgym.

    Args:
        scorer: The scorer over the exporter's env and judges (labels name tasks of it).
        stop_texts: End-of-sequence / padding texts removed from the end of each completion.
    """

    def __init__(self, scorer: Scorer, stop_texts: Iterable[str] = DEFAULT_STOP_TEXTS) -> None:
        self.stop_texts = tuple(stop_texts)
        self.scorer = scorer

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> RewardRuntime:
        """The runtime a generated file's ``SETTINGS`` describe (the exporter's ``env`` and ``judge`` configs)."""
        _check_version(settings, REWARD_FILE)
        scorer = _fixed_scorer(settings, REWARD_FILE, int(settings.get("max_worlds", 8)))
        return cls(scorer, settings.get("stop_texts", DEFAULT_STOP_TEXTS))

    def score(self, queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any]) -> list[Score]:
        """One :class:`~lrmgym.integrations.labels.Score` per query; never raises for the model's text."""
        if not (len(queries) == len(prompts) == len(labels)):
            raise ValueError(
                f"reward_func got {len(queries)} queries, {len(prompts)} prompts and {len(labels)} labels; "
                "OpenRLHF passes one of each per sample."
            )
        pairs = [completion_from_query(q if isinstance(q, str) else str(q), p if isinstance(p, str) else None,
                                       self.stop_texts) for q, p in zip(queries, prompts, strict=True)]  # fmt: skip
        return self.scorer.score(labels, [t for t, _ in pairs], [found for _, found in pairs])

    def __call__(self, queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any]) -> dict[str, Any]:
        """OpenRLHF's reward dict: ``rewards`` and ``scores`` tensors, ``extra_logs`` of tensors (one value each)."""
        try:
            scores = self.score(queries, prompts, labels)
        except ValueError as err:  # a label or call problem: OpenRLHF logs a raise at INFO only, so say it here
            logger.error("lrmgym reward_func: %s", err)
            raise
        keys = list(scores[0].extra_logs) if scores else []
        return {
            "rewards": _tensor([s.reward for s in scores]),
            "scores": _tensor([s.score for s in scores]),
            "extra_logs": {k: _tensor([s.extra_logs.get(k, math.nan) for s in scores]) for k in keys},
        }


class Episode:
    """One multi-turn episode of one sample: grades each turn and says what the env replies.

    Args:
        world: The env and judges (the exporter's; the label names the task).
        index: The task's index.
        seed: The task's stream seed.
        turn_format: How feedback is wrapped between turns.
        stop_texts: Texts removed from the end of each policy turn before grading.
        max_turns: Policy turns allowed; ``None``: the env's own ``max_turns``.
    """

    def __init__(
        self,
        world: World,
        index: int,
        seed: int,
        turn_format: TurnFormat,
        stop_texts: Sequence[str],
        max_turns: int | None = None,
    ) -> None:
        self.world, self.index, self.seed = world, index, seed
        self.max_turns = int(max_turns or world.max_turns)
        self.task = world.task(index, seed)
        self.turn_format = turn_format
        self.stop_texts = tuple(stop_texts)
        self.turn = 0
        self.total = 0.0
        self.last: Score | None = None

    def step_values(self, action_text: str) -> dict[str, Any]:
        """Grade one policy turn; never raises for the model's text.

        Returns:
            ``reward`` (the change of the latest verdict's score, so the rewards sum to it), ``score``, ``feedback``
            (``""`` when done), ``done`` and ``extra_logs`` (plain floats).
        """
        from lrmgym.core import Completion, feedback_after

        text = strip_stop_texts(action_text if isinstance(action_text, str) else str(action_text), self.stop_texts)
        self.turn += 1
        result = self.world.score_texts(self.index, self.seed, [text])[0]
        reply, feedback_failed = None, 0.0
        if self.turn < self.max_turns and result.verdict is not None:
            try:
                reply = feedback_after(self.world.env, self.task, Completion(text), result.verdict, self.turn)
            except Exception as err:  # noqa: BLE001 - an env bug ends the episode, it must not end the rollout
                logger.warning("lrmgym agent: feedback failed on task %s: %s", self.task.id, err)
                feedback_failed = 1.0
        done = reply is None
        reward = result.reward - self.total
        self.total, self.last = result.reward, result
        logs = {**result.extra_logs, "episode/turns": float(self.turn), "episode/feedback_failed": feedback_failed}
        return {
            "reward": reward,
            "score": result.score,
            "feedback": "" if done else self.turn_format.wrap(str(reply), action_text),
            "done": done,
            "extra_logs": logs,
        }

    def step(self, action_text: str) -> dict[str, Any]:
        """:meth:`step_values` as OpenRLHF's step dict: ``rewards``/``scores`` 0-d tensors, ``environment_feedback``."""
        import torch

        values = self.step_values(action_text)
        return {
            "rewards": torch.tensor(values["reward"], dtype=torch.float32),
            "scores": torch.tensor(values["score"], dtype=torch.float32),
            "environment_feedback": values["feedback"],
            "done": values["done"],
            "extra_logs": values["extra_logs"],
        }


class AgentRuntime:
    """What a generated ``agent_func.py`` calls: starts an :class:`Episode` per OpenRLHF sample.

    Args:
        scorer: The scorer over the exporter's env and judges (labels name tasks of it).
        stop_texts: Texts removed from the end of each policy turn.
        turn_format: The turn markers (a :class:`TurnFormat` or its dict); ``None``: recognised from each prompt.
        max_turns: Policy turns per episode (``learner.max_turns``); ``None``: each env's own.
    """

    def __init__(
        self,
        scorer: Scorer,
        stop_texts: Iterable[str] = DEFAULT_STOP_TEXTS,
        turn_format: TurnFormat | Mapping[str, str] | None = None,
        max_turns: int | None = None,
    ) -> None:
        self.stop_texts = tuple(stop_texts)
        self.max_turns = max_turns
        if isinstance(turn_format, Mapping):
            turn_format = TurnFormat(**turn_format)
        self.turn_format = turn_format
        self.scorer = scorer

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> AgentRuntime:
        """The runtime a generated file's ``SETTINGS`` describe (the exporter's ``env`` and ``judge`` configs)."""
        _check_version(settings, AGENT_FILE)
        return cls(
            _fixed_scorer(settings, AGENT_FILE, int(settings.get("max_worlds", 8))),
            settings.get("stop_texts", DEFAULT_STOP_TEXTS),
            settings.get("turn_format"),
            settings.get("max_turns"),
        )

    def start(self, label: Any, observation: str) -> Episode:
        """The episode of the sample whose label OpenRLHF passed to ``reset`` (blocking: it may build an env).

        Raises:
            LabelError: The label is unusable (a data problem, not the model's).
        """
        decoded = decode_label(label)
        world = self.scorer.world(decoded)
        task = world.task(decoded.index, decoded.seed)
        fmt = self.turn_format or detect_turn_format(observation, task.prompt)
        return Episode(world, decoded.index, decoded.seed, fmt, self.stop_texts, self.max_turns)


# --------------------------------------------------------------------------------------------------- the files
_REWARD_TEMPLATE = '''"""OpenRLHF reward function for lrmgym: env {env_id}, judges {judges}.

Generated by lrmgym {version} for OpenRLHF {openrlhf}. Load it with ``--reward.remote_url {name}`` and the data's
label column (``--data.label_key label``): ``reward_func`` is called once per sample with the decoded query, the
prompt and the label; the label names the task, graded in the env and judges of SETTINGS (fixed at export time,
every setting included: a label that names one is refused) with the installed lrmgym, which must be importable in
every Ray worker. Returns ``rewards`` (the judged verdict's score; the env's failure value when
ungradeable), ``scores`` (0..1: correctness) and ``extra_logs`` (each judge's component, verdict flags).
"""

import json

import lrmgym  # noqa: F401 - the installed package does the work
from lrmgym.integrations.openrlhf_plugins import RewardRuntime

SETTINGS = json.loads({settings})
_RUNTIME = RewardRuntime.from_settings(SETTINGS)


def reward_func(queries, prompts, labels, **kwargs):
    """Score each ``queries[i]`` (prompt + completion) against the task ``labels[i]`` names."""
    return _RUNTIME(queries, prompts, labels)
'''

_AGENT_TEMPLATE = '''"""OpenRLHF multi-turn agent for lrmgym: env {env_id} (up to {turns} turns), judges {judges}.

Generated by lrmgym {version} for OpenRLHF {openrlhf}. Load it with ``--train.agent_func_path {name}`` and the
data's label column (``--data.label_key label``). Each sample gets an ``AgentInstance``: ``reset`` rebuilds the task
its label names, in the env and judges of SETTINGS (fixed at export time; a label that names a setting is refused),
with the installed lrmgym (importable in every Ray worker); each ``step``
grades the turn in a worker thread and returns the env's feedback (in the prompt's turn markers) until the answer
is right, the env has nothing to add, or the turns are used up. The step rewards sum to the latest verdict's score.
"""

import asyncio
import json

import lrmgym  # noqa: F401 - the installed package does the work
from lrmgym.integrations.openrlhf_plugins import AgentRuntime
from openrlhf.utils.agent import AgentInstanceBase, MultiTurnAgentExecutor

SETTINGS = json.loads({settings})
_RUNTIME = AgentRuntime.from_settings(SETTINGS)


class AgentInstance(AgentInstanceBase):
    """One sample's episode."""

    def __init__(self, *args, **kwargs):
        self.episode = None

    async def reset(self, states, **kwargs):
        """Rebuild the task from the label; the observation is the prompt as OpenRLHF rendered it."""
        self.episode = await asyncio.to_thread(_RUNTIME.start, states.get("label"), states["observation"])
        return {{"observation": states["observation"]}}

    async def step(self, states, **kwargs):
        """Grade the policy's turn off the event loop; rewards and scores are 0-d tensors."""
        return await asyncio.to_thread(self.episode.step, states["action_text"])


class AgentExecutor(MultiTurnAgentExecutor):
    """OpenRLHF's multi-turn executor over lrmgym episodes."""

    def __init__(self):
        super().__init__(AgentInstance)
'''


def _refuse_group_judges(judge: Mapping[str, Any], multi_turn: bool) -> None:
    from lrmgym.configs.errors import ConfigError

    names = group_judges(judge)
    if not names:
        return
    name = names[0]
    kind = judge[name]["kind"]
    if multi_turn:
        raise ConfigError(
            f"judge.{name}: the {kind} judge compares the completions of a group, but an OpenRLHF 0.11.2 agent "
            "(agent_func.py) grades one trajectory per AgentInstance and never sees the others of its prompt. "
            f"Remove judge {name!r} for OpenRLHF, or train this multi-turn env with `lrmgym run`."
        )
    raise ConfigError(
        f"judge.{name}: the {kind} judge compares the completions of a group, but OpenRLHF 0.11.2 calls "
        "reward_func.py with one sample at a time (SingleTurnAgentExecutor._fetch_rewards_via_func, batch_size = 1), "
        "so it would never see a group. Its HTTP path is no different on its own: each sample's reward request posts "
        "that one sample (SingleTurnAgentExecutor.execute sends [query]). Serve the judges instead and let the "
        f"server form the groups: `lrmgym serve env=... judge=... --group-size N` (N = --rollout.n_samples_per_prompt) "
        "holds the requests that carry one prompt's label until N have arrived and scores them together; pass its "
        f"URL as --reward.remote_url. Or remove judge {name!r}."
    )


def _tokenizer_settings(tokenizer: Any) -> tuple[TurnFormat | None, list[str]]:
    """The turn format and extra stop texts of a tokenizer (or of a model path / hub name to load one from)."""
    if tokenizer is None:
        return None, []
    if isinstance(tokenizer, (str, Path)):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
    stops = [t for t in (getattr(tokenizer, "eos_token", None), getattr(tokenizer, "pad_token", None)) if t]
    fmt = turn_format_from_tokenizer(tokenizer)
    if fmt is not None and fmt.close:
        stops.append(fmt.close)
    return fmt, [str(s) for s in stops]


def write_plugins(
    cfg: Any,
    out_dir: str | Path,
    *,
    tokenizer: Any = None,
    stop_texts: Iterable[str] | None = None,
    max_worlds: int = 8,
) -> dict[str, Any]:
    """Write the OpenRLHF plug-in file for ``cfg``'s env and judges: ``reward_func.py`` or ``agent_func.py``.

    Single-turn episodes get ``reward_func.py``, multi-turn ones ``agent_func.py``: the turns are the learner's
    ``max_turns`` when it has one set (as lrmgym's on-policy learners read it), else the env's. The file holds the
    env and judge configs, every setting included (sandbox, bounds, workers, data files, judge endpoints): the
    data's labels name only the tasks (:func:`lrmgym.integrations.labels.write_data`).

    Args:
        cfg: A resolved :class:`~lrmgym.configs.schema.RunConfig` (its ``env`` and ``judge`` sections are used).
        out_dir: The folder to write into (created).
        tokenizer: The policy's tokenizer, or the model path / hub name to load it from: its chat template gives
            the multi-turn feedback's turn markers and its EOS / pad texts are stripped. ``None``: the markers are
            recognised from each prompt at run time (ChatML, Llama 3; else plain text).
        stop_texts: Texts stripped from the end of completions, on top of common EOS / pad texts.
        max_worlds: Most env variants one loaded file builds (the env and its eval split: 2).

    Returns:
        ``{"multi_turn", "reward_func", "agent_func", "argv", "turn_format"}``: the file written (the other is
        ``None``), the OpenRLHF flag that loads it (``["--reward.remote_url", path]`` or
        ``["--train.agent_func_path", path]``) and the turn format baked in (``None``: recognised at run time).

    Raises:
        ConfigError: A judge compares completions within a group (``arena``, ``llm_pairwise``,
            ``rule_pairwise``): OpenRLHF 0.11.2 hands a plug-in one sample at a time. The message names the judge
            and what to use instead.
    """
    import lrmgym
    from lrmgym.core import learner_env
    from lrmgym.files import atomic_write_text

    judge = {name: j.model_dump(mode="json") for name, j in cfg.judge.items()}
    env = cfg.env.make().unwrapped
    try:  # the learner's turn limit, as lrmgym's own on-policy learners read it, else the env's
        turns = int(getattr(cfg.learner, "max_turns", None) or learner_env(env).max_turns)
    finally:
        close = getattr(env, "close", None)
        if callable(close):
            close()
    multi_turn = turns > 1
    _refuse_group_judges(judge, multi_turn)
    fmt, tokenizer_stops = _tokenizer_settings(tokenizer)
    stops = list(dict.fromkeys([*tokenizer_stops, *(stop_texts or ()), *DEFAULT_STOP_TEXTS]))
    settings = {
        "lrmgym_version": lrmgym.__version__,
        "label_version": LABEL_VERSION,
        "openrlhf_version": OPENRLHF_VERSION,
        "env_id": cfg.env.id,
        "judges": sorted(judge),
        "env": cfg.env.model_dump(mode="json"),
        "judge": judge,
        "stop_texts": stops,
        "max_worlds": max_worlds,
    }
    if multi_turn:
        settings["turn_format"] = asdict(fmt) if fmt is not None else None
        settings["max_turns"] = turns
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = AGENT_FILE if multi_turn else REWARD_FILE
    template = _AGENT_TEMPLATE if multi_turn else _REWARD_TEMPLATE
    text = template.format(
        env_id=cfg.env.id, judges=", ".join(sorted(judge)) or "none (the env's verifier)", version=lrmgym.__version__,
        openrlhf=OPENRLHF_VERSION, name=name, turns=turns, settings=json.dumps(json.dumps(settings, sort_keys=True)),
    )  # fmt: skip
    path = out / name
    atomic_write_text(path, text)
    flag = "--train.agent_func_path" if multi_turn else "--reward.remote_url"
    return {
        "multi_turn": multi_turn,
        "reward_func": None if multi_turn else path,
        "agent_func": path if multi_turn else None,
        "argv": [flag, str(path)],
        "turn_format": settings.get("turn_format"),
        "max_turns": turns,
    }
