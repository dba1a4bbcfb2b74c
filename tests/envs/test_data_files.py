"""Bad data files: one clear error naming the file, the 1-based line and the fix, read with bounded memory."""

from __future__ import annotations

import gzip
import json
import re
import tracemalloc
from pathlib import Path

import pytest

from lrmgym.envs._jsonl import iter_jsonl, iter_lines
from lrmgym.envs.code.loaders import DataError as CodeDataError
from lrmgym.envs.code.loaders import load_jsonl
from lrmgym.envs.game24.data import load_held_out
from lrmgym.envs.math.env import MathEnv
from lrmgym.envs.math.loaders import DataError, load_gsm8k, load_records, read_rows

HEADER = "Rank,Puzzles,AMT (s),Solved rate,1-sigma Mean (s),1-sigma STD (s)\n"


def _raises(error, message, fn, *args, **kwargs):
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        fn(*args, **kwargs)


def test_empty_and_blank_only_files_are_errors(tmp_path):
    for content in ("", "\n  \n"):
        path = tmp_path / "e.jsonl"
        path.write_text(content)
        message = f"{path}: the file is empty (no JSON lines). Give a JSONL file: one JSON object per line."
        _raises(DataError, message, lambda p: list(iter_jsonl(p, DataError)), path)


def test_broken_json_names_line_and_column(tmp_path):
    path = tmp_path / "b.jsonl"
    path.write_text('{"x": 1}\n\n{"x": tru}\n')
    message = (
        f"{path}:3: not valid JSON (Expecting value at column 7). Each line must be one complete JSON object; "
        "fix or remove this line."
    )
    _raises(DataError, message, lambda: list(iter_jsonl(path, DataError)))


def test_deep_nesting_and_huge_integers_are_data_errors_not_crashes(tmp_path):
    path = tmp_path / "n.jsonl"
    path.write_text("[" * 200_000 + "\n")
    with pytest.raises(DataError, match=r":1: not valid JSON \(nested too deeply\)"):
        list(iter_jsonl(path, DataError))
    path.write_text('{"x": ' + "9" * 5000 + "}\n")
    with pytest.raises(DataError, match=r":1: not valid JSON \(Exceeds the limit"):
        list(iter_jsonl(path, DataError))


def test_binary_and_non_utf8_content(tmp_path):
    path = tmp_path / "bin.jsonl"
    path.write_bytes(b'{"x": 1}\n\x00\x01\x02\n')
    message = (
        f"{path}:2: contains a NUL byte: this is a binary file, not UTF-8 text. "
        "Give a text file (JSONL: one JSON object per line)."
    )
    _raises(DataError, message, lambda: list(iter_jsonl(path, DataError)))
    path.write_bytes('{"q": "caf\u00e9"}\n'.encode("latin-1"))
    message = f"{path}:1: not UTF-8 text (byte 0xe9 at column 11). Save the file as UTF-8."
    _raises(DataError, message, lambda: list(iter_jsonl(path, DataError)))


def test_a_50_mb_line_is_refused_after_reading_about_1_mib(tmp_path):
    path = tmp_path / "huge.jsonl"
    with open(path, "w") as handle:
        handle.write('{"question": "')
        for _ in range(50):
            handle.write("x" * (1 << 20))
        handle.write('", "answer": "1"}\n')
    tracemalloc.start()
    try:
        with pytest.raises(DataError, match=re.escape(f"{path}:1: line longer than 1 MiB, the limit for one record.")):
            MathEnv(source=str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"peak {peak / 2**20:.0f} MiB: the line was read whole"


def test_limits_can_be_raised_and_a_file_cap_holds(tmp_path, monkeypatch):
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps({"x": "y" * 3000}) + "\n")
    with pytest.raises(DataError, match=":1: line longer than 1000 bytes"):
        list(iter_jsonl(path, DataError, max_line_bytes=1000))
    monkeypatch.setenv("LRMGYM_MAX_LINE_BYTES", "100000")
    assert len(list(iter_jsonl(path, DataError, max_line_bytes=None))) == 1
    monkeypatch.setenv("LRMGYM_MAX_FILE_BYTES", "2000")
    with pytest.raises(DataError, match="larger than 2000 bytes, the limit for one data file. Split it, or set"):
        list(iter_jsonl(path, DataError))
    monkeypatch.setenv("LRMGYM_MAX_FILE_BYTES", "lots")
    _raises(
        DataError,
        "LRMGYM_MAX_FILE_BYTES='lots' is not a positive integer (a number of bytes); unset it or give e.g. 1073741824.",
        lambda: list(iter_jsonl(path, DataError)),
    )


def test_a_gzip_bomb_stops_at_the_file_cap(tmp_path):
    path = tmp_path / "bomb.jsonl.gz"
    path.write_bytes(gzip.compress(b"\n" * (8 << 20)))
    with pytest.raises(DataError, match="larger than 1 MiB, the limit for one data file"):
        list(iter_lines(path, DataError, max_file_bytes=1 << 20))


def test_gzip_by_magic_bom_and_crlf_are_read(tmp_path):
    path = tmp_path / "named-plain.jsonl"  # gzip content without the .gz name
    path.write_bytes(gzip.compress(b'\xef\xbb\xbf{"x": 1}\r\n{"x": 2}'))
    assert list(iter_jsonl(path, DataError)) == [(1, {"x": 1}), (2, {"x": 2})]
    broken = tmp_path / "t.jsonl.gz"
    broken.write_bytes(gzip.compress(b'{"x": 1}\n' * 1000)[:60])
    with pytest.raises(DataError, match="the gzip data is corrupt or truncated"):
        list(iter_jsonl(broken, DataError))


@pytest.mark.parametrize("kind", ["folder", "device"])
def test_a_folder_or_dev_null_as_a_data_file(tmp_path, kind):
    path = tmp_path if kind == "folder" else Path("/dev/null")
    message = (
        f"{path} is a folder, not a data file. Give the path of a file (e.g. {path}/data.jsonl)."
        if kind == "folder"
        else f"{path} is not a regular file (a device, pipe or socket such as /dev/null), so it holds no data. "
        "Give the path of a data file."
    )
    _raises(DataError, message, lambda: list(iter_jsonl(path, DataError)))
    _raises(ValueError, message, load_held_out, path)
    _raises(CodeDataError, message, load_jsonl, path)


def test_math_null_answer_is_a_data_error_not_the_string_none(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"question": "1+1?", "answer": "2"}\n{"question": "2+2?", "answer": null}\n')
    fix = "Give every row its gold answer, or drop the row."
    message = f"{path}:2: field 'answer' is null; expected text (or a number). {fix}"
    _raises(DataError, message, load_records, path, "train", "question", "answer")
    gsm = tmp_path / "g.jsonl"
    gsm.write_text('{"question": "q", "answer": null}\n')
    with pytest.raises(DataError, match=re.escape(f"{gsm}:1: field 'answer' is null")):
        load_gsm8k(gsm, "test")
    gsm.write_text('{"question": "q", "answer": "no marker"}\n')
    _raises(DataError, f"{gsm}:1: the answer has no '####' line: 'no marker'.", load_gsm8k, gsm, "test")


def test_math_rows_are_numbered_from_one_in_every_format(tmp_path):
    listing = tmp_path / "l.json"
    listing.write_text(json.dumps([{"question": "a", "answer": "1"}, {"question": "b"}]))
    with pytest.raises(DataError, match=re.escape(f"{listing} row 2: missing field(s) ['answer']")):
        load_records(listing, "train", "question", "answer")
    listing.write_text('[{"question": "a",\n  "answer": 1,}]')
    with pytest.raises(DataError, match=re.escape(f"{listing}:2: not valid JSON (Expecting property name")):
        read_rows(listing)


def test_math_env_refuses_dev_null_as_source():
    import pydantic

    with pytest.raises(pydantic.ValidationError, match=re.escape("source '/dev/null' is not a regular file")):
        MathEnv(source="/dev/null")


def test_code_jsonl_null_prompt_and_bad_types(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"prompt": null, "tests": "assert f(1) == 1"}\n')
    _raises(CodeDataError, f"{path}:1: field 'prompt' is null; expected a non-empty string.", load_jsonl, path)
    path.write_text('{"prompt": "p", "tests": "assert f(1) == 1", "entry_point": 3}\n')
    _raises(CodeDataError, f"{path}:1: 'entry_point' must be a string.", load_jsonl, path)
    path.write_text("")
    with pytest.raises(CodeDataError, match="the file is empty"):
        load_jsonl(path)


def test_game24_huge_line_and_empty_file(tmp_path):
    path = tmp_path / "24.csv"
    path.write_text(HEADER + "1," + "9 " * (1 << 20) + ",4.4,99.20%,4.67,1.48\n")
    with pytest.raises(ValueError, match=re.escape(f"{path}:2: line longer than 1 MiB")):
        load_held_out(path)
    path.write_text("")
    with pytest.raises(ValueError, match=re.escape(f"{path}:1: expected the ToT 24.csv header")):
        load_held_out(path)
    path.write_bytes(HEADER.encode() + b"1,1 1 4 6,4.4,99.20%,4.67,\xff\n")
    with pytest.raises(ValueError, match=re.escape(f"{path}:2: not UTF-8 text (byte 0xff at column 27)")):
        load_held_out(path)
