import gzip
import re

import pytest

from lrmgym.envs._jsonl import iter_jsonl
from lrmgym.envs.code.loaders import DataError as CodeDataError
from lrmgym.envs.math.loaders import DataError as MathDataError


def test_plain_and_gzipped_skip_blank_lines_and_number_lines(tmp_path):
    plain = tmp_path / "a.jsonl"
    plain.write_text('{"x": 1}\n\n{"x": 2}\n')
    zipped = tmp_path / "a.jsonl.gz"
    zipped.write_bytes(gzip.compress(plain.read_bytes()))
    for path in (plain, zipped):
        assert list(iter_jsonl(path, ValueError)) == [(1, {"x": 1}), (3, {"x": 2})]


@pytest.mark.parametrize("error", [CodeDataError, MathDataError])
def test_bad_lines_raise_the_callers_error_naming_the_line(tmp_path, error):
    path = tmp_path / "b.jsonl"
    path.write_text('{"x": 1}\n[1]\n')
    with pytest.raises(error, match=f"^{re.escape(str(path))}:2: expected a JSON object, got list.$"):
        list(iter_jsonl(path, error))
    path.write_text('{"x": \n')
    with pytest.raises(error, match=f"^{re.escape(str(path))}:1: not valid JSON"):
        list(iter_jsonl(path, error))
