"""Element-wise TOP ops: binary arithmetic with numpy broadcasting and the activations."""

from __future__ import annotations

import math

import numpy as np

from tftpu.interp.kernels._registry import (
    aligned_empty, as_f32, channel_axis, is_float, post_relu, register, relu,
    relu_limit, tf)


def _binary(fn, name):
    def kernel(operands, attrs):
        a, b = operands[0], operands[1]
        if is_float(a) or is_float(b):
            a, b = as_f32(np.asarray(a)), as_f32(np.asarray(b))
        if isinstance(fn, np.ufunc):
            shape = np.broadcast_shapes(np.shape(a), np.shape(b))
            y = fn(a, b, out=aligned_empty(shape, np.result_type(a, b)))
        else:
            y = np.asarray(fn(a, b))
        return [post_relu(y, attrs, inplace=y.ndim > 0)]
    kernel.__name__ = name
    kernel.__doc__ = f"top.{name}: element-wise with numpy broadcasting (then the fused relu)."
    return kernel


def _div(a, b):
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        dtype = np.result_type(a, b)
        return np.trunc(np.divide(a, b, dtype=np.float64)).astype(dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.divide(a, b)


for _name, _fn in (("Add", np.add), ("Sub", np.subtract), ("Mul", np.multiply),
                   ("Div", _div), ("Max", np.maximum), ("Min", np.minimum)):
    register(f"top.{_name}")(_binary(_fn, _name))


def _unary(name, fn, mult=1):
    def kernel(operands, attrs):
        x = as_f32(operands[0]) if is_float(operands[0]) else operands[0]
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            return [np.asarray(fn(x, attrs)).astype(x.dtype, copy=False)]
    kernel.__name__ = name
    register(f"top.{name}")(kernel)
    return kernel


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _erf(x):
    return tf().math.erf(x).numpy()


_unary("Relu", lambda x, a: relu(x, relu_limit(a)))
_unary("Clip", lambda x, a: np.clip(
    x, -np.inf if a.get("min") is None else a["min"], np.inf if a.get("max") is None else a["max"]))
_unary("LeakyRelu", lambda x, a: np.where(x >= 0, x, x * np.float32(a.get("alpha", 0.01))))
_unary("Sigmoid", lambda x, a: _sigmoid(x), 4)
_unary("HardSigmoid", lambda x, a: np.clip(
    x * np.float32(a.get("alpha", 0.2)) + np.float32(a.get("beta", 0.5)), 0, 1), 3)
_unary("HardSwish", lambda x, a: x * np.clip(x * np.float32(1 / 6) + np.float32(0.5), 0, 1), 4)
_unary("SiLU", lambda x, a: x * _sigmoid(x), 5)
_unary("Tanh", lambda x, a: np.tanh(x), 4)
_unary("Exp", lambda x, a: np.exp(x))
_unary("Log", lambda x, a: np.log(x))
_unary("Sqrt", lambda x, a: np.sqrt(x))
_unary("Erf", lambda x, a: _erf(x), 4)
_unary("Abs", lambda x, a: np.abs(x))
_unary("Neg", lambda x, a: np.negative(x))
_unary("Floor", lambda x, a: np.floor(x))
_unary("Ceil", lambda x, a: np.ceil(x))
_unary("Round", lambda x, a: np.round(x))           # halves to even, as ONNX's Round
_unary("Sign", lambda x, a: np.sign(x))
_unary("Sin", lambda x, a: np.sin(x), 4)
_unary("Cos", lambda x, a: np.cos(x), 4)
_unary("Softsign", lambda x, a: x / (1 + np.abs(x)), 3)


def _gelu(x, attrs):
    if attrs["approximate"] == "tanh":
        c = np.float32(math.sqrt(2 / math.pi))
        return 0.5 * x * (1 + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))
    return 0.5 * x * (1 + _erf(x * np.float32(1 / math.sqrt(2))))


_unary("GELU", _gelu, 8)


@register("top.PRelu")
def prelu(operands, attrs):
    """top.PRelu: x where x >= 0 else slope * x; slope broadcasts like numpy (ONNX), or a
    1-D slope of C values on the channel axis."""
    x, slope = as_f32(operands[0]), as_f32(operands[1])
    try:
        np.broadcast_shapes(x.shape, slope.shape)
    except ValueError:
        slope = slope.reshape([-1] + [1] * (x.ndim - 1 - channel_axis(x.ndim, attrs))) \
            if slope.ndim <= 1 else slope
    return [np.where(x >= 0, x, x * slope).astype(np.float32, copy=False)]
