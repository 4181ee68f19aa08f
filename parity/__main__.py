import os
import signal
import sys


def _interrupted_while_loading(*_: object) -> None:
    """Ctrl-C while parity loads, before it handles Ctrl-C itself: end at once. Raised as
    KeyboardInterrupt there, it could come out of numpy's import as an ImportError, printed
    with its traceback and exit code 1."""
    print("parity: interrupted; no partial output was left behind", file=sys.stderr)
    sys.stderr.flush()
    os._exit(130)               # parity.errors.EXIT_INTERRUPT, perhaps not imported yet


try:
    at_default = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if at_default:              # not where Ctrl-C is ignored (a background job)
        signal.signal(signal.SIGINT, _interrupted_while_loading)
    from parity.cli import main
    if at_default:              # main installs parity's own handler where it finds the default
        signal.signal(signal.SIGINT, signal.default_int_handler)
except KeyboardInterrupt:
    _interrupted_while_loading()

sys.exit(main())
