"""Tensors autograd saves for backward, written to a scratch file past a memory budget.

The float64 step saves twice the float32 step's activations: at batch 8, 224² it was the
whole capture's peak (2.46 GB against 1.92 GB for the hooked float32 step, ResNet50). While
the process holds more than the budget, each further saved tensor goes to the scratch file and
comes back, byte for byte, when backward needs it. Autograd's own saved-tensor hooks do the
bookkeeping (``torch.autograd.graph.saved_tensors_hooks``).

The tensors spilled are the forward's later ones, which backward reads back first, so the
peak falls by less than what is spilled: torch capture at batch 8, 224², two runs each, peak
2.47-2.48 GB → 2.16-2.23 GB with 591-725 MB spilled, float64 step 13.6-13.7 s → 14.9-15.7 s.
Spilling the first 700 MB instead lowered a bare float64 step's peak by 711 MB for 2.0 s,
but how many bytes to spill that way is known only once the forward has run.

The scratch file is written and read with O_DIRECT where the file system allows it
(parity/direct_io.py): through the page cache, whose new pages are slow to fault in on this VM,
torch capture at batch 8, 224², float64 step 16.4-20.1 s, with O_DIRECT 12.3-14.7 s (two runs
each, in turns, 2026-12-03).
"""

from __future__ import annotations

import errno
import os
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from parity import direct_io
from parity.errors import no_space_error
from parity.resources import resident_bytes

MIN_BYTES = 1 << 20         # smaller tensors are not worth a write and a read


@dataclass(frozen=True)
class _Spilled:
    offset: int
    shape: Tuple[int, ...]
    dtype: Any
    direct: bool        # written with O_DIRECT, so read so


class SavedTensorSpill:
    """A context manager around a whole step (forward *and* backward: backward reads back).

    Only a tensor whose memory the spill frees is written: at least MIN_BYTES, on the CPU,
    contiguous, the whole of its storage, neither a view (of a parameter, say: ``weight.t()``)
    nor a parameter itself (a leaf that requires grad), which live on anyway. A tensor saved
    twice unchanged (an in-place ReLU's output, saved by the ReLU and by the next convolution)
    is written once.
    """

    def __init__(self, scratch: Path, budget: int, written_for: Optional[Path] = None) -> None:
        """``written_for``: the path a full disk is told about, the one the user named (the
        run directory the scratch file is hidden in); the scratch file itself by default."""
        self.scratch = scratch
        self.budget = budget
        self.written_for = written_for or scratch
        self.spilled_bytes = 0
        self._end = 0           # of the file: each tensor starts on a direct_io.BLOCK boundary
        self._fd = -1
        self._direct: Optional[direct_io.DirectFile] = None
        self._writes_direct = False     # until the file system refuses O_DIRECT
        self._hooks: Any = None
        # (data pointer, version, shape, dtype) -> the storage, weakly (it must die when autograd
        # frees it; a later tensor at the same address is another), and where it was spilled,
        # None if kept. Torch keeps one Python object per live storage.
        self._seen: Dict[Tuple, Tuple[weakref.ref, Optional[_Spilled]]] = {}

    def __enter__(self) -> "SavedTensorSpill":
        import torch
        self._fd = os.open(self.scratch, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            self._direct = direct_io.DirectFile(self.scratch, os.O_RDWR)
            self._writes_direct = True
        except OSError as error:
            if not direct_io.refused(error):
                raise
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)
        self._seen.clear()
        os.close(self._fd)
        if self._direct is not None:
            self._direct.close()
        self.scratch.unlink()

    def _frees_memory(self, tensor) -> bool:
        return (tensor.device.type == "cpu" and tensor.nbytes >= MIN_BYTES
                and tensor.is_contiguous() and not tensor._is_view()
                and not (tensor.is_leaf and tensor.requires_grad)
                and tensor.untyped_storage().nbytes() == tensor.nbytes)

    def _pack(self, tensor) -> Any:
        if not self._frees_memory(tensor):
            return tensor
        key = (tensor.data_ptr(), tensor._version, tuple(tensor.shape), tensor.dtype)
        storage = tensor.untyped_storage()
        seen = self._seen.get(key)
        if seen is None or seen[0]() is not storage:
            resident = resident_bytes()
            over = resident is not None and resident > self.budget
            seen = (weakref.ref(storage), self._write(tensor) if over else None)
            self._seen[key] = seen
        return tensor if seen[1] is None else seen[1]

    def _unpack(self, packed: Any) -> Any:
        if not isinstance(packed, _Spilled):
            return packed
        import torch
        tensor = torch.empty(packed.shape, dtype=packed.dtype)
        view = memoryview(tensor.view(-1).view(torch.uint8).numpy())
        if packed.direct:
            self._direct.read_into(packed.offset, view)
            return tensor
        done = 0
        while done < len(view):
            read = os.preadv(self._fd, [view[done:]], packed.offset + done)
            if read == 0:
                raise OSError(errno.EIO, f"{self.scratch} ended early")
            done += read
        return tensor

    def _write(self, tensor) -> _Spilled:
        import torch
        view = memoryview(tensor.detach().view(-1).view(torch.uint8).numpy())
        offset = self._end
        try:
            direct = self._writes_direct and self._write_direct(view, offset)
            done = 0
            while not direct and done < len(view):
                done += os.pwrite(self._fd, view[done:], offset + done)
        except OSError as error:
            if error.errno == errno.ENOSPC:
                raise no_space_error(self.written_for) from error
            raise
        self.spilled_bytes += len(view)
        self._end = offset + direct_io.padded(len(view))
        return _Spilled(offset, tuple(tensor.shape), tensor.dtype, direct)

    def _write_direct(self, view: memoryview, offset: int) -> bool:
        """Whether ``view`` went to the file with O_DIRECT; where the file system refuses it,
        this tensor and the next go through the page cache (those before are read back as
        they were written)."""
        try:
            self._direct.write(offset, [view])
        except OSError as error:
            if not direct_io.refused(error):
                raise
            self._writes_direct = False
            return False
        return True
