"""Where each side drops at random, compared point by point.

Both captures run dropout and stochastic depth as identity (the frameworks cannot draw the
same random masks), so a dropping module's output is its input, stored once under both names
(``RunWriter.add`` keeps equal bytes once). The dropping modules and Identity cells whose
outputs are one stored tensor, on either side, joined through the record pairs holding it, act
on one point of the computation, whichever module holds them: torchvision's ViT drops the
attention's output in its encoder block, timm and mindcv in the attention's own ``proj_drop``,
and hold Identity cells where torchvision's dropout is. Each side's rate at a point, 1 − Π(1 −
rate) over its modules there, is compared. Module by module, that ViT ported with torch's
rates failed ("rate differs: torch 0.1, MindSpore 0" at the Identity), and a port without torch's
Dropout(0.2) before its classifier passed, the dropout only listed as unmatched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from parity.compare.structure import drop_rate
from parity.records import DROPPING_OPS, Diagnosis, RecordInfo

SIDES = ("torch", "mindspore")
SIDE_NAMES = {"torch": "torch", "mindspore": "MindSpore"}
ONE_SIDE_ONLY = "dropout on one side only"
UNSEEN = "both captures run dropout as identity, so no number shows it"


@dataclass(frozen=True)
class DropMismatch:
    """A point of the computation each side drops at another rate: each side's dropping
    modules and Identity cells there (none where a side has no module at that point), and the
    rate they come to."""

    torch: Tuple[RecordInfo, ...]
    mindspore: Tuple[RecordInfo, ...]
    rates: Tuple[float, float]

    @property
    def op(self) -> str:
        """stochastic depth where every dropping module at the point is one, else dropout"""
        ops = {r.op for r in self.torch + self.mindspore if r.op in DROPPING_OPS}
        return "droppath" if ops == {"droppath"} else "dropout"

    @property
    def lacking(self) -> Optional[str]:
        """The side with no module at all at the point, if one has none."""
        return next((side for side in SIDES if not getattr(self, side)), None)

    def reason(self) -> str:
        """Why the marked pair fails whatever its numbers."""
        if self.lacking is None:
            return f"{self.op} rate differs: torch {self.rates[0]:g}, MindSpore {self.rates[1]:g}"
        side = "mindspore" if self.lacking == "torch" else "torch"
        return (f"{ONE_SIDE_ONLY}: {SIDE_NAMES[side]} runs {_listed(getattr(self, side))} next to "
                "this module, the other side no dropout")

    def cause(self, t: RecordInfo, m: RecordInfo, torch_step_random: bool = False
              ) -> Diagnosis:
        """The diagnosis where the marked pair ``t``, ``m`` is the first divergence. Where torch
        has no dropping module at the point but its step draws random numbers
        (``torch_step_random``), it likely drops there in its forward: timm's classifier heads
        call ``F.dropout(x, p=self.drop_rate, training=self.training)``, and a timm GhostNet's
        mindcv port, dropping 0.2 in a Dropout cell there, was told "extra Dropout in the port"
        (certain)."""
        module = "DropPath" if self.op == "droppath" else "Dropout"
        port_name = m.name if m.name == t.name else f"{m.name} (torch's {t.name})"
        if self.lacking == "torch" and torch_step_random:
            modules = self.mindspore
            where = "before" if modules[0].order < m.order else "after"
            return Diagnosis(cause=f"{module} in torch's forward, not a module",
                             detail=f"MindSpore runs {_listed(modules)} just {where} {port_name}; "
                                    "torch has no dropping module there, but two torch steps "
                                    "from the same state differ: it likely drops in its forward "
                                    "(F.dropout), which parity cannot run as identity. For the "
                                    "check, build both without it (rate 0), or make torch's an "
                                    "nn.Dropout module; if torch does not drop there, remove the "
                                    "port's.", confidence="likely")
        if self.lacking is None:
            return Diagnosis(cause=f"{module} rate differs",
                             detail=f"torch runs {_listed(self.torch) or 'no dropout'} at "
                                    "this point, MindSpore "
                                    f"{_listed(self.mindspore) or 'no dropout'}; {UNSEEN} but "
                                    "its rate.",
                             confidence="certain")
        side = "mindspore" if self.lacking == "torch" else "torch"
        modules, own = getattr(self, side), (t if side == "torch" else m)
        where = "before" if modules[0].order < own.order else "after"
        rate = self.rates[SIDES.index(side)]
        if side == "torch":
            add = f"a DropPath of rate {rate:g}" if self.op == "droppath" else \
                f"nn.Dropout(p={rate:g})"
            return Diagnosis(cause=f"{module} missing in the port",
                             detail=f"torch runs {_listed(modules)} just {where} {t.name}; "
                                    f"MindSpore runs no dropout {where} {port_name}: add {add} "
                                    f"there ({UNSEEN}).", confidence="certain")
        return Diagnosis(cause=f"extra {module} in the port",
                         detail=f"MindSpore runs {_listed(modules)} just {where} {port_name}; "
                                "torch runs no dropout there: remove it, or build it with rate 0 "
                                f"({UNSEEN}).", confidence="certain")


def _listed(modules: Iterable[RecordInfo]) -> str:
    """The dropping modules among ``modules``, each with its rate (an Identity drops nothing)."""
    dropping = [r for r in modules if r.op in DROPPING_OPS]
    listed = ", ".join(f"{r.name} ({r.op} {drop_rate(r):g})" for r in dropping)
    return listed if len(dropping) < 2 else f"{listed}: {_rate_of(dropping):g} in all"


def drop_mismatches(pairs: Sequence[Tuple[RecordInfo, RecordInfo]],
                    torch_forward: Sequence[RecordInfo], ms_forward: Sequence[RecordInfo]
                    ) -> Dict[str, DropMismatch]:
    """The points each side drops at another rate, by the torch name of the forward pair
    (``pairs``, torch's record first) to fail for each: the first pair holding one of its
    modules, or, where the modules of the point are all unpaired, the pair run next after the
    first of them on its side (the last before it, where none runs after)."""
    points = _Points()
    for t, m in pairs:
        points.join(("torch", t.shard, t.key), ("mindspore", m.shard, m.key))
    at: Dict[Tuple, Dict[str, List[RecordInfo]]] = {}
    for side, records in zip(SIDES, (torch_forward, ms_forward)):
        for record in records:
            if _dropping_or_identity(record):
                point = points.root((side, record.shard, record.key))
                at.setdefault(point, {s: [] for s in SIDES})[side].append(record)
    torch_name = {"torch": {t.name: t.name for t, _ in pairs},
                  "mindspore": {m.name: t.name for t, m in pairs}}
    ordered = {side: sorted(records, key=lambda r: r.order)
               for side, records in zip(SIDES, (torch_forward, ms_forward))}
    # a dropping module paired with a module of another kind, which may drop in its own
    # forward (a functional dropout): the numbers, or the determinism self-check, judge it
    opaque = {(side, r.name) for t, m in pairs for side, r in zip(SIDES, (t, m))
              if _dropping_or_identity(t) != _dropping_or_identity(m)}
    found: Dict[str, DropMismatch] = {}
    for modules in at.values():
        if not any(r.op in DROPPING_OPS for side in SIDES for r in modules[side]) or \
                any((side, r.name) in opaque for side in SIDES for r in modules[side]):
            continue
        rates = tuple(_rate_of(modules[side]) for side in SIDES)
        if None in rates or np.isclose(*rates, rtol=1e-6, atol=0):
            continue
        mismatch = DropMismatch(tuple(modules["torch"]), tuple(modules["mindspore"]), rates)
        marked = next((torch_name[side][r.name] for side in SIDES for r in modules[side]
                       if r.name in torch_name[side]), None)
        if marked is None:
            side = next(side for side in SIDES if modules[side])
            marked = _neighbour(modules[side][0], ordered[side], torch_name[side])
        if marked is not None:
            found.setdefault(marked, mismatch)
    return found


def _dropping_or_identity(record: RecordInfo) -> bool:
    return record.op in DROPPING_OPS or record.op == "identity"


def _rate_of(modules: Sequence[RecordInfo]) -> Optional[float]:
    """1 − Π(1 − rate): the share a sample's value is dropped with, passing them all."""
    rates = [drop_rate(r) for r in modules]
    return None if None in rates else 1.0 - float(np.prod([1.0 - r for r in rates]))


def _neighbour(module: RecordInfo, ordered: Sequence[RecordInfo],
               torch_name: Dict[str, str]) -> Optional[str]:
    """The torch name of the paired record run next after ``module`` on its side, or last
    before it where none runs after."""
    index = next(i for i, r in enumerate(ordered) if r.name == module.name)
    after = (torch_name.get(r.name) for r in ordered[index + 1:])
    before = (torch_name.get(r.name) for r in reversed(ordered[:index]))
    return next((n for n in after if n), None) or next((n for n in before if n), None)


class _Points:
    """Stored tensors joined into points: a union-find over (side, shard, key)."""

    def __init__(self) -> None:
        self._parent: Dict[Tuple, Tuple] = {}

    def root(self, node: Tuple) -> Tuple:
        while self._parent.get(node, node) != node:
            node = self._parent[node]
        return node

    def join(self, a: Tuple, b: Tuple) -> None:
        ra, rb = self.root(a), self.root(b)
        if ra != rb:
            self._parent[ra] = rb
