"""``lrmgym/MultipleChoice-v0``: GPQA-format files, the seeded option order, the strict one-letter answer."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import pytest

import lrmgym
from lrmgym.envs.math.loaders import DataError
from lrmgym.envs.mcq.env import LETTERS, extract_letter, option_order
from lrmgym.envs.mcq.loaders import GPQA_FIELDS, load_questions
from lrmgym.testing.checker import check_env

GPQA = Path(__file__).resolve().parents[2] / "fixtures" / "evals" / "gpqa_diamond.csv"


def _write_csv(path: Path, rows: list[list[str]]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(GPQA_FIELDS)
        writer.writerows(rows)
    return path


def _text(task) -> str:
    return task.prompt[-1]["content"] if isinstance(task.prompt, list) else task.prompt


def _correct(task) -> str:
    return task.metadata["options"][LETTERS.index(task.answer)]


def test_fixture_loads_with_multiline_questions_and_metadata():
    questions = load_questions(GPQA)
    assert len(questions) == 4
    assert "\n" in questions[1].question  # a quoted CSV field spanning lines
    assert questions[0].correct == "Nitrogen" and questions[0].metadata["Record ID"] == "recFAKE0001"


def test_env_passes_the_checker_and_the_prompt_lists_the_options_without_marking_the_correct_one():
    env = lrmgym.make("lrmgym/MultipleChoice-v0", data_path=str(GPQA))
    check_env(env, seed_sensitive=False)  # sequential: task i is question i whatever the seed
    for i in range(4):
        task = env.unwrapped.task_at(i, seed=0)
        text = _text(task)
        options = task.metadata["options"]
        for letter, option in zip(LETTERS, options, strict=True):
            assert f"\n{letter}) {option}\n" in f"{text}\n"
        correct = options[LETTERS.index(task.answer)]
        assert correct == load_questions(GPQA)[i].correct
        assert "correct" not in text.lower().replace("incorrect", "")  # no column name or marker in the prompt


def test_option_order_is_deterministic_per_question_and_independent_of_file_position(tmp_path):
    rows = [[f"Made-up question {i}?", f"right {i}", f"w1 {i}", f"w2 {i}", f"w3 {i}"] for i in range(12)]
    forward = lrmgym.make("lrmgym/MultipleChoice-v0", data_path=str(_write_csv(tmp_path / "a.csv", rows)))
    backward = lrmgym.make("lrmgym/MultipleChoice-v0", data_path=str(_write_csv(tmp_path / "b.csv", rows[::-1])))
    a = {_correct(t): t for t in (forward.unwrapped.task_at(i, 0) for i in range(12))}
    b = {_correct(t): t for t in (backward.unwrapped.task_at(i, 7) for i in range(12))}
    assert {k: (_text(t), t.answer) for k, t in a.items()} == {k: (_text(t), t.answer) for k, t in b.items()}
    assert option_order("Made-up question 3?", 0) == option_order("Made-up  question 3? ", 0)  # whitespace-normalised
    assert len({tuple(option_order(f"q{i}", 0)) for i in range(50)}) > 10  # not one fixed order


def test_correct_position_is_balanced_over_letters_and_changes_with_the_shuffle_seed():
    counts = Counter(LETTERS[option_order(f"Made-up question number {i}", 0).index(0)] for i in range(800))
    assert set(counts) == set(LETTERS)
    assert all(160 <= c <= 240 for c in counts.values()), counts  # 200 expected each; fixed by the seed, no flake
    other = [option_order(f"Made-up question number {i}", 1) for i in range(50)]
    assert other != [option_order(f"Made-up question number {i}", 0) for i in range(50)]


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        ("Reasoning...\n<answer>B</answer>", "B"),
        ("<answer> (C) </answer>\n", "C"),
        ("<answer>A or C</answer>", None),
        ("<answer>AC</answer>", None),
        ("<answer>b</answer>", None),
        ("<answer>E</answer>", None),
        ("<answer>A</answer><answer>B</answer>", None),
        ("<answer>A</answer> actually B", None),
        ("The answer is B.", None),
        ("", None),
    ],
)
def test_exactly_one_letter_in_one_answer_block_else_format_failure(text, letter):
    got, reason = extract_letter(text)
    assert got == letter
    assert (reason == "") == (letter is not None)


def test_verdicts_right_wrong_and_hedged():
    env = lrmgym.make("lrmgym/MultipleChoice-v0", data_path=str(GPQA))
    task = env.unwrapped.task_at(0, seed=0)
    wrong = next(x for x in LETTERS if x != task.answer)
    right = env.unwrapped.verify(task, f"<answer>{task.answer}</answer>")
    assert (right.score, right.correct, right.format_ok) == (1.0, True, True)
    assert env.unwrapped.verify(task, f"<answer>{wrong}</answer>").score == 0.0
    hedged = env.unwrapped.verify(task, f"<answer>{task.answer}, {wrong}</answer>")
    assert (hedged.score, hedged.format_ok) == (0.0, False)


def test_jsonl_with_the_same_columns_loads_the_same_questions(tmp_path):
    rows = list(csv.DictReader(GPQA.open(newline="", encoding="utf-8")))
    path = tmp_path / "gpqa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert [q.correct for q in load_questions(path)] == [q.correct for q in load_questions(GPQA)]


def test_bad_rows_are_refused_with_the_row_and_the_fix(tmp_path):
    dup = _write_csv(tmp_path / "dup.csv", [["Q?", "same", "Same ", "x", "y"]])
    with pytest.raises(DataError, match=r"dup.csv row 1: two options have the same text"):
        load_questions(dup)
    empty = _write_csv(tmp_path / "empty.csv", [["Q?", "", "a", "b", "c"]])
    with pytest.raises(DataError, match=r"empty.csv row 1: field 'Correct Answer' is empty"):
        load_questions(empty)
    other = tmp_path / "other.csv"
    other.write_text("question,answer\nQ?,A\n")
    with pytest.raises(DataError, match=r"other.csv row 1: missing column\(s\) \['Question', 'Correct Answer'"):
        load_questions(other)


def test_data_path_is_required_and_must_be_a_file(tmp_path):
    with pytest.raises(ValueError, match="data_path is required"):
        lrmgym.make("lrmgym/MultipleChoice-v0")
    with pytest.raises(ValueError, match="is not a regular file"):
        lrmgym.make("lrmgym/MultipleChoice-v0", data_path=str(tmp_path))


def test_the_instruction_shows_no_example_letter():
    env = lrmgym.make("lrmgym/MultipleChoice-v0", data_path=str(GPQA))
    instruction = _text(env.unwrapped.task_at(0, seed=0)).rsplit("\n\n", 1)[1]
    assert not any(f"<answer>{letter}</answer>" in instruction for letter in LETTERS)


def test_csv_is_read_within_the_file_limit_and_may_be_gzipped(tmp_path, monkeypatch):
    import gzip

    packed = tmp_path / "gpqa_diamond.csv.gz"
    packed.write_bytes(gzip.compress(GPQA.read_bytes()))
    assert [q.correct for q in load_questions(packed)] == [q.correct for q in load_questions(GPQA)]
    monkeypatch.setenv("LRMGYM_MAX_FILE_BYTES", "100")
    with pytest.raises(DataError, match=r"gpqa_diamond.csv: larger than 100 bytes, the limit for one data file"):
        load_questions(GPQA)
