"""The exceptions the CLI turns into one-line messages (exit code 2 for bad input, 130 or 143
for an interrupt), and how such a line names a long list."""

from typing import Sequence


class ParityInputError(Exception):
    """Bad input or usage: the message names the problem and the fix; never a traceback."""


# What to do when a step runs out of memory.
SMALLER_BATCH = ("a smaller batch needs less (--batch-size, --image-size, or fewer samples in "
                 "--input)")


class Interrupted(KeyboardInterrupt):
    """An interrupt (Ctrl-C, SIGTERM) that left finished work behind on purpose: ``kept`` says
    what, and how to use it."""

    def __init__(self, kept: str) -> None:
        super().__init__(kept)
        self.kept = kept


def first_few(items: Sequence[str], shown: int = 4, separator: str = ", ") -> str:
    """The first ``shown`` items and how many more: one line a reader can take in."""
    more = len(items) - shown
    return separator.join(items[:shown]) + (f" and {more} more" if more > 0 else "")
