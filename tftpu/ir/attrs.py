"""Plain-Python <-> xDSL attribute and type conversion for the TOP dialect.

TOP op attributes are declared as `{name: (kind, default)}`; this module maps each kind to its
builtin attribute (`int` -> `i64`, `float` -> `f64`, `bool`, `str`, `ints` -> `[.. : i64]`,
`floats` -> `[.. : f64]`) and back, and maps short dtype names ("f32", "i64") to MLIR types.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from xdsl.dialects.builtin import (
    ArrayAttr,
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float64Type,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    NoneType,
    Signedness,
    StringAttr,
    TensorType,
    bf16,
    f16,
    f32,
    f64,
    i1,
    i64,
)
from xdsl.ir import Attribute

from tftpu.errors import ShapeError

KINDS = ("int", "float", "bool", "str", "ints", "floats")

DTYPES = {
    "f32": f32,
    "f16": f16,
    "bf16": bf16,
    "f64": f64,
    "i8": IntegerType(8),
    "u8": IntegerType(8, Signedness.UNSIGNED),
    "i16": IntegerType(16),
    "i32": IntegerType(32),
    "i64": i64,
    "bool": i1,
}
_NUMPY = {"f32": np.float32, "f16": np.float16, "f64": np.float64, "i8": np.int8, "u8": np.uint8,
          "i16": np.int16, "i32": np.int32, "i64": np.int64, "bool": np.bool_}


@lru_cache(maxsize=1 << 16)
def _i64(value: int) -> IntegerAttr:
    """The `i64` attribute of `value`, shared: attributes are immutable, and a lowering encodes
    the same per-channel multipliers and shifts again on each trial of the precision search."""
    return IntegerAttr(value, i64)


@lru_cache(maxsize=1 << 12)
def _i64_array(values: tuple) -> ArrayAttr:
    return ArrayAttr([_i64(v) for v in values])


def to_attr(kind: str, value) -> Attribute:
    """Wrap a plain Python value as the builtin attribute of `kind`."""
    if kind == "int":
        return _i64(int(value))
    if kind == "float":
        return FloatAttr(float(value), f64)
    if kind == "bool":
        return IntegerAttr(1 if value else 0, i1)
    if kind == "str":
        return StringAttr(str(value))
    if kind == "ints":
        return _i64_array(tuple(int(v) for v in value))
    if kind == "floats":
        return ArrayAttr([FloatAttr(float(v), f64) for v in value])
    raise ValueError(f"unknown attribute kind {kind!r}")


def from_attr(kind: str, attr: Attribute):
    """Unwrap a builtin attribute into the plain Python value of `kind`; ValueError if it is not one."""
    if kind in ("int", "bool"):
        if not isinstance(attr, IntegerAttr):
            raise ValueError(f"expected an integer attribute, got {attr}")
        v = attr.value.data
        return bool(v) if kind == "bool" else int(v)
    if kind == "float":
        if isinstance(attr, FloatAttr):
            return float(attr.value.data)
        if isinstance(attr, IntegerAttr):
            return float(attr.value.data)
        raise ValueError(f"expected a float attribute, got {attr}")
    if kind == "str":
        if not isinstance(attr, StringAttr):
            raise ValueError(f"expected a string attribute, got {attr}")
        return attr.data
    if kind in ("ints", "floats"):
        if not isinstance(attr, ArrayAttr):
            raise ValueError(f"expected an array attribute, got {attr}")
        items = attr.data
        # (per-channel requant arrays make this hot: one pass over the items, not a call per item)
        if kind == "ints" and all(type(a) is IntegerAttr for a in items):
            return [int(a.value.data) for a in items]
        if kind == "floats" and all(type(a) is FloatAttr for a in items):
            return [float(a.value.data) for a in items]
        return [from_attr("int" if kind == "ints" else "float", a) for a in items]
    raise ValueError(f"unknown attribute kind {kind!r}")


def dtype_name(t: Attribute) -> str:
    """Short dtype name ("f32", "i64", ...) of an MLIR element type; a quantized type's storage
    type (`!quant.uniform<i8:f32, ..>` -> "i8"), a calibrated type's expressed type."""
    from tftpu.ir import quant

    if isinstance(t, quant.UniformQuantType):
        return t.storage
    if isinstance(t, quant.CalibratedQuantType):
        return t.expressed
    for name, ty in DTYPES.items():
        if ty == t:
            return name
    raise ShapeError(f"unsupported element type {t}")


def numpy_dtype(name: str):
    """numpy dtype for a short dtype name (bf16 via ml_dtypes)."""
    if name == "bf16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(_NUMPY[name])


def dtype_of_numpy(dt) -> str:
    """Short dtype name of a numpy dtype."""
    dt = np.dtype(dt)
    if dt.name == "bfloat16":
        return "bf16"
    for name, np_t in _NUMPY.items():
        if np.dtype(np_t) == dt:
            return name
    raise ShapeError(f"unsupported numpy dtype {dt}")


def tensor_type(shape, dtype: str = "f32") -> TensorType:
    """`tensor<AxBxdtype>` for a static shape."""
    return TensorType(DTYPES[dtype], [int(d) for d in shape])


def shape_of(t: Attribute) -> tuple[int, ...] | None:
    """Static shape of a tensor type; None for `none`."""
    if isinstance(t, NoneType):
        return None
    if not isinstance(t, TensorType):
        raise ShapeError(f"expected a tensor type, got {t}")
    return tuple(int(d) for d in t.get_shape())


def is_float(t: Attribute) -> bool:
    """True for a tensor of a floating-point element type."""
    return isinstance(t, TensorType) and isinstance(
        t.element_type, (Float32Type, Float16Type, BFloat16Type, Float64Type))
