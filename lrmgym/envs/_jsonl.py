"""Reading user data files with bounded memory, shared by the env loaders and ``lrmgym judge``.

Every reader here refuses bad input with one error (of the caller's type) that names the file, the line
(1-based, as ``path:line:``) and the fix:

- a missing path, a folder or a device / pipe (``/dev/null``) where a file is expected;
- a line longer than :data:`MAX_LINE_BYTES` (1 MiB; a file of one 50 MB line is refused after reading 1 MiB)
  and a file larger than :data:`MAX_FILE_BYTES` (1 GiB, counted after decompression, so a gzip bomb stops too).
  ``$LRMGYM_MAX_LINE_BYTES`` and ``$LRMGYM_MAX_FILE_BYTES`` raise them;
- binary content (a NUL byte), text that is not UTF-8, a line that is not one JSON object, an empty file.

Files are read in bounded chunks, never with an unbounded ``readline()``. Gzip is recognised by its magic
bytes (whatever the name), and a UTF-8 byte-order mark is skipped.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["MAX_FILE_BYTES", "MAX_LINE_BYTES", "check_file", "iter_jsonl", "iter_lines", "read_bytes", "read_json"]

MAX_LINE_BYTES = 1 << 20
"""Longest line accepted (bytes, newline excluded); ``$LRMGYM_MAX_LINE_BYTES`` overrides it."""
MAX_FILE_BYTES = 1 << 30
"""Largest file accepted (bytes after decompression); ``$LRMGYM_MAX_FILE_BYTES`` overrides it."""
_CHUNK = 1 << 16
_GZIP_MAGIC = b"\x1f\x8b"
_BOM = b"\xef\xbb\xbf"


def _limit(name: str, default: int, error: type[Exception]) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise error(f"{name}={raw!r} is not a positive integer (a number of bytes); unset it or give e.g. {default}.")
    return value


def _size(n: int) -> str:
    return f"{n // (1 << 20)} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n} bytes"


def check_file(path: Path, error: type[Exception], what: str = "data file") -> None:
    """Refuse a path that is not an existing regular file, naming it and saying what to give instead."""
    if not path.exists():
        raise error(f"{path}: no such {what}. Check the path.")
    if path.is_dir():
        raise error(f"{path} is a folder, not a {what}. Give the path of a file (e.g. {path}/data.jsonl).")
    if not path.is_file():
        raise error(
            f"{path} is not a regular file (a device, pipe or socket such as /dev/null), so it holds no data. "
            f"Give the path of a {what}."
        )


def _open(path: Path, error: type[Exception]) -> IO[bytes]:
    try:
        with open(path, "rb") as probe:
            magic = probe.read(2)
        return gzip.open(path, "rb") if magic == _GZIP_MAGIC else open(path, "rb")  # noqa: SIM115
    except OSError as err:
        raise error(f"{path}: cannot be read ({err.strerror or err}). Check its permissions.") from None


def _chunks(path: Path, error: type[Exception], max_file_bytes: int) -> Iterator[bytes]:
    """The file's bytes (decompressed), in chunks of at most 64 KiB, up to ``max_file_bytes`` in all."""
    total = 0
    with _open(path, error) as handle:
        while True:
            try:
                chunk = handle.read(_CHUNK)
            except (OSError, EOFError, zlib.error) as err:
                raise error(
                    f"{path}: the gzip data is corrupt or truncated ({err}). Re-create or re-download the file."
                ) from None
            if not chunk:
                return
            total += len(chunk)
            if total > max_file_bytes:
                raise error(
                    f"{path}: larger than {_size(max_file_bytes)}, the limit for one data file. Split it, or set "
                    "LRMGYM_MAX_FILE_BYTES to a larger number of bytes."
                )
            yield chunk


def _decode(path: Path, line_no: int, raw: bytes, error: type[Exception]) -> str:
    if b"\x00" in raw:
        raise error(
            f"{path}:{line_no}: contains a NUL byte: this is a binary file, not UTF-8 text. "
            "Give a text file (JSONL: one JSON object per line)."
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        column = len(raw[: err.start].decode("utf-8", errors="replace")) + 1
        raise error(
            f"{path}:{line_no}: not UTF-8 text (byte 0x{raw[err.start]:02x} at column {column}). "
            "Save the file as UTF-8."
        ) from None


def iter_lines(
    path: Path,
    error: type[Exception],
    max_line_bytes: int | None = None,
    max_file_bytes: int | None = None,
) -> Iterator[tuple[int, str]]:
    """Yield ``(line number, text)`` for every line (1-based, line end removed), reading in bounded chunks.

    Raises:
        error: The path is not a regular file; a line or the file is over its limit; a NUL byte; not UTF-8.
    """
    path = Path(path)
    check_file(path, error)
    max_line = max_line_bytes or _limit("LRMGYM_MAX_LINE_BYTES", MAX_LINE_BYTES, error)
    max_file = max_file_bytes or _limit("LRMGYM_MAX_FILE_BYTES", MAX_FILE_BYTES, error)
    buffer = bytearray()
    line_no = 0

    def too_long() -> Exception:
        return error(
            f"{path}:{line_no + 1}: line longer than {_size(max_line)}, the limit for one record. Is this a "
            "JSONL file (one JSON object per line)? Shorten the record, or set LRMGYM_MAX_LINE_BYTES to a "
            "larger number of bytes."
        )

    for chunk in _chunks(path, error, max_file):
        start = len(buffer)
        buffer += chunk
        while (end := buffer.find(b"\n", start)) >= 0:
            if end > max_line:
                raise too_long()
            raw = bytes(buffer[:end]).removesuffix(b"\r")
            del buffer[: end + 1]
            start = 0
            line_no += 1
            if line_no == 1:
                raw = raw.removeprefix(_BOM)
            yield line_no, _decode(path, line_no, raw, error)
        if len(buffer) > max_line:
            raise too_long()
    if buffer:
        line_no += 1
        raw = bytes(buffer).removesuffix(b"\r")
        yield line_no, _decode(path, line_no, raw.removeprefix(_BOM) if line_no == 1 else raw, error)


def _json_problem(err: Exception) -> str:
    if isinstance(err, json.JSONDecodeError):
        return f"{err.msg} at column {err.colno}"
    if isinstance(err, RecursionError):
        return "nested too deeply"
    return str(err)  # e.g. an integer of more than 4300 digits


def iter_jsonl(
    path: Path,
    error: type[Exception],
    max_line_bytes: int | None = None,
    max_file_bytes: int | None = None,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line number, object)`` for each non-blank line; any problem raises ``error`` naming the line.

    A file without any JSON object (empty, or only blank lines) is an error too.
    """
    seen = False
    for line_no, line in iter_lines(path, error, max_line_bytes, max_file_bytes):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as err:
            raise error(
                f"{path}:{line_no}: not valid JSON ({_json_problem(err)}). Each line must be one complete JSON "
                "object; fix or remove this line."
            ) from None
        if not isinstance(row, dict):
            raise error(f"{path}:{line_no}: expected a JSON object, got {type(row).__name__}.")
        seen = True
        yield line_no, row
    if not seen:
        raise error(f"{path}: the file is empty (no JSON lines). Give a JSONL file: one JSON object per line.")


def read_bytes(path: Path, error: type[Exception], max_file_bytes: int | None = None) -> bytes:
    """A whole file's bytes (gunzipped when gzip), read in bounded chunks up to the file limit, BOM removed."""
    path = Path(path)
    check_file(path, error)
    max_file = max_file_bytes or _limit("LRMGYM_MAX_FILE_BYTES", MAX_FILE_BYTES, error)
    return b"".join(_chunks(path, error, max_file)).removeprefix(_BOM)


def read_json(path: Path, error: type[Exception], max_file_bytes: int | None = None) -> Any:
    """The JSON document of a whole file, read in bounded chunks; a problem raises ``error`` naming the line."""
    path = Path(path)
    data = read_bytes(path, error, max_file_bytes)
    if not data.strip():
        raise error(f"{path}: the file is empty. Give a JSON file.")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        text = ""
        bad = err.start
    else:
        bad = data.find(b"\x00")
    if bad >= 0:  # report it as iter_lines would: the line number, the byte and its column
        start, end = data.rfind(b"\n", 0, bad) + 1, data.find(b"\n", bad)
        _decode(path, data.count(b"\n", 0, bad) + 1, data[start : end if end >= 0 else len(data)], error)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise error(f"{path}:{err.lineno}: not valid JSON ({err.msg} at column {err.colno}).") from None
    except (ValueError, RecursionError) as err:
        raise error(f"{path}: not valid JSON ({_json_problem(err)}).") from None
