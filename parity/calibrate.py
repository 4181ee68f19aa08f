"""Measure what tolerances a correct port needs: ``python -m parity.calibrate RUN_DIR ...``.

Each RUN_DIR holds torch/ and mindspore/ captures of a port known to be correct (the built-in
ResNet pair). Prints, per kind, the worst noise ratio (float64-calibrated verdict) and the
worst needed rtol and lowest cosine (fixed-tolerance verdict): the defaults in
parity/compare/tolerance.py sit a margin above these.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from parity.compare.engine import compare_runs


def measure(run_dir: Path) -> pd.DataFrame:
    calibrated = compare_runs(run_dir / "torch", run_dir / "mindspore").records
    fixed = compare_runs(run_dir / "torch", run_dir / "mindspore",
                         use_fp64_reference=False).records
    return pd.DataFrame({
        "worst_noise_ratio": calibrated.groupby("kind").noise_ratio.max(),
        "worst_needed_rtol": fixed.groupby("kind").needed_rtol.max(),
        "lowest_cosine": fixed.groupby("kind").cosine.min(),
    })


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m parity.calibrate", description=__doc__)
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR")
    for run_dir in parser.parse_args().runs:
        print(f"{run_dir}:")
        print(measure(run_dir).to_string(float_format=lambda v: f"{v:.3g}"))


if __name__ == "__main__":
    main()
