"""The TOP dialect: framework-neutral tensor ops (ONNX-like, NCHW by default), on xDSL IRDL.

Each op declares its operands and results with IRDL, its attributes as `ATTRS = {name: (kind,
default)}` (`REQUIRED` for no default; see `tftpu.ir.attrs` for kinds), and a shape function
`infer`. The verifier checks operand kinds, attribute values and that every result type equals
the inferred one. Op semantics follow the ONNX op of the same name (see the table in DESIGN/top_spec); kernels
and FLOPs counts live in `tftpu.interp.kernels` under the op name without `top.`.

>>> Conv.name, Conv.ATTRS["group"]
('top.Conv', ('int', 1))
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
from xdsl.dialects.builtin import (
    ArrayAttr,
    FloatAttr,
    FusedLoc,
    IntegerAttr,
    NameLoc,
    NoneAttr,
    NoneType,
    StringAttr,
    TensorType,
)
from xdsl.ir import Dialect
from xdsl.irdl import (
    IRDLOperation,
    attr_def,
    irdl_op_definition,
    operand_def,
    opt_attr_def,
    result_def,
    var_operand_def,
    var_result_def,
)
from xdsl.utils.exceptions import VerifyException

from tftpu.errors import ShapeError
from tftpu.ir import attrs as A

REQUIRED = object()
_CONSTRAINT = {"int": IntegerAttr, "float": FloatAttr, "bool": IntegerAttr, "str": StringAttr,
               "ints": ArrayAttr, "floats": ArrayAttr}
LAYOUTS = ("NCHW", "NHWC")
_RELU = {"do_relu": ("bool", False), "relu_limit": ("float", -1.0)}


def loc_names(op) -> list[str]:
    """Names of an op's results from its location: `loc("a")` or `loc(fused["a", "b"])`."""
    loc = op.location
    if isinstance(loc, NameLoc):
        return [loc.desc.data]
    if isinstance(loc, FusedLoc):
        return [sub.desc.data for sub in loc.locations.data if isinstance(sub, NameLoc)]
    return []


def loc_name(op) -> str:
    """The location name of an op (its first result's name), or "" when it has none."""
    names = loc_names(op)
    return names[0] if names else ""


def set_loc(op, name: str | list[str]) -> None:
    """Name an op by location, as TPU-MLIR does: by its output tensor name(s)."""
    if isinstance(name, str):
        op.location = NameLoc(StringAttr(name), NoneAttr())
    elif len(name) == 1:
        op.location = NameLoc(StringAttr(name[0]), NoneAttr())
    else:
        op.location = FusedLoc(ArrayAttr([NameLoc(StringAttr(n), NoneAttr()) for n in name]), NoneAttr())


class TopOp(IRDLOperation):
    """Base of every TOP op: attribute table, shape function, verifier, FLOPs."""

    ATTRS: ClassVar[dict] = {}
    # operands that may be a `none` value (e.g. a missing bias)
    OPTIONAL_OPERANDS: ClassVar[tuple[int, ...]] = ()

    @property
    def op_name(self) -> str:
        """Op name without the `top.` prefix: the key in KERNELS and FLOPS."""
        return self.name[4:]

    @property
    def loc(self) -> str:
        return loc_name(self)

    def attrs(self) -> dict:
        """Attributes as plain Python values, defaults filled in."""
        out = {}
        for key, (kind, default) in self.ATTRS.items():
            attr = self.attributes.get(key)
            if attr is None:
                if default is REQUIRED:
                    raise VerifyException(f"{self.name} at {self.loc!r}: missing attribute {key!r}")
                out[key] = list(default) if isinstance(default, (list, tuple)) else default
            else:
                try:
                    out[key] = A.from_attr(kind, attr)
                except ValueError as e:
                    raise VerifyException(f"{self.name} at {self.loc!r}: attribute {key!r}: {e}") from None
        extra = set(self.attributes) - set(self.ATTRS)
        if extra:
            raise VerifyException(f"{self.name} at {self.loc!r}: unknown attribute(s) {sorted(extra)}")
        return self.fill_defaults(out, self.operand_shapes())

    def operand_shapes(self) -> list:
        return [A.shape_of(v.type) for v in self.operands]

    def fill_defaults(self, attrs: dict, shapes: list) -> dict:
        """Hook for defaults that depend on operand ranks (strides, pads, ...)."""
        return attrs

    @classmethod
    def infer(cls, shapes: list, attrs: dict) -> list:
        """Result shapes from operand shapes and attributes (default: like operand 0)."""
        return [shapes[0]]

    @classmethod
    def infer_dtypes(cls, dtypes: list, attrs: dict) -> list:
        """Result element types (default: that of operand 0)."""
        return [dtypes[0]]

    def verify_(self) -> None:
        where = f"{self.name} at {self.loc!r}"
        for i, v in enumerate(self.operands):
            if isinstance(v.type, NoneType):
                if i not in self.OPTIONAL_OPERANDS:
                    raise VerifyException(f"{where}: operand {i} must be a tensor, not none")
            elif not isinstance(v.type, TensorType):
                raise VerifyException(f"{where}: operand {i} has non-tensor type {v.type}")
        for r in self.results:
            if not isinstance(r.type, TensorType):
                raise VerifyException(f"{where}: result has non-tensor type {r.type}")
        attrs = self.attrs()
        shapes = self.operand_shapes()
        try:
            self.check(shapes, attrs)
            want = self.infer(shapes, attrs)
        except (ValueError, IndexError, ZeroDivisionError, TypeError) as e:
            raise VerifyException(f"{where}: {e}") from None
        got = [A.shape_of(r.type) for r in self.results]
        if [tuple(s) for s in want] != got:
            raise VerifyException(f"{where}: result shape(s) {got} do not match inferred {[tuple(s) for s in want]}")
        dtypes = [None if s is None else A.dtype_name(v.type.element_type)
                  for v, s in zip(self.operands, shapes)]
        want_dt = self.infer_dtypes(dtypes, attrs)
        got_dt = [A.dtype_name(r.type.element_type) for r in self.results]
        if want_dt != got_dt:
            raise VerifyException(f"{where}: result element type(s) {got_dt}, expected {want_dt}")

    def check(self, shapes: list, attrs: dict) -> None:
        """Extra attribute/operand checks; raise ValueError with a message."""
        if "layout" in attrs and attrs["layout"] not in LAYOUTS:
            raise ValueError(f"layout must be NCHW or NHWC, got {attrs['layout']!r}")

    def flops(self) -> int:
        """FLOPs of this op (from `tftpu.interp.kernels.FLOPS`)."""
        from tftpu.interp.kernels import FLOPS
        fn = FLOPS.get(self.op_name)
        if fn is None:
            return 0
        return int(fn(self.operand_shapes(), [A.shape_of(r.type) for r in self.results], self.attrs()))


def top_op(cls):
    """Declare the IRDL attribute fields from `cls.ATTRS`, then define the op."""
    for key, (kind, default) in cls.ATTRS.items():
        setattr(cls, key, (attr_def if default is REQUIRED else opt_attr_def)(_CONSTRAINT[kind]))
    return irdl_op_definition(cls)


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


def conv_out(size: int, k: int, s: int, d: int, pb: int, pe: int) -> int:
    """Output length of a convolution window along one axis."""
    return (size + pb + pe - d * (k - 1) - 1) // s + 1


def pool_out(size: int, k: int, s: int, pb: int, pe: int, ceil_mode: bool) -> int:
    """Output length of a pooling window (ceil mode drops a window starting in the end pad)."""
    if not ceil_mode:
        return (size + pb + pe - k) // s + 1
    out = -(-(size + pb + pe - k) // s) + 1
    if (out - 1) * s >= size + pb:
        out -= 1
    return out


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

    @property
    def key(self) -> str:
        """The array's key in the weight file (for now its location name)."""
        return self.loc

    @classmethod
    def infer(cls, shapes, attrs):
        raise ShapeError("top.Weight takes its shape from the weight file, not from operands")

    def verify_(self) -> None:
        if not self.loc:
            raise VerifyException("top.Weight needs a location name (its key in the weight file)")
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
    ATTRS: ClassVar[dict] = {"kernel_shape": ("ints", REQUIRED), "strides": ("ints", ()), "pads": ("ints", ()),
             "dilations": ("ints", ()), "group": ("int", 1), **_RELU, "layout": ("str", "NCHW"),
             "kernel_layout": ("str", "OIHW")}

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
    def infer(cls, shapes, attrs):
        x, w = shapes[0], shapes[1]
        o = w[-1] if attrs["kernel_layout"] == "HWIO" else w[0]
        sp, _ = _spatial(x, attrs["layout"])
        n = len(sp)
        p = attrs["pads"]
        out = [conv_out(sp[i], attrs["kernel_shape"][i], attrs["strides"][i], attrs["dilations"][i],
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
    ATTRS: ClassVar[dict] = {"kernel_shape": ("ints", REQUIRED), "strides": ("ints", ()), "pads": ("ints", ()),
             "dilations": ("ints", ()), "group": ("int", 1), "output_padding": ("ints", ()),
             **_RELU, "layout": ("str", "NCHW")}

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
    def infer(cls, shapes, attrs):
        x, w = shapes[0], shapes[1]
        sp, _ = _spatial(x, attrs["layout"])
        n, p = len(sp), attrs["pads"]
        out = [attrs["strides"][i] * (sp[i] - 1) + attrs["output_padding"][i]
               + (attrs["kernel_shape"][i] - 1) * attrs["dilations"][i] + 1 - p[i] - p[i + n]
               for i in range(n)]
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
    ATTRS: ClassVar[dict] = {"right_transpose": ("bool", False), **_RELU}

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
    ATTRS: ClassVar[dict] = dict(_RELU)


@top_op
class Div(_Binary):
    """a / b with numpy broadcasting."""
    name = "top.Div"


@top_op
class Max(_Binary):
    """Elementwise maximum with broadcasting."""
    name = "top.Max"


@top_op
class Min(_Binary):
    """Elementwise minimum with broadcasting."""
    name = "top.Min"


@top_op
class PRelu(_Binary):
    """x if x > 0 else slope * x; slope broadcast on the channel axis."""
    name = "top.PRelu"

    @classmethod
    def infer(cls, shapes, attrs):
        return [shapes[0]]


class _Unary(TopOp):
    input = operand_def()
    output = result_def(TensorType)


def _unary(op_name: str, doc: str, attrs: dict | None = None):
    cls = type(op_name, (_Unary,), {"name": f"top.{op_name}", "__doc__": doc,
                                    "ATTRS": attrs or {}, "__module__": __name__,
                                    "__annotations__": {"ATTRS": ClassVar[dict]}})
    return top_op(cls)


Relu = _unary("Relu", "max(x, 0), clipped at relu_limit when it is >= 0.", {"relu_limit": ("float", -1.0)})
Clip = _unary("Clip", "min(max(x, min), max).", {"min": ("float", REQUIRED), "max": ("float", REQUIRED)})
LeakyRelu = _unary("LeakyRelu", "x if x >= 0 else alpha * x.", {"alpha": ("float", 0.01)})
Sigmoid = _unary("Sigmoid", "1 / (1 + exp(-x)).")
HardSigmoid = _unary("HardSigmoid", "max(0, min(1, alpha * x + beta)).",
                     {"alpha": ("float", 0.2), "beta": ("float", 0.5)})
HardSwish = _unary("HardSwish", "x * max(0, min(1, x / 6 + 1 / 2)).")
SiLU = _unary("SiLU", "x * sigmoid(x).")
Tanh = _unary("Tanh", "tanh(x).")
Exp = _unary("Exp", "exp(x).")
Log = _unary("Log", "natural log.")
Sqrt = _unary("Sqrt", "square root.")
Erf = _unary("Erf", "error function.")
Abs = _unary("Abs", "absolute value.")
Neg = _unary("Neg", "-x.")
GELU = _unary("GELU", "x * Phi(x), exact or tanh-approximated.", {"approximate": ("str", "none")})


@top_op
class Softmax(_Unary):
    """Softmax (or log-softmax) along one axis."""
    name = "top.Softmax"
    ATTRS: ClassVar[dict] = {"axis": ("int", -1), "log": ("bool", False)}

    def check(self, shapes, attrs):
        _axis(attrs["axis"], len(shapes[0]))


@top_op
class Cast(_Unary):
    """Element type conversion."""
    name = "top.Cast"
    ATTRS: ClassVar[dict] = {"to": ("str", REQUIRED)}

    def check(self, shapes, attrs):
        if attrs["to"] not in ("f32", "f16", "bf16", "i8", "u8", "i32", "i64"):
            raise ValueError(f"cannot cast to {attrs['to']!r}")

    @classmethod
    def infer_dtypes(cls, dtypes, attrs):
        return [attrs["to"]]


# ---------------------------------------------------------------- pooling / normalization

class _Pool(_Unary):
    ATTRS: ClassVar[dict] = {"kernel_shape": ("ints", REQUIRED), "strides": ("ints", ()), "pads": ("ints", ()),
             "count_include_pad": ("bool", False), "ceil_mode": ("bool", False), **_RELU,
             "layout": ("str", "NCHW")}

    def fill_defaults(self, attrs, shapes):
        return _window_defaults(attrs, len(shapes[0]) - 2)

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
        out = [pool_out(sp[i], attrs["kernel_shape"][i], attrs["strides"][i], p[i], p[i + n],
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
    ATTRS: ClassVar[dict] = {"keepdims": ("bool", True), "layout": ("str", "NCHW")}

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
    ATTRS: ClassVar[dict] = {"epsilon": ("float", 1e-5), "layout": ("str", "NCHW")}

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
    ATTRS: ClassVar[dict] = {**_RELU, "layout": ("str", "NCHW")}

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
    ATTRS: ClassVar[dict] = {"axes": ("ints", REQUIRED), "eps": ("float", 1e-5)}

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
    ATTRS: ClassVar[dict] = {"axis": ("int", REQUIRED), "do_relu": ("bool", False)}

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
    ATTRS: ClassVar[dict] = {"shape": ("ints", REQUIRED)}

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
    ATTRS: ClassVar[dict] = {"start_dim": ("int", 1), "end_dim": ("int", -1)}

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
    ATTRS: ClassVar[dict] = {"order": ("ints", REQUIRED)}

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
    ATTRS: ClassVar[dict] = {"paddings": ("ints", REQUIRED), "mode": ("str", "constant"), "val": ("float", 0.0)}

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
    ATTRS: ClassVar[dict] = {"starts": ("ints", REQUIRED), "ends": ("ints", REQUIRED), "steps": ("ints", ()),
             "axes": ("ints", ())}

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
    ATTRS: ClassVar[dict] = {"axis": ("int", REQUIRED), "split_size": ("ints", REQUIRED)}

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
    ATTRS: ClassVar[dict] = {"axes": ("ints", REQUIRED)}

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
    ATTRS: ClassVar[dict] = {"axes": ("ints", REQUIRED)}

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
    ATTRS: ClassVar[dict] = {"mode": ("str", "nearest"), "coord_mode": ("str", "half_pixel"),
             "nearest_mode": ("str", "round_prefer_floor"), "target_shape": ("ints", REQUIRED),
             "layout": ("str", "NCHW")}

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
    def infer(cls, shapes, attrs):
        sp, c = _spatial(shapes[0], attrs["layout"])
        if len(attrs["target_shape"]) != len(sp):
            raise ValueError(f"target_shape {attrs['target_shape']} must have {len(sp)} values")
        return [_with_spatial(shapes[0], attrs["layout"], c, attrs["target_shape"])]


class _Reduce(_Unary):
    ATTRS: ClassVar[dict] = {"axes": ("ints", REQUIRED), "keepdims": ("bool", True)}

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
    ATTRS: ClassVar[dict] = {"block_size": ("int", REQUIRED), "mode": ("str", "DCR"), "layout": ("str", "NCHW")}

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
    ATTRS: ClassVar[dict] = {"axis": ("int", 0)}

    @classmethod
    def infer(cls, shapes, attrs):
        x, idx = shapes
        ax = _axis(attrs["axis"], len(x))
        return [(*x[:ax], *idx, *x[ax + 1:])]


TOP_OPS = [Input, Weight, NoneOp, Conv, Deconv, MatMul, Add, Sub, Mul, Div, Max, Min, PRelu,
           Relu, Clip, LeakyRelu, Sigmoid, HardSigmoid, HardSwish, SiLU, Tanh, Exp, Log, Sqrt, Erf,
           Abs, Neg, GELU, Softmax, Cast, MaxPool, AvgPool, GlobalAvgPool, GlobalMaxPool, BatchNorm,
           Scale, LayerNorm, Concat, Reshape, Flatten, Permute, Pad, Slice, Split, Squeeze, Unsqueeze, Resize,
           ReduceMean, ReduceMax, ReduceMin, ReduceSum, SpaceToDepth, DepthToSpace, Gather]

OPS_BY_NAME: dict[str, type[TopOp]] = {cls.name[4:]: cls for cls in TOP_OPS}

Top = Dialect("top", TOP_OPS, [])
