"""Causes proven by the module settings each capture records (parity/capture/hooks.py):
padding modes and amounts, eps, BatchNorm's training flag, dropout rates, activation slopes,
upsampling, transposed-convolution and attention conventions. Each names the MindSpore
argument to write.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Tuple

import numpy as np

from parity.compare.structure import (batch_statistics_in_eval_on_torch_only,
                                      different_drop_rates, different_eps, different_gelu_forms,
                                      different_operations, dropping_op, eps_setting, op_family)
from parity.records import Diagnosis, RecordInfo, module_of

# MindSpore's pools, whose stride defaults to 1 (torch's to the kernel size).
POOLS = {"maxpool1d": "MaxPool1d", "avgpool1d": "AvgPool1d", "maxpool2d": "MaxPool2d",
         "avgpool2d": "AvgPool2d", "maxpool3d": "MaxPool3d", "avgpool3d": "AvgPool3d"}
# The modules whose MindSpore pad_mode='same' pads otherwise than torch's explicit padding.
WINDOWED = {"conv1d": "Conv1d", "conv2d": "Conv2d", "conv3d": "Conv3d", "maxpool1d": "MaxPool1d",
            "maxpool2d": "MaxPool2d", "maxpool3d": "MaxPool3d"}
# the sides MindSpore's pad_mode='same' puts the odd row or column on
SAME_PADDED_ENDS = {"1d": "the end", "2d": "bottom/right", "3d": "back/bottom/right"}


def settings_cause(t: RecordInfo, m: RecordInfo) -> Optional[Diagnosis]:
    """The cause the two modules' recorded settings prove, or None."""
    if t.op == m.op and t.op.endswith("1d") and op_family(t.op) not in PADS:
        m = dataclasses.replace(m, attrs=_in_one_dimension(m.attrs))
    ta, ma = t.attrs, m.attrs
    rates = different_drop_rates(t, m)
    if rates is not None and dropping_op(t, m) == "droppath":
        t_is, m_is = (", an Identity," if r.op == "identity" else "" for r in (t, m))
        return Diagnosis(cause="DropPath rate differs",
                         detail=f"torch {t.name}{t_is} drops a sample's branch with probability "
                                f"{rates[0]:g}, MindSpore {m.name}{m_is} with {rates[1]:g} "
                                "(stochastic depth runs as identity in both captures, so only "
                                "its rate can differ here).", confidence="certain")
    if rates is not None and t.op in SEQUENCE_OPS:
        return Diagnosis(cause=f"{SEQUENCE_OPS[t.op]} dropout differs",
                         detail=f"torch {module_of(t.name)} drops {rates[0]:g} of each stacked "
                                f"layer's output before the next, MindSpore {module_of(m.name)} "
                                f"{rates[1]:g} (it runs in eval mode in both captures, so only "
                                f"its rate can differ here): pass dropout={rates[0]:g}.",
                         confidence="certain")
    if rates is not None:
        keep_prob = " MindSpore's nn.Dropout takes keep_prob as its first argument: write " \
            f"nn.Dropout(p={rates[0]:g})." if "p" not in ma and m.op == "dropout" else ""
        return Diagnosis(cause="Dropout rate differs",
                         detail=f"torch {t.name} drops {rates[0]:g} of its inputs, MindSpore "
                                f"{m.name} {rates[1]:g}.{keep_prob}", confidence="certain")
    if different_operations(t, m):
        example = " (ReLU and ReLU6 agree below 6)" if {t.op, m.op} == {"relu", "relu6"} else ""
        return Diagnosis(cause="different operation",
                         detail=f"torch {t.name} is {t.op}, MindSpore {m.name} is {m.op}: "
                                "use the same operation. One batch through random initial "
                                f"weights need not show the difference{example}.",
                         confidence="certain")
    forms = different_gelu_forms(t, m)
    if forms is not None:
        return Diagnosis(cause="GELU approximation differs", detail=_gelu_detail(t, m, forms),
                         confidence="certain")
    what = WINDOWED.get(m.op)
    if what and str(ma.get("pad_mode", "")).lower() == "same":
        stride = ma.get("stride", 1)
        strided = any(s > 1 for s in (stride if isinstance(stride, list) else [stride]))
        # a window of one pads nothing in 'same' mode at any stride, as torch's padding=0
        single = set(_as_pair(ma.get("kernel_size", 0))) == {1} and \
            not any(_as_pair(ta.get("padding", 0)))
        if (strided or op_family(m.op) == "maxpool") and not single:
            padding = _one_if_all_equal(ta.get("padding"))
            return Diagnosis(
                cause=f"{what} pad_mode='same' with stride > 1",
                detail=f"MindSpore {m.name} pads {SAME_PADDED_ENDS[m.op[-2:]]} only, torch "
                       f"{t.name} pads both sides (padding={padding}): the window shifts one "
                       f"pixel. Use pad_mode='pad', padding={padding}.", confidence="certain")
        unlike_torch = _same_padding_unlike_torch(ta, ma)
        if unlike_torch is not None:
            amount = f"{unlike_torch[0]} positions" if m.op.endswith("1d") else \
                f"{unlike_torch} rows and columns"
            return Diagnosis(
                cause=f"{what} pad_mode='same' pads differently",
                detail=f"MindSpore {m.name} has pad_mode='same' (nn.{what}'s default), which "
                       f"pads {amount} in all (the odd one at the "
                       f"{SAME_PADDED_ENDS[m.op[-2:]].removeprefix('the ')}), torch {t.name} "
                       f"padding={ta.get('padding')} on each side. "
                       f"Use {_explicit_padding(ta.get('padding', 0))}.", confidence="certain")
    padded = _padding_mode_cause(t, m)
    if padded is not None:
        return padded
    slopes = ta.get("negative_slope"), ma.get("negative_slope", ma.get("alpha"))
    if t.op == m.op == "leakyrelu" and None not in slopes and \
            not np.isclose(*slopes, rtol=1e-6, atol=0):
        return Diagnosis(cause="LeakyReLU slope differs",
                         detail=f"torch {t.name} has negative_slope={slopes[0]:g}, MindSpore "
                                f"{m.name} alpha={slopes[1]:g} (nn.LeakyReLU's default alpha is "
                                f"0.2, torch's 0.01); write nn.LeakyReLU({slopes[0]:g}).",
                         confidence="certain")
    eps = different_eps(t, m)
    if eps is not None:
        cause, t_eps, m_eps = eps
        keyword = eps_setting(m)                        # MindSpore's LayerNorm: epsilon
        return Diagnosis(cause=cause,
                         detail=f"torch {t.name} {eps_setting(t)}={t_eps:g}, MindSpore {m.name} "
                                f"{keyword}={m_eps:g}; set {keyword}={t_eps:g}.",
                         confidence="certain")
    spans = _layer_norm_spans(t, m)
    if spans is not None:
        return Diagnosis(cause="LayerNorm normalises over other dimensions",
                         detail=f"torch {t.name} normalises over dimensions {spans[0]} to "
                                f"{len(t.shape) - 1} of its {len(t.shape)}-D input "
                                f"(normalized_shape {tuple(ta['normalized_shape'])}), MindSpore "
                                f"{m.name} from dimension {spans[1]} (begin_norm_axis="
                                f"{ma['begin_norm_axis']}; its default -1 is the last only); "
                                f"write begin_norm_axis={spans[0]}.", confidence="certain")
    if batch_statistics_in_eval_on_torch_only(t, m):
        return Diagnosis(cause="BatchNorm eval-mode statistics differ",
                         detail=f"torch {t.name} has track_running_stats=False: it keeps no "
                                "running statistics and normalises with the batch's in eval mode "
                                f"too; MindSpore {m.name} normalises with its running statistics "
                                "in eval mode. The training step agrees; inference would not. "
                                "Pass use_batch_statistics=True.", confidence="certain")
    if m.op.startswith("batchnorm") and t.op.startswith("batchnorm"):
        if ta.get("batch_statistics") is False and ma.get("batch_statistics"):
            return Diagnosis(cause="BatchNorm statistics differ",
                             detail=f"torch {t.name} normalises with its running statistics "
                                    "(a FrozenBatchNorm2d, or one in eval mode), MindSpore "
                                    f"{m.name} with the batch's: pass use_batch_statistics=False "
                                    "(and freeze its gamma and beta where torch's are buffers).",
                             confidence="certain")
        if ta.get("batch_statistics", ta.get("training")) and \
                ma.get("use_batch_statistics") is False:
            return Diagnosis(cause="MindSpore network not in training mode",
                             detail=f"{m.name} has use_batch_statistics=False: it normalises "
                                    "with its running statistics even in training, where torch "
                                    "uses batch statistics; leave it None.",
                             confidence="certain")
        if ta.get("batch_statistics", ta.get("training")) and ma.get("training") is False and \
                ma.get("use_batch_statistics") is None:
            return Diagnosis(cause="MindSpore network not in training mode",
                             detail=f"{m.name} normalised with its running statistics while "
                                    "torch used batch statistics; call net.set_train(True).",
                             confidence="certain")
    by_module_kind = _upsample_cause(t, m) or _transposed_conv_cause(t, m) or \
        _sequence_cause(t, m) or _softmax_axis_cause(t, m) or _same_named_setting_cause(t, m) \
        or _pad_widths_cause(t, m)
    if by_module_kind is not None:
        return by_module_kind
    differing = [key for key in ("stride", "padding", "kernel_size", "dilation")
                 if key in ta and key in ma and _as_pair(ta[key]) != _as_pair(ma[key])
                 and not (key == "padding" and (str(ma.get("pad_mode", "pad")).lower() != "pad"
                                                or m.op.startswith("convtranspose")
                                                or op_family(m.op) in PADS))]
    if differing:
        verb = "differs" if len(differing) == 1 else "differ"
        return Diagnosis(cause=f"{m.op or 'module'} {' and '.join(differing)} {verb}",
                         detail="; ".join(_setting_difference(key, t, m) for key in differing)
                         + ".", confidence="certain")
    padding = ta.get("padding", 0)
    if t.op == m.op and op_family(m.op) in ("conv", "maxpool", "avgpool") and \
            str(ma.get("pad_mode", "")).lower() == "valid" and not isinstance(padding, str) \
            and any(_as_pair(padding)):
        return Diagnosis(cause=f"{m.op} padding differs",
                         detail=f"MindSpore {m.name} has pad_mode='valid' and pads nothing, "
                                f"torch {t.name} padding={padding}. Use pad_mode='pad', "
                                f"padding={padding}.", confidence="certain")
    return None


def _setting_difference(key: str, t: RecordInfo, m: RecordInfo) -> str:
    ta, ma = t.attrs, m.attrs
    told = f"torch {t.name} {key}={ta[key]}, MindSpore {m.name} {key}={ma[key]}"
    if key == "stride" and m.op in POOLS and _as_pair(ma[key]) == (1, 1):
        told += f" (MindSpore's nn.{POOLS[m.op]} defaults to stride 1, torch's to the kernel size)"
    return told


def _in_one_dimension(attrs: Dict) -> Dict:
    """A MindSpore 1-D conv's or pool's settings as torch's 1-D ones: MindSpore computes them
    as 2-D ones over a height of 1 and keeps them so (stride (1, s), MaxPool1d's (1, 1, s),
    padding (0, 0, left, right), MaxPool1d's (0, 0, p))."""
    lowered = dict(attrs)
    for key in ("stride", "kernel_size", "dilation", "output_padding"):
        if isinstance(attrs.get(key), list) and len(attrs[key]) > 1:
            lowered[key] = attrs[key][-1]
    padding = attrs.get("padding")
    if isinstance(padding, list) and len(padding) == 4:
        lowered["padding"] = padding[2] if padding[2] == padding[3] else padding[2:]
    elif isinstance(padding, list) and len(padding) > 1:
        lowered["padding"] = padding[-1]
    return lowered


def _padding_mode_cause(t: RecordInfo, m: RecordInfo) -> Optional[Diagnosis]:
    """torch's conv pads with reflected, replicated or circular values when padding_mode says
    so; MindSpore's nn.Conv1d/2d/3d have no padding mode: their padding is zeros."""
    mode = t.attrs.get("padding_mode", "zeros")
    if t.op != m.op or op_family(t.op) != "conv" or mode == "zeros" or \
            m.attrs.get("padding_mode", "zeros") != "zeros":
        return None
    pad_mode = str(m.attrs.get("pad_mode", "same")).lower()
    if pad_mode == "valid" or (pad_mode == "pad" and not any(_as_pair(m.attrs.get("padding", 0)))):
        return None
    return Diagnosis(cause="conv padding values differ",
                     detail=f"torch {t.name} pads with padding_mode='{mode}', MindSpore {m.name} "
                            "with zeros (its convolutions have no padding mode): pad the input "
                            f"first, ops.pad(x, ..., mode='{mode}'), and convolve with "
                            "pad_mode='valid'.", confidence="certain")


def _one_if_all_equal(padding):
    """torch's padding as MindSpore takes it: one number when every side's is the same
    (MindSpore's nn.Conv3d takes one or six, not torch's three)."""
    if isinstance(padding, list) and padding and all(p == padding[0] for p in padding):
        return padding[0]
    return padding


def _explicit_padding(padding) -> str:
    """MindSpore's arguments for torch's explicit conv padding."""
    rows, columns = _as_pair(padding)
    if rows == columns == 0:
        return "pad_mode='valid'"
    return f"pad_mode='pad', padding={rows if rows == columns else (rows, rows, columns, columns)}"


def _same_padding_unlike_torch(ta: Dict, ma: Dict) -> Optional[Tuple[int, int]]:
    """The total padding (rows, columns) of a stride-1 MindSpore conv in pad_mode 'same',
    dilation·(kernel − 1), when torch's explicit padding is not half of it on each side;
    None when they agree or torch's padding is a mode ('same', 'valid')."""
    padding = ta.get("padding", 0)
    if isinstance(padding, str) or any(s > 1 for s in _as_pair(ma.get("stride", 1))):
        return None
    totals = tuple(d * (k - 1) for k, d in zip(_as_pair(ma.get("kernel_size", 1)),
                                                _as_pair(ma.get("dilation", 1))))
    if all(total % 2 == 0 and total // 2 == p for total, p in zip(totals, _as_pair(padding))):
        return None
    return totals


LINEAR_MODES = ("linear", "bilinear", "bicubic", "trilinear")
# Measured on MindSpore 2.8.0 against torch 2.14.1 (nn.Upsample, 4×4 → 8×8 and 8×8 → 16×16)
BICUBIC = ("MindSpore's is Keys' cubic with a = -0.5, the taps outside the image left out and "
           "the rest renormalised, its offsets rounded to 1/1024; torch's has a = -0.75 and "
           "repeats the border pixels (each equals its formula within 5e-7; the two differ by "
           "up to 0.23 on unit-variance input).")
BICUBIC_ALIGNED = ("MindSpore's is torch's (a = -0.75, the border repeated) with each offset "
                   "rounded to 1/1024, as read from a table of weights (within 3e-7 of that "
                   "formula, compare/resize.py): 4e-4 to 6e-4 of the output's RMS from torch's "
                   "in the two cases measured, the corners excepted.")


def _upsample_cause(t: RecordInfo, m: RecordInfo) -> Optional[Diagnosis]:
    if not t.op == m.op == "upsample":
        return None
    modes = str(t.attrs.get("mode")), str(m.attrs.get("mode"))
    if modes[0] != modes[1]:
        return Diagnosis(cause="Upsample mode differs",
                         detail=f"torch {t.name} interpolates with mode='{modes[0]}', MindSpore "
                                f"{m.name} with '{modes[1]}'.", confidence="certain")
    corners = bool(t.attrs.get("align_corners")), bool(m.attrs.get("align_corners"))
    if modes[0] in LINEAR_MODES and corners[0] != corners[1]:
        return Diagnosis(cause="Upsample align_corners differs",
                         detail=f"torch {t.name} interpolates with align_corners={corners[0]} "
                                f"(torch's default, None, is False), MindSpore {m.name} with "
                                f"{corners[1]}: the two sample different points; write "
                                f"align_corners={corners[0]}.", confidence="certain")
    if modes[0] == "bicubic":
        return Diagnosis(cause="bicubic kernels differ", detail=(
            f"torch {t.name} and MindSpore {m.name} both upsample bicubically, with "
            f"align_corners={corners[0]}, but not with the same kernel: "
            + (BICUBIC_ALIGNED if corners[0] else BICUBIC) + " No MindSpore setting gives "
            "torch's: apply torch's interpolation as two fixed matrices (ops.matmul), or upsample "
            "bilinearly on both sides."), confidence="certain")
    return None


def _transposed_conv_cause(t: RecordInfo, m: RecordInfo) -> Optional[Diagnosis]:
    """A transposed convolution crops its full output, (H − 1)·stride + dilation·(kernel − 1)
    + 1 rows. torch crops ``padding`` rows at the top and ``padding − output_padding`` at the
    bottom (output_padding gives computed rows back); MindSpore's pad mode crops its (top,
    bottom, left, right) ``padding``, then appends ``output_padding`` rows of zeros after the
    bias (nn.Conv2dTranspose.construct, 2.8.0); its same mode crops kernel − stride rows, the
    odd one at the bottom. Compared as the four crops each side takes."""
    if not t.op == m.op == "convtranspose2d":
        return None
    ta, ma = t.attrs, m.attrs
    padding, extra = _as_pair(ta.get("padding", 0)), _as_pair(ta.get("output_padding", 0))
    wanted = (padding[0], padding[0] - extra[0], padding[1], padding[1] - extra[1])
    fix = f" Use pad_mode='pad', padding={wanted} and no output_padding." \
        if min(wanted) >= 0 else ""
    mode = str(ma.get("pad_mode", "same")).lower()
    if mode == "pad" and any(_as_pair(ma.get("output_padding", 0))):
        return Diagnosis(cause="Conv2dTranspose output_padding appends zeros",
                         detail=f"MindSpore {m.name}'s output_padding={ma['output_padding']} "
                                "pads its output with zeros after the bias, where torch "
                                f"{t.name}'s output_padding={ta.get('output_padding')} computes "
                                f"those rows and columns.{fix}", confidence="certain")
    crops = _ms_transposed_crops(ma, mode)
    if crops is None or crops == wanted:
        return None
    return Diagnosis(cause=f"Conv2dTranspose pad_mode='{mode}' crops differently" if mode != "pad"
                     else "Conv2dTranspose padding differs",
                     detail=f"MindSpore {m.name} crops {crops} rows and columns (top, bottom, "
                            f"left, right) of the full output, torch {t.name} {wanted} "
                            f"(padding={ta.get('padding')}, output_padding="
                            f"{ta.get('output_padding')}): the output shifts.{fix}",
                     confidence="certain")


def _ms_transposed_crops(attrs: Dict, mode: str) -> Optional[Tuple[int, ...]]:
    """(top, bottom, left, right) rows and columns a MindSpore Conv2dTranspose crops."""
    if mode == "valid":
        return (0, 0, 0, 0)
    if mode == "pad":
        padding = attrs.get("padding", 0)
        flat = tuple(padding) if isinstance(padding, list) else (padding,)
        return flat * 4 if len(flat) == 1 else flat if len(flat) == 4 else None
    if mode != "same":
        return None
    crops: Tuple[int, ...] = ()
    for kernel, stride, dilation in zip(*(_as_pair(attrs.get(key, 1))
                                          for key in ("kernel_size", "stride", "dilation"))):
        total = max(dilation * (kernel - 1) + 1 - stride, 0)
        crops += (total // 2, total - total // 2)
    return crops


def _as_pair(value) -> Tuple:
    """Spatial settings in one shape: 1 -> (1, 1); MindSpore's (top, bottom, left, right)
    padding -> (top, left) when symmetric, nn.Conv3d's six the same way; a 3-entry setting
    (MaxPool's padding, a 3-D module's) -> its last two."""
    if not isinstance(value, list):
        return (value, value)
    flat = tuple(value)
    if len(flat) == 4 and flat[0] == flat[1] and flat[2] == flat[3]:
        return (flat[0], flat[2])
    if len(flat) == 6 and flat[::2] == flat[1::2]:         # nn.Conv3d's (head, tail, top, ...)
        return (flat[2], flat[4])
    if len(flat) == 3:
        return flat[1:]
    return flat if len(flat) > 1 else flat * 2


# Settings of one name in both frameworks, by the op families that have them, and what to write
# when MindSpore's differs. MindSpore's pools have no ceil_mode (False) but at pad_mode='pad'.
SAME_NAMED_SETTINGS = {
    "ceil_mode": (("maxpool", "avgpool"), False, " (MindSpore's pools take it only with "
                                                  "pad_mode='pad')"),
    "count_include_pad": (("avgpool",), None, ""),
    "num_groups": (("groupnorm",), None, " (the weights have the same shapes either way)"),
    "groups": (("channelshuffle",), None, ""),
    "value": (("constantpad",), None, ""),
    "alpha": (("elu",), None, "; MindSpore 2.8.0's nn.ELU runs only alpha=1.0 on CPU (\"alpha "
                              "must be 1.0f\"), so write it out there: ops.where(x > 0, x, "
                              "alpha * ops.expm1(x))"),
}


def _same_named_setting_cause(t: RecordInfo, m: RecordInfo) -> Optional[Diagnosis]:
    """A setting both frameworks name alike (ceil_mode, count_include_pad, num_groups, a
    ChannelShuffle's groups) that differs between two modules of one kind."""
    family = op_family(t.op)
    if family != op_family(m.op):
        return None
    for key, (families, ms_default, advice) in SAME_NAMED_SETTINGS.items():
        torch_value, ms_value = t.attrs.get(key), m.attrs.get(key, ms_default)
        if family in families and None not in (torch_value, ms_value) and \
                not _same_value(torch_value, ms_value):
            return Diagnosis(cause=f"{m.op} {key} differs",
                             detail=f"torch {t.name} has {key}={torch_value}, MindSpore "
                                    f"{m.name} {key}={ms_value}; set {key}={torch_value}"
                                    f"{advice}.", confidence="certain")
    return None


def uncounted_padding(m: RecordInfo) -> Optional[Tuple[int, str]]:
    """(kernel, the setting) of a MindSpore average pool of an odd square kernel and stride 1
    that does not count its padding, which torch's pools count by default; else None."""
    ma = m.attrs
    kernel, stride = ma.get("kernel_size"), ma.get("stride", 1)
    if op_family(m.op) != "avgpool" or not isinstance(kernel, int) or stride != 1 or \
            kernel % 2 == 0 or kernel == 1:
        return None
    if str(ma.get("pad_mode", "")).lower() == "same":
        return kernel, "pad_mode='same'"
    if ma.get("count_include_pad") is False and ma.get("padding") == kernel // 2:
        return kernel, "count_include_pad=False"
    return None


def counting_padding(kernel: int) -> str:
    """The MindSpore pool that counts its padding as torch's F.avg_pool2d does by default."""
    return f"nn.AvgPool2d({kernel}, 1, pad_mode='pad', padding={kernel // 2}, " \
        "count_include_pad=True)"


PADS = ("reflectionpad", "replicationpad", "circularpad", "constantpad")


def _pad_widths(padding) -> Optional[Tuple[int, ...]]:
    """A pad module's widths as torch orders them, the last dimension's two first: (left,
    right, top, bottom). MindSpore's nn.ReflectionPad2d keeps ((top, bottom), (left, right)),
    its other pads torch's order."""
    if not isinstance(padding, list):
        return None
    if all(isinstance(pair, list) for pair in padding):
        return tuple(width for pair in reversed(padding) for width in pair)
    return tuple(padding)


def _pad_widths_cause(t: RecordInfo, m: RecordInfo) -> Optional[Diagnosis]:
    """Two pad modules of one kind padding other widths (compared in one order: MindSpore's
    nn.ReflectionPad2d(1) keeps [[1, 1], [1, 1]], torch's (1, 1, 1, 1), the same widths)."""
    family = op_family(t.op)
    if family not in PADS or family != op_family(m.op):
        return None
    widths = _pad_widths(t.attrs.get("padding")), _pad_widths(m.attrs.get("padding"))
    if None in widths or widths[0] == widths[1]:
        return None
    return Diagnosis(cause=f"{m.op} padding differs",
                     detail=f"torch {t.name} pads {widths[0]}, MindSpore {m.name} {widths[1]} "
                            "(the last dimension's two sides first, as torch orders them: "
                            "left, right, top, bottom); write the widths in torch's order, as "
                            "MindSpore's pad cells take them.", confidence="certain")


def _layer_norm_spans(t: RecordInfo, m: RecordInfo) -> Optional[Tuple[int, int]]:
    """The first dimension each LayerNorm normalises from, where they differ: torch's the last
    len(normalized_shape) dimensions, MindSpore's from begin_norm_axis on."""
    shape, axis = t.attrs.get("normalized_shape"), m.attrs.get("begin_norm_axis")
    rank = len(t.shape)
    if t.op != m.op or t.op != "layernorm" or not isinstance(shape, list) or \
            not isinstance(axis, int) or not rank:
        return None
    spans = rank - len(shape), axis % rank
    return spans if spans[0] != spans[1] else None


def _same_value(a, b) -> bool:
    """Settings compared as written; a float to float32 rounding (a MindSpore primitive may
    keep it in float32)."""
    if isinstance(a, float) or isinstance(b, float):
        return bool(np.isclose(a, b, rtol=1e-6, atol=0))
    return a == b


def softmax_axis(m: RecordInfo) -> Optional[int]:
    """The axis a MindSpore softmax cell normalises over (its primitive keeps it as a list of
    one; -1, its default, where not recorded), or None for anything else."""
    axis = m.attrs.get("axis", -1)
    axis = axis[0] if isinstance(axis, list) and len(axis) == 1 else axis
    return axis if isinstance(axis, int) else None


def _softmax_axis_cause(t: RecordInfo, m: RecordInfo) -> Optional[Diagnosis]:
    """A softmax over another axis: MindSpore's nn.Softmax and nn.LogSoftmax default to the
    last axis, torch's take dim (left None, the legacy choice: dimension 1 of a 2-D or 4-D
    input, 0 of a 1-D or 3-D one)."""
    if t.op != m.op or t.op not in ("softmax", "logsoftmax") or "axis" not in m.attrs:
        return None
    rank = len(t.shape)
    torch_dim = t.attrs.get("dim")
    if torch_dim is None:
        torch_dim = 0 if rank in (0, 1, 3) else 1
    ms_axis = softmax_axis(m)
    if ms_axis is None or not rank or torch_dim % rank == ms_axis % rank:
        return None
    name = "nn.Softmax" if t.op == "softmax" else "nn.LogSoftmax"
    return Diagnosis(cause=f"{name} axis differs",
                     detail=f"torch {t.name} normalises over dimension {torch_dim % rank} of its "
                            f"{rank}-D input, MindSpore {m.name} over axis {ms_axis % rank} "
                            f"({name}'s default axis is -1, the last); write {name}"
                            f"(axis={torch_dim % rank}).", confidence="certain")


# Modules over sequences that read the batch from the first dimension only if batch_first.
SEQUENCE_OPS = {"attention": "attention", "lstm": "LSTM", "gru": "GRU", "rnn": "RNN"}


def _sequence_cause(t: RecordInfo, m: RecordInfo) -> Optional[Diagnosis]:
    """Two attentions or recurrent layers of one shape whose settings differ: the batch read
    from another dimension (TransformerEncoderLayer hands its batch_first down to its
    attention), or the same weights split into another number of heads."""
    if not t.op == m.op or t.op not in SEQUENCE_OPS:
        return None
    ta, ma = t.attrs, m.attrs
    t, m = (dataclasses.replace(r, name=module_of(r.name)) for r in (t, m))
    if ta.get("batch_first") is not None and ma.get("batch_first") is not None and \
            ta["batch_first"] != ma["batch_first"]:
        return Diagnosis(cause=f"{SEQUENCE_OPS[t.op]} batch_first differs",
                         detail=f"torch {t.name} has batch_first={ta['batch_first']}, MindSpore "
                                f"{m.name} batch_first={ma['batch_first']}: with False the first "
                                "dimension is read as the sequence, so the layer runs across "
                                "the batch (both frameworks default to False); pass batch_first="
                                f"{ta['batch_first']} to the MindSpore layer.",
                         confidence="certain")
    if ta.get("num_heads") is not None and ma.get("num_heads") is not None and \
            ta["num_heads"] != ma["num_heads"]:
        return Diagnosis(cause="attention num_heads differs",
                         detail=f"torch {t.name} splits its projections into {ta['num_heads']} "
                                f"heads, MindSpore {m.name} into {ma['num_heads']}: the weights "
                                "have the same shapes either way; set the MindSpore layer's "
                                f"num_heads (nhead) to {ta['num_heads']}.", confidence="certain")
    return None


QUICK_GELU = "the quick GELU, x·σ(1.702x) (Hugging Face's quick_gelu, CLIP's)"


def _gelu_detail(t: RecordInfo, m: RecordInfo, forms: Tuple[str, str]) -> str:
    if "quick" not in forms:
        return (f"torch {t.name} computes GELU with approximate='{forms[0]}', MindSpore {m.name} "
                f"with '{forms[1]}' (MindSpore's nn.GELU defaults to the tanh form); write "
                f"nn.GELU(approximate={forms[0] == 'tanh'}).")
    computes = [QUICK_GELU if form == "quick" else f"GELU with approximate='{form}'"
                for form in forms]
    fix = "nn.FastGelu(), which computes it" if forms[0] == "quick" else \
        f"nn.GELU(approximate={forms[0] == 'tanh'})"
    return f"torch {t.name} computes {computes[0]}, MindSpore {m.name} {computes[1]}; write {fix}."
