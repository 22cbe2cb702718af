"""Pooling TOP ops (ONNX MaxPool / AveragePool / Global*Pool semantics), 1-D/2-D/3-D.

2-D and 3-D windows run TF's pooling on explicitly padded data; average pooling divides by
the window's count of real (or, with count_include_pad, real and pad) elements as ONNX does.
"""

from __future__ import annotations

import math

import numpy as np

from tftpu import geometry
from tftpu.interp.kernels._registry import (
    aligned_empty, as_f32, channels_last, ints, nchw_supported, post_relu, register,
    spatial_axes, tf, to_numpy)


def _pad_const(x, widths, fill):
    """Pad with a constant: fill a new array and copy `x` in (cheaper than np.pad)."""
    out = aligned_empty([d + b + e for d, (b, e) in zip(x.shape, widths)], x.dtype)
    out.fill(fill)
    out[tuple(slice(b, b + d) for d, (b, _) in zip(x.shape, widths))] = x
    return out


def _window_reduce(xp, k, s, d, out, axes, reduce):
    """Reduce strided windows of an already padded array with a binary ufunc (numpy path)."""
    acc = None
    for off in np.ndindex(*k):
        sl = [slice(None)] * xp.ndim
        for i, ax in enumerate(axes):
            start = off[i] * d[i]
            sl[ax] = slice(start, start + s[i] * (out[i] - 1) + 1, s[i])
        v = xp[tuple(sl)]
        acc = v.copy() if acc is None else reduce(acc, v, out=acc)
    return acc


def _tf_pool(xp, kind, k, s, nhwc):
    """VALID pooling of an already padded 2-D/3-D array with TF; None when TF cannot."""
    t = tf()
    nsp = len(k)
    if nsp == 2:
        fn = t.nn.max_pool2d if kind == "max" else t.nn.avg_pool2d
        if not nhwc and not nchw_supported():
            y = to_numpy(fn(np.ascontiguousarray(xp.transpose(0, 2, 3, 1)), k, s, "VALID"))
            return np.ascontiguousarray(y.transpose(0, 3, 1, 2))
        return to_numpy(fn(xp, k, s, "VALID", data_format="NHWC" if nhwc else "NCHW"))
    if nsp == 3:
        fn = t.nn.max_pool3d if kind == "max" else t.nn.avg_pool3d
        x5 = xp if nhwc else xp.transpose(0, 2, 3, 4, 1)
        y = to_numpy(fn(x5, k, s, "VALID"))
        return y if nhwc else y.transpose(0, 4, 1, 2, 3)
    return None


def _pool(x, attrs, kind):
    nhwc = channels_last(attrs)
    axes = spatial_axes(x.ndim, attrs)
    nsp = len(axes)
    k = ints(attrs, "kernel_shape", nsp, 1)
    s = ints(attrs, "strides", nsp, 1)
    pads = ints(attrs, "pads", 2 * nsp, 0)
    d = ints(attrs, "dilations", nsp, 1)
    ceil_mode = bool(attrs.get("ceil_mode", False))
    geo = [geometry.pool_window(x.shape[ax], k[i], s[i], pads[i], pads[nsp + i], d[i], ceil_mode)
           for i, ax in enumerate(axes)]
    out = [g[0] for g in geo]
    widths = [(0, 0)] * x.ndim
    for i, ax in enumerate(axes):
        widths[ax] = (pads[i], pads[nsp + i] + geo[i][1])
    padded = any(w != (0, 0) for w in widths)
    fill = (np.iinfo(x.dtype).min if x.dtype.kind in "iu" else -np.inf) if kind == "max" else 0.0
    xp = _pad_const(x, widths, fill) if padded else x
    use_tf = all(di == 1 for di in d) and nsp in (2, 3) and x.dtype == np.float32
    if kind == "max":
        y = _tf_pool(xp, "max", k, s, nhwc) if use_tf else None
        if y is None:
            y = _window_reduce(xp, k, s, d, out, axes, np.maximum)
        return y
    # average: sum over the window / count of counted elements
    if use_tf:
        y = _tf_pool(xp, "avg", k, s, nhwc)
        scaled = True
    else:
        y = _window_reduce(xp, k, s, d, out, axes, np.add)
        scaled = False
    include_pad = bool(attrs.get("count_include_pad", False))
    if not padded or (include_pad and not any(g[1] for g in geo)):
        return y if scaled else y / np.float32(math.prod(k))
    shape = [1] * x.ndim
    mshape = [1] * x.ndim
    for i, ax in enumerate(axes):
        shape[ax] = x.shape[ax] + pads[i] + pads[nsp + i] + geo[i][1]
        mshape[ax] = out[i]
    mask = np.zeros(shape, np.float32)
    sl = [slice(None)] * x.ndim
    for i, ax in enumerate(axes):
        lo = 0 if include_pad else pads[i]
        hi = x.shape[ax] + pads[i] + (pads[nsp + i] if include_pad else 0)
        sl[ax] = slice(lo, hi)
    mask[tuple(sl)] = 1.0
    count = _window_reduce(mask, k, s, d, out, axes, np.add).reshape(mshape)
    if scaled:
        return (y * (np.float32(math.prod(k)) / count)).astype(np.float32)
    return (y / count).astype(np.float32)


@register("top.MaxPool")
def max_pool(operands, attrs):
    """top.MaxPool: ONNX MaxPool (pads, ceil_mode, dilations) + fused relu."""
    x = operands[0]
    x = as_f32(x) if x.dtype.kind == "f" else x
    if x.dtype.kind in "iu":         # integers: the window maximum in their own type (exact)
        return [post_relu(_pool(x, attrs, "max"), attrs)]
    if x.dtype.kind != "f":
        return [post_relu(_pool(x.astype(np.float64), attrs, "max").astype(x.dtype), attrs)]
    return [post_relu(_pool(x, attrs, "max"), attrs)]


@register("top.AvgPool")
def avg_pool(operands, attrs):
    """top.AvgPool: ONNX AveragePool (pads, ceil_mode, count_include_pad) + fused relu."""
    return [post_relu(_pool(as_f32(operands[0]), attrs, "avg"), attrs)]


def _global(x, attrs, fn):
    axes = tuple(spatial_axes(x.ndim, attrs))
    keep = attrs.get("keepdims", True)
    return fn(x, axis=axes, keepdims=True if keep is None else bool(keep))


@register("top.GlobalAvgPool")
def global_avg_pool(operands, attrs):
    """top.GlobalAvgPool: mean over the spatial axes."""
    return [_global(as_f32(operands[0]), attrs, np.mean).astype(np.float32, copy=False)]


@register("top.GlobalMaxPool")
def global_max_pool(operands, attrs):
    """top.GlobalMaxPool: max over the spatial axes."""
    return [_global(operands[0], attrs, np.max)]
