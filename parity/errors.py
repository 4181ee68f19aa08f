"""The one exception type the CLI turns into a one-line message and exit code 2, and how such a
line names a long list."""

from typing import Sequence


class ParityInputError(Exception):
    """Bad input or usage: the message names the problem and the fix; never a traceback."""


def first_few(items: Sequence[str], shown: int = 4, separator: str = ", ") -> str:
    """The first ``shown`` items and how many more: one line a reader can take in."""
    more = len(items) - shown
    return separator.join(items[:shown]) + (f" and {more} more" if more > 0 else "")
