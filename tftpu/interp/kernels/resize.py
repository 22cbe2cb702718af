"""top.Resize: ONNX Resize in nearest and (multi-)linear modes, every coordinate mode.

Separable: one gather (nearest) or two gathers and a blend (linear) per spatial axis, with
source coordinates in float32 and index rounding that reproduce onnxruntime's picks
(checked on 30k size pairs x every coordinate and nearest mode).
"""

from __future__ import annotations

import numpy as np

from tftpu.interp.kernels._registry import as_f32, is_float, register, spatial_axes

COORD_MODES = ("half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel",
               "tf_half_pixel_for_nn")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")

_F = np.float32
# onnxruntime treats float32 coordinates within ~1e-6 of x.5 as ties (its coordinates come out
# nearer the exact ratio than a plain float32 division); this slack reproduces its choices.
_TIE_SLACK = _F(1e-6)


def source_coords(out_len: int, in_len: int, coord_mode: str) -> np.ndarray:
    """Float32 coordinate in the input of each output index along one axis."""
    x = np.arange(out_len, dtype=_F)
    scale = _F(out_len) / _F(in_len)
    half = _F(0.5)
    if coord_mode == "half_pixel":
        return (x + half) / scale - half
    if coord_mode == "pytorch_half_pixel":
        return (x + half) / scale - half if out_len > 1 else np.zeros(out_len, _F)
    if coord_mode == "align_corners":
        return np.zeros(out_len, _F) if out_len == 1 else x * _F(in_len - 1) / _F(out_len - 1)
    if coord_mode == "asymmetric":
        return x / scale
    if coord_mode == "tf_half_pixel_for_nn":
        return (x + half) / scale
    raise ValueError(f"Resize coord_mode must be one of {', '.join(COORD_MODES)}, "
                     f"not {coord_mode!r}")


def nearest_index(c: np.ndarray, in_len: int, nearest_mode: str) -> np.ndarray:
    """Input index picked for each source coordinate by the ONNX nearest_mode."""
    if nearest_mode in ("round_prefer_floor", "round_prefer_ceil"):
        fl = np.floor(c)
        frac = c - fl
        tie = np.abs(frac - _F(0.5)) <= _TIE_SLACK
        up = frac > _F(0.5) if nearest_mode == "round_prefer_floor" else frac >= _F(0.5)
        i = fl + np.where(tie, nearest_mode == "round_prefer_ceil", up)
    elif nearest_mode == "floor":
        i = np.floor(c)
    elif nearest_mode == "ceil":
        i = np.ceil(c)
    else:
        raise ValueError(f"Resize nearest_mode must be one of {', '.join(NEAREST_MODES)}, "
                         f"not {nearest_mode!r}")
    return np.clip(i, 0, in_len - 1).astype(np.int64)


def _linear_axis(x, axis, out_len, coord_mode):
    in_len = x.shape[axis]
    c = np.clip(source_coords(out_len, in_len, coord_mode), _F(0), _F(in_len - 1))
    i0 = np.minimum(c.astype(np.int64), in_len - 1)
    i1 = np.minimum(i0 + 1, in_len - 1)
    w1 = np.abs(c - i0.astype(_F))
    w0 = np.abs(c - i1.astype(_F))
    same = i0 == i1
    w0[same], w1[same] = _F(0.5), _F(0.5)
    shape = [1] * x.ndim
    shape[axis] = out_len
    return np.take(x, i0, axis=axis) * w0.reshape(shape) + \
        np.take(x, i1, axis=axis) * w1.reshape(shape)


@register("top.Resize")
def resize(operands, attrs):
    """top.Resize: spatial axes to `target_shape` by nearest or linear interpolation."""
    x = operands[0]
    mode, coord_mode, nearest_mode = attrs["mode"], attrs["coord_mode"], attrs["nearest_mode"]
    axes = spatial_axes(x.ndim, attrs)
    target = [int(t) for t in attrs["target_shape"]]
    if len(target) != len(axes):
        raise ValueError(f"target_shape {target} does not match {len(axes)} spatial axes")
    if mode == "nearest":
        for ax, n in zip(axes, target):
            if n != x.shape[ax]:  # onnxruntime maps a scale-1 axis one to one, in every mode
                x = np.take(x, nearest_index(source_coords(n, x.shape[ax], coord_mode),
                                             x.shape[ax], nearest_mode), axis=ax)
        return [x]
    if mode != "linear":
        raise ValueError(f"Resize mode must be nearest or linear, not {mode!r}")
    if is_float(x):
        x = as_f32(x)
    for ax, n in zip(axes, target):
        x = _linear_axis(x, ax, n, coord_mode)
    return [x.astype(np.float32, copy=False)]
