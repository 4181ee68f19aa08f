"""The ``parity`` command's first code: the console script and ``python -m parity`` both start
here. It imports nothing heavy itself (not even typing), so that a Ctrl-C is handled from the
first moment: loading parity.cli takes a few hundred milliseconds (numpy), and a
KeyboardInterrupt raised inside an import can come out of it as another error (numpy's
ImportError), printed with its traceback and exit code 1."""

import os
import signal
import sys


def interrupted_while_loading(*_: object) -> None:
    """Ctrl-C before parity handles it itself: nothing is written yet, so end at once."""
    print("parity: interrupted; no partial output was left behind", file=sys.stderr)
    sys.stderr.flush()
    os._exit(130)               # parity.errors.EXIT_INTERRUPT, not imported yet


def main() -> None:
    """Load the command line and run it. parity.cli.main replaces this module's handler with
    its own (it takes it for the default), so no moment is left without one."""
    try:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:   # not where Ctrl-C
            signal.signal(signal.SIGINT, interrupted_while_loading)        # is ignored
        from parity.cli import main as run_command_line
    except KeyboardInterrupt:   # raised before the handler was in place
        interrupted_while_loading()
    run_command_line()
