"""Parity's own files: read back checked, and written atomically without ever clobbering a file
parity did not write."""

from __future__ import annotations

import json
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

from parity.errors import ParityInputError, file_system_refusal, told_as

# Every report parity writes carries this marker near its start; a file without it is the
# user's own and is never overwritten.
MARKER = "parity-report"
CSV_HEADER = b"name,kind,shape,passed,"
# The kinds of file parity writes and may replace, each only with one of its own kind: a JSON
# report is not replaced by its HTML rendering, nor a baseline (a known-good run's errors,
# often kept under version control) by a report.
JSON_REPORT = "JSON report"
CSV_REPORT = "CSV report"
HTML_REPORT = "HTML report"
BASELINE = "baseline"
BASELINE_FORMAT = f"{MARKER}/baseline"      # a baseline's "format"; a JSON report's is MARKER
# How each starts: a JSON file with its "format" first, an HTML page with a comment.
_JSON_FORMAT = re.compile(rb'^\s*\{\s*"format":\s*"([^"]*)"')
_JSON_KINDS = {MARKER.encode(): JSON_REPORT, BASELINE_FORMAT.encode(): BASELINE}
_HTML_MARKER = f"<!-- {MARKER}: written by parity".encode()


def read_parity_json(path: Path, *, what: str, marker: str, version: int,
                     redo: str) -> Dict[str, Any]:
    """The JSON object of a file parity writes (``what``: a run manifest, a baseline, a JSON
    report), checked to carry ``"format": marker`` and ``"format_version": version``; else a
    one-line error ending in ``redo``, what to do. A missing file raises FileNotFoundError:
    what that means is the caller's to say."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise
    except OSError as error:
        raise ParityInputError(file_system_refusal(error)
                               or f"{path} cannot be read ({error.strerror})") from None
    except ValueError as error:      # UnicodeDecodeError included
        raise ParityInputError(f"{path} is not readable JSON ({error}): cut short or changed "
                               f"since parity wrote it? {redo}") from None
    if not isinstance(data, dict) or data.get("format") != marker:
        raise ParityInputError(f"{path} is not a parity {what} (it has no \"format\": "
                               f"\"{marker}\"): {redo}")
    if data.get("format_version") != version:
        raise ParityInputError(f"{path} was written in {what} format "
                               f"{data.get('format_version')!r}; this parity reads format "
                               f"{version}: {redo}")
    return data


def written_by_parity(path: Path) -> Optional[str]:
    """The kind of parity file (JSON_REPORT, CSV_REPORT, HTML_REPORT, BASELINE) the regular
    file ``path`` is, told by its start; None for any other file (a pipe's read would block)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(4096)
    except OSError:
        return None
    if head.startswith(CSV_HEADER):
        return CSV_REPORT
    if head.startswith(b"<!DOCTYPE html>") and _HTML_MARKER in head:
        return HTML_REPORT
    found = _JSON_FORMAT.match(head)
    return _JSON_KINDS.get(found.group(1)) if found else None


def refuse_unwritable(path: Path, *, replace_own: Optional[str] = None) -> None:
    """Raise unless ``path`` may be written: a new file in an existing folder, or a file parity
    wrote of the kind ``replace_own`` names (JSON_REPORT, CSV_REPORT, HTML_REPORT, BASELINE).
    Called before long work, as well as when writing."""
    if path.is_dir():
        raise ParityInputError(f"{path} is a folder: name the file to write (a path inside it, "
                               "say)")
    if path.exists():
        if not path.is_file():
            raise ParityInputError(f"{path} is not a regular file (a device, a pipe): parity "
                                   "writes each output whole into a file of its own; name a "
                                   "file, and read it from there")
        written_as = written_by_parity(path)
        if written_as is None or replace_own is None:
            raise ParityInputError(f"{path} already exists; parity never overwrites a file it "
                                   "did not write: remove it or choose another path")
        if written_as != replace_own:
            raise ParityInputError(f"{path} is a parity {written_as}; writing the "
                                   f"{replace_own} there would lose it: choose another path, "
                                   "or remove it")
    if not path.parent.is_dir():
        raise ParityInputError(f"cannot write {path}: folder {path.parent} does not exist")
    _refuse_unwritable_folder(path.parent, path)


def _refuse_unwritable_folder(folder: Path, path: Path) -> None:
    """Raise if ``path`` cannot be created in ``folder``: before minutes of capture, not after.
    access(2) answers for the folder's file system and permissions (a read-only mount too, for
    root)."""
    if os.access(folder, os.W_OK | os.X_OK):
        return
    read_only = os.statvfs(folder).f_flag & os.ST_RDONLY
    why, advice = (("is on a read-only file system", "write to another folder") if read_only else
                   ("is not writable", "check its permissions, or write to another folder"))
    raise ParityInputError(f"cannot write {path}: folder {folder} {why}; {advice}")


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file (through links too, when it exists)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


@contextmanager
def atomic_output(path: Path, *, replace_own: Optional[str] = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is renamed over ``path``.

    An existing file is replaced only when parity wrote it as the kind ``replace_own`` names.
    """
    path = Path(path)
    refuse_unwritable(path, replace_own=replace_own)
    with replaced_whole(path) as tmp:
        yield tmp


def through_links(path: Path) -> Path:
    """What a write to ``path`` replaces: the file or directory a symbolic link there names.
    Renamed over, the link itself would be gone and its target left as it was."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


@contextmanager
def replaced_whole(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is renamed over ``path``, whatever
    that was: for a file parity owns by where it is (a run directory's index)."""
    target = through_links(path)
    tmp = target.with_name(f".{target.stem}.tmp-{os.getpid()}{target.suffix}")
    try:
        with told_as(path, tmp):
            yield tmp
            os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text(path: Path, text: str, kind: str) -> Path:
    """Write a file parity owns (carrying MARKER), of ``kind`` (JSON_REPORT...), atomically."""
    with atomic_output(path, replace_own=kind) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)
