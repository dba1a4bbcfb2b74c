"""KL-LoRA distillation (learner=kl_distill): the loss by hand, the top-k cache, the teacher, training, resume."""

from __future__ import annotations

import json
import math

import pytest
import torch
from click.testing import CliRunner
from learner_helpers import TEST_ENV_ID, register_test_env, save_tiny_hf, tiny_hf_policy

from lrmgym.compose import load_named_model
from lrmgym.learners.algorithms.kl_distill import KLDistill, KLDistillConfig, forward_kl_topk, teacher_topk
from lrmgym.learners.engine.context import RunContext
from lrmgym.registry import make

register_test_env()


# --------------------------------------------------------------------------------------------------- the loss
def _softmax(v: list[float]) -> list[float]:
    z = sum(math.exp(x) for x in v)
    return [math.exp(x) / z for x in v]


TEACHER = [2.0, 1.0, 0.0, -1.0]  # top-2: tokens 0 and 1
STUDENT = [0.0, 1.0, 0.5, 0.0]


def _by_hand() -> dict[str, float]:
    q = _softmax(TEACHER[:2])  # renormalised over the top 2: e/(e+1), 1/(e+1)
    p = _softmax(STUDENT)  # the student's full softmax
    forward = sum(q[i] * (math.log(q[i]) - math.log(p[i])) for i in range(2))
    reverse = sum(p[i] * (math.log(p[i]) - math.log(q[i])) for i in range(2))
    full_q = _softmax(TEACHER)  # not renormalised: the top-2's share of the full softmax
    unnormalised = sum(full_q[i] * (math.log(full_q[i]) - math.log(p[i])) for i in range(2))
    return {"forward": forward, "reverse": reverse, "unnormalised": unnormalised}


def test_the_top_k_targets_are_renormalised_over_the_k():
    ids, logq = teacher_topk(torch.tensor([TEACHER]), 2)
    assert ids.tolist() == [[0, 1]]
    assert logq.exp().tolist()[0] == pytest.approx(_softmax(TEACHER[:2]), rel=1e-6)
    assert float(logq.exp().sum()) == pytest.approx(1.0, abs=1e-6)
    assert teacher_topk(torch.tensor([TEACHER]), 64)[0].shape == (1, 4)  # k is capped at the vocabulary


def test_the_loss_is_the_forward_kl_from_the_teacher_by_hand():
    ids, logq = teacher_topk(torch.tensor([[TEACHER]]), 2)  # [1, 1, 2]
    kl = forward_kl_topk(torch.tensor([[STUDENT]]), ids, logq, torch.tensor([[True]]))
    hand = _by_hand()
    assert float(kl) == pytest.approx(hand["forward"], rel=1e-5)  # 0.7487...
    # the swapped direction KL(student || teacher) and an unrenormalised top-k are different numbers
    assert abs(hand["forward"] - hand["reverse"]) > 0.1 and abs(hand["forward"] - hand["unnormalised"]) > 0.1
    same = forward_kl_topk(torch.tensor([[TEACHER]]), ids, logq, torch.tensor([[True]]))
    assert float(same) > 0  # the teacher itself as student: mass outside the top 2 still costs
    exact = torch.tensor([[[*TEACHER[:2], -1e4, -1e4]]])  # the renormalised top 2 exactly: no loss
    assert float(forward_kl_topk(exact, ids, logq, torch.tensor([[True]]))) == pytest.approx(0.0, abs=1e-6)


def test_masked_positions_count_nothing():
    ids, logq = teacher_topk(torch.tensor([[TEACHER, TEACHER]]), 2)
    kl = forward_kl_topk(torch.tensor([[STUDENT, STUDENT]]), ids, logq, torch.tensor([[False, True]]))
    assert kl[0, 0].item() == 0.0 and kl[0, 1].item() == pytest.approx(_by_hand()["forward"], rel=1e-5)


# --------------------------------------------------------------------------------------------------- the learner
def _cfg(teacher, **kw) -> KLDistillConfig:
    base = dict(
        teacher=str(teacher), problems=6, rollouts_per_problem=2, temperature=1.0, top_p=1.0, max_new_tokens=6,
        sample_chunk=4, top_k=8, lora_r=4, lora_alpha=8.0, lr=1e-2, batch_size=4, micro_batch_size=2, epochs=2,
        score_batch_size=5, eval_before_after=False, progress=False, checkpoint_every=100,
    )  # fmt: skip
    return KLDistillConfig(**{**base, **kw})


def _ctx(tmp_path, name: str, seed: int = 0, load_model=load_named_model) -> RunContext:
    return RunContext(env=make(TEST_ENV_ID), policy=tiny_hf_policy(seed=0), eval=None, seed=seed,
                      run_dir=tmp_path / name, load_model=load_model)  # fmt: skip


@pytest.fixture
def teacher(tmp_path):
    return save_tiny_hf(tmp_path / "teacher", seed=1)  # another random model with the same tokenizer


def test_the_first_step_s_loss_is_the_mean_kl_over_generated_tokens_only(tmp_path, teacher):
    loop = _cfg(teacher).build(_ctx(tmp_path, "run"))
    algo: KLDistill = loop.algorithm
    algo.setup()
    first = [algo.rows[i] for i in algo.batch(0)]
    short = first[0]  # cut one rollout to 2 generated tokens: a per-sequence mean would then differ
    short.ids, short.top_ids, short.top_logq = short.ids[: short.prompt_len + 2], short.top_ids[:2], short.top_logq[:2]
    teacher_model = tiny_hf_policy(seed=1).model.eval()  # recomputed here, not read from the cache
    kls, per_row = [], []
    with torch.no_grad():
        for r in first:
            ids = torch.tensor([r.ids])
            t = teacher_model(input_ids=ids).logits[0, r.prompt_len - 1 : -1]  # predicts the generated tokens
            s = algo.model(input_ids=ids).logits[0, r.prompt_len - 1 : -1]  # the fresh adapter: the base
            q = torch.log_softmax(t.topk(8).values, -1)
            p = torch.log_softmax(s, -1).gather(-1, t.topk(8).indices)
            row = (q.exp() * (q - p)).sum(-1)
            kls += row.tolist()
            per_row.append(float(row.mean()))
    loop.step = 0
    metrics = algo.train_step().metrics
    assert metrics["loss"] == pytest.approx(sum(kls) / len(kls), rel=1e-4)
    assert abs(metrics["loss"] - sum(per_row) / len(per_row)) > 1e-4  # not a mean of per-rollout means
    assert metrics["length/mean"] == len(kls) / len(first)


def test_training_pulls_the_student_toward_the_teacher_and_exports_the_adapter(tmp_path, teacher):
    summary = _cfg(teacher, merge=True).build(_ctx(tmp_path, "run")).run()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    report = json.loads((tmp_path / "run" / "kl_distill" / "report.json").read_text())
    assert summary["steps"] == len(lines) == 2 * math.ceil(12 / 4)  # 6 problems x 2 rollouts, 2 epochs
    assert lines[-1]["loss"] < lines[0]["loss"]
    assert lines[0]["generations"] == 12 and lines[0]["compute/generated_tokens"] == report["generated_tokens"] > 0
    assert lines[0]["compute/scoring_tokens"] > lines[0]["compute/generated_tokens"]  # prompts + completions
    assert report["teacher"] == str(teacher) and report["top_k"] == 8
    assert report["trainable_params"] == sum(4 * (32 + 32) for _ in range(4))  # rank 4 on q, k, v, o of 32 x 32
    assert report["lora_param_share"] == pytest.approx(report["trainable_params"] / report["base_params"])
    assert (tmp_path / "run" / "adapter" / "adapter_config.json").is_file()
    assert (tmp_path / "run" / "merged" / "config.json").is_file()


def test_a_resume_needs_neither_new_rollouts_nor_the_teacher(tmp_path, teacher):
    _cfg(teacher, steps=2).build(_ctx(tmp_path, "run")).run()
    cached = torch.load(tmp_path / "run" / "kl_distill" / "topk.pt", weights_only=False)
    for path in teacher.iterdir():  # the cache holds all the teacher gives: it may be gone now
        path.unlink()
    summary = _cfg(teacher, steps=4).build(_ctx(tmp_path, "run")).run(resume=True)
    assert summary["steps"] == 4
    again = torch.load(tmp_path / "run" / "kl_distill" / "topk.pt", weights_only=False)
    assert all(torch.equal(a, b) for a, b in zip(cached["logq"], again["logq"], strict=True))


def test_a_cache_made_with_another_top_k_is_refused(tmp_path, teacher):
    _cfg(teacher, steps=1).build(_ctx(tmp_path, "run")).run()
    loop = _cfg(teacher, steps=1, top_k=4).build(_ctx(tmp_path, "run"))
    with pytest.raises(ValueError, match=r"topk\.pt was made with other options \(top_k=8 there, 4 now\)"):
        loop.algorithm.setup()


def test_a_bad_teacher_is_a_one_line_error_before_anything_is_sampled(tmp_path):
    loop = _cfg(tmp_path / "nowhere").build(_ctx(tmp_path, "run"))
    with pytest.raises(ValueError) as err:
        loop.algorithm.setup()
    assert str(err.value) == (
        f"learner.teacher: {str(tmp_path / 'nowhere')!r} does not exist; give a model folder (with config.json), a "
        "run directory of `lrmgym run` (with config.yaml), or tiny (the shipped default model)."
    )
    assert not (tmp_path / "run" / "kl_distill").exists()


def test_a_context_that_cannot_load_models_is_refused(tmp_path, teacher):
    loop = _cfg(teacher).build(_ctx(tmp_path, "run", load_model=None))
    with pytest.raises(ValueError, match=r"^learner=kl_distill needs a run context that can load its teacher"):
        loop.algorithm.setup()


def test_a_teacher_with_another_tokenizer_is_refused(tmp_path, teacher):
    from lrmgym.policies.tiny import build_tokenizer

    tok = build_tokenizer()
    tok.add_tokens(["<extra>"])
    tok.save_pretrained(str(teacher))
    loop = _cfg(teacher).build(_ctx(tmp_path, "run"))
    with pytest.raises(ValueError, match=r"^learner.teacher: its tokenizer's vocabulary differs from the policy's"):
        loop.algorithm.setup()


def test_the_cli_reports_a_bad_teacher_in_one_line_and_keeps_no_run_dir(tmp_path):
    from lrmgym.cli.main import cli

    args = ["run", "env=echo", "learner=kl_distill", f"learner.teacher={tmp_path}/missing",
            f"run.output_dir={tmp_path}/runs", "run.name=r"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"Error: learner.teacher: '{tmp_path}/missing' does not exist; give a model folder (with config.json), a "
        "run directory of `lrmgym run` (with config.yaml), or tiny (the shipped default model)."
    )
    assert not (tmp_path / "runs" / "r").exists()


def test_defaults_are_the_papers_and_the_preset_resolves():
    from lrmgym.configs.resolve import resolve

    cfg = KLDistillConfig(teacher="tiny")
    assert (cfg.top_k, cfg.problems, cfg.epochs, cfg.lr, cfg.weight_decay, cfg.temperature, cfg.top_p) == (
        64, 100, 3, 1e-4, 0.01, 0.6, 0.95,
    )  # fmt: skip
    assert (cfg.lora_r, cfg.batch_size, cfg.lora_targets) == (32, 16, ["q_proj", "k_proj", "v_proj", "o_proj"])
    assert cfg.for_data(100).warmup_steps == math.ceil(0.1 * 3 * math.ceil(100 / 16))  # 10 % of the steps
    resolved = resolve(["learner=kl_distill", "learner.teacher=tiny"]).learner
    assert resolved.kind == "kl_distill" and resolved.teacher == "tiny" and resolved.top_k == 64
