"""A module's inputs, told apart from the sketches the captures took as they entered
(parity/sketch.py): its first one, and its second and later ones (an attention or padding mask,
a skip connection, a decoder's memory). Where one already differs, the difference was made
before the module ran, in the forward of the outermost enclosing module given it so. A first
input's sketch also tells which module's output it is (fed_by, taken_by).

A mask is compared by the positions it masks out, whatever its form: torch's
TransformerEncoderLayer hands its attention an additive float mask (-inf where masked) made
from the boolean one it was given, MindSpore's hands on the boolean itself, and both mask the
same positions. Those positions' sketch holds whole numbers, so two masks are the same, or one
is the other inverted, exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple

import numpy as np

from parity.compare import reorder
from parity.records import Diagnosis, RecordInfo
from parity.rundir import RunReader
from parity.sketch import input_sketch, sketch_distance

Sketch = Dict[str, Any]
# A module's first input is an earlier module's output where their sketches lie within this
# share of its norm (the same tensor: 0), looked for among this many records before it.
FED_BY, FED_BY_SEARCHED = 1e-6, 256


def first_input_difference(t: RecordInfo, m: RecordInfo) -> Optional[float]:
    """How far the module's first input on the MindSpore side is from torch's, relative to its
    norm; None when either side has no sketch of it (an integer input, a capture from before
    the sketches). Where one side holds the module's output in another layout
    (RecordInfo.transposed), its input is so too, and the sketches' projections, of the values
    in their order, cannot be compared (mindcv's ConvNeXtV2 GELU, channels last, was told
    "input in another order"): how far apart their norms and sums of magnitudes are, which no
    reordering moves, stands for it (the norms' alone bound the distance from below)."""
    if t.axes is not None or m.axes is not None:
        return reorder.sums_difference(t, m)
    return sketch_distance(t.attrs.get("input_sketch"), m.attrs.get("input_sketch"))


def _parent(name: str) -> str:
    return name.rpartition(".")[0]


def caller(name: str, run: RunReader) -> str:
    """The module whose forward calls module ``name`` of ``run``: its parent, or the model
    (""); its grandparent where the parent is a list of modules, which has no forward (a
    numbered module whose parent records nothing: a ModuleList, a CellList). Whisper's encoder
    ported without its positions was told of "whisper.model.encoder.layers's forward"."""
    parent = _parent(name)
    if parent and name.rpartition(".")[2].isdigit() and run.record(parent, "forward") is None:
        parent = _parent(parent)
    return parent


def forward_holding(name: str, run: RunReader) -> str:
    """The forward that calls module ``name`` of ``run`` (``caller``), named."""
    parent = caller(name, run)
    return f"{parent}'s forward" if parent else "the model's own forward"


def given_torch_alone(t: RecordInfo, m: RecordInfo) -> List[str]:
    """Torch's float and boolean inputs of a module past its first that MindSpore's is given
    none of (of that shape), as "name (dtype, shape)": a mask or a position bias the port builds
    in the cell itself (Hugging Face's BLOOM hands each attention its ALiBi bias)."""
    paired = {t_key for t_key, _ in compared_inputs(t, m)}
    given = [m.attrs.get("input_sketch"), *(sketch["values"] for sketch in
                                            (m.attrs.get("other_inputs") or {}).values())]
    return [f"{key} ({sketch['dtype']}, {tuple(sketch['shape'])})"
            for key, sketch in (t.attrs.get("other_inputs") or {}).items()
            if key not in paired and sketch["dtype"].startswith(("float", "bool"))
            and not any(same_values(sketch["values"], other) for other in given)]


def same_values(sketch: Optional[List[float]], other: Optional[List[float]],
                within: float = FED_BY) -> bool:
    """Whether two sketches are of the same values, to ``within`` of the first's norm (an
    input passed by keyword on one side and by position on the other)."""
    distance = sketch_distance(sketch, other)
    return distance is not None and distance <= within


def outermost(t: RecordInfo, m: RecordInfo, torch_run: RunReader, ms_run: RunReader,
              holds: Callable[[RecordInfo, RecordInfo], bool]) -> Tuple[RecordInfo, RecordInfo]:
    """The outermost of the pair ``t``, ``m`` and their enclosing modules' pairs for which
    ``holds``, going up while it does."""
    while "." in t.name:
        parents = (torch_run.record(_parent(t.name), "forward"),
                   ms_run.record(_parent(m.name), "forward"))
        if None in parents or not holds(*parents):
            break
        t, m = parents
    return t, m


def outermost_fed(t: RecordInfo, m: RecordInfo, torch_run: RunReader, ms_run: RunReader,
                  floor: float) -> RecordInfo:
    """The outermost of ``t`` and its enclosing modules whose first input already differs by
    more than ``floor``: the computation that feeds it is in that module's parent. A pre-norm
    block's first LayerNorm takes the block's own input, which the model's forward made (a class
    token put last instead of first was blamed on the block's forward)."""
    def fed(a: RecordInfo, b: RecordInfo) -> bool:
        difference = first_input_difference(a, b)
        return difference is not None and difference > floor
    return outermost(t, m, torch_run, ms_run, fed)[0]


@dataclass(frozen=True)
class InputDifference:
    """One input given differently to a module on the two sides."""
    torch_key: str          # "1", "2" by position, else its keyword
    ms_key: str
    cause: str              # "mask inverted", "mask differs", "other input differs"
    detail: str


def compared_inputs(t: RecordInfo, m: RecordInfo) -> List[Tuple[str, str]]:
    """The pairs of second and later inputs that can be compared: by keyword or position where
    both sides name it so, then the rest in order (a mask passed by keyword on one side and by
    position on the other); of the same shape (a mask broadcast another way is not)."""
    t_others, m_others = t.attrs.get("other_inputs") or {}, m.attrs.get("other_inputs") or {}
    shared = [(key, key) for key in t_others if key in m_others]
    rest = zip([key for key in t_others if key not in m_others],
               [key for key in m_others if key not in t_others])
    return [(t_key, m_key) for t_key, m_key in [*shared, *rest]
            if list(t_others[t_key]["shape"]) == list(m_others[m_key]["shape"])]


def _count(sketch: List[float]) -> int:
    return int(sketch[0])


def _same_positions(a: List[float], b: List[float]) -> bool:
    """Whether two sketches of masked positions ([count, projections], whole numbers) are
    of the same positions."""
    return bool(np.array_equal(a, b))


def _masking(sketch: Sketch) -> str:
    if sketch["dtype"] == "bool":
        return "a bool mask (True masks out)"
    return f"an additive {sketch['dtype']} mask (-inf masks out)"


def _forms(a: Sketch, b: Sketch) -> str:
    if _masking(a) == _masking(b):
        return f"each side's is {_masking(a)}"
    return f"torch's is {_masking(a)}, MindSpore's {_masking(b)}"


def _mask_difference(a: Sketch, b: Sketch) -> Optional[Tuple[str, str]]:
    """How MindSpore's mask ``b`` differs from torch's ``a`` in the positions they mask out,
    as (cause, detail); None when they mask out the same ones."""
    size = int(np.prod(a["shape"]))
    if _same_positions(a["masked"], b["masked"]):
        return None
    forms = _forms(a, b)
    everything = input_sketch(np.ones(size, np.float32))
    kept_by_a = [size - a["masked"][0],
                 *np.subtract(everything[1:len(a["masked"])], a["masked"][1:])]
    if _same_positions(kept_by_a, b["masked"]):
        return "mask inverted", (f"is inverted: MindSpore masks out the {_count(b['masked'])} of "
                                 f"{size} positions torch keeps, and keeps the "
                                 f"{_count(a['masked'])} it masks out ({forms})")
    return "mask differs", (f"masks out other positions: torch {_count(a['masked'])} of {size}, "
                            f"MindSpore {_count(b['masked'])} ({forms})")


def input_differences(t: RecordInfo, m: RecordInfo, floor: float) -> List[InputDifference]:
    """The second and later inputs given differently to the module on the two sides: masks
    masking out other positions, other inputs whose values differ by more than ``floor`` of
    their norm."""
    found = []
    for t_key, m_key in compared_inputs(t, m):
        a, b = t.attrs["other_inputs"][t_key], m.attrs["other_inputs"][m_key]
        is_mask = a["masked"] is not None and b["masked"] is not None and \
            ("bool" in (a["dtype"], b["dtype"]) or a["masked"][0] or b["masked"][0])
        difference = _mask_difference(a, b) if is_mask else None
        if difference is None and "bool" not in (a["dtype"], b["dtype"]) and \
                a["values"] and b["values"] and a["values"][0]:   # what float masks add too
            distance = float(np.max(np.abs(np.subtract(a["values"], b["values"])))) / \
                a["values"][0]
            difference = None if distance <= floor else (
                "other input differs", f"differs by {distance:.2g} of its norm")
        if difference is not None:
            found.append(InputDifference(t_key, m_key, *difference))
    return found


def input_name(key: str) -> str:
    return f"input {int(key) + 1}" if key.isdigit() else key


def other_input_cause(t: RecordInfo, m: RecordInfo, torch_run: RunReader, ms_run: RunReader,
                      floor: float) -> Optional[Diagnosis]:
    """A module whose first input matched and whose output is the first to diverge, given
    another of its inputs differently; placed at the outermost enclosing module given one
    differently too (a padding mask handed down from the model's forward)."""
    differences = input_differences(t, m, floor)
    if not differences:
        return None
    first = differences[0]

    def given_alike(a: RecordInfo, b: RecordInfo) -> bool:
        given = input_differences(a, b, floor)
        return bool(given) and given[0].cause == first.cause
    outer, outer_ms = outermost(t, m, torch_run, ms_run, given_alike)
    given_first = input_differences(outer, outer_ms, floor)[0]
    which = input_name(first.torch_key) if first.torch_key == first.ms_key else \
        f"{input_name(first.torch_key)} (MindSpore's {input_name(first.ms_key)})"
    maker = forward_holding(outer.name, torch_run)
    where = f" It is made in {maker}." if outer is t else \
        f" {outer.name} is already given its {input_name(given_first.torch_key)} so: the " \
        f"difference is made in {maker}."
    sources = [given_as(record.attrs["other_inputs"][key]["values"], record, run)
               for record, key, run in ((t, first.torch_key, torch_run),
                                        (m, first.ms_key, ms_run))]
    if outer is t and None not in sources and sources[0] != sources[1]:
        where += f" Torch's is {sources[0]}, MindSpore's {sources[1]}."
    return Diagnosis(cause=first.cause,
                     detail=f"{m.name}'s first input matched torch's, but its {which} "
                            f"{first.detail}.{where}", confidence="likely")


def given_as(sketch: Optional[List[float]], record: RecordInfo, run: RunReader) -> Optional[str]:
    """What a further input of ``record`` is, told by its ``sketch``: the first input of a module
    enclosing it, or the output of one of the PARTS_SEARCHED latest modules before it. A BLOOM
    port passing its attention the normed input as the residual (torch's
    apply_residual_connection_post_layernorm, False) was told only that input 2 differs."""
    if not sketch or not sketch[0]:
        return None
    name = record.name.partition("#")[0]
    while "." in name:
        name = _parent(name)
        holder = run.record(name, "forward")
        if holder is not None and same_values(holder.attrs.get("input_sketch"), sketch):
            return f"{name}'s input"
    return next((f"{source.name}'s output" for source in latest_outputs(record, run)
                 if same_values(input_sketch(run.tensor(source)), sketch)), None)


def fed_by(record: RecordInfo, run: RunReader) -> Optional[RecordInfo]:
    """The latest forward record of ``run`` before ``record`` whose output is ``record``'s
    first input, told by the input's sketch (to 10⁻⁶ of its norm), among the FED_BY_SEARCHED
    before it; None if none is."""
    return output_sketched(record.attrs.get("input_sketch"), record, run)


def output_sketched(sketch: Optional[List[float]], before: RecordInfo,
                    run: RunReader) -> Optional[RecordInfo]:
    """The latest forward record of ``run`` before ``before`` whose output is of this
    ``sketch`` (to FED_BY of its norm), among the FED_BY_SEARCHED before it; None if none is."""
    if not sketch:
        return None
    earlier = [r for r in run.records if r.kind == "forward" and r.order < before.order
               and r.part is None]
    return next((candidate for candidate in sorted(earlier, key=lambda r: -r.order)
                 [:FED_BY_SEARCHED] if same_values(sketch, input_sketch(run.tensor(candidate)))),
                None)


class Added(NamedTuple):
    """A tensor one side adds to a module's first input and the other does not."""

    side: str           # "MindSpore" or "torch": the side adding it
    what: str           # the tensor, in words
    apart: float        # how far the inputs' projections' difference is from its, per norm
    table: bool         # a parameter or buffer (a position table), not a module's input or output


class PartTaken(NamedTuple):
    """A module's first input as a part of an earlier module's output: of ``count`` equal parts
    along ``axis``, the ``index``-th, its last two axes swapped where ``swapped``."""

    source: str
    axis: int
    count: int
    index: int
    swapped: bool


# how many equal parts an output is looked at as (a fused gate and up projection, q, k and v)
PART_COUNTS = (2, 3, 4)
# the latest outputs before a module looked in for its input
PARTS_SEARCHED = 8


def latest_outputs(record: RecordInfo, run: RunReader) -> List[RecordInfo]:
    """The PARTS_SEARCHED latest float32 module outputs of ``run`` before ``record``, the
    latest first."""
    return sorted((r for r in run.records if r.kind == "forward" and r.part is None
                   and r.order < record.order and r.dtype == "float32"),
                  key=lambda r: -r.order)[:PARTS_SEARCHED]


def part_taken(record: RecordInfo, run: RunReader) -> Optional[PartTaken]:
    """The part of one of the PARTS_SEARCHED latest outputs before ``record`` that is its first
    input, told by the input's sketch (to FED_BY of its norm); None where none is."""
    sketch = record.attrs.get("input_sketch")
    if not sketch:
        return None
    for source in latest_outputs(record, run):
        value = run.tensor(source)
        for taken in parts_of(source, value):
            if is_part_input(value, taken, record):
                return taken
    return None


def parts_of(source: RecordInfo, value: np.ndarray) -> Iterator[PartTaken]:
    """Each way part_taken looks at ``source``'s output as parts."""
    for axis in range(1, value.ndim):
        for count in PART_COUNTS:
            if value.shape[axis] % count == 0 and value.shape[axis] > count:
                for index in range(count):
                    # tokens by channels held as channels by tokens (Mamba's conv input)
                    for swapped in (False, True) if value.ndim == 3 else (False,):
                        yield PartTaken(source.name, axis, count, index, swapped)


def is_part_input(value: np.ndarray, taken: PartTaken, record: RecordInfo) -> bool:
    """Whether the part ``taken`` of ``value`` is ``record``'s first input, by its sketch."""
    size = value.shape[taken.axis] // taken.count
    part = np.take(value, range(taken.index * size, (taken.index + 1) * size), axis=taken.axis)
    part = np.ascontiguousarray(np.swapaxes(part, -1, -2) if taken.swapped else part)
    return _taken_as_first_input(input_sketch(part), record)


def scale_of_input(t: RecordInfo, m: RecordInfo, within: float) -> Optional[float]:
    """k (not 1) where the module's first input on the MindSpore side is torch's times k: each
    number of its sketch, norm and projections, is torch's times k, to ``within`` of its norm,
    and k explains the difference: k is 10⁻³ or more from 1, or the sketches lie ten times
    closer scaled than as they are. Gemma's model multiplies its embeddings by √width before
    its first layer: a port leaving that out was told "computation between modules differs";
    RecurrentGemma's by √width rounded to bfloat16, 1.07·10⁻⁴ from float32's."""
    a, b = t.attrs.get("input_sketch"), m.attrs.get("input_sketch")
    if not a or not b or not a[0] or not b[0]:
        return None
    count = min(len(a), len(b))
    torch_sketch, ms_sketch = np.array(a[1:count]), np.array(b[1:count])
    scale = b[0] / a[0] * (1.0 if np.dot(torch_sketch, ms_sketch) >= 0 else -1.0)
    scaled = np.abs(ms_sketch - scale * torch_sketch).max()
    if scale == 1 or scaled > within * b[0] or (
            abs(scale - 1) <= 1e-3 and np.abs(ms_sketch - torch_sketch).max() < 10 * scaled):
        return None
    return scale


def bfloat16_constant(scale: float, run: RunReader) -> Optional[Tuple[str, float, float]]:
    """(name, value, the value it rounds) of a one-value buffer of torch's kept in bfloat16
    (widened to float32 in the capture) that is a value rounded to bfloat16 whose unrounded
    value is the buffer's times ``scale`` or over it: the constant one side scales by in
    bfloat16, the other in float32."""
    for record in run.records:
        if record.kind != "buffer" or record.attrs.get("widened_from") != "bfloat16" or \
                int(np.prod(record.shape)) != 1:
            continue
        value = float(np.asarray(run.tensor(record)).reshape(-1)[0])
        for unrounded in (value * scale, value / scale):
            if value != unrounded and _bfloat16(unrounded) == value:
                return record.name, value, unrounded
    return None


def _bfloat16(value: float) -> float:
    """``value`` rounded to bfloat16 (to nearest, ties to even), as float."""
    bits = int(np.array(value, np.float32).view(np.uint32))
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return float(np.array(bits, np.uint32).view(np.float32))


def added_to_input(t: RecordInfo, m: RecordInfo, torch_run: RunReader, ms_run: RunReader,
                   within: float) -> Optional[Added]:
    """The tensor one side adds to the module's first input, where that input is the other's
    plus the input of the module whose forward runs it, the output of a module run before it
    there (the FED_BY_SEARCHED latest), or a parameter broadcast: the projections are sums, so
    the difference of the two inputs' projections is that tensor's, to ``within`` of the
    input's norm. GPT-NeoX's layer adds attention and MLP to its input in parallel; a port
    adding the attention's output first hands the MLP's norm x + attention(x), and was told
    "computation between modules differs", as were a ResNet block whose port leaves out its
    identity and a Whisper encoder whose port leaves out its positions."""
    return _added(t.attrs.get("input_sketch"), m.attrs.get("input_sketch"),
                  {"torch": _tensors_before(t, torch_run), "MindSpore": _tensors_before(m, ms_run)},
                  within)


def added_to_output(t: RecordInfo, m: RecordInfo, torch_run: RunReader, ms_run: RunReader,
                    within: float) -> Optional[Added]:
    """The parameter of its own one side adds to a module's output, where that output is the
    other's plus it, broadcast, as inputs.added_to_input tells it. ViT's embeddings add their
    position table after their last module (the patch embedding): a port leaving it out was
    told "module computes something different" (a guess)."""
    return _added(input_sketch(torch_run.tensor(t)), input_sketch(ms_run.tensor(m)),
                  {"torch": _tables_sketched(t, torch_run, own=True),
                   "MindSpore": _tables_sketched(m, ms_run, own=True)},
                  within)


def _added(a: Optional[List[float]], b: Optional[List[float]],
           candidates: Dict[str, Iterator[Tuple[str, Optional[List[float]], bool]]],
           within: float) -> Optional[Added]:
    """The candidate (what, sketch, whether a parameter) of either side ("torch",
    "MindSpore") whose projections are those of that side's tensor (sketch ``a`` for torch,
    ``b`` for MindSpore) less the other's, to ``within`` of torch's norm."""
    if not a or not b or len(a) != len(b) or not a[0]:
        return None
    gap = np.subtract(b[1:], a[1:])
    for side, sign in (("MindSpore", 1), ("torch", -1)):
        for what, added, table in candidates[side]:
            if added is None:
                continue
            apart = float(np.abs(sign * gap - added[1:len(a)]).max()) / a[0]
            if apart <= within:
                return Added(side, what, apart, table)
    return None


def _tensors_before(record: RecordInfo, run: RunReader
                    ) -> Iterator[Tuple[str, Optional[List[float]], bool]]:
    """(what it is, its sketch, whether a parameter) of the input of the module whose forward
    runs ``record``, then of the outputs run before ``record`` inside that forward, the latest
    first, then of the parameters a forward may add as they are (position tables)."""
    inside = _parent(record.name.partition("#")[0])
    holder = run.record(inside, "forward") if inside else None
    if holder is not None:
        yield f"{inside}'s input", holder.attrs.get("input_sketch"), False
    earlier = sorted((r for r in run.records if r.kind == "forward" and r.part is None
                      and r.order < record.order and r.dtype == "float32"
                      and r.name.startswith(f"{inside}." if inside else "")),
                     key=lambda r: -r.order)[:FED_BY_SEARCHED]
    for candidate in earlier:
        yield f"{candidate.name}'s output", input_sketch(run.tensor(candidate)), False
    yield from _tables_sketched(record, run)


def _tables_sketched(record: RecordInfo, run: RunReader, own: bool = False
                     ) -> Iterator[Tuple[str, Optional[List[float]], bool]]:
    """(what it is, its sketch, True) of each of ``tables``."""
    for name, table in tables(record, run, own):
        yield name, input_sketch(np.ascontiguousarray(table, np.float32)), True


def tables(record: RecordInfo, run: RunReader, own: bool = False
           ) -> Iterator[Tuple[str, np.ndarray]]:
    """(what it is, its values) of each float32 parameter or buffer (a frozen parameter is
    recorded as one) of two axes or more broadcast to ``record``'s output shape, as it was
    before the step (its weight less its update), or, ``own``, those of ``record``'s module: a
    position table a forward adds to its input (Whisper's frozen ``embed_positions.weight``,
    timm's ``pos_embed``), which no module's output holds."""
    inside = f"{record.name.partition('#')[0]}." if own else ""
    shape = tuple(record.shape)
    updates = {r.name: r for r in run.records if r.kind == "update"}
    for weight in run.records:
        if weight.kind not in ("weight", "buffer") or not weight.name.startswith(inside) or \
                weight.dtype != "float32" or \
                not 2 <= len(weight.shape) <= len(shape) or \
                any(w not in (1, s) for w, s in zip(weight.shape[::-1], shape[::-1])):
            continue
        value = np.asarray(run.tensor(weight), np.float64)
        if weight.name in updates:
            value = value - run.tensor(updates[weight.name])
        yield f"{weight.name} (broadcast to {shape})", np.broadcast_to(value, shape)


def feeds(source: RecordInfo, record: RecordInfo, run: RunReader) -> bool:
    """Whether ``source``'s output is ``record``'s first input, by its sketch."""
    return _taken_as_first_input(input_sketch(run.tensor(source)), record)


def feeds_a_later_module(source: RecordInfo, run: RunReader) -> bool:
    """Whether a module run after ``source`` takes its output as its first input."""
    return bool(fed_later(source, run))


def fed_later(source: RecordInfo, run: RunReader) -> List[str]:
    """The modules run after ``source`` that take its output as their first input (or an
    output equal to it: two norms at their initial weights)."""
    return [r.name for r in _taking(input_sketch(run.tensor(source)), run, FED_BY)
            if r.order > source.order]


def taken_by(array: np.ndarray, run: RunReader, up_to: RecordInfo,
             within: float) -> Optional[RecordInfo]:
    """The latest forward record of ``run`` up to ``up_to`` (itself included) whose first input
    is ``array``, its sketch within ``within`` of its norm; None if none is."""
    return next((r for r in _taking(input_sketch(np.asarray(array, np.float32)), run, within)
                 if r.order <= up_to.order and r.part is None), None)


def _taking(sketch: Optional[List[float]], run: RunReader, within: float) -> List[RecordInfo]:
    """The forward records of ``run`` whose first input's sketch lies within ``within`` of
    ``sketch`` (relative to its norm), the latest first."""
    return sorted((r for r in run.records if r.kind == "forward"
                   and _taken_as_first_input(sketch, r, within)), key=lambda r: -r.order)


def _taken_as_first_input(sketch: Optional[List[float]], record: RecordInfo,
                          within: float = FED_BY) -> bool:
    return same_values(record.attrs.get("input_sketch"), sketch, within)
