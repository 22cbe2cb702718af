"""INT8 `top.Softmax` where it makes probabilities (classifier and score heads): exp as a
256-entry INT32 table on the input grid relative to the row max, an integer sum and an integer
rounding division, the result on a fixed grid of 1/256 (zero point -128) as TFLite's int8
softmax, or of 1/65536 on 16 bits where the probabilities are only a model output. A Softmax
that feeds a DFL box expectation (its probabilities times a constant 0..N-1 projection: box
decode) stays float by design, and says so."""

from __future__ import annotations

import numpy as np
from xdsl.dialects.builtin import TensorType

from tftpu import rounding
from tftpu.ir.base import value_name
from tftpu.quant import params as P
from tftpu.transforms.lowering.registry import int8

EXP_BITS = 16                              # the table holds exp(-d * scale) in units of 2**-16
OUTPUT = P.QParams(1.0 / 256, -128)        # probabilities 0..255/256, TFLite's int8 softmax grid
# probabilities that are only a model output: nothing reads them in INT8, the output cast alone
# (which dequantizes them): 16 bits cost nothing there and keep the classifier's scores exact
OUTPUT_ONLY = P.QParams(1.0 / 65536, -32768, "i16")
# ops that carry the probabilities unchanged on the way to a DFL projection
# (a slice or split across the bins leaves fewer than N of them: no projection matches)
_CARRIERS = ("top.Reshape", "top.Permute", "top.Squeeze", "top.Unsqueeze", "top.Flatten", "top.Slice", "top.Split")


def exp_table(scale_in: float) -> np.ndarray:
    """int32 [256]: round(exp(-d * scale_in) * 2**EXP_BITS) for d = 0..255 (half away from zero)."""
    d = np.arange(256, dtype=np.float64)
    return rounding.round_half_away(np.exp(-d * scale_in) * float(1 << EXP_BITS)).astype(np.int32)


def _is_projection(values: np.ndarray, n: int) -> bool:
    """Whether constant `values` are N evenly spaced bin positions (c * 0..N-1 + offset, c != 0)."""
    v = np.asarray(values, np.float64).ravel()
    if v.size != n or n < 2 or v[1] == v[0]:
        return False
    return bool(np.allclose(v, v[0] + (v[1] - v[0]) * np.arange(n), rtol=1e-5, atol=1e-6 * abs(v[1] - v[0])))


def _rows(user, w: np.ndarray, n: int):
    """The constant's vectors of length `n` that a MatMul or Conv takes dot products with (one
    per output), or None where its reduction is not over `n` values."""
    if user.name == "top.Conv":
        hwio = user.attrs()["kernel_layout"] == "HWIO"
        o = w.shape[-1] if hwio else w.shape[0]
        if w.size != o * n:
            return None
        return np.moveaxis(w, -1, 0).reshape(o, n) if hwio else w.reshape(o, n)
    if w.ndim < 2:
        return w.reshape(1, n) if w.size == n else None
    if user.attrs()["right_transpose"]:
        return w.reshape(-1, n) if w.shape[-1] == n else None
    return np.moveaxis(w, -2, -1).reshape(-1, n) if w.shape[-2] == n else None


def projects(user, w: np.ndarray, n: int) -> bool:
    """Whether MatMul / Conv `user` takes dot products of `n` probabilities with the constant `w`
    whose every vector is a 0..N-1 bin projection (a DFL expectation)."""
    rows = _rows(user, w, n)
    return rows is not None and all(_is_projection(r, n) for r in rows)


def dfl_reason(ctx, op) -> str | None:
    """Why `op` stays float when its probabilities feed a DFL expectation: a MatMul or 1x1 Conv
    by a constant 0..N-1 projection (through reshapes and transposes), or a Mul by one."""
    n = op.results[0].type.get_shape()[op.attrs()["axis"] % len(op.results[0].type.get_shape())]
    todo, seen = [op.results[0]], set()
    while todo:
        v = todo.pop()
        for use in list(v.uses):
            user = use.operation
            if id(user) in seen:
                continue
            seen.add(id(user))
            if user.name in _CARRIERS:
                todo.extend(user.results)
                continue
            const = None
            if user.name in ("top.MatMul", "top.Conv") and use.index == 0 and ctx.is_weight(user.operands[1]):
                if projects(user, ctx.weight_array(user.operands[1]), n):
                    const = user.operands[1]
            elif user.name == "top.Mul":
                other = user.operands[1 - use.index]
                if ctx.is_weight(other) and _is_projection(ctx.weight_array(other), n):
                    const = other
            if const is not None:
                return (f"it feeds a DFL box expectation ({user.name} {user.loc!r} by the constant 0..{n - 1} "
                        f"projection {value_name(const)!r}): box decode stays float by design")
    return None


@int8("top.Softmax")
def softmax(ctx, op):
    a = op.attrs()
    if a["log"]:
        return "log-softmax runs in float (its result is not a probability on a fixed grid)"
    why = dfl_reason(ctx, op)
    if why:
        return why
    x = op.operands[0]
    xq = ctx.grid(x)
    if xq is None:
        return f"no calibration entry for {value_name(x)!r}"
    shape = op.results[0].type.get_shape()
    n = shape[a["axis"] % len(shape)]
    if n << EXP_BITS >= 1 << 31:
        return f"its rows of {n} values are too long for an INT32 sum of exps"
    table = ctx.weight(f"{op.loc}_exp", exp_table(xq.scale))
    only_output = all(use.operation.name == "func.return" for use in op.results[0].uses)
    out = TensorType(ctx.qtype(OUTPUT_ONLY if only_output else OUTPUT), shape)
    new = ctx.emit("tpu.Softmax", [ctx.quantized(x, xq), table], ctx.attributes(op, "tpu.Softmax"), op.loc, [out])
    ctx.values[op.results[0]] = new.results[0]
    return None
