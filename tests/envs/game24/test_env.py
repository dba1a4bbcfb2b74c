"""Game24Env: options, seeding, the held-out split, single-shot grading and step-by-step episodes."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

import lrmgym
from lrmgym.core import Completion, ResetNeeded, Task
from lrmgym.envs.game24 import solver
from lrmgym.envs.game24.data import load_held_out
from lrmgym.envs.game24.env import Game24Env
from lrmgym.envs.game24.prompts import feedback_text, prompt_text
from lrmgym.testing import ADVERSARIAL_OUTPUTS, AdversarialPolicy, RandomTextPolicy, check_env


def r1(answer: str) -> str:
    return f"<think>search</think><answer>{answer}</answer>"


def puzzle(*numbers: int, solvable: bool = True) -> Task:
    """A hand-made task: the env needs only metadata['numbers'] and ['solvable']."""
    return Task(
        id="hand/" + "-".join(map(str, numbers)), prompt="p", metadata={"numbers": numbers, "solvable": solvable}
    )


def single_reference(task: Task) -> str:
    return r1(task.answer)


def steps_reference(task: Task) -> str:
    return r1("; ".join(solver.step_solution(task.metadata["numbers"])))


# ------------------------------------------------------------------------------------------------ options
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_turns": 3}, "max_turns=3 applies to mode='steps' only; remove it or set mode='steps'."),
        ({"step_penalty": 0.5}, "step_penalty=0.5 applies to mode='steps' only; remove it or set mode='steps'."),
        ({"unsolvable_ratio": 0.5}, "unsolvable_ratio=0.5 needs allow_unsolvable=True; set it or remove the ratio."),
        ({"order": "random"}, "order='random' applies to split='test' only; remove it or set split='test'."),
        (
            {"split": "test", "max_number": 9},
            "max_number=9 applies to split='train' only (the test split is the fixed 24.csv set, all solvable); "
            "remove it or set split='train'.",
        ),
        ({"min_number": 9, "max_number": 3}, "min_number=9 is above max_number=3; the range must be non-empty."),
        (
            {"held_out_ranks": (10, 5)},
            "held_out_ranks=[10, 5] must be [first, last] with 1 <= first <= last, for example [901, 1000] (the ToT "
            "test range).",
        ),
    ],
)
def test_contradictory_options_are_refused_with_a_clear_message(options, message):
    with pytest.raises(ValidationError) as info:
        Game24Env(**options)
    assert [e["msg"] for e in info.value.errors()] == [f"Value error, {message}"]


def test_unknown_and_out_of_range_options_are_refused():
    with pytest.raises(ValidationError, match="answer_format"):
        Game24Env(answer_format="r1")
    with pytest.raises(ValidationError, match="max_number"):
        Game24Env(max_number=50)


def test_a_range_without_solvable_puzzles_needs_allow_unsolvable():
    message = (
        "No puzzle to generate: numbers 1..1 give no solvable puzzle outside held_out_ranks. "
        "Widen min_number/max_number or set allow_unsolvable=True."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        Game24Env(min_number=1, max_number=1)
    env = Game24Env(min_number=1, max_number=1, allow_unsolvable=True)
    assert env.task_at(0, seed=0).answer == "no solution"


def test_every_config_field_has_a_docstring():
    for name, field in Game24Env.Config.model_fields.items():
        assert field.description, f"Game24Config.{name} has no attribute docstring"


# ------------------------------------------------------------------------------------------------ seeding
def test_same_seed_same_tasks_and_adjacent_seeds_differ():
    env = lrmgym.make("Game24-v0")
    first = [env.task_at(i, seed=5) for i in range(8)]
    assert [env.task_at(i, seed=5) for i in range(8)] == first
    other = [env.task_at(i, seed=6) for i in range(8)]
    assert [t.metadata["numbers"] for t in other] != [t.metadata["numbers"] for t in first]
    assert other[0].metadata["numbers"] != first[1].metadata["numbers"]  # no seed + index collision
    env.reset(seed=5)
    assert [env.reset()[1]["task"] for _ in range(3)] == first[1:4]


def test_generated_tasks_carry_solver_labels():
    env = Game24Env(min_number=1, max_number=13)
    for i in range(30):
        task = env.task_at(i, seed=0)
        numbers = task.metadata["numbers"]
        assert numbers == tuple(sorted(numbers)) and all(1 <= n <= 13 for n in numbers)
        assert task.id == f"game24/train/{i}/{'-'.join(map(str, numbers))}"
        found = solver.solutions(numbers)
        assert task.metadata["num_solutions"] == len(found) > 0 and task.answer == found[0]
        assert task.metadata["solutions"] == found
        assert task.metadata["needs_fractions"] == solver.analyse(numbers).needs_fractions
        expected = (
            "hard" if len(found) == 1 or task.metadata["needs_fractions"] else ("medium" if len(found) <= 4 else "easy")
        )
        assert task.difficulty == expected


def test_unsolvable_puzzles_on_request():
    env = Game24Env(allow_unsolvable=True)
    tasks = [env.task_at(i, seed=1) for i in range(400)]
    share = sum(not t.metadata["solvable"] for t in tasks) / len(tasks)
    assert 0.18 < share < 0.32  # default ratio 0.25
    bad = next(t for t in tasks if not t.metadata["solvable"])
    assert bad.answer == "no solution" and bad.difficulty == "unsolvable"
    assert not solver.solvable(bad.metadata["numbers"])
    assert "If it cannot be done, answer 'no solution'." in bad.prompt
    assert "no solution" not in Game24Env().task_at(0, seed=1).prompt
    only = Game24Env(allow_unsolvable=True, unsolvable_ratio=1.0)
    assert all(not only.task_at(i, seed=2).metadata["solvable"] for i in range(20))


# ------------------------------------------------------------------------------------------------ prompts
def test_prompt_styles():
    assert prompt_text((4, 7, 8, 8), "single", "compact", "r1", False) == "Q:24 from 4 7 8 8. A:"
    assert prompt_text((4, 7, 8, 8), "steps", "compact", "r1", False) == "Q:24 in steps from 4 7 8 8. A:"
    instruct = prompt_text((4, 7, 8, 8), "single", "instruct", "r1", False)
    assert instruct.startswith("Use the numbers 4 7 8 8 and the operations +, -, *, / with parentheses to make 24.")
    assert "<answer>(1 + 2 + 3) * 4</answer>" in instruct
    assert "\\boxed{(1 + 2 + 3) * 4}" in prompt_text((1, 2, 3, 4), "single", "instruct", "boxed", False)
    assert "'Answer: 8 / 3 = 8/3; 3 - (8/3) = 1/3'" in prompt_text((1, 2, 3, 4), "steps", "instruct", "plain", False)
    chat = Game24Env(chat=True, style="compact").task_at(0, seed=0).prompt
    assert (
        isinstance(chat, list)
        and chat[0]["role"] == "user"
        and re.fullmatch(r"Q:24 from( \d+){4}\. A:", chat[0]["content"])
    )


# ------------------------------------------------------------------------------------------------ single
def test_single_mode_grading():
    env = Game24Env()
    task = puzzle(3, 3, 8, 8)
    verdict = env.verify(task, Completion(r1("8/(3-8/3)")))
    assert (verdict.score, verdict.correct, verdict.reason, verdict.format_ok, verdict.parsed) == (
        1.0, True, "correct", True, "8/(3-8/3)")  # fmt: skip
    cases = {
        r1("8*3*3/8 = 25"): "'=' is only allowed as a trailing '= 24', got '= 25'",
        r1("6*4*1*1"): "numbers used 1 1 4 6, puzzle has 3 3 8 8",
        "8/(3-8/3)": "format: no <answer> tag",
        r1("1") + "<answer>8/(3-8/3)</answer>": "format: 2 <answer> tags, expected exactly one",
        r1("8/(3-8/3)") + " or maybe 25": "format: text after </answer>",
        r1("no solution"): "claimed no solution, but the puzzle is solvable",
    }
    for text, reason in cases.items():
        v = env.verify(task, Completion(text))
        assert (v.score, v.correct, v.reason) == (0.0, False, reason), text
    assert env.verify(puzzle(1, 1, 1, 1, solvable=False), Completion(r1("No solution."))).correct is True


def test_single_mode_other_templates():
    task = puzzle(1, 2, 3, 4)
    plain = Game24Env(template="plain")
    assert plain.verify(task, Completion("Let me try.\nAnswer: (1+2+3)*4 = 24")).correct is True
    assert plain.verify(task, Completion("Answer: (1+2+3)*4\nAnswer: 24")).reason == (
        "format: 2 'Answer:' lines, expected exactly one"
    )
    boxed = Game24Env(template="boxed")
    assert boxed.verify(task, Completion("so \\boxed{(1+2+3) \\times 4}")).correct is True
    assert boxed.verify(task, Completion("\\boxed{1*2*3*4} \\boxed{24}")).reason == (
        "format: 2 \\boxed{} answers, expected exactly one"
    )


def test_check_env_single_mode_train():
    check_env(lrmgym.make("Game24-v0"), reference=single_reference)
    check_env(lrmgym.make("Game24-v0", style="compact", template="plain", allow_unsolvable=True),
              reference=lambda t: f"Answer: {t.answer}")  # fmt: skip


# ------------------------------------------------------------------------------------------------ steps
def test_steps_episode_with_an_illegal_step_then_solved():
    env = Game24Env(mode="steps")
    assert env.max_turns == 6
    env.reset(options={"task": puzzle(3, 3, 8, 8)})
    obs, reward, terminated, truncated, info = env.step(r1("8 / 3 = 8/3"))
    assert obs == (
        "Correct so far: 8 / 3 = 8/3. Numbers left: 8/3 3 8. Reply with all your steps so far plus the next one."
    )
    assert (reward, terminated, truncated, info["verdict"].correct) == (0.0, False, False, None)
    obs, reward, terminated, truncated, info = env.step(r1("8 / 3 = 8/3; 9 - 1 = 8"))
    assert obs == (
        "Illegal step (penalty 0.1): step 2: 9 is not one of the remaining numbers (8/3 3 8). Numbers left after "
        "your legal steps: 8/3 3 8. Reply with your steps from the start, corrected."
    )
    assert (reward, terminated, truncated, info["verdict"].correct) == (-0.1, False, False, False)
    obs, reward, *_ = env.step(r1("8 / 3 = 8/3\n3 - 8/3 = 1/3"))
    assert obs == (
        "Correct so far: 8 / 3 = 8/3; 3 - (8/3) = 1/3. Numbers left: 1/3 8. Reply with all your steps so far plus "
        "the next one."
    )
    assert reward == 0.0
    obs, reward, terminated, truncated, info = env.step(r1("8 / 3 = 8/3; 3 - (8/3) = 1/3; 8 / (1/3) = 24"))
    assert (obs, reward, terminated, truncated, info["verdict"].correct) == ("", 1.0, True, False, True)
    assert info["verdict"].reason == "solved: 8 / 3 = 8/3; 3 - (8/3) = 1/3; 8 / (1/3) = 24"
    with pytest.raises(ResetNeeded):
        env.step(r1("24 + 0 = 24"))


def test_steps_answers_are_replayed_from_the_start_each_turn():
    env = Game24Env(mode="steps")
    env.reset(options={"task": puzzle(3, 3, 8, 8)})
    env.step(r1("8 / 3 = 8/3"))
    # Only the new step, without the earlier one: 8/3 is not among the puzzle's numbers.
    _, reward, _, _, info = env.step(r1("3 - 8/3 = 1/3"))
    assert (reward, info["verdict"].reason) == (-0.1, "step 1: 8/3 is not one of the remaining numbers (3 3 8 8)")


def test_steps_dead_end_can_be_revised_and_turns_run_out():
    env = Game24Env(mode="steps")
    env.reset(options={"task": puzzle(1, 1, 4, 6)})
    obs, reward, terminated, truncated, info = env.step(r1("1 + 1 = 2\n2 + 4 = 6\n6 + 6 = 12"))
    assert (reward, terminated, truncated, info["verdict"].correct) == (0.0, False, False, False)
    assert obs == (
        "Dead end: 1 + 1 = 2; 2 + 4 = 6; 6 + 6 = 12 leaves 12, not 24. "
        "Reply with a new sequence of steps from the start."
    )
    _, reward, terminated, *_ = env.step(r1("1 - 1 = 0; 4 * 6 = 24; 24 + 0 = 24"))
    assert (reward, terminated) == (1.0, True)

    env = Game24Env(mode="steps", max_turns=2, step_penalty=0.25, style="compact")
    env.reset(options={"task": puzzle(1, 1, 4, 6)})
    obs, reward, terminated, truncated, _ = env.step("no tags at all")
    assert obs == " bad: format: no <answer> tag. left 1 1 4 6. A:"
    assert (reward, terminated, truncated) == (-0.25, False, False)
    obs, reward, terminated, truncated, info = env.step(r1("1 + 1 = 3"))
    assert info["verdict"].reason == "step 1: wrong arithmetic: 1 + 1 is 2, not 3"
    assert (reward, terminated, truncated) == (-0.25, False, True)


def test_steps_no_solution_claims():
    env = Game24Env(mode="steps", allow_unsolvable=True)
    env.reset(options={"task": puzzle(1, 1, 1, 1, solvable=False)})
    _, reward, terminated, _, info = env.step(r1("no solution"))
    assert (reward, terminated, info["verdict"].correct) == (1.0, True, True)
    env.reset(options={"task": puzzle(3, 3, 8, 8)})
    obs, reward, terminated, _, info = env.step(r1("no solution"))
    assert (obs, reward, terminated, info["verdict"].correct) == ("", 0.0, True, False)
    assert info["verdict"].reason == "claimed no solution, but the puzzle is solvable"


def test_steps_verify_score_group_and_feedback_are_stateless():
    """The GRPO rollout drives episodes with score_group + feedback, never step: both must work without state."""
    env = Game24Env(mode="steps", style="compact")
    task = puzzle(3, 3, 8, 8)
    answers = [r1("8 / 3 = 8/3"), r1("8 / 3 = 8/3; 3 - (8/3) = 1/3; 8 / (1/3) = 24"), r1("8 / (1/3) = 24"), "x"]
    verdicts = env.score_group(task, answers)
    assert [v.score for v in verdicts] == [0.0, 1.0, -0.1, -0.1]
    assert [v.correct for v in verdicts] == [None, True, False, False]
    replies = [env.feedback(task, Completion(a), v, 1) for a, v in zip(answers, verdicts, strict=True)]
    assert replies[0] == " ok left 8/3 3 8. A:"
    assert replies[2] == " bad: step 1: 1/3 is not one of the remaining numbers (3 3 8 8). left 3 3 8 8. A:"
    assert env.feedback(task, Completion(r1("no solution")), verdicts[0], 1) is None


def test_foreign_tasks_without_numbers_are_ungradeable_not_a_crash():
    env = Game24Env(mode="steps")
    verdict = env.verify(Task(id="other/1", prompt="?"), Completion("1"))
    assert verdict.score is None
    assert verdict.reason == "task 'other/1' has no metadata['numbers']; it is not a Game24 task"


def test_check_env_steps_mode_train():
    check_env(lrmgym.make("Game24-v0", mode="steps"), reference=steps_reference)

    def plain_steps(task: Task) -> str:
        steps = solver.step_solution(task.metadata["numbers"])
        return "Answer: " + ("; ".join(steps) if steps else "no solution")

    env = lrmgym.make("Game24-v0", mode="steps", style="compact", template="plain", allow_unsolvable=True)
    check_env(env, reference=plain_steps)


# ------------------------------------------------------------------------------------- garbage and hostility
@pytest.mark.parametrize("mode", ["single", "steps"])
def test_garbage_scores_near_zero_and_never_crashes(mode):
    env = Game24Env(mode=mode, style="compact")
    scores = []
    policy = RandomTextPolicy(seed=3, alphabet="0123456789+-*/=() <>answerthink", max_chars=60)
    for i in range(150):
        task = env.task_at(i, seed=9)
        text = policy.generate([task.prompt], n=1)[0][0].text
        verdict = env.verify(task, Completion(text))
        assert verdict.score is not None, verdict.reason
        scores.append(verdict.score)
    assert max(scores) <= 0.0  # random text never solves a puzzle
    # What a tiny model trained on env=math writes (the OOD probe): well-formed, numerically off-task.
    for text in (
        "<think>93+13=106;106+41=147</think><answer>147</answer>",
        "<think>x-50=42</think><answer>92</answer>",
    ):
        verdict = env.verify(puzzle(1, 1, 4, 6), Completion(text))
        assert verdict.score is not None and verdict.score <= 0.0 and verdict.correct is False, verdict.reason
    adversarial = AdversarialPolicy()
    task = env.task_at(0, seed=9)
    for completion in adversarial.generate([task.prompt], n=len(ADVERSARIAL_OUTPUTS))[0]:
        verdict = env.verify(task, completion)
        assert verdict.score is not None and verdict.correct is not True, verdict.reason


def test_hostile_step_answers_are_bounded():
    env = Game24Env(mode="steps")
    task = puzzle(3, 3, 8, 8)
    hostile = [
        r1("\n".join(["1 + 1 = 2"] * 10_000)),
        r1("9**9**9 = 1"),
        r1("(" * 5000 + "8 / 3 = 8/3"),
        r1("8 / 3 = 8/3\x00"),
        r1("\ud800 = 1"),
        r1("99999999999999999999 / 3 = 33333333333333333333"),
    ]
    for text in hostile:
        start = time.perf_counter()
        verdict = env.verify(task, Completion(text))
        elapsed = time.perf_counter() - start
        assert (verdict.score, verdict.correct) == (pytest.approx(-0.1), False), verdict.reason
        assert elapsed < 0.1, f"{verdict.reason}: {elapsed * 1e3:.1f} ms"


# ------------------------------------------------------------------------------------------ held-out split
def test_test_split_serves_24csv_in_rank_order(shared_data):
    env = lrmgym.make("Game24-v0", split="test", data_path=str(shared_data / "game24" / "24.csv"))
    first = env.task_at(0, seed=0)
    assert first.id == "game24/test/1" and first.metadata["numbers"] == (1, 1, 4, 6) and first.difficulty == 1
    assert [env.task_at(i, seed=0).difficulty for i in (99, 100, 900, 999, 1361)] == [1, 2, 10, 10, 14]
    assert env.task_at(1349, seed=0).metadata["numbers"] == (3, 3, 8, 8)
    assert env.task_at(1349, seed=0).metadata["needs_fractions"] is True
    assert first.metadata["human_solve_time_s"] == 4.4 and first.metadata["human_solved_rate"] == pytest.approx(0.992)
    assert env.task_at(1361, seed=0).id == "game24/test/1362"
    assert env.task_at(1362, seed=7) == first  # index wraps; the seed does not change a sequential split
    check_env(env, reference=single_reference, seed_sensitive=False)
    check_env(lrmgym.make("Game24-v0", split="test", order="random"), reference=single_reference)
    check_env(lrmgym.make("Game24-v0", split="test", mode="steps"), reference=steps_reference, seed_sensitive=False)


def test_held_out_ranks_select_the_test_split_and_leave_the_train_split(shared_data):
    test = Game24Env(split="test", held_out_ranks=(901, 1000))
    assert [test.task_at(i, seed=0).metadata["rank"] for i in (0, 99, 100)] == [901, 1000, 901]
    reserved = {p.numbers for p in load_held_out() if 901 <= p.rank <= 1000}
    train = Game24Env(held_out_ranks=(901, 1000))
    assert len(train._pool.solvable) == 1362 - 100
    assert not any(train.task_at(i, seed=0).metadata["numbers"] in reserved for i in range(300))


def test_missing_data_file_names_the_path_and_the_fix(tmp_path, monkeypatch):
    missing = tmp_path / "nope.csv"
    message = (
        f"The Game24 test split needs the ToT puzzle file, not found at {missing}. Set LRMGYM_SHARED_DATA to the "
        "folder that holds game24/24.csv, or pass data_path='/path/to/24.csv' to the env."
    )
    with pytest.raises(FileNotFoundError, match=f"^{re.escape(message)}$"):
        Game24Env(split="test", data_path=str(missing))
    monkeypatch.setenv("LRMGYM_SHARED_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "game24" / "24.csv"))):
        Game24Env(split="test")
    Game24Env(split="train")  # the train split never needs the file


def test_malformed_data_files_are_reported_with_their_line(tmp_path):
    bad_header = tmp_path / "h.csv"
    bad_header.write_text("a,b\n1,1 1 4 6\n")
    with pytest.raises(ValueError, match="expected the ToT 24.csv header"):
        load_held_out(bad_header)
    bad_row = tmp_path / "r.csv"
    bad_row.write_text(
        "Rank,Puzzles,AMT (s),Solved rate,1-sigma Mean (s),1-sigma STD (s)\n"
        "1,1 1 4 6,4.4,99.20%,4.67,1.48\n2,1 x,1,1%,1,1\n"
    )
    message = f"{bad_row}:3: cannot read '2,1 x,1,1%,1,1' as 'rank,n1 n2 n3 n4,seconds,rate%,...'"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        load_held_out(bad_row)


def test_feedback_text_without_penalty():
    assert feedback_text("instruct", "illegal", "why", (), 0.0) == (
        "Illegal step: why. Numbers left after your legal steps: . Reply with your steps from the start, corrected."
    )


def test_preset_file(shared_data):  # the preset's held-out split reads the ToT puzzle file (shared data)
    import yaml

    preset = Path(lrmgym.__file__).parent / "configs" / "presets" / "env" / "game24.yaml"
    data = yaml.safe_load(preset.read_text())
    env_id = data.pop("id")
    assert env_id == "lrmgym/Game24-v0"
    Game24Env(**data)


def test_grpo_rollout_drives_a_steps_episode_through_score_group_and_feedback():
    """The learner's rollout keeps no env state; the cumulative-steps protocol makes its episodes right."""
    from lrmgym.learners.engine.rollout import rollout
    from lrmgym.policies.base import SamplingParams
    from lrmgym.testing import ScriptedPolicy

    env = Game24Env(mode="steps", style="compact")
    task = env.task_at(0, seed=0)
    steps = solver.step_solution(task.metadata["numbers"])

    def answer(prompt: str, sample: int) -> str:
        turn = prompt.count(" A:")  # the first prompt has one, each feedback adds one
        if " bad:" in prompt or (turn == 1 and sample == 1):  # later turns sample once per trajectory
            return r1("9 + 9 = 18")  # always illegal
        return r1("; ".join(steps[:turn]))  # one more step per turn, restating the earlier ones

    result = rollout(env, ScriptedPolicy(answer), [task], group_size=2, sampling=SamplingParams(max_new_tokens=64))
    good, bad = result.groups[0]
    assert [v.score for v in result.turn_verdicts[0][0]] == [0.0, 0.0, 1.0]
    assert good.reward == 1.0 and good.verdict.correct is True
    assert [t.role for t in good.turns] == ["policy", "env", "policy", "env", "policy"]
    assert good.turns[1].text.startswith(" ok left ")
    assert [v.score for v in result.turn_verdicts[0][1]] == [-0.1] * 6
    assert bad.reward == -0.1 and len(bad.policy_turns) == 6
