"""ReasonMaxxer (learner=reason_maxxer): selection, tau, the loss by hand, ablations, stored data, resume, exports."""

from __future__ import annotations

import json
import math
import re
import shutil
import zlib

import pytest
import torch
from learner_helpers import TEST_ENV_ID, register_test_env, tiny_hf_policy
from pydantic import ValidationError

from lrmgym.configs.resolve import resolve
from lrmgym.core import Verdict
from lrmgym.learners.algorithms.reason_maxxer import (
    JudgedRollout,
    ReasonMaxxer,
    ReasonMaxxerConfig,
    calibrate_tau,
    read_rollouts,
    reason_maxxer_loss,
    select_rollouts,
    write_rollouts,
)
from lrmgym.learners.engine.context import RunContext
from lrmgym.registry import make

register_test_env()


class _Graded:
    """The test env with a verdict the random tiny model gets right about half the time: the text's CRC parity."""

    def __init__(self, env):
        self.env = env

    def __getattr__(self, name):
        return getattr(self.env, name)

    def score_group(self, task, completions):
        good = [zlib.crc32(c.text.encode()) % 2 == 0 for c in completions]
        return [Verdict(score=float(g), correct=g) for g in good]


class _Counting:
    """Counts a policy's generate calls (and can fail the n-th)."""

    def __init__(self, policy, fail_at: int | None = None):
        self.calls, self.fail_at, self._generate = 0, fail_at, policy.generate
        policy.generate = self

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.fail_at:
            raise KeyboardInterrupt
        return self._generate(*args, **kwargs)


def _cfg(**kw) -> ReasonMaxxerConfig:
    base = dict(
        problems=8, rollouts_per_problem=4, temperature=1.0, top_p=1.0, max_new_tokens=6, sample_chunk=3,
        max_problems=6, lora_r=4, lora_alpha=8.0, lr=1e-2, warmup_steps=1, batch_size=2, score_batch_size=8,
        eval_before_after=False, progress=False, checkpoint_every=100, log_samples=1,
    )  # fmt: skip
    return ReasonMaxxerConfig(**{**base, **kw})


def _ctx(tmp_path, name: str, seed: int = 0, policy=None) -> RunContext:
    env = _Graded(make(TEST_ENV_ID))
    return RunContext(env=env, policy=policy or tiny_hf_policy(seed=0), eval=None, seed=seed, run_dir=tmp_path / name)


def _setup(tmp_path, name: str, cfg: ReasonMaxxerConfig, data_from: str | None = None) -> ReasonMaxxer:
    """A set-up algorithm; ``data_from``: copy that run's stored data first (so nothing is sampled again)."""
    if data_from is not None:
        shutil.copytree(tmp_path / data_from / "reason_maxxer", tmp_path / name / "reason_maxxer")
    loop = cfg.build(_ctx(tmp_path, name))
    loop.algorithm.setup()
    return loop.algorithm


def _rollout(task: str, correct: bool | None, length: int, truncated: bool = False, **kw) -> JudgedRollout:
    reward = kw.pop("reward", None if correct is None else float(correct))
    return JudgedRollout(
        task, "Q:", "x" * length, [5], [7] * length, reward, correct, finish_reason="length" if truncated else "stop",
        **kw,
    )  # fmt: skip


def _adapter(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


# --------------------------------------------------------------------------------------------------- selection
def test_selection_keeps_the_edge_of_competence_ranked_and_trims_the_longest_fifth():
    rollouts = [
        *[_rollout("p1", c, 3) for c in (True, False, False, False)],  # pass rate 0.25
        *[_rollout("p2", c, 3) for c in (True, True, False, False)],  # 0.5, short
        *[_rollout("p3", c, 5) for c in (True, False, True, False)],  # 0.5, longer
        *[_rollout("p4", True, 2) for _ in range(4)],  # always right: not eligible
        *[_rollout("p5", False, 2) for _ in range(4)],  # always wrong: not eligible
        *[_rollout("p6", c, n, t) for c, n, t in ((True, 2, 0), (False, 2, 0), (True, 2, 0), (False, 6, 1))],
        _rollout("p7", True, 1),
        _rollout("p7", None, 1, reward=None),  # ungradeable: left out, so p7 (one gradeable rollout) is all right
    ]
    sel = select_rollouts(rollouts, max_problems=3, trim_longest=0.2)
    # 0.5 first; p2 before p3 (shorter), p3 before p6 (p6 has a truncation, though shorter); p1 (0.25) is 4th.
    assert sel.problems == ["p2", "p3", "p6"]
    # 12 rollouts, the 2 longest dropped: p6's 6 tokens and the last of p3's (equal) 5-token ones.
    assert sel.rows == [4, 5, 6, 7, 8, 9, 10, 20, 21, 22]
    third = math.sqrt(2 / 9)  # population std of [1, 0, 1]
    two_of_three = [(1 / 3) / third, -(2 / 3) / third, (1 / 3) / third]  # (r - 2/3) / std for r = 1, 0, 1
    assert sel.advantages == pytest.approx([1, 1, -1, -1, *two_of_three, *two_of_three])
    assert sel.counts == {
        "problems_sampled": 7, "problems_eligible": 4, "problems_kept": 3, "rollouts_ungradeable": 1,
        "rollouts_before_trim": 12, "rollouts_kept": 10,
    }  # fmt: skip


def test_advantages_are_clipped_and_a_problem_without_correctness_is_ranked_by_its_signal():
    one_of_eight = [_rollout("hard", i == 0, 3) for i in range(8)]
    sel = select_rollouts(one_of_eight, max_problems=1, trim_longest=0.0)
    std = math.sqrt(1 / 8 * 7 / 8)
    assert (7 / 8) / std > 2.5  # 2.65 before the clip
    assert sel.advantages == pytest.approx([2.5] + [-(1 / 8) / std] * 7)
    assert select_rollouts(one_of_eight, 1, 0.0, adv_clip=None).advantages[0] == pytest.approx((7 / 8) / std)
    # Strengths without correctness: eligible when not constant, ranked after every problem with a pass rate.
    arena = [_rollout("a", None, 2, strength=s) for s in (0.5, -0.5)] + [_rollout("b", None, 2, strength=1.0)] * 2
    mixed = arena + [_rollout("c", c, 9, strength=0.0) for c in (True, False)]
    sel = select_rollouts(mixed, max_problems=5, trim_longest=0.0, advantage="strength")
    assert sel.problems == ["c", "a"] and sel.advantages == pytest.approx([0.0, 0.0, 1.0, -1.0])


def test_tau_is_calibrated_to_gate_the_target_fraction():
    torch.manual_seed(0)
    entropies = [torch.rand(600) * 3, torch.rand(400) * 2]
    for fraction, gated in ((0.04, 40), (0.03, 30), (0.05, 50)):
        tau = calibrate_tau(entropies, fraction)
        assert sum(int((e > tau).sum()) for e in entropies) == gated
    with pytest.raises(ValueError, match=r"^tau calibration needs at least 2 completion tokens, got 1; give tau"):
        calibrate_tau([torch.ones(1)], 0.04)


# --------------------------------------------------------------------------------------------------- the loss
def _log_softmax(v: list[float], i: int) -> float:
    return v[i] - math.log(sum(math.exp(x) for x in v))


def _kl(p_logits: list[float], q_logits: list[float]) -> float:
    return sum(
        math.exp(_log_softmax(p_logits, i)) * (_log_softmax(p_logits, i) - _log_softmax(q_logits, i))
        for i in range(len(p_logits))
    )


def test_the_loss_on_two_sequences_by_hand():
    logits = [[[1.0, 0.0, -1.0], [0.5, 0.2, 2.0], [0.0, 1.0, 0.0], [0.3, -0.3, 0.9], [0.0, 0.0, 0.0]],
              [[2.0, 1.0, 0.0], [-1.0, 0.5, 0.0], [0.1, 0.2, 0.3], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]]  # fmt: skip
    base = [[[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.0, 2.0, 0.5], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
            [[0.0, 1.0, 0.0], [0.0, 0.0, 3.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]]  # fmt: skip
    ids = torch.tensor([[0, 1, 2, 1, 0], [2, 0, 1, 0, 0]])  # row 2: three tokens and two pads
    # Row 1: the prompt is token 0; decisions at positions 1 and 3 (they predict tokens 2 and 0), anchors at 0
    # (the prompt's position) and 2. Row 2: decision at 1 (predicts token 1), anchor at 0; positions 2 and 3
    # predict padding (invalid).
    decision = torch.tensor([[False, True, False, True], [False, True, False, False]])
    anchor = torch.tensor([[True, False, True, False], [True, False, False, False]])
    adv = torch.tensor([1.5, -2.0])
    parts = reason_maxxer_loss(torch.tensor(logits), torch.tensor(base), ids, adv, decision, anchor, kl_coef=0.2)
    ce1 = -1.5 * (_log_softmax(logits[0][1], 2) + _log_softmax(logits[0][3], 0)) / 2
    kl1 = (_kl(base[0][0], logits[0][0]) + _kl(base[0][2], logits[0][2])) / 2
    ce2 = -1 * -2.0 * _log_softmax(logits[1][1], 1)  # -A log p with A = -2
    kl2 = _kl(base[1][0], logits[1][0])
    assert parts.decision_ce.tolist() == pytest.approx([ce1, ce2], abs=1e-6)
    assert parts.anchor_kl.tolist() == pytest.approx([kl1, kl2], abs=1e-6)
    assert parts.loss.tolist() == pytest.approx([ce1 + 0.2 * kl1, ce2 + 0.2 * kl2], abs=1e-6)
    no_anchor = reason_maxxer_loss(torch.tensor(logits), None, ids, adv, decision, anchor, kl_coef=0.0)
    assert no_anchor.loss.tolist() == pytest.approx([ce1, ce2], abs=1e-6) and no_anchor.anchor_kl.tolist() == [0, 0]


def test_beta_neg_scales_only_negatives_and_the_floor_stops_pushing_a_token_already_below_it():
    # Row 1 (A = +1): decisions at 0 and 1, token 0 at position 1 has p ~ 0.024; row 2 (A = -2): decisions at
    # 0 and 1, token 1 has p = 0.5 at position 0 and token 0 has p ~ 0.0474 at position 1 (1 / (2 + e^3)).
    logits = torch.tensor([[[0.0, 1.0, 0.0], [-3.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
                           [[0.0, math.log(2.0), 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 0.0]]],
                          requires_grad=True)  # fmt: skip
    ids = torch.tensor([[0, 1, 0], [0, 1, 0]])
    decision = torch.tensor([[True, True], [True, True]])
    anchor = torch.zeros(2, 2, dtype=torch.bool)
    adv = torch.tensor([1.0, -2.0])
    lp = [[_log_softmax([0.0, 1.0, 0.0], 1), _log_softmax([-3.0, 0.0, 0.0], 0)],
          [math.log(0.5), _log_softmax([0.0, 3.0, 0.0], 0)]]  # fmt: skip
    scaled = reason_maxxer_loss(logits, None, ids, adv, decision, anchor, 0.0, beta_neg=0.25)
    assert scaled.decision_ce.tolist() == pytest.approx([-(lp[0][0] + lp[0][1]) / 2, 0.5 * (lp[1][0] + lp[1][1]) / 2])
    floored = reason_maxxer_loss(logits, None, ids, adv, decision, anchor, 0.0, neg_prob_floor=0.1)
    # Row 2's second token (p = 0.047 < 0.1) drops out of the sum but not out of |D| = 2; row 1 is untouched.
    assert floored.decision_ce.tolist() == pytest.approx([-(lp[0][0] + lp[0][1]) / 2, 2.0 * lp[1][0] / 2])
    floored.loss.sum().backward()
    assert logits.grad[1, 1].abs().sum() == 0 and logits.grad[1, 0].abs().sum() > 0
    assert logits.grad[0, 1].abs().sum() > 0  # a positive sequence's token below the floor is still pulled up


# --------------------------------------------------------------------------------------------------- ablations
def test_the_ablations_change_exactly_what_they_should(tmp_path):
    full = _setup(tmp_path, "full", _cfg())
    assert full.report["source"] == "sampled" and full.report["rollouts"] == 32
    assert 0 < full.report["decision_frac"] < 0.1
    pos = _setup(tmp_path, "pos", _cfg(positive_only=True), data_from="full")
    assert [r.source for r in pos.rows] == [r.source for r in full.rows if r.advantage > 0]
    seq = _setup(tmp_path, "seq", _cfg(full_sequence=True), data_from="full")
    assert [r.source for r in seq.rows] == [r.source for r in full.rows]
    for algo, gated in ((full, lambda r: r.entropy > full.tau), (seq, lambda r: torch.ones_like(r.entropy) > 0)):
        row = algo.rows[0]
        _, _, decision, anchor, _ = algo.collate([row])
        start, end = row.prompt_len - 1, len(row.ids) - 1
        assert decision[0, start:end].tolist() == gated(row).tolist() and not decision[0, :start].any()
        assert anchor[0, :end].tolist() == (~decision[0, :end]).tolist()  # every other valid position, prompt too
    no_kl = _setup(tmp_path, "no_kl", _cfg(kl_coef=0.0), data_from="full")
    with_kl, without = full.train_step().metrics, no_kl.train_step().metrics
    assert with_kl["compute/base_forward_tokens"] == with_kl["compute/forward_tokens"] > 0
    assert without["compute/base_forward_tokens"] == 0 and without["loss"] == without["loss/decision_ce"]
    assert with_kl["loss/decision_ce"] == pytest.approx(without["loss/decision_ce"])  # the same first batch
    assert with_kl["loss"] == pytest.approx(with_kl["loss/decision_ce"] + 0.2 * with_kl["loss/anchor_kl"])
    later = [full.train_step().metrics for _ in range(3)]
    assert later[-1]["loss/anchor_kl"] > 1e-6  # the adapter moved the model away from the (adapter-less) base


def test_micro_batches_give_the_update_of_the_whole_batch(tmp_path):
    one = _setup(tmp_path, "one", _cfg(batch_size=4, micro_batch_size=1))
    four = _setup(tmp_path, "four", _cfg(batch_size=4, micro_batch_size=4), data_from="one")
    a, b = one.train_step().metrics, four.train_step().metrics
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-6) and a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    for (name, x), y in zip(_adapter(one.model).items(), _adapter(four.model).values(), strict=True):
        assert torch.allclose(x, y, atol=1e-6), name


# --------------------------------------------------------------------------------------------------- stored data
def test_rollouts_are_stored_once_and_a_resume_never_samples_again(tmp_path):
    ctx = _ctx(tmp_path, "run")
    calls = _Counting(ctx.policy)
    summary = _cfg(checkpoint_every=2).build(ctx).run()
    assert calls.calls == 3  # 8 problems, 3 a call
    stored = read_rollouts(tmp_path / "run" / "reason_maxxer" / "rollouts.jsonl")
    assert len(stored) == 32 and all(r.token_ids and r.prompt_token_ids for r in stored)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    report = json.loads((tmp_path / "run" / "reason_maxxer" / "report.json").read_text())
    assert summary["steps"] == len(lines) == report["steps"] == math.ceil(report["rollouts_trained"] / 2)
    assert lines[0]["generations"] == 32 and summary["generations"] == 32
    assert lines[0]["data/problems_sampled"] == 8 and lines[0]["compute/generated_tokens"] > 0
    assert summary["reason_maxxer"] == report  # the data counts and tau are in summary.json too
    again = _ctx(tmp_path, "run", policy=tiny_hf_policy(seed=3))
    calls = _Counting(again.policy)
    _cfg(checkpoint_every=2).build(again).run(resume=True)
    assert calls.calls == 0


def test_an_interrupted_sampling_continues_where_it_stopped(tmp_path):
    straight = _setup(tmp_path, "straight", _cfg())
    ctx = _ctx(tmp_path, "cut")
    calls = _Counting(ctx.policy, fail_at=2)  # interrupted while sampling the second chunk
    with pytest.raises(KeyboardInterrupt):
        _cfg().build(ctx).run()
    assert len(read_rollouts(tmp_path / "cut" / "reason_maxxer" / "rollouts.jsonl")) == 3 * 4
    ctx = _ctx(tmp_path, "cut")
    calls = _Counting(ctx.policy)
    loop = _cfg().build(ctx)
    loop.algorithm.setup()
    assert calls.calls == 2  # the two chunks left
    assert loop.algorithm.rollouts == straight.rollouts


class _CrashAfter3(ReasonMaxxer):
    def train_step(self):
        if self.loop.step == 3:
            raise RuntimeError("simulated crash")
        return super().train_step()


def test_resume_after_a_crash_ends_with_the_adapter_of_an_uninterrupted_run(tmp_path):
    cfg = _cfg(checkpoint_every=2, lora_dropout=0.1)  # dropout: the RNG state must be restored too
    straight = _ctx(tmp_path, "a")
    cfg.build(straight).run()
    crashed = _ctx(tmp_path, "b")
    with pytest.raises(RuntimeError, match="simulated crash"):
        from lrmgym.learners.engine.loop import Loop

        Loop(crashed, cfg, _CrashAfter3(cfg)).run()
    resumed = _ctx(tmp_path, "b", policy=tiny_hf_policy(seed=0))
    summary = cfg.build(resumed).run(resume=True)
    assert summary["steps"] > 3
    for (name, a), b in zip(_adapter(straight.policy.model).items(), _adapter(resumed.policy.model).values(),
                            strict=True):  # fmt: skip
        assert torch.equal(a, b), name
    losses = [[json.loads(x)["loss"] for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()] for d in "ab"]
    assert losses[0] == losses[1]


# --------------------------------------------------------------------------------------------------- rollouts_from
def test_rollouts_from_an_exported_file_with_strength_advantages(tmp_path):
    tok = tiny_hf_policy().tokenizer
    path = tmp_path / "traces.jsonl"
    rows = [
        {"task_id": "t1", "prompt": "Q:1+1", "completion": "2", "prompt_token_ids": None, "token_ids": None,
         "reward": 0.2, "correct": None, "strength": 1.0},
        {"task_id": "t1", "prompt": "Q:1+1", "completion": "3", "prompt_token_ids": None, "token_ids": None,
         "reward": 0.9, "correct": None, "strength": -1.0},
        {"task_id": "t1", "prompt": "Q:1+1", "completion": "22", "prompt_token_ids": [10, 11], "token_ids": [12, 1],
         "reward": 0.5, "correct": None, "strength": 3.0},
        {"task_id": "t2", "prompt": "Q:2", "completion": "x", "prompt_token_ids": None, "token_ids": None,
         "reward": 1.0, "correct": None, "strength": 0.0},
        {"task_id": "t2", "prompt": "Q:2", "completion": "y", "prompt_token_ids": None, "token_ids": None,
         "reward": 0.0, "correct": None, "strength": 0.0},  # constant strength: no signal
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    algo = _setup(tmp_path, "run", _cfg(rollouts_from=str(path), advantage="strength", trim_longest=0.0))
    assert algo.report["source"] == "file" and algo.report["encoded"] == 4 and algo.report["problems_kept"] == 1
    std = math.sqrt(((1 - 1) ** 2 + (-1 - 1) ** 2 + (3 - 1) ** 2) / 3)  # mean 1
    assert [r.advantage for r in algo.rows] == pytest.approx([0.0, -2 / std, 2 / std])
    # Encoded with the policy's tokenizer (EOS appended); given ids are kept as they are.
    assert algo.rows[0].ids == tok("Q:1+1")["input_ids"] + tok("2", add_special_tokens=False)["input_ids"] + [1]
    assert algo.rows[2].ids == [10, 11, 12, 1] and algo.rows[2].prompt_len == 2
    stored = read_rollouts(tmp_path / "run" / "reason_maxxer" / "rollouts.jsonl")
    assert stored[2] == JudgedRollout.from_dict(rows[2]) and stored[0].token_ids == algo.rows[0].ids[-2:]
    assert algo.train_step().metrics["generations"] == 0


def test_a_bad_rollouts_file_names_the_file_and_line(tmp_path):
    path = tmp_path / "traces.jsonl"
    good = {"task_id": "t", "prompt": "Q:", "completion": "a", "reward": 1.0}
    fix = "Fix this line, or export the file again with `lrmgym export traces`."
    cases = [
        ({**good, "reward": "high"}, "reward must be a finite number or null, got 'high'"),
        ({**good, "rewards": 1.0}, "missing keys [], unknown keys ['rewards']; the keys are task_id, prompt, "
                                   "completion, prompt_token_ids, token_ids, reward, correct, strength, "
                                   "finish_reason, step, verdict"),
        ({**good, "token_ids": [1, -2]}, "token_ids must be null or a non-empty list of token ids (integers >= 0)"),
        ({**good, "prompt": [{"role": "user"}]}, "prompt must be a string or a list of chat messages "
                                                 "{role: str, content: str}"),
        ({**good, "token_ids": [5, 999]}, "token_ids holds id 999, not below the policy's vocabulary (105)"),
        ({**good, "prompt_token_ids": [105]}, "prompt_token_ids holds id 105, not below the policy's vocabulary (105)"),
    ]  # fmt: skip
    for bad, problem in cases:
        path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
        message = f"{path}:2: not a judged rollout: {problem}. {fix}"
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            read_rollouts(path, vocab_size=105)
    # The edges are fine: id 0 and the vocabulary's last id (vocab_size - 1).
    path.write_text(json.dumps({**good, "prompt_token_ids": [0], "token_ids": [104, 0]}) + "\n")
    assert read_rollouts(path, vocab_size=105)[0].token_ids == [104, 0]
    path.write_text('{"task_id": "t",\n')
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:1: not valid JSON"):
        read_rollouts(path)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(tmp_path / 'no.jsonl'))}: no such data file"):
        _setup(tmp_path, "run", _cfg(rollouts_from=str(tmp_path / "no.jsonl")))


def test_write_and_read_round_trip(tmp_path):
    rollouts = [_rollout("t", True, 2), JudgedRollout("u", [{"role": "user", "content": "hi"}], "yo", strength=0.5)]
    write_rollouts(tmp_path / "r.jsonl", rollouts)
    assert read_rollouts(tmp_path / "r.jsonl") == rollouts


# --------------------------------------------------------------------------------------------------- exports
def test_the_adapter_is_saved_used_for_sampling_and_merged_on_request(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ctx = _ctx(tmp_path, "run")
    _cfg().build(ctx).run()
    model = ctx.policy.model
    assert isinstance(model, PeftModel)  # what ctx.policy.generate (the loop's evaluation) samples with
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        trained = model(input_ids=ids).logits
        with model.disable_adapter():
            assert not torch.allclose(model(input_ids=ids).logits, trained)
        loaded = PeftModel.from_pretrained(tiny_hf_policy(seed=0).model, str(tmp_path / "run" / "adapter"))
        assert torch.allclose(loaded(input_ids=ids).logits, trained, atol=1e-5)
    merged_ctx = _ctx(tmp_path, "merged")
    shutil.copytree(tmp_path / "run" / "reason_maxxer", tmp_path / "merged" / "reason_maxxer")
    _cfg(merge=True).build(merged_ctx).run()
    assert not isinstance(merged_ctx.policy.model, PeftModel)
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged" / "merged"))(input_ids=ids).logits
    assert torch.allclose(merged, trained, atol=1e-5)  # same data, same seed: the same adapter, merged
    assert (tmp_path / "merged" / "merged" / "tokenizer.json").is_file()


# --------------------------------------------------------------------------------------------------- config
def test_config_errors_name_the_values_and_the_fix():
    with pytest.raises(ValidationError) as err:
        ReasonMaxxerConfig(advantage="strength")
    assert err.value.errors()[0]["msg"] == (
        "Value error, advantage=strength needs rollouts_from: sampled rollouts carry no Bradley-Terry strength (an "
        "arena judge's exported traces do). Set rollouts_from=PATH or advantage=reward."
    )
    with pytest.raises(ValidationError) as err:
        ReasonMaxxerConfig(micro_batch_size=16)
    assert err.value.errors()[0]["msg"] == (
        "Value error, micro_batch_size=16 exceeds batch_size=8 (rollouts per optimizer step); lower micro_batch_size."
    )
    assert ReasonMaxxerConfig(batch_size=8).for_data(20).steps == 3
    assert ReasonMaxxerConfig(epochs=2, batch_size=8).for_data(20).steps == 6
    assert ReasonMaxxerConfig(steps=5).for_data(20).steps == 5


def test_defaults_are_the_papers_and_the_preset_resolves():
    cfg = ReasonMaxxerConfig()
    assert (cfg.rollouts_per_problem, cfg.temperature, cfg.top_p, cfg.max_problems) == (20, 0.6, 0.95, 50)
    assert (cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_targets) == (
        32, 64.0, 0.0, ["q_proj", "k_proj", "v_proj", "o_proj"],
    )  # fmt: skip
    assert (cfg.lr, cfg.adam_betas, cfg.weight_decay, cfg.max_grad_norm) == (1e-4, (0.9, 0.999), 0.0, 1.0)
    assert (cfg.batch_size, cfg.micro_batch_size, cfg.epochs, cfg.kl_coef, cfg.adv_clip) == (8, 1, 1, 0.2, 2.5)
    assert (cfg.trim_longest, cfg.decision_fraction, cfg.tau) == (0.2, 0.04, None)
    preset = resolve(("env=math", "policy=tiny", "learner=reason_maxxer", "learner.lora_r=4")).learner
    assert preset.kind == "reason_maxxer" and preset.lora_r == 4 and preset.temperature == 1.0


# --------------------------------------------------------------------------------------------------- mutants
def test_the_base_entropies_sit_at_the_completion_positions(tmp_path):
    # Kills: the slice of the scored entropies shifted by one (prompt_len : len, or prompt_len-1 : len-2).
    from lrmgym.learners.algorithms.logprobs import token_entropy

    policy = tiny_hf_policy(seed=0)
    algo = ReasonMaxxer(_cfg(score_batch_size=3))
    algo.policy, algo.pad_id = policy, 0
    rollouts = [
        JudgedRollout("a", "p", "c", [5, 6, 7], [8, 9, 10, 11], 1.0, True),
        JudgedRollout("b", "p", "c", [5, 6], [12, 13], 0.0, False),
        JudgedRollout("c", "p", "c", [5, 6, 7, 8, 9], [14], 0.0, False),
    ]
    scored = algo._score(rollouts)
    with torch.no_grad():
        for r, got in zip(rollouts, scored, strict=True):
            ids = torch.tensor([[*r.prompt_token_ids, *r.token_ids]])
            entropy = token_entropy(policy.model(input_ids=ids).logits)[0]  # entry t predicts token t + 1
            want = entropy[len(r.prompt_token_ids) - 1 :]  # the predictions of the completion's tokens
            assert got.shape == (len(r.token_ids),)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_the_clarity_order_puts_the_clearest_rollout_first(tmp_path):
    # Kills: order=clarity sorted ascending (the least clear rollouts first).
    from lrmgym.learners.algorithms.reason_maxxer import _Row

    algo = ReasonMaxxer(_cfg(order="clarity", batch_size=2, full_sequence=False))
    algo.tau = 1.0
    entropy = torch.tensor([2.0, 0.5, 2.0, 0.5])  # half of the positions are decisions
    algo.rows = [_Row([1] * 6, 2, entropy, adv, i) for i, adv in enumerate([0.1, -2.0, 0.5, 1.0])]
    algo.batches_per_epoch = 2
    assert algo.batch(0) + algo.batch(1) == [1, 3, 2, 0]  # |A| x decision share, descending
