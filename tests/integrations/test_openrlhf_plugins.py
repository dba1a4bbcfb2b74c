"""The generated reward_func.py / agent_func.py, driven by OpenRLHF 0.11.2's real executor classes.

A fake vLLM engine replays scripted completions (as token ids of the tiny model's character tokenizer, EOS
included, like vLLM with ``skip_special_tokens=False``). The files are loaded the way OpenRLHF loads them
(``SingleTurnAgentExecutor(remote_rm_url=path)``; ``spec_from_file_location("agent_module", path)`` then
``AgentExecutor()``), and their output goes through ``SamplesGenerator._process_response_into_experience``, the code
that turns it into an ``Experience`` (rewards, action mask) in the trainer. That module imports vLLM and OpenRLHF's
Ray engine module at its top, so the import stubs ``vllm`` and ``openrlhf.trainer.ray`` (and ``ray`` when it is
not installed) for its duration only, as OpenRLHF's own tests do, and then removes every module it added.
Rewards are checked against ``lrmgym judge`` (:func:`lrmgym.judges.scoring.judge_file`) on the same completions.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest
from integration_helpers import adversarial_cases, reference_rewards, reference_verdicts

from lrmgym.compose import build_env
from lrmgym.configs.errors import ConfigError
from lrmgym.configs.resolve import resolve
from lrmgym.core import Completion, learner_env
from lrmgym.envs.game24.solver import step_solution
from lrmgym.integrations.labels import World, decode_label, write_data
from lrmgym.integrations.openrlhf_plugins import CHATML, turn_format_from_tokenizer, write_plugins

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# ------------------------------------------------------------------------------------------------ fakes
@pytest.fixture(scope="module")
def tok():
    from lrmgym.policies.tiny import build_tokenizer

    return build_tokenizer()


class _Output:
    def __init__(self, token_ids, text, finish_reason):
        self.token_ids, self.text, self.finish_reason, self.logprobs = token_ids, text, finish_reason, None


class FakeEngine:
    """Replays one sample's scripted turns; each reply is the text's tokens plus the tokenizer's EOS."""

    def __init__(self, tokenizer, turns, end_text=None):
        self.tok, self.turns, self.end_text = tokenizer, list(turns), end_text
        self.prompts: list[list[int]] = []
        self.actions: list[str] = []

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        self.prompts.append(list(prompt_token_ids))
        text = self.turns.pop(0)
        if self.end_text is None:
            ids = self.tok(text=text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        else:  # a chat model ends its turn with the template's end-of-turn text
            ids = self.tok(text=text + self.end_text, add_special_tokens=False)["input_ids"]
        decoded = self.tok.decode(ids, skip_special_tokens=False)
        self.actions.append(decoded)
        await asyncio.sleep(0)  # yield to the loop, as a real engine does
        return types.SimpleNamespace(outputs=[_Output(ids, decoded, "stop")])


def _params(max_tokens=None):
    return types.SimpleNamespace(max_tokens=max_tokens, logprobs=None)


@pytest.fixture(scope="module")
def make_experience(openrlhf_agent):
    """OpenRLHF's ``SamplesGenerator._process_response_into_experience``, imported with vllm and Ray stubbed."""
    stubs = {
        "vllm": types.SimpleNamespace(SamplingParams=object),
        "openrlhf.trainer.ray": types.SimpleNamespace(batch_vllm_engine_call=None, create_vllm_engines=None),
        "openrlhf.trainer.ray.vllm_engine": types.SimpleNamespace(batch_vllm_engine_call=None),
    }
    if importlib.util.find_spec("ray") is None:
        stubs["ray"] = types.SimpleNamespace()
    before = set(sys.modules)
    saved = {name: sys.modules.get(name) for name in stubs}
    sys.modules.update({name: types.ModuleType(name) for name in stubs})
    for name, attrs in stubs.items():
        sys.modules[name].__dict__.update(vars(attrs))
    try:
        module = importlib.import_module("openrlhf.trainer.ppo_utils.samples_generator")
    except ImportError as err:
        pytest.skip(f"openrlhf's samples_generator cannot be imported with vllm stubbed: {err}")
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    process = module.SamplesGenerator._process_response_into_experience
    yield lambda response, max_len: process(None, response, max_len=max_len)
    for name in set(sys.modules) - before:
        if name.startswith("openrlhf.trainer") or name == "vllm":
            sys.modules.pop(name, None)


def _load_agent_executor(path: Path):
    """What OpenRLHF's ``vllm_engine._load_agent_executor`` does with ``--train.agent_func_path``."""
    from openrlhf.utils.agent import AgentExecutorBase

    spec = importlib.util.spec_from_file_location("agent_module", str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert issubclass(module.AgentExecutor, AgentExecutorBase)
    return module.AgentExecutor()


def _rows(path):
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


def _task(row):
    label = decode_label(row["label"])
    world = World(label.env)
    return world.task(label.index, label.seed)


def _check_mask(experience, out, tok, actions):
    """The action mask marks exactly the sampled tokens, and they decode to the scripted turns."""
    mask = experience.action_mask[0]
    sequence = experience.sequences[0]
    ranges = out["action_ranges"]
    assert len(ranges) == len(actions)
    assert int(mask.sum()) == sum(end - start for start, end in ranges)
    for (start, end), action in zip(ranges, actions, strict=True):
        assert mask[start - 1 : end - 1].all()  # the mask is shifted by one: it marks the tokens predicted
        assert tok.decode(sequence[start:end].tolist(), skip_special_tokens=False) == action
    outside = [i for i in range(len(mask)) if not any(s - 1 <= i < e - 1 for s, e in ranges)]
    assert not mask[outside].any()  # prompt and env feedback tokens are never trained on


# ------------------------------------------------------------------------------------------------ single turn
def test_reward_func_math_through_single_turn_executor(openrlhf_agent, make_experience, tok, tmp_path):
    cfg = resolve(["env=math", "judge=[accuracy,format_strict]"])
    data = write_data(cfg, tmp_path, 3, 2)
    info = write_plugins(cfg, tmp_path)
    assert info["multi_turn"] is False and info["agent_func"] is None
    assert info["argv"] == ["--reward.remote_url", str(tmp_path / "reward_func.py")]
    executor = openrlhf_agent.SingleTurnAgentExecutor(remote_rm_url=str(info["reward_func"]))
    hostile = [c["input"]["pred"] for c in adversarial_cases("math_verifier") if len(c["input"]["pred"]) < 20_000]
    rows = _rows(data["train"]) + _rows(data["eval"])
    groups, got = [], []
    for k, row in enumerate(rows):
        task = _task(row)
        texts = [task.metadata.get("solution") or f"<think>x</think><answer>{task.answer}</answer>",
                 "<think>7*7=48</think><answer>48</answer>", "no tags", "\x00\x01 binary \x7f"]  # fmt: skip
        if k == 0:
            texts += [f"<think>x</think><answer>{h}</answer>" for h in hostile[:4]] + ["<think>" + "loop " * 40_000]
        groups.append((task, texts))
        for text in texts:
            engine = FakeEngine(tok, [text])
            out = asyncio.run(executor.execute(row["prompt"], row["label"], _params(), 400_000, tok, engine))
            experience = make_experience(out, 400_000)
            _check_mask(experience, out, tok, engine.actions)
            assert experience.rewards.flatten().tolist() == out["reward"].tolist()
            assert set(experience.info) >= {"reward", "score", "judge/accuracy", "verdict/ungradeable"}
            got.append(
                (out["reward"].item(), out["scores"].item(), {k: v.item() for k, v in out["extra_logs"].items()})
            )
    expected = [r for g in reference_rewards(cfg, groups, tmp_path) for r in g]
    assert [r for r, _, _ in got] == expected
    assert got[0][:2] == (2.0, 1.0)  # the worked solution: accuracy 1 + strict format 1, correct
    assert all(logs["verdict/prompt_not_found"] == 0.0 for _, _, logs in got)


def test_reward_func_refuses_group_judges(tmp_path):
    cfg = resolve(["env=math", "judge=arena"])
    with pytest.raises(ConfigError) as err:
        write_plugins(cfg, tmp_path)
    message = str(err.value)
    assert message.startswith("judge.arena: the arena judge compares the completions of a group, but OpenRLHF 0.11.2 "
                              "calls reward_func.py with one sample at a time")  # fmt: skip
    assert "SingleTurnAgentExecutor.execute sends [query]" in message and "--group-size N" in message
    assert not (tmp_path / "reward_func.py").exists()
    cfg = resolve(["env=game24", "env.mode=steps", "env.split=train", "judge=[accuracy,llm_pairwise]"])
    with pytest.raises(ConfigError, match=r"^judge\.llm_pairwise: the llm_pairwise judge .* \(agent_func\.py\)"):
        write_plugins(cfg, tmp_path)


# ------------------------------------------------------------------------------------------------ multi turn
def _steps_answer(steps):
    return "<think>search</think><answer>" + "; ".join(steps) + "</answer>"


def test_agent_game24_steps_through_multi_turn_executor(openrlhf_agent, make_experience, tok, tmp_path):
    cfg = resolve(["env=game24", "env.mode=steps", "env.split=train", "judge=accuracy"])
    data = write_data(cfg, tmp_path, 2, 0)
    info = write_plugins(cfg, tmp_path)
    assert info["multi_turn"] is True and info["reward_func"] is None and info["max_turns"] == 6
    executor = _load_agent_executor(info["agent_func"])
    env = cfg.env.make()
    for row in _rows(data["train"]):
        task = _task(row)
        steps = step_solution(task.metadata["numbers"])
        turns = [_steps_answer(steps[:1]), _steps_answer(["99 + 1 = 100"]), _steps_answer(steps)]
        engine = FakeEngine(tok, turns)
        out = asyncio.run(executor.execute(row["prompt"], row["label"], _params(), 4096, tok, engine))
        per_turn = [v[0] for v in reference_verdicts(cfg, [(task, [t]) for t in turns], tmp_path)]
        assert [v["score"] for v in per_turn] == [0.0, -0.1, 1.0]  # progress, illegal step (penalty), solved
        assert out["reward"] == pytest.approx(1.0)  # OpenRLHF's sum of the step rewards: the last verdict's score
        assert out["scores"].item() == 1.0 and out["extra_logs"]["episode/turns"] == 3.0
        experience = make_experience(out, 4096)
        _check_mask(experience, out, tok, engine.actions)
        assert experience.rewards.item() == pytest.approx(1.0)
        # between the turns: the env's own feedback, as lrmgym's episodes put it
        transcript = tok.decode(out["observation_tokens"], skip_special_tokens=False)
        expected = row["prompt"]
        for k, action in enumerate(engine.actions[:-1], start=1):
            completion = Completion(turns[k - 1])
            verdict = env.score_group(task, [completion])[0]
            expected += action + env.feedback(task, completion, verdict, k)
        assert transcript == expected + engine.actions[-1]


def test_agent_ends_on_the_token_budget_with_the_latest_score(openrlhf_agent, tok, tmp_path):
    cfg = resolve(["env=game24", "env.mode=steps", "env.split=train", "judge=accuracy"])
    data = write_data(cfg, tmp_path, 1, 0)
    executor = _load_agent_executor(write_plugins(cfg, tmp_path)["agent_func"])
    row = _rows(data["train"])[0]
    engine = FakeEngine(tok, [_steps_answer(["99 + 1 = 100"])] * 6)
    budget = len(tok(text=row["prompt"])["input_ids"]) + 60  # room for one turn and its feedback only
    out = asyncio.run(executor.execute(row["prompt"], row["label"], _params(), budget, tok, engine))
    assert len(engine.actions) == 1 and out["reward"] == pytest.approx(-0.1)


def test_agent_code_with_feedback_concurrent_samples(openrlhf_agent, make_experience, tok, tmp_path):
    cfg = resolve(["env=code", "env.max_turns=3", "env.timeout_s=1.5", "judge=accuracy"])
    data = write_data(cfg, tmp_path, 2, 0)
    info = write_plugins(cfg, tmp_path)
    executor = _load_agent_executor(info["agent_func"])
    rows = _rows(data["train"])
    fence = "```python\n{}\n```"
    scripts, groups = [], []
    for row in rows:
        task = _task(row)
        wrong = fence.format("def f():\n    return 0")
        loop = fence.format("while True:\n    pass")
        right = fence.format(task.answer)
        for turns in ([wrong, right], [loop, wrong, right], [right], ["no code block", wrong, wrong]):
            scripts.append((row, task, turns))
            groups += [(task, [t]) for t in turns]

    async def run_all():  # the G samples of each prompt at once, as RolloutRayActor.generate_responses runs them
        engines = [FakeEngine(tok, turns) for _, _, turns in scripts]
        outs = await asyncio.gather(*(
            executor.execute(row["prompt"], row["label"], _params(), 100_000, tok, engine)
            for (row, _, _), engine in zip(scripts, engines, strict=True)
        ))  # fmt: skip
        return outs, engines

    outs, engines = asyncio.run(run_all())
    reference = iter(r[0] for r in reference_rewards(cfg, groups, tmp_path))
    env = learner_env(build_env(cfg))  # the judged env lrmgym's own episodes grade and ask for feedback
    for (_, task, turns), out, engine in zip(scripts, outs, engines, strict=True):
        per_turn = [next(reference) for _ in turns]
        assert out["reward"] == pytest.approx(per_turn[-1])  # the trajectory reward: the last turn's verdict
        assert len(engine.actions) == len(turns) == out["extra_logs"]["episode/turns"]
        _check_mask(make_experience(out, 100_000), out, tok, engine.actions)
        transcript = tok.decode(out["observation_tokens"], skip_special_tokens=False)
        for k, text in enumerate(turns[:-1], start=1):  # each feedback is the env's for that very code
            completion = Completion(text)
            feedback = env.feedback(task, completion, env.score_group(task, [completion])[0], k)
            assert feedback in transcript
    assert [o["reward"] for o in outs[:4]] == [1.0, 1.0, 1.0, 0.0]
    env.env.close()


def test_agent_chat_prompts_get_the_template_turn_markers(openrlhf_agent, tok, tmp_path):
    from lrmgym.policies.tiny import build_tokenizer

    tok = build_tokenizer()  # a fresh one: the module's stays without a chat template
    tok.chat_template = CHATML_TEMPLATE
    assert turn_format_from_tokenizer(tok) == CHATML.__class__("tokenizer", CHATML.close, CHATML.before, CHATML.after)
    cfg = resolve(["env=game24", "env.mode=steps", "env.split=train", "env.style=instruct", "env.chat=true",
                   "judge=accuracy"])  # fmt: skip
    data = write_data(cfg, tmp_path, 1, 0)
    row = _rows(data["train"])[0]
    assert isinstance(row["prompt"], list)
    task = _task(row)
    steps = step_solution(task.metadata["numbers"])
    turns = [_steps_answer(steps[:2]), _steps_answer(steps)]
    env = cfg.env.make()
    for baked in (True, False):  # markers from the tokenizer, or recognised from the prompt at run time
        folder = tmp_path / str(baked)
        info = write_plugins(cfg, folder, tokenizer=tok if baked else None)
        assert (info["turn_format"] is not None) is baked
        prompt = tok.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        engine = FakeEngine(tok, turns, end_text="<|im_end|>")
        out = asyncio.run(_load_agent_executor(info["agent_func"]).execute(prompt, row["label"], _params(), 8192,
                                                                           tok, engine))  # fmt: skip
        completion = Completion(turns[0])
        feedback = env.feedback(task, completion, env.score_group(task, [completion])[0], 1)
        messages = [*row["prompt"], {"role": "assistant", "content": turns[0]}, {"role": "user", "content": feedback},
                    {"role": "assistant", "content": turns[1]}]  # fmt: skip
        rendered = tok.apply_chat_template(messages, tokenize=False)
        assert tok.decode(out["observation_tokens"], skip_special_tokens=False) == rendered.removesuffix("\n")
        assert out["reward"] == pytest.approx(1.0)


# ------------------------------------------------------------------------------------------ settings: the exporter's
def _load(path: Path):
    spec = importlib.util.spec_from_file_location("plugin_module", str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reward_plugin_grades_with_the_exporters_settings_never_a_labels(tmp_path):
    cfg = resolve(["env=code", "env.timeout_s=1.5", "env.memory_mb=256", "env.workers=1"])
    data = write_data(cfg, tmp_path, 1, 0)
    runtime = _load(write_plugins(cfg, tmp_path)["reward_func"])._RUNTIME
    row = _rows(data["train"])[0]
    assert "timeout_s" not in decode_label(row["label"]).env and "sandbox" not in decode_label(row["label"]).env
    loop = "```python\nwhile True:\n    pass\n```"
    assert runtime.score([row["prompt"] + loop], [row["prompt"]], [row["label"]])[0].reward == 0.0
    world = runtime.scorer.fixed
    assert (world.env.config.timeout_s, world.env.config.memory_mb, world.env.config.workers) == (1.5, 256, 1)
    hostile = json.dumps({"v": 1, "env": {"id": "lrmgym/Code-v0", "sandbox": "process"}, "index": 0, "seed": 0})
    with pytest.raises(ValueError, match=r"^labels\[0\]\.env: sandbox: a label names its task, never a setting"):
        runtime.score(["x"], ["x"], [hostile])
    runtime.scorer.close()


def test_the_agent_plugin_refuses_a_label_that_names_a_setting(tmp_path):
    from lrmgym.integrations.openrlhf_plugins import AgentRuntime

    cfg = resolve(["env=game24", "env.mode=steps", "env.split=train"])
    runtime = AgentRuntime.from_settings(json.loads(json.dumps({"env": cfg.env.model_dump(mode="json"), "judge": {}})))
    good = json.loads(_rows(write_data(cfg, tmp_path, 1, 0)["train"])[0]["label"])
    assert runtime.start(json.dumps(good), "Q").index == 0
    bad = {**good, "env": {**good["env"], "data_path": "/etc/shadow"}}
    with pytest.raises(ValueError, match=r"^label\.env: data_path: a label names its task, never a setting"):
        runtime.start(json.dumps(bad), "Q")
    runtime.scorer.close()
