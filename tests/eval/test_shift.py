"""The token-shift analysis (`lrmgym.eval.shift`, `lrmgym analyze shift`): classes, oracle, control, CLI errors."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from click.testing import CliRunner

from lrmgym.cli.main import cli
from lrmgym.envs.echo import EchoEnv
from lrmgym.eval.shift import RERANKED, SHIFTED, UNSHIFTED, analyze_shift, classify_positions, summarize_positions
from lrmgym.policies.tiny import build_tokenizer


def _entropy(probs: list[float]) -> float:
    return -sum(p * math.log(p) for p in probs)


# ------------------------------------------------------------------------------------------------ classes
BASE_PROBS = [
    [0.5, 0.1, 0.1, 0.1, 0.1, 0.1],  # the RL model picks token 0 too: UNSHIFTED
    [0.3, 0.25, 0.2, 0.15, 0.06, 0.04],  # the RL model picks token 2, the base's third: RERANKED, rank 3
    [0.4, 0.2, 0.15, 0.12, 0.08, 0.05],  # the RL model picks token 5, the base's sixth: SHIFTED, rank 6
]
RL_PICKS = [0, 2, 5]


def _hand_made() -> tuple[torch.Tensor, torch.Tensor]:
    base = torch.tensor(BASE_PROBS).log()
    rl = torch.zeros(3, 6)
    rl[torch.arange(3), torch.tensor(RL_PICKS)] = 4.0
    return base, rl


def test_classification_rank_and_entropy_on_hand_made_logits():
    stats = classify_positions(*_hand_made())
    assert stats.classes.tolist() == [UNSHIFTED, RERANKED, SHIFTED]
    assert stats.rank.tolist() == [1, 3, 6]
    assert stats.base_top.tolist() == [0, 0, 0] and stats.rl_top.tolist() == RL_PICKS
    assert stats.entropy.tolist() == pytest.approx([_entropy(p) for p in BASE_PROBS], rel=1e-5)

    summary = summarize_positions(stats.classes.tolist(), stats.rank.tolist(), stats.entropy.tolist())
    assert summary["counts"] == {"unshifted": 1, "reranked": 1, "shifted": 1}
    assert summary["rates"] == pytest.approx({"unshifted": 1 / 3, "reranked": 1 / 3, "shifted": 1 / 3})
    assert summary["reranked_mean_rank"] == 3.0 and summary["shifted_mean_rank"] == 6.0
    ratio = _entropy(BASE_PROBS[1]) / _entropy(BASE_PROBS[0])
    assert summary["entropy_ratio"] == pytest.approx(ratio, rel=1e-5)


def test_a_wider_top_k_turns_the_shifted_position_into_a_reranked_one():
    assert classify_positions(*_hand_made(), top_k=6).classes.tolist() == [UNSHIFTED, RERANKED, RERANKED]


def test_means_over_no_position_are_none():
    summary = summarize_positions([UNSHIFTED, UNSHIFTED], [1, 1], [0.5, 1.5])
    assert summary["rates"]["unshifted"] == 1.0
    assert summary["reranked_mean_rank"] is None and summary["entropy_ratio"] is None
    assert summary["entropy"]["unshifted"] == 1.0


def test_different_vocabularies_are_refused():
    with pytest.raises(ValueError, match=r"^The base logits have shape \(3, 6\) and the RL logits \(3, 7\)"):
        classify_positions(torch.zeros(3, 6), torch.zeros(3, 7))


# ------------------------------------------------------------------------------------------------ decoding
@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def base_model(tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1,
        intermediate_size=64, max_position_embeddings=256, tie_word_embeddings=False, pad_token_id=0,
        bos_token_id=None, eos_token_id=1,
    )  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def echo():
    env = EchoEnv(words=1)
    return env, [env.task_at(i, seed=0) for i in range(2)]  # every Echo word has 5 letters: equal prompt lengths


def test_identical_models_are_all_unshifted_and_the_oracle_is_the_base(base_model, tokenizer, echo):
    env, tasks = echo
    report = analyze_shift(base_model, copy.deepcopy(base_model), tokenizer, env, tasks, max_new_tokens=10)
    assert report.summary["rates"] == {"unshifted": 1.0, "reranked": 0.0, "shifted": 0.0}
    assert report.summary["positions"] == sum(t["base"]["tokens"] for t in report.tasks) > 0
    assert report.oracle_edit_rate == 0.0 and report.control_edit_rate == 0.0 and report.oracle_matches_rl == 1.0
    for task in report.tasks:
        assert task["oracle"]["text"] == task["base"]["text"] == task["rl"]["text"] == task["control"]["text"]
    assert len(set(report.accuracy.values())) == 1
    assert json.loads(json.dumps(report.to_dict()))["counts"]["unshifted"] == report.summary["positions"]


def _biased_at(model, position: int, token: int):
    """A copy of ``model`` whose logits for ``token`` are raised by 100 where the prefix ends at ``position``.

    A forward hook also keeps the lean decoder out, so the copy runs through ``model.forward`` (as the base
    must, with :func:`_observed`, for the two to compute the same logits bit for bit).
    """
    biased = copy.deepcopy(model)

    def hook(module, args, kwargs, output):
        rows = kwargs["position_ids"][:, -1] == position  # [b] the absolute position of each row's last token
        output.logits[rows, -1, token] += 100.0
        return output

    biased.register_forward_hook(hook, with_kwargs=True)
    return biased


def _observed(model):
    observed = copy.deepcopy(model)
    observed.register_forward_hook(lambda module, args, output: output)
    return observed


@pytest.mark.parametrize("kind", ["reranked", "shifted"])
def test_an_rl_model_that_differs_at_one_position_is_edited_exactly_there(base_model, tokenizer, echo, kind):
    env, tasks = echo
    tasks = tasks[:1]
    base = _observed(base_model)
    plain = analyze_shift(base, base, tokenizer, env, tasks, max_new_tokens=10)
    prompt_ids = tokenizer(tasks[0].prompt)["input_ids"]
    p = 4  # the completion index where the RL model disagrees
    ids = tokenizer(plain.tasks[0]["base"]["text"])["input_ids"]
    assert len(ids) > p
    with torch.no_grad():  # the base's ranking of the next token after the base's first p completion tokens
        ranked = base_model(input_ids=torch.tensor([prompt_ids + ids[:p]])).logits[0, -1].argsort(descending=True)
    # reranked: the base's second choice there; shifted: its 50th (outside its top 5)
    forced = int(ranked[1] if kind == "reranked" else ranked[49])
    rl = _biased_at(base_model, len(prompt_ids) - 1 + p, forced)  # logits at position q predict token q + 1

    report = analyze_shift(base, rl, tokenizer, env, tasks, max_new_tokens=10)
    task = report.tasks[0]
    assert report.summary["counts"]["unshifted"] == report.summary["positions"] - 1
    assert (task["reranked"], task["shifted"]) == ((1, 0) if kind == "reranked" else (0, 1))
    assert task["base"]["text"] == plain.tasks[0]["base"]["text"]  # the base path does not depend on the RL model
    rl_ids = tokenizer(task["rl"]["text"])["input_ids"]
    assert rl_ids[:p] == ids[:p] and rl_ids[p] == forced
    oracle = tokenizer(task["oracle"]["text"])["input_ids"]
    if kind == "reranked":  # the oracle takes the RL token there, then decodes on from the corrected prefix
        assert task["oracle"]["edits"] == 1 and oracle[:p] == ids[:p] and oracle[p] == forced
        assert task["oracle"]["text"] == task["rl"]["text"] and report.oracle_matches_rl == 1.0
        assert report.oracle_edit_rate == pytest.approx(1 / task["oracle"]["tokens"])
    else:  # a shifted position is not the base re-ranking its own candidates: the oracle keeps the base's token
        assert task["oracle"]["edits"] == 0 and task["oracle"]["text"] == task["base"]["text"]
        assert report.oracle_matches_rl == 0.0
    assert task["control"]["edits"] == 1
    control = tokenizer(task["control"]["text"])["input_ids"]
    assert control[:p] == ids[:p] and control[p] != ids[p]


def test_models_with_different_vocabularies_are_refused(base_model, tokenizer, echo):
    from transformers import LlamaConfig, LlamaForCausalLM

    env, tasks = echo
    other = LlamaForCausalLM(LlamaConfig(**{**base_model.config.to_dict(), "vocab_size": len(tokenizer) + 3})).eval()
    vocab = len(tokenizer)
    with pytest.raises(ValueError, match=rf"^The base model scores {vocab} tokens and the RL model {vocab + 3};"):
        analyze_shift(base_model, other, tokenizer, env, tasks, max_new_tokens=2)


# ------------------------------------------------------------------------------------------------ CLI
def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--base", "/nonexistent/model", "--rl", "tiny"),
            "Error: --base: '/nonexistent/model' does not exist; give a model folder (with config.json), a run "
            "directory of `lrmgym run` (with config.yaml), or tiny (the shipped default model).",
        ),
        (
            ("--base", "tiny", "--rl", "tiny", "policy=hf"),
            "Error: policy=hf: `lrmgym analyze shift` takes its models from --base and --rl and grades with the "
            "env's own verifier; it reads only env=... and eval.* settings.",
        ),
    ],
)
def test_cli_errors(args, message):
    result = invoke("analyze", "shift", *args)
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == message


def test_cli_refuses_a_negative_gate_tau():
    result = invoke("analyze", "shift", "--base", "tiny", "--rl", "tiny", "--gate-tau", "-1")
    assert result.exit_code == 2
    assert "Invalid value for '--gate-tau': -1.0 is not in the range 0.0<=x<=1000000.0." in result.output


def test_cli_refuses_a_folder_that_is_neither_a_model_nor_a_run(tmp_path):
    result = invoke("analyze", "shift", "--base", "tiny", "--rl", str(tmp_path))
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"Error: --rl: {str(tmp_path)!r} is neither a model folder (no config.json) nor a run directory of "
        "`lrmgym run` (no config.yaml); give one of those, or tiny (the shipped default model)."
    )


def test_cli_tiny_against_itself_writes_json_and_plot(tmp_path):
    out = tmp_path / "shift"
    args = ["--base", "tiny", "--rl", "tiny", "--tasks", "2", "--max-new-tokens", "6", "--out", str(out), "env=echo"]
    result = invoke("analyze", "shift", *args, "--gate-tau", "1.4", "--gate-tau", "0.5")
    assert result.exit_code == 0, result.output
    assert "reranked" in result.output and "oracle" in result.output and "base entropy > 1.4" in result.output
    report = json.loads((out / "shift.json").read_text())
    assert [g["tau"] for g in report["gated"]] == [1.4, 0.5] and report["config"]["gate_taus"] == [1.4, 0.5]
    assert all(g["matches_rl"] == 1.0 for g in report["gated"])  # the same model: every gate decodes as it does
    assert report["rates"]["unshifted"] == 1.0 and report["oracle_matches_rl"] == 1.0
    assert report["config"]["base"] == "tiny" and report["config"]["env"]["id"] == "lrmgym/Echo-v0"
    assert (out / "shift.png").read_bytes()[:4] == b"\x89PNG"


def _fake_run(folder, noise: float):
    """A run directory of `lrmgym run` (policy=tiny, env=echo) whose one checkpoint holds perturbed weights."""
    from lrmgym.configs.resolve import resolve
    from lrmgym.policies.tiny import TinyPolicyConfig

    folder.mkdir()
    (folder / "config.yaml").write_text(resolve(["env=echo"]).to_yaml())
    state = TinyPolicyConfig().build().model.state_dict()
    torch.manual_seed(0)
    state = {k: v + noise * torch.randn_like(v) for k, v in state.items()}
    (folder / "checkpoints").mkdir()
    torch.save({"model": state, "optimizer": {}, "step": 3}, folder / "checkpoints" / "step_000003.pt")
    return folder


def test_cli_loads_a_run_directory_s_newest_checkpoint_into_its_policy(tmp_path):
    run = _fake_run(tmp_path / "run", noise=0.3)
    args = ["--base", "tiny", "--rl", str(run), "--tasks", "2", "--max-new-tokens", "6", "--out", str(tmp_path)]
    result = invoke("analyze", "shift", *args, "env=echo")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "shift.json").read_text())
    assert report["config"]["rl"] == f"{run} (step 3)"
    assert report["rates"]["unshifted"] < 1.0  # the perturbed weights were loaded, not the run's initial ones


def test_cli_refuses_a_run_without_a_checkpoint(tmp_path):
    run = _fake_run(tmp_path / "run", noise=0.0)
    (run / "checkpoints" / "step_000003.pt").unlink()
    result = invoke("analyze", "shift", "--base", "tiny", "--rl", str(run))
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == (
        f"Error: --rl: the run directory {str(run)!r} holds no checkpoint yet (checkpoints/step_*.pt); let the run "
        "save one (learner.checkpoint_every) or give a model folder."
    )


def test_the_control_never_picks_the_base_argmax_and_stays_in_its_top_k():
    # Kills: the control's draw starting at rank 1 (randint(0, k)): it would sometimes keep the base's argmax.
    from lrmgym.eval.shift import _control

    torch.manual_seed(0)
    base = torch.randn(4000, 50)
    rl = base.clone()
    rl[torch.arange(4000), base.argmax(-1)] = -1e9  # the RL model disagrees everywhere
    stats = classify_positions(base, rl)
    picks, where = _control(torch.Generator().manual_seed(1), 8)(base, stats)
    assert bool(where.all())
    top = torch.topk(base, 8, dim=-1).indices
    rank = (top == picks[:, None]).float().argmax(-1)  # 0 = the base's argmax
    assert bool((top == picks[:, None]).any(-1).all())  # always within the base's top 8
    assert int((rank == 0).sum()) == 0
    assert set(rank.tolist()) == set(range(1, 8))  # every other rank is drawn


# ------------------------------------------------------------------------------------------------ entropy gate
class _TableLM(torch.nn.Module):
    """A causal LM whose next-token logits depend only on the last token: ``table[last]`` (no cache needed)."""

    def __init__(self, table: list[list[float]]) -> None:
        super().__init__()
        self.register_buffer("table", torch.tensor(table))

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=True, past_key_values=None):
        from types import SimpleNamespace

        return SimpleNamespace(logits=self.table[input_ids], past_key_values=None)


NEG = -1e4  # a token the model never picks (finite: no 0 * inf in the entropy)
# Tokens: 0 the prompt, 1-4 words, 5 EOS. Rows: the logits after that token.
BASE_TABLE = [
    [NEG, 0.1, 0.0, NEG, NEG, NEG],  # after the prompt: 1 or 2, nearly a coin (H just under ln 2); base picks 1
    [NEG, NEG, NEG, 9.0, 0.0, NEG],  # after 1: 3, sure
    [NEG, NEG, NEG, 0.0, 9.0, NEG],  # after 2: 4, sure (H ~ 1e-3)
    [NEG, NEG, NEG, NEG, NEG, 0.0],  # after 3: EOS
    [NEG, NEG, NEG, NEG, NEG, 0.0],  # after 4: EOS
    [NEG, NEG, NEG, NEG, NEG, 0.0],
]
RL_TABLE = [row[:] for row in BASE_TABLE]
RL_TABLE[0] = [NEG, 0.0, 5.0, NEG, NEG, NEG]  # the RL model picks 2 at the fork
RL_TABLE[2] = [NEG, NEG, NEG, 5.0, 0.0, NEG]  # and 3 after 2, where the base is sure of 4


def _gate_decode(tau: float):
    from lrmgym.eval.shift import _gated, _lockstep

    base, rl = _TableLM(BASE_TABLE), _TableLM(RL_TABLE)
    kwargs = {"max_new_tokens": 5, "eos_ids": [5], "pad_id": 5, "top_k": 5}
    return _lockstep(base, rl, [[0]], _gated(tau), **kwargs)[0]


def test_the_gate_substitutes_only_strictly_above_tau_on_hand_made_logits():
    from lrmgym.eval.shift import _gated

    base = torch.tensor([BASE_TABLE[0], BASE_TABLE[2]])
    rl = torch.tensor([RL_TABLE[0], RL_TABLE[2]])
    stats = classify_positions(base, rl)
    p = torch.softmax(torch.tensor([0.1, 0.0]), -1).tolist()
    assert stats.entropy[0].item() == pytest.approx(_entropy(p), rel=1e-5)  # 0.6919 nats
    h = stats.entropy[0].item()
    below = float(torch.nextafter(torch.tensor(h), torch.tensor(-1.0)))  # the float32 just under H
    token, where = _gated(h)(base, stats)  # H > H is false: the boundary is not gated (a >= gate would be)
    assert token.tolist() == [1, 4] and where.tolist() == [False, False]
    token, where = _gated(below)(base, stats)  # just under H: the fork is gated, the sure position is not
    assert token.tolist() == [2, 4] and where.tolist() == [True, False]
    token, where = _gated(0.0)(base, stats)  # every position with any entropy: the RL model's argmax everywhere
    assert token.tolist() == [2, 3] and where.tolist() == [True, True]


def test_the_gated_decode_continues_from_the_corrected_prefix():
    # Gated at the fork only (tau 0.5): token 2, then the base's own 4 after 2 (its row, not its row after 1), EOS.
    path = _gate_decode(0.5)
    assert path.token_ids == [2, 4, 5] and path.touched == [0] and path.edits == 1
    # The RL model's greedy decode is 2, 3: the sure position (H ~ 1e-3 < 0.5) keeps the base's token.
    assert _gate_decode(1e-9).token_ids == [2, 3, 5]  # everything with entropy gated: the RL decode
    path = _gate_decode(0.7)  # above ln 2: nothing gated, the base's decode 1, 3
    assert path.token_ids == [1, 3, 5] and path.touched == [] and path.edits == 0


def test_analyze_shift_reports_each_gate(base_model, tokenizer, echo):
    env, tasks = echo
    tasks = tasks[:1]
    base = _observed(base_model)
    prompt_ids = tokenizer(tasks[0].prompt)["input_ids"]
    plain = analyze_shift(base, base, tokenizer, env, tasks, max_new_tokens=10)
    ids = tokenizer(plain.tasks[0]["base"]["text"])["input_ids"]
    p = 4
    with torch.no_grad():
        ranked = base_model(input_ids=torch.tensor([prompt_ids + ids[:p]])).logits[0, -1].argsort(descending=True)
    rl = _biased_at(base_model, len(prompt_ids) - 1 + p, int(ranked[1]))
    report = analyze_shift(base, rl, tokenizer, env, tasks, max_new_tokens=10, gate_taus=[0.0, 1e9, 0.0])
    assert [g["tau"] for g in report.gated] == [0.0, 1e9]  # each tau once, in order
    everywhere, nowhere = report.gated
    task = report.tasks[0]
    # tau 0: every position gated, so the decode is the RL model's own greedy decode
    assert task["gated@0.0"]["text"] == task["rl"]["text"] and everywhere["matches_rl"] == 1.0
    assert everywhere["gated_rate"] == 1.0 and everywhere["edit_rate"] == pytest.approx(1 / task["rl"]["tokens"])
    assert task["gated@0.0"]["gated"] == list(range(task["rl"]["tokens"]))
    # an unreachable tau: the base's decode, nothing gated
    assert task["gated@1000000000.0"]["text"] == task["base"]["text"] and nowhere["matches_rl"] == 0.0
    assert nowhere["gated_rate"] == 0.0 and nowhere["edit_rate"] == 0.0
    assert report.accuracy["gated@0.0"] == everywhere["accuracy"] == report.accuracy["rl"]
    assert json.loads(json.dumps(report.to_dict()))["gated"][0]["tau"] == 0.0


@pytest.mark.parametrize("tau", [-0.1, float("nan"), float("inf")])
def test_a_gate_tau_that_is_no_entropy_is_refused(base_model, tokenizer, echo, tau):
    env, tasks = echo
    with pytest.raises(ValueError, match=r"^gate tau .* is not a finite entropy in nats"):
        analyze_shift(base_model, base_model, tokenizer, env, tasks, max_new_tokens=2, gate_taus=[tau])
