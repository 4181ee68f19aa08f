"""The exceptions the CLI turns into one-line messages, the exit codes it ends with, how such
a line tells a framework's error (its first line; memory that ran out) and names a long list."""

import errno
import os
import re
import signal
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional, Sequence

# The interrupts parity cleans up after, as it names them: Ctrl-C, a cancelled CI job or
# ``timeout``, a terminal closing (an SSH session dropped).
INTERRUPT_NAMES = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated (SIGTERM)",
                   signal.SIGHUP: "hung up (SIGHUP)"}


def interrupted_exit(signum: int) -> int:
    """The exit code after cleaning up from interrupt ``signum``: 128 + the signal, as a shell
    reports a process the signal ended (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP)."""
    return 128 + signum


# parity's exit codes: 0 parity, 1 violations, 2 bad input or usage; interrupted_exit()
EXIT_PASS, EXIT_FAIL, EXIT_INPUT = 0, 1, 2
EXIT_INTERRUPT = interrupted_exit(signal.SIGINT)
EXIT_INTERRUPTED = tuple(map(interrupted_exit, INTERRUPT_NAMES))


class ParityInputError(Exception):
    """Bad input or usage: the message names the problem and the fix; never a traceback."""


class UserCodeFailed(ParityInputError):
    """The user's own code (a factory, the model's forward) raised: the line names it, and the
    command line adds how to see its traceback, which points into their code (not under
    --debug, which prints it)."""


TRACEBACK_HINT = " (rerun with --debug for the traceback)"


# What to do about a file the system refused parity, whatever command met it.
FILE_SYSTEM_ADVICE = {
    errno.EROFS: "write to another folder",
    errno.EACCES: "check its permissions, or use another path",     # reading or writing
    errno.EPERM: "check its permissions, or use another path",
    errno.ENOSPC: "free some space or write elsewhere",
    errno.EDQUOT: "free some space or write elsewhere",
}


def file_system_refusal(error: BaseException) -> Optional[str]:
    """'PATH: Read-only file system; write to another folder' for an error of the file system
    about a file, None for any other error."""
    if not isinstance(error, OSError) or error.errno not in FILE_SYSTEM_ADVICE \
            or error.filename is None:
        return None
    return (f"{os.fsdecode(error.filename)}: {error.strerror or os.strerror(error.errno)}; "
            f"{FILE_SYSTEM_ADVICE[error.errno]}")


def no_space_error(path: Path) -> ParityInputError:
    return ParityInputError(f"no space left on the device while writing {path}; "
                            f"{FILE_SYSTEM_ADVICE[errno.ENOSPC]}")


@contextmanager
def told_as(path: Path, temporary: Path) -> Iterator[None]:
    """File-system errors about ``temporary`` (what parity writes in place of ``path`` until it
    renames it: a hidden file or directory beside it) raised as errors about ``path``, the one
    the user named; so is an error that names no file (a failed write), and a full disk is
    no_space_error(path)."""
    try:
        yield
    except OSError as error:
        about = os.fsdecode(error.filename) if error.filename is not None else None
        if about is not None and about != os.fsdecode(temporary) \
                and not about.startswith(os.path.join(os.fsdecode(temporary), "")):
            raise
        if error.errno == errno.ENOSPC:
            raise no_space_error(path) from None
        raise OSError(error.errno, error.strerror, os.fsdecode(path)) from None


# What to do when a step runs out of memory.
SMALLER_BATCH = ("a smaller batch needs less (--batch-size, --image-size, or fewer samples in "
                 "--input)")


# How the frameworks word an allocation that failed: torch's CPU allocator ("can't allocate
# memory"), MindSpore's memory pool and kernels ("Allocate output memory failed, alloc node:
# ...", "malloc memory failed", "memory is not enough"); numpy raises MemoryError.
OUT_OF_MEMORY = re.compile(r"can't allocate memory|cannot allocate memory|memory isn't enough|"
                           r"memory is not enough|out of memory|"
                           r"\b(?:allocate|malloc|alloc)\b[^.\n]*\bmemory failed", re.IGNORECASE)
# oneDNN, under MindSpore's CPU kernels, says only this when it cannot allocate a primitive
# (measured under ``ulimit -v``); one it does not implement fails earlier, as "could not create
# a primitive descriptor ...".
PRIMITIVE_NOT_CREATED = re.compile(r"could not create a primitive(?! descriptor)")


def memory_ran_out(error: BaseException) -> str:
    """'ran out of memory'; 'most likely ran out of memory' for oneDNN's "could not create a
    primitive", which another failure could also raise; '' for any other error."""
    message = str(error)
    if isinstance(error, MemoryError) or OUT_OF_MEMORY.search(message):
        return "ran out of memory"
    if PRIMITIVE_NOT_CREATED.search(message):
        return "most likely ran out of memory"
    return ""


# A line of MindSpore's framed messages that says nothing itself: a rule of dashes, or a
# section's heading ("- Kernel select failed:", then the message on the line after the rule).
FRAMING = re.compile(r"^(?:[\W_]*|- [^:]*:)$")


# The lines a message's first line that leaves a bracket open goes on to, at most: a tensor's
# repr inside a sentence (MindSpore's "The Tensor(shape=[1, 19], dtype=Float32, value=" and
# "<uninitialized>) is uninitialized." on the next line).
BRACKETED_LINES = 8


def in_one_line(error: BaseException) -> str:
    """'ValueError: its message's first line': a framework's message can run to a C++ stack
    (--debug shows the rest). MindSpore frames some ("Unsupported op [InstanceNorm] on CPU"
    after a rule, a heading and a rule): their first line that says something, with the lines
    after it that close a bracket it leaves open."""
    lines = [line.strip() for line in str(error).strip().splitlines()]
    start = next((i for i, line in enumerate(lines) if not FRAMING.match(line)), 0)
    told = lines[start:start + 1]
    for line in lines[start + 1:start + 1 + BRACKETED_LINES]:
        if _brackets_open(" ".join(told)) <= 0:
            break
        told.append(line)
    first_line = " ".join(told).rstrip(".")
    return f"{type(error).__name__}{': ' if first_line else ''}{first_line}"


def _brackets_open(text: str) -> int:
    return sum(text.count(b) for b in "([{") - sum(text.count(b) for b in ")]}")


def damage(error: Exception) -> str:
    """What is wrong with a damaged file parity wrote, from the error reading it raised: a
    missing key's KeyError says only "'kind'"."""
    return f"no {error} field" if isinstance(error, KeyError) else str(error)


class Interrupted(KeyboardInterrupt):
    """An interrupt (Ctrl-C, SIGTERM, SIGHUP) that left finished work behind on purpose:
    ``kept`` says what, and how to use it."""

    def __init__(self, kept: str) -> None:
        super().__init__(kept)
        self.kept = kept


def first_few(items: Sequence[str], shown: int = 4, separator: str = ", ") -> str:
    """The first ``shown`` items and how many more: one line a reader can take in."""
    more = len(items) - shown
    return separator.join(items[:shown]) + (f" and {more} more" if more > 0 else "")
