"""Data-movement TOP ops: Concat, Reshape, Flatten, Permute, Pad, Slice, Split, Squeeze,
Unsqueeze, SpaceToDepth, DepthToSpace, Cast, Gather. Integer tensors keep their dtype."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from tftpu.interp.kernels._registry import (
    aligned_empty, channels_last, post_relu, register)


def _common_dtype(xs):
    return np.result_type(*xs) if len({x.dtype for x in xs}) > 1 else xs[0].dtype


@register("top.Concat")
def concat(operands, attrs):
    """top.Concat: join along `axis` (+ fused relu)."""
    xs = [np.asarray(x) for x in operands]
    axis = int(attrs.get("axis", 0)) % max(xs[0].ndim, 1)
    shape = list(xs[0].shape)
    shape[axis] = sum(x.shape[axis] for x in xs)
    y = np.concatenate(xs, axis=axis, out=aligned_empty(shape, _common_dtype(xs)))
    return [post_relu(y, attrs, inplace=True)]


@register("top.Reshape")
def reshape(operands, attrs):
    """top.Reshape: to the static `shape` (-1 allowed once)."""
    return [np.reshape(operands[0], [int(d) for d in attrs["shape"]])]


@register("top.Flatten")
def flatten(operands, attrs):
    """top.Flatten: merge axes start_dim..end_dim (inclusive, negatives from the end)."""
    x = operands[0]
    r = x.ndim
    s, e = int(attrs["start_dim"]), int(attrs["end_dim"])
    s, e = s % r if r else 0, e % r if r else 0
    shape = list(x.shape[:s]) + [math.prod(x.shape[s:e + 1])] + list(x.shape[e + 1:])
    return [np.reshape(x, shape)]


@register("top.Permute")
def permute(operands, attrs):
    """top.Permute: transpose to `order` (ONNX Transpose perm)."""
    order = attrs.get("order")
    view = np.transpose(operands[0], None if order is None else [int(o) for o in order])
    out = aligned_empty(view.shape, view.dtype)
    np.copyto(out, view)
    return [out]


@register("top.Pad")
def pad(operands, attrs):
    """top.Pad: ONNX Pad; `paddings` = [begins..., ends...], negative values crop."""
    x = operands[0]
    p = [int(v) for v in attrs["paddings"]]
    r = x.ndim
    mode = attrs.get("mode", "constant") or "constant"
    crop = tuple(slice(max(0, -p[i]), x.shape[i] - max(0, -p[i + r])) for i in range(r))
    x = x[crop]
    widths = [(max(0, p[i]), max(0, p[i + r])) for i in range(r)]
    if mode == "constant":
        return [np.pad(x, widths, constant_values=np.asarray(attrs.get("val", 0.0) or 0)
                       .astype(x.dtype))]
    if mode not in ("reflect", "edge"):
        raise ValueError(f"Pad mode must be constant, reflect or edge, not {mode!r}")
    return [np.pad(x, widths, mode=mode)]


def onnx_slice(dim, start, end, step):
    """A Python slice for one axis with ONNX Slice's clamping of start/end."""
    if step == 0:
        raise ValueError("Slice step must not be 0")
    if start < 0:
        start += dim
    if end < 0:
        end += dim
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return slice(start, None if end < 0 else end, step)


@register("top.Slice")
def slice_(operands, attrs):
    """top.Slice: ONNX Slice with static starts/ends/steps/axes (ends clamped like ONNX)."""
    x = operands[0]
    starts = [int(v) for v in attrs["starts"]]
    ends = [int(v) for v in attrs["ends"]]
    axes = attrs.get("axes") or list(range(len(starts)))
    steps = attrs.get("steps") or [1] * len(starts)
    sl = [slice(None)] * x.ndim
    for a, b, e, st in zip(axes, starts, ends, steps):
        a = int(a) % x.ndim
        sl[a] = onnx_slice(x.shape[a], b, e, int(st))
    return [np.ascontiguousarray(x[tuple(sl)])]


@register("top.Split")
def split(operands, attrs):
    """top.Split: cut along `axis` into pieces of `split_size`."""
    x = operands[0]
    axis = int(attrs.get("axis", 0)) % x.ndim
    sizes = [int(s) for s in attrs["split_size"]]
    if sum(sizes) != x.shape[axis]:
        raise ValueError(f"Split sizes {sizes} do not add up to axis {axis} size {x.shape[axis]}")
    cuts = np.cumsum(sizes)[:-1]
    return [np.ascontiguousarray(p) for p in np.split(x, cuts, axis=axis)]


@register("top.Squeeze")
def squeeze(operands, attrs):
    """top.Squeeze: drop the size-1 `axes` (all size-1 axes when empty)."""
    x = operands[0]
    axes = attrs.get("axes")
    if not axes:
        return [np.squeeze(x)]
    return [np.squeeze(x, axis=tuple(int(a) % x.ndim for a in axes))]


@register("top.Unsqueeze")
def unsqueeze(operands, attrs):
    """top.Unsqueeze: insert size-1 `axes` (positions in the result)."""
    x = operands[0]
    r = x.ndim + len(attrs["axes"])
    return [np.expand_dims(x, tuple(sorted(int(a) % r for a in attrs["axes"])))]


def _block_mode(attrs):
    mode = attrs["mode"].upper()
    if mode not in ("DCR", "CRD"):
        raise ValueError(f"mode must be DCR or CRD, not {mode!r}")
    return mode


def _block_rearrange(operands, attrs, fn):
    """Shared by DepthToSpace/SpaceToDepth: `fn(x_nchw, block, mode)` on an NCHW view of the
    input (NHWC when the op's layout says so), the result back in the op's layout."""
    x = operands[0]
    b = int(attrs["block_size"])
    mode = _block_mode(attrs)
    nhwc = channels_last(attrs)
    y = fn(x.transpose(0, 3, 1, 2) if nhwc else x, b, mode)
    return [np.ascontiguousarray(y.transpose(0, 2, 3, 1) if nhwc else y)]


def _d2s(x, b, mode):
    n, c, h, w = x.shape
    if mode == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (b * b), h * b, w * b)


def _s2d(x, b, mode):
    n, c, h, w = x.shape
    y = x.reshape(n, c, h // b, b, w // b, b)
    y = y.transpose(0, 3, 5, 1, 2, 4) if mode == "DCR" else y.transpose(0, 1, 3, 5, 2, 4)
    return y.reshape(n, c * b * b, h // b, w // b)


@register("top.DepthToSpace")
def depth_to_space(operands, attrs):
    """top.DepthToSpace: ONNX DepthToSpace (DCR: depth-column-row, CRD: column-row-depth)."""
    return _block_rearrange(operands, attrs, _d2s)


@register("top.SpaceToDepth")
def space_to_depth(operands, attrs):
    """top.SpaceToDepth: ONNX SpaceToDepth (DCR channel order, the ONNX/TF one) or CRD."""
    return _block_rearrange(operands, attrs, _s2d)


CAST_TYPES = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16,
              "i8": np.int8, "u8": np.uint8, "i32": np.int32, "i64": np.int64,
              "f64": np.float64, "bool": np.bool_}


@register("top.Cast")
def cast(operands, attrs):
    """top.Cast: convert to `to` (f32/f16/bf16/i8/u8/i32/i64); float -> int truncates."""
    to = attrs["to"]
    if to not in CAST_TYPES:
        raise ValueError(f"Cast to {to!r} is not one of {', '.join(CAST_TYPES)}")
    x = operands[0]
    dt = np.dtype(CAST_TYPES[to])
    if x.dtype.name == "bfloat16" and dt.kind in "iub":
        x = x.astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        return [np.asarray(x).astype(dt)]


@register("top.Gather")
def gather(operands, attrs):
    """top.Gather: ONNX Gather along `axis` (negative indices count from the end)."""
    x, idx = operands[0], np.asarray(operands[1])
    axis = int(attrs.get("axis", 0)) % max(x.ndim, 1)
    idx = np.where(idx < 0, idx + x.shape[axis], idx).astype(np.int64)
    return [np.take(x, idx, axis=axis)]
