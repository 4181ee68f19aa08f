"""``make bench``: what parity costs on top of the two bare training steps it checks.

For ResNet50 at batch 2 / 64² and batch 8 / 224², each in fresh processes:

* the bare torch step and the bare MindSpore step (model built, one SGD step, no hooks), and
  the MindSpore one again run synchronously, as parity's capture runs it on CPU;
* ``parity run`` (both captures with every check, compare, reports);

and prints the overhead ratio ``parity run / (bare torch + bare MindSpore)`` with and without
interpreter start-up, peak resident memory against the larger bare step's, and the compare
throughput in GB/s of tensor data read. Targets (issue 6): ratio <= 1.5 without start-up at
8 / 224², peak memory <= 1.5 x the larger bare step, compare >= 1 GB/s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

from parity.resources import peak_resident_mb

SIZES: List[Tuple[int, int]] = [(2, 64), (8, 224)]
# MindSpore's bare step as parity's capture runs it on CPU (pynative_synchronize): reported
# beside the default one, which the ratio uses, so the ratio's denominator is not the slower
# of the two without saying so
SYNCHRONOUS_MINDSPORE = "mindspore-synchronous"
ENV = {**os.environ, "GLOG_v": "3"}


def bare_step(framework: str, batch: int, size: int) -> Dict[str, float]:
    """One training step with no parity code in the way; runs in the calling process."""
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
        loss = torch.nn.functional.cross_entropy(model(x), torch.arange(batch))
        loss.backward()
        optimizer.step()
    return {"seconds": time.perf_counter() - started,
            "peak_rss_mb": peak_resident_mb()}


def _timed(command: List[str]) -> Tuple[float, str]:
    started = time.perf_counter()
    process = subprocess.run(command, env=ENV, capture_output=True, text=True)
    if process.returncode not in (0, 1):
        raise SystemExit(f"benchmark command failed: {' '.join(command)}\n{process.stderr}")
    return time.perf_counter() - started, process.stdout


def bare_steps(batch: int, size: int) -> Dict[str, float]:
    figures: Dict[str, float] = {}
    for framework in ("torch", "mindspore", SYNCHRONOUS_MINDSPORE):
        wall, out = _timed([sys.executable, "-m", "parity.bench", "--bare", framework,
                            str(batch), str(size)])
        inner = json.loads(out.strip().splitlines()[-1])
        figures[f"{framework}_wall"] = wall
        figures[f"{framework}_step"] = inner["seconds"]
        figures[f"{framework}_rss"] = inner["peak_rss_mb"]
    return figures


def parity_run(batch: int, size: int, scratch: Path, *options: str) -> Dict[str, Any]:
    """``parity run`` timed from outside, with its parts as each process reported them."""
    run_dir, report_path = scratch / f"run-{batch}-{size}", scratch / f"r-{batch}-{size}.json"
    wall, _ = _timed([sys.executable, "-m", "parity", "run", "--batch-size", str(batch),
                      "--image-size", str(size), "--out", str(run_dir), "--json",
                      str(report_path), "--quiet", *options])
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
            "torch_rss": manifests["torch"]["resources"]["peak_rss_mb"],
            "spilled_mb": manifests["torch"]["resources"]["float64_spilled_mb"],
            "mindspore_rss": manifests["mindspore"]["resources"]["peak_rss_mb"],
            "compare_rss": report["extra"]["compare_peak_rss_mb"],
            "gbps": report["extra"]["compare_bytes"] / 1e9 / compare_seconds,
            "passed": report["passed"]}


def rerun_seconds(phases: Dict[str, Dict[str, float]]) -> float:
    """What the checks that rerun the step cost: what the ratio would be without them."""
    return sum(seconds for each in phases.values() for phase, seconds in each.items()
               if phase in ("observer rerun", "float64 step"))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m parity.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bare", nargs=3, metavar=("FRAMEWORK", "BATCH", "SIZE"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--sizes", default="2x64,8x224",
                        help="comma-separated BATCHxSIZE list (default 2x64,8x224)")
    args = parser.parse_args()
    if args.bare:
        framework, batch, size = args.bare
        print(json.dumps(bare_step(framework, int(batch), int(size))))
        return
    sizes = [tuple(int(v) for v in item.split("x")) for item in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="parity-bench-") as scratch:
        for batch, size in sizes:
            bare = bare_steps(batch, size)
            bare_inner = bare["torch_step"] + bare["mindspore_step"]
            bare_wall = bare["torch_wall"] + bare["mindspore_wall"]
            bare_rss = max(bare["torch_rss"], bare["mindspore_rss"])
            print(f"ResNet50 batch {batch} at {size}x{size}:")
            print(f"  bare torch step       {bare['torch_step']:7.2f} s  "
                  f"({bare['torch_wall']:.2f} s with start-up), peak {bare['torch_rss']:.0f} MB")
            print(f"  bare MindSpore step   {bare['mindspore_step']:7.2f} s  "
                  f"({bare['mindspore_wall']:.2f} s with start-up), "
                  f"peak {bare['mindspore_rss']:.0f} MB")
            synchronous = bare[f"{SYNCHRONOUS_MINDSPORE}_step"]
            print(f"    synchronous         {synchronous:7.2f} s  (pynative_synchronize, as "
                  "parity's MindSpore capture runs on CPU)")
            for label, options in (("parity run", ()),
                                   ("  --no-fp64-reference", ("--no-fp64-reference",))):
                f = parity_run(batch, size, Path(scratch), *options)
                print(f"  {label:<21} {f['inner']:7.2f} s  ({f['wall']:.2f} s with start-up): "
                      f"torch capture {f['torch']:.1f} s, MindSpore capture "
                      f"{f['mindspore']:.1f} s, compare {f['compare']:.1f} s; "
                      f"{'parity' if f['passed'] else 'DIVERGENCE'}")
                for framework, phases in f["phases"].items():
                    print(f"    {framework + ' capture':<19} " + ", ".join(
                        f"{phase} {seconds:.1f} s" for phase, seconds in phases.items()))
                print(f"    overhead ratio      {f['inner'] / bare_inner:7.2f}   without start-up "
                      f"(target <= 1.5); {f['wall'] / bare_wall:.2f} with; "
                      f"{(f['inner'] - rerun_seconds(f['phases'])) / bare_inner:.2f} without "
                      "the reruns (observer, float64); "
                      f"{f['inner'] / (bare['torch_step'] + synchronous):.2f} against the "
                      "synchronous MindSpore step")
                rss = max(f["torch_rss"], f["mindspore_rss"], f["compare_rss"])
                print(f"    peak memory ratio   {rss / bare_rss:7.2f}   (target <= 1.5; torch "
                      f"capture {f['torch_rss']:.0f} MB with {f['spilled_mb']:.0f} MB of "
                      f"float64 activations spilled, MindSpore capture "
                      f"{f['mindspore_rss']:.0f} MB, compare {f['compare_rss']:.0f} MB)")
                print(f"    compare throughput  {f['gbps']:7.2f} GB/s (target >= 1)")


if __name__ == "__main__":
    main()
