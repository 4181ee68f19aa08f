"""``make bench``: what parity costs on top of the two bare training steps it checks.

For ResNet50 at batch 2 / 64² and batch 8 / 224², each in fresh processes:

* the bare torch step and the bare MindSpore step (model built, one SGD step, no hooks), and
  the MindSpore one again run synchronously, as parity's capture runs it on CPU; each process
  then steps once more, for the memory a second step takes (a capture's observer rerun);
* ``parity run`` (both captures with every check, compare, reports);

and prints the overhead ratio ``parity run / (bare torch + bare MindSpore)`` with and without
interpreter start-up, peak resident memory against the larger bare step's, and the compare
throughput in GB/s of tensor data read. ``parity run``'s memory is that of all its processes
at once (it waits beside each capture, and compare has a helper), sampled while it runs.
Targets (issue 6): ratio <= 1.5 without start-up at 8 / 224², peak memory <= 1.5 x the larger
bare step, compare >= 1 GB/s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

from parity.errors import EXIT_INTERRUPT, INTERRUPT_NAMES, interrupted_exit
from parity.processes import as_child_of_this_process, end_with_parent, stop
from parity.resources import peak_resident_mb, resident_bytes, shares_its_parents_memory
from parity.rundir import PAGE_CACHE_DROPPED, remove_abandoned

SIZES: List[Tuple[int, int]] = [(2, 64), (8, 224)]
# MindSpore's bare step as parity's capture runs it on CPU (pynative_synchronize): reported
# beside the default one, which the ratio uses, so the ratio's denominator is not the slower
# of the two without saying so
SYNCHRONOUS_MINDSPORE = "mindspore-synchronous"
BARE_FRAMEWORKS = ("torch", "mindspore", SYNCHRONOUS_MINDSPORE)
ENV = {**os.environ, "GLOG_v": "3", **as_child_of_this_process()}    # each ends with us
SCRATCH_PREFIX = "parity-bench-"     # + the benchmark's process id, in the temp directory


def bare_step(framework: str, batch: int, size: int) -> Dict[str, float]:
    """One training step with no parity code in the way, then a second one from where it left
    off (each capture steps more than once: its observer rerun); runs in the calling process.
    The step's time and peak are the first step's (model built, one SGD step)."""
    import numpy as np
    if framework.startswith("mindspore"):
        import mindspore as ms
        from mindspore import nn

        from models.resnet_mindspore import resnet50
        ms.set_context(mode=ms.PYNATIVE_MODE,
                       pynative_synchronize=framework == SYNCHRONOUS_MINDSPORE)
        started = time.perf_counter()
        net = resnet50()
        net.set_train(True)
        optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9, weight_decay=1e-4)
        loss_fn = nn.CrossEntropyLoss()
        grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, optimizer.parameters)
        x = ms.Tensor(np.random.default_rng(0).standard_normal((batch, 3, size, size),
                                                               dtype=np.float32))

        def step() -> None:
            loss, grads = grad_fn(x, ms.Tensor(np.arange(batch, dtype=np.int32)))
            optimizer(grads)
            loss.asnumpy()
    else:
        import torch
        import torchvision
        started = time.perf_counter()
        model = torchvision.models.resnet50().train()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
        x = torch.randn(batch, 3, size, size)

        def step() -> None:
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), torch.arange(batch)).backward()
            optimizer.step()
    step()
    first_done = time.perf_counter()
    figures = {"seconds": first_done - started, "peak_rss_mb": peak_resident_mb()}
    step()
    return {**figures, "second_step_seconds": time.perf_counter() - first_done,
            "second_step_peak_rss_mb": peak_resident_mb()}


def _tree_resident_bytes(pid: int) -> int:
    """Resident memory of process ``pid`` and all its descendants now (Linux /proc; a process
    that ends while it is read counts 0). A child that has not called exec yet counts 0: a
    capture running ``uname -p`` at its peak read as twice its memory while subprocess's vfork
    child shared it (a peak ratio of 2.54 instead of 1.3 in one run of make bench)."""
    total, pending = 0, [pid]
    while pending:
        pid = pending.pop()
        if not shares_its_parents_memory(pid):
            total += resident_bytes(pid) or 0
        try:
            for task in Path(f"/proc/{pid}/task").iterdir():
                pending += [int(child) for child in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return total


class TreeMemoryPeak:
    """The most memory a process and its descendants held at once, sampled every
    ``period`` seconds on a thread of its own while the process runs (a peak shorter than
    that can be missed: each process's own peak is reported beside it)."""

    def __init__(self, process: subprocess.Popen, period: float = 0.05) -> None:
        self.peak_bytes = 0
        self._process, self._period = process, period
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while self._process.poll() is None:
            self.peak_bytes = max(self.peak_bytes, _tree_resident_bytes(self._process.pid))
            time.sleep(self._period)

    def mb(self) -> float:
        self._thread.join()
        return self.peak_bytes / 2**20


def _timed(command: List[str], succeeded: Tuple[int, ...] = (0,)) -> Tuple[float, str, float]:
    """Wall seconds, standard output and the sampled peak memory (MB) of all its processes;
    an exit code not in ``succeeded`` ends the benchmark with the command's last words."""
    started = time.perf_counter()
    process = subprocess.Popen(command, env=ENV, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        memory = TreeMemoryPeak(process)
        stdout, stderr = process.communicate()
    except BaseException:           # Ctrl-C, SIGTERM: the command cleans up, then it is gone
        # SIGTERM, which changes nothing for a command a terminal's Ctrl-C reached already:
        # as a child of ours, it takes only the first interrupt
        stop(process, signal.SIGTERM)
        raise
    wall = time.perf_counter() - started
    if process.returncode not in succeeded:
        last = stderr.strip().splitlines()[-1:] or [f"exit code {process.returncode}"]
        raise SystemExit(f"parity.bench: {' '.join(command[1:])} failed: {last[0]}")
    return wall, stdout, memory.mb()


def scratch_directory() -> Path:
    """A new scratch directory for this benchmark's runs, named after its process; those of
    benchmarks that no longer run (killed: no time to clean up) are removed first."""
    temp = Path(tempfile.gettempdir())
    remove_abandoned(temp, SCRATCH_PREFIX)
    scratch = temp / f"{SCRATCH_PREFIX}{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)      # a dead process's, whose id was reused
    scratch.mkdir()
    return scratch


def _terminate(signum: int, frame: Any) -> None:
    """SIGTERM (a cancelled CI job, ``timeout``) and SIGHUP (its terminal closed) unwind like
    Ctrl-C, so that the scratch directory and the running command are cleaned up; by default
    they ended the benchmark where it stood, leaving both."""
    raise SystemExit(interrupted_exit(signum))


def bare_steps(batch: int, size: int) -> Dict[str, float]:
    figures: Dict[str, float] = {}
    for framework in BARE_FRAMEWORKS:
        wall, out, _ = _timed([sys.executable, "-m", "parity.bench", "--bare", framework,
                               str(batch), str(size)])
        inner = json.loads(out.strip().splitlines()[-1])
        figures[f"{framework}_wall"] = wall - inner["second_step_seconds"]
        figures[f"{framework}_step"] = inner["seconds"]
        figures[f"{framework}_rss"] = inner["peak_rss_mb"]
        figures[f"{framework}_rss2"] = inner["second_step_peak_rss_mb"]
    return figures


def parity_run(batch: int, size: int, scratch: Path, *options: str) -> Dict[str, Any]:
    """``parity run`` timed from outside, with its parts as each process reported them."""
    run_dir, report_path = scratch / f"run-{batch}-{size}", scratch / f"r-{batch}-{size}.json"
    wall, _, tree_rss = _timed([sys.executable, "-m", "parity", "run", "--batch-size",
                                str(batch), "--image-size", str(size), "--out", str(run_dir),
                                "--json", str(report_path), "--quiet", *options],
                               succeeded=(0, 1))      # 1: a divergence, reported
    report = json.loads(report_path.read_text())
    report_path.unlink()
    manifests = {fw: json.loads((run_dir / fw / "manifest.json").read_text())
                 for fw in ("torch", "mindspore")}
    compare_seconds = report["extra"]["compare_seconds"]
    return {"wall": wall, "torch": manifests["torch"]["resources"]["seconds"],
            "mindspore": manifests["mindspore"]["resources"]["seconds"],
            "phases": {fw: m["resources"]["phases"] for fw, m in manifests.items()},
            "compare": compare_seconds,
            "inner": sum(m["resources"]["seconds"] for m in manifests.values()) + compare_seconds,
            "peaks_after": {fw: m["resources"]["peak_rss_mb_after"]
                            for fw, m in manifests.items()},
            "torch_rss": manifests["torch"]["resources"]["peak_rss_mb"],
            "spilled_mb": manifests["torch"]["resources"]["float64_spilled_mb"],
            "past_page_cache": [fw for fw, m in manifests.items()
                                if m["resources"].get(PAGE_CACHE_DROPPED)],
            "mindspore_rss": manifests["mindspore"]["resources"]["peak_rss_mb"],
            "compare_rss": report["extra"]["compare_peak_rss_mb"],
            "tree_rss": tree_rss,
            "gbps": report["extra"]["compare_bytes"] / 1e9 / compare_seconds,
            "passed": report["passed"]}


def rerun_seconds(phases: Dict[str, Dict[str, float]]) -> float:
    """What the checks that rerun the step cost: what the ratio would be without them."""
    return sum(seconds for each in phases.values() for phase, seconds in each.items()
               if phase in ("observer rerun", "rerounded step", "float64 step"))


def _print_per_capture(by_framework: Dict[str, Dict[str, float]], each: str,
                       lead: str = "") -> None:
    """One line per capture of figures by phase, each formatted by ``each`` (phase, value)."""
    for framework, by_phase in by_framework.items():
        print(f"    {framework + ' capture':<19} {lead}" + ", ".join(
            each.format(phase, value) for phase, value in by_phase.items()))


def _positive_integers(*texts: str) -> bool:
    return all(text.isdigit() and int(text) > 0 for text in texts)


def _sizes(text: str) -> List[Tuple[int, int]]:
    """``--sizes``: "2x64,8x224" -> [(2, 64), (8, 224)]."""
    pairs = [item.strip().split("x") for item in text.split(",")]
    if not all(len(pair) == 2 and _positive_integers(*pair) for pair in pairs):
        raise argparse.ArgumentTypeError(f"{text!r}: expected BATCHxSIZE pairs of positive "
                                         "integers, comma-separated (e.g. 2x64,8x224)")
    return [(int(batch), int(size)) for batch, size in pairs]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m parity.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bare", nargs=3, metavar=("FRAMEWORK", "BATCH", "SIZE"),
                        help="only time one bare step in this process and print its figures "
                             f"as JSON; FRAMEWORK: {', '.join(BARE_FRAMEWORKS)} (e.g. "
                             "--bare mindspore 8 224, under the MindSpore you train with)")
    parser.add_argument("--sizes", default=_sizes("2x64,8x224"), type=_sizes,
                        help="comma-separated BATCHxSIZE list (default 2x64,8x224)")
    args = parser.parse_args()
    if args.bare:
        framework, batch, size = args.bare
        if framework not in BARE_FRAMEWORKS or not _positive_integers(batch, size):
            parser.error(f"--bare {framework} {batch} {size}: expected one of "
                         f"{', '.join(BARE_FRAMEWORKS)}, then a batch and an image size, "
                         "positive integers")
        end_with_parent()
        print(json.dumps(bare_step(framework, int(batch), int(size))))
        return
    for number in INTERRUPT_NAMES:      # not SIGINT, Python's KeyboardInterrupt already
        if signal.getsignal(number) is signal.SIG_DFL:          # not when ignored (nohup)
            signal.signal(number, _terminate)
    scratch = scratch_directory()
    try:
        for batch, size in args.sizes:
            bare = bare_steps(batch, size)
            bare_inner = bare["torch_step"] + bare["mindspore_step"]
            bare_wall = bare["torch_wall"] + bare["mindspore_wall"]
            bare_rss = max(bare["torch_rss"], bare["mindspore_rss"])
            print(f"ResNet50 batch {batch} at {size}x{size}:")
            for framework, label in (("torch", "  bare torch step"),
                                     ("mindspore", "  bare MindSpore step"),
                                     (SYNCHRONOUS_MINDSPORE, "    synchronous")):
                started = "pynative_synchronize, as parity's MindSpore capture runs on CPU" \
                    if framework == SYNCHRONOUS_MINDSPORE else \
                    f"{bare[f'{framework}_wall']:.2f} s with start-up"
                print(f"{label:<23} {bare[f'{framework}_step']:7.2f} s  ({started}), peak "
                      f"{bare[f'{framework}_rss']:.0f} MB ({bare[f'{framework}_rss2']:.0f} MB "
                      "once it steps again)")
            synchronous = bare[f"{SYNCHRONOUS_MINDSPORE}_step"]
            for label, options in (("parity run", ()),
                                   ("  --no-fp64-reference", ("--no-fp64-reference",))):
                f = parity_run(batch, size, Path(scratch), *options)
                print(f"  {label:<21} {f['inner']:7.2f} s  ({f['wall']:.2f} s with start-up): "
                      f"torch capture {f['torch']:.1f} s, MindSpore capture "
                      f"{f['mindspore']:.1f} s, compare {f['compare']:.1f} s; "
                      f"{'parity' if f['passed'] else 'DIVERGENCE'}")
                _print_per_capture(f["phases"], "{} {:.1f} s")
                print(f"    overhead ratio      {f['inner'] / bare_inner:7.2f}   without start-up "
                      f"(target <= 1.5); {f['wall'] / bare_wall:.2f} with; "
                      f"{(f['inner'] - rerun_seconds(f['phases'])) / bare_inner:.2f} without "
                      "the reruns (observer, rerounded, float64); "
                      f"{f['inner'] / (bare['torch_step'] + synchronous):.2f} against the "
                      "synchronous MindSpore step")
                rss = max(f["tree_rss"], f["torch_rss"], f["mindspore_rss"], f["compare_rss"])
                print(f"    peak memory ratio   {rss / bare_rss:7.2f}   (target <= 1.5; all of "
                      f"parity run's processes at once {f['tree_rss']:.0f} MB, sampled; each "
                      f"one's own peak: torch capture {f['torch_rss']:.0f} MB with "
                      f"{f['spilled_mb']:.0f} MB of float64 activations spilled, MindSpore "
                      f"capture {f['mindspore_rss']:.0f} MB, compare and its helper "
                      f"{f['compare_rss']:.0f} MB)")
                _print_per_capture(f["peaks_after"], "{} {:.0f}", lead="peak MB after ")
                print(f"    compare throughput  {f['gbps']:7.2f} GB/s (target >= 1); shards "
                      "put past a slow page cache and read from disk: "
                      f"{', '.join(f['past_page_cache']) or 'none'}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("parity.bench: interrupted; its scratch directory is removed", file=sys.stderr)
        sys.exit(EXIT_INTERRUPT)
