"""An independent integer reference for the INT8 TPU kernels, written only from the published
definitions (gemmlowp / TFLite reference kernels, TPU-MLIR's INT8 Add), with Python integers and
numpy int64: it never calls `tftpu.rounding`, `tftpu.quant` or a TF/BLAS kernel.

- `quantize_multiplier(real)`: TFLite's QuantizeMultiplier, from exact fractions:
  `real ~= m * 2**(shift - 31)`, `m` in [2**30, 2**31) rounded half away from zero.
- `srdhm(a, b)`: gemmlowp's SaturatingRoundingDoublingHighMul = floor(a*b / 2**31 + 1/2)
  (round half up), saturating only for INT32_MIN * INT32_MIN.
- `rdbpot(x, e)`: gemmlowp's RoundingDivideByPOT = x / 2**e rounded half away from zero.
- `mbqm(x, m, shift)`: TFLite's MultiplyByQuantizedMultiplier (left shift saturated to int32).
- Quantize: round half away from zero of `x / scale` (float64), plus zero point, saturate.
- Dequantize: `(q - zp) * scale` in float32.

`check_model(tpu_model, dump)` walks every TPU op of a lowered model and recomputes each
integer op from the int8 tensors the interpreter fed it (from `dump_all=True`), so any model,
however built, can be checked bit for bit.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
QRANGE = {"i8": (-128, 127), "u8": (0, 255), "i16": (-32768, 32767), "i32": (INT32_MIN, INT32_MAX)}
NP = {"i8": np.int8, "u8": np.uint8, "i16": np.int16, "i32": np.int32}


# ---------------------------------------------------------------- scalar rules (Python ints)

def half_away(fr) -> int:
    """Round a Fraction (or float) half away from zero."""
    fr = Fraction(fr)
    n = (abs(fr.numerator) * 2 + fr.denominator) // (2 * fr.denominator)
    return n if fr >= 0 else -n


def quantize_multiplier(real: float) -> tuple[int, int]:
    """(m, shift) with real ~= m * 2**(shift - 31), TFLite's QuantizeMultiplier."""
    if real == 0:
        return 0, 0
    fr = Fraction(real)
    shift = 0
    while fr >= Fraction(1) * 2 ** shift:         # find 2**(shift-1) <= real < 2**shift
        shift += 1
    while fr < Fraction(1, 2) * 2 ** shift:
        shift -= 1
    m = half_away(fr * 2 ** (31 - shift))
    if m == 1 << 31:
        m, shift = m // 2, shift + 1
    if shift < -31:
        return 0, 0
    return m, shift


def srdhm(a: int, b: int) -> int:
    if a == INT32_MIN and b == INT32_MIN:
        return INT32_MAX
    return (a * b + (1 << 30)) // (1 << 31)        # floor(ab/2^31 + 1/2): ties toward +inf


def rdbpot(x: int, e: int) -> int:
    assert 0 <= e <= 31
    if e == 0:
        return x
    mag = (abs(x) + (1 << (e - 1))) >> e          # ties away from zero
    return mag if x >= 0 else -mag


def sat32(x: int) -> int:
    return max(INT32_MIN, min(INT32_MAX, x))


def mbqm(x: int, m: int, shift: int) -> int:
    left, right = max(shift, 0), max(-shift, 0)
    return rdbpot(srdhm(sat32(x * (1 << left)), m), right)


def _vec(fn, *arrays):
    """Apply a scalar Python-int function element-wise (broadcasting), returning int64."""
    arrays = np.broadcast_arrays(*[np.asarray(a, dtype=object) for a in arrays])
    out = np.frompyfunc(lambda *a: fn(*[int(v) for v in a]), len(arrays), 1)(*arrays)
    return np.asarray(out, dtype=np.int64).reshape(arrays[0].shape)


def requant(acc, multiplier, rshift, axis: int, zp: int):
    """int32 accumulators (saturated) scaled per channel of `axis` (or one), plus zp."""
    acc = np.asarray(acc, np.int64)
    m, r = np.asarray(multiplier, np.int64), np.asarray(rshift, np.int64)
    if m.size > 1:
        shape = [1] * acc.ndim
        shape[axis] = -1
        m, r = m.reshape(shape), r.reshape(shape)
    else:
        m, r = m.reshape(()), r.reshape(())
    return _vec(lambda a, mm, rr: mbqm(sat32(a), mm, -rr) + zp, acc, m, r)


def clamp(y, dtype: str, zp: int, do_relu=False, relu_limit=-1.0, scale=None):
    lo, hi = QRANGE[dtype]
    if do_relu:
        lo = max(lo, zp)
        if relu_limit is not None and relu_limit >= 0:
            hi = min(hi, zp + half_away(Fraction(relu_limit) / Fraction(scale)))
    return np.clip(np.asarray(y, np.int64), lo, hi).astype(NP[dtype])


def quantize(x, scale: float, zp: int, dtype: str = "i8"):
    lo, hi = QRANGE[dtype]
    flat = [max(lo, min(hi, half_away(float(v) / scale) + zp)) for v in np.asarray(x, np.float64).ravel()]
    return np.asarray(flat, np.int64).reshape(np.shape(x)).astype(NP[dtype])


def dequantize(q, scale: float, zp: int):
    return (np.asarray(q, np.int64) - zp).astype(np.float32) * np.float32(scale)


# ---------------------------------------------------------------- integer arithmetic (int64)

def conv_nchw(x, w, strides, pads, dil, group):
    """Exact int64 N-D (1-D or 2-D) conv: x [N, C, *sp] (centred), w [O, C/g, *k]."""
    x, w = np.asarray(x, np.int64), np.asarray(w, np.int64)
    if x.ndim == 3:
        x, w = x[:, :, None], w[:, :, None]
        strides, dil, pads = [1, *strides], [1, *dil], [0, pads[0], 0, pads[1]]
        return conv_nchw(x, w, strides, pads, dil, group)[:, :, 0]
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.zeros((n, c, h + pads[0] + pads[2], wd + pads[1] + pads[3]), np.int64)
    xp[:, :, pads[0]:pads[0] + h, pads[1]:pads[1] + wd] = x
    oh = (xp.shape[2] - dil[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (xp.shape[3] - dil[1] * (kw - 1) - 1) // strides[1] + 1
    og = o // group
    y = np.zeros((n, o, oh, ow), np.int64)
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i * dil[0]: i * dil[0] + strides[0] * (oh - 1) + 1: strides[0],
                       j * dil[1]: j * dil[1] + strides[1] * (ow - 1) + 1: strides[1]]
            for g in range(group):
                y[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch[:, g * cg:(g + 1) * cg],
                                                       w[g * og:(g + 1) * og, :, i, j])
    return y


def conv_any(x, w, a):
    """Exact int64 conv in the op's own layouts (NCHW/NHWC, OIHW/HWIO)."""
    nhwc, hwio = a["layout"] == "NHWC", a["kernel_layout"] == "HWIO"
    if nhwc:
        x = np.moveaxis(x, -1, 1)
    if hwio:            # [*k, I, O] -> [O, I, *k]
        w = np.moveaxis(np.moveaxis(w, -1, 0), -1, 1)
    y = conv_nchw(x, w, list(a["strides"]), list(a["pads"]), list(a["dilations"]), a["group"])
    return np.moveaxis(y, 1, -1) if nhwc else y


def window_reduce(x, kernel, strides, pads, fill, reduce, ceil_mode=False):
    """Windows over the trailing spatial axes of NC* int64 `x` padded with `fill`. With
    `ceil_mode`, ONNX's rule (as onnxruntime): one more window where the division leaves a
    remainder, unless that window would start inside the end padding."""
    nsp = len(kernel)
    sizes = [x.shape[x.ndim - nsp + i] for i in range(nsp)]
    outs = []
    for i in range(nsp):
        span = sizes[i] + pads[i] + pads[i + nsp] - kernel[i]
        n = -(-span // strides[i]) + 1 if ceil_mode else span // strides[i] + 1
        if ceil_mode and (n - 1) * strides[i] >= sizes[i] + pads[i]:
            n -= 1
        outs.append(n)
    extra = [max(0, (outs[i] - 1) * strides[i] + kernel[i] - (sizes[i] + pads[i] + pads[i + nsp])) for i in range(nsp)]
    widths = [(0, 0)] * (x.ndim - nsp) + [(pads[i], pads[i + nsp] + extra[i]) for i in range(nsp)]
    xp = np.pad(np.asarray(x, np.int64), widths, constant_values=fill)
    y = np.zeros((*x.shape[:x.ndim - nsp], *outs), np.int64)
    for idx in np.ndindex(*outs):
        sl = tuple(slice(idx[i] * strides[i], idx[i] * strides[i] + kernel[i]) for i in range(nsp))
        win = xp[(Ellipsis, *sl)]
        y[(Ellipsis, *idx)] = reduce(win.reshape(*win.shape[:x.ndim - nsp], -1), axis=-1)
    return y


# ---------------------------------------------------------------- linear resize

RESIZE_BITS = 10           # fraction bits of a source coordinate (TFLite's quantized ResizeBilinear)


def resize_source(o: int, n_in: int, n_out: int, mode: str) -> Fraction:
    """The exact source coordinate of output index `o` (ONNX Resize's coordinate modes)."""
    o, L, N = Fraction(o), Fraction(n_in), Fraction(n_out)
    if mode == "half_pixel" or mode == "pytorch_half_pixel" and n_out > 1:
        return (o + Fraction(1, 2)) * L / N - Fraction(1, 2)
    if mode == "pytorch_half_pixel" or mode == "align_corners" and n_out == 1:
        return Fraction(0)
    if mode == "align_corners":
        return o * (L - 1) / (N - 1)
    if mode == "asymmetric":
        return o * L / N
    if mode == "tf_half_pixel_for_nn":
        return (o + Fraction(1, 2)) * L / N
    raise ValueError(mode)


def resize_weights(n_in: int, n_out: int, mode: str) -> np.ndarray:
    """[n_out, n_in] int64: row o holds the two weights (in 2**RESIZE_BITS) of output o: the
    coordinate clamped to [0, n_in - 1], rounded half up to RESIZE_BITS bits, split into floor
    and fraction."""
    one = 1 << RESIZE_BITS
    m = np.zeros((n_out, n_in), np.int64)
    for o in range(n_out):
        c = min(max(resize_source(o, n_in, n_out, mode), Fraction(0)), Fraction(n_in - 1))
        fixed = math.floor(c * one + Fraction(1, 2))
        i0, frac = divmod(fixed, one)
        m[o, i0] += one - frac
        m[o, min(i0 + 1, n_in - 1)] += frac
    return m


def resize_linear(xc, a) -> np.ndarray:
    """Linear resize of centred int64 `xc`: each spatial axis times its weight matrix (exact
    integers), then / 2**(RESIZE_BITS * axes) rounded half away from zero."""
    nhwc = a.get("layout") == "NHWC"
    axes = list(range(1, xc.ndim - 1)) if nhwc else list(range(2, xc.ndim))
    acc = np.asarray(xc, np.int64)
    for ax, n in zip(axes, a["target_shape"]):
        m = resize_weights(acc.shape[ax], int(n), a["coord_mode"])
        acc = np.moveaxis(np.tensordot(np.moveaxis(acc, ax, -1), m.T, axes=([-1], [0])), -1, ax)
    return _vec(lambda v: rdbpot(v, RESIZE_BITS * len(axes)), acc)


# ---------------------------------------------------------------- the per-op reference

class Info:
    """A tensor's element type: dtype, and when quantized its scales / zero points / axis."""

    def __init__(self, dtype, scales=(), zps=(), axis=None):
        self.dtype, self.scales, self.zps, self.axis = dtype, tuple(scales), tuple(zps), axis
        self.quant = bool(self.scales)

    @classmethod
    def of(cls, value):
        """Read from the IR type (independently of tftpu.interp.tpu.info)."""
        from tftpu.ir import attrs as A
        from tftpu.ir import quant
        et = value.type.element_type
        if quant.is_quant(et):
            return cls(et.storage, et.scales, et.zero_points, et.quant_axis)
        return cls(A.dtype_name(et))

    @property
    def scale(self):
        assert self.axis is None
        return self.scales[0]

    @property
    def zp(self):
        return self.zps[0] if self.quant and self.axis is None else 0


def _expected_requant(reals):
    ms, rs = [], []
    for r in reals:
        m, s = quantize_multiplier(float(r))
        ms.append(m)
        rs.append(-s)
    return ms, rs


def reference(op, args):
    """The exact result of one INT8 TPU op (or tpu.Cast) on `args` (numpy arrays, None for none),
    plus a list of problems with its parameters (multipliers that do not match the types)."""
    ins = [Info.of(v) if hasattr(v.type, "element_type") else None for v in op.operands]
    return reference_of(op.name, op.attrs(), ins, Info.of(op.results[0]), args)


def reference_of(name, a, ins, out, args, check_params=True):
    """`reference` from an op name, its attributes and the Info of its operands and result."""
    problems = []

    def check_requant(reals, what=""):
        if not check_params:
            return
        want = _expected_requant(reals)
        got = (list(a["multiplier"]), list(a["rshift"]))
        if got != (list(want[0]), list(want[1])):
            problems.append(f"{name} {what} multiplier/rshift {got} != QuantizeMultiplier of {reals}: {want}")

    relu = dict(do_relu=a.get("do_relu", False), relu_limit=a.get("relu_limit", -1.0),
                scale=out.scales[0] if out.quant else None)
    if name in ("tpu.Conv", "tpu.MatMul"):
        x, w, b = args
        xi, wi = ins[0], ins[1]
        xc = np.asarray(x, np.int64) - xi.zp
        wc = np.asarray(w, np.int64) - (wi.zp if wi.axis is None else 0)
        if name == "tpu.Conv":
            acc = conv_any(xc, wc, a)
            axis = acc.ndim - 1 if a["layout"] == "NHWC" else 1
        else:
            if a["right_transpose"]:
                wc = np.swapaxes(wc, -1, -2)
            acc = np.matmul(xc, wc)
            axis = acc.ndim - 1
        if b is not None:
            bb = np.asarray(b, np.int64).ravel()
            shape = [1] * acc.ndim
            shape[axis] = -1
            acc = acc + (bb.reshape(shape) if bb.size > 1 else bb.reshape(()))
        wscales = np.asarray(wi.scales, np.float64)
        reals = xi.scale * wscales / out.scale
        check_requant(reals)
        if b is not None and check_params:
            bs = np.asarray(ins[2].scales, np.float64)
            if not np.array_equal(bs, np.broadcast_to(xi.scale * wscales, bs.shape)):
                problems.append(f"{name}: bias scales {bs} != input*weight scales")
        y = requant(acc, a["multiplier"], a["rshift"], axis, out.zp)
        return clamp(y, out.dtype, out.zp, **relu), problems
    if name in ("tpu.Add", "tpu.Sub"):
        m, r = a["multiplier"], a["rshift"][0]
        want = _add_params([ins[0].scale / out.scale, ins[1].scale / out.scale])
        if check_params and (list(m), r) != want:
            problems.append(f"{name}: multipliers {list(m)} >> {r} != {want}")
        sign = 1 if name == "tpu.Add" else -1
        t0 = (np.asarray(args[0], np.int64) - ins[0].zp) * m[0]
        t1 = (np.asarray(args[1], np.int64) - ins[1].zp) * m[1]
        y = _vec(lambda s: rdbpot(s, r) + out.zp, t0 + sign * t1)
        return clamp(y, out.dtype, out.zp, **relu), problems
    if name == "tpu.Mul":
        check_requant([ins[0].scale * ins[1].scale / out.scale])
        acc = (np.asarray(args[0], np.int64) - ins[0].zp) * (np.asarray(args[1], np.int64) - ins[1].zp)
        y = requant(acc, a["multiplier"], a["rshift"], 0, out.zp)
        return clamp(y, out.dtype, out.zp, **relu), problems
    if name == "tpu.PRelu":
        x, slope = np.asarray(args[0], np.int64), np.asarray(args[1], np.int64)
        m, r = list(a["multiplier"]), list(a["rshift"])
        sscales = np.broadcast_to(np.asarray(ins[1].scales, np.float64), (slope.size,))
        check_requant([ins[0].scale / out.scale] + list(ins[0].scale * sscales / out.scale))
        xc = x - ins[0].zp
        try:
            np.broadcast_shapes(xc.shape, slope.shape)
            shape = slope.shape
        except ValueError:
            axis = xc.ndim - 1 if a.get("layout") == "NHWC" else 1
            shape = [-1] + [1] * (xc.ndim - 1 - axis)
        sb = np.broadcast_to(slope.reshape(shape), xc.shape)
        mb = np.broadcast_to(np.asarray(m[1:], np.int64).reshape(slope.shape).reshape(shape), xc.shape)
        rb = np.broadcast_to(np.asarray(r[1:], np.int64).reshape(slope.shape).reshape(shape), xc.shape)
        flat = [mbqm(int(v), m[0], -r[0]) if v >= 0 else mbqm(int(v) * int(sv), int(mv), -int(rv))
                for v, sv, mv, rv in zip(xc.ravel(), sb.ravel(), mb.ravel(), rb.ravel())]
        y = np.asarray(flat, np.int64).reshape(xc.shape) + out.zp
        return clamp(y, out.dtype, out.zp, **relu), problems
    if name == "tpu.Lut":
        x, table = args
        lo = QRANGE[ins[0].dtype][0]
        if ins[0].dtype != "i16":
            return np.asarray(table)[np.asarray(x, np.int64) - lo], problems
        # 513 knots 128 input levels apart, 6 fraction bits finer than the output, rounded half up
        if len(table) != 513:
            problems.append(f"tpu.Lut: a 16-bit input needs 513 knots, got {len(table)}")
        knots = [int(t) for t in np.ravel(table)]
        flat = []
        for v in np.ravel(np.asarray(x, np.int64)):
            u = int(v) - lo
            i, f = u // 128, u % 128
            flat.append((knots[i] * 128 + (knots[i + 1] - knots[i]) * f + 4096) // 8192)
        y = np.asarray(flat, np.int64).reshape(np.shape(x))
        return clamp(y, out.dtype, out.zp), problems
    if name in ("tpu.MaxPool", "tpu.GlobalMaxPool"):
        if ins[0].scales != out.scales or ins[0].zps != out.zps:
            problems.append(f"{name}: output grid differs from input's")
        x = np.asarray(args[0], np.int64)
        nhwc = a["layout"] == "NHWC"
        xs = np.moveaxis(x, -1, 1) if nhwc else x
        if name == "tpu.MaxPool":
            if any(d != 1 for d in a.get("dilations") or [1]):
                problems.append("dilated max pools are not modelled by this reference")
            y = window_reduce(xs, a["kernel_shape"], a["strides"], a["pads"], -(1 << 40), np.max,
                              bool(a.get("ceil_mode")))
        else:
            y = xs.reshape(*xs.shape[:2], -1).max(axis=-1).reshape(*xs.shape[:2], *([1] * (xs.ndim - 2)))
            if not a["keepdims"]:
                y = y.reshape(xs.shape[:2])
        if nhwc and y.ndim > 2:
            y = np.moveaxis(y, 1, -1)
        return clamp(y, out.dtype, out.zp, **relu), problems
    if name in ("tpu.AvgPool", "tpu.GlobalAvgPool"):
        x = np.asarray(args[0], np.int64) - ins[0].zp
        nhwc = a["layout"] == "NHWC"
        xs = np.moveaxis(x, -1, 1) if nhwc else x
        if name == "tpu.AvgPool":
            acc = window_reduce(xs, a["kernel_shape"], a["strides"], a["pads"], 0, np.sum)
            count = math.prod(a["kernel_shape"])
        else:
            acc = xs.reshape(*xs.shape[:2], -1).sum(axis=-1).reshape(*xs.shape[:2], *([1] * (xs.ndim - 2)))
            count = math.prod(xs.shape[2:])
            if not a["keepdims"]:
                acc = acc.reshape(xs.shape[:2])
        if nhwc and acc.ndim > 2:
            acc = np.moveaxis(acc, 1, -1)
        check_requant([ins[0].scale / (count * out.scale)])
        y = requant(acc, a["multiplier"], a["rshift"], 0, out.zp)
        return clamp(y, out.dtype, out.zp, **relu), problems
    if name == "tpu.Concat":
        for i in ins:
            if i.scales != out.scales or i.zps != out.zps:
                problems.append(f"{name}: an input is not on the output grid")
        y = np.concatenate([np.asarray(v, np.int64) for v in args], axis=a["axis"] % args[0].ndim)
        return clamp(y, out.dtype, out.zp, **relu), problems
    if name == "tpu.Pad":
        x = np.asarray(args[0], np.int64)
        p = a["paddings"]
        widths = [(p[i], p[i + x.ndim]) for i in range(x.ndim)]
        if a["mode"] == "constant":
            y = np.pad(x, widths, constant_values=int(a["val"]))
        else:
            y = np.pad(x, widths, mode={"reflect": "reflect", "edge": "edge"}[a["mode"]])
        return y.astype(NP[out.dtype]), problems
    if name == "tpu.Resize":
        if (ins[0].dtype, ins[0].scales, ins[0].zps) != (out.dtype, out.scales, out.zps):
            problems.append(f"{name}: output grid differs from input's")
        x = np.asarray(args[0], np.int64)
        if a["mode"] == "nearest":
            # a data move: which element each output takes is the op's meaning (the TOP kernel's
            # onnxruntime picks), applied to the integers
            from tftpu.interp.kernels.resize import resize as top_resize
            return np.asarray(top_resize([x], a)[0]).astype(NP[out.dtype]), problems
        y = resize_linear(x - ins[0].zp, a) + out.zp
        return clamp(y, out.dtype, out.zp), problems
    if name == "tpu.Cast":
        x = args[0]
        src = ins[0]
        if src.quant and out.quant:
            check_requant([src.scale / out.scale], "requantize")
            y = requant(np.asarray(x, np.int64) - src.zp, a["multiplier"], a["rshift"], 0, out.zp)
            return clamp(y, out.dtype, out.zp), problems
        if out.quant:
            return quantize(np.asarray(x, np.float32).astype(np.float64), out.scale, out.zp, out.dtype), problems
        if src.quant:
            return round_float(dequantize(x, src.scale, src.zp), out.dtype), problems
        return round_float(np.asarray(x).astype(np.float32), out.dtype), problems
    if name in MORE:                 # Deconv, Scale, Softmax (below)
        y = MORE[name](a, ins, out, args, problems, check_requant)
        return clamp(y, out.dtype, out.zp, **relu), problems
    return None, problems


def _add_params(ratios):
    """TPU-MLIR's INT8 Add: multipliers < 2**15 and the largest shift (<= 31) that keeps them so."""
    for r in range(31, -1, -1):
        ms = [half_away(Fraction(x) * 2 ** r) for x in ratios]
        if all(abs(m) < 1 << 15 for m in ms):
            return ms, r
    return None


def round_float(x, dtype):
    import ml_dtypes
    x = np.asarray(x, np.float32)
    if dtype == "f32":
        return x
    if dtype == "f16":
        return x.astype(np.float16)
    if dtype == "bf16":
        return x.astype(ml_dtypes.bfloat16)
    raise ValueError(dtype)


MOVES = {"tpu.Reshape", "tpu.Flatten", "tpu.Permute", "tpu.Squeeze", "tpu.Unsqueeze", "tpu.Slice",
         "tpu.Split", "tpu.SpaceToDepth", "tpu.DepthToSpace", "tpu.Gather"}


def check_model(tpu_model, dump: dict, inputs: dict | None = None) -> dict:
    """Recompute every INT8 op (and cast) of `tpu_model` from the tensors in `dump` (the
    interpreter's `dump_all=True` output) and assert bit equality. Returns {op name: count}."""
    from tftpu.ir import top, tpu
    from tftpu.ir.base import value_name

    values = dict(inputs or {})
    values.update(dump)
    seen: dict[str, int] = {}
    for op in tpu_model.ops:
        if not isinstance(op, tpu.TpuOp):
            continue
        if not (op.quantized or op.name == "tpu.Cast"):
            continue
        args = []
        for v in op.operands:
            if isinstance(v.owner, top.NoneOp):
                args.append(None)
            elif isinstance(v.owner, top.Weight):
                args.append(tpu_model.weights[v.owner.key])
            else:
                args.append(values[value_name(v)])
        if op.name in MOVES:
            continue            # data movement: checked by shape and grid below
        want, problems = reference(op, args)
        assert not problems, problems
        assert want is not None, f"no reference for {op.name}"
        got = values[value_name(op.results[0])]
        where = f"{op.name} {value_name(op.results[0])!r}"
        assert got.shape == want.shape, (where, got.shape, want.shape)
        assert np.asarray(got).dtype == want.dtype, (where, np.asarray(got).dtype, want.dtype)
        if want.dtype.kind == "f" or want.dtype.name == "bfloat16":
            assert np.array_equal(np.ascontiguousarray(got).view(np.uint8),
                                  np.ascontiguousarray(want).view(np.uint8)), where
        else:
            bad = np.argwhere(np.asarray(got) != want)
            assert bad.size == 0, (f"{where}: {len(bad)} of {want.size} differ, first at {bad[0].tolist()}: "
                                   f"got {got[tuple(bad[0])]}, want {want[tuple(bad[0])]}")
        seen[op.name] = seen.get(op.name, 0) + 1
    return seen


# ---------------------------------------------------------------- Deconv, Scale, Softmax

def deconv_nchw(x, w, strides, pads, dil, group, output_padding):
    """Exact int64 transposed conv (ONNX ConvTranspose) of centred NC* `x` (1-D or 2-D) by
    filter [I, O/g, *k], as the conv of the zero-inserted input (stride - 1 zeros between
    pixels), padded by `dil * (k - 1) - pad` (the end also by `output_padding`, cropped where
    negative), with the filter flipped and each group's [I/g, O/g] swapped."""
    x, w = np.asarray(x, np.int64), np.asarray(w, np.int64)
    nsp = x.ndim - 2
    k = w.shape[2:]
    n, c = x.shape[:2]
    sp = x.shape[2:]
    xd = np.zeros((n, c, *[(sp[i] - 1) * strides[i] + 1 for i in range(nsp)]), np.int64)
    xd[(slice(None), slice(None), *[slice(None, None, strides[i]) for i in range(nsp)])] = x
    for i in range(nsp):
        before = dil[i] * (k[i] - 1) - pads[i]
        after = dil[i] * (k[i] - 1) - pads[i + nsp] + output_padding[i]
        ax = 2 + i
        if before < 0:
            xd = np.take(xd, range(-before, xd.shape[ax]), axis=ax)
        if after < 0:
            xd = np.take(xd, range(0, xd.shape[ax] + after), axis=ax)
        widths = [(0, 0)] * xd.ndim
        widths[ax] = (max(before, 0), max(after, 0))
        xd = np.pad(xd, widths)
    cg, og = c // group, w.shape[1]
    flipped = w[(slice(None), slice(None), *[slice(None, None, -1)] * nsp)]
    wc = np.concatenate([np.swapaxes(flipped[g * cg:(g + 1) * cg], 0, 1) for g in range(group)], axis=0)
    return conv_nchw(xd, wc, [1] * nsp, [0] * (2 * nsp), list(dil), group)


def _deconv_ref(a, ins, out, args, problems, check_requant):
    x, w, b = args
    xi, wi = ins[0], ins[1]
    nhwc = a["layout"] == "NHWC"
    xc = np.asarray(x, np.int64) - xi.zp
    if nhwc:
        xc = np.moveaxis(xc, -1, 1)
    nsp = xc.ndim - 2
    g = a["group"]
    acc = deconv_nchw(xc, w, list(a["strides"]), list(a["pads"]), list(a["dilations"]), g,
                      list(a.get("output_padding") or [0] * nsp))
    if b is not None:
        acc = acc + np.asarray(b, np.int64).reshape(-1, *[1] * nsp)
    if nhwc:
        acc = np.moveaxis(acc, 1, -1)
    axis = acc.ndim - 1 if nhwc else 1
    # the scale of each output channel g * O/g + j, from the filter's per-axis type
    scales = np.asarray(wi.scales, np.float64)
    cg = np.asarray(w).shape[0] // g
    if wi.axis == 1:
        wscales = np.tile(scales, g)
    else:
        wscales = scales[::cg]
        if not np.array_equal(np.repeat(wscales, cg), scales):
            problems.append("tpu.Deconv: filter scales along axis 0 differ within a group")
    check_requant(xi.scale * wscales / out.scale)
    if b is not None and not np.array_equal(np.asarray(ins[2].scales, np.float64), xi.scale * wscales):
        problems.append("tpu.Deconv: bias scales != input*weight scales")
    return requant(acc, a["multiplier"], a["rshift"], axis, out.zp)


def _scale_ref(a, ins, out, args, problems, check_requant):
    """y = (x - zp) * s + b per channel (int64, saturated to int32), requantized per channel."""
    x, s, b = (np.asarray(v, np.int64) if v is not None else None for v in args)
    axis = x.ndim - 1 if a.get("layout") == "NHWC" else 1
    shape = [1] * x.ndim
    shape[axis] = -1
    acc = (x - ins[0].zp) * s.reshape(shape)
    if b is not None:
        acc = acc + b.reshape(shape)
    sscales = np.broadcast_to(np.asarray(ins[1].scales, np.float64), (s.size,))
    check_requant(ins[0].scale * sscales / out.scale)
    if b is not None and not np.array_equal(np.broadcast_to(np.asarray(ins[2].scales, np.float64), (s.size,)),
                                            ins[0].scale * sscales):
        problems.append("tpu.Scale: bias scales != input*scale scales")
    return requant(acc, a["multiplier"], a["rshift"], axis, out.zp)


def _softmax_ref(a, ins, out, args, problems, check_requant):
    """Per row: e_i = table[max - x_i], S = sum e, y_i = e_i * steps / S rounded half away from
    zero (Python fractions), on the grid 1/steps: 1/256 with zero point -128 in i8, 1/65536 with
    -32768 in i16. The table is checked to be exp(-d * scale_in) * 2**16 for d = 0..255 within
    its rounding."""
    x, table = np.asarray(args[0], np.int64), [int(v) for v in np.asarray(args[1]).ravel()]
    steps, zp = {"i8": (256, -128), "i16": (65536, -32768)}[out.dtype]
    if (out.scales, out.zps) != ((1.0 / steps,), (zp,)):
        problems.append(f"tpu.Softmax: output grid {out.scales} / {out.zps} is not 1/{steps}, {zp}")
    sx = ins[0].scale
    if len(table) != 256 or table[0] != 1 << 16 or \
            any(abs(t - math.exp(-d * sx) * 65536) > 0.5 + 1e-6 for d, t in enumerate(table)):
        problems.append("tpu.Softmax: the table is not exp(-d * scale_in) * 2**16")
    rows = np.moveaxis(x, a["axis"] % x.ndim, -1)
    y = np.zeros(rows.shape, np.int64)
    for idx in np.ndindex(*rows.shape[:-1]):
        row = [int(v) for v in rows[idx]]
        e = [table[max(row) - v] for v in row]
        total = sum(e)
        y[idx] = [half_away(Fraction(v * steps, total)) + zp for v in e]
    return np.moveaxis(y, -1, a["axis"] % x.ndim)


MORE = {"tpu.Deconv": _deconv_ref, "tpu.Scale": _scale_ref, "tpu.Softmax": _softmax_ref}
