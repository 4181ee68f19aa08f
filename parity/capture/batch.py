"""What both models are fed: the synthetic seeded batch, or the user's --input file."""

from __future__ import annotations

import re
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from parity.errors import ParityInputError


def input_name(position: int) -> str:
    """The record (and --input array) of the model's ``position``-th input: ``input`` / ``x``
    first, then ``input1`` / ``x1``, ``input2`` / ``x2``..."""
    return "input" if position == 0 else f"input{position}"


@dataclass(frozen=True)
class Batch:
    """What both models are fed: ``model(*inputs)``, and ``loss(outputs, labels)``."""

    inputs: Tuple[np.ndarray, ...]
    labels: np.ndarray

    @classmethod
    def of(cls, inputs: Sequence[Any], labels: Any) -> "Batch":
        """A user's arrays in the dtypes both models take (``model_input``), labels as int64."""
        return cls(tuple(model_input(np.asarray(x)) for x in inputs),
                   np.asarray(labels).astype(np.int64, copy=False))

    def summary(self) -> str:
        """'x (2, 3, 16, 16) float32; labels y (2,)': the arrays as --input names them."""
        inputs = ", ".join(f"x{i or ''} {x.shape} {x.dtype}" for i, x in enumerate(self.inputs))
        return f"{inputs}; labels y {self.labels.shape}"

    def named(self) -> List[Tuple[str, np.ndarray]]:
        """(record name, array) of each input, then of the labels (``target``)."""
        return [(input_name(i), x) for i, x in enumerate(self.inputs)] + \
            [("target", self.labels)]


def synthetic_batch(batch_size: int, image_size: int, num_classes: int, seed: int) -> Batch:
    """A seeded batch both frameworks can regenerate without sharing a file."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch_size, 3, image_size, image_size), dtype=np.float32)
    y = rng.integers(0, num_classes, size=batch_size, dtype=np.int64)
    return Batch((x,), y)


def model_input(x: np.ndarray) -> np.ndarray:
    """The batch as both models take it: floats in float32, integers (token ids, indices) in
    int64, as torch's embedding and gather require; anything else is refused."""
    if np.issubdtype(x.dtype, np.floating):
        return x.astype(np.float32, copy=False)
    if np.issubdtype(x.dtype, np.integer):
        return x.astype(np.int64, copy=False)
    raise ParityInputError(f"the input batch holds {x.dtype}: pass floats (images, features) "
                           "or integers (token ids)")


def _input_keys(path: Path, keys: List[str]) -> List[str]:
    """x, then x1, x2... as present in the file: any other array is refused, not ignored."""
    numbered = sorted(int(key[1:]) for key in keys if re.fullmatch(r"x[1-9][0-9]*", key))
    unknown = sorted(set(keys) - {"x", "y"} - {f"x{i}" for i in numbered})
    if unknown:
        raise ParityInputError(f"{path} holds array(s) {', '.join(unknown)} parity does not "
                               "read: a model's inputs are x, x1, x2... in the order it takes "
                               "them, its labels y")
    if numbered != list(range(1, len(numbered) + 1)):
        raise ParityInputError(f"{path}: inputs x, {', '.join(f'x{i}' for i in numbered)} skip "
                               "a number: after x come x1, x2... in the order the model takes "
                               "them")
    return ["x"] + [f"x{i}" for i in numbered]


def load_batch(path: Path) -> Batch:
    """A user batch from an .npz with ``x`` (float N×C×H×W, or integer token ids N×L), further
    inputs ``x1``, ``x2``... (an attention mask, say) and ``y`` (integer labels)."""
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):      # an .npy: one array, no labels
            raise ParityInputError(f"{path} holds one array ({loaded.dtype} {loaded.shape}), "
                                   "not the arrays of an .npz: write the inputs and labels "
                                   "with numpy.savez(path, x=..., y=...)")
        with loaded as data:
            missing = [key for key in ("x", "y") if key not in data.files]
            if missing:
                raise ParityInputError(f"{path} lacks array(s) {', '.join(missing)}; an --input "
                                       ".npz needs 'x' (N×C×H×W or token ids) and 'y' (class "
                                       "indices)")
            keys = _input_keys(path, list(data.files))
            inputs, y = [data[key] for key in keys], data["y"]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as error:
        # numpy takes a file that is neither a zip nor an .npy for a pickle
        what = "neither .npz nor .npy" if "pickled data" in str(error) else str(error)
        raise ParityInputError(f"{path} is not a readable .npz file ({what}); write it with "
                               "numpy.savez(path, x=..., y=...)") from None
    return checked_batch(inputs, y, str(path))


def checked_batch(inputs: Sequence[np.ndarray], y: np.ndarray, source: str) -> Batch:
    """A user's inputs (x, x1, x2...) and labels y from ``source`` (a file, or check()'s
    inputs=), refused unless they share a batch size of at least one sample and y holds
    integers: float labels would be truncated to classes without a word."""
    keys = ["x"] + [f"x{i}" for i in range(1, len(inputs))]
    if inputs[0].ndim < 2 or y.ndim < 1 or any(x.ndim < 1 or len(x) != len(y) for x in inputs):
        shapes = ", ".join(f"{key} {x.shape}" for key, x in zip(keys, inputs))
        raise ParityInputError(f"{source}: {shapes} and y {y.shape} must share the batch size "
                               "(y holds class indices: one per sample, or per pixel or token)")
    if not np.issubdtype(y.dtype, np.integer):
        raise ParityInputError(f"{source}: y must hold integer class indices, not {y.dtype}")
    if len(y) == 0:         # torch steps on it: its mean loss is NaN, and so is every gradient
        raise ParityInputError(f"{source} holds no samples (x {inputs[0].shape}, y {y.shape}): "
                               "a training step needs at least one")
    return Batch.of(inputs, y)


def batch_for(config, batch_file: Optional[Path], num_classes: int) -> Batch:
    if batch_file is not None:
        return load_batch(batch_file)
    return synthetic_batch(config.batch_size, config.image_size, num_classes, config.seed)
