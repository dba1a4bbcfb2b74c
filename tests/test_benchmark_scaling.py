"""benchmarks/scaling.py: the exponent fit and the report, on synthetic figures (no training, no pools)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "scaling.py"
_SPEC = importlib.util.spec_from_file_location("benchmark_scaling", _PATH)
scaling = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(scaling)


def test_fit_recovers_a_power_law():
    # y = 3 x^1.5 at x = 1, 2, 4: log y = log 3 + 1.5 log x exactly, so the slope is 1.5 and c is 3.
    k, c = scaling.fit_exponent([1, 2, 4], [3.0, 3 * 2**1.5, 24.0])
    assert k == pytest.approx(1.5) and c == pytest.approx(3.0)


def test_fit_of_a_falling_series_is_negative():
    k, c = scaling.fit_exponent([1, 2, 4, 8], [10.0, 5.0, 2.5, 1.25])
    assert k == pytest.approx(-1.0) and c == pytest.approx(10.0)


@pytest.mark.parametrize(
    ("xs", "ys", "message"),
    [
        ([1], [2.0], "fit_exponent needs at least 2 points of equal count, got 1 x and 1 y."),
        ([2, 2], [1.0, 3.0], "fit_exponent needs at least 2 distinct x values, got [2]."),
    ],
)
def test_bad_fit_input_is_reported(xs, ys, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        scaling.fit_exponent(xs, ys)


def test_verifier_pairs_are_fixed_and_distinct():
    pairs = scaling.verify_pairs(70)
    assert len(set(pairs)) == 70 and pairs == scaling.verify_pairs(70)
    assert pairs[0] == ("\\frac{1}{\\sqrt{2}}", "\\frac{1\\sqrt{2}}{2}")
    assert scaling.verify_pairs(10, start=60) == pairs[60:]


def test_report_lists_every_series_with_its_exponent(tmp_path):
    def grpo(params, seconds):
        return {"params": params, "step_s": [seconds], "median_s": seconds, "length": 40.0, "trained_frac": 1.0,
                "generations": 256}  # fmt: skip

    sizes = dict(zip(scaling.SIZES, (792_576, 2_584_064, 21_096_448), strict=True))
    results = {
        "grpo": {f"size:{s}": grpo(n, 1e-6 * n) for s, n in sizes.items()}
        | {f"group:{g}": grpo(None, 0.1 * g) for g in scaling.GROUPS}
        | {f"prompts:{p}": grpo(None, 0.05 * p) for p in scaling.PROMPTS},
        "verify": {w: {"rates": [100.0 * w], "median": 100.0 * w} for w in scaling.WORKERS},
        "sandbox": {w: {"rates": [50.0], "median": 50.0, "backend": "process"} for w in scaling.WORKERS},
    }
    fits = scaling.series(results)
    assert fits["GRPO s/step vs parameters"]["fit"][0] == pytest.approx(1.0)
    assert fits["math verifications/s vs workers"]["fit"][0] == pytest.approx(1.0)
    assert fits["sandbox executions/s vs workers"]["fit"][0] == pytest.approx(0.0, abs=1e-12)
    meta = {"quick": True, "settings": scaling.SETTINGS["quick"], "threads": 1, "machine": "test", "wall_s": 1.0,
            "uptime_before": "up", "uptime_after": "up", "command": "python benchmarks/scaling.py --quick",
            "png": "scaling.png"}  # fmt: skip
    text = scaling.report(results, fits, meta)
    assert text.startswith("# How cost grows (smoke run: --quick)")
    assert "| GRPO s/step vs group size | 1.00 | 0.1 |" in text
    assert "| 21,096,448 |" in text
