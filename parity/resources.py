"""How much memory this process holds: the peak every stage reports (captures, compare and its
helper, the bench's bare steps) and the figure the float64 step's spill budgets against."""

from __future__ import annotations

import os
import resource
from pathlib import Path
from typing import Optional

STATM = Path("/proc/self/statm")


def peak_resident_bytes() -> int:
    """The most memory this process has held so far (Unix only; Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_resident_mb() -> float:
    return peak_resident_bytes() / 2**20


def resident_bytes() -> Optional[int]:
    """This process's resident memory now (Linux), or None where it cannot be read."""
    try:
        return int(STATM.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
