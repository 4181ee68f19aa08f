"""Child processes parity starts (a capture, a benchmark's command): stopping one so that it
can clean up after itself, and ending it with the process that started it."""

import ctypes
import os
import signal
import subprocess
import sys
from typing import Dict

# How long an interrupted child may take to remove what it was writing before it is killed: a
# kernel running when the interrupt came finishes first.
CLEAN_UP_SECONDS = 60
# Names the process that started a child: the child ends with it (end_with_parent).
PARENT_ENV = "PARITY_PARENT_PID"
PR_SET_PDEATHSIG = 1        # Linux's prctl option (sys/prctl.h)


def as_child_of_this_process() -> Dict[str, str]:
    """The environment entry that makes a child started with it call end_with_parent on us."""
    return {PARENT_ENV: str(os.getpid())}


def end_with_parent() -> bool:
    """In a child that parity started: get SIGTERM, which each cleans up after, when the parent
    ends, killed (SIGKILL leaves it no time to stop its children) or with its terminal. Not
    SIGINT: a job a shell starts in the background ignores it. Whether this process is such a
    child (outside Linux it does not end with its parent).

    The kernel sends the signal again each time the child passes to another of the dying
    parent's threads, all within milliseconds: such a child takes only the first interrupt, or
    the repeats would cut its clean-up short (its parent, alive, kills it when it means to)."""
    parent = os.environ.get(PARENT_ENV)
    if not parent:
        return False
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != int(parent):         # it ended before prctl
            os.kill(os.getpid(), signal.SIGTERM)
    return True


def stop(process: subprocess.Popen, signum: int) -> None:
    """Send ``signum`` to a child that still runs and wait while it cleans up; kill it after
    CLEAN_UP_SECONDS, or at once at another interrupt (Ctrl-C, SIGTERM) during the wait."""
    if process.poll() is not None:
        return
    process.send_signal(signum)
    try:
        process.communicate(timeout=CLEAN_UP_SECONDS)
    except (KeyboardInterrupt, SystemExit, subprocess.TimeoutExpired):
        process.kill()
        process.communicate()
