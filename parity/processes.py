"""Stopping a child process parity started (a capture, a benchmark's command) so that it can
clean up after itself."""

import subprocess

# How long an interrupted child may take to remove what it was writing before it is killed: a
# kernel running when the interrupt came finishes first.
CLEAN_UP_SECONDS = 60


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
