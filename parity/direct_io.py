"""Files written and read past the page cache (O_DIRECT), through a reused staging buffer.

Where memory untouched for a few seconds is slow to fault in (this VM hands freed pages back
to its host), each new page-cache page costs that fault: a capture's shards and the float64
step's spilled tensors went into the cache at 0.1-1 GB/s. With O_DIRECT the bytes go between
the disk and one staging buffer that stays in use, so stays fast. O_DIRECT wants the buffer,
the file offset and the length aligned to the device's logical block: the staging buffer is an
anonymous map (page-aligned), every transfer starts on a BLOCK boundary, and the last block a
write fills is padded with zeros. A file system that refuses O_DIRECT (tmpfs on some kernels,
though this machine's 6.18 takes it; some overlay mounts) raises OSError EINVAL, at open or at
the first transfer (``refused``): callers then go through the page cache.
"""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path
from typing import Iterable, Optional

O_DIRECT = getattr(os, "O_DIRECT", 0)       # Linux
BLOCK = 4096                # a multiple of the logical block size of the disks in use
STAGING_BYTES = 8 * 2**20   # a multiple of BLOCK


def refused(error: OSError) -> bool:
    """Whether ``error`` is the file system refusing O_DIRECT, not a failed transfer."""
    return error.errno == errno.EINVAL


def padded(size: int) -> int:
    """``size`` rounded up to whole blocks: what a write of ``size`` bytes takes in the file."""
    return -(-size // BLOCK) * BLOCK


def staging_buffer() -> mmap.mmap:
    """A staging buffer to hand to one DirectFile after another (a new one faults its pages in
    anew)."""
    return mmap.mmap(-1, STAGING_BYTES)


class DirectFile:
    """``path`` opened with O_DIRECT besides ``flags``; its transfers go through ``staging``
    (staging_buffer(), used by one file at a time), or through one of its own."""

    def __init__(self, path: Path, flags: int, mode: int = 0o666,
                 staging: Optional[mmap.mmap] = None) -> None:
        if not O_DIRECT:
            raise OSError(errno.EINVAL, "no O_DIRECT on this platform", str(path))
        self._descriptor = os.open(path, flags | O_DIRECT, mode)
        self._view = memoryview(staging_buffer() if staging is None else staging)

    def write(self, offset: int, chunks: Iterable) -> int:
        """The buffers ``chunks``, one after the other, from ``offset`` (a multiple of BLOCK);
        returns their size. The file holds zeros after them to the end of the block."""
        view, filled, written = self._view, 0, 0
        for chunk in chunks:
            data = memoryview(chunk).cast("B")
            done = 0
            while done < len(data):
                taken = min(len(data) - done, len(view) - filled)
                view[filled:filled + taken] = data[done:done + taken]
                filled, done = filled + taken, done + taken
                if filled == len(view):
                    self._write(view, offset + written)
                    written, filled = written + filled, 0
        if filled:
            view[filled:padded(filled)] = bytes(padded(filled) - filled)
            self._write(view[:padded(filled)], offset + written)
            written += filled
        return written

    def read_into(self, offset: int, target: memoryview) -> None:
        """Fill ``target`` with the bytes a write put at ``offset``."""
        done = 0
        while done < len(target):
            size = min(len(target) - done, len(self._view))
            self._read(self._view[:padded(size)], offset + done, size)
            target[done:done + size] = self._view[:size]
            done += size

    def truncate(self, size: int) -> None:
        """Cut the file back to ``size`` bytes: a write's padding past its last byte goes."""
        os.ftruncate(self._descriptor, size)

    def close(self) -> None:
        """Close the file; the staging buffer is unmapped once nothing holds it (a traceback
        through a failed transfer does, for a while)."""
        os.close(self._descriptor)

    def __enter__(self) -> "DirectFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _write(self, view: memoryview, offset: int) -> None:
        done = 0
        while done < len(view):
            done += os.pwrite(self._descriptor, view[done:], offset + done)

    def _read(self, view: memoryview, offset: int, needed: int) -> None:
        """Whole blocks into ``view`` from ``offset``, of which the first ``needed`` bytes must
        be in the file (the rest may lie past its end, when it was cut back)."""
        done = 0
        while done < needed:
            read = os.preadv(self._descriptor, [view[done:]], offset + done)
            if read == 0:
                raise OSError(errno.EIO, "the file ended before the bytes written to it")
            done += read
