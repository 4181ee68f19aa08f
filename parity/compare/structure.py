"""What one random-init step's numbers may not show, checked on the records' settings.

ReLU in place of ReLU6 agrees wherever no input exceeds 6 (none did in MobileNetV2 at batch 2,
64²), and dropout runs as identity in both captures (the frameworks' random masks cannot match),
so its output always agrees whatever its rate.
"""

from __future__ import annotations

import re
from typing import Dict, Optional, Tuple

import numpy as np

from parity.align import GENERIC_OP
from parity.records import DROPPING_OPS, RECURRENT_OPS, RecordInfo, dropping_for_identity

# Op types that only move or select data: modules differing in these are not flagged.
STRUCTURAL_OPS = {"module", "sequential", "list", "flatten", "identity", "dropout", "droppath"}


def _rate_in(attrs: Dict) -> Optional[float]:
    """A dropout module's rate: torch's ``p``; MindSpore's ``p``, or 1 − ``keep_prob`` where
    ``p`` is unset (``nn.Dropout(0.2)`` keeps 20 %: its first argument is keep_prob); a
    DropPath's ``drop_prob`` (timm), or 1 − ``keep_prob`` (mindcv); a recurrent layer's
    ``dropout`` between its stacked layers."""
    for key, rate in (("p", lambda v: v), ("drop_prob", lambda v: v),
                      ("keep_prob", lambda v: 1 - v), ("dropout", lambda v: v)):
        if isinstance(attrs.get(key), (int, float)):
            return float(rate(attrs[key]))
    return None


def dropping_op(t: RecordInfo, m: RecordInfo) -> Optional[str]:
    """The dropping op (dropout, stochastic depth, a recurrent layer's dropout between layers)
    a pair is of: both sides', or one side's where the other is an Identity, a rate of 0 as
    timm and mindcv write it (``DropPath(p) if p > 0 else Identity()``)."""
    if t.op == m.op:
        return t.op if t.op in DROPPING_OPS + RECURRENT_OPS else None
    return dropping_for_identity(t.op, m.op)


def drop_rate(record: RecordInfo) -> Optional[float]:
    """A dropping module's rate (0 for an Identity), None where its settings do not say."""
    return 0.0 if record.op == "identity" else _rate_in(record.attrs)


def computes_nothing(record: RecordInfo) -> bool:
    """An Identity, or a dropout or stochastic depth of rate 0: a module a port may hold or
    lack with no effect (timm and mindcv build their pre-norm, layer scale and drop path cells
    as Identity where torchvision builds nothing)."""
    return record.op == "identity" or (record.op in DROPPING_OPS and drop_rate(record) == 0)


def different_drop_rates(t: RecordInfo, m: RecordInfo) -> Optional[Tuple[float, float]]:
    """(torch's, MindSpore's) rate of a dropout pair (or a recurrent pair's dropout between
    layers) whose rates differ, else None."""
    if dropping_op(t, m) is None:
        return None
    rates = drop_rate(t), drop_rate(m)
    if None in rates or np.isclose(*rates, rtol=1e-6, atol=0):
        return None
    return rates


def _gelu_form(approximate) -> Optional[str]:
    """'tanh' or 'none' from either framework's setting (MindSpore: True/False, or the string),
    or the form a module holding none computes ('quick' too: capture.hooks.GELU_FORMS)."""
    if isinstance(approximate, bool):
        return "tanh" if approximate else "none"
    return str(approximate).lower() if approximate is not None else None


def different_gelu_forms(t: RecordInfo, m: RecordInfo) -> Optional[Tuple[str, str]]:
    """(torch's, MindSpore's) form of a GELU pair computing GELU in different forms (the exact
    one, 'none', and the tanh approximation, MindSpore's nn.GELU's default), else None. The two
    differ by 4.7e-4 at most (at |x| = 2.7, in float64): one random-init step may show it
    nowhere (mindcv's ConvNeXt-T at 64² passed at its first block's GELU, 3.4× torch's float32
    error)."""
    forms = _gelu_form(t.attrs.get("approximate")), _gelu_form(m.attrs.get("approximate"))
    if t.op == m.op == "gelu" and None not in forms and forms[0] != forms[1]:
        return forms
    return None


def op_family(op: str) -> str:
    """An op type without its dimensionality: batchnorm2d -> batchnorm."""
    return re.sub(r"[123]d$", "", op)


def different_operations(t: RecordInfo, m: RecordInfo) -> bool:
    """A forward pair computing different things (ReLU for ReLU6), whatever the numbers say.
    Dimensionality is not compared (a BatchNorm2d may stand for a BatchNorm1d on a reshape),
    nor a dense layer with a convolution computing one (_dense_as_a_conv)."""
    return t.kind == "forward" and op_family(t.op) != op_family(m.op) \
        and not {t.op, m.op} & STRUCTURAL_OPS \
        and not ({op_family(t.op), op_family(m.op)} == {"dense", "conv"}
                 and _dense_as_a_conv(t if op_family(t.op) == "conv" else m,
                                      transposed=t.axes is not None or m.axes is not None))


def _dense_as_a_conv(conv: RecordInfo, transposed: bool = False) -> bool:
    """Whether a convolution computes a dense layer: unpadded, undilated, in one group, with an
    output of one pixel, a dense layer over its window (timm's DPN classifies its pooled
    features with a 1×1 conv and its VGG its 7×7 map with a 7×7 conv, mindcv's ports both with
    nn.Dense: the correct ports failed there, "different operation"); or a 1×1 kernel at
    stride 1 at every pixel of a map the dense layer's side holds channels last
    (``transposed``: timm's ConvNeXtV2 MLP, mindcv's)."""
    def all_ones(setting: str, default: int) -> bool:
        given = conv.attrs.get(setting, default)
        return all(size == 1 for size in (given if isinstance(given, (list, tuple)) else [given]))

    padding = conv.attrs.get("padding", 0)     # a number, numbers, or a mode ("same")
    unpadded = all(not isinstance(size, (int, float)) or size == 0
                   for size in (padding if isinstance(padding, (list, tuple)) else [padding]))
    one_pixel = all(size == 1 for size in conv.shape[2:])
    pointwise = all_ones("kernel_size", 0) and all_ones("stride", 0)
    return len(conv.shape) > 2 and unpadded and all_ones("dilation", 1) and \
        (one_pixel or (transposed and pointwise)) and \
        conv.attrs.get("groups", conv.attrs.get("group")) == 1


NORM_NAMES = {"batchnorm": "BatchNorm", "layernorm": "LayerNorm", "groupnorm": "GroupNorm"}


def different_eps(t: RecordInfo, m: RecordInfo) -> Optional[Tuple[str, float, float]]:
    """(the cause, torch's eps, MindSpore's) of a norm pair whose eps differ, else None: a pair
    of known norms ("LayerNorm eps differs"), or of modules of the user's own that both keep an
    eps ("eps differs": Hugging Face's RMSNorm keeps ``variance_epsilon``, and a Llama port at
    1e-5 for 1e-6 was told "operation missing in the port", naming the rotary embedding torch
    runs before it). MindSpore's nn.LayerNorm defaults to 1e-7 (torch's 1e-5, timm's 1e-6): over
    a feature of variance far above eps, one random-init step shows it nowhere (mindcv's
    MLP-Mixer passed its every norm at 224² with 1e-7 for timm's 1e-6), trained weights may.
    1e-3 relative tolerates an eps held in float32."""
    family = op_family(t.op) if op_family(t.op) == op_family(m.op) else None
    cause = f"{NORM_NAMES[family]} eps differs" if family in NORM_NAMES else \
        "eps differs" if t.op == m.op == GENERIC_OP else None
    t_eps, m_eps = declared_eps(t), declared_eps(m)
    if cause and t.kind == "forward" and None not in (t_eps, m_eps) and \
            not np.isclose(t_eps, m_eps, rtol=1e-3):
        return cause, t_eps, m_eps
    return None


EPS_SETTINGS = ("eps", "epsilon", "variance_epsilon")   # MindSpore's LayerNorm, HF's RMSNorm


def eps_setting(record: RecordInfo) -> Optional[str]:
    """The name of the eps setting a module keeps, or None."""
    return next((name for name in EPS_SETTINGS if name in record.attrs), None)


def declared_eps(record: RecordInfo) -> Optional[float]:
    """The eps a module's settings hold, or None."""
    value = record.attrs.get(eps_setting(record) or "eps")
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if numeric else None


def batch_statistics_in_eval_on_torch_only(t: RecordInfo, m: RecordInfo) -> bool:
    """A BatchNorm keeping no running statistics in torch (track_running_stats=False: it
    normalises with the batch's in eval mode too) ported without use_batch_statistics=True:
    MindSpore's normalises with its running statistics in eval mode. A training step cannot
    show it."""
    return t.kind == "forward" and op_family(t.op) == op_family(m.op) == "batchnorm" and \
        t.attrs.get("track_running_stats") is False and \
        m.attrs.get("use_batch_statistics") is not True


FROZEN_ON_ONE_SIDE = "frozen on one side only"


def frozen_on_one_side(t: RecordInfo, m: RecordInfo) -> Optional[Tuple[str, str]]:
    """(the side that trains, the side that froze) of a parameter paired as a ``weight``
    record on one side and a ``buffer`` (requires_grad False) on the other, else None."""
    if t.kind == m.kind:
        return None
    return ("torch", "MindSpore") if t.kind == "weight" else ("MindSpore", "torch")


def violation(t: RecordInfo, m: RecordInfo) -> str:
    """Why the pair fails whatever its numbers, or ""."""
    sides = frozen_on_one_side(t, m)
    if sides is not None:
        why = "requires_grad=False" if sides[1] == "MindSpore" else \
            "requires_grad=False, or no gradient in its step"
        return (f"{FROZEN_ON_ONE_SIDE}: {sides[0]} trains this parameter, {sides[1]} does "
                f"not ({why})")
    rates = different_drop_rates(t, m)
    if rates is not None and t.op in RECURRENT_OPS:    # dropout modules: compare/dropping.py
        return f"{t.op} dropout rate differs: torch {rates[0]:g}, MindSpore {rates[1]:g}"
    if different_operations(t, m):
        return f"different operation: torch {t.op}, MindSpore {m.op}"
    forms = different_gelu_forms(t, m)
    if forms is not None:
        return f"GELU approximation differs: torch '{forms[0]}', MindSpore '{forms[1]}'"
    eps = different_eps(t, m)
    if eps is not None:
        return f"{eps[0]}: torch {eps[1]:g}, MindSpore {eps[2]:g}"
    if batch_statistics_in_eval_on_torch_only(t, m):
        return "eval-mode statistics differ: torch keeps no running statistics, MindSpore does"
    return ""
