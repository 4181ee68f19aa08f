"""The one exception type the CLI turns into a one-line message and exit code 2."""


class ParityInputError(Exception):
    """Bad input or usage: the message names the problem and the fix; never a traceback."""
