"""Ring-Zero's self-distillation stage: traces, the corpus and its pruning, the masked-CE trainer, SD under the loop."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from learner_helpers import tiny_hf_policy
from pydantic import ValidationError

from lrmgym.core import Completion, Verdict, learner_env
from lrmgym.learners.algorithms.distill import (
    DEFAULT_PRUNE_PROMPT,
    SDConfig,
    SelfDistill,
    Trace,
    build_corpus,
    pruner_for,
    read_traces,
    self_distill_loop,
    write_traces,
)
from lrmgym.learners.algorithms.sft import (
    MaskedCE,
    collate_masked_ce,
    cosine_lr_factor,
    masked_ce_batches,
    train_masked_ce,
)
from lrmgym.learners.engine.context import RunContext
from lrmgym.learners.engine.loop import Loop
from lrmgym.policies import fasttrain
from lrmgym.policies.tiny import TinyArch, TinyTrainConfig, build_model, build_tokenizer
from lrmgym.registry import make
from lrmgym.testing.mock import ADVERSARIAL_OUTPUTS, AdversarialPolicy, ScriptedPolicy

SEED = 11  # the training stream the test traces come from
TOK = build_tokenizer()
EOS = TOK.eos_token_id


def _ids(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def env():
    return make("lrmgym/Math-v0", template="r1", style="compact")


def _task(env, position):
    return learner_env(env).task_at(position, seed=SEED)


def _padded(solution: str) -> str:
    """The solution with a redundant segment in its working (still correct, 15 tokens longer)."""
    return solution.replace("</think>", ";so far so good</think>")


def _trace(env, position: int, text: str, eos: bool = True, task_id: str | None = None) -> Trace:
    task = _task(env, position)
    ids = _ids(text) + ([EOS] if eos else [])
    return Trace(task_id or task.id, position, SEED, _ids(task.prompt), ids, text, len(ids))


def _solution(env, position: int) -> str:
    return _task(env, position).metadata["solution"]


class FakePruner:
    """Replies to each pruning prompt by the trace it holds: ``replies[trace text] -> Completion``; records calls."""

    def __init__(self, replies: dict[str, Completion], fail_calls: tuple[int, ...] = ()) -> None:
        self.replies, self.fail_calls = replies, fail_calls
        self.calls: list[tuple[list, object]] = []

    def generate(self, prompts, n=1, sampling=None):
        self.calls.append((list(prompts), sampling))
        if len(self.calls) in self.fail_calls:
            raise TimeoutError("timed out after 60 s")
        out = []
        for prompt in prompts:
            text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
            # The trace sits between "Solution:\n" and the next blank line in the default prompt.
            trace = text.split("Solution:\n", 1)[1].split("\n\n", 1)[0]
            out.append([self.replies[trace]])
        return out


# --------------------------------------------------------------------------------------------------- masked CE
def _old_train_masked_ce(model, tokenizer, cfg, pairs):
    """The tiny build's trainer as it was before MaskedCE, written out: the reference for bit-identity."""
    import torch.nn.functional as F

    def factor(step):
        if step < cfg.warmup:
            return (step + 1) / cfg.warmup
        progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    def batches():
        prompts = tokenizer([p for p, _ in pairs], add_special_tokens=False)["input_ids"]
        targets = tokenizer([t for _, t in pairs], add_special_tokens=False)["input_ids"]
        eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        for start in range(0, len(pairs), cfg.batch_size):
            chunk = slice(start, start + cfg.batch_size)
            rows = [(p, t + [eos]) for p, t in zip(prompts[chunk], targets[chunk], strict=True)]
            width = max(len(p) + len(t) for p, t in rows)
            ids = torch.full((len(rows), width), pad, dtype=torch.long)
            labels = torch.full((len(rows), width), -100, dtype=torch.long)
            for r, (p, t) in enumerate(rows):
                ids[r, : len(p) + len(t)] = torch.tensor(p + t)
                labels[r, len(p) : len(p) + len(t)] = torch.tensor(t)
            yield ids, labels

    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    model.train()
    losses = []
    for ids, labels in batches():
        attention = (ids != tokenizer.pad_token_id).long()
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    model.eval()
    return losses


def test_train_masked_ce_is_bit_identical_to_the_recipe_before_the_refactor(monkeypatch):
    # Bit-identical through model.forward, as the old recipe ran; the lean training forward (which changes float
    # rounding only) is checked against model.forward in tests/policies/test_fasttrain.py.
    monkeypatch.setattr(fasttrain.LlamaTrainer, "build", classmethod(lambda cls, model: None))
    # Prompts and solutions of different lengths, so rows are padded; 5 steps cross the warm-up into the cosine.
    pairs = [
        (f"Q:Compute {7 * i}+{i}. A:", f"<think>{7 * i}+{i}={8 * i}</think><answer>{8 * i}</answer>") for i in range(20)
    ]
    cfg = TinyTrainConfig(steps=5, batch_size=4, warmup=2, lr=3e-3, weight_decay=0.01)
    arch = TinyArch(hidden=64, layers=1, heads=2, mlp=64, max_positions=64)
    old, new = build_model(arch, len(TOK), seed=3), build_model(arch, len(TOK), seed=3)
    old_losses = _old_train_masked_ce(old, TOK, cfg, pairs)
    facts = train_masked_ce(new, TOK, cfg, pairs, progress=False)
    assert facts["first_loss"] == old_losses[0]
    assert facts["final_loss"] == float(sum(old_losses) / len(old_losses))
    init = build_model(arch, len(TOK), seed=3).state_dict()
    for (name, a), b in zip(old.state_dict().items(), new.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert not torch.equal(new.state_dict()["lm_head.weight"], init["lm_head.weight"])  # the models did train
    assert not new.training


def test_cosine_schedule_by_hand():
    factor = [cosine_lr_factor(s, steps=6, warmup=2, min_ratio=0.1) for s in range(7)]
    assert factor[:3] == [0.5, 1.0, 1.0]  # warm-up, then the cosine starts at 1
    assert factor[4] == pytest.approx(0.55)  # halfway: 0.1 + 0.9 * 0.5
    assert factor[6] == pytest.approx(0.1)
    assert cosine_lr_factor(9, steps=6, warmup=2, min_ratio=0.1) == pytest.approx(0.1)  # past the end: stays


def test_eos_is_appended_only_when_missing():
    ids, labels = collate_masked_ce([([5, 6], [7, EOS]), ([5], [8])], pad_id=0, eos_id=EOS)
    assert ids.tolist() == [[5, 6, 7, EOS], [5, 8, EOS, 0]]
    assert labels.tolist() == [[-100, -100, 7, EOS], [-100, 8, EOS, -100]]
    # Text pairs: the tokenized solution gets exactly one EOS.
    ((ids, labels),) = masked_ce_batches([("Q:", "<answer>1</answer>")], TOK, batch_size=8)
    assert ids[0].tolist() == _ids("Q:<answer>1</answer>") + [EOS]
    assert labels[0].tolist() == [-100, -100] + _ids("<answer>1</answer>") + [EOS]


def test_a_pad_token_equal_to_eos_does_not_hide_the_targets_eos():
    # Many HF tokenizers pad with EOS: the attention mask comes from the labels, so the EOS is attended and counted.
    model = build_model(TinyArch(hidden=64, layers=1, heads=2, mlp=64, max_positions=64), len(TOK), seed=0)
    trainer = MaskedCE(model, 1e-3, lambda s: 1.0)
    stats = trainer.step(*collate_masked_ce([([5, 6], [7]), ([5], [8, 9, 10])], pad_id=EOS, eos_id=EOS))
    assert (stats["tokens"], stats["target_tokens"]) == (4 + 5, 2 + 4)
    assert stats["lr"] == 1e-3 and stats["grad_norm"] > 0 and not model.training


# --------------------------------------------------------------------------------------------------- traces
def test_trace_json_round_trip_and_file(env, tmp_path):
    traces = [_trace(env, 0, _solution(env, 0)), _trace(env, 1, "<think>{x}</think>\n", eos=False)]
    assert Trace.from_json(traces[0].to_json()) == traces[0]
    path = tmp_path / "traces.jsonl"
    write_traces(path, traces)
    assert read_traces(path) == traces
    assert len(path.read_text().splitlines()) == 2


def test_a_broken_trace_line_names_the_file_and_line(env, tmp_path):
    path = tmp_path / "traces.jsonl"
    good = _trace(env, 0, _solution(env, 0)).to_json()
    path.write_text(good + "\n\n" + good[:40] + "\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}, line 3: not a trace: not JSON \(") as err:
        read_traces(path)
    assert str(err.value).endswith("was it cut short or edited?")
    record = json.loads(good)
    record["tokens"] = "7"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}, line 1: not a trace: tokens must be an integer"):
        read_traces(path)


def test_trace_tokens_must_be_the_completion_length():
    msg = "Trace 't': tokens=3 but token_ids has 2; tokens must be len(token_ids)."
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        Trace("t", 0, 0, [5], [6, EOS], "x", 3)


# --------------------------------------------------------------------------------------------------- corpus
def test_corpus_keeps_the_shortest_trace_per_task_ties_by_first_seen(env):
    sol0, sol1 = _solution(env, 0), _solution(env, 1)
    long0, short0 = _trace(env, 0, _padded(sol0)), _trace(env, 0, sol0)
    first1 = _trace(env, 1, sol1)
    tie1 = _trace(env, 1, sol1.replace("<think>", "<think> ").replace(";", ""))  # other text, same length
    assert tie1.tokens == first1.tokens
    corpus, report = build_corpus([long0, first1, short0, tie1], env, TOK, SDConfig())
    assert corpus == [(short0.prompt_token_ids, short0.token_ids), (first1.prompt_token_ids, first1.token_ids)]
    assert (report.traces, report.kept, report.pruned_accepted, report.pruned_rejected) == (4, 2, 0, 0)
    assert report.mean_tokens_before == report.mean_tokens_after == (short0.tokens + first1.tokens) / 2


def test_a_trace_without_eos_gets_one_in_the_corpus(env):
    trace = _trace(env, 0, _solution(env, 0), eos=False)
    ((_, target),), report = build_corpus([trace], env, TOK, SDConfig())
    assert target == trace.token_ids + [EOS]
    assert report.mean_tokens_before == trace.tokens + 1


def test_too_few_traces_is_an_error_that_says_what_to_do(env):
    traces = [_trace(env, 0, _solution(env, 0)), _trace(env, 0, _padded(_solution(env, 0)))]
    msg = (
        "Self-distillation needs correct traces of at least min_traces=2 tasks, got 1 (from 2 traces). Train RL-1 "
        "longer or on easier tasks so that more tasks are solved, or lower min_traces."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        build_corpus(traces, env, TOK, SDConfig(min_traces=2))


def test_pruned_traces_are_taken_only_when_shorter_and_still_verified(env):
    sol = [_solution(env, i) for i in range(7)]
    answer = [str(_task(env, i).answer) for i in range(7)]
    originals = [sol[i] if i == 2 else _padded(sol[i]) for i in range(7)]  # the third is short already
    replies = {
        originals[0]: Completion(text=" " + sol[0] + "\n"),  # shorter and correct: taken (whitespace trimmed)
        originals[1]: Completion(text=sol[1].replace(f">{answer[1]}<", f">{answer[1]}1<")),  # wrong answer
        originals[2]: Completion(text=_padded(sol[2])),  # longer
        originals[3]: Completion(text=f"<answer>{answer[3]}</answer>"),  # shorter, right answer, format broken
        originals[4]: Completion(text="  \n"),
        originals[5]: Completion(text=sol[5].replace("</think>", "<eos></think>")),  # smuggles an EOS token in
        originals[6]: Completion(text=sol[6][:10], finish_reason="length"),  # hit the token budget
    }
    traces = [_trace(env, i, text) for i, text in enumerate(originals)]
    pruner = FakePruner(replies)
    corpus, report = build_corpus(traces, env, TOK, SDConfig(prune_batch_size=4), pruner=pruner)
    assert corpus[0][1] == _ids(sol[0]) + [EOS]
    assert [target for _, target in corpus[1:]] == [t.token_ids for t in traces[1:]]
    assert (report.kept, report.pruned_accepted, report.pruned_rejected) == (7, 1, 6)
    assert report.rejected == {
        "empty": 1, "format": 1, "not_shorter": 1, "special_tokens": 1, "truncated": 1, "wrong": 1,
    }  # fmt: skip
    before = [t.tokens for t in traces]
    assert report.mean_tokens_before == sum(before) / 7
    assert report.mean_tokens_after == (sum(before) - 15) / 7  # only the first lost its 15-token segment
    # Two requests (4 + 3 traces), greedy, each budgeted at its longest original trace.
    assert [len(prompts) for prompts, _ in pruner.calls] == [4, 3]
    assert [s.temperature for _, s in pruner.calls] == [0.0, 0.0]
    assert [s.max_new_tokens for _, s in pruner.calls] == [max(before[:4]), max(before[4:])]
    assert pruner.calls[0][0][0] == DEFAULT_PRUNE_PROMPT.format(prompt=_task(env, 0).prompt, solution=originals[0])


def test_a_failing_pruner_keeps_the_originals_and_is_counted(env):
    traces = [_trace(env, i, _padded(_solution(env, i))) for i in range(3)]
    replies = {t.text: Completion(text=_solution(env, i)) for i, t in enumerate(traces)}
    pruner = FakePruner(replies, fail_calls=(1,))  # the first request (traces 0 and 1) times out
    corpus, report = build_corpus(traces, env, TOK, SDConfig(prune_batch_size=2), pruner=pruner)
    assert [target for _, target in corpus[:2]] == [traces[0].token_ids, traces[1].token_ids]
    assert corpus[2][1] == _ids(_solution(env, 2)) + [EOS]
    assert (report.pruned_accepted, report.pruned_rejected, report.rejected) == (1, 2, {"error": 2})
    assert report.first_error == "TimeoutError: timed out after 60 s"


def test_adversarial_pruner_output_is_refused_without_crashing(env):
    traces = [_trace(env, i, _padded(_solution(env, i))) for i in range(len(ADVERSARIAL_OUTPUTS))]
    corpus, report = build_corpus(traces, env, TOK, SDConfig(), pruner=AdversarialPolicy())
    assert report.pruned_accepted == 0 and report.pruned_rejected == len(traces)
    assert report.rejected["unencodable"] == 1  # the lone surrogate
    assert [target for _, target in corpus] == [t.token_ids for t in traces]


def test_the_prompt_is_filled_in_one_pass_and_can_be_sent_as_chat(env):
    cfg = SDConfig(prune_prompt="P={prompt} S={solution}", prune_chat=True)
    assert cfg.fill_prompt("a {solution} b", "c {prompt} d") == "P=a {solution} b S=c {prompt} d"
    trace = _trace(env, 0, _padded(_solution(env, 0)))
    pruner = ScriptedPolicy(lambda prompt, i: _solution(env, 0))
    _, report = build_corpus([trace], env, TOK, cfg, pruner=pruner)
    assert report.pruned_accepted == 1
    assert pruner.calls[0][0] == [[{"role": "user", "content": f"P={_task(env, 0).prompt} S={trace.text}"}]]


def test_traces_from_another_env_are_an_error_when_pruning(env):
    trace = _trace(env, 0, _solution(env, 0), task_id="math/other/0")
    msg = (
        f"Trace of task 'math/other/0' (position 0, stream seed {SEED}) rebuilds as task {_task(env, 0).id!r}: "
        "the env is not the one the traces were recorded in. Use the RL stage's env."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        build_corpus([trace], env, TOK, SDConfig(), pruner=ScriptedPolicy(["x"]))


# --------------------------------------------------------------------------------------------------- config
def _msg(err: pytest.ExceptionInfo) -> str:
    return err.value.errors()[0]["msg"]


def test_prune_accepts_none_self_or_a_policy_config():
    policy = object()
    assert pruner_for(SDConfig(), policy) is None
    assert pruner_for(SDConfig(prune="self"), policy) is policy
    cfg = SDConfig(prune={"kind": "mock", "mode": "scripted", "responses": ["r"]})
    assert type(cfg.prune).__name__ == "MockPolicyConfig"
    assert pruner_for(cfg, policy).generate(["q"])[0][0].text == "r"
    seen = []
    resolved = SDConfig.model_validate(
        {"prune": {"kind": "openai"}},
        context={"component": lambda group, data: seen.append((group, data)) or cfg.prune},
    )
    assert seen == [("policy", {"kind": "openai"})] and resolved.prune is cfg.prune


def test_prune_errors_name_the_value_and_the_fix():
    with pytest.raises(ValidationError) as err:
        SDConfig(prune="Self")
    assert _msg(err) == (
        "Value error, expected 'none', 'self' or a policy config such as {kind: openai, base_url: ..., model: ...}, "
        "got 'Self'. Did you mean 'self'?"
    )
    with pytest.raises(ValidationError) as err:
        SDConfig(prune={"kind": "nope"})
    assert _msg(err).startswith("Value error, policy.kind: unknown kind 'nope'; allowed: ")
    with pytest.raises(ValidationError) as err:
        SDConfig(prune_prompt="Shorten: {solution}")
    assert _msg(err) == (
        "Value error, prune_prompt must contain both {prompt} and {solution}; missing: {prompt}. Put them where "
        "the task's prompt and the trace to prune go."
    )
    with pytest.raises(ValidationError, match="extra_forbidden"):
        SDConfig(epoch=3)


def test_steps_default_to_epochs_over_the_corpus():
    assert SDConfig(epochs=3, batch_size=4).for_corpus(10).steps == 9
    assert SDConfig(steps=5).for_corpus(10).steps == 5


# --------------------------------------------------------------------------------------------------- training
def _corpus(env, count: int):
    tasks = [_task(env, i) for i in range(count)]
    return [(_ids(t.prompt), _ids(t.metadata["solution"]) + [EOS]) for t in tasks]


def _corpus_loss(model, corpus) -> float:
    import torch.nn.functional as F

    ids, labels = collate_masked_ce(corpus, pad_id=0, eos_id=EOS)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=(ids != 0).long()).logits[:, :-1]  # no token is <pad>
    return float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100))


def _sd_cfg(**kw) -> SDConfig:
    base = dict(lr=1e-2, batch_size=4, epochs=2, eval_before_after=False, progress=False, checkpoint_every=100)
    return SDConfig(**{**base, **kw})


def test_self_distill_under_the_loop_lowers_the_loss_on_its_corpus(env, tmp_path):
    corpus = _corpus(env, 12)
    policy = tiny_hf_policy(seed=0)
    before = _corpus_loss(policy.model, corpus)
    ctx = RunContext(env=env, policy=policy, eval=None, seed=0, run_dir=tmp_path)
    summary = self_distill_loop(ctx, _sd_cfg(), corpus).run()
    after = _corpus_loss(policy.model, corpus)
    assert after < 0.85 * before, (before, after)  # measured: 4.66 -> 3.55
    assert not policy.model.training
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert summary["steps"] == 6 and [m["step"] for m in lines] == [1, 2, 3, 4, 5, 6]  # 2 epochs of 3 batches
    assert [m["epoch"] for m in lines] == pytest.approx([1 / 3, 2 / 3, 1, 4 / 3, 5 / 3, 2])
    for key in ("loss", "tokens", "lr", "grad_norm", "tokens_per_s", "time/train_s"):
        assert all(isinstance(m[key], (int, float)) for m in lines), key
    assert lines[0]["lr"] == 1e-2 and lines[-1]["lr"] < lines[0]["lr"]  # the cosine decays


def test_each_epoch_is_a_seeded_shuffle_of_the_whole_corpus(env, tmp_path):
    corpus = [([i], [i + 10]) for i in range(10)]
    sd = SelfDistill(_sd_cfg(batch_size=4).for_corpus(10), corpus)
    Loop(RunContext(env=env, policy=None, eval=None, seed=5, run_dir=tmp_path), sd.cfg, sd)
    epochs = [[p[0][0] for s in range(3 * e, 3 * e + 3) for p in sd.batch(s)] for e in range(2)]
    assert [len(b) for b in (sd.batch(0), sd.batch(1), sd.batch(2))] == [4, 4, 2]
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(10))
    assert epochs[0] != epochs[1]
    again = SelfDistill(sd.cfg, corpus)
    Loop(RunContext(env=env, policy=None, eval=None, seed=5, run_dir=tmp_path), sd.cfg, again)
    assert again.batch(4) == sd.batch(4)  # a function of (seed, step): what a resume relies on


class _CrashAfter3(SelfDistill):
    def train_step(self):
        if self.loop.step == 3:
            raise RuntimeError("simulated crash")
        return super().train_step()


def test_resume_after_a_crash_ends_with_the_weights_of_an_uninterrupted_run(env, tmp_path):
    corpus = _corpus(env, 10)
    cfg = _sd_cfg(checkpoint_every=3).for_corpus(len(corpus))  # 6 steps, a checkpoint at step 3

    def ctx(policy, name):
        return RunContext(env=env, policy=policy, eval=None, seed=0, run_dir=tmp_path / name)

    straight = tiny_hf_policy(seed=0)
    Loop(ctx(straight, "a"), cfg, SelfDistill(cfg, corpus)).run()
    with pytest.raises(RuntimeError, match="simulated crash"):
        Loop(ctx(tiny_hf_policy(seed=0), "b"), cfg, _CrashAfter3(cfg, corpus)).run()
    resumed = tiny_hf_policy(seed=1)  # a fresh process would rebuild the model: its weights come from the checkpoint
    summary = Loop(ctx(resumed, "b"), cfg, SelfDistill(cfg, corpus)).run(resume=True)
    assert summary["steps"] == 6
    for (name, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    lines = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    straight_lines = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [m["loss"] for m in lines] == [m["loss"] for m in straight_lines]


class _UnknownCorrectness:
    """The env, except that every pruned text's verdict has a score and a format but ``correct=None``."""

    def __init__(self, env):
        self.inner = learner_env(env)
        self.max_turns = 1

    def task_at(self, index, seed=None):
        return self.inner.task_at(index, seed=seed)

    def score_group(self, task, completions):
        return [Verdict(score=1.0, correct=None, format_ok=True) for _ in completions]

    def feedback(self, task, completion, verdict, turn):
        return None


def test_a_pruned_trace_of_unknown_correctness_is_refused(env):
    # Kills: the pruner's check `correct is not True` weakened to `correct is False` (None accepted).
    traces = [_trace(env, 0, _padded(_solution(env, 0)))]
    pruner = FakePruner({traces[0].text: Completion(text=_solution(env, 0))})  # shorter; correct, were it graded
    corpus, report = build_corpus(traces, _UnknownCorrectness(env), TOK, SDConfig(), pruner=pruner)
    assert (report.pruned_accepted, report.rejected) == (0, {"wrong": 1})
    assert corpus[0][1] == traces[0].token_ids


def test_a_pruned_trace_as_long_as_the_original_is_refused(env):
    # Kills: `len(ids) >= len(original)` relaxed to `>` (an equal-length rewrite taken as a pruning).
    original = _padded(_solution(env, 0))
    same_length = original.replace(";so far so good", ";so far so fine")
    assert len(_ids(same_length)) == len(_ids(original)) and same_length != original
    traces = [_trace(env, 0, original)]
    corpus, report = build_corpus(traces, env, TOK, SDConfig(), pruner=FakePruner({original: Completion(same_length)}))
    assert (report.pruned_accepted, report.rejected) == (0, {"not_shorter": 1})
    assert corpus[0][1] == traces[0].token_ids
