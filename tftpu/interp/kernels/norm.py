"""Normalisation TOP ops: BatchNorm (inference form), Scale (per-channel affine), LayerNorm, Softmax."""

from __future__ import annotations

import numpy as np

from tftpu.interp.kernels._registry import (
    aligned_empty, as_f32, channel_axis, per_channel, post_relu, register)


@register("top.BatchNorm")
def batch_norm(operands, attrs):
    """top.BatchNorm: (x - mean) / sqrt(var + eps) * scale + bias on the channel axis."""
    x, mean, var, scale, bias = (as_f32(o) for o in operands[:5])
    ax = channel_axis(x.ndim, attrs) if x.ndim > 1 else 0
    eps = np.float32(attrs["epsilon"])
    inv = scale / np.sqrt(var + eps)
    y = np.multiply(x, per_channel(inv, x.ndim, ax), out=aligned_empty(x.shape))
    y += per_channel(bias - mean * inv, x.ndim, ax)
    return [y.astype(np.float32, copy=False)]


@register("top.Scale")
def scale(operands, attrs):
    """top.Scale: x * scale + bias per channel (the folded form of BatchNorm) + fused relu."""
    x, s = as_f32(operands[0]), as_f32(operands[1])
    b = operands[2] if len(operands) > 2 else None
    ax = channel_axis(x.ndim, attrs) if x.ndim > 1 else 0
    y = np.multiply(x, per_channel(s, x.ndim, ax), out=aligned_empty(x.shape))
    if b is not None:
        y += per_channel(as_f32(b), x.ndim, ax)
    return [post_relu(y.astype(np.float32, copy=False), attrs, inplace=True)]


@register("top.LayerNorm")
def layer_norm(operands, attrs):
    """top.LayerNorm: (x - mean) / sqrt(var + eps) * scale + bias over `axes` (as Keras and TF compute it)."""
    x = as_f32(operands[0])
    axes = tuple(sorted(a % x.ndim for a in attrs["axes"]))
    mean = np.mean(x, axis=axes, keepdims=True)
    centred = x - mean
    var = np.mean(centred * centred, axis=axes, keepdims=True)
    y = centred * (np.float32(1) / np.sqrt(var + np.float32(attrs["eps"])))
    if len(operands) > 1 and operands[1] is not None:
        y *= as_f32(operands[1])
    if len(operands) > 2 and operands[2] is not None:
        y += as_f32(operands[2])
    return [y.astype(np.float32, copy=False)]


@register("top.Softmax")
def softmax(operands, attrs):
    """top.Softmax: softmax (or log-softmax when `log`) along `axis` (ONNX opset >= 13)."""
    x = as_f32(operands[0])
    axis = int(attrs["axis"])
    z = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(z)
    s = np.sum(e, axis=axis, keepdims=True)
    if attrs["log"]:
        return [(z - np.log(s)).astype(np.float32, copy=False)]
    return [(e / s).astype(np.float32, copy=False)]
