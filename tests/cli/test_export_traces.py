"""`lrmgym export traces`: rollouts and DPO pairs from a run's samples.jsonl (`lrmgym.learners.engine.export`)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from lrmgym.cli.main import cli
from lrmgym.learners.engine.export import TRACE_FIELDS, arena_strength


def invoke(*args):
    return CliRunner().invoke(cli, ["export", "traces", *map(str, args)], catch_exceptions=False)


def _arena(strength):
    return {"name": "arena", "score": None, "weight": 1.0, "latency_s": 0.0, "cached": False,
            "reason": f"tournament: strength {strength:+.3f} (6 comparisons, 6 judge calls in the group)"}  # fmt: skip


def _traj(texts, reward, correct=None, strength=None):
    """A logged trajectory: policy turns and env replies alternate, starting with the policy."""
    turns = [{"role": "policy" if k % 2 == 0 else "env", "text": t} for k, t in enumerate(texts)]
    components = [_arena(strength)] if strength is not None else [
        {"name": "arena", "score": reward, "weight": 1.0, "latency_s": 0.0, "cached": False,
         "reason": "verifier (not routed)"}
    ]  # fmt: skip
    verdict = {"score": reward, "correct": correct, "parsed": None, "reason": "r", "components": components,
               "latency_s": 0.0, "format_ok": None}  # fmt: skip
    return {"turns": turns, "reward": reward, "advantage": 0.0, "verdict": verdict}


CHAT = [{"role": "user", "content": "Say yes."}]
GROUPS = [
    # step 1, a group the arena routed: strengths 0.8, -0.4, 0.8 (a tie with the best), -1.0
    {"step": 1, "task_id": "t/routed", "prompt": "Q1:", "answer": "1", "trajectories": [
        _traj(["a"], 1.0, True, 0.8), _traj(["b"], 0.667, True, -0.4), _traj(["c"], 1.0, True, 0.8),
        _traj(["d"], 0.0, True, -1.0)]},
    # step 1, a mixed group it did not route: rewards 0, 1, 1 (a tie), 0.5 (the best's text), ungradeable, 0
    # (the first one's text again)
    {"step": 1, "task_id": "t/mixed", "prompt": "Q2:", "answer": "2", "trajectories": [
        _traj(["x"], 0.0, False), _traj(["y"], 1.0, True), _traj(["z"], 1.0, True), _traj(["y"], 0.5, False),
        _traj(["w"], None), _traj(["x"], 0.0, False)]},
    # step 2, a text prompt with a two-turn trajectory
    {"step": 2, "task_id": "t/retry", "prompt": "Q3:", "answer": "3", "trajectories": [
        _traj(["1", " no, again:", "3"], 1.0, True), _traj(["4"], 0.0, False)]},
    # step 2, a chat prompt: two single-turn trajectories and a two-turn one
    {"step": 2, "task_id": "t/chat", "prompt": CHAT, "answer": "yes", "trajectories": [
        _traj(["yes"], 1.0, True), _traj(["no"], 0.0, False), _traj(["maybe", "Try again.", "no"], 0.0, False)]},
]  # fmt: skip


def _write_run(folder, groups=GROUPS, extra=""):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "samples.jsonl").write_text("".join(json.dumps(g) + "\n" for g in groups) + extra)
    return folder


def _read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def run_dir(tmp_path):
    return _write_run(tmp_path / "run")


def test_rows_follow_the_schema_one_rollout_per_line(run_dir):
    result = invoke(run_dir)
    assert result.exit_code == 0, result.output
    rows = _read(run_dir / "traces.jsonl")
    assert len(rows) == 4 + 6 + 2 + 3
    assert all(tuple(r) == TRACE_FIELDS for r in rows)
    first = rows[0]
    assert first["task_id"] == "t/routed" and first["prompt"] == "Q1:" and first["completion"] == "a"
    assert first["prompt_token_ids"] is None and first["token_ids"] is None  # samples.jsonl logs no token ids
    assert (first["reward"], first["correct"], first["strength"], first["step"]) == (1.0, True, 0.8, 1)
    assert first["verdict"] == GROUPS[0]["trajectories"][0]["verdict"]
    assert [r["strength"] for r in rows[:9]] == [0.8, -0.4, 0.8, -1.0, None, None, None, None, None]
    assert rows[8]["reward"] is None and rows[8]["correct"] is None
    retry = rows[10]  # a two-turn trajectory: its final policy turn after the transcript
    assert (retry["prompt"], retry["completion"], retry["step"]) == ("Q3:1 no, again:", "3", 2)
    chat_retry = rows[14]
    assert chat_retry["prompt"] == [*CHAT, {"role": "assistant", "content": "maybe"},
                                    {"role": "user", "content": "Try again."}]  # fmt: skip
    assert chat_retry["completion"] == "no"
    assert result.output.strip() == (
        f"exported 15 rollouts of 4 groups (steps 1-2; 4 with an arena strength) to {run_dir / 'traces.jsonl'}"
    )


def test_pairs_best_against_each_lower_skipping_ties_and_identical(run_dir, tmp_path):
    pairs_file = tmp_path / "pairs.jsonl"
    result = invoke(run_dir, "--out", tmp_path / "rows.jsonl", "--pairs", pairs_file)
    assert result.exit_code == 0, result.output
    assert _read(pairs_file) == [
        {"prompt": "Q1:", "chosen": "a", "rejected": "b"},  # by strength: 0.8 vs -0.4 (c ties a at 0.8)
        {"prompt": "Q1:", "chosen": "a", "rejected": "d"},  # 0.8 vs -1.0
        {"prompt": "Q2:", "chosen": "y", "rejected": "x"},  # by reward: 1 vs 0 (z ties, the 0.5 is y, the last x)
        # t/retry: the best is the two-turn trajectory, whose prompt (its transcript) the other does not share
        {"prompt": CHAT, "chosen": [{"role": "assistant", "content": "yes"}],
         "rejected": [{"role": "assistant", "content": "no"}]},  # conversational: the prompt is chat messages
    ]  # fmt: skip
    assert result.output.strip().endswith(
        f"; 4 pairs to {pairs_file} (skipped: 2 tie, 1 identical, 1 duplicate, 2 other prompt, 1 unscored)"
    )


def test_min_margin_drops_close_pairs(run_dir, tmp_path):
    pairs_file = tmp_path / "pairs.jsonl"
    assert invoke(run_dir, "--pairs", pairs_file, "--min-margin", "1.5").exit_code == 0
    assert [(p["chosen"], p["rejected"]) for p in _read(pairs_file)] == [("a", "d")]  # margin 1.8; 1.2 and 1 < 1.5


def test_pairs_by_reward_ignore_strengths(run_dir, tmp_path):
    pairs_file = tmp_path / "pairs.jsonl"
    assert invoke(run_dir, "--pairs", pairs_file, "--by", "reward").exit_code == 0
    routed = [(p["chosen"], p["rejected"]) for p in _read(pairs_file) if p["prompt"] == "Q1:"]
    assert routed == [("a", "b"), ("a", "d")]  # rewards 1.0 vs 0.667 and 0.0; c ties at 1.0


def test_standard_pairs_load_with_datasets_as_three_string_columns(tmp_path):
    datasets = pytest.importorskip("datasets")
    run = _write_run(tmp_path / "run", GROUPS[:2])
    pairs_file = tmp_path / "pairs.jsonl"
    assert invoke(run, "--pairs", pairs_file).exit_code == 0
    data = datasets.load_dataset("json", data_files=str(pairs_file), cache_dir=str(tmp_path / "hf"))["train"]
    assert data.num_rows == 3
    assert {k: v.dtype for k, v in data.features.items()} == {"prompt": "string", "chosen": "string",
                                                               "rejected": "string"}  # fmt: skip


@pytest.mark.parametrize("flag", ["--out", "--pairs"])
def test_the_input_is_never_overwritten(run_dir, flag):
    before = (run_dir / "samples.jsonl").read_text()
    result = invoke(run_dir, flag, run_dir / "samples.jsonl")
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"Error: {flag} {str(run_dir / 'samples.jsonl')!r} is the input file {str(run_dir / 'samples.jsonl')!r}; "
        "writing it would destroy the input. Give another output path."
    )
    assert (run_dir / "samples.jsonl").read_text() == before


def test_a_broken_line_is_one_error_and_nothing_is_written(tmp_path):
    lines = [json.dumps(GROUPS[0]), "{not json", json.dumps(GROUPS[1])]
    run = tmp_path / "run"
    run.mkdir()
    (run / "samples.jsonl").write_text("\n".join(lines) + "\n")
    result = invoke(run)
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"Error: {run / 'samples.jsonl'}:2: not a JSON line (Expecting property name enclosed in double quotes at "
        "column 2)."
    )
    assert not (run / "traces.jsonl").exists()


def test_a_line_that_is_no_group_record_is_one_error(tmp_path):
    run = _write_run(tmp_path / "run", [GROUPS[0], {"step": 1, "task_id": "t", "completion": "eval-style"}])
    result = invoke(run)
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"Error: {run / 'samples.jsonl'}:2: no 'trajectories' list; expected a group record of `lrmgym run` "
        "({step, task_id, prompt, trajectories: [{turns, ...}]})."
    )


def test_a_torn_last_line_of_a_killed_run_is_dropped_and_said(tmp_path):
    run = _write_run(tmp_path / "run", GROUPS[:1], extra='{"step": 2, "task_id": "t/to')
    result = invoke(run)
    assert result.exit_code == 0
    assert len(_read(run / "traces.jsonl")) == 4
    assert result.output.strip().endswith("; dropped a torn last line (the run was killed while writing it)")


def test_a_directory_without_samples_is_one_error(tmp_path):
    result = invoke(tmp_path)
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"Error: RUN_DIR: {str(tmp_path)!r} has no samples.jsonl; give the directory of a `lrmgym run` that trained "
        "at least one step with learner.log_samples > 0."
    )


def test_arena_strength_reads_only_the_tournament_line():
    assert arena_strength({"components": [_arena(-1.25)]}) == -1.25
    raw = {**_arena(-1.25), "raw_score": -1.2468}  # a run that records the unrounded strength: that one
    assert arena_strength({"components": [raw]}) == -1.2468
    assert arena_strength({"components": [{"reason": "verifier (not routed)"}]}) is None
    assert arena_strength(None) is None and arena_strength({}) is None


def test_a_real_arena_run_exports_the_strengths_behind_its_rewards(tmp_path):
    """A one-step GRPO run with the arena routing every group: its rewards are the exported strengths min-max
    normalised, and each pair prefers the stronger rollout."""
    args = [
        "run", "env=math", "judge=arena", "judge.arena.route_when=always", "learner.steps=1",
        "learner.prompts_per_step=4", "learner.group_size=4", "learner.max_new_tokens=40", "learner.log_samples=4",
        "learner.eval_before_after=false", "learner.async_rollouts=false", "learner.progress=false",
        f"run.output_dir={tmp_path}", "run.name=arena", "run.seed=1",
    ]  # fmt: skip
    trained = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert trained.exit_code == 0, trained.output
    result = invoke(tmp_path / "arena", "--pairs", tmp_path / "pairs.jsonl")
    assert result.exit_code == 0, result.output
    rows = _read(tmp_path / "arena" / "traces.jsonl")
    assert len(rows) == 16 and all(r["strength"] is not None for r in rows)
    spread = 0
    for task in {r["task_id"] for r in rows}:
        group = [r for r in rows if r["task_id"] == task]
        low, high = min(r["strength"] for r in group), max(r["strength"] for r in group)
        spread += high > low
        for r in group:  # the arena's reward: the group's strengths min-max normalised (0 when all tie)
            expected = (r["strength"] - low) / (high - low) if high > low else 0.0
            assert r["reward"] == pytest.approx(expected, abs=1e-9)  # the unrounded strength (raw_score)
    # A group the tournament separated. Seed 1 draws tasks the tiny model is unsure of (it separates all four);
    # on easy ones it writes the same answer four times and every group ties.
    assert spread >= 1
    strength = {(r["prompt"], r["completion"]): r["strength"] for r in rows}
    pairs = _read(tmp_path / "pairs.jsonl")
    assert len(pairs) >= spread
    assert all(strength[p["prompt"], p["chosen"]] > strength[p["prompt"], p["rejected"]] for p in pairs)


def test_exported_traces_are_reason_maxxer_training_data(run_dir):
    from lrmgym.learners.algorithms.reason_maxxer import read_rollouts

    assert invoke(run_dir).exit_code == 0
    rollouts = read_rollouts(run_dir / "traces.jsonl")
    rows = _read(run_dir / "traces.jsonl")
    assert len(rollouts) == len(rows) == 15
    assert [(r.task_id, r.completion, r.reward, r.strength, r.step) for r in rollouts] == [
        (row["task_id"], row["completion"], row["reward"], row["strength"], row["step"]) for row in rows
    ]


def test_pair_margins_at_their_edges():
    # Kills: `<` / `<=` swapped at the margin checks: a pair exactly at min_margin is kept, a tie never is.
    from lrmgym.learners.engine.export import preference_pairs

    rows = [{"prompt": "Q", "completion": c, "reward": r, "strength": None}
            for c, r in [("a", 1.0), ("b", 0.5), ("c", 1.0), ("d", 0.0)]]  # fmt: skip
    skipped: dict[str, int] = {}
    pairs = preference_pairs(rows, min_margin=0.5, skipped=skipped)
    assert [(p["chosen"], p["rejected"]) for p in pairs] == [("a", "b"), ("a", "d")]  # b: margin 0.5 exactly
    assert skipped == {"unscored": 0, "tie": 1}
    skipped = {}
    pairs = preference_pairs(rows, min_margin=0.0, skipped=skipped)
    assert [p["rejected"] for p in pairs] == ["b", "d"] and skipped == {"unscored": 0, "tie": 1}
    skipped = {}
    assert [p["rejected"] for p in preference_pairs(rows, min_margin=0.6, skipped=skipped)] == ["d"]
    assert skipped == {"unscored": 0, "tie": 1, "margin": 1}
