"""``lrmgym judge --input``: bad input files are one clear error naming the file, the line and the fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lrmgym.judges.rule import AccuracyJudge
from lrmgym.judges.scoring import JudgeInputError, judge_file


def _fails(tmp_path, path, message):
    with pytest.raises(JudgeInputError, match=f"^{re.escape(message)}$"):
        judge_file(path, tmp_path / "out.jsonl", AccuracyJudge())
    assert not (tmp_path / "out.jsonl").exists()


def test_text_that_is_not_utf8_is_refused_not_passed_on(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"prompt": "p", "completion": "caf\xe9"}\n')
    _fails(tmp_path, path, f"{path}:1: not UTF-8 text (byte 0xe9 at column 35). Save the file as UTF-8.")


def test_a_huge_line_is_refused(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"prompt": "p", "completion": "' + "x" * (2 << 20) + '"}\n')
    with pytest.raises(
        JudgeInputError, match=re.escape(f"{path}:1: line longer than 1 MiB, the limit for one record.")
    ):
        judge_file(path, tmp_path / "out.jsonl", AccuracyJudge())


def test_dev_null_and_a_folder(tmp_path):
    _fails(
        tmp_path,
        Path("/dev/null"),
        "/dev/null is not a regular file (a device, pipe or socket such as /dev/null), so it holds no data. "
        "Give the path of a data file.",
    )
    _fails(
        tmp_path,
        tmp_path,
        f"{tmp_path} is a folder, not a data file. Give the path of a file (e.g. {tmp_path}/data.jsonl).",
    )


def test_an_answer_that_is_not_text_or_a_number(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"prompt": "p", "completion": "x", "answer": [1, 2]}\n')
    _fails(tmp_path, path, f"{path}:1: 'answer' must be text or a number (or left out), got list.")
