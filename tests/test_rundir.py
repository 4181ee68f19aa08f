"""The run directory writer and reader (without any framework), and how ``parity run``
replaces an earlier run."""

from __future__ import annotations

import errno
import json
import os
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

from parity import direct_io, rundir
from parity.rundir import RunReader, RunWriter
from tests.conftest import skip_without_o_direct


def _write(path, arrays, monkeypatch, shard_bytes=rundir.SHARD_BYTES):
    monkeypatch.setattr(rundir, "SHARD_BYTES", shard_bytes)
    with RunWriter(path, "torch") as writer:
        for name, array in arrays:
            writer.add(name, "forward", array)
        written = [writer.array(record) for record in writer.records]
        writer.finish({})
    return RunReader.open(path), written


def test_a_tensor_with_the_bytes_of_an_earlier_one_is_stored_once(tmp_path, monkeypatch):
    block = np.arange(1000, dtype=np.float32)
    arrays = [("layer1.0.relu", block), ("other", block + 1), ("layer1.0", block.copy()),
              ("zero", np.zeros(4, np.float32)), ("negative zero", np.zeros(4, np.float32) * -1),
              ("empty", np.zeros((0, 3), np.float32))]
    # a 2 KB shard size: the first tensor is already on disk when its duplicate arrives
    run, written = _write(tmp_path / "run", arrays, monkeypatch, shard_bytes=2048)
    by_name = {r.name: r for r in run.records}
    assert (by_name["layer1.0"].shard, by_name["layer1.0"].key) == \
        (by_name["layer1.0.relu"].shard, by_name["layer1.0.relu"].key)
    # -0.0 and 0.0 compare equal but are different bytes: stored apart
    assert by_name["zero"].key != by_name["negative zero"].key
    assert np.signbit(run.tensor(by_name["negative zero"])).all()
    for (name, array), readback in zip(arrays, written):
        np.testing.assert_array_equal(run.tensor(by_name[name]), array)
        np.testing.assert_array_equal(readback, array)
    stored = sum(len(load_file(str(path))) for path in (tmp_path / "run").glob("*.safetensors"))
    assert stored == 5


def test_a_shard_buffer_is_reused_only_once_its_shard_is_written(tmp_path, monkeypatch):
    """Copies go into shard buffers that are reused: slow writes keep as many shards in
    flight as allowed, so a buffer reused too early would change bytes still being written."""
    write = RunWriter._write_chunks

    def slow_write(handle, chunks):
        time.sleep(0.02)
        return write(handle, chunks)

    monkeypatch.setattr(RunWriter, "_write_chunks", staticmethod(slow_write))
    rng = np.random.default_rng(0)
    # 200 float32 are 800 bytes, more than a 512-byte shard buffer: copied on their own
    arrays = [(f"t{index}", rng.standard_normal(size, dtype=np.float32))
              for index, size in enumerate([10, 70, 3, 64, 200, 1, 33] * 6)]
    run, written = _write(tmp_path / "run", arrays, monkeypatch, shard_bytes=512)
    assert len(run.manifest["shards"]) > rundir.SHARDS_IN_FLIGHT + 1
    for record, (_, array), readback in zip(run.records, arrays, written):
        np.testing.assert_array_equal(run.tensor(record), array)
        np.testing.assert_array_equal(readback, array)


def test_the_writer_keeps_its_own_copy(tmp_path, monkeypatch):
    buffer = np.ones(10, np.float32)
    with RunWriter(tmp_path / "run", "torch") as writer:
        writer.add("bn", "forward", buffer)
        buffer[:] = 0                       # what an in-place ReLU does a moment later
        writer.finish({})
    run = RunReader.open(tmp_path / "run")
    np.testing.assert_array_equal(run.tensor(run.records[0]), np.ones(10, np.float32))


def test_annotations_reach_the_manifest(tmp_path):
    with RunWriter(tmp_path / "run", "torch") as writer:
        record = writer.add("conv1", "forward", np.ones(3, np.float32))
        writer.annotate(record, fp32_noise_rms=1e-7, exact_rms=1.0, fp32_spread_rms=3e-7)
        writer.finish({})
    (saved,) = RunReader.open(tmp_path / "run").records
    assert (saved.fp32_noise_rms, saved.exact_rms, saved.fp32_spread_rms) == (1e-7, 1.0, 3e-7)


def test_a_checksum_collision_is_not_taken_for_equal_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(rundir, "crc32", lambda data: 0)     # every tensor collides
    arrays = [("a", np.zeros(3, np.float32)), ("b", np.ones(3, np.float32))]
    run, _ = _write(tmp_path / "run", arrays, monkeypatch)
    a, b = run.records
    assert a.key != b.key
    np.testing.assert_array_equal(run.tensor(b), np.ones(3, np.float32))


def test_hidden_directories_are_found_by_name_whatever_it_holds(tmp_path, ended_pid):
    """The partial and replaced directories of a run called ``run[1]`` are its own (a glob read
    ``[1]`` as a pattern and found none: gigabytes left behind); those of ``run1`` and of a run
    called ``run[1].old-7`` are not."""
    out = tmp_path / "run[1]"
    mine = [f".run[1].partial-{ended_pid}", ".run[1].old-12"]
    others = [f".run1.partial-{ended_pid}", ".run1.old-12", ".run[1].old-7.old-12"]
    for name in mine + others:
        (tmp_path / name).mkdir()
    rundir.remove_abandoned_partials(out)
    rundir.remove_replaced(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(others)


def test_a_rerun_deletes_the_mindspore_run_it_replaced_once_compared(tmp_path, monkeypatch):
    """``parity run`` twice into one --out: the MindSpore run the second capture replaced is
    still aside while the compare runs (deleting its gigabytes slowed the compare), and gone
    once the run is over."""
    from parity import api
    from parity.config import StepConfig
    from tests.conftest import REPO
    monkeypatch.chdir(REPO)                 # the capture processes import tests.tiny
    out, aside_during_compare = tmp_path / "run", []
    compare = api.compare_runs

    def recording(torch_dir, ms_dir, **options):
        aside_during_compare.append([p.name.rpartition("-")[0] for p in out.glob(".*")])
        return compare(torch_dir, ms_dir, **options)

    monkeypatch.setattr(api, "compare_runs", recording)
    factories = {"torch_factory": "tests.tiny:torch_tiny",
                 "mindspore_factory": "tests.tiny:ms_tiny"}
    config = StepConfig(image_size=16, **factories)
    for _ in range(2):
        assert api.run(config, out, api.CaptureOptions(**factories)).passed
    assert aside_during_compare == [[], [".mindspore.old"]]
    assert sorted(p.name for p in out.iterdir()) == ["mindspore", api.RUN_INDEX, "torch"]
    assert json.loads((out / api.RUN_INDEX).read_text())["finished"] is True


def test_a_capture_removes_the_partial_directories_killed_captures_left(
        tmp_path, monkeypatch, ended_pid, running_pid):
    """A capture killed by SIGKILL (out of memory) leaves its partial directory, gigabytes; the
    next capture into the same --out removes it, and keeps one whose capture still runs."""
    for pid in (ended_pid, running_pid):
        (tmp_path / f".run.partial-{pid}").mkdir()
        (tmp_path / f".run.partial-{pid}" / "tensors-00000.safetensors").write_bytes(b"x")
    _write(tmp_path / "run", [("a", np.ones(3, np.float32))], monkeypatch)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".run.partial-{running_pid}", "run"]


@pytest.mark.parametrize("slow_below, shard_bytes, dropped", [
    (float("inf"), 16384, True),                # every page-cache write is slow
    (0.0, 16384, False),                        # none is
    (float("inf"), rundir.SHARD_BYTES, False),  # one small last shard says nothing of speed
])
def test_shards_go_past_a_slow_page_cache_and_read_back_the_same(tmp_path, monkeypatch,
                                                                 slow_below, shard_bytes,
                                                                 dropped):
    """Where the page cache is slow (this VM: 0.11-0.23 GB/s), each shard is put to disk and
    dropped from it, and a reader reads the shards it finds so marked and drops them again."""
    monkeypatch.setattr(rundir, "SLOW_PAGE_CACHE_BYTES_PER_S", slow_below)
    monkeypatch.setattr(rundir, "CACHED_AT_LEAST", 0)
    advised = []
    advise = os.posix_fadvise
    monkeypatch.setattr(os, "posix_fadvise", lambda descriptor, offset, length, advice: (
        advised.append(advice), advise(descriptor, offset, length, advice)))
    rng = np.random.default_rng(0)
    arrays = [(f"layer{i}", rng.standard_normal(3000, dtype=np.float32)) for i in range(8)]
    run, written = _write(tmp_path / "run", arrays, monkeypatch, shard_bytes=shard_bytes)
    assert (run.page_cache_dropped, run.manifest["resources"]["page_cache_dropped"]) == \
        (dropped, dropped)
    drops_writing = advised.count(os.POSIX_FADV_DONTNEED)     # each shard, and each read back
    assert drops_writing >= len(run.manifest["shards"]) if dropped else drops_writing == 0
    read = [run.tensor(record) for record in run.records]
    assert advised.count(os.POSIX_FADV_DONTNEED) - drops_writing == \
        (len(arrays) if dropped else 0)
    for (_, array), again, back in zip(arrays, written, read):
        assert np.array_equal(again, array) and np.array_equal(back, array)
        assert not back.flags.writeable


@pytest.mark.parametrize("sizes", [[3], [8192], [8193], [5000, 1, 12000, 4096], [20000]])
def test_a_file_written_with_o_direct_holds_its_bytes_and_no_padding(tmp_path, sizes):
    """Through a staging buffer of two blocks: chunks within one, across several, ending on a
    block or one byte past it."""
    import mmap
    skip_without_o_direct(tmp_path)
    rng = np.random.default_rng(0)
    chunks = [rng.integers(0, 256, size, dtype=np.uint8) for size in sizes]
    size = rundir.write_direct(tmp_path / "f", chunks, mmap.mmap(-1, 2 * direct_io.BLOCK))
    assert size == sum(sizes) and (tmp_path / "f").read_bytes() == b"".join(map(bytes, chunks))


@pytest.mark.parametrize("refused", [False, True])
def test_shards_past_a_slow_page_cache_are_written_with_o_direct_or_as_before(
        tmp_path, monkeypatch, refused):
    """Once a shard was slow to write into the cache, the next ones go straight to the disk;
    where the file system refuses O_DIRECT, through the cache and dropped, as before."""
    if not refused:
        skip_without_o_direct(tmp_path)
    monkeypatch.setattr(rundir, "SLOW_PAGE_CACHE_BYTES_PER_S", float("inf"))
    monkeypatch.setattr(rundir, "CACHED_AT_LEAST", 0)
    calls = []

    def write_direct(path, chunks, staging):
        calls.append(path.name)
        if refused:
            raise OSError(errno.EINVAL, "Invalid argument", str(path))
        return direct(path, chunks, staging)
    direct = rundir.write_direct
    monkeypatch.setattr(rundir, "write_direct", write_direct)
    monkeypatch.setattr(direct_io, "O_DIRECT", direct_io.O_DIRECT or os.O_SYNC)   # any platform
    rng = np.random.default_rng(0)
    arrays = [(f"layer{i}", rng.standard_normal(3000, dtype=np.float32)) for i in range(8)]
    run, _ = _write(tmp_path / "run", arrays, monkeypatch, shard_bytes=16384)
    shards = [shard["file"] for shard in run.manifest["shards"]]
    assert calls == (shards[1:2] if refused else shards[1:]) and len(shards) > 2
    assert all(shard.get("page_cache_dropped") for shard in run.manifest["shards"])
    for record, (_, array) in zip(run.records, arrays):
        assert np.array_equal(run.tensor(record), array)


def test_a_small_capture_stays_in_the_page_cache_however_slow(tmp_path, monkeypatch):
    """Dropping saved no time at batch 2, 64² and made the compare read from disk: the first
    CACHED_AT_LEAST bytes stay cached, and only the shards after them are read past the cache."""
    monkeypatch.setattr(rundir, "SLOW_PAGE_CACHE_BYTES_PER_S", float("inf"))
    monkeypatch.setattr(rundir, "CACHED_AT_LEAST", 40000)
    rng = np.random.default_rng(0)
    arrays = [(f"layer{i}", rng.standard_normal(3000, dtype=np.float32)) for i in range(8)]
    run, written = _write(tmp_path / "run", arrays, monkeypatch, shard_bytes=16384)
    dropped = [shard.get("page_cache_dropped", False) for shard in run.manifest["shards"]]
    assert dropped == [False] * 3 + [True] * (len(dropped) - 3) and len(dropped) > 3
    assert run.page_cache_dropped
    for record, (_, array) in zip(run.records, arrays):
        assert np.array_equal(run.tensor(record), array)


def test_shards_dropped_on_linux_are_read_where_the_cache_cannot_be_dropped(tmp_path,
                                                                          monkeypatch):
    """A run written on Linux and reported elsewhere (compare needs neither framework)."""
    monkeypatch.setattr(rundir, "SLOW_PAGE_CACHE_BYTES_PER_S", float("inf"))
    monkeypatch.setattr(rundir, "CACHED_AT_LEAST", 0)
    rng = np.random.default_rng(0)
    arrays = [(f"layer{i}", rng.standard_normal(3000, dtype=np.float32)) for i in range(4)]
    run, _ = _write(tmp_path / "run", arrays, monkeypatch, shard_bytes=16384)
    assert run.page_cache_dropped
    monkeypatch.setattr(rundir, "CAN_DROP_CACHE", False)
    monkeypatch.delattr(os, "posix_fadvise")
    for record, (_, array) in zip(RunReader.open(tmp_path / "run").records, arrays):
        assert np.array_equal(run.tensor(record), array)
