"""The TOP dialect: framework-neutral tensor ops (ONNX-like, NCHW by default), on xDSL IRDL.

Each op declares on its class (see `tftpu.ir.base`) its operands and results, its typed
attributes with their defaults (`ATTRS`, each also an accessor: `conv.group`), its traits, its
shape function `infer` and its FLOPs `count_flops`. Op semantics follow the ONNX op of the same
name. Tables about ops elsewhere (kernels, lowerings, layout rules, chip formats) are keyed by
the full name, `top.Conv`.

>>> Conv.name, Conv.ATTRS["group"].default
('top.Conv', 1)
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
from xdsl.dialects.builtin import NoneType, TensorType
from xdsl.ir import Dialect
from xdsl.irdl import operand_def, result_def, var_operand_def, var_result_def
from xdsl.utils.exceptions import VerifyException

from tftpu import geometry
from tftpu.errors import ShapeError
from tftpu.ir.base import (  # noqa: F401  (REQUIRED and the loc helpers are re-exported)
    REQUIRED,
    Bool,
    Commutative,
    Elementwise,
    Interpolable,
    LookupTable,
    Float,
    Int,
    Ints,
    Pure,
    Str,
    TensorOp,
    define_op,
    loc_name,
    loc_names,
    numel,
    set_loc,
)

LAYOUTS = ("NCHW", "NHWC")
_RELU = {"do_relu": Bool(False), "relu_limit": Float(-1.0)}


class TopOp(TensorOp):
    """Base of every TOP op."""

    TRAITS: ClassVar[tuple] = (Pure(),)

    @property
    def op_name(self) -> str:
        """The op's name without `top.`, for messages; tables are keyed by the full `name`."""
        return self.name[4:]

    def check(self, shapes: list, attrs: dict) -> None:
        if "layout" in attrs and attrs["layout"] not in LAYOUTS:
            raise ValueError(f"layout must be NCHW or NHWC, got {attrs['layout']!r}")


top_op = define_op


def per_output(mult: int = 1, fused_relu: bool = False):
    """A `count_flops` of `mult` operations per output element (+1 for a fused ReLU)."""

    def count_flops(cls, ins, outs, attrs):
        n = numel(outs[0])
        return n * mult + (n if fused_relu and attrs.get("do_relu") else 0)

    return classmethod(count_flops)


def _relu_flops(n: int, attrs: dict) -> int:
    return n if attrs.get("do_relu") else 0


# ---------------------------------------------------------------- shape helpers

def _axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} out of range for rank {rank}")
    return axis % rank if rank else 0


def _spatial(shape, layout: str) -> tuple[list[int], int]:
    """(spatial dims, channels) of an activation shape."""
    if layout == "NHWC":
        return list(shape[1:-1]), shape[-1]
    return list(shape[2:]), shape[1]


def _with_spatial(shape, layout: str, channels: int, spatial) -> tuple:
    if layout == "NHWC":
        return (shape[0], *spatial, channels)
    return (shape[0], channels, *spatial)


def _window_defaults(attrs: dict, n: int) -> dict:
    for key, val in (("strides", 1), ("dilations", 1), ("output_padding", 0)):
        if key in attrs and not attrs[key]:
            attrs[key] = [val] * n
    if "pads" in attrs and not attrs["pads"]:
        attrs["pads"] = [0] * (2 * n)
    return attrs


def _check_window(attrs: dict, n: int) -> None:
    k = attrs["kernel_shape"]
    if len(k) != n:
        raise ValueError(f"kernel_shape {k} has {len(k)} dims, input has {n} spatial dims")
    for key, want in (("strides", n), ("dilations", n), ("pads", 2 * n), ("output_padding", n)):
        if key in attrs and len(attrs[key]) != want:
            raise ValueError(f"{key} {attrs[key]} must have {want} values")
    if any(v <= 0 for v in k) or any(v <= 0 for v in attrs["strides"]):
        raise ValueError("kernel_shape and strides must be positive")
    if any(p < 0 for p in attrs["pads"]):
        raise ValueError(f"pads {attrs['pads']} must be non-negative")


def _check_per_channel(shapes, attrs: dict) -> None:
    """Every operand after the data input holds one value per channel of the data input."""
    _, c = _spatial(shapes[0], attrs["layout"])
    for s in shapes[1:]:
        if math.prod(s) != c:
            raise ValueError(f"per-channel operand {s} must have {c} values")


def slice_len(dim: int, start: int, end: int, step: int) -> tuple[int, int, int]:
    """ONNX Slice clamping: (clamped start, clamped end, length)."""
    if step == 0:
        raise ValueError("slice step must not be 0")
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        n = max(0, -(-(end - start) // step))
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
        n = max(0, -(-(start - end) // -step))
    return start, end, n


# ---------------------------------------------------------------- graph ops

@top_op
class Input(TopOp):
    """A model input; its location names the input."""

    name = "top.Input"
    input = operand_def(TensorType)
    output = result_def(TensorType)


@top_op
class Weight(TopOp):
    """A constant tensor whose data lives in the module's weight file under the op's location."""

    name = "top.Weight"
    output = result_def(TensorType)

    ATTRS: ClassVar[dict] = {"key": Str(None)}

    @property
    def key(self) -> str:
        """The array's key in the weight file: the `key` attribute, else the location name.

        A key of its own lets one tensor own several arrays (an INT8 conv's weights, bias,
        multipliers) and keeps a weight's file entry stable when a pass renames the tensor."""
        return self.attr_value("key") or self.loc

    @classmethod
    def infer(cls, shapes, attrs):
        raise ShapeError("top.Weight takes its shape from the weight file, not from operands")

    def verify_(self) -> None:
        if not self.key:
            raise VerifyException("top.Weight needs a key or a location name (its key in the weight file)")
        if not isinstance(self.output.type, TensorType):
            raise VerifyException(f"top.Weight at {self.loc!r}: result must be a tensor")


@top_op
class NoneOp(TopOp):
    """The absent operand (e.g. a conv without bias)."""

    name = "top.None"
    output = result_def(NoneType)

    def verify_(self) -> None:
        pass


# ---------------------------------------------------------------- conv / matmul

@top_op
class Conv(TopOp):
    """N-D convolution (1-D/2-D/3-D), groups, dilations, explicit pads, optional fused ReLU."""

    name = "top.Conv"
    input = operand_def()
    filter = operand_def()
    bias = operand_def()
    output = result_def(TensorType)
    OPTIONAL_OPERANDS: ClassVar[tuple[int, ...]] = (2,)
    ATTRS: ClassVar[dict] = {"kernel_shape": Ints(), "strides": Ints(()), "pads": Ints(()),
             "dilations": Ints(()), "group": Int(1), **_RELU, "layout": Str("NCHW"),
             "kernel_layout": Str("OIHW")}

    def fill_defaults(self, attrs, shapes):
        return _window_defaults(attrs, len(shapes[0]) - 2)

    def check(self, shapes, attrs):
        super().check(shapes, attrs)
        x, w, b = shapes
        n = len(x) - 2
        if not 1 <= n <= 3 or len(w) != len(x):
            raise ValueError(f"input {x} and filter {w} must both be 3-D, 4-D or 5-D")
        _check_window(attrs, n)
        g = attrs["group"]
        _, c = _spatial(x, attrs["layout"])
        if attrs["kernel_layout"] == "HWIO":
            k, ci, o = list(w[:-2]), w[-2], w[-1]
        elif attrs["kernel_layout"] == "OIHW":
            k, ci, o = list(w[2:]), w[1], w[0]
        else:
            raise ValueError(f"kernel_layout must be OIHW or HWIO, got {attrs['kernel_layout']!r}")
        if k != list(attrs["kernel_shape"]):
            raise ValueError(f"filter {w} does not match kernel_shape {attrs['kernel_shape']}")
        if g < 1 or c != ci * g or o % g:
            raise ValueError(f"input channels {c}, filter {w} and group {g} disagree")
        if b is not None and math.prod(b) != o:
            raise ValueError(f"bias {b} must have {o} values")

    @classmethod
    def count_flops(cls, ins, outs, attrs):
        w = ins[1]
        taps = numel(w[:-2]) * w[-2] if attrs["kernel_layout"] == "HWIO" else numel(w[1:])
        n = numel(outs[0])
        has_bias = len(ins) > 2 and ins[2] is not None
        return n * (2 * taps + (1 if has_bias else 0)) + _relu_flops(n, attrs)

    @classmethod
    def infer(cls, shapes, attrs):
        x, w = shapes[0], shapes[1]
        o = w[-1] if attrs["kernel_layout"] == "HWIO" else w[0]
        sp, _ = _spatial(x, attrs["layout"])
        n = len(sp)
        p = attrs["pads"]
        out = [geometry.conv_out(sp[i], attrs["kernel_shape"][i], attrs["strides"][i], attrs["dilations"][i],
                        p[i], p[i + n]) for i in range(n)]
        if any(v <= 0 for v in out):
            raise ValueError(f"empty output spatial size {out}")
        return [_with_spatial(x, attrs["layout"], o, out)]


@top_op
class Deconv(TopOp):
    """Transposed convolution (ONNX ConvTranspose); filter [I, O/g, *k]."""

    name = "top.Deconv"
    input = operand_def()
    filter = operand_def()
    bias = operand_def()
    output = result_def(TensorType)
    OPTIONAL_OPERANDS: ClassVar[tuple[int, ...]] = (2,)
    ATTRS: ClassVar[dict] = {"kernel_shape": Ints(), "strides": Ints(()), "pads": Ints(()),
             "dilations": Ints(()), "group": Int(1), "output_padding": Ints(()),
             **_RELU, "layout": Str("NCHW")}

    def fill_defaults(self, attrs, shapes):
        return _window_defaults(attrs, len(shapes[0]) - 2)

    def check(self, shapes, attrs):
        super().check(shapes, attrs)
        x, w, b = shapes
        n = len(x) - 2
        if not 1 <= n <= 3 or len(w) != len(x):
            raise ValueError(f"input {x} and filter {w} must both be 3-D, 4-D or 5-D")
        _check_window(attrs, n)
        _, c = _spatial(x, attrs["layout"])
        if list(w[2:]) != list(attrs["kernel_shape"]) or w[0] != c:
            raise ValueError(f"filter {w} does not match input channels {c} / kernel_shape")
        o = w[1] * attrs["group"]
        if b is not None and math.prod(b) != o:
            raise ValueError(f"bias {b} must have {o} values")

    @classmethod
    def count_flops(cls, ins, outs, attrs):
        n_out = numel(outs[0])
        has_bias = len(ins) > 2 and ins[2] is not None
        return numel(ins[0]) * 2 * numel(ins[1][1:]) + (n_out if has_bias else 0) + _relu_flops(n_out, attrs)

    @classmethod
    def infer(cls, shapes, attrs):
        x, w = shapes[0], shapes[1]
        sp, _ = _spatial(x, attrs["layout"])
        n, p = len(sp), attrs["pads"]
        out = [geometry.deconv_out(sp[i], attrs["kernel_shape"][i], attrs["strides"][i], attrs["dilations"][i],
                                   p[i], p[i + n], attrs["output_padding"][i]) for i in range(n)]
        return [_with_spatial(x, attrs["layout"], w[1] * attrs["group"], out)]


@top_op
class MatMul(TopOp):
    """Batched matmul with broadcasting, optional bias on the last axis and fused ReLU."""

    name = "top.MatMul"
    input = operand_def()
    right = operand_def()
    bias = operand_def()
    output = result_def(TensorType)
    OPTIONAL_OPERANDS: ClassVar[tuple[int, ...]] = (2,)
    ATTRS: ClassVar[dict] = {"right_transpose": Bool(False), **_RELU}

    @classmethod
    def count_flops(cls, ins, outs, attrs):
        k = ins[0][-1] if len(ins[0]) else 1
        n = numel(outs[0])
        has_bias = len(ins) > 2 and ins[2] is not None
        return n * 2 * k + (n if has_bias else 0) + _relu_flops(n, attrs)

    @classmethod
    def infer(cls, shapes, attrs):
        a, b, bias = shapes
        if len(a) < 2 or len(b) < 2:
            raise ValueError(f"operands {a} and {b} must have rank >= 2")
        n, k2 = (b[-2], b[-1]) if attrs["right_transpose"] else (b[-1], b[-2])
        if a[-1] != k2:
            raise ValueError(f"contraction sizes differ: {a} x {b}")
        batch = np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
        out = (*batch, a[-2], n)
        if bias is not None:
            if np.broadcast_shapes(tuple(bias), out) != out:
                raise ValueError(f"bias {bias} does not broadcast to {out}")
        return [out]


# ---------------------------------------------------------------- elementwise

class _Binary(TopOp):
    input = operand_def()
    other = operand_def()
    output = result_def(TensorType)
    TRAITS: ClassVar[tuple] = (Pure(), Elementwise())
    count_flops = per_output(1, fused_relu=True)

    @classmethod
    def infer(cls, shapes, attrs):
        try:
            return [tuple(np.broadcast_shapes(tuple(shapes[0]), tuple(shapes[1])))]
        except ValueError:
            raise ValueError(f"operands {shapes[0]} and {shapes[1]} do not broadcast") from None


@top_op
class Add(_Binary):
    """a + b with numpy broadcasting."""
    name = "top.Add"
    TRAITS: ClassVar[tuple] = (Pure(), Elementwise(), Commutative())
    ATTRS: ClassVar[dict] = dict(_RELU)


@top_op
class Sub(_Binary):
    """a - b with numpy broadcasting."""
    name = "top.Sub"
    ATTRS: ClassVar[dict] = dict(_RELU)


@top_op
class Mul(_Binary):
    """a * b with numpy broadcasting."""
    name = "top.Mul"
    TRAITS: ClassVar[tuple] = (Pure(), Elementwise(), Commutative())
    ATTRS: ClassVar[dict] = dict(_RELU)


@top_op
class Div(_Binary):
    """a / b with numpy broadcasting."""
    name = "top.Div"


@top_op
class Max(_Binary):
    """Elementwise maximum with broadcasting."""
    name = "top.Max"
    TRAITS: ClassVar[tuple] = (Pure(), Elementwise(), Commutative())


@top_op
class Min(_Binary):
    """Elementwise minimum with broadcasting."""
    name = "top.Min"
    TRAITS: ClassVar[tuple] = (Pure(), Elementwise(), Commutative())


@top_op
class PRelu(_Binary):
    """x if x > 0 else slope * x; slope broadcast on the channel axis."""
    name = "top.PRelu"
    count_flops = per_output(2)

    @classmethod
    def infer(cls, shapes, attrs):
        return [shapes[0]]


class _Unary(TopOp):
    input = operand_def()
    output = result_def(TensorType)


def _unary(op_name: str, doc: str, attrs: dict | None = None, flops: int = 1, smooth: bool = True):
    """An element-wise function `top.<op_name>` costing `flops` per element (INT8: a lookup table;
    `smooth`: continuous, of bounded slope, so a 16-bit input may interpolate the table)."""
    traits = (Pure(), Elementwise(), LookupTable()) + ((Interpolable(),) if smooth else ())
    cls = type(op_name, (_Unary,), {"name": f"top.{op_name}", "__doc__": doc,
                                    "ATTRS": attrs or {}, "__module__": __name__,
                                    "TRAITS": traits, "count_flops": per_output(flops),
                                    "__annotations__": {"ATTRS": ClassVar[dict], "TRAITS": ClassVar[tuple]}})
    return top_op(cls)


Relu = _unary("Relu", "max(x, 0), clipped at relu_limit when it is >= 0.", {"relu_limit": Float(-1.0)})
Clip = _unary("Clip", "min(max(x, min), max).", {"min": Float(), "max": Float()})
LeakyRelu = _unary("LeakyRelu", "x if x >= 0 else alpha * x.", {"alpha": Float(0.01)})
Sigmoid = _unary("Sigmoid", "1 / (1 + exp(-x)).", flops=4)
HardSigmoid = _unary("HardSigmoid", "max(0, min(1, alpha * x + beta)).",
                     {"alpha": Float(0.2), "beta": Float(0.5)}, flops=3)
HardSwish = _unary("HardSwish", "x * max(0, min(1, x / 6 + 1 / 2)).", flops=4)
SiLU = _unary("SiLU", "x * sigmoid(x).", flops=5)
Tanh = _unary("Tanh", "tanh(x).", flops=4)
Exp = _unary("Exp", "exp(x).")
Log = _unary("Log", "natural log.", smooth=False)
Sqrt = _unary("Sqrt", "square root.", smooth=False)
Erf = _unary("Erf", "error function.", flops=4)
Abs = _unary("Abs", "absolute value.")
Neg = _unary("Neg", "-x.")
GELU = _unary("GELU", "x * Phi(x), exact or tanh-approximated.", {"approximate": Str("none")}, flops=8)
Floor = _unary("Floor", "largest integer <= x.", smooth=False)
Ceil = _unary("Ceil", "smallest integer >= x.", smooth=False)
Round = _unary("Round", "nearest integer, halves to even (ONNX's Round).", smooth=False)
Sign = _unary("Sign", "-1, 0 or 1 as x is negative, zero or positive.", smooth=False)
Sin = _unary("Sin", "sine.", flops=4)
Cos = _unary("Cos", "cosine.", flops=4)
Softsign = _unary("Softsign", "x / (1 + |x|).", flops=3)


@top_op
class Softmax(_Unary):
    """Softmax (or log-softmax) along one axis."""
    name = "top.Softmax"
    count_flops = per_output(5)
    ATTRS: ClassVar[dict] = {"axis": Int(-1), "log": Bool(False)}

    def check(self, shapes, attrs):
        _axis(attrs["axis"], len(shapes[0]))


@top_op
class Cast(_Unary):
    """Element type conversion."""
    name = "top.Cast"
    TRAITS: ClassVar[tuple] = (Pure(), Elementwise())
    count_flops = per_output(1)
    ATTRS: ClassVar[dict] = {"to": Str()}

    def check(self, shapes, attrs):
        if attrs["to"] not in ("f32", "f16", "bf16", "i8", "u8", "i32", "i64"):
            raise ValueError(f"cannot cast to {attrs['to']!r}")

    @classmethod
    def infer_dtypes(cls, dtypes, attrs):
        return [attrs["to"]]


# ---------------------------------------------------------------- pooling / normalization

class _Pool(_Unary):
    ATTRS: ClassVar[dict] = {"kernel_shape": Ints(), "strides": Ints(()), "pads": Ints(()),
             "count_include_pad": Bool(False), "ceil_mode": Bool(False), **_RELU,
             "layout": Str("NCHW")}

    def fill_defaults(self, attrs, shapes):
        return _window_defaults(attrs, len(shapes[0]) - 2)

    @classmethod
    def count_flops(cls, ins, outs, attrs):
        n = numel(outs[0])
        return n * math.prod(attrs["kernel_shape"]) + _relu_flops(n, attrs)

    def check(self, shapes, attrs):
        super().check(shapes, attrs)
        n = len(shapes[0]) - 2
        if not 1 <= n <= 3:
            raise ValueError(f"input {shapes[0]} must be 3-D, 4-D or 5-D")
        _check_window(attrs, n)

    @classmethod
    def infer(cls, shapes, attrs):
        x = shapes[0]
        sp, c = _spatial(x, attrs["layout"])
        n, p = len(sp), attrs["pads"]
        out = [geometry.pool_out(sp[i], attrs["kernel_shape"][i], attrs["strides"][i], p[i], p[i + n],
                        attrs["ceil_mode"]) for i in range(n)]
        if any(v <= 0 for v in out):
            raise ValueError(f"empty output spatial size {out}")
        return [_with_spatial(x, attrs["layout"], c, out)]


@top_op
class MaxPool(_Pool):
    """Max pooling, 1/2/3-D."""
    name = "top.MaxPool"


@top_op
class AvgPool(_Pool):
    """Average pooling, 1/2/3-D."""
    name = "top.AvgPool"


class _GlobalPool(_Unary):
    ATTRS: ClassVar[dict] = {"keepdims": Bool(True), "layout": Str("NCHW")}

    @classmethod
    def count_flops(cls, ins, outs, attrs):
        return numel(ins[0])

    @classmethod
    def infer(cls, shapes, attrs):
        x = shapes[0]
        sp, c = _spatial(x, attrs["layout"])
        if attrs["keepdims"]:
            return [_with_spatial(x, attrs["layout"], c, [1] * len(sp))]
        return [(x[0], c)]


@top_op
class GlobalAvgPool(_GlobalPool):
    """Mean over all spatial axes."""
    name = "top.GlobalAvgPool"


@top_op
class GlobalMaxPool(_GlobalPool):
    """Max over all spatial axes."""
    name = "top.GlobalMaxPool"


@top_op
class BatchNorm(TopOp):
    """Inference batch normalization (folded away by canonicalization)."""

    name = "top.BatchNorm"
    input = operand_def()
    mean = operand_def()
    variance = operand_def()
    scale = operand_def()
    bias = operand_def()
    output = result_def(TensorType)
    ATTRS: ClassVar[dict] = {"epsilon": Float(1e-5), "layout": Str("NCHW")}
    count_flops = per_output(2)

    def check(self, shapes, attrs):
        super().check(shapes, attrs)
        _check_per_channel(shapes, attrs)


@top_op
class Scale(TopOp):
    """x * scale + bias per channel, optional fused ReLU."""

    name = "top.Scale"
    input = operand_def()
    scale = operand_def()
    bias = operand_def()
    output = result_def(TensorType)
    ATTRS: ClassVar[dict] = {**_RELU, "layout": Str("NCHW")}
    count_flops = per_output(2, fused_relu=True)

    def check(self, shapes, attrs):
        super().check(shapes, attrs)
        _check_per_channel(shapes, attrs)


@top_op
class LayerNorm(TopOp):
    """(x - mean) / sqrt(var + eps) * scale + bias, mean and variance over `axes`.

    `scale` and `bias` (each optional) have x's rank and broadcast against it.
    """

    name = "top.LayerNorm"
    input = operand_def()
    scale = operand_def()
    bias = operand_def()
    output = result_def(TensorType)
    OPTIONAL_OPERANDS: ClassVar[tuple[int, ...]] = (1, 2)
    ATTRS: ClassVar[dict] = {"axes": Ints(), "eps": Float(1e-5)}
    count_flops = per_output(8)

    def check(self, shapes, attrs):
        x = shapes[0]
        axes = [_axis(a, len(x)) for a in attrs["axes"]]
        if not axes or len(set(axes)) != len(axes):
            raise ValueError(f"axes {attrs['axes']} must be distinct and not empty")
        for what, s in zip(("scale", "bias"), shapes[1:]):
            if s is not None and (len(s) != len(x) or any(d not in (1, e) for d, e in zip(s, x))):
                raise ValueError(f"{what} {list(s)} does not broadcast to the input {list(x)} at its rank")
        if attrs["eps"] < 0:
            raise ValueError(f"eps {attrs['eps']} must be >= 0")


# ---------------------------------------------------------------- data movement

@top_op
class Concat(TopOp):
    """Concatenation along `axis`."""

    name = "top.Concat"
    inputs = var_operand_def()
    output = result_def(TensorType)
    ATTRS: ClassVar[dict] = {"axis": Int(), "do_relu": Bool(False)}

    @classmethod
    def count_flops(cls, ins, outs, attrs):
        return _relu_flops(numel(outs[0]), attrs)

    @classmethod
    def infer(cls, shapes, attrs):
        if not shapes:
            raise ValueError("needs at least one operand")
        rank = len(shapes[0])
        ax = _axis(attrs["axis"], rank)
        for s in shapes:
            if len(s) != rank or any(s[i] != shapes[0][i] for i in range(rank) if i != ax):
                raise ValueError(f"operand shapes {shapes} differ off axis {ax}")
        out = list(shapes[0])
        out[ax] = sum(s[ax] for s in shapes)
        return [tuple(out)]


@top_op
class Reshape(_Unary):
    """Reshape to a fully static shape."""
    name = "top.Reshape"
    ATTRS: ClassVar[dict] = {"shape": Ints()}

    @classmethod
    def infer(cls, shapes, attrs):
        shape = tuple(attrs["shape"])
        if any(d < 0 for d in shape) or math.prod(shape) != math.prod(shapes[0]):
            raise ValueError(f"cannot reshape {shapes[0]} to {shape}")
        return [shape]


@top_op
class Flatten(_Unary):
    """Merge axes start_dim..end_dim into one."""
    name = "top.Flatten"
    ATTRS: ClassVar[dict] = {"start_dim": Int(1), "end_dim": Int(-1)}

    @classmethod
    def infer(cls, shapes, attrs):
        x = shapes[0]
        s, e = _axis(attrs["start_dim"], len(x)), _axis(attrs["end_dim"], len(x))
        if s > e:
            raise ValueError(f"start_dim {s} > end_dim {e}")
        return [(*x[:s], math.prod(x[s:e + 1]), *x[e + 1:])]


@top_op
class Permute(_Unary):
    """Transpose by `order`."""
    name = "top.Permute"
    ATTRS: ClassVar[dict] = {"order": Ints()}

    @classmethod
    def infer(cls, shapes, attrs):
        x, order = shapes[0], attrs["order"]
        if sorted(order) != list(range(len(x))):
            raise ValueError(f"order {order} is not a permutation of rank {len(x)}")
        return [tuple(x[i] for i in order)]


@top_op
class Pad(_Unary):
    """Pad every axis by [begins..., ends...] (constant, reflect or edge)."""
    name = "top.Pad"
    ATTRS: ClassVar[dict] = {"paddings": Ints(), "mode": Str("constant"), "val": Float(0.0)}

    @classmethod
    def infer(cls, shapes, attrs):
        x, p = shapes[0], attrs["paddings"]
        if len(p) != 2 * len(x):
            raise ValueError(f"paddings {p} must have {2 * len(x)} values")
        if attrs["mode"] not in ("constant", "reflect", "edge"):
            raise ValueError(f"unknown pad mode {attrs['mode']!r}")
        out = tuple(x[i] + p[i] + p[i + len(x)] for i in range(len(x)))
        if any(d < 0 for d in out):
            raise ValueError(f"negative padded size {out}")
        return [out]


@top_op
class Slice(_Unary):
    """Static strided slice with ONNX clamping of starts/ends."""
    name = "top.Slice"
    ATTRS: ClassVar[dict] = {"starts": Ints(), "ends": Ints(), "steps": Ints(()),
             "axes": Ints(())}

    def fill_defaults(self, attrs, shapes):
        n = len(attrs["starts"])
        attrs["steps"] = attrs["steps"] or [1] * n
        attrs["axes"] = attrs["axes"] or list(range(n))
        return attrs

    @classmethod
    def infer(cls, shapes, attrs):
        x = list(shapes[0])
        n = len(attrs["starts"])
        if not len(attrs["ends"]) == len(attrs["steps"]) == len(attrs["axes"]) == n:
            raise ValueError("starts, ends, steps and axes must have the same length")
        for st, en, sp, ax in zip(attrs["starts"], attrs["ends"], attrs["steps"], attrs["axes"]):
            ax = _axis(ax, len(x))
            x[ax] = slice_len(shapes[0][ax], st, en, sp)[2]
        return [tuple(x)]


@top_op
class Split(TopOp):
    """Split along `axis` into pieces of `split_size`."""

    name = "top.Split"
    input = operand_def()
    outputs = var_result_def(TensorType)
    ATTRS: ClassVar[dict] = {"axis": Int(), "split_size": Ints()}

    @classmethod
    def infer(cls, shapes, attrs):
        x = shapes[0]
        ax = _axis(attrs["axis"], len(x))
        if sum(attrs["split_size"]) != x[ax] or any(s < 0 for s in attrs["split_size"]):
            raise ValueError(f"split_size {attrs['split_size']} does not add up to {x[ax]}")
        return [tuple(s if i == ax else d for i, d in enumerate(x)) for s in attrs["split_size"]]

    @classmethod
    def infer_dtypes(cls, dtypes, attrs):
        return [dtypes[0]] * len(attrs["split_size"])


@top_op
class Squeeze(_Unary):
    """Remove size-1 axes."""
    name = "top.Squeeze"
    ATTRS: ClassVar[dict] = {"axes": Ints()}

    @classmethod
    def infer(cls, shapes, attrs):
        x = shapes[0]
        axes = {_axis(a, len(x)) for a in attrs["axes"]}
        if any(x[a] != 1 for a in axes):
            raise ValueError(f"cannot squeeze axes {sorted(axes)} of {x}")
        return [tuple(d for i, d in enumerate(x) if i not in axes)]


@top_op
class Unsqueeze(_Unary):
    """Insert size-1 axes (axes index the output)."""
    name = "top.Unsqueeze"
    ATTRS: ClassVar[dict] = {"axes": Ints()}

    @classmethod
    def infer(cls, shapes, attrs):
        rank = len(shapes[0]) + len(attrs["axes"])
        axes = {_axis(a, rank) for a in attrs["axes"]}
        it = iter(shapes[0])
        return [tuple(1 if i in axes else next(it) for i in range(rank))]


@top_op
class Resize(_Unary):
    """Nearest or (bi/tri)linear resize of the spatial axes to `target_shape`."""
    name = "top.Resize"
    ATTRS: ClassVar[dict] = {"mode": Str("nearest"), "coord_mode": Str("half_pixel"),
             "nearest_mode": Str("round_prefer_floor"), "target_shape": Ints(),
             "layout": Str("NCHW")}

    def check(self, shapes, attrs):
        super().check(shapes, attrs)
        if attrs["mode"] not in ("nearest", "linear"):
            raise ValueError(f"unknown mode {attrs['mode']!r}")
        if attrs["coord_mode"] not in ("half_pixel", "align_corners", "asymmetric",
                                       "pytorch_half_pixel", "tf_half_pixel_for_nn"):
            raise ValueError(f"unknown coord_mode {attrs['coord_mode']!r}")
        if attrs["nearest_mode"] not in ("round_prefer_floor", "floor", "ceil", "round_prefer_ceil"):
            raise ValueError(f"unknown nearest_mode {attrs['nearest_mode']!r}")

    @classmethod
    def count_flops(cls, ins, outs, attrs):
        return 0 if attrs["mode"] == "nearest" else numel(outs[0]) * 3 * (len(outs[0]) - 2)

    @classmethod
    def infer(cls, shapes, attrs):
        sp, c = _spatial(shapes[0], attrs["layout"])
        if len(attrs["target_shape"]) != len(sp):
            raise ValueError(f"target_shape {attrs['target_shape']} must have {len(sp)} values")
        return [_with_spatial(shapes[0], attrs["layout"], c, attrs["target_shape"])]


class _Reduce(_Unary):
    ATTRS: ClassVar[dict] = {"axes": Ints(), "keepdims": Bool(True)}

    @classmethod
    def count_flops(cls, ins, outs, attrs):
        return numel(ins[0])

    @classmethod
    def infer(cls, shapes, attrs):
        x = shapes[0]
        axes = {_axis(a, len(x)) for a in attrs["axes"]}
        if attrs["keepdims"]:
            return [tuple(1 if i in axes else d for i, d in enumerate(x))]
        return [tuple(d for i, d in enumerate(x) if i not in axes)]


@top_op
class ReduceMean(_Reduce):
    """Mean over axes."""
    name = "top.ReduceMean"


@top_op
class ReduceMax(_Reduce):
    """Max over axes."""
    name = "top.ReduceMax"


@top_op
class ReduceMin(_Reduce):
    """Min over axes."""
    name = "top.ReduceMin"


@top_op
class ReduceSum(_Reduce):
    """Sum over axes."""
    name = "top.ReduceSum"


class _BlockOp(_Unary):
    ATTRS: ClassVar[dict] = {"block_size": Int(), "mode": Str("DCR"), "layout": Str("NCHW")}

    def check(self, shapes, attrs):
        super().check(shapes, attrs)
        if attrs["mode"] not in ("DCR", "CRD"):
            raise ValueError(f"mode must be DCR or CRD, got {attrs['mode']!r}")
        if len(shapes[0]) != 4 or attrs["block_size"] < 1:
            raise ValueError(f"needs a 4-D input and block_size >= 1, got {shapes[0]}")


@top_op
class SpaceToDepth(_BlockOp):
    """[N,C,H,W] -> [N,C*b*b,H/b,W/b]."""
    name = "top.SpaceToDepth"

    @classmethod
    def infer(cls, shapes, attrs):
        b = attrs["block_size"]
        (h, w), c = _spatial(shapes[0], attrs["layout"])
        if h % b or w % b:
            raise ValueError(f"spatial size {h}x{w} is not a multiple of {b}")
        return [_with_spatial(shapes[0], attrs["layout"], c * b * b, [h // b, w // b])]


@top_op
class DepthToSpace(_BlockOp):
    """[N,C,H,W] -> [N,C/(b*b),H*b,W*b]."""
    name = "top.DepthToSpace"

    @classmethod
    def infer(cls, shapes, attrs):
        b = attrs["block_size"]
        (h, w), c = _spatial(shapes[0], attrs["layout"])
        if c % (b * b):
            raise ValueError(f"channels {c} not a multiple of {b * b}")
        return [_with_spatial(shapes[0], attrs["layout"], c // (b * b), [h * b, w * b])]


@top_op
class Gather(TopOp):
    """Take `indices` along `axis` (ONNX Gather)."""

    name = "top.Gather"
    input = operand_def()
    indices = operand_def()
    output = result_def(TensorType)
    ATTRS: ClassVar[dict] = {"axis": Int(0)}

    @classmethod
    def infer(cls, shapes, attrs):
        x, idx = shapes
        ax = _axis(attrs["axis"], len(x))
        return [(*x[:ax], *idx, *x[ax + 1:])]


TOP_OPS = [Input, Weight, NoneOp, Conv, Deconv, MatMul, Add, Sub, Mul, Div, Max, Min, PRelu,
           Relu, Clip, LeakyRelu, Sigmoid, HardSigmoid, HardSwish, SiLU, Tanh, Exp, Log, Sqrt, Erf,
           Abs, Neg, GELU, Floor, Ceil, Round, Sign, Sin, Cos, Softsign, Softmax, Cast, MaxPool, AvgPool, GlobalAvgPool, GlobalMaxPool, BatchNorm,
           Scale, LayerNorm, Concat, Reshape, Flatten, Permute, Pad, Slice, Split, Squeeze, Unsqueeze, Resize,
           ReduceMean, ReduceMax, ReduceMin, ReduceSum, SpaceToDepth, DepthToSpace, Gather]

OPS_BY_NAME: dict[str, type[TopOp]] = {cls.name: cls for cls in TOP_OPS}
FLOPS = {cls.name: cls.flops_of for cls in TOP_OPS}   # full name -> flops(ins, outs, attrs)
# the one-input element-wise functions, by full name (INT8: each a 256-entry table)
LOOKUP_TABLES = tuple(cls.name for cls in TOP_OPS if any(isinstance(t, LookupTable) for t in cls.TRAITS))
INTERPOLABLE = tuple(cls.name for cls in TOP_OPS if any(isinstance(t, Interpolable) for t in cls.TRAITS))

Top = Dialect("top", TOP_OPS, [])
