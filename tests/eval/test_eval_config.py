"""EvalConfig validation: k <= n, strict keys."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from lrmgym.eval.config import EvalConfig


def test_k_above_n_is_an_error_naming_both():
    msg = (
        "eval.k contains 16 but eval.n is 8: pass@16 needs at least 16 samples per task. "
        "Raise eval.n to 16 or more, or drop 16 from eval.k."
    )
    with pytest.raises(ValidationError, match=re.escape(msg)):
        EvalConfig(n=8, k=[1, 16])


def test_k_forms():
    assert EvalConfig(n=8, k=4).k == [4]
    assert EvalConfig(n=8, k=[1, 4, 8]).k == [1, 4, 8]
    with pytest.raises(ValidationError, match=re.escape("eval.k has duplicates: [1, 1]; list each k once.")):
        EvalConfig(n=8, k=[1, 1])
    with pytest.raises(ValidationError, match=re.escape("eval.k contains 0; every k must be >= 1.")):
        EvalConfig(n=8, k=[0])
    with pytest.raises(ValidationError, match=re.escape("eval.k is empty; list at least one k, e.g. eval.k=[1].")):
        EvalConfig(k=[])


def test_unknown_key_is_rejected():
    with pytest.raises(ValidationError, match="samples\n  Extra inputs are not permitted"):
        EvalConfig(samples=3)


def test_sampling_params():
    cfg = EvalConfig(temperature=0.5, top_p=0.9, top_k=3, max_new_tokens=7, stop=["X"], seed=4)
    s = cfg.sampling()
    assert (s.temperature, s.top_p, s.top_k, s.max_new_tokens, s.stop, s.seed) == (0.5, 0.9, 3, 7, ("X",), 4)
    assert cfg.sampling(seed=9).seed == 9
