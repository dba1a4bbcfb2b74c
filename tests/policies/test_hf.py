"""The hf policy and its sampler on a tiny Llama built from a config inside the test."""

from __future__ import annotations

import importlib.util
import re

import pytest
import torch

from lrmgym.core import Completion
from lrmgym.policies.base import SamplingParams, TokenContextPolicy, TrainablePolicy
from lrmgym.policies.fasttrain import LlamaTrainer
from lrmgym.policies.hf import HFPolicy, HFPolicyConfig, render_plain_chat
from lrmgym.policies.sampling import filter_logits
from lrmgym.policies.tiny import TinyArch, build_model, build_tokenizer

PROMPTS = ["Q:Compute 93+13+41. A:", "Q:x-5=4. x=? A:", "Q:1+1. A:"]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def policy(tokenizer):
    model = build_model(TinyArch(hidden=64, layers=2, heads=2, mlp=128), len(tokenizer), seed=0)
    return HFPolicy(model, tokenizer, device="cpu", batch_size=4)


def _fresh_logits(policy: HFPolicy, prompt_ids: list[int], completion_ids: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        return policy.model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()  # [C, V]


def test_is_a_trainable_policy(policy):
    assert isinstance(policy, TrainablePolicy)


def test_shapes_and_fields(policy):
    out = policy.generate(PROMPTS, n=3, sampling=SamplingParams(max_new_tokens=12, seed=0))
    assert [len(g) for g in out] == [3, 3, 3]
    for prompt, group in zip(PROMPTS, out, strict=False):
        for c in group:
            assert c.prompt_token_ids == policy.encode_prompt(prompt)
            assert 1 <= len(c.token_ids) <= 12 and len(c.logprobs) == len(c.token_ids)
            assert c.finish_reason in ("stop", "length")
            assert c.text == policy.decode(c.token_ids)


def test_logprobs_match_a_fresh_forward_pass_at_temperature_one(policy):
    # Rows of different prompt lengths share a left-padded batch: padding must not change anything.
    out = policy.generate(PROMPTS, n=2, sampling=SamplingParams(max_new_tokens=20, seed=1))
    for group in out:
        for c in group:
            fresh = torch.log_softmax(_fresh_logits(policy, c.prompt_token_ids, c.token_ids), -1)
            expected = fresh.gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
            assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-4)
            assert policy.logprobs(c.prompt_token_ids, c.token_ids) == pytest.approx(expected.tolist(), abs=1e-5)


def test_logprobs_are_under_the_processed_distribution(policy):
    sampling = SamplingParams(temperature=0.7, top_k=5, top_p=0.9, max_new_tokens=16, seed=2)
    for c in policy.generate(PROMPTS, n=2, sampling=sampling)[0]:
        logits = _fresh_logits(policy, c.prompt_token_ids, c.token_ids)
        processed = torch.log_softmax(filter_logits(logits, sampling), -1)  # [C, V]
        expected = processed.gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
        assert torch.isfinite(expected).all()  # every sampled token survived the filters
        assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-4)
        kept = torch.isfinite(processed).sum(-1)
        assert (kept <= 5).all()


def test_filter_logits_top_p_keeps_the_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(filter_logits(logits, SamplingParams(top_p=0.8)))
    assert kept.tolist() == [[True, True, False, False]]
    kept = torch.isfinite(filter_logits(logits, SamplingParams(top_p=0.81)))
    assert kept.tolist() == [[True, True, True, False]]


def test_same_seed_same_samples_other_seed_differs(policy):
    a = policy.generate(PROMPTS, n=2, sampling=SamplingParams(max_new_tokens=16, seed=7))
    b = policy.generate(PROMPTS, n=2, sampling=SamplingParams(max_new_tokens=16, seed=7))
    c = policy.generate(PROMPTS, n=2, sampling=SamplingParams(max_new_tokens=16, seed=8))
    ids = lambda out: [x.token_ids for g in out for x in g]  # noqa: E731
    assert ids(a) == ids(b) and ids(a) != ids(c)


def test_greedy_matches_transformers_generate(policy, tokenizer):
    out = policy.generate(PROMPTS, n=1, sampling=SamplingParams(temperature=0, max_new_tokens=10))
    for _prompt, (c,) in zip(PROMPTS, out, strict=False):
        ids = torch.tensor([c.prompt_token_ids])
        ref = policy.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=10,
            do_sample=False,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        assert c.token_ids == ref[0, ids.shape[1] :].tolist()


def test_max_new_tokens_and_stop_strings(policy):
    ((c,),) = policy.generate([PROMPTS[0]], n=1, sampling=SamplingParams(temperature=0, max_new_tokens=15))
    if c.finish_reason == "stop":
        pytest.skip("the random model ended early; nothing to cut")
    assert c.finish_reason == "length" and len(c.token_ids) == 15
    stop = c.text[5:7]
    ((s,),) = policy.generate(
        [PROMPTS[0]], n=1, sampling=SamplingParams(temperature=0, max_new_tokens=15, stop=(stop,))
    )
    assert s.finish_reason == "stop"
    assert s.text == c.text[: c.text.find(stop) + len(stop)]
    assert s.token_ids == c.token_ids[: len(s.token_ids)] and len(s.token_ids) < 15


def test_eos_ends_a_sequence_and_is_kept_in_token_ids(tokenizer):
    model = build_model(TinyArch(hidden=64, layers=1, heads=2, mlp=64), len(tokenizer), seed=3)
    with torch.no_grad():  # make EOS overwhelmingly likely after any prefix
        model.model.embed_tokens.weight[tokenizer.eos_token_id] *= 0
        model.model.norm.weight.fill_(1.0)
        model.lm_head.weight.data = model.lm_head.weight.data.clone()
        model.config.tie_word_embeddings = False
    policy = HFPolicy(model, tokenizer)
    with torch.no_grad():
        model.lm_head.weight.zero_()
        model.lm_head.weight[tokenizer.eos_token_id] = 0  # all logits equal -> bias EOS by a huge margin below
    bias = torch.zeros(len(tokenizer))
    bias[tokenizer.eos_token_id] = 50.0
    model.lm_head.register_forward_hook(lambda mod, inp, out: out + bias)
    ((c,),) = policy.generate(["Q:1+1. A:"], n=1, sampling=SamplingParams(max_new_tokens=8, seed=0))
    assert c.token_ids == [tokenizer.eos_token_id] and c.finish_reason == "stop" and c.text == ""
    assert c.logprobs[0] == pytest.approx(0.0, abs=1e-6)


def test_chat_prompts_use_the_template_when_there_is_one(policy, tokenizer):
    chat = [{"role": "user", "content": "Q:1+1. A:"}]
    assert policy.render_prompt(chat) == render_plain_chat(chat) == "user: Q:1+1. A:\nassistant: "
    templated = HFPolicy(policy.model, build_tokenizer())
    templated.tokenizer.chat_template = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}>"
    assert templated.render_prompt(chat) == "[user]Q:1+1. A:>"
    assert templated.encode_prompt(chat) == tokenizer("[user]Q:1+1. A:>")["input_ids"]
    assert len(templated.generate([chat], n=2, sampling=SamplingParams(max_new_tokens=3))[0]) == 2


def test_generate_from_ids_samples_as_generate_does_on_the_encoded_prompt(policy):
    assert isinstance(policy, TokenContextPolicy)
    sampling = SamplingParams(max_new_tokens=12, seed=4)
    by_text = policy.generate(PROMPTS, n=2, sampling=sampling)
    by_ids = policy.generate_from_ids([policy.encode_prompt(p) for p in PROMPTS], n=2, sampling=sampling)
    assert by_ids == by_text  # same ids, same seed: the same completions, prompt_token_ids included
    ((c,),) = policy.generate_from_ids([[5, 6, 1, 7]], sampling=sampling)  # any ids, EOS inside included
    assert c.prompt_token_ids == [5, 6, 1, 7]
    fresh = torch.log_softmax(_fresh_logits(policy, c.prompt_token_ids, c.token_ids), -1)
    assert torch.allclose(
        torch.tensor(c.logprobs), fresh.gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0], atol=1e-4
    )


def test_generate_from_ids_rejects_bad_prompts(policy):
    vocab = policy.model.config.vocab_size
    with pytest.raises(ValueError, match=re.escape(f"must be non-empty with ids in [0, {vocab}), got 0 ids: []")):
        policy.generate_from_ids([[]])
    with pytest.raises(ValueError, match=re.escape(f"got 2 ids: [3, {vocab}]")):
        policy.generate_from_ids([[3, vocab]])
    with pytest.raises(TypeError, match="^prompt_ids must be a list of token-id lists, one per prompt.$"):
        policy.generate_from_ids([3, 4])
    with pytest.raises(ValueError, match="^n \\(samples per prompt\\) must be a positive integer, got 0.$"):
        policy.generate_from_ids([[3]], n=0)


def _templated(policy, template):
    templated = HFPolicy(policy.model, build_tokenizer())
    templated.tokenizer.chat_template = template
    return templated


def test_encode_reply_of_a_text_prompt_is_the_replys_encoding(policy, tokenizer):
    eos = tokenizer.eos_token_id
    for ids in ([10, 11, eos], [10, 11]):
        assert policy.encode_reply("Q:", Completion("x", token_ids=ids), "|again:") == tokenizer.encode("|again:")


def test_encode_reply_writes_the_chat_end_of_turn_once(policy, tokenizer):
    chat = [{"role": "user", "content": "Q"}]
    templated = _templated(policy, "{% for m in messages %}{{ m['role'] }}:{{ m['content'] }}<eos>{% endfor %}>")
    eos = tokenizer.eos_token_id
    tail = tokenizer.encode("user:again<eos>>")
    # ended with the EOS, which is the template's end-of-turn token: not written a second time
    assert templated.encode_reply(chat, Completion("ab", token_ids=[10, 11, eos]), "again") == tail
    # cut by the token budget: the format's end-of-turn token closes the turn
    assert templated.encode_reply(chat, Completion("ab", token_ids=[10, 11]), "again") == [eos, *tail]
    # without a template: render_plain_chat's lines
    expected = tokenizer.encode("\nuser: again\nassistant: ")
    assert policy.encode_reply(chat, Completion("ab", token_ids=[10, 11, eos]), "again") == expected


def test_encode_reply_needs_a_template_that_renders_the_assistant_content(policy):
    hides = _templated(
        policy, "{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}{% endif %}{% endfor %}"
    )
    with pytest.raises(ValueError, match="does not render an assistant message's content verbatim"):
        hides.encode_reply([{"role": "user", "content": "Q"}], Completion("ab", token_ids=[10]), "again")


def test_bad_arguments_are_clear_errors(policy):
    with pytest.raises(ValueError, match=f"^{re.escape('n (samples per prompt) must be a positive integer, got 0.')}$"):
        policy.generate(PROMPTS, n=0)
    with pytest.raises(TypeError, match="^prompts must be a list of prompts; wrap a single prompt as \\[prompt\\].$"):
        policy.generate("Q:1+1. A:")
    with pytest.raises(TypeError, match="^A prompt must be a str or a list of chat messages"):
        policy.generate([42])


def test_config_builds_from_a_folder_with_lora(policy, tmp_path):
    policy.save(tmp_path / "m")
    plain = HFPolicyConfig(model=str(tmp_path / "m"), device="cpu").build()
    greedy = SamplingParams(temperature=0, max_new_tokens=8)
    ids = [[c.token_ids for c in g] for g in plain.generate(PROMPTS, sampling=greedy)]
    assert ids == [[c.token_ids for c in g] for g in policy.generate(PROMPTS, sampling=greedy)]
    lora_spec = {"r": 4, "target_modules": ["q_proj", "v_proj"]}
    lora = HFPolicyConfig(model=str(tmp_path / "m"), device="cpu", lora=lora_spec).build()
    trainable = [n for n, p in lora.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    c = lora.generate(PROMPTS[:1], n=2, sampling=SamplingParams(max_new_tokens=6, seed=0))[0][0]
    assert lora.logprobs(c.prompt_token_ids, c.token_ids) == pytest.approx(c.logprobs, abs=1e-4)


def test_config_sets_attention_kernel_and_gradient_checkpointing(policy, tmp_path):
    policy.save(tmp_path / "m")
    plain = HFPolicyConfig(model=str(tmp_path / "m"), device="cpu").build()
    assert not LlamaTrainer.build(plain.model.train()).checkpointing
    built = HFPolicyConfig(
        model=str(tmp_path / "m"), device="cpu", attn_implementation="eager", gradient_checkpointing=True
    ).build()
    assert built.model.config._attn_implementation == "eager"
    assert LlamaTrainer.build(built.model.train()).checkpointing  # and the lean forward checkpoints too
    plain.model.eval()
    built.model.eval()
    greedy = SamplingParams(temperature=0, max_new_tokens=8)
    ids = [[c.token_ids for c in g] for g in built.generate(PROMPTS, sampling=greedy)]
    assert ids == [[c.token_ids for c in g] for g in plain.generate(PROMPTS, sampling=greedy)]
    with pytest.raises(ValueError, match="attn_implementation"):
        HFPolicyConfig(model="x", attn_implementation="flash")
    if importlib.util.find_spec("flash_attn") is None:  # a user's mistake: one line naming the value and the fix
        flash = HFPolicyConfig(model=str(tmp_path / "m"), device="cpu", attn_implementation="flash_attention_2")
        with pytest.raises(ValueError, match=r"needs the flash-attn package .* set policy.attn_implementation=sdpa"):
            flash.build()


def test_config_errors(tmp_path):
    missing = str(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match=f"^{re.escape(f'policy.model={missing!r} is not a folder.')}"):
        HFPolicyConfig(model=missing).build()
    with pytest.raises(ValueError, match="dtype\n  Input should be 'auto', 'float32', 'bfloat16' or 'float16'"):
        HFPolicyConfig(model="x", dtype="fp8")


# ------------------------------------------------------------------------------------------------ the device
def _machine(monkeypatch, cuda_build: bool, gpus: int, mps: bool) -> None:
    """Make torch describe a machine: a CUDA build or not, how many GPUs it sees, MPS or not."""
    monkeypatch.setattr(torch.version, "cuda", "12.4" if cuda_build else None)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)


@pytest.mark.parametrize(
    ("device", "machine", "message"),
    [
        ("cuda", (False, 0, False),
         "policy.device='cuda': this torch ({v}) is built without CUDA; use policy.device=cpu, or auto (a GPU when "
         "there is one), or install a CUDA build of torch."),
        ("cuda", (True, 0, False),
         "policy.device='cuda': torch sees no CUDA GPU here (none, no driver, or CUDA_VISIBLE_DEVICES hides them); "
         "use policy.device=cpu, or auto (a GPU when there is one)."),
        ("cuda:7", (True, 2, False),
         "policy.device='cuda:7': this machine has 2 CUDA GPUs (cuda:0 to cuda:1); use one of them, or "
         "policy.device=cpu."),
        ("cuda:1", (True, 1, False),
         "policy.device='cuda:1': this machine has 1 CUDA GPU (cuda:0); use one of them, or policy.device=cpu."),
        ("mps", (False, 0, False),
         "policy.device='mps': torch has no MPS (Apple-silicon GPU) here; use policy.device=cpu, or auto (a GPU "
         "when there is one)."),
        ("xpu", (False, 0, False),
         "policy.device='xpu': torch has no xpu device here; use policy.device=cpu, or auto (a GPU when there is "
         "one)."),
        ("bogus", (False, 0, False),
         "policy.device='bogus' is not a device; expected auto, cpu, cuda, cuda:N or mps."),
        ("cuda:x", (True, 1, False),
         "policy.device='cuda:x' is not a device; expected auto, cpu, cuda, cuda:N or mps."),
    ],
)  # fmt: skip
def test_a_device_this_machine_lacks_is_one_clear_error(monkeypatch, device, machine, message):
    from lrmgym.policies.hf import resolve_device

    _machine(monkeypatch, *machine)
    with pytest.raises(ValueError, match=f"^{re.escape(message.format(v=torch.__version__))}$"):
        resolve_device(device)


def test_devices_this_machine_has_resolve(monkeypatch):
    from lrmgym.policies.hf import resolve_device

    _machine(monkeypatch, True, 2, True)
    assert resolve_device("cuda:1") == torch.device("cuda:1") and resolve_device("mps") == torch.device("mps")
    assert resolve_device("auto") == torch.device("cuda") and resolve_device("cpu") == torch.device("cpu")
    _machine(monkeypatch, False, 0, False)
    assert resolve_device("auto") == torch.device("cpu")


def test_the_device_is_checked_before_the_weights_are_read(monkeypatch, tmp_path, tokenizer):
    # A 7B checkpoint takes minutes to load: a device the machine lacks is refused first.
    import transformers

    model = build_model(TinyArch(hidden=64, layers=1, heads=2, mlp=128), len(tokenizer), seed=0)
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    _machine(monkeypatch, False, 0, False)

    def no_load(*args, **kwargs):
        raise AssertionError("the weights were read before the device was checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_load)
    with pytest.raises(ValueError, match=r"^policy.device='cuda': this torch"):
        HFPolicyConfig(model=str(tmp_path / "m"), device="cuda").build()
