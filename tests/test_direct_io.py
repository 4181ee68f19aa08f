"""Files written and read past the page cache: the same bytes back, at any size, through a
staging buffer smaller than what moves."""

from __future__ import annotations

import os

import numpy as np
import pytest

from parity import direct_io
from parity.direct_io import BLOCK, DirectFile
from tests.conftest import skip_without_o_direct


@pytest.fixture
def small_staging(monkeypatch):
    """Two blocks: a transfer of a few kilobytes already takes several."""
    monkeypatch.setattr(direct_io, "STAGING_BYTES", 2 * BLOCK)


def _open(path) -> DirectFile:
    skip_without_o_direct(path.parent)
    return DirectFile(path, os.O_RDWR | os.O_CREAT)


@pytest.mark.parametrize("sizes", [[1], [BLOCK], [2 * BLOCK + 1], [3000, 1, 9000, BLOCK]])
def test_what_is_written_at_block_boundaries_reads_back_the_same(tmp_path, small_staging,
                                                                 sizes):
    rng = np.random.default_rng(0)
    tensors = [rng.integers(0, 256, size, dtype=np.uint8) for size in sizes]
    offsets, end = [], 0
    with _open(tmp_path / "f") as file:
        for tensor in tensors:      # as the spill writes them: each from the block after
            offsets.append(end)
            assert file.write(end, [tensor]) == len(tensor)
            end += direct_io.padded(len(tensor))
        for offset, tensor in zip(offsets, tensors):
            back = bytearray(len(tensor))
            file.read_into(offset, memoryview(back))
            assert bytes(back) == tensor.tobytes()
    assert (tmp_path / "f").stat().st_size == end


def test_the_bytes_of_a_file_cut_back_to_its_size_read_back(tmp_path):
    """A shard is cut back after its last write: its last block is short in the file."""
    with _open(tmp_path / "f") as file:
        file.truncate(file.write(0, [b"0123456789"]))
        back = bytearray(10)
        file.read_into(0, memoryview(back))
    assert back == b"0123456789" and (tmp_path / "f").stat().st_size == 10


def test_a_read_past_what_was_written_says_the_file_ended(tmp_path):
    with _open(tmp_path / "f") as file:
        file.write(0, [b"x" * 10])
        with pytest.raises(OSError, match="ended before"):
            file.read_into(BLOCK, memoryview(bytearray(10)))


def test_padded_rounds_up_to_whole_blocks():
    assert [direct_io.padded(n) for n in (0, 1, BLOCK, BLOCK + 1)] == [0, BLOCK, BLOCK, 2 * BLOCK]
