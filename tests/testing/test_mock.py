import pytest

from lrmgym.policies.base import Policy, SamplingParams
from lrmgym.testing import ADVERSARIAL_OUTPUTS, AdversarialPolicy, MockPolicyConfig, RandomTextPolicy, ScriptedPolicy


def test_all_mocks_satisfy_the_policy_protocol():
    for policy in (ScriptedPolicy(["a"]), RandomTextPolicy(), AdversarialPolicy()):
        assert isinstance(policy, Policy)


def test_scripted_by_prompt_cycles_samples_and_chat_uses_last_message():
    policy = ScriptedPolicy({"q1": ["a", "b"], "q2": "c"})
    out = policy.generate(["q1", [{"role": "user", "content": "q2"}]], n=3)
    assert [[c.text for c in g] for g in out] == [["a", "b", "a"], ["c", "c", "c"]]
    assert policy.calls[0][1] == 3


def test_scripted_missing_prompt_is_a_clear_error_or_default():
    with pytest.raises(KeyError, match="ScriptedPolicy has no response for prompt 'zz'"):
        ScriptedPolicy({"q": "a"}).generate(["zz"])
    assert ScriptedPolicy({"q": "a"}, default="d").generate(["zz"])[0][0].text == "d"


def test_scripted_by_index_and_function():
    seq = ScriptedPolicy(["x", "y", "z"])
    assert [c.text for c in seq.generate(["p", "q"], n=2)[1]] == ["z", "x"]
    fn = ScriptedPolicy(lambda prompt, i: f"{prompt}-{i}")
    assert [c.text for c in fn.generate(["p"], n=2)[0]] == ["p-0", "p-1"]


def test_random_is_seeded_and_bounded():
    a = RandomTextPolicy(seed=3).generate(["p"] * 4, n=2, sampling=SamplingParams(max_new_tokens=5))
    b = RandomTextPolicy(seed=3).generate(["p"] * 4, n=2, sampling=SamplingParams(max_new_tokens=5))
    assert [[c.text for c in g] for g in a] == [[c.text for c in g] for g in b]
    assert all(len(c.text) <= 5 for g in a for c in g)


def test_adversarial_cycles_through_hostile_outputs():
    names = [n for n, _ in ADVERSARIAL_OUTPUTS]
    assert {"empty", "one_megabyte", "nul_bytes", "lone_surrogate", "injection_system"} <= set(names)
    texts = [c.text for c in AdversarialPolicy().generate(["p"], n=len(names))[0]]
    assert texts == [t for _, t in ADVERSARIAL_OUTPUTS]
    assert len(dict(ADVERSARIAL_OUTPUTS)["one_megabyte"]) == 1 << 20
    with pytest.raises(ValueError, match="Unknown adversarial output"):
        AdversarialPolicy(["nope"])


def test_mock_policy_config_builds_each_mode():
    assert isinstance(MockPolicyConfig().build(), RandomTextPolicy)
    assert isinstance(MockPolicyConfig(mode="adversarial").build(), AdversarialPolicy)
    assert MockPolicyConfig(mode="scripted", responses=["r"]).build().generate(["p"])[0][0].text == "r"
