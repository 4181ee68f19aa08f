"""Which activation each side applies between two modules, where it is written as a function
in a forward (``F.gelu(self.fc1(x))``, TransformerEncoderLayer's ``activation="gelu"``) and so
has no record of its own; in which order each lays the values out for the next module (a
feature map flattened channels-last on one side only); and which tokens each pools for it (the
class token, or their mean).

A module's input is kept as a sketch (its norm and six ±1 projections, parity/sketch.py). The
candidate activations are applied to the previous module's recorded output and sketched alike:
on each side the closest is the one it applied. Float32 rounding moves a sketch's projections
by ~3e-7 of the norm (one rounding either way on 30 % of 6.4 million values: 2.7e-7); GELU's two
forms differ by ~1e-4 of it (their relative RMS difference over normal inputs at scales 0.3 to
3, torch), so they are told apart.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from parity.sketch import PROJECTIONS, SKETCH_PERIOD, input_sketch, sketch_distance
from parity.records import Diagnosis, RecordInfo, module_of
from parity.rundir import RunReader

# A sketch this close (relative to the input's norm) is the same input: 100 times the rounding
# above, a tenth of GELU's forms apart. Measured in two runs (an MLP, a Transformer layer): each
# side's own activation within 3.4e-7, the other GELU form 2.1e-4 to 3.3e-4 off. An activation a
# kernel computes less exactly (MindSpore's CPU tanh where 2 < |x| < 8, compare/kernels.py)
# may fit no candidate: then nothing is named.
SAME_SKETCH = 3e-5
BLOCK = 64 * SKETCH_PERIOD
# The port's records of the pool's shape, latest first, searched for the pool's input.
MAX_POOL_INPUTS = 32


def _erf(x: np.ndarray) -> np.ndarray:
    """erf to within 1.5e-7 (Abramowitz & Stegun 7.1.26): numpy has none, scipy is not a
    dependency."""
    t = 1.0 / (1.0 + 0.3275911 * np.abs(x))
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027
                                                                         + t * 1.061405429))))
    return np.sign(x) * (1.0 - poly * np.exp(-x * x))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


GELU_EXACT, GELU_TANH = "gelu (exact, erf)", "gelu (tanh approximation)"
ACTIVATIONS: Dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "nothing": lambda x: x,
    "relu": lambda x: np.maximum(x, 0.0),
    GELU_EXACT: lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    GELU_TANH:
        lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3))),
    "gelu (quick, x·σ(1.702x))": lambda x: x * _sigmoid(1.702 * x),
    "silu": lambda x: x * _sigmoid(x),
    "sigmoid": _sigmoid,
    "tanh": np.tanh,
    "leaky_relu (slope 0.01)": lambda x: np.where(x > 0, x, 0.01 * x),
    "elu": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0.0))),
}


AS_LAID_OUT = "as laid out"


def _layouts(ndim: int) -> Dict[str, Optional[Tuple[int, ...]]]:
    """The orders a feature map may be handed on in, by their description: as the module laid
    it out, or with its channels moved last (NHWC code, TensorFlow's ports) before a flatten or
    reshape, which keeps every value and moves the features the next module weighs."""
    moved = {4: (0, 2, 3, 1), 3: (0, 2, 1)}.get(ndim)
    layouts: Dict[str, Optional[Tuple[int, ...]]] = {AS_LAID_OUT: None}
    if moved is not None:
        layouts[f"transposed {moved} (channels last)"] = moved
    return layouts


def projections(activation: Callable[[np.ndarray], np.ndarray],
                 values: np.ndarray) -> np.ndarray:
    """The ±1 projections of input_sketch(activation(values)), a block at a time: memory
    bounded by a block, not by the tensor (ResNet50's largest at batch 8, 224² is 25 MB, 51 MB
    widened). Summed as input_sketch sums them, to float64 rounding."""
    flat, projections = values.reshape(-1), np.zeros(PROJECTIONS)
    for start in range(0, flat.size, BLOCK):        # each block starts the signs' period anew
        block = activation(flat[start:start + BLOCK].astype(np.float64)).astype(np.float32)
        projections += input_sketch(block)[1:]
    return projections


Candidate = Tuple[str, str]        # (activation, layout)


def sketch_distances(previous: np.ndarray, sketch: Sequence[float]) -> Dict[Candidate, float]:
    """How far each candidate activation's output from ``previous``, in each layout, is from
    this sketch, in its projections relative to its norm. The norm itself is left out:
    input_sketch sums its squares in float32, whose rounding depends on the order (3.6e-5 of it
    over 6.4 million values, more than this check allows; the projections' 3.5e-7). A moved
    layout is one copy of ``previous``, made and dropped in turn."""
    norm, *recorded = sketch
    distances: Dict[Candidate, float] = {}
    for layout, axes in _layouts(previous.ndim).items():
        values = previous if axes is None else np.ascontiguousarray(previous.transpose(axes))
        for name, f in ACTIVATIONS.items():
            distances[name, layout] = math.inf if not norm else \
                float(np.abs(projections(f, values)[:len(recorded)] - recorded).max()) / norm
    return distances


def applied_activation(run: RunReader, record: RecordInfo) -> Optional[str]:
    """The activation ``run`` applies between its previous module and ``record``, values laid
    out as that module left them, told from ``record``'s input sketch; None where none fits."""
    sketch, previous = record.attrs.get("input_sketch"), _previous_forward(run, record)
    if previous is None or not sketch or previous.dtype != "float32":
        return None
    distances = sketch_distances(run.tensor(previous), sketch)
    (activation, layout), distance = min(distances.items(), key=lambda item: item[1])
    return activation if distance <= SAME_SKETCH and layout == AS_LAID_OUT else None


def pooled_padding_counted(pool: RecordInfo, kernel: int, t: RecordInfo, ms_run: RunReader,
                           torch_run: RunReader, torch_names: Mapping[str, str]
                           ) -> Optional[str]:
    """The torch record an average pool in torch's forward reads, where torch counts the
    padding and the port's ``pool`` cell (odd ``kernel``, stride 1) does not: found by the pool's
    input sketch among the port's earlier records of its shape, read on torch's side (its pair,
    ``torch_names``: MindSpore name -> torch name), pooled both ways and sketched; counted fits
    the input of ``t`` (the module torch runs next) and uncounted does not. None otherwise."""
    wanted = pool.attrs.get("input_sketch")
    if not wanted or not t.attrs.get("input_sketch") or len(pool.shape) != 4:
        return None
    earlier = sorted((r for r in ms_run.records if r.kind == "forward" and r.order < pool.order
                      and tuple(r.shape) == tuple(pool.shape) and r.dtype == "float32"
                      and r.name in torch_names), key=lambda r: -r.order)
    for candidate in earlier[:MAX_POOL_INPUTS]:
        distance = sketch_distance(input_sketch(ms_run.tensor(candidate)), wanted)
        if distance is None or distance > SAME_SKETCH:
            continue
        source = torch_run.record(torch_names[candidate.name], "forward")
        if source is None or tuple(source.shape) != tuple(pool.shape):
            return None
        x = torch_run.tensor(source)
        fits = [sketch_distance(t.attrs["input_sketch"],
                                input_sketch(_average_pooled(x, kernel, counted)))
                for counted in (True, False)]
        if None not in fits and fits[0] <= SAME_SKETCH < fits[1]:
            return source.name
        return None
    return None


def _average_pooled(x: np.ndarray, kernel: int, counted: bool) -> np.ndarray:
    """x (N, C, H, W) averaged over kernel × kernel windows, stride 1, padded by kernel // 2 with
    zeros, the padding counted in each window's size or not; in float64, returned in float32."""
    pad, (height, width) = kernel // 2, x.shape[2:]
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    sums = sum(padded[:, :, i:i + height, j:j + width] for i in range(kernel)
               for j in range(kernel))
    if counted:
        return (sums / kernel ** 2).astype(np.float32)
    inside = np.pad(np.ones((height, width)), pad)
    counts = sum(inside[i:i + height, j:j + width] for i in range(kernel) for j in range(kernel))
    return (sums / counts).astype(np.float32)


def _previous_forward(run: RunReader, record: RecordInfo,
                      shape: Optional[Tuple[int, ...]] = None) -> Optional[RecordInfo]:
    """``run``'s latest forward record before ``record``; of ``shape``, where given, if the
    module whose output that is returns one of it too (Hugging Face's DINOv2 returns its
    states, then its pooled class token, (N, D), recorded last)."""
    before = [r for r in run.records if r.kind == "forward" and r.order < record.order]
    if not before:
        return None
    latest = max(before, key=lambda r: r.order)
    if shape is None:
        return latest
    of_shape = [r for r in before if module_of(r.name) == module_of(latest.name)
                and tuple(r.shape) == tuple(shape)]
    return max(of_shape, key=lambda r: r.order) if of_shape else latest


def _previous_and_sketches(t: RecordInfo, m: RecordInfo, torch_run: RunReader,
                           ms_run: RunReader
                           ) -> Optional[Tuple[Tuple[RecordInfo, RecordInfo],
                                               Tuple[List[float], List[float]]]]:
    """Each side's previous forward record and this module's input sketch, where both sides
    have them and the previous outputs are float32 of one shape; else None."""
    sketches = t.attrs.get("input_sketch"), m.attrs.get("input_sketch")
    ms_previous = _previous_forward(ms_run, m)
    previous = _previous_forward(torch_run, t, ms_previous and ms_previous.shape), ms_previous
    if None in previous or not all(sketches) or \
            previous[0].shape != previous[1].shape or previous[0].dtype != "float32":
        return None
    return previous, sketches


def activation_cause(t: RecordInfo, m: RecordInfo, torch_run: RunReader,
                     ms_run: RunReader) -> Optional[Diagnosis]:
    """The activations the two sides apply between the previous module and this one, or the
    orders they hand its values on in, when they differ."""
    found = _previous_and_sketches(t, m, torch_run, ms_run)
    if found is None:
        return None
    previous, sketches = found
    distances = [sketch_distances(run.tensor(record), sketch)
                 for run, record, sketch in zip((torch_run, ms_run), previous, sketches)]
    applied = [min(side, key=side.get) for side in distances]
    # each side's activation fits its input, and not the other side's: activations that
    # agree on these values (relu and nothing on non-negative ones) explain no difference
    if any(side[own] > SAME_SKETCH or side[other] <= SAME_SKETCH
           for side, own, other in zip(distances, applied, applied[::-1])):
        return None
    (torch_activation, torch_layout), (ms_activation, ms_layout) = applied
    if torch_activation == ms_activation:
        return Diagnosis(cause="layout between modules differs",
                         detail=f"{t.name}'s input holds {previous[0].name}'s output "
                                f"{tuple(previous[0].shape)} {torch_layout} in torch, "
                                f"{ms_layout} in MindSpore (told from {t.name}'s input on each "
                                "side): the same values in another order, as a transpose before "
                                "a flatten or reshape in the forward makes them; "
                                f"{t.name}'s weights then meet other features.",
                         confidence="likely")
    gelu = " MindSpore's nn.GELU defaults to the tanh form (approximate=True), torch's to the " \
        "exact one." if {name for name, _ in applied} == {GELU_EXACT, GELU_TANH} else ""
    if torch_layout != ms_layout:
        gelu += f" MindSpore also hands it on {ms_layout}, torch {torch_layout}."
    return Diagnosis(cause="activation between modules differs",
                     detail=f"between {previous[0].name} and {t.name}, torch applies "
                            f"{torch_activation}, MindSpore {ms_activation} (told from {t.name}'s "
                            "input on each side): an activation written as a function in the "
                            "forward, or passed as a setting (TransformerEncoderLayer's "
                            f"activation).{gelu}", confidence="likely")


TOKEN_POOLS: Dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "the first token (x[:, 0])": lambda x: x[:, 0],
    "the last token (x[:, -1])": lambda x: x[:, -1],
    "the mean over tokens (x.mean(1))": lambda x: x.mean(1, dtype=np.float64),
    "the mean over the tokens after the first (x[:, 1:].mean(1))":
        lambda x: x[:, 1:].mean(1, dtype=np.float64),
    "the max over tokens (x.max(1))": lambda x: x.max(1),
}


def _token_pools(values: np.ndarray) -> Dict[str, np.ndarray]:
    """Each TOKEN_POOLS pooling of ``values`` (batch, tokens, features), and each two of them
    concatenated along the features (DINOv2's head: its class token and the mean of its
    patches)."""
    pooled = {name: np.asarray(pool(values), np.float32) for name, pool in TOKEN_POOLS.items()}
    pairs = {f"{first} and {second}, concatenated": np.concatenate((a, b), axis=-1)
             for first, a in pooled.items() for second, b in pooled.items()}
    return {**pooled, **pairs}


def pooling_cause(t: RecordInfo, m: RecordInfo, torch_run: RunReader,
                  ms_run: RunReader) -> Optional[Diagnosis]:
    """The tokens each side pools between the previous module, of (batch, tokens, features),
    and this one, where they differ, told from this module's input: ViT's port classifying
    the mean token for torch's class token was "computation between modules differs", as was
    a DINOv2 port reading its class token twice for the class token and the patches' mean."""
    found = _previous_and_sketches(t, m, torch_run, ms_run)
    if found is None or len(found[0][0].shape) != 3:
        return None
    previous, sketches = found
    fits = []
    for run, record, sketch in zip((torch_run, ms_run), previous, sketches):
        distances = {name: sketch_distance(sketch, input_sketch(np.ascontiguousarray(pooled)))
                     for name, pooled in _token_pools(run.tensor(record)).items()}
        fits.append({name for name, distance in distances.items()
                     if distance is not None and distance <= SAME_SKETCH})
    if len(fits[0]) != 1 or len(fits[1]) != 1 or fits[0] == fits[1]:
        return None
    (torch_pool,), (ms_pool,) = fits
    return Diagnosis(cause="pooling between modules differs",
                     detail=f"between {previous[0].name} and {t.name}, torch takes {torch_pool}, "
                            f"MindSpore {ms_pool} (told from {t.name}'s input on each side): "
                            "a class token read where the port averages, or the other way "
                            "round, or the class token averaged with the others where it is "
                            "not.", confidence="likely")

