"""Depthwise input equalization: each channel of a depthwise conv's input brought nearer the
tensor's largest, by a per-channel factor that its weights take back.

A depthwise conv reads its input on one 8-bit grid, set by the channel with the widest range. A
channel whose values stay in a small part of that range is read on a few levels, and where its
kernel is large (a folded batch norm of a quiet channel) the conv multiplies that rounding
error back up: the stem of a PicoDet-style layout detector loses 26 dB in one depthwise conv so.
Here the input `x` goes through `x * k` (`top.Mul` by a constant, one factor per channel) before
the conv, whose weights are divided by `k`, which the float program computes the same (up to
float rounding). In INT8 the Mul reads `x` on its 16-bit link (`tftpu.quant.links`: `x` comes
from an op that can write 16 bits) and writes the channels on the 8-bit grid nearer equal in
range; each conv weight channel has its own scale, so dividing it costs nothing.

A depthwise conv up to 7x7 reads such an input on its 16-bit link itself, in two INT8 passes
(`tftpu.quant.links.is_depthwise`), which removes that rounding rather than spreads it (the layout
detector's all-INT8 program judged: 2.1 dB plain, 8.2 dB equalized, 13.2 dB over the links, 13.6
dB both): only the inputs of larger depthwise kernels are equalized here.

`k_c = (R / r_c) ** POWER`, at most `MAX_FACTOR`, where `r_c` is channel c's largest magnitude on
the calibration samples and `R` the largest of them. Full equalization (`POWER` 1) clips the
channels that reach further on a new image than on the calibration set; the square root keeps
room (measured on the benchmarks' detectors, `benchmarks/detectors.py`). The factors are whole
multiples of the largest over 127, so the Mul's constant is exact on its INT8 grid.

>>> eq = equalize_depthwise(model, samples)                      # doctest: +SKIP
>>> print(eq)                                                     # doctest: +SKIP
3 depthwise conv inputs equalized per channel (factors up to 8.0, taken back by their weights)
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tftpu.errors import UsageError
from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.ir import attrs as A
from tftpu.ir import top
from tftpu.ir.base import value_name
from tftpu.ir.module import TopModel, make_op
from tftpu.quant.links import WIDE_PRODUCERS, is_depthwise
from tftpu.utils.names import unique_name

__all__ = ["equalize_depthwise", "Equalization", "POWER", "MAX_FACTOR"]

POWER = 0.5
MAX_FACTOR = 64.0
# a tensor is left as it is where no channel would be scaled by at least this much
MIN_FACTOR = 2.0


@dataclasses.dataclass
class Equalization:
    """The model with its depthwise conv inputs equalized, and the factors per tensor."""

    model: TopModel
    factors: dict[str, np.ndarray]           # equalized tensor (the Mul's input) -> per-channel factors
    products: dict[str, str]                 # equalized tensor -> the Mul's result (the convs' new input)

    def __str__(self) -> str:
        if not self.factors:
            return "no depthwise conv input to equalize"
        top_k = max(float(k.max()) for k in self.factors.values())
        return (f"{len(self.factors)} depthwise conv input(s) equalized per channel (factors up to {top_k:.1f}, "
                "taken back by their weights)")

    def as_dict(self) -> dict:
        return {"tensors": {n: [float(v) for v in k] for n, k in self.factors.items()}}


def _channel_axis(conv) -> int | None:
    """The channel axis of a depthwise conv's data, or None where this pass does not apply."""
    attrs = conv.attrs()
    if attrs.get("kernel_layout", "OIHW") != "OIHW":
        return None
    rank = len(conv.operands[0].type.get_shape())
    return rank - 1 if attrs.get("layout") == "NHWC" else 1


def _depthwise(conv, model) -> bool:
    """Whether `conv` is a depthwise conv (one input channel per group) with constant weights."""
    if not isinstance(conv, top.Conv) or not isinstance(conv.operands[1].owner, top.Weight):
        return False
    axis = _channel_axis(conv)
    if axis is None:
        return False
    w = model.weights.get(conv.operands[1].owner.key)
    channels = conv.operands[0].type.get_shape()[axis]
    return w is not None and w.ndim >= 3 and w.shape[1] == 1 and channels > 1 and \
        conv.attrs().get("group", 1) == channels and w.shape[0] % channels == 0


def _candidates(model) -> dict[str, list]:
    """Tensor name -> the depthwise convs reading it, for each tensor an op that can write a
    16-bit link makes (so the Mul reads it unrounded) and that is not a model output. A conv
    that reads such a tensor on its 16-bit link itself (`tftpu.quant.links.is_depthwise`: up to
    7x7) needs no equalization: only larger kernels are candidates."""
    outputs = set(model.output_names)
    found: dict[str, list] = {}
    for op in model.ops:
        if not _depthwise(op, model) or is_depthwise(op):
            continue
        x = op.operands[0]
        src = x.owner
        if getattr(src, "name", "") not in WIDE_PRODUCERS or value_name(x) in outputs:
            continue
        found.setdefault(value_name(x), []).append(op)
    return found


def channel_ranges(model, names: dict[str, int], samples) -> dict[str, np.ndarray]:
    """Each named tensor's largest magnitude per channel (its axis given) over `samples`."""
    ranges: dict[str, np.ndarray] = {}

    def observe(name, arr):
        if name in names:
            axis = names[name] % arr.ndim
            m = np.abs(np.moveaxis(np.asarray(arr, np.float64), axis, 0)).reshape(arr.shape[axis], -1).max(axis=1)
            ranges[name] = m if name not in ranges else np.maximum(ranges[name], m)
        return arr

    interp = TopInterpreter(model)
    for sample in samples:
        interp.run(sample, observe=observe)
    return ranges


def check_factors(what: str, power: float, max_factor: float) -> None:
    """A UsageError unless `power` is in (0, 1] and `max_factor` at least 1 (`what`: the pass)."""
    if not 0 < power <= 1:
        raise UsageError(f"{what} power {power!r}: expected a number in (0, 1]")
    if not max_factor >= 1:
        raise UsageError(f"{what} max_factor {max_factor!r}: expected a number >= 1")


def range_factors(r: np.ndarray, power: float, max_factor: float) -> np.ndarray | None:
    """`(R / r_c) ** power` per channel, at most `max_factor` (`R` the largest of the channel
    ranges `r`); None where no range is positive and finite."""
    big = float(r.max()) if r.size else 0.0
    if not np.isfinite(big) or big <= 0:
        return None
    return np.minimum((big / np.maximum(r, big / max_factor ** (1 / power))) ** power, max_factor)


def factors_for(r: np.ndarray, power: float = POWER, max_factor: float = MAX_FACTOR) -> np.ndarray | None:
    """Per-channel factors for channel ranges `r` (None where none reaches `MIN_FACTOR`): whole
    multiples of the largest over 127, so that an INT8 constant holds them exactly."""
    k = range_factors(r, power, max_factor)
    if k is None or k.max() < MIN_FACTOR:
        return None
    step = k.max() / 127
    return np.maximum(np.rint(k / step), 1) * step


def equalize_depthwise(model: TopModel, samples, power: float = POWER,
                       max_factor: float = MAX_FACTOR) -> Equalization:
    """`model` with the input of each depthwise conv that an op able to write a 16-bit link makes
    equalized per channel (a copy; `model` itself where nothing applies): see the module doc.
    `samples`: input dicts, the calibration samples whose ranges set the factors."""
    check_factors("equalization", power, max_factor)
    samples = list(samples)
    found = _candidates(model)
    if not found or not samples:
        return Equalization(model, {}, {})
    ranges = channel_ranges(model, {n: _channel_axis(convs[0]) for n, convs in found.items()}, samples)
    factors = {n: k for n in found if n in ranges for k in [factors_for(ranges[n], power, max_factor)]
               if k is not None}
    if not factors:
        return Equalization(model, {}, {})
    copy = model.copy()
    block = copy.func.body.block
    locs = {op.loc: True for op in copy.ops}
    products = {}
    for name, convs in _candidates(copy).items():
        if name not in factors:
            continue
        k = factors[name]
        first = convs[0]
        x = first.operands[0]
        axis = _channel_axis(first)
        shape = [1] * len(x.type.get_shape())
        shape[axis] = k.size
        key = unique_name(f"{name}_equalized_by", copy.weights)
        copy.weights[key] = k.astype(np.float32).reshape(shape)
        locs[key] = True
        weight = top.Weight.create(result_types=[A.tensor_type(shape, "f32")])
        top.set_loc(weight, key)
        block.insert_op_before(weight, first)
        loc = unique_name(f"{name}_equalized", locs)
        locs[loc] = True
        mul = make_op("Mul", [x, weight.results[0]], {}, loc)
        block.insert_op_before(mul, first)
        products[name] = value_name(mul.results[0])
        for conv in convs:
            w_key = conv.operands[1].owner.key
            w = np.asarray(copy.weights[w_key])
            per_out = np.repeat(k, w.shape[0] // k.size).reshape([-1] + [1] * (w.ndim - 1))
            new = (w.astype(np.float64) / per_out).astype(w.dtype)
            if len(list(conv.operands[1].uses)) == 1:
                copy.weights[w_key] = new                    # its own weight: a new array under its key
                conv.operands = [mul.results[0], *conv.operands[1:]]
                continue
            new_key = unique_name(f"{conv.loc}_filter_equalized", copy.weights)
            copy.weights[new_key] = new
            nw = top.Weight.create(result_types=[conv.operands[1].type])
            top.set_loc(nw, new_key)
            block.insert_op_before(nw, conv)
            conv.operands = [mul.results[0], nw.results[0], *conv.operands[2:]]
    return Equalization(copy, {n: factors[n] for n in products}, products)
