"""Exact 8-bit model inputs: a conv that reads the image's pixels through a per-channel affine
normalization (`(p / 255 - mean_c) / std_c`, `p / 127.5 - 1`) gets the pixel levels themselves.

One INT8 grid per tensor cannot hold three channels normalized by different means and standard
deviations: their levels fall between its steps, and the rounding is noise on every pixel (the
ImageNet-normalized PP-OCR text detectors: that noise alone takes the float model's output to
20 dB (v6) and 8 dB (v4) SQNR). Where every calibration sample's values in each channel of the
conv's input lie on `origin_c + k * step_c` with at most 256 levels `k`, the conv's input `t`
becomes `u = (t - origin) / step - 128` (a float `top.Scale`, after the conv's zero padding,
which then maps to each channel's own pad level), cast to INT8 exactly (-128..127), and the
conv takes `step` into its weights and `origin` into its bias: the same function in float, with
no input rounding in INT8 (TPU-MLIR's fused preprocessing, derived from the data).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from tftpu.interp.kernels import KERNELS
from tftpu.ir import attrs as A
from tftpu.ir import top
from tftpu.ir.base import value_name
from tftpu.ir.module import TopModel, make_op
from tftpu.quant import params as P

__all__ = ["InputGrid", "pixel_grid", "exact_input_grid", "LEVELS"]

LEVELS = 256                 # pixel levels an 8-bit grid (with a zero point) holds
_MOVES = (top.Permute, top.Pad, top.SpaceToDepth, top.Reshape)
# values this close (relative to the channel's largest) are one level: float round-off of the
# normalization, not a level of its own
_SAME = 1e-5
# the levels are centred: an INT8 weight's rounding error times a level carries no DC of 128 levels
_MID = LEVELS // 2
_SPARSE = 8                  # levels a channel's few values may skip between its two nearest
_ON_GRID = 0.02              # a value's distance to its level, in steps, that still counts as on it


@dataclasses.dataclass
class InputGrid:
    """What the rewrite did (or why not): the conv, the new input's name, each channel's step and origin."""

    conv: str | None
    reason: str
    scaled: str | None = None
    step: list | None = None
    origin: list | None = None
    float_ops: list = dataclasses.field(default_factory=list)   # the moves and the Scale before the conv: in float

    @property
    def applied(self) -> bool:
        return self.scaled is not None

    @property
    def line(self) -> str:
        if not self.applied:
            return f"not applied: {self.reason}"
        return (f"{self.conv} reads its input's {len(self.step)} channels as exact 8-bit levels "
                f"(step {_short(self.step)}, origin {_short(self.origin)}); {self.reason}")


def _short(values: list) -> str:
    shown = ", ".join(f"{v:.4g}" for v in values[:3])
    return f"[{shown}{', ...' if len(values) > 3 else ''}]"


def pixel_grid(values: np.ndarray) -> tuple[float, float] | str:
    """(step, origin) of one channel's values (exact zeros, a pad's, left out) where they all lie
    on `origin + k * step`, k integer in 0..255; else why not."""
    v = np.asarray(values, np.float64).ravel()
    v = v[v != 0.0]
    if v.size == 0 or not np.all(np.isfinite(v)):
        return "no finite non-zero values"
    levels = np.unique(v)
    tol = _SAME * max(abs(levels[0]), abs(levels[-1]))
    levels = levels[np.concatenate([[True], np.diff(levels) > tol])]
    if len(levels) > LEVELS:
        return f"{len(levels)} distinct values, more than {LEVELS} levels"
    if len(levels) < 2:
        return "a constant channel"
    gaps = np.diff(levels)
    for parts in range(1, _SPARSE + 1):        # few values may skip levels: the step divides the least gap
        step = float(gaps.min()) / parts
        k = (levels - levels[0]) / step
        if np.max(np.abs(k - np.rint(k))) <= _ON_GRID:
            break
    else:
        return "its values are not evenly spaced levels"
    zero = -levels[0] / step                  # a pad's zero, where it is one of the levels
    if abs(zero - np.rint(zero)) <= _ON_GRID:
        levels = np.union1d(levels, [0.0])
        k = (levels - levels[0]) / step
    span = int(np.rint(k[-1]))
    if span >= LEVELS:
        return f"its values span {span + 1} levels of step {step:.4g}"
    origin = float(levels[0]) - step * ((LEVELS - 1 - span) // 2)     # room split either side
    return step, origin


def _moves(op) -> tuple[list, object]:
    """(the data moves before `op`'s data input, nearest it first; the op they start from: a
    `top.Input` where `op` reads one through moves alone)."""
    ops, v = [], op.operands[0].owner
    while isinstance(v, _MOVES):
        ops.append(v)
        v = v.operands[0].owner
    return ops, v


def _conv_input(conv, sample: dict) -> np.ndarray | None:
    """The conv's data input on `sample`: the model input through the moves before it (None
    where `sample` does not hold that input: named otherwise, among several)."""
    ops, v = _moves(conv)
    name = value_name(v.results[0])
    if name not in sample and len(sample) != 1:
        return None
    x = np.asarray(sample[name] if name in sample else next(iter(sample.values())), np.float32)
    for op in reversed(ops):
        x = KERNELS[op.name]([x], op.attrs())[0]
    return x


def exact_input_grid(model: TopModel, table, samples: list[dict],
                     asymmetric: bool | str = "auto") -> tuple[TopModel, object, InputGrid]:
    """(model, table, what was done): the first conv reading a model input through data moves,
    where `samples` put each of its input channels on a grid of at most 256 levels that the
    input's own INT8 grid (`table`'s entry, `asymmetric` as the lowering's) does not hold,
    rewritten to read them exactly (module docstring); `table` gains the new tensors' entries.
    Elsewhere the model and table as given."""
    conv = next((op for op in model.ops if isinstance(op, top.Conv)), None)
    if conv is None or not isinstance(_moves(conv)[1], top.Input):
        return model, table, InputGrid(None, "no conv reads a model input through data moves alone")
    a = conv.attrs()
    if a.get("kernel_layout", "OIHW") != "OIHW" or not isinstance(conv.operands[1].owner, top.Weight) \
            or len(a["kernel_shape"]) != 2:
        return model, table, InputGrid(conv.loc, "its kernel is not a constant 2-D OIHW weight")
    if not samples:
        return model, table, InputGrid(conv.loc, "no samples to find the input's levels in")
    axis = 3 if a["layout"] == "NHWC" else 1
    data = [_conv_input(conv, s) for s in samples]
    if any(x is None for x in data):
        return model, table, InputGrid(conv.loc, "the samples do not name the input it reads")
    grids = []
    for c in range(data[0].shape[axis]):
        got = pixel_grid(np.concatenate([np.take(x, c, axis=axis).ravel() for x in data]))
        if isinstance(got, str):
            return model, table, InputGrid(conv.loc, f"input channel {c}: {got}")
        grids.append(got)
    step = np.array([g[0] for g in grids])
    origin = np.array([g[1] for g in grids])
    entry = table.entries.get(value_name(conv.operands[0]))
    if entry is not None:                        # (unit or 0..255 pixels on a grid with a zero point)
        own = P.activation(*entry[:3], asymmetric=asymmetric)
        if all(np.max(np.abs(own.dequantize(own.quantize(x)) - x)) <= _ON_GRID * step.min() for x in data):
            return model, table, InputGrid(conv.loc, "the input's own INT8 grid holds its levels already")
    new = model.copy()
    scaled = _rewrite(new, next(op for op in new.ops if op.loc == conv.loc), step, origin)
    entries = dict(table.entries)
    src = value_name(conv.operands[0])
    if src in entries:
        t, lo, hi = entries[src][:3]
        for op in new.ops:                       # the conv's explicit zero pad
            if op.name == "top.Pad" and value_name(op.results[0]) not in entries and \
                    value_name(op.operands[0]) == src:
                entries[value_name(op.results[0])] = (t, min(lo, 0.0), max(hi, 0.0))
    # levels -128..127 on a grid of step 1 and zero point 0 (the threshold marks the range one-sided
    # enough for asymmetric="auto" to give it one: a symmetric grid holds 255 levels, not 256)
    entries[scaled] = (float(LEVELS - 1), -float(_MID), float(LEVELS - 1 - _MID))
    # the image reaches the levels in float: the Scale and the moves before it
    scale = next(op for op in new.ops if op.loc == conv.loc).operands[0].owner
    moved = [scale.loc] + [op.loc for op in _moves(scale)[0]]
    return new, dataclasses.replace(table, entries=entries), InputGrid(
        conv.loc, f"{sum(math.prod(x.shape) for x in data)} input values over {len(samples)} samples on the grid",
        scaled, step.tolist(), origin.tolist(), moved[::-1])


def _rewrite(model: TopModel, conv, step: np.ndarray, origin: np.ndarray) -> str:
    """conv(t) -> conv'(Scale(pad(t))): t's levels as -128..127 in float, the conv's padding made
    explicit before it, the step into the weights and the origin into the bias. Returns the
    Scale's output name."""
    block, a, name = conv.parent, conv.attrs(), conv.loc

    def weight(key: str, arr: np.ndarray):
        while key in model.weights:
            key += "_"
        model.weights[key] = np.ascontiguousarray(arr, np.float32)
        op = top.Weight.create(result_types=[A.tensor_type(arr.shape)])
        top.set_loc(op, key)
        block.insert_op_before(op, conv)
        return op.results[0]

    def add(op_name, operands, attrs, loc):
        op = make_op(op_name, operands, attrs, loc)
        block.insert_op_before(op, conv)
        return op.results[0]

    x = conv.operands[0]
    pads = list(a["pads"])
    if any(pads):
        t, l, b, r = pads
        paddings = [0, t, l, 0, 0, b, r, 0] if a["layout"] == "NHWC" else [0, 0, t, l, 0, 0, b, r]
        x = add("top.Pad", [x], {"paddings": paddings}, f"{name}_grid_pad")
    u = add("top.Scale", [x, weight(f"{name}_grid_scale", 1.0 / step),
                          weight(f"{name}_grid_shift", -origin / step - _MID)],
            {"layout": a["layout"]}, f"{name}_grid")
    w = np.asarray(model.weights[conv.operands[1].owner.key], np.float64)
    o, cg = w.shape[:2]
    g = int(a.get("group", 1) or 1)
    per_out = lambda v: np.repeat(v.reshape(g, cg), o // g, axis=0)[:, :, None, None]   # noqa: E731
    folded = w * per_out(step)
    bias = conv.operands[2].owner
    b0 = np.asarray(model.weights[bias.key], np.float64).reshape(-1) if isinstance(bias, top.Weight) \
        else np.zeros(o)
    b1 = b0 + (w * per_out(origin + _MID * step)).sum(axis=(1, 2, 3))
    attrs = dict(a, pads=[0, 0, 0, 0])
    new = make_op("top.Conv", [u, weight(f"{conv.operands[1].owner.key}_grid", folded),
                               weight(f"{name}_grid_bias", b1)], attrs, name)
    block.insert_op_before(new, conv)
    conv.results[0].replace_all_uses_with(new.results[0])
    old = [v.owner for v in conv.operands[1:] if isinstance(v.owner, top.Weight)]
    block.erase_op(conv)
    for op in old:
        if not op.results[0].uses:
            block.erase_op(op)
    model.weights = model.used_weights()
    return value_name(u)
