"""Broken and hostile inputs: one line naming the problem, exit 2, nothing overwritten."""

from __future__ import annotations

import errno
import importlib
import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Tuple

import numpy as np
import pytest

from parity.errors import ParityInputError, UserCodeFailed
from tests.conftest import (REPO, TINY, TINY_PAIR, assert_one_line_error, parity_cli,
                            read_json, rewrite_json, signals_at_their_defaults)


def _copy(run: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(run, target)
    return target


def _shard(run: Path) -> Path:
    return sorted(run.glob("tensors-*.safetensors"))[0]


def _first_record(of_dtype: str, **fields):
    """Damage: the manifest's first record of dtype ``of_dtype`` gets ``fields``."""
    return lambda manifest: next(r for r in manifest["records"]
                                 if r["dtype"] == of_dtype).update(fields)


def test_truncated_shard(tiny_run, tmp_path):
    ms_run = _copy(tiny_run / "mindspore", tmp_path)
    shard = _shard(ms_run)
    shard.write_bytes(shard.read_bytes()[:-100])
    process = parity_cli("compare", tiny_run / "torch", ms_run)
    assert_one_line_error(process, "truncated", shard.name)


def test_truncated_initial_weights(tiny_run, tmp_path):
    torch_run = _copy(tiny_run / "torch", tmp_path)
    weights = torch_run / "initial_weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    process = parity_cli("compare", torch_run, tiny_run / "mindspore")
    assert_one_line_error(process, "initial_weights.safetensors")


def test_corrupted_shard_bytes(tiny_run, tmp_path):
    ms_run = _copy(tiny_run / "mindspore", tmp_path)
    shard = _shard(ms_run)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    process = parity_cli("compare", tiny_run / "torch", ms_run)
    assert_one_line_error(process, "corrupted", shard.name)


def test_garbage_manifest(tiny_run, tmp_path):
    ms_run = _copy(tiny_run / "mindspore", tmp_path)
    (ms_run / "manifest.json").write_text('{"format": "parity-run", "records": [')
    assert_one_line_error(parity_cli("compare", tiny_run / "torch", ms_run),
                          "manifest.json is not readable JSON", "capture again")


def test_a_manifest_record_missing_a_field_names_it(tiny_run, tmp_path):
    ms_run = _copy(tiny_run / "mindspore", tmp_path)
    rewrite_json(ms_run / "manifest.json", lambda manifest: manifest["records"][0].pop("kind"))
    process = parity_cli("compare", tiny_run / "torch", ms_run)
    assert_one_line_error(process, "manifest.json is corrupt (no 'kind' field); capture again")


def test_missing_manifest_means_incomplete(tiny_run, tmp_path):
    ms_run = _copy(tiny_run / "mindspore", tmp_path)
    (ms_run / "manifest.json").unlink()
    assert_one_line_error(parity_cli("compare", tiny_run / "torch", ms_run), "no manifest.json")


def test_manifest_from_another_format_version(tiny_run, tmp_path):
    ms_run = _copy(tiny_run / "mindspore", tmp_path)
    rewrite_json(ms_run / "manifest.json", lambda manifest: manifest.update(format_version=99))
    assert_one_line_error(parity_cli("compare", tiny_run / "torch", ms_run), "format 99")


def test_a_manifest_record_of_an_unknown_dtype_is_named(tiny_run, tmp_path):
    ms_run = _copy(tiny_run / "mindspore", tmp_path)
    rewrite_json(ms_run / "manifest.json", _first_record("int64", dtype="datetime64[s]"))
    process = parity_cli("compare", tiny_run / "torch", ms_run)
    assert_one_line_error(process, "manifest.json is corrupt", "datetime64[s]")


@pytest.mark.parametrize("of_dtype, fields, message", [
    ("float32", {"kind": "weird"}, "kind 'weird' is none of"),
    ("float32", {"name": 5}, "name 5 is not a name"),
    ("float32", {"shape": [-1, 3]}, "shape has -1"),
    ("int64", {"dtype": "complex64"}, "'complex64', which parity does not store"),
    ("int64", {"dtype": "object"}, "'object', which parity does not store"),
    # the same bytes read as another dtype, or in another shape: only the shard's header knows
    ("float32", {"dtype": "int32"}, "as float32 [2, 3, 16, 16], its manifest says int32"),
    ("float32", {"shape": [2, 3, 256]}, "as float32 [2, 3, 16, 16], its manifest says "
                                        "float32 [2, 3, 256]"),
])
def test_a_damaged_manifest_record_is_refused_not_read(tiny_run, tmp_path, of_dtype, fields,
                                                        message):
    from parity.compare.engine import compare_runs
    ms_run = _copy(tiny_run / "mindspore", tmp_path)
    rewrite_json(ms_run / "manifest.json", _first_record(of_dtype, **fields))
    with pytest.raises(ParityInputError, match=re.escape(message)):
        compare_runs(tiny_run / "torch", ms_run)


@pytest.mark.parametrize("damage, message", [
    (lambda m: m["config"].update(lr="x"), "lr must be a finite number >= 0, got 'x'"),
    (lambda m: m["config"].update(nesterov="no"), "nesterov must be true or false"),
    (lambda m: m["config"].update(optimizer="rmsprop"),
     "optimizer must be one of sgd, adam, adamw, got 'rmsprop'"),
    (lambda m: m.update(param_map=None), "param_map is NoneType, not dict"),
    (lambda m: m["param_map"].update({"fc.weight": 5}), "param_map is not names to names"),
    (lambda m: m.update(self_checks={"observer_effect": 3}), "observer_effect is not a table"),
    (lambda m: m["shards"][0].update(file="/etc/passwd"), "shard '/etc/passwd' is not a file"),
    (lambda m: m["shards"][0].update(bytes="5"), "has '5' bytes"),
])
def test_a_damaged_manifest_field_is_refused_when_opened(tiny_run, tmp_path, damage, message):
    from parity.rundir import RunReader
    ms_run = _copy(tiny_run / "mindspore", tmp_path)
    rewrite_json(ms_run / "manifest.json", damage)
    with pytest.raises(ParityInputError, match=re.escape(message)):
        RunReader.open(ms_run)


def test_run_directory_from_a_different_model(tiny_run, resnet50_run):
    process = parity_cli("compare", tiny_run / "torch", resnet50_run / "run" / "mindspore")
    assert_one_line_error(process, "different model")


def test_a_whole_run_given_for_one_capture_is_pointed_to_its_halves(tiny_run):
    process = parity_cli("compare", tiny_run, tiny_run / "mindspore")
    assert_one_line_error(process, "holds a whole parity run", str(tiny_run / "torch"))


def test_one_capture_given_for_a_whole_run_is_pointed_to_the_run(tiny_run, tmp_path):
    """It read "neither a JSON report nor a run directory holding torch/ and mindspore/"."""
    process = parity_cli("report", tiny_run / "mindspore", "--json", tmp_path / "r.json")
    assert_one_line_error(process, f"{tiny_run / 'mindspore'} is one capture, not a whole run: "
                                   f"'parity report {tiny_run}' reports the run holding it")
    lone = shutil.copytree(tiny_run / "torch", tmp_path / "lone")
    process = parity_cli("report", lone, "--json", tmp_path / "r.json")
    assert_one_line_error(process, "'parity compare TORCH_CAPTURE MINDSPORE_CAPTURE' compares "
                                   "it with the other side's")
    assert not (tmp_path / "r.json").exists()


def test_report_of_a_path_that_is_not_there_says_so(tmp_path):
    """It read "neither a JSON report nor a run directory holding torch/ and mindspore/"."""
    process = parity_cli("report", tmp_path / "no-such-run", "--json", tmp_path / "r.json")
    assert_one_line_error(process, f"{tmp_path / 'no-such-run'} does not exist: pass a run "
                                   "directory")
    assert not (tmp_path / "r.json").exists()


def test_report_of_one_capture_with_a_damaged_manifest_names_the_damage(tiny_run, tmp_path):
    """It read "neither a JSON report nor a run directory": a lone capture whose manifest is
    damaged is told as such, as compare tells it."""
    lone = shutil.copytree(tiny_run / "torch", tmp_path / "lone")
    (lone / "manifest.json").write_text("{\"format\": ")
    process = parity_cli("report", lone, "--json", tmp_path / "r.json")
    assert_one_line_error(process, f"{lone / 'manifest.json'} is not readable JSON")
    assert not (tmp_path / "r.json").exists()


def test_two_captures_of_the_same_framework(tiny_run):
    process = parity_cli("compare", tiny_run / "torch", tiny_run / "torch")
    assert_one_line_error(process, "both")


def test_nan_in_the_batch_is_the_first_divergence_not_a_crash(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    x[1, 2, 3, 4] = np.nan
    np.savez(tmp_path / "batch.npz", x=x, y=np.array([1, 2]))
    process = parity_cli("run", *TINY_PAIR, "--input", tmp_path / "batch.npz", "--out",
                         tmp_path / "run", "--json", tmp_path / "r.json", "--quiet")
    assert process.returncode == 1, process.stderr
    report = read_json(tmp_path / "r.json")
    assert report["first_divergence"]["name"] == "input"
    assert report["diagnosis"]["cause"] == "non-finite values"
    first = next(r for r in report["records"] if r["name"] == "input")
    assert first["nan_torch"] == first["nan_mindspore"] == 1


def test_batch_file_without_labels(tmp_path):
    np.savez(tmp_path / "batch.npz", x=np.zeros((2, 3, 8, 8), np.float32))
    process = parity_cli("run", *TINY_PAIR, "--input", tmp_path / "batch.npz", "--out",
                         tmp_path / "run")
    assert_one_line_error(process, "lacks array(s) y")


@pytest.mark.parametrize("arrays, message", [
    ({"mask": np.ones((2, 4))}, "holds array(s) mask parity does not read: a model's inputs are "
                                "x, x1, x2..."),
    ({"x2": np.ones((2, 4))}, "inputs x, x2 skip a number"),
    ({"x1": np.ones((3, 4))}, "x (2, 4), x1 (3, 4) and y (2,) must share the batch size"),
])
def test_batch_file_with_inputs_parity_cannot_place(tmp_path, arrays, message):
    from parity.capture.batch import load_batch
    np.savez(tmp_path / "batch.npz", x=np.zeros((2, 4), np.int64), y=np.array([1, 2]),
             **arrays)
    with pytest.raises(ParityInputError, match=re.escape(message)):
        load_batch(tmp_path / "batch.npz")


def test_a_batch_file_without_samples_is_refused(tmp_path):
    """torch steps on an empty batch: a NaN loss and NaN gradients, reported as a divergence."""
    from parity.capture.batch import load_batch
    np.savez(tmp_path / "batch.npz", x=np.zeros((0, 3, 8, 8), np.float32),
             y=np.zeros(0, np.int64))
    with pytest.raises(ParityInputError, match=re.escape(
            "holds no samples (x (0, 3, 8, 8), y (0,)): a training step needs at least one")):
        load_batch(tmp_path / "batch.npz")


@pytest.mark.parametrize("damage", ["truncated", "one byte flipped", "empty"])
def test_a_damaged_batch_file_is_named_not_a_crash(tmp_path, damage):
    from parity.capture.batch import load_batch
    path = tmp_path / "batch.npz"
    np.savez(path, x=np.ones((2, 3, 8, 8), np.float32), y=np.zeros(2, np.int64))
    data = bytearray(path.read_bytes())
    if damage == "truncated":
        data = data[:len(data) // 2]
    elif damage == "one byte flipped":
        data[len(data) // 4] ^= 0xFF          # inside x.npy's stored bytes
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    with pytest.raises(ParityInputError, match="batch.npz is not a readable .npz file"):
        load_batch(path)


@pytest.mark.parametrize("name, content, told", [
    ("batch.npy", None, "batch.npy holds one array (float32 (2, 3, 8, 8)), not the arrays of an "
                        ".npz: write the inputs and labels with numpy.savez"),
    ("batch.npz", b"x,y\n0.5,1\n", "batch.npz is not a readable .npz file (neither .npz nor "
                                    ".npy); write it with numpy.savez"),
])
def test_a_batch_file_that_is_no_npz_is_told_how_to_write_one(tmp_path, name, content, told):
    """An .npy failed "unexpected TypeError: 'numpy.ndarray' object does not support the
    context manager protocol"; a text file was called one holding pickled data."""
    path = tmp_path / name
    if content is None:
        np.save(path, np.ones((2, 3, 8, 8), np.float32))
    else:
        path.write_bytes(content)
    process = parity_cli("run", *TINY_PAIR, "--input", path, "--out", tmp_path / "run")
    assert_one_line_error(process, told)
    assert not (tmp_path / "run").exists()


def test_batch_of_booleans(tmp_path):
    np.savez(tmp_path / "batch.npz", x=np.zeros((2, 3, 8, 8), bool), y=np.array([1, 2]))
    process = parity_cli("run", *TINY_PAIR, "--input", tmp_path / "batch.npz", "--out",
                         tmp_path / "run")
    assert_one_line_error(process, "the input batch holds bool: pass floats")


def test_output_directory_that_is_not_a_parity_run(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("precious")
    process = parity_cli("run", *TINY, "--out", tmp_path / "mine")
    assert_one_line_error(process, "not a parity run directory")
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "precious"


def test_output_path_that_is_a_user_file(tmp_path):
    (tmp_path / "results").write_text("precious")
    process = parity_cli("run", *TINY, "--out", tmp_path / "results")
    assert_one_line_error(process, "not a parity run directory")
    assert (tmp_path / "results").read_text() == "precious"


@pytest.mark.parametrize("report, message", [
    ("thesis.html", "already exists; parity never overwrites"),
    ("no-such-folder/r.json", "no-such-folder does not exist"),
    ("a-folder.json", "a-folder.json is a folder: name the file to write"),
    # a named pipe (or /dev/stdout): reading it to see whether parity wrote it blocked forever
    ("pipe.json", "pipe.json is not a regular file (a device, a pipe)"),
])
def test_a_report_path_that_cannot_be_written_is_refused_before_the_captures(tmp_path, report,
                                                                             message):
    (tmp_path / "thesis.html").write_text("precious")
    (tmp_path / "a-folder.json").mkdir()
    os.mkfifo(tmp_path / "pipe.json")
    option = "--html" if report.endswith(".html") else "--json"
    process = parity_cli("run", *TINY, option, tmp_path / report, "--out", tmp_path / "run",
                         timeout=120)
    assert_one_line_error(process, message)
    assert (tmp_path / "thesis.html").read_text() == "precious"
    assert not (tmp_path / "run").exists()          # refused before any capture ran


@pytest.mark.parametrize("option, value, message", [
    ("--lr", "-1", "must be a finite number >= 0"),
    ("--momentum", "nan", "must be a finite number >= 0"),
    ("--weight-decay", "abc", "must be a finite number >= 0"),
    ("--weight-decay", "inf", "must be a finite number >= 0"),   # MindSpore refused it late
    ("--batch-size", "two", "must be a positive integer"),
    ("--label-smoothing", "1.5", "must be between 0 and 1"),
    ("--ms-loss-scale", "0", "must be a finite number > 0"),
    ("--ms-loss-scale", "inf", "must be a finite number > 0"),
    ("--seed", "-1", "must be an integer between 0 and 2**32 - 1"),
    ("--seed", str(2**32), "must be an integer between 0 and 2**32 - 1"),
    ("--betas", "0.9 1", "must be at least 0 and below 1"),    # torch refuses β = 1
    ("--eps", "-0.1", "must be a finite number >= 0"),
    ("--optimizer", "rmsprop", "invalid choice: 'rmsprop' (choose from 'sgd', 'adam', 'adamw')"),
])
def test_step_settings_out_of_range(option, value, message):
    assert_one_line_error(parity_cli("run", option, *value.split()),
                          f"argument {option}: {message}")


@pytest.mark.parametrize("settings, message", [
    (["--betas", "0.8", "0.99"], "--betas sets Adam's and AdamW's step, and the optimizer is sgd: "
                                 "pass --optimizer adam or adamw, or leave it out"),
    (["--optimizer", "adam", "--momentum", "0.5", "--nesterov"],
     "--momentum, --nesterov set SGD's step, and the optimizer is adam: pass --optimizer sgd, "
     "or leave them out"),
    (["--ms-adam", "nn.Adam"], "nn.Adam steps MindSpore's side of Adam or AdamW; the optimizer "
                               "is sgd: choose adam or adamw"),
])
def test_another_optimizers_settings_are_refused_not_ignored(tmp_path, settings, message):
    process = parity_cli("run", *TINY, *settings, "--out", tmp_path / "run")
    assert_one_line_error(process, message)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("settings", [["--momentum", "0"], ["--dampening", "0.5"]])
def test_nesterov_without_momentum_is_refused_before_the_captures(tmp_path, settings):
    """It read as the torch model failing on the synthetic batch, after building it."""
    process = parity_cli("run", *TINY, "--nesterov", *settings, "--out", tmp_path / "run")
    assert_one_line_error(process, "Nesterov momentum needs momentum > 0 and dampening 0")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("number, said", [
    (errno.EROFS, "Read-only file system; write to another folder"),
    (errno.EACCES, "Permission denied; check its permissions, or use another path"),
    (errno.EDQUOT, "Disk quota exceeded; free some space or write elsewhere"),
])
def test_a_file_the_system_refuses_is_named_in_one_line(tiny_run, tmp_path, monkeypatch,
                                                        capsys, number, said):
    """A read-only folder (a mounted dataset), a permission, a quota: the file and what to do,
    not "unexpected OSError". Simulated: as root, this machine's tests cannot be refused."""
    from parity import cli
    from parity.result import CheckResult
    report = tmp_path / "report.json"

    def refused(result, path):
        raise OSError(number, os.strerror(number), str(report))

    monkeypatch.setattr(CheckResult, "to_json", refused)
    code = cli._main(["compare", str(tiny_run / "torch"), str(tiny_run / "mindspore"),
                      "--json", str(report), "--quiet"], debug=False)
    assert (code, capsys.readouterr().err) == (2, f"parity: error: {report}: {said}\n")


@pytest.mark.parametrize("read_only, said", [
    (True, "folder {folder} is on a read-only file system; write to another folder"),
    (False, "folder {folder} is not writable; check its permissions, or write to another folder"),
])
def test_a_report_into_a_folder_it_cannot_write_is_refused_before_the_captures(
        tmp_path, monkeypatch, capsys, read_only, said):
    """A run wrote its captures, then failed on --json. Simulated: as root, this machine's
    tests are refused only by a read-only mount."""
    from parity import cli
    folder = tmp_path / "mounted"
    folder.mkdir()
    access, statvfs = os.access, os.statvfs

    def denied(path, mode, **kwargs):
        return Path(path) != folder and access(path, mode, **kwargs)

    def flags(path):
        real = statvfs(path)
        return os.statvfs_result((*real[:8], real.f_flag | os.ST_RDONLY if read_only
                                  else real.f_flag & ~os.ST_RDONLY, real.f_namemax))

    monkeypatch.setattr(os, "access", denied)
    monkeypatch.setattr(os, "statvfs", flags)
    code = cli._main(["run", *TINY, "--json", str(folder / "r.json"),
                      "--out", str(tmp_path / "run")], debug=False)
    assert (code, capsys.readouterr().err) == (
        2, f"parity: error: cannot write {folder / 'r.json'}: {said.format(folder=folder)}\n")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["mounted"]


@pytest.mark.parametrize("about, told", [
    ("{tmp}", "{path}: Read-only file system"),
    ("{tmp}/tensors-00000.safetensors", "{path}: Read-only file system"),
    (None, "{path}: Read-only file system"),                # a failed write names no file
    ("{tmp}-other", "{tmp}-other: Read-only file system"),  # not parity's: as it was
])
def test_a_file_system_error_names_the_users_path_not_the_hidden_one(tmp_path, about, told):
    from parity.errors import file_system_refusal, told_as
    path, tmp = tmp_path / "out", tmp_path / ".out.partial-7"
    with pytest.raises(OSError) as raised, told_as(path, tmp):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS),
                      *([about.format(tmp=tmp)] if about else []))
    assert file_system_refusal(raised.value) == \
        f"{told.format(path=path, tmp=tmp)}; write to another folder"


def test_a_full_disk_names_the_users_path_not_the_hidden_one(tmp_path):
    from parity.errors import told_as
    with pytest.raises(ParityInputError, match=re.escape(
            f"no space left on the device while writing {tmp_path / 'r.json'}; free some")):
        with told_as(tmp_path / "r.json", tmp_path / ".r.tmp-7.json"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("command, message", [
    (["report", "{report}", "--html", "{report}"],
     "--html {report} is the report this command reads: write to another file"),
    (["report", "{report}", "--html", "{report}", "--json", "{copy}"],   # a copy: still read
     "--html {report} is the report this command reads"),
    (["baseline", "save", "{report}", "--out", "{report}"],
     "--out {report} is the report this command reads: write the baseline to another file"),
    (["report", "{run}", "--json", "{copy}", "--csv", "{copy}"],
     "--json and --csv both name {copy}: give each report a file of its own"),
])
def test_a_report_is_not_written_over_the_report_it_reads(tiny_run, tmp_path, command,
                                                           message):
    """Parity replaces its own files: `parity report r.json --html r.json` replaced the
    report with its rendering, `baseline save r.json --out r.json` with the baseline."""
    report = Path(shutil.copy(tiny_run.parent / "report.json", tmp_path / "report.json"))
    names = dict(report=report, copy=tmp_path / "copy.json", run=tiny_run)
    before = report.read_bytes()
    process = parity_cli(*(part.format(**names) for part in command))
    assert_one_line_error(process, message.format(**names))
    assert report.read_bytes() == before
    assert not (tmp_path / "copy.json").exists()


def test_report_path_holding_a_user_file(tiny_run, tmp_path):
    (tmp_path / "notes.json").write_text("my notes")
    process = parity_cli("compare", tiny_run / "torch", tiny_run / "mindspore",
                         "--json", tmp_path / "notes.json")
    assert_one_line_error(process, "already exists")
    assert (tmp_path / "notes.json").read_text() == "my notes"


@pytest.mark.parametrize("text", [
    "# notes on our parity-report runs\n",                     # the marker, in the user's words
    'name,kind,shape\n1,2,3\n',
    '{"format": "parity-report/other"}',
], ids=["mentions-the-marker", "a-csv", "json-of-another-format"])
def test_a_user_file_that_looks_a_little_like_parity_s_is_kept(tiny_run, tmp_path, text):
    """A file was parity's to replace when its first 4 KB held "parity-report" anywhere."""
    (tmp_path / "notes.md").write_text(text)
    process = parity_cli("report", tiny_run, "--json", tmp_path / "notes.md")
    assert_one_line_error(process, "already exists; parity never overwrites")
    assert (tmp_path / "notes.md").read_text() == text


@pytest.mark.parametrize("kept, command, written", [
    ("baseline", ["report", "{run}", "--json", "{path}"], "JSON report"),
    ("JSON report", ["report", "{run}", "--html", "{path}"], "HTML report"),
    ("JSON report", ["report", "{run}", "--csv", "{path}"], "CSV report"),
    ("JSON report", ["baseline", "save", "{run}", "--out", "{path}"], "baseline"),
], ids=["report-over-baseline", "html-over-json", "csv-over-json", "baseline-over-json"])
def test_a_file_parity_wrote_is_replaced_only_by_one_of_its_kind(tiny_run, tmp_path, kept,
                                                                 command, written):
    """A baseline (the golden errors, kept under version control) was replaced by a report, and
    a JSON report by its HTML rendering: all files parity "owned"."""
    path = _written_by_parity(kept, tiny_run, tmp_path)
    before = path.read_bytes()
    process = parity_cli(*(part.format(run=tiny_run, path=path) for part in command))
    assert_one_line_error(process, f"{path} is a parity {kept}; writing the {written} there "
                                   "would lose it: choose another path")
    assert path.read_bytes() == before


def test_each_file_parity_wrote_is_replaced_by_a_new_one_of_its_kind(tiny_run, tmp_path):
    from parity.io import written_by_parity
    files = {"JSON report": tmp_path / "r.json", "CSV report": tmp_path / "r.csv",
             "HTML report": tmp_path / "r.html", "baseline": tmp_path / "golden.json"}
    for _ in range(2):
        process = parity_cli("report", tiny_run, "--json", files["JSON report"], "--csv",
                             files["CSV report"], "--html", files["HTML report"], "--quiet")
        assert process.returncode == 0, process.stderr
        process = parity_cli("baseline", "save", tiny_run, "--out", files["baseline"])
        assert process.returncode == 0, process.stderr
    assert {kind: written_by_parity(path) for kind, path in files.items()} == {
        kind: kind for kind in files}


def test_a_report_through_a_symbolic_link_replaces_what_it_names(tiny_run, tmp_path):
    """The link was replaced by a file of its own: the user's link gone, its target stale."""
    (tmp_path / "reports").mkdir()
    shutil.copy(tiny_run.parent / "report.json", tmp_path / "reports" / "latest.json")
    (tmp_path / "latest.json").symlink_to(tmp_path / "reports" / "latest.json")
    process = parity_cli("compare", tiny_run / "torch", tiny_run / "mindspore", "--html",
                         tmp_path / "latest.json.html", "--json", tmp_path / "latest.json")
    assert process.returncode == 0, process.stderr
    assert (tmp_path / "latest.json").is_symlink()
    assert read_json(tmp_path / "reports" / "latest.json")["meta"]["command"].startswith(
        "parity compare")
    assert sorted(p.name for p in (tmp_path / "reports").iterdir()) == ["latest.json"]


def test_a_capture_through_a_symbolic_link_replaces_what_it_names(tmp_path):
    """The link was renamed aside and left there (rmtree refuses a link), a capture of its own
    put in its place: the user's link gone, its target stale."""
    from parity.capture.torch_capture import capture_torch
    from parity.config import StepConfig
    capture = partial(capture_torch, StepConfig(batch_size=2, image_size=16, num_classes=10),
                      factory="tests.tiny:torch_tiny")
    capture(tmp_path / "captures" / "torch")
    first = (tmp_path / "captures" / "torch" / "manifest.json").stat().st_mtime_ns
    (tmp_path / "latest").symlink_to(tmp_path / "captures" / "torch")
    capture(tmp_path / "latest")
    assert (tmp_path / "latest").is_symlink()
    assert (tmp_path / "captures" / "torch" / "manifest.json").stat().st_mtime_ns != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["captures", "latest"]
    assert sorted(p.name for p in (tmp_path / "captures").iterdir()) == ["torch"]


def _damaged_report(tiny_run: Path, tmp_path: Path, damage) -> Path:
    return rewrite_json(Path(shutil.copy(tiny_run.parent / "report.json", tmp_path)), damage)


def test_a_damaged_json_report_is_named_not_rendered(tiny_run, tmp_path):
    report = _damaged_report(tiny_run, tmp_path, lambda r: r["records"][0].update(max_abs="x"))
    process = parity_cli("report", report, "--html", tmp_path / "report.html")
    assert_one_line_error(process, "not a readable parity JSON report", "max_abs is 'x'")
    assert not (tmp_path / "report.html").exists()


@pytest.mark.parametrize("damage, message", [
    (lambda r: r.update(format_version=2), "written in JSON report format 2; this parity "
                                           "reads format 1"),
    (lambda r: r.pop("records"), "(no 'records' field)"),
    (lambda r: r["records"][0].update(passed=1), "passed is 1, not bool"),
    (lambda r: r["records"][0].update(shape="x"), "shape is 'x', not Tuple[int, ...]"),
    (lambda r: r["records"][0].update(kind="odd"), "has kind 'odd'"),
    (lambda r: r["meta"].update(config=None), "config is None, not Dict"),
    (lambda r: r["meta"].update(notes=[5]), "notes is (5,), not Tuple[str, ...]"),
    # a string of names was read as its characters, one unmatched record each
    (lambda r: r.update(unmatched={"torch": "fc.bias"}), "unmatched is {'torch': 'fc.bias'}, "
                                                         "not Dict[str, Tuple[str, ...]]"),
    (lambda r: r.update(details={"fc · grad": {"histogram_counts": [1], "histogram_edges": [0.0],
                                               "worst": [[[0], 1.0, "x", 0.0]]}}),
     "RecordDetail field worst is [[[0], 1.0, 'x', 0.0]]"),
    (lambda r: r.update(details={"fc · grad": {"histogram_counts": [1], "histogram_edges": [0.0],
                                               "worst": [[0, 1.0, 1.0, 0.0]]}}),
     "RecordDetail field worst is [[0, 1.0, 1.0, 0.0]]"),
])
def test_a_damaged_json_report_is_refused_when_read(tiny_run, tmp_path, damage, message):
    from parity.result import CheckResult
    with pytest.raises(ParityInputError, match=re.escape(message)):
        CheckResult.from_json(_damaged_report(tiny_run, tmp_path, damage))


def _written_by_parity(kind: str, tiny_run: Path, tmp_path: Path) -> Path:
    """A copy of the JSON file of ``kind`` that parity wrote for the tiny run."""
    from parity import baseline
    from parity.result import CheckResult
    if kind == "run manifest":
        return _copy(tiny_run / "mindspore", tmp_path) / "manifest.json"
    report = Path(shutil.copy(tiny_run.parent / "report.json", tmp_path))
    if kind == "JSON report":
        return report
    return baseline.save(CheckResult.from_json(report), tmp_path / "golden.json")


def _read_back(kind: str, path: Path) -> None:
    from parity import baseline
    from parity.result import CheckResult
    from parity.rundir import RunReader
    {"run manifest": lambda: RunReader.open(path.parent), "baseline": lambda: baseline.load(path),
     "JSON report": lambda: CheckResult.from_json(path)}[kind]()


@pytest.mark.parametrize("kind, redo", [
    ("run manifest", "capture again"),
    ("baseline", "save it again ('parity baseline save RUN --out FILE')"),
    ("JSON report", "report its run directory again ('parity report RUN_DIR --json PATH')"),
], ids=["manifest", "baseline", "report"])
@pytest.mark.parametrize("damage, problem", [
    (lambda text: text[:len(text) // 2], "is not readable JSON ("),
    (lambda text: "[1, 2]", 'is not a parity {kind} (it has no "format": '),
    (lambda text: json.dumps({**json.loads(text), "format": "other"}),
     'is not a parity {kind} (it has no "format": '),
    (lambda text: json.dumps({**json.loads(text), "format_version": 99}),
     "was written in {kind} format 99; this parity reads format "),
], ids=["cut-short", "a-list", "another-format", "another-version"])
def test_a_damaged_json_file_parity_wrote_is_named_with_what_to_do(tiny_run, tmp_path, kind,
                                                                   redo, damage, problem):
    path = _written_by_parity(kind, tiny_run, tmp_path)
    _read_back(kind, path)                                  # undamaged, it reads
    path.write_text(damage(path.read_text()))
    with pytest.raises(ParityInputError) as refused:
        _read_back(kind, path)
    message = str(refused.value)
    assert message.startswith(f"{path} {problem.format(kind=kind)}"), message
    assert message.endswith(redo), message


def test_a_json_file_the_system_refuses_to_read_is_told_so(tmp_path, monkeypatch):
    from parity.io import read_parity_json
    path = tmp_path / "golden.json"
    path.write_text("{}")

    def refuse(self, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(self))
    monkeypatch.setattr(Path, "read_text", refuse)
    with pytest.raises(ParityInputError, match=re.escape(
            f"{path}: Permission denied; check its permissions, or use another path")):
        read_parity_json(path, what="baseline", marker="parity-report/baseline", version=1,
                         redo="save it again")


def test_a_truncated_json_report_is_one_line_saying_what_to_do(tiny_run, tmp_path):
    report = _written_by_parity("JSON report", tiny_run, tmp_path)
    report.write_bytes(report.read_bytes()[:1000])
    process = parity_cli("report", report, "--html", tmp_path / "report.html")
    assert_one_line_error(process, f"{report} is not readable JSON", "cut short or changed",
                          "'parity report RUN_DIR --json PATH'")
    assert not (tmp_path / "report.html").exists()


def test_a_reference_given_to_the_torch_capture_is_refused(tmp_path):
    process = parity_cli("capture", "--framework", "torch", *TINY, "--reference", tmp_path,
                         "--out", tmp_path / "torch")
    assert_one_line_error(process, "--reference is the MindSpore capture's")
    assert not (tmp_path / "torch").exists()


def test_a_mindspore_capture_into_its_own_reference_is_refused(tiny_run, tmp_path):
    """It replaced the torch capture it started from, and said "wrote"."""
    run = _copy(tiny_run, tmp_path)
    process = parity_cli("capture", "--framework", "mindspore", *TINY_PAIR, "--reference",
                         run / "torch", "--out", run / "torch")
    assert_one_line_error(process, f"--out {run / 'torch'} is the --reference capture, which "
                                   "this one would replace: write the MindSpore capture beside "
                                   f"it (say {run / 'mindspore'})")
    assert read_json(run / "torch" / "manifest.json")["framework"] == "torch"


def test_batch_options_with_a_batch_file_are_refused_not_ignored(tmp_path):
    np.savez(tmp_path / "batch.npz", x=np.zeros((2, 3, 16, 16), np.float32), y=np.array([1, 2]))
    process = parity_cli("run", *TINY_PAIR, "--input", tmp_path / "batch.npz", "--batch-size", "4",
                         "--out", tmp_path / "run")
    assert_one_line_error(process, "--batch-size shapes parity's synthetic batch; with --input "
                                   "the batch is your file's: leave it out")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("option, value, recorded", [("--image-size", "32", "16"),
                                                     ("--seed", "3", "0"),
                                                     ("--num-classes", "7", "10")])
def test_a_mindspore_capture_starting_elsewhere_than_its_reference_is_refused(
        tiny_run, tmp_path, option, value, recorded):
    """The seed and class count were ignored: the manifest recorded a seed that drew neither
    the weights nor the batch."""
    process = parity_cli("capture", "--framework", "mindspore", *TINY_PAIR, option, value,
                         "--reference", tiny_run / "torch", "--out", tmp_path / "ms")
    assert_one_line_error(process, f"{option} {value} (the torch capture's: {recorded}): the "
                                   "MindSpore capture takes its weights and batch from "
                                   "--reference; leave it out")
    assert not (tmp_path / "ms").exists()


def test_a_mindspore_capture_takes_seed_and_class_count_from_its_reference(tmp_path):
    """It built the built-in model with its own 1000 classes and was refused ("Weights of a
    10-class model? Pass --num-classes 10") though its reference records 10; and it recorded
    seed 0 for weights and a batch seed 3 drew."""
    torch_run = tmp_path / "torch"
    process = parity_cli("capture", "--framework", "torch", "--model", "resnet18",
                         "--num-classes", "10", "--seed", "3", "--image-size", "16",
                         "--no-fp64-reference", "--out", torch_run)
    assert process.returncode == 0, process.stdout + process.stderr
    process = parity_cli("capture", "--framework", "mindspore", "--model", "resnet18",
                         "--reference", torch_run, "--out", tmp_path / "ms")
    assert process.returncode == 0, process.stdout + process.stderr
    config = read_json(tmp_path / "ms" / "manifest.json")["config"]
    assert (config["num_classes"], config["seed"]) == (10, 3)


def test_a_mindspore_capture_called_from_python_records_its_references_seed(tmp_path):
    """Called with its reference and a config of its own (seed 0), it recorded seed 0 for the
    weights and batch that the reference's seed 3 had drawn."""
    from parity.capture.mindspore_capture import capture_mindspore
    from parity.capture.torch_capture import capture_torch
    from parity.config import StepConfig

    torch_run = capture_torch(StepConfig(seed=3, batch_size=2, image_size=16), tmp_path / "t",
                              factory="tests.tiny:torch_tiny", fp64_reference=False)
    ms_run = capture_mindspore(StepConfig(batch_size=2, image_size=16), tmp_path / "ms",
                               factory="tests.tiny:ms_tiny", reference=torch_run)
    manifest = read_json(ms_run / "manifest.json")
    assert (manifest["seed"], manifest["config"]["seed"]) == (3, 3)


@pytest.mark.parametrize("torch_model", ["torch.nn:Identity", "tests.tiny:torch_tiny_frozen"])
def test_a_model_with_nothing_to_train_is_refused(tmp_path, torch_model):
    process = parity_cli("run", "--torch-model", torch_model, "--ms-model", "tests.tiny:ms_tiny",
                         "--image-size", "16", "--out", tmp_path / "run")
    assert_one_line_error(process, "the torch model has no trainable parameter")
    assert not (tmp_path / "run").exists()


def test_a_torch_model_built_in_another_precision_is_told_to_be_float32(tmp_path):
    """It failed on the float32 batch, "expected scalar type Float but found Double", with a
    hint that the model may take other inputs (--input)."""
    process = parity_cli("run", "--torch-model", "tests.tiny:torch_tiny_float64", "--ms-model",
                         "tests.tiny:ms_tiny", "--image-size", "16", "--out", tmp_path / "run")
    assert_one_line_error(process, "the torch model's parameters are not all float32 (8 float64; "
                                   "the first: 0.weight)", "(model.float())")
    assert not (tmp_path / "run").exists()


def test_a_torch_compiled_model_is_told_to_be_passed_before_torch_compile(tmp_path):
    """A ResNet18 so compiled stepped in float32 for 90 s, compiling, then failed "unexpected"
    in float64 with an AssertionError from dynamo."""
    process = parity_cli("run", "--torch-model", "tests.tiny:torch_tiny_compiled", "--ms-model",
                         "tests.tiny:ms_tiny", "--image-size", "16", "--out", tmp_path / "run")
    assert_one_line_error(process, "the torch model is torch.compile'd: parity hooks each layer",
                          "return the module before torch.compile")
    assert not (tmp_path / "run").exists()


def test_a_torch_compiled_part_of_a_model_is_named():
    import torch

    from parity.capture.torch_capture import _refuse_compiled
    from tests.tiny import torch_tiny
    model = torch.nn.Sequential(torch_tiny(), torch.nn.ReLU())
    _refuse_compiled(model)
    model[0] = torch.compile(model[0])
    with pytest.raises(ParityInputError, match="the torch model's 0 is torch.compile'd"):
        _refuse_compiled(model)


def test_unknown_option():
    assert_one_line_error(parity_cli("run", "--batchsize", "2"),
                          "unrecognized arguments: --batchsize 2 (see 'parity run --help')")
    assert_one_line_error(parity_cli("baseline", "check", "r", "b.json", "--baseline", "b.json"),
                          "(see 'parity baseline check --help')")


def test_unknown_model():
    assert_one_line_error(parity_cli("run", "--model", "vgg16"), "unknown model 'vgg16'")


def test_unimportable_factory(tmp_path):
    process = parity_cli("run", "--torch-model", "nosuch.module:f", "--ms-model",
                         "tests.tiny:ms_tiny", "--out", tmp_path / "run")
    assert_one_line_error(process, "cannot import 'nosuch.module'")


@pytest.mark.parametrize("option, factory", [
    ("--ms-loss", "unreduced_cross_entropy"), ("--torch-loss", "torch_unreduced_cross_entropy")])
def test_a_loss_that_is_not_one_number(tmp_path, option, factory):
    process = parity_cli("run", *TINY, option, f"tests.losses:{factory}", "--out", tmp_path / "r")
    assert_one_line_error(process, f"loss tests.losses:{factory} returned (2,), not one number")
    assert not (tmp_path / "r" / "mindspore").exists()


def test_bad_tolerance_file(tiny_run, tmp_path):
    (tmp_path / "tol.toml").write_text("[forward]\nrtoll = 1e-3\n")
    process = parity_cli("compare", tiny_run / "torch", tiny_run / "mindspore",
                         "--tolerance", tmp_path / "tol.toml")
    assert_one_line_error(process, "unknown key(s) rtoll")


def test_no_space_left_leaves_no_run_directory(tmp_path, monkeypatch):
    """ENOSPC while a shard is written: a clean error and no half-written directory."""
    import errno

    from parity import rundir
    from parity.capture.torch_capture import capture_torch
    from parity.config import StepConfig

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rundir.os, "fsync", full_disk)
    with pytest.raises(ParityInputError, match="no space left"):
        capture_torch(StepConfig(batch_size=2, image_size=16), tmp_path / "run",
                      factory="tests.tiny:torch_tiny")
    assert list(tmp_path.iterdir()) == []


def _capture_caught_in_its_forward(tmp_path: Path, stdout: int) -> subprocess.Popen:
    """``parity capture`` into ``tmp_path / "run"`` once its model is in the step (it announces
    its forward, then waits: a signal timed from outside alone can land after a fast capture
    has finished); its stderr a pipe."""
    marker = tmp_path / "forward-started"
    process = subprocess.Popen(
        [sys.executable, "-m", "parity", "capture", "--framework", "torch",
         "--out", str(tmp_path / "run"), "--torch-model", "tests.tiny:torch_waits_in_training",
         "--ms-model", "tests.tiny:ms_tiny", "--image-size", "16"],
        cwd=REPO, stdout=stdout, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PARITY_TEST_FORWARD_MARKER": str(marker)},
        preexec_fn=signals_at_their_defaults)
    deadline = time.time() + 120
    while time.time() < deadline and not marker.exists() and process.poll() is None:
        time.sleep(0.05)
    assert marker.exists(), process.communicate()[1]
    return process


@pytest.mark.parametrize("number, code, said", [
    (signal.SIGINT, 130, "interrupted"),
    (signal.SIGTERM, 143, "terminated (SIGTERM)"),      # by default it left the partial directory
    (signal.SIGHUP, 129, "hung up (SIGHUP)")])          # so did a terminal closing
def test_an_interrupt_during_capture_leaves_nothing(tmp_path, number, code, said):
    """SIGINT while the step runs; SIGTERM (a cancelled CI job, ``timeout``) and SIGHUP (a
    terminal closing) clean up as well."""
    process = _capture_caught_in_its_forward(tmp_path, stdout=subprocess.PIPE)
    assert list(tmp_path.glob(".run.partial-*")), "the step ran before the run directory began"
    process.send_signal(number)
    _, stderr = process.communicate(timeout=120)
    assert (process.returncode, stderr.strip().splitlines()) == \
        (code, [f"parity: {said}; no partial output was left behind"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["forward-started"]


def test_an_interrupt_with_no_one_left_to_read_its_line_still_exits_by_it(tmp_path):
    """A capture whose parity run was killed, or whose terminal closed, cleans up and writes
    its last line where no one reads any more: the write failed (BrokenPipeError) and it
    exited 1 with a traceback nobody saw, not 143."""
    process = _capture_caught_in_its_forward(tmp_path, stdout=subprocess.DEVNULL)
    process.stderr.close()                  # the pipe's reader is gone
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) == 143
    assert sorted(p.name for p in tmp_path.iterdir()) == ["forward-started"]


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _run_caught_in_its_forward(tmp_path: Path, torch_model: str,
                               ms_model: str = "tests.tiny:ms_tiny",
                               ) -> Tuple[subprocess.Popen, int]:
    """``parity run`` (its own process group, SIGINT at its default as from a terminal) once
    the capture of its waiting model is in the step; with that capture's process id."""
    marker = tmp_path / "forward-started"
    process = subprocess.Popen(
        [sys.executable, "-m", "parity", "run", "--torch-model", torch_model,
         "--ms-model", ms_model, "--image-size", "16", "--out", str(tmp_path / "run")],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PARITY_TEST_FORWARD_MARKER": str(marker),
             "PARITY_TEST_MS_FORWARD_MARKER": str(marker)}, start_new_session=True,
        preexec_fn=signals_at_their_defaults)
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None and \
            not (marker.exists() and marker.read_text()):
        time.sleep(0.05)
    assert marker.exists(), process.communicate()[1]
    return process, int(marker.read_text())


@pytest.mark.parametrize("signalled, number, code, said", [
    ("its process group", signal.SIGINT, 130, "interrupted"),
    ("parity alone", signal.SIGINT, 130, "interrupted"),
    ("parity alone", signal.SIGTERM, 143, "terminated (SIGTERM)"),
    ("parity alone", signal.SIGHUP, 129, "hung up (SIGHUP)")])
def test_ctrl_c_during_a_runs_capture_waits_for_its_clean_up(tmp_path, signalled, number, code,
                                                             said):
    """A terminal's Ctrl-C reaches ``parity run``'s process group, ``kill -INT`` parity alone;
    either way the capture is interrupted and parity waits while it cleans up. Here the capture
    takes a second to stop, as a long kernel makes it: ``subprocess.run`` killed it after
    0.25 s, leaving its partial directory and so the run directory. SIGTERM is told apart."""
    marker = tmp_path / "forward-started"
    process, capture = _run_caught_in_its_forward(
        tmp_path, "tests.tiny:torch_waits_in_training_slow_to_stop")
    if signalled == "parity alone":
        process.send_signal(number)
    else:
        os.killpg(process.pid, number)
    _, stderr = process.communicate(timeout=120)
    assert (process.returncode, stderr.strip().splitlines()) == \
        (code, [f"parity: {said}; no partial output was left behind"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["forward-started"]
    assert marker.read_text() == "interrupted", "the capture was not let finish its second"
    assert not _alive(capture)


def test_a_second_ctrl_c_stops_the_capture_at_once(tmp_path):
    """While parity waits for an interrupted capture to clean up, a second Ctrl-C kills it;
    parity removes what it had written."""
    marker = tmp_path / "forward-started"
    process, capture = _run_caught_in_its_forward(
        tmp_path, "tests.tiny:torch_waits_in_training_slow_to_stop")
    process.send_signal(signal.SIGINT)
    time.sleep(0.3)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert (process.returncode, stderr.strip().splitlines()) == \
        (130, ["parity: interrupted; no partial output was left behind"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["forward-started"]
    assert marker.read_text() == str(capture), "the capture finished its second"
    assert not _alive(capture)


def test_ctrl_c_during_a_runs_mindspore_capture_names_the_torch_capture_kept(tmp_path):
    process, capture = _run_caught_in_its_forward(tmp_path, "tests.tiny:torch_tiny",
                                                  "tests.tiny:ms_waits_in_training")
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    torch_run = tmp_path / "run" / "torch"
    assert (process.returncode, stderr.strip().splitlines()) == (130, [
        f"parity: interrupted; the torch capture is kept in {torch_run} ('parity capture "
        f"--framework mindspore --reference {torch_run}' reruns MindSpore alone, with this run's "
        "options); no partial output was left behind"])
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["parity-run.json", "torch"]
    assert (torch_run / "manifest.json").exists()
    assert not _alive(capture)


@pytest.mark.parametrize("stage, kept", [
    ("mindspore capture", "the torch capture is kept in {run}/torch ('parity capture "
                          "--framework mindspore --reference {run}/torch' reruns MindSpore alone"),
    ("compare", "both captures are kept in {run} ('parity compare {run}/torch {run}/mindspore' "
                "compares them)")])
def test_a_run_interrupted_says_what_it_keeps(tmp_path, monkeypatch, stage, kept):
    from parity import api
    from parity.config import StepConfig
    from parity.errors import Interrupted

    def capture(framework, config, out, *args, **kwargs):
        if (stage, framework) == ("mindspore capture", "mindspore"):
            raise KeyboardInterrupt
        out.mkdir()

    def compare(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "capture_in_subprocess", capture)
    monkeypatch.setattr(api, "compare_runs", compare)
    monkeypatch.setattr(api, "worth_a_helper", lambda stored_bytes: False)
    run = tmp_path / "run"
    with pytest.raises(Interrupted) as interrupt:
        api.run(StepConfig(), run, api.CaptureOptions("tests.tiny:torch_tiny",
                                                      "tests.tiny:ms_tiny"))
    assert interrupt.value.kept.startswith(kept.format(run=run))
    # the index says whether both captures beside it are this run's
    assert read_json(run / api.RUN_INDEX)["finished"] is (stage == "compare")


@pytest.mark.parametrize("finished", [False, True])
def test_a_report_of_a_run_that_did_not_finish_says_so(tiny_run, tmp_path, finished):
    """A run killed during its torch capture leaves its index beside an earlier run's
    captures, which report as a whole pair."""
    run = _copy(tiny_run, tmp_path)
    rewrite_json(run / "parity-run.json", lambda index: index.update(finished=finished))
    process = parity_cli("report", run, "--json", tmp_path / "report.json", "--quiet")
    assert process.returncode == 0, process.stderr
    notes = read_json(tmp_path / "report.json")["meta"]["notes"]
    said = (f"the last parity run into {run} did not finish (stopped or killed): the captures "
            "here may be an earlier run's")
    assert (said in notes) is not finished


def test_an_interrupt_a_library_swallowed_still_ends_the_command_by_it(tiny_run, monkeypatch,
                                                                       capsys):
    """A KeyboardInterrupt raised where Python cannot raise it (a weakref callback, a __del__)
    was printed with its traceback ("Exception ignored in ..."), and the command went on to
    exit 0 after a Ctrl-C."""
    from parity import cli

    class Dropped:
        def __del__(self):
            cli._Interrupts._handle(signal.SIGINT, None)

    def swallowing(args):
        Dropped()
        return cli.EXIT_PASS

    code = _compare_running(swallowing, tiny_run, monkeypatch)
    assert (code, capsys.readouterr().err) == (130, (
        "parity: interrupted; the command had finished: its outputs are whole; no partial "
        "output was left behind\n"))


def _compare_running(command, tiny_run, monkeypatch) -> int:
    """``parity compare``'s exit code with ``command`` run as its work, in this process, with
    parity's interrupt handling installed (and undone after the test)."""
    from parity import cli
    monkeypatch.setattr(cli._Interrupts, "received", None)
    monkeypatch.setattr(cli._Interrupts, "ends_at_once", True)     # restored: _main clears it
    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)    # Python's, not pytest's
    monkeypatch.setattr(signal, "signal", lambda *args: None)          # this process's stay
    cli._Interrupts.install()
    monkeypatch.setitem(cli.COMMANDS, "compare", command)
    return cli._main(["compare", str(tiny_run / "torch"), str(tiny_run / "mindspore")],
                     debug=False)


def test_a_finaliser_failing_after_an_interrupt_is_not_printed(tiny_run, monkeypatch, capsys):
    """Ctrl-C cut a pyparsing ``Forward``'s constructor short (matplotlib builds its parsers
    while the HTML report is drawn): the half-built object failed in its __del__ as the
    interrupt unwound, and Python printed "Exception ignored in: <function Forward.__del__"
    with a traceback beside parity's one line (a fresh-clone CI run, 1 s into a compare)."""
    from parity import cli

    class HalfBuilt:
        def __init__(self):
            cli._Interrupts._handle(signal.SIGINT, None)
            self.expr = None

        def __del__(self):
            self.expr

    def interrupted_in_a_constructor(args):
        HalfBuilt()
        return cli.EXIT_PASS

    code = _compare_running(interrupted_in_a_constructor, tiny_run, monkeypatch)
    assert (code, capsys.readouterr().err) == (
        130, "parity: interrupted; no partial output was left behind\n")


def test_a_capture_ends_with_the_parity_run_that_started_it(tmp_path):
    """``parity run`` killed (it cannot clean up): its capture, in a session of its own that
    no terminal signal reaches, is interrupted, removes its partial directory and ends. The
    kernel sends it SIGTERM once for each of parity's threads as they die: the repeats cut a
    clean-up that takes a while short, leaving the partial directory (3 runs in 4 of ResNet50
    at batch 2, 64²)."""
    marker = tmp_path / "forward-started"
    process, capture = _run_caught_in_its_forward(
        tmp_path, "tests.tiny:torch_waits_in_training_slow_to_stop")
    process.kill()
    process.communicate()
    deadline = time.time() + 60
    while time.time() < deadline and _alive(capture):
        time.sleep(0.05)
    assert not _alive(capture)
    assert marker.read_text() == "interrupted", "the capture was not let finish its second"
    assert list((tmp_path / "run").iterdir()) == [tmp_path / "run" / "parity-run.json"]


def test_a_capture_killed_mid_step_leaves_no_partial_directory(tmp_path):
    """A capture the kernel kills (out of memory: SIGKILL) cannot clean up after itself: its
    gigabytes stayed in a hidden partial directory. ``parity run`` removes them."""
    process = parity_cli("run", "--torch-model", "tests.tiny:torch_killed_in_training",
                         "--ms-model", "tests.tiny:ms_tiny", "--image-size", "16",
                         "--out", tmp_path / "run")
    assert_one_line_error(process, "the torch capture was killed (SIGKILL)")
    assert list(tmp_path.iterdir()) == []


# Ctrl-C landing while parity.cli loads, turned into an ImportError as numpy's import does;
# {start} is how the command starts
CTRL_C_IN_AN_IMPORT = """
import builtins, os, runpy, signal, sys, time
real_import = builtins.__import__
def importing(name, *args, **kwargs):
    if name == "parity.cli":
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        except KeyboardInterrupt:
            raise ImportError("do not import numpy from its source directory")
    return real_import(name, *args, **kwargs)
builtins.__import__ = importing
sys.argv = ["parity", "--version"]
{start}
"""
# The `parity` script pip generated from pyproject.toml's [project.scripts], and python -m parity
STARTS = {"console script": f"runpy.run_path({str(Path(sys.executable).parent / 'parity')!r}, "
                            "run_name='__main__')",
          "python -m parity": "runpy.run_module('parity', run_name='__main__')"}


@pytest.mark.parametrize("start", STARTS.values(), ids=STARTS.keys())
def test_ctrl_c_that_an_import_turns_into_another_error_still_exits_130(start):
    """A fresh-clone CI run's Ctrl-C 0.1 s into `parity compare` landed in numpy's import,
    which made it an ImportError: a traceback and exit code 1."""
    process = subprocess.run([sys.executable, "-c", CTRL_C_IN_AN_IMPORT.format(start=start)],
                             cwd=REPO, capture_output=True, text=True, timeout=120,
                             preexec_fn=signals_at_their_defaults)
    assert (process.returncode, process.stderr.strip().splitlines()) == \
        (130, ["parity: interrupted; no partial output was left behind"]), process.stderr


def test_the_command_takes_over_ctrl_c_from_the_loading_handler():
    """The handler that ends at once while parity loads is replaced by the command's own, which
    cleans up (a capture's partial directory) — with no moment between the two unhandled."""
    from parity.cli import _Interrupts
    from parity.launch import interrupted_while_loading

    before = {number: signal.getsignal(number) for number in _Interrupts.SIGNALS}
    hook = sys.unraisablehook
    signal.signal(signal.SIGINT, interrupted_while_loading)
    try:
        _Interrupts.install()
        assert signal.getsignal(signal.SIGINT) == _Interrupts._handle
    finally:            # this process's handlers as they were
        for number, handler in before.items():
            signal.signal(number, handler)
        sys.unraisablehook = hook


def test_ctrl_c_while_compare_loads_exits_130_wherever_it_lands(tiny_run, tmp_path):
    """Interrupted while importing, it exited by the signal (-2) after saying "interrupted"
    (a Ctrl-C inside dataclasses' exec() sets CPython's unhandled-interrupt flag), or 2 with
    numpy's "do not import numpy from its source directory" (its import turns the interrupt
    into an ImportError), or printed a traceback from the import machinery; one a weakref
    callback swallowed printed Python's "Exception ignored" traceback and exited 0. Each lands
    in a window of milliseconds: many moments are tried."""
    reports = {"--json": tmp_path / "report.json", "--html": tmp_path / "report.html"}
    signalled = 0
    for delay in np.arange(0.1, 1.6, 0.05):
        process = subprocess.Popen(
            [sys.executable, "-m", "parity", "compare", str(tiny_run / "torch"),
             str(tiny_run / "mindspore"), *map(str, sum(reports.items(), ())), "--quiet"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=signals_at_their_defaults)
        time.sleep(delay)
        if process.poll() is not None:                  # done before the signal
            break
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
        if process.returncode != 0:         # 0: the signal came as the process ended
            signalled += 1
            # or a library swallowed it (a weakref callback) and the command went on to finish
            assert (process.returncode, stderr.strip().splitlines()) in (
                (130, ["parity: interrupted; no partial output was left behind"]),
                (130, ["parity: interrupted; the command had finished: its outputs are whole; "
                       "no partial output was left behind"])), delay
        for path in reports.values():       # each written whole before the signal, or not
            if path.exists():
                assert path.read_text().rstrip().endswith(("}", "</html>")), path
                path.unlink()
    assert signalled >= 10


def test_failing_user_model_code_is_one_line(tmp_path):
    process = parity_cli("run", "--torch-model", "tests.tiny:torch_tiny", "--ms-model",
                         "tests.ports:broken_factory", "--image-size", "16",
                         "--out", tmp_path / "run")
    assert_one_line_error(process, "mindspore capture: tests.ports:broken_factory() failed "
                          "building the MindSpore model: TypeError", "'depth'",
                          "call it alone to fix it (rerun with --debug for the traceback); the "
                          f"torch capture is kept in {tmp_path / 'run' / 'torch'}")
    assert (tmp_path / "run" / "torch" / "manifest.json").exists()


ALLOCATION_FAILED = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
                     "allocate memory: you tried to allocate 204799999997952 bytes")


@pytest.mark.parametrize("error, said", [
    (RuntimeError(ALLOCATION_FAILED + "\nframe #0: c10::alloc_cpu"),
     "nets:make() ran out of memory building the torch model: RuntimeError: [enforce fail "
     "at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
     "allocate 204799999997952 bytes; the model itself does not fit: check the sizes it is "
     "built with"),
    (ValueError("depth must be 18, 34 or 50"),
     "nets:make() failed building the torch model: ValueError: depth must be 18, 34 or 50; "
     "call it alone to fix it")])
def test_a_factory_that_fails_is_named_as_the_failure(tmp_path, monkeypatch, error, said):
    """A model too large for memory (``--num-classes 99999999999``: a 200 TB classifier) or a bug
    in the factory was "unexpected RuntimeError", as if parity had failed."""
    from parity.models_loader import build_torch_model
    (tmp_path / "nets.py").write_text("ERROR = None\n\n\ndef make():\n    raise ERROR\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "nets", raising=False)
    monkeypatch.setattr(importlib.import_module("nets"), "ERROR", error)
    with pytest.raises(ParityInputError) as refused:
        build_torch_model("nets:make")
    assert str(refused.value) == said
    assert refused.value.__cause__ is error          # --debug shows the factory's traceback
    # the command line adds how to see that traceback to the user's code failing, not to memory
    assert isinstance(refused.value, UserCodeFailed) == (type(error) is ValueError)


def test_a_module_or_factory_calling_sys_exit_is_named_not_obeyed(tmp_path, monkeypatch):
    """A module that parses its command line on import (parity's, here) or a factory that
    exits ended the capture with the user's own exit code and last line."""
    from parity.models_loader import build_torch_model
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("parses", "exits"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    (tmp_path / "parses.py").write_text("import sys\nsys.exit(2)\n")
    (tmp_path / "exits.py").write_text("import sys\n\n\ndef make():\n    sys.exit('no GPU')\n")
    with pytest.raises(ParityInputError, match=r"^importing parses for 'parses:make' called "
                       r"sys.exit\(2\): code at its top level runs on import"):
        build_torch_model("parses:make")
    with pytest.raises(ParityInputError, match=r"^exits:make\(\) failed building the torch model: "
                       "SystemExit: no GPU;"):
        build_torch_model("exits:make")


def test_a_loss_factory_that_fails_is_named(tmp_path, monkeypatch):
    from parity.models_loader import build_loss
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "losses_here", raising=False)
    (tmp_path / "losses_here.py").write_text("def make():\n    return 1 / 0\n")
    with pytest.raises(ParityInputError, match=r"^losses_here:make\(\) failed building the loss: "
                       "ZeroDivisionError: division by zero;"):
        build_loss("losses_here:make")


def test_an_unexpected_error_is_one_line(monkeypatch, capsys):
    """A framework's message can run to a C++ stack: its first line is said, --debug shows it."""
    from parity import cli

    def failing(args):
        raise RuntimeError("Sync stream failed\n\n- C++ Call Stack:\nmindspore/ccsrc/x.cc:12")

    monkeypatch.setitem(cli.COMMANDS, "compare", failing)
    assert cli._main(["compare", "a", "b"], debug=False) == 2
    assert capsys.readouterr().err == ("parity: error: unexpected RuntimeError: Sync stream failed "
                                       "(rerun with --debug for the traceback)\n")


def test_a_capture_killed_by_the_kernel_is_told_so(tmp_path):
    """The kernel's out-of-memory killer ends a process with SIGKILL: no error of its own."""
    process = parity_cli("run", *TINY_PAIR[:2], "--ms-model", "tests.ports:killed_factory",
                         "--out", tmp_path / "run")
    assert_one_line_error(process, "the mindspore capture was killed (SIGKILL), on Linux most "
                                   "often by the kernel when memory runs out",
                          f"the torch capture is kept in {tmp_path / 'run' / 'torch'}")
    assert not (tmp_path / "run" / "mindspore").exists()


@pytest.mark.parametrize("ms_model", ["ms_tiny_compiled", "ms_tiny_mixed_precision_o1"])
def test_a_mindspore_model_whose_hooks_never_fire_is_refused(tmp_path, ms_model):
    """No forward hook fires in a construct compiled with @jit, nor in a network rewritten by
    amp.auto_mixed_precision O1: an empty capture would compare nothing, so it is refused.
    (O1's rewrite writes its source under ./rewritten_network: run where that can go.)"""
    process = parity_cli("run", "--torch-model", "tests.tiny:torch_tiny", "--ms-model",
                         f"tests.tiny:{ms_model}", "--image-size", "16", "--out", tmp_path / "run",
                         cwd=tmp_path)
    assert_one_line_error(process, "mindspore capture: no forward hook fired",
                          "auto_mixed_precision at level O1")
    assert not (tmp_path / "run" / "mindspore").exists()


@pytest.mark.parametrize("options, fed", [
    ((), "the first sample of parity's synthetic batch (1×3×64×64 float32 images, in eval mode"),
    (("--num-classes", "5"), "parity's synthetic batch (2×3×64×64 float32 images")])
def test_a_model_that_takes_other_inputs_is_pointed_to_input(tmp_path, options, fed):
    """A token-id model fed parity's synthetic image batch: the framework's error says what
    failed, the line says what to do. Without --num-classes the model first meets one sample
    alone (for its class count): the line said the whole batch's shape, the framework's
    message quoted the sample's."""
    process = parity_cli("run", "--torch-model", "tests.tiny:torch_tokens", "--ms-model",
                         "tests.tiny:ms_tokens", "--out", tmp_path / "run", *options)
    assert_one_line_error(process, f"failed on {fed}", "'indices'",
                          "needs them from --input FILE.npz", "(rerun with --debug for the "
                          "traceback)")
    assert not (tmp_path / "run").exists()


def test_a_batch_file_the_model_cannot_take_is_named_with_its_arrays(tmp_path):
    np.savez(tmp_path / "gray.npz", x=np.zeros((2, 1, 16, 16), np.float32),
             y=np.zeros(2, np.int64))
    process = parity_cli("run", *TINY_PAIR, "--input", tmp_path / "gray.npz", "--out",
                         tmp_path / "run")
    assert_one_line_error(process, "the torch model failed on your --input",
                          "(x (2, 1, 16, 16) float32; labels y (2,))", "RuntimeError",
                          "x, x1... the inputs in order")


def test_images_saved_as_integers_are_pointed_to_floats(tmp_path):
    """uint8 images straight from the files: passed as int64 token ids, the convolution
    failed with "expected scalar type Long but found Float"."""
    np.savez(tmp_path / "raw.npz", x=np.zeros((2, 3, 16, 16), np.uint8), y=np.zeros(2, np.int64))
    process = parity_cli("run", *TINY_PAIR, "--input", tmp_path / "raw.npz", "--out",
                         tmp_path / "run")
    assert_one_line_error(process, "(x (2, 3, 16, 16) int64; labels y (2,))", "RuntimeError",
                          "the labels. x holds integers, which parity passes as int64 (token "
                          "ids): images go in as floats, converted and normalised as in training")


def test_a_port_that_cannot_take_the_batch_torch_took_is_told_so(tmp_path):
    process = parity_cli("run", "--torch-model", "tests.tiny:torch_tiny", "--ms-model",
                         "tests.tiny:ms_tiny_channels_last", "--image-size", "16",
                         "--out", tmp_path / "run")
    assert_one_line_error(process, "the MindSpore model failed on the batch torch took (x (2, 3, "
                          "16, 16) float32", "The port takes what the torch model takes",
                          f"the torch capture is kept in {tmp_path / 'run' / 'torch'}")


@pytest.mark.parametrize("message, said", [
    ("The Tensor(shape=[1, 19], dtype=Float32, value=\n<uninitialized>) is uninitialized. Maybe "
     "the Tensor is create by initializer.\n\n-----\n- C++ Call Stack:\n-----\nfile.cc:973",
     "RuntimeError: The Tensor(shape=[1, 19], dtype=Float32, value= <uninitialized>) is "
     "uninitialized. Maybe the Tensor is create by initializer"),
    ("\n----\n- Kernel select failed:\n----\nUnsupported op [InstanceNorm] on CPU\nmore",
     "RuntimeError: Unsupported op [InstanceNorm] on CPU"),
    ("Error(s) in loading state_dict for Net:\n\tMissing key(s) in state_dict: \"fc.weight\"",
     "RuntimeError: Error(s) in loading state_dict for Net:"),
    ("a tensor (\n" + "1\n" * 40 + ") never closed", "RuntimeError: a tensor ( 1 1 1 1 1 1 1 1")])
def test_a_framework_message_is_told_in_one_line_its_sentence_whole(message, said):
    """mindcv's RexNet builds a tensor MindSpore leaves uninitialised; its message breaks its
    first sentence inside the tensor's repr, and the line said "The Tensor(shape=[1, 19],
    dtype=Float32, value=". A line leaving a bracket open goes on to the lines closing it (a
    few at most); a framed message is told from its first line that says something."""
    from parity.errors import in_one_line
    told = in_one_line(RuntimeError(message))
    assert told == said


@pytest.mark.parametrize("torch_model, ms_model, said", [
    ("torch_tiny", "ms_tiny_mint", "RuntimeError: The kernel Conv2DExt unregistered. "),
    pytest.param("torch_instance_normed", "ms_instance_normed",
                 "RuntimeError: Unsupported op [InstanceNorm] on CPU, Please confirm",
                 marks=pytest.mark.skipif(
                     importlib.metadata.version("mindspore").startswith("2.7."),
                     reason="MindSpore 2.7.0 cannot build nn.InstanceNorm2d (AttributeError: "
                            "mindspore.ops has no InstanceNorm): the port never reaches a "
                            "kernel"))])
def test_a_port_using_ops_without_a_kernel_here_is_told_so(tmp_path, torch_model, ms_model,
                                                           said):
    """A port written with mindspore.mint.nn (torch's names, momentum convention and step
    counter) has no CPU kernel for its Conv2d: it was told to take the inputs torch takes.
    MindSpore frames its message for nn.InstanceNorm2d: the line said only "RuntimeError:
    ------"."""
    process = parity_cli("run", "--torch-model", f"tests.tiny:{torch_model}", "--ms-model",
                         f"tests.tiny:{ms_model}", "--image-size", "16",
                         "--out", tmp_path / "run")
    assert_one_line_error(process, said, "This MindSpore has no kernel for that op on this "
                          "device: on CPU, mindspore.mint.nn's Conv2d, BatchNorm2d",
                          "write those layers with mindspore.nn for the check")
    assert "The port takes what" not in process.stderr


def test_a_batch_too_small_for_batch_norm_is_pointed_to_the_batch_options(tmp_path):
    """ResNet18's last BatchNorm sees one value per channel at batch 1, 32²: the line says to
    enlarge the batch, beside the --input hint."""
    process = parity_cli("run", "--model", "resnet18", "--batch-size", "1", "--image-size", "32",
                         "--out", tmp_path / "run")
    assert_one_line_error(process, "Expected more than 1 value per channel",
                          "a larger --batch-size or --image-size")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("options, message", [
    ((), "the torch model returns a tuple of 2 outputs, so the synthetic labels' class count "
         "cannot be read from it: pass --num-classes K"),
    (("--num-classes", "10"), "the torch model returns a tuple of 2 outputs; parity's default "
                              "loss (mean cross entropy) takes one logits tensor: pass "
                              "--torch-loss and --ms-loss"),
    (("--num-classes", "10", "--torch-loss", "tests.losses:torch_two_heads"),
     "the MindSpore model returns a tuple of 2 outputs; parity's default loss"),
])
def test_a_model_with_several_outputs_is_told_what_to_pass(tmp_path, options, message):
    process = parity_cli("run", "--torch-model", "tests.tiny:torch_two_heads", "--ms-model",
                         "tests.tiny:ms_two_heads", "--image-size", "16", *options,
                         "--out", tmp_path / "run")
    assert_one_line_error(process, message)


def test_a_model_returning_its_logits_in_a_dict_is_told_to_return_them(tmp_path):
    """Hugging Face models return an output object, a dict holding 'logits'."""
    process = parity_cli("run", "--torch-model", "tests.tiny:torch_output_object", "--ms-model",
                         "tests.tiny:ms_two_heads", "--image-size", "16", "--num-classes", "10",
                         "--out", tmp_path / "run")
    assert_one_line_error(process, "the torch model returns a dict ('logits') (as Hugging Face "
                          "models return: to train on its logits alone, wrap the model in a "
                          "module returning model(...).logits); parity's default loss")


def test_bad_map_file(tmp_path):
    (tmp_path / "map.toml").write_text("fc = 3\n")
    process = parity_cli("run", *TINY, "--map", tmp_path / "map.toml", "--out", tmp_path / "r")
    assert_one_line_error(process, "must map MindSpore names to PyTorch names")


def test_a_map_naming_no_cell_or_parameter_of_the_port_is_refused(tiny_run, tmp_path):
    """A misspelt entry (or one written torch = mindspore) pinned nothing, silently."""
    (tmp_path / "map.toml").write_text('"0" = "0"\n"fc.weight" = "8.weight"\n')
    process = parity_cli("capture", "--framework", "mindspore", *TINY, "--reference",
                         tiny_run / "torch", "--map", tmp_path / "map.toml",
                         "--out", tmp_path / "ms")
    assert_one_line_error(process, "--map: fc.weight is no cell or parameter of the MindSpore "
                                   "model")
    assert not (tmp_path / "ms").exists()


def test_a_map_naming_no_module_of_the_torch_model_is_refused_before_its_capture(tmp_path):
    """Its PyTorch names were checked by nothing: a misspelt one pinned nothing, and a
    misspelt MindSpore name was found only after the whole torch capture."""
    (tmp_path / "map.toml").write_text('"1.moving_mean" = "1.running_mean"\n"0#1" = "0"\n'
                                       '"8.weight" = "8.wieght"\n')
    process = parity_cli("run", *TINY, "--map", tmp_path / "map.toml", "--out", tmp_path / "r")
    assert_one_line_error(process, "torch capture: --map: 8.wieght is no module, parameter or "
                                   "buffer of the torch model")
    assert not (tmp_path / "r").exists()


def test_a_run_refused_for_rows_held_stacked_writes_the_map_it_suggests(tmp_path):
    """mindcv's DPN was refused for 34 convs timm holds stacked (68 missing keys, 34 extra):
    writing the 68 lines of a map by hand was the only way on. The run directory now holds
    them, the user's own lines kept, and the next run passes with it; a MindSpore capture
    whose reference lies outside a parity run directory writes nothing beside it."""
    import shutil
    import tomllib
    pair = ("--torch-model", "tests.tiny:torch_dual_path", "--ms-model",
            "tests.tiny:ms_dual_path", "--image-size", "16")
    (tmp_path / "mine.toml").write_text('"head.weight" = "head.weight"\n')
    process = parity_cli("run", *pair, "--map", tmp_path / "mine.toml", "--out", tmp_path / "run")
    suggested = tmp_path / "run" / "suggested-map.toml"
    assert_one_line_error(process, "torch's c1x1.weight (12, 8, 1, 1) may hold the port's "
                          "c1x1_main.weight (8 rows) and c1x1_side.weight (4 rows) stacked",
                          f"the 6 lines for all of them are written to {suggested}")
    assert tomllib.loads(suggested.read_text()) == {
        "head.weight": "head.weight",
        "c1x1_main.weight": "c1x1.weight[0:8]", "c1x1_side.weight": "c1x1.weight[8:12]",
        "gate_up.weight[0:6]": "gate.weight", "gate_up.weight[6:12]": "up.weight",
        "gate_up.bias[0:6]": "gate.bias", "gate_up.bias[6:12]": "up.bias"}
    shutil.copytree(tmp_path / "run" / "torch", tmp_path / "alone" / "torch")
    process = parity_cli("capture", "--framework", "mindspore", *pair, "--reference",
                         tmp_path / "alone" / "torch", "--out", tmp_path / "alone" / "ms")
    assert_one_line_error(process, "may hold the port's c1x1_main.weight")
    assert "written to" not in process.stderr
    assert sorted(p.name for p in (tmp_path / "alone").iterdir()) == ["torch"]
    process = parity_cli("run", *pair, "--map", suggested, "--out", tmp_path / "run")
    assert process.returncode == 0, process.stderr


@pytest.mark.parametrize("name_map, message", [
    ({"1.moving_mean": "1.running_mean", "0#1": "0", "8.weight": "8.wieght"},
     "--map: 8.wieght is no module, parameter or buffer of the torch model"),
    ({"1.moving_mean": "1.running_mean", "0#1": "0", "8.wieght": "8.weight"},
     "--map: 8.wieght is no cell or parameter of the MindSpore model"),
])
def test_check_refuses_a_map_naming_nothing_before_it_captures(tmp_path, name_map, message):
    import parity
    from tests import tiny
    with pytest.raises(ParityInputError, match=re.escape(message)):
        parity.check(tiny.torch_tiny(), tiny.ms_tiny(), image_size=16, name_map=name_map,
                     out=tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("models, message", [
    (("ms_tiny", "torch_tiny"), "check() got the MindSpore model first"),
    (("torch_tiny", "torch_tiny"), "check()'s ms_model is a Sequential, not a mindspore.nn.Cell"),
    (("ms_tiny", "ms_tiny"), "check()'s torch_model is a SequentialCell, not a torch.nn.Module"),
])
def test_check_is_told_when_its_models_are_not_a_torch_model_then_a_mindspore_one(models,
                                                                                    message):
    import parity
    from tests import tiny
    with pytest.raises(ParityInputError, match=re.escape(message)):
        parity.check(*(getattr(tiny, name)() for name in models), image_size=16)


@pytest.mark.parametrize("size", [dict(batch_size=4), dict(image_size=16)])
def test_check_refuses_batch_sizes_beside_its_own_batch(size):
    import parity
    from tests import tiny
    batch = (np.zeros((2, 3, 16, 16), np.float32), np.array([1, 2]))
    with pytest.raises(ParityInputError, match="with inputs= the batch is yours: leave them out"):
        parity.check(tiny.torch_tiny(), tiny.ms_tiny(), inputs=batch, **size)


def test_a_mindspore_capture_made_from_another_torch_capture_is_refused(tiny_run, tmp_path):
    """The MindSpore half of a run against a torch capture of the same pair from another seed:
    other weights and batch, so every record would differ (it read as 'preprocessing
    differs')."""
    other = tmp_path / "torch-seed-1"
    assert parity_cli("capture", "--framework", "torch", *TINY, "--seed", "1",
                      "--out", other).returncode == 0
    process = parity_cli("compare", other, tiny_run / "mindspore")
    assert_one_line_error(process, "was captured from another torch capture",
                          f"--reference {other}")
    assert parity_cli("compare", tiny_run / "torch", tiny_run / "mindspore").returncode == 0


@pytest.mark.parametrize("inputs, message", [
    ((np.zeros((2, 3, 16, 16), np.float32),), "inputs= is a pair (x, y)"),
    ((np.zeros((2, 3, 16, 16), np.float32), np.array([0.7, 1.2])),
     "y must hold integer class indices, not float64"),
    ((np.zeros((2, 3, 16, 16), np.float32), np.array([1, 2, 3])),
     "x (2, 3, 16, 16) and y (3,) must share the batch size"),
    ((np.zeros((0, 3, 16, 16), np.float32), np.zeros(0, np.int64)), "holds no samples"),
])
def test_check_refuses_a_batch_it_cannot_step_on(inputs, message):
    """check()'s inputs= is held to what --input's .npz is: labels given as floats were
    truncated to classes, and an x alone failed with 'not enough values to unpack'."""
    import parity
    from tests import tiny
    with pytest.raises(ParityInputError, match=re.escape(message)):
        parity.check(tiny.torch_tiny(), tiny.ms_tiny(), inputs=inputs)
