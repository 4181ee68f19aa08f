"""How much memory this process holds: the peak every stage reports (captures, compare and its
helper, the bench's bare steps), the figure the float64 step's spill budgets against, and
(for the bench) what another process holds now."""

from __future__ import annotations

import os
import resource
from pathlib import Path
from typing import Optional, Union


def peak_resident_bytes() -> int:
    """The most memory this process has held so far (Unix only; Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_resident_mb() -> float:
    return peak_resident_bytes() / 2**20


def resident_bytes(pid: Union[int, str] = "self") -> Optional[int]:
    """Resident memory now of this process (or of process ``pid``; Linux), or None where it
    cannot be read (a process that has ended, say)."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * \
            os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


PF_FORKNOEXEC = 0x40        # a process's flag (linux/sched.h): forked, has not called exec


def shares_its_parents_memory(pid: Union[int, str]) -> bool:
    """Whether process ``pid`` has forked and not yet called exec (Linux): its resident pages
    are its parent's, the same memory (subprocess's vfork, until the command starts) or copies
    of it only as written (a fork). False where it cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return bool(int(fields[6]) & PF_FORKNOEXEC)
    except (OSError, ValueError, IndexError):
        return False
