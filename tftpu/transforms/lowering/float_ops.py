"""Lowering of any TOP op to its TPU op in a float mode (F32, BF16, F16): the same op, its
float tensors in the mode's type, float weights rounded to it (ties to even)."""

from __future__ import annotations

from xdsl.dialects.builtin import TensorType

from tftpu.ir import attrs as A
from tftpu.ir import tpu


def lower_float(ctx, op, dtype: str) -> None:
    """Append `op` as a float TPU op computing in `dtype`."""
    operands = [ctx.floating(v, dtype) for v in op.operands]
    if op.name == "top.Cast":
        to = op.attrs()["to"]
        result_types = [TensorType(A.DTYPES[dtype if to in ("f32", "f16", "bf16") else to], r.type.get_shape())
                        for r in op.results]
        new = ctx.emit("tpu.Cast", operands, {}, _names(op), result_types)
    else:
        name = tpu.FROM_TOP[op.name].name
        result_types = [TensorType(A.DTYPES[dtype], r.type.get_shape()) if A.is_float(r.type) else r.type
                        for r in op.results]
        new = ctx.emit(name, operands, ctx.attributes(op, name), _names(op), result_types)
    for old, r in zip(op.results, new.results):
        ctx.values[old] = r


def _names(op) -> list[str]:
    from tftpu.ir.base import loc_names

    return loc_names(op) or [op.loc]
