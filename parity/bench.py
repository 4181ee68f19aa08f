"""``make bench``: what parity costs on top of the two bare training steps it checks.

For ResNet50 at batch 2 / 64² and batch 8 / 224², each in fresh processes:

* the bare torch step and the bare MindSpore step (model built, one SGD step, no hooks);
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
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

SIZES: List[Tuple[int, int]] = [(2, 64), (8, 224)]
ENV = {**os.environ, "GLOG_v": "3"}


def bare_step(framework: str, batch: int, size: int) -> Dict[str, float]:
    """One training step with no parity code in the way; runs in the calling process."""
    import numpy as np
    if framework == "mindspore":
        import mindspore as ms
        from mindspore import nn

        from models.resnet_mindspore import resnet50
        ms.set_context(mode=ms.PYNATIVE_MODE)
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
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _timed(command: List[str]) -> Tuple[float, str]:
    started = time.perf_counter()
    process = subprocess.run(command, env=ENV, capture_output=True, text=True)
    if process.returncode not in (0, 1):
        raise SystemExit(f"benchmark command failed: {' '.join(command)}\n{process.stderr}")
    return time.perf_counter() - started, process.stdout


def measure(batch: int, size: int, scratch: Path) -> Dict[str, float]:
    figures: Dict[str, float] = {}
    for framework in ("torch", "mindspore"):
        wall, out = _timed([sys.executable, "-m", "parity.bench", "--bare", framework,
                            str(batch), str(size)])
        inner = json.loads(out.strip().splitlines()[-1])
        figures[f"{framework}_wall"] = wall
        figures[f"{framework}_step"] = inner["seconds"]
        figures[f"{framework}_rss"] = inner["peak_rss_mb"]
    run_dir = scratch / f"run-{batch}-{size}"
    wall, _ = _timed([sys.executable, "-m", "parity", "run", "--batch-size", str(batch),
                      "--image-size", str(size), "--out", str(run_dir), "--json",
                      str(scratch / f"r-{batch}-{size}.json"), "--quiet"])
    report = json.loads((scratch / f"r-{batch}-{size}.json").read_text())
    figures["parity_wall"] = wall
    manifests = {fw: json.loads((run_dir / fw / "manifest.json").read_text())
                 for fw in ("torch", "mindspore")}
    captures = sum(m["resources"]["seconds"] for m in manifests.values())
    compare_seconds = report["extra"].get("compare_seconds", float("nan"))
    figures["parity_inner"] = captures + compare_seconds
    figures["parity_rss"] = max(m["resources"]["peak_rss_mb"] for m in manifests.values())
    figures["compare_gbps"] = report["extra"].get("compare_bytes", 0) / 1e9 / compare_seconds
    figures["passed"] = float(report["passed"])
    return figures


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
            f = measure(batch, size, Path(scratch))
            bare_inner = f["torch_step"] + f["mindspore_step"]
            bare_wall = f["torch_wall"] + f["mindspore_wall"]
            bare_rss = max(f["torch_rss"], f["mindspore_rss"])
            print(f"ResNet50 batch {batch} at {size}x{size}:")
            print(f"  bare torch step       {f['torch_step']:7.2f} s  ({f['torch_wall']:.2f} s "
                  f"with start-up), peak {f['torch_rss']:.0f} MB")
            print(f"  bare MindSpore step   {f['mindspore_step']:7.2f} s  "
                  f"({f['mindspore_wall']:.2f} s with start-up), peak {f['mindspore_rss']:.0f} MB")
            print(f"  parity run            {f['parity_inner']:7.2f} s  ({f['parity_wall']:.2f} s "
                  f"with start-up), peak {f['parity_rss']:.0f} MB, "
                  f"{'parity' if f['passed'] else 'DIVERGENCE'}")
            print(f"  overhead ratio        {f['parity_inner'] / bare_inner:7.2f}   without "
                  f"start-up (target <= 1.5); {f['parity_wall'] / bare_wall:.2f} with")
            print(f"  peak memory ratio     {f['parity_rss'] / bare_rss:7.2f}   (target <= 1.5)")
            print(f"  compare throughput    {f['compare_gbps']:7.2f} GB/s (target >= 1)")


if __name__ == "__main__":
    main()
