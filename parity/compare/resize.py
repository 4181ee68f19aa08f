"""How each side resizes a feature map between two modules, where it is written as a function
in a forward (``F.interpolate``, ``ops.interpolate``, ``ops.ResizeBilinearV2``) and so has no
record of its own: SegFormer's decode head resizes each stage's map to the first's and
concatenates them, the last first, for its fusing conv; a U-Net decoder block resizes the map
it is given and concatenates the skip connection; a feature pyramid adds the resized deeper
map to the lateral one.

A module's input is kept as a sketch (parity/sketch.py). Earlier outputs of the forward that
calls it, and those given to it, each resized every way F.interpolate can (and the asymmetric
way MindSpore's ResizeBilinearV2 does by default, half_pixel_centers=False), concatenated
along the channels in some order or two added, are sketched alike; on each side the one
within SAME_SKETCH is what it computed. A resize is a fixed (out, in) interpolation matrix
along each spatial axis, applied in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations, permutations
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from parity.compare import inputs, loss
from parity.compare.functional import ACTIVATIONS, SAME_SKETCH, projections
from parity.records import Comparison, Diagnosis, RecordInfo
from parity.rundir import RunReader
from parity.sketch import input_sketch

# The latest outputs of the calling forward searched for the parts of a module's input.
MAX_PARTS = 6
# A rebuilt input's norm against the recorded one, relative: a fit's lies within float32's sum
# of the squares (3.6e-5 of it over 6.4 million values, functional.sketch_distances), so parts
# whose norms add up farther off are not sketched. Other resizes move the norm more: bilinear
# with align_corners=True for False by 1.6-4.5 % on maps of normal values doubled from 4² to 16²,
# the rest by 12-53 %.
SAME_NORM = 1e-3
# torch's cubic convolution coefficient (upsample_bicubic2d).
CUBIC_A = -0.75


def _linear(source: np.ndarray, n_in: int) -> np.ndarray:
    """Weights (out, in) taking each output position from the two input positions around its
    source coordinate ``source`` (clamped into the input)."""
    source = np.clip(source, 0, n_in - 1)
    low = np.minimum(np.floor(source).astype(int), n_in - 1)
    high = np.minimum(low + 1, n_in - 1)
    weights = np.zeros((source.size, n_in))
    rows = np.arange(source.size)
    np.add.at(weights, (rows, low), 1 - (source - low))
    np.add.at(weights, (rows, high), source - low)
    return weights


def _nearest(n_in: int, n_out: int, offset: float) -> np.ndarray:
    """Each output position taking the input position at floor((dst + offset) · in / out),
    in float32 as torch computes it: at 6 to 9 positions, float64 put 1.5 · 2/3 below 1."""
    scale = np.float32(n_in) / np.float32(n_out)
    source = np.floor((np.arange(n_out, dtype=np.float32) + np.float32(offset)) * scale)
    weights = np.zeros((n_out, n_in))
    weights[np.arange(n_out), np.minimum(source.astype(int), n_in - 1)] = 1
    return weights


def _cubic(source: np.ndarray, n_in: int, a: float = CUBIC_A, border: bool = True,
           table: int = 0) -> np.ndarray:
    """Bicubic taps: the four input positions around ``source``, weighted by the cubic
    convolution of coefficient ``a``; those off the map clamped to its border (torch's
    upsample_bicubic2d), or else dropped and the rest scaled to sum to 1. ``table``: the
    offsets rounded to 1/table first, as a kernel reading its weights from a table does."""
    base = np.floor(source)
    t = source - base
    if table:
        t = np.rint(t * table) / table
    taps = [((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
            ((a + 2) * t - (a + 3)) * t * t + 1,
            ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
            ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a]
    weights = np.zeros((source.size, n_in))
    rows = np.arange(source.size)
    for offset, tap in zip((-1, 0, 1, 2), taps):
        index = base.astype(int) + offset
        if border:
            np.add.at(weights, (rows, np.clip(index, 0, n_in - 1)), tap)
        else:
            on = (index >= 0) & (index < n_in)
            np.add.at(weights, (rows[on], index[on]), tap[on])
    return weights if border else weights / weights.sum(axis=1, keepdims=True)


def _half_pixel(n_in: int, n_out: int) -> np.ndarray:
    return (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5


def _corners(n_in: int, n_out: int) -> np.ndarray:
    return np.arange(n_out) * ((n_in - 1) / (n_out - 1) if n_out > 1 else 0.0)


def _asymmetric(n_in: int, n_out: int) -> np.ndarray:
    return np.arange(n_out) * (n_in / n_out)


# Each way of resizing one axis of n_in positions to n_out: (out, in) weights, by the call
# making it (torch's integer scale factors take the same source coordinates as the sizes they
# give; MindSpore's ops.interpolate takes torch's, but for bicubic: MindSpore 2.8.0's kernel
# reads its weights from a table of 1024 offsets, and without align_corners is Keys' a = -0.5
# with the taps off the map dropped: within 5e-7 of ops.interpolate at sizes 3 to 9, and held
# to it by tests/test_compare_units.py).
# How finely MindSpore's bicubic kernel reads its weights: each offset rounded to 1/CUBIC_TABLE.
CUBIC_TABLE = 1024
ASYMMETRIC = "ops.ResizeBilinearV2() (half_pixel_centers=False, its default)"
RESIZES: Dict[str, Callable[[int, int], np.ndarray]] = {
    "F.interpolate(mode='nearest')": lambda i, o: _nearest(i, o, 0.0),
    "F.interpolate(mode='nearest-exact')": lambda i, o: _nearest(i, o, 0.5),
    "F.interpolate(mode='bilinear', align_corners=False)":
        lambda i, o: _linear(_half_pixel(i, o), i),
    "F.interpolate(mode='bilinear', align_corners=True)": lambda i, o: _linear(_corners(i, o), i),
    ASYMMETRIC: lambda i, o: _linear(_asymmetric(i, o), i),
    "F.interpolate(mode='bicubic', align_corners=False)": lambda i, o: _cubic(_half_pixel(i, o), i),
    "F.interpolate(mode='bicubic', align_corners=True)": lambda i, o: _cubic(_corners(i, o), i),
    "ops.interpolate(mode='bicubic', align_corners=False) (MindSpore's kernel: a = -0.5, the "
    "taps off the map dropped)": lambda i, o: _cubic(_half_pixel(i, o), i, a=-0.5,
                                                     border=False, table=CUBIC_TABLE),
    "ops.interpolate(mode='bicubic', align_corners=True) (MindSpore's kernel: torch's, at "
    "offsets rounded to 1/1024)": lambda i, o: _cubic(_corners(i, o), i, table=CUBIC_TABLE),
}


@dataclass(frozen=True)
class Part:
    """An earlier output read as a feature map (N, C, H, W): ``record``'s values, moved from
    (N, H·W, C) tokens where ``tokens`` (SegFormer's MLP outputs)."""
    record: RecordInfo
    tokens: bool

    def map(self, run: RunReader, size: Tuple[int, int]) -> Optional[np.ndarray]:
        values = run.tensor(self.record).astype(np.float64)
        if not self.tokens:
            return values
        n, length, channels = values.shape
        height = math.isqrt(length * size[0] // size[1]) if size[1] else 0
        if not height or length % height:
            return None
        return values.transpose(0, 2, 1).reshape(n, channels, height, length // height)


@dataclass(frozen=True)
class Fit:
    """An input rebuilt: ``parts`` resized ``how`` to ``size`` and concatenated in this order
    (``added``: added up, as an FPN's top-down path adds the resized deeper map to the
    lateral one)."""
    parts: Tuple[str, ...]
    how: str
    size: Tuple[int, int]
    added: bool = False


def _resized(values: np.ndarray, how: str, size: Tuple[int, int]) -> np.ndarray:
    if values.shape[2:] == size:
        return values                           # every way keeps a map of its own size
    rows, columns = (RESIZES[how](n_in, n_out) for n_in, n_out in zip(values.shape[2:], size))
    return np.einsum("Hh,nchw,Ww->ncHW", rows, values, columns, optimize=True)


def _fits(sketch: Optional[List[float]], batch: int, parts: Dict[str, Part], run: RunReader,
          sizes: Sequence[Tuple[int, int]]) -> List[Fit]:
    """The ways of rebuilding the tensor of this ``sketch`` (of ``batch`` samples) from
    ``parts`` (by name) that it fits: each resize to each of ``sizes``, each set of parts whose
    norms add up to its norm concatenated in each order, and each two of one shape added."""
    if not sketch or not sketch[0]:
        return []
    norm, *recorded = sketch

    def fits(values: np.ndarray) -> bool:
        sketched = projections(ACTIVATIONS["nothing"], values)[:len(recorded)]
        return bool(np.abs(sketched - recorded).max() <= SAME_SKETCH * norm)

    found = []
    for size in sizes:
        maps = {name: part.map(run, size) for name, part in parts.items()}
        if all(values is None or values.shape[2:] == size for values in maps.values()):
            continue                            # nothing to resize: every way is the same
        for how in RESIZES:
            resized = {name: _resized(values, how, size) for name, values in maps.items()
                       if values is not None and values.shape[0] == batch}
            squares = {name: float(np.sum(values ** 2)) for name, values in resized.items()}
            sets = [s for count in range(1, len(resized) + 1) for s in combinations(resized, count)]
            found += [Fit(ordered, how, size) for chosen in sets
                      if abs(math.sqrt(sum(squares[n] for n in chosen)) - norm) <= SAME_NORM * norm
                      for ordered in permutations(chosen)
                      if fits(np.concatenate([resized[n] for n in ordered], 1))]
            found += [Fit(pair, how, size, added=True) for pair in combinations(resized, 2)
                      if resized[pair[0]].shape == resized[pair[1]].shape
                      and fits(resized[pair[0]] + resized[pair[1]])]
    return found


def _parts(t: RecordInfo, caller: str, torch_run: RunReader) -> Dict[str, Part]:
    """The latest MAX_PARTS outputs module ``caller``'s forward made before ``t``, outermost (a
    module's, not its last part's, which is the same tensor), and the outputs given to that
    forward as its inputs: 4-D maps of ``t``'s batch, or 3-D tokens."""

    def part_like(r: RecordInfo) -> bool:
        return r.kind == "forward" and r.dtype == "float32" and len(r.shape) in (3, 4) \
            and r.shape[0] == t.shape[0] and r.part is None

    within = [r for r in torch_run.records if part_like(r) and r.order < t.order
              and (not caller or r.name.startswith(f"{caller}."))]
    names = {r.name for r in within}
    outermost = [r for r in within
                 if not any(r.name.startswith(f"{other}.") for other in names)]
    latest = sorted(outermost, key=lambda r: -r.order)[:MAX_PARTS]
    return {r.name: Part(r, len(r.shape) == 3)
            for r in [*latest, *_given_to(caller, part_like, torch_run)]}


def _given_to(caller: str, part_like: Callable[[RecordInfo], bool],
              run: RunReader) -> List[RecordInfo]:
    """The earlier outputs given to module ``caller``'s forward as its inputs, told by their
    sketches (a U-Net decoder block's deeper map and skip connection, resized and concatenated
    in it: segmentation_models_pytorch's DecoderBlock)."""
    holder = run.record(caller, "forward") if caller else None
    if holder is None:
        return []
    given = [holder.attrs.get("input_sketch"),
             *(other.get("values") for other in holder.attrs.get("other_inputs", {}).values())]
    sources = (inputs.output_sketched(sketch, holder, run) for sketch in given)
    return [r for r in sources if r is not None and part_like(r)
            and not r.name.startswith(f"{caller}.")]


def resize_cause(t: RecordInfo, m: RecordInfo, torch_run: RunReader, ms_run: RunReader,
                 comparisons: Sequence[Comparison], where: str) -> Optional[Diagnosis]:
    """Where torch's input to ``t`` is earlier outputs resized and concatenated or added (in
    ``where``): how MindSpore's input to ``m`` is made of their counterparts, where otherwise.
    None where torch's input is no such resize, or MindSpore's is made the same way."""
    if len(t.shape) != 4:
        return None
    return _resized_otherwise(
        "resize between modules differs", f"{m.name}'s input",
        (t.attrs.get("input_sketch"), m.attrs.get("input_sketch")), t,
        _parts(t, inputs.caller(t.name, torch_run), torch_run), torch_run, ms_run, comparisons,
        where)


def resized_in_its_forward(t: RecordInfo, m: RecordInfo, torch_run: RunReader,
                           ms_run: RunReader, comparisons: Sequence[Comparison]
                           ) -> Optional[Diagnosis]:
    """Where torch's output of ``t`` is outputs of modules it runs resized (and concatenated
    or added) after them in its forward (a decoder's upsampling module returning
    F.interpolate(self.conv(x), scale_factor=2)): how MindSpore's ``m`` makes its own, where
    otherwise. Was "module computes something different" (a guess)."""
    if len(t.shape) != 4 or len(m.shape) != 4:
        return None
    module = t.name.partition("#")[0]
    return _resized_otherwise(
        "resize in the module's forward differs", f"{m.name}'s output",
        (input_sketch(torch_run.tensor(t)), input_sketch(ms_run.tensor(m))), t,
        _parts(t, module, torch_run), torch_run, ms_run, comparisons, f"{module}'s forward")


def _resized_otherwise(cause: str, what: str, sketches: Tuple[Optional[List[float]], ...],
                       t: RecordInfo, parts: Dict[str, Part], torch_run: RunReader,
                       ms_run: RunReader, comparisons: Sequence[Comparison], where: str
                       ) -> Optional[Diagnosis]:
    """``what`` (of torch's ``t``), whose torch and MindSpore ``sketches`` are given, told as
    ``parts`` resized one way in torch and another in MindSpore, in ``where``: ``cause``; None
    where torch's fits no resize of them, or MindSpore's fits torch's."""
    batch = t.shape[0]
    sizes = sorted({tuple(t.shape[2:]), *(tuple(p.record.shape[2:]) for p in parts.values()
                                          if not p.tokens)}, key=lambda s: -s[0] * s[1])
    torch_fits = _fits(sketches[0], batch, parts, torch_run, sizes)
    if not torch_fits:
        return None
    fit = torch_fits[0]
    if all(parts[name].map(torch_run, fit.size).shape[2:] == fit.size for name in fit.parts):
        return None                             # nothing resized: a concatenation alone
    counterparts = {c.name: c.mindspore_name for c in comparisons if c.kind == "forward"}
    ms_parts: Dict[str, Part] = {}
    for name in fit.parts:
        record = ms_run.record(counterparts.get(name, ""), "forward")
        if record is None or tuple(record.shape) != tuple(parts[name].record.shape):
            return None
        ms_parts[name] = Part(record, parts[name].tokens)
    torch_ways = [other.how for other in torch_fits
                  if (other.parts, other.added) == (fit.parts, fit.added)]
    ms_fits = _fits(sketches[1], batch, ms_parts, ms_run, [fit.size])
    if any(other.how in torch_ways for other in ms_fits):
        return None                             # resized alike (concatenated in another order)
    ways = f"{' or '.join(torch_ways)} does{' (alike here)' if len(torch_ways) > 1 else ''}"
    size = f"{fit.size[0]}×{fit.size[1]}"
    owned = [f"{name}'s" for name in fit.parts]
    owners = " and ".join([", ".join(owned[:-1]), owned[-1]] if len(owned) > 1 else owned)
    torch_said = f"torch resizes {owners} output to {size} as {ways}" if len(fit.parts) == 1 \
        else f"torch adds {owners} outputs, resized to {size} as {ways}" if fit.added \
        else f"torch concatenates {owners} outputs, in that order, resized to {size} as {ways}"
    if ms_fits:
        order = "" if ms_fits[0].parts == fit.parts or fit.added else \
            f", concatenated as {', '.join(ms_fits[0].parts)}"
        ms_said = f"MindSpore as {ms_fits[0].how} does{order}"
    else:
        ms_said = (f"MindSpore's fits none of the {len(RESIZES) - len(torch_ways)} other "
                   f"resizes tried ({'; '.join(h for h in RESIZES if h not in torch_ways)}): "
                   "a kernel of its own")
    return Diagnosis(cause=cause,
                     detail=f"{what}: {torch_said}; {ms_said}, in {where}: a resize written "
                            "as a function there records nothing of its own.",
                     confidence="certain" if ms_fits else "likely")


def resized_before_the_loss(torch_run: RunReader, ms_run: RunReader) -> Optional[Diagnosis]:
    """Where each side's loss (parity's default cross entropy) is that of its last module's
    output resized to its labels' height and width, after that module in the forward (as
    torchvision's segmentation models resize their logits to the image), and the two resize
    otherwise. Was "loss function differs" (MindSpore/torch = 1.0009 for align_corners=True
    against False on tests/tiny.py's upsampled_logits)."""
    labels = torch_run.record("target", "input")
    if not loss.default_losses(torch_run, ms_run) or labels is None or len(labels.shape) != 3:
        return None
    y = np.asarray(torch_run.tensor(labels)).astype(np.int64).reshape(-1)
    size = tuple(labels.shape[1:])
    smoothing = float(torch_run.manifest.get("config", {}).get("label_smoothing", 0.0))
    ways: List[List[str]] = []
    lasts: List[str] = []
    for run in (torch_run, ms_run):
        gradient, value = loss.output_gradient(run), run.record("loss", "loss")
        last = None if gradient is None else run.record(gradient.name, "forward")
        if last is None or value is None or len(last.shape) != 4 or \
                last.shape[0] != labels.shape[0] or tuple(last.shape[2:]) == size:
            return None
        own, logits = loss.loss_value(run, value), run.tensor(last).astype(np.float64)
        ways.append([how for how in RESIZES if loss.is_cross_entropy(own, loss.cross_entropy(
            np.moveaxis(_resized(logits, how, size), 1, -1).reshape(-1, last.shape[1]), y,
            smoothing))])
        lasts.append(last.name)
    torch_ways, ms_ways = ways
    if not torch_ways or set(torch_ways) & set(ms_ways):
        return None
    ms_said = f"MindSpore's as {' or '.join(ms_ways)} does" if ms_ways else \
        "MindSpore's fits none of the others tried: a kernel of its own"
    return Diagnosis(
        cause="resize between modules differs",
        detail=f"every module output matches, {lasts[0]}'s, the last before the loss, too; each "
               f"side's loss is the cross entropy of that output resized to the labels' "
               f"{size[0]}×{size[1]} after it in the forward: torch's as "
               f"{' or '.join(torch_ways)} does, {ms_said}.",
        confidence="certain" if ms_ways else "likely")
