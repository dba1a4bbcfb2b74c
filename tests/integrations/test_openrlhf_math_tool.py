"""env=math_tool exported to OpenRLHF 0.11.2: the generated agent_func.py runs tool episodes in the real executor.

The plug-in is the one every multi-turn env gets (``lrmgym export openrlhf`` / :func:`write_plugins`): each
``step`` grades the turn, a tool-call turn's feedback is the tool's result (run in the exporter's sandbox), and the
executor appends it to the token stream outside the action ranges, so it is never trained on. Driven as in
``test_openrlhf_plugins.py``: a fake engine replays scripted turns through OpenRLHF's ``MultiTurnAgentExecutor``.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import test_openrlhf_plugins
from test_openrlhf_plugins import FakeEngine, _check_mask, _load_agent_executor, _params, _rows, _task

from lrmgym.configs.resolve import resolve
from lrmgym.integrations.labels import write_data
from lrmgym.integrations.openrlhf_plugins import write_plugins


def _call(code: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'python', 'arguments': {'code': code}})}</tool_call>"


def _answer(value: str) -> str:
    return f"<think>the tool said so</think><answer>{value}</answer>"


@pytest.fixture(scope="module")
def make_experience(openrlhf_agent):
    """OpenRLHF's experience maker, as ``test_openrlhf_plugins.py`` sets it up (vllm and Ray stubbed)."""
    yield from test_openrlhf_plugins.make_experience.__wrapped__(openrlhf_agent)


@pytest.fixture(scope="module")
def tok():
    from lrmgym.policies.tiny import build_tokenizer

    return build_tokenizer()


def test_agent_runs_tool_episodes_in_the_multi_turn_executor(openrlhf_agent, make_experience, tok, tmp_path):
    cfg = resolve(["env=math_tool", "env.max_tool_calls=2", "env.tool_timeout_s=2"])
    data = write_data(cfg, tmp_path, 2, 0)
    info = write_plugins(cfg, tmp_path)
    assert info["multi_turn"] is True and info["max_turns"] == 3
    executor = _load_agent_executor(info["agent_func"])
    for row in _rows(data["train"]):
        task = _task(row)
        gold = str(task.answer)
        scripts = {
            "call-then-answer": ([_call(f"print({gold})"), _answer(gold)], 1.0, 2),
            "malformed-then-answer": (["<tool_call>print(1)</tool_call>", _answer(gold)], 1.0, 2),
            "calls-past-the-cap": ([_call("print(1)")] * 3, 0.0, 3),
            "echo-then-nothing": ([_call(f"print('<think>x</think><answer>{gold}</answer>')"), "</think>"], 0.0, 2),
        }
        for name, (turns, reward, n_turns) in scripts.items():
            engine = FakeEngine(tok, turns)
            out = asyncio.run(executor.execute(row["prompt"], row["label"], _params(), 8192, tok, engine))
            assert out["reward"] == pytest.approx(reward), name
            assert out["extra_logs"]["episode/turns"] == n_turns == len(engine.actions), name
            _check_mask(make_experience(out, 8192), out, tok, engine.actions)  # tool responses: never trained on
            transcript = tok.decode(out["observation_tokens"], skip_special_tokens=False)
            assert transcript.count("<tool_response>") == min(n_turns - 1, 2), name
            if name == "call-then-answer":
                assert f"<tool_response>\n{gold}\n</tool_response>" in transcript
            if name == "malformed-then-answer":
                assert "error: the tool call is not valid JSON" in transcript
            if name == "echo-then-nothing":
                assert f"<tool_response>\n&lt;think>x&lt;/think>&lt;answer>{gold}&lt;/answer>\n" in transcript
