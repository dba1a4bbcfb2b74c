"""Writing files safely: atomic writes, output paths checked before anything is written, fresh directories.

Every command writes through these, so that no crash leaves half a file, no output overwrites its own input or
a device, and no command writes into a directory that holds another command's results.

- :func:`atomic_write_bytes` / :func:`atomic_write_text`: a temporary sibling with a unique name (two writers of
  one path never share it), fsynced, then renamed over the target (atomic on POSIX).
- :func:`check_output_file`: refuses an output that is an input, an existing non-regular file (``/dev/null``, a
  directory, a FIFO), or lies under ``/proc``, ``/sys`` or ``/dev``; one of a run folder's own files, always; a
  new file in a run folder or an existing result, unless forced (the commands' ``--force``).
- :func:`check_output_dir`: refuses an export folder that a shell stands in, a run folder, or a folder of runs.
- :func:`run_folder_of`: the folder of a ``lrmgym run`` (or eval, export, stage) a path lies in.
- :func:`fresh_dir`: creates a directory that did not exist (``mkdir`` without ``exist_ok`` is the lock), or,
  for a generated name, the first free ``name-2``, ``name-3`` ...
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "OutputPathError",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_text",
    "check_output_dir",
    "check_output_file",
    "describe_os_error",
    "fresh_dir",
    "out_of_space",
    "remove_stale_temps",
    "replaced_dir",
    "run_folder_of",
]

_PSEUDO_ROOTS = (Path("/proc"), Path("/sys"), Path("/dev"))
TEMP_SUFFIX = ".tmp"


class OutputPathError(ValueError):
    """An output path that must not be written (the message says why and what to do)."""


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some filesystems do not allow opening directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write`` on a fresh temporary sibling of ``path``, fsync it, then rename it over ``path``.

    On any failure (a full disk included) the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        full = isinstance(err, Exception) and out_of_space(err, path.parent)  # before the space is freed again
        Path(tmp).unlink(missing_ok=True)
        if full:  # torch.save reports a full disk as a RuntimeError ("unexpected pos ..."): say what it is
            raise OSError(errno.ENOSPC, "No space left on device", str(path)) from err
        raise
    _fsync_dir(path.parent)


def out_of_space(err: BaseException, directory: str | os.PathLike) -> bool:
    """Whether ``err`` is (or was caused by) the disk of ``directory`` being full."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    try:
        st = os.statvfs(directory)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 1 << 20  # under 1 MiB left: whatever the error says, the disk is full


@contextlib.contextmanager
def replaced_dir(target: str | os.PathLike) -> Iterator[Path]:
    """A temporary sibling folder to fill, which takes ``target``'s place when the block ends cleanly.

    A folder is written whole or not at all: an exception removes the temporary folder and leaves ``target`` as
    it was; an existing ``target`` is moved aside and removed only once the new folder is in its place.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
        aside = None
        if target.exists():
            aside = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.rename(target, aside)
        os.rename(tmp, target)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash leaves either the old file or the new one."""
    atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """:func:`atomic_write_bytes` of UTF-8 text (lone surrogates, which model output may hold, kept as they are)."""
    atomic_write_bytes(path, text.encode("utf-8", errors="surrogatepass"))


def remove_stale_temps(directory: str | os.PathLike) -> list[Path]:
    """Delete the temporary files interrupted atomic writes left in ``directory`` (not below it); returns them.

    Only names this module makes (``.NAME.XXXXXXXX.tmp``) are touched. Call it where no other writer is active.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    stale = [p for p in directory.iterdir() if p.name.startswith(".") and p.name.endswith(TEMP_SUFFIX) and p.is_file()]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def _under_pseudo_fs(path: Path) -> Path | None:
    for root in _PSEUDO_ROOTS:
        if path == root or root in path.parents:
            return root
    return None


_RUN_MARKERS = ("run.json", "run.lock", "metrics.jsonl", "summary.json", "checkpoints", "eval.json", "export.json")
"""Beside a ``config.yaml``, what makes a folder one of lrmgym's: a run (started, training, finished), an eval, an
export (a folder with a ``config.yaml`` alone could be anyone's)."""
_STAGE_MARKERS = ("metrics.jsonl", "checkpoints", "stage.json")
"""What makes a folder under a staged run's ``stages/`` one of its stage folders (they have no config.yaml)."""


def _is_run_folder(folder: Path) -> bool:
    if folder.parent.name == "stages" and any((folder / m).exists() for m in _STAGE_MARKERS):
        return True
    return (folder / "config.yaml").is_file() and any((folder / m).exists() for m in _RUN_MARKERS)


def run_folder_of(path: str | os.PathLike) -> Path | None:
    """The innermost run folder ``path`` lies in (resolved), or None.

    A run folder is one of ``lrmgym run``, ``eval`` or ``export`` (a ``config.yaml`` with a run's, an eval's or an
    export's files beside it), or a staged run's stage folder.
    """
    resolved = Path(os.path.realpath(path))
    for folder in resolved.parents:
        if _is_run_folder(folder):
            return folder
    return None


_TRAINED = ("run.json", "run.lock", "metrics.jsonl", "summary.json", "checkpoints", "eval.json")
"""What an export folder (``config.yaml`` + ``export.json``) holds once it has trained or been evaluated."""


def _replaceable_export(folder: Path) -> bool:
    """Whether ``folder`` is an export of ``lrmgym export`` that nothing has trained in (its files re-derivable)."""
    return (folder / "export.json").is_file() and not any((folder / m).exists() for m in _TRAINED)


def check_output_dir(path: str | os.PathLike, force: bool, what: str = "out") -> Path:
    """``path`` resolved, if a command may make (or, with ``force``, replace) a whole folder there.

    Refused, ``force`` or not: the current folder or one above it, a folder under ``/proc``, ``/sys`` or ``/dev``,
    a run folder (except an export nothing has trained in), a folder holding a run folder (two levels down).
    Refused without ``force``: a new folder inside a run folder. The caller checks the rest (a file, not empty).
    """
    given = Path(path)
    resolved = Path(os.path.realpath(given))
    root = _under_pseudo_fs(resolved)
    if root is not None:
        raise OutputPathError(f"{what}={given}: it lies under {root}, which holds devices or kernel files; give a "
                              "normal folder.")  # fmt: skip
    cwd = Path(os.path.realpath(os.getcwd()))
    if resolved == cwd or resolved in cwd.parents:
        raise OutputPathError(
            f"{what}={given}: {str(resolved)!r} is the current folder or holds it, and the export replaces its "
            "folder whole; give a new folder, e.g. out=exports/NAME."
        )
    if resolved.is_dir():
        if _is_run_folder(resolved) and not _replaceable_export(resolved):
            raise OutputPathError(
                f"{what}={given}: {str(resolved)!r} is a run folder; it is never replaced, --force or not. Give a new "
                "folder."
            )
        inner = [p for p in resolved.glob("*/") if _is_run_folder(p)] or [
            p for p in resolved.glob("*/*/") if _is_run_folder(p)
        ]
        if inner:
            raise OutputPathError(
                f"{what}={given}: {str(resolved)!r} holds the run folder {str(inner[0])!r}; it is never replaced, "
                "--force or not. Give a new folder."
            )
    run = run_folder_of(resolved)
    if run is not None and not force:
        raise OutputPathError(
            f"{what}={given}: it lies in the run folder {str(run)!r}, whose files are the run's; give a folder "
            "outside it, or pass --force to add this one there."
        )
    return resolved


def check_output_file(
    path: str | os.PathLike,
    inputs: Iterable[str | os.PathLike] = (),
    what: str = "output",
    *,
    force: bool = True,
    owned: Collection[str] = (),
    default: bool = False,
) -> Path:
    """``path`` resolved, if a command may write a file there; else :class:`OutputPathError` saying why.

    Allowed: a new path (its parent is created later), or an existing regular file that is none of ``inputs``,
    with these limits for results (:func:`run_folder_of`):

    - Never over a run folder's own files (its logs, config, checkpoints ...: whatever is there that this command
      does not write), ``force`` or not: only a file named in ``owned`` (the names this command writes), at the top
      of a run folder that is not a stage folder, may be replaced.
    - Without ``force``: no existing file is replaced, and no new file is added to a run folder, unless it is the
      command's ``default`` output there (``owned`` names only, e.g. ``lrmgym report``'s RUN/report.html).

    ``force`` is True by default for library callers; the commands pass their ``--force`` flag.
    """
    given = Path(path)
    resolved = Path(os.path.realpath(given))
    root = _under_pseudo_fs(resolved)
    if root is not None:
        raise OutputPathError(
            f"{what} {str(given)!r} lies under {root}, which holds devices or kernel files, not results; "
            "give a path in a normal directory."
        )
    for src in inputs:
        src_path = Path(src)
        same = resolved == Path(os.path.realpath(src_path))
        if not same and resolved.exists() and src_path.exists():
            try:
                same = os.path.samefile(resolved, src_path)
            except OSError:
                same = False
        if same:
            raise OutputPathError(
                f"{what} {str(given)!r} is the input file {str(src_path)!r}; writing it would destroy the input. "
                "Give another output path."
            )
    if os.path.lexists(given):
        mode = os.stat(resolved).st_mode if resolved.exists() else 0
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file (a device, pipe or socket)"
            if not resolved.exists():
                kind = "a broken symbolic link"
            raise OutputPathError(f"{what} {str(given)!r} is {kind}; give the path of a new or regular file.")
    parent = resolved.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise OutputPathError(f"{what} {str(given)!r}: {str(parent)!r} is a file, not a directory; give another path.")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputPathError(f"{what} {str(given)!r}: the directory {str(parent)!r} is not writable by this user.")
    exists = os.path.lexists(given)
    run = run_folder_of(resolved)
    if run is not None:
        own = resolved.name in owned and resolved.parent == run
        if exists and (not own or run.parent.name == "stages"):
            raise OutputPathError(
                f"{what} {str(given)!r} is a file of the run in {str(run)!r}; no command writes over a run's own "
                "files, --force or not: give a path outside that folder."
            )
        if not exists and not force and not (own and default):
            raise OutputPathError(
                f"{what} {str(given)!r} lies in the run folder {str(run)!r}, whose files are the run's; give a path "
                "outside it, or pass --force to add this file there."
            )
    if exists and not force:
        raise OutputPathError(f"{what} {str(given)!r} already exists; pass --force to replace it, or give a new path.")
    return resolved


def fresh_dir(parent: str | os.PathLike, name: str, unique: bool = False, what: str = "run.name") -> Path:
    """Create and return ``parent/name``, a directory that did not exist before this call.

    With ``unique`` (a generated name), the first free ``name-2``, ``name-3`` ... is taken instead of failing, so
    two commands started in the same second get two directories. Without it, an existing ``parent/name`` raises
    :class:`OutputPathError`, as does a ``parent`` in a run folder (:func:`run_folder_of`). ``mkdir`` is atomic,
    so two processes never both get one directory.
    """
    parent = Path(parent)
    if parent.exists() and not parent.is_dir():
        raise OutputPathError(
            f"run.output_dir {str(parent)!r} is a file, not a directory; give a directory (it is created if missing)."
        )
    under = _under_pseudo_fs(Path(os.path.realpath(parent)))
    if under is not None:
        raise OutputPathError(f"run.output_dir {str(parent)!r} lies under {under}; give a normal directory.")
    run = run_folder_of(parent / name)
    if run is not None:
        raise OutputPathError(
            f"run.output_dir {str(parent)!r} lies in the run folder {str(run)!r}, whose files are the run's; give an "
            "output folder outside it."
        )
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputPathError(f"run.output_dir {str(parent)!r} cannot be created: {describe_os_error(err)}.") from None
    for attempt in range(1, 10_000):
        candidate = parent / (name if attempt == 1 else f"{name}-{attempt}")
        try:
            candidate.mkdir()
        except FileExistsError:
            if not unique:
                raise OutputPathError(
                    f"{what}: {str(candidate)!r} already exists; choose another {what} (a command never writes "
                    "into a directory that holds other results)."
                ) from None
            continue
        except OSError as err:
            raise OutputPathError(f"{str(candidate)!r} cannot be created: {describe_os_error(err)}.") from None
        return candidate
    raise OutputPathError(f"{what}: every name {name}-2 ... {name}-9999 under {str(parent)!r} is taken.")


def describe_os_error(err: OSError) -> str:
    """A short, plain reason for an OS error ("no space left on device", "permission denied" ...)."""
    if err.errno == errno.ENOSPC:
        return "no space left on device"
    if err.errno == errno.EDQUOT:
        return "disk quota exceeded"
    return (err.strerror or str(err)).lower()
