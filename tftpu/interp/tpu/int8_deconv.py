"""The INT8 kernel of `tpu.Deconv`: each kernel tap's products of the centred input with that
tap's INT8 weights, scattered to the output pixels it reaches (stride apart, offset by the tap
times the dilation), summed exactly, then the bias and `tpu.Conv`'s requantization.

The sums run as float64 matrix products: every product is an integer below 2**15 and every sum
below 2**53 for any filter under 2**37 taps, so float64 holds them exactly whatever the order.
"""

from __future__ import annotations

import math

import numpy as np

from tftpu.interp.kernels._registry import WEIGHTS
from tftpu.interp.tpu.int8_kernels import _centered, _per_channel, _requant
from tftpu.interp.tpu.registry import int8


def _taps(w: np.ndarray, group: int) -> np.ndarray:
    """The filter [I, O/g, *k] as float64 [*k, g, O/g, I/g]: per tap, per group, a matrix."""
    i, og = w.shape[:2]
    k = w.shape[2:]
    wg = np.asarray(w, np.float64).reshape(group, i // group, og, *k)
    order = [3 + a for a in range(len(k))] + [0, 2, 1]
    return np.ascontiguousarray(wg.transpose(order))


def deconv_sums(x: np.ndarray, w: np.ndarray, strides, pads, dilations, group: int, output_padding) -> np.ndarray:
    """Exact sums (float64 holding integers) of a transposed conv of NC* float64 `x` (centred)
    by filter [I, O/g, *k]: ONNX ConvTranspose, output_padding at the end."""
    n, c, *sp = x.shape
    k = w.shape[2:]
    nsp = len(sp)
    og = w.shape[1]
    taps = WEIGHTS.get(w, ("deconv_taps", group), lambda: _taps(w, group)) if isinstance(w, np.ndarray) \
        else _taps(w, group)
    full = [(sp[i] - 1) * strides[i] + dilations[i] * (k[i] - 1) + 1 + output_padding[i] for i in range(nsp)]
    acc = np.zeros((n, group, og, *full), np.float64)
    xg = x.reshape(n, group, c // group, math.prod(sp))
    for tap in np.ndindex(*k):
        part = np.matmul(taps[tap], xg).reshape(n, group, og, *sp)
        dst = tuple(slice(tap[i] * dilations[i], tap[i] * dilations[i] + strides[i] * (sp[i] - 1) + 1, strides[i])
                    for i in range(nsp))
        acc[(slice(None), slice(None), slice(None), *dst)] += part
    crop = tuple(slice(pads[i], full[i] - pads[nsp + i]) for i in range(nsp))
    return acc.reshape(n, group * og, *full)[(slice(None), slice(None), *crop)]


@int8("tpu.Deconv")
def deconv(operands, attrs, info):
    x, w, b = operands
    nhwc = attrs["layout"] == "NHWC"
    xc = _centered(x, info.ins[0])
    if nhwc:
        xc = np.moveaxis(xc, -1, 1)
    nsp = xc.ndim - 2
    output_padding = list(attrs.get("output_padding") or [0] * nsp)
    acc = deconv_sums(xc, w, list(attrs["strides"]), list(attrs["pads"]), list(attrs["dilations"]),
                      int(attrs["group"]), output_padding).astype(np.int64)
    if b is not None:
        acc += _per_channel(b, acc.ndim, 1)
    if nhwc:
        acc = np.ascontiguousarray(np.moveaxis(acc, 1, -1))
    return [_requant(acc, attrs, info.outs[0], acc.ndim - 1 if nhwc else 1)]
