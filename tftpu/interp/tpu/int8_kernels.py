"""INT8 kernels of the TPU ops: exact integer arithmetic, bit-exact by construction.

Products of INT8 values accumulate in INT32 (saturating), then requantize with the rules of
`tftpu.rounding` (multiplier and right shift per channel; `requant.Requant` computes the same
integers in fewer passes). The sums come from the fastest exact source that applies: the
native kernels (`native`: depthwise and ungrouped convs whole, 8-bit data or 16-bit links,
requantization fused), onnxruntime's
ConvInteger / MatMulInteger (exact int32), its float32 Conv for grouped convs whose partial
sums provably stay below 2**24, else float64 (TensorFlow's / BLAS's: exact for any reduction
shorter than 2**38 taps).
"""

from __future__ import annotations

import numpy as np

from tftpu import rounding
from tftpu.interp.kernels import KERNELS
from tftpu.interp.kernels._registry import WEIGHTS, tf
from tftpu.interp.tpu import native, requant
from tftpu.interp.tpu.registry import int8, own
from tftpu.ir import attrs as A
from tftpu.ir import quant
from tftpu.ir.tpu import Lut
from tftpu.utils import threads


# ---------------------------------------------------------------- requantization and clamps

def _per_channel(v, ndim: int, axis: int) -> np.ndarray:
    v = np.asarray(v, np.int64)
    if v.size <= 1:
        return v.reshape(())
    shape = [1] * ndim
    shape[axis] = -1
    return v.reshape(shape)


def _bounds(attrs: dict, out) -> tuple[int, int]:
    """The output's clamp: its type's range, raised to the zero point by a fused ReLU and
    lowered by `relu_limit` (quantized on the output grid)."""
    lo, hi = out.qmin, out.qmax
    if attrs.get("do_relu"):
        lo = max(lo, out.zp)
        limit = attrs.get("relu_limit", -1.0)
        if limit is not None and limit >= 0:
            hi = min(hi, out.zp + int(rounding.round_half_away_scalar(limit / out.scale)))
    return lo, hi


def _clamp(y: np.ndarray, attrs: dict, out) -> np.ndarray:
    """Saturate to the output type and apply a fused ReLU."""
    lo, hi = _bounds(attrs, out)
    return np.clip(y, lo, hi).astype(np.dtype(quant.STORAGE[out.dtype][0]))




def _requant(acc, attrs: dict, out, axis: int, saturated: bool = False) -> np.ndarray:
    """INT32 accumulator -> output type: multiplier/rshift (per channel of `axis` or one).
    `acc` may be overwritten when it is an int64 array; `saturated`: known to lie in int32."""
    acc = np.asarray(acc)
    fused = _native_plan(attrs, out)
    if fused is not None:
        y = fused.requant(acc, axis)
        if y is not None:
            return y
    plan = requant.plan_for(attrs, ("requant", acc.ndim, axis, out), lambda: _make_plan(attrs, out, acc.ndim, axis))
    if plan is not None:
        return plan(acc, saturated)
    acc = np.clip(np.asarray(acc, np.int64), rounding.INT32_MIN, rounding.INT32_MAX)
    m = _per_channel(attrs["multiplier"], acc.ndim, axis)
    r = _per_channel(attrs["rshift"], acc.ndim, axis)
    y = rounding.multiply_by_quantized_multiplier(acc, m, -r).astype(np.int64) + out.zp
    return _clamp(y, attrs, out)


def _make_plan(attrs: dict, out, ndim: int, axis: int):
    """The fast requantization of an op, or None where its parameters need the general rule."""
    m, r = attrs["multiplier"], attrs["rshift"]
    if out.dtype not in quant.STORAGE or not requant.Requant.applies(m, r):
        return None
    lo, hi = _bounds(attrs, out)
    return requant.Requant(m, r, ndim, axis if np.size(m) > 1 else 0, lo, hi, out.zp, quant.STORAGE[out.dtype][0])


def _native_plan(attrs: dict, out):
    """The native kernels' form of an op's requantization, or None where they do not apply."""
    def make():
        m, r = attrs["multiplier"], attrs["rshift"]
        if out.dtype not in quant.STORAGE or not requant.Requant.applies(m, r) or np.min(r) < 0 \
                or native.library() is None:       # (the native kernels shift right only)
            return None
        lo, hi = _bounds(attrs, out)
        return native.Requantizer(m, r, lo, hi, out.zp, quant.STORAGE[out.dtype][0])

    return requant.plan_for(attrs, ("native", out), make)


def _centered(x, info) -> np.ndarray:
    """x - zero point, as float64 (exact)."""
    return x.astype(np.float64) - (info.zp if info.quantized and info.axis is None else 0)


# ---------------------------------------------------------------- conv / matmul

def _conv2d_f64(x, w, strides, pads, dil, group):
    """Exact-integer 2-D conv in float64: x NHWC (already centred), w HWIO [kh, kw, C/g, O]."""
    raw = tf().raw_ops
    x = np.pad(x, ((0, 0), (pads[0], pads[2]), (pads[1], pads[3]), (0, 0)))
    st, dl = [1, *strides, 1], [1, *dil, 1]
    c, o = x.shape[-1], w.shape[-1]
    if group == 1:
        return np.asarray(raw.Conv2D(input=x, filter=w, strides=st, padding="VALID", dilations=dl))
    # TF's depthwise kernel takes no dilations and only equal strides
    if group == c and w.shape[2] == 1 and dil == [1, 1] and strides[0] == strides[1]:
        kh, kw = w.shape[:2]
        dw = w.reshape(kh, kw, c, o // c)
        return np.asarray(raw.DepthwiseConv2dNative(input=x, filter=dw, strides=st, padding="VALID"))
    cg, og = c // group, o // group
    parts = [np.asarray(raw.Conv2D(input=np.ascontiguousarray(x[..., g * cg:(g + 1) * cg]),
                                   filter=np.ascontiguousarray(w[..., g * og:(g + 1) * og]),
                                   strides=st, padding="VALID", dilations=dl)) for g in range(group)]
    return np.concatenate(parts, axis=-1)


def conv_accumulate(x, w, attrs) -> np.ndarray:
    """The exact integer sums of a 1-D/2-D conv (float64), in the data's own layout."""
    nhwc = attrs["layout"] == "NHWC"
    hwio = attrs["kernel_layout"] == "HWIO"
    one_d = x.ndim == 3
    strides, pads, dil = list(attrs["strides"]), list(attrs["pads"]), list(attrs["dilations"])
    if one_d:           # a 1-D conv is a 2-D one of height 1
        x = x[:, None] if nhwc else x[:, :, None]
        w = w[None] if hwio else w[:, :, None]
        strides, dil, pads = [1, *strides], [1, *dil], [0, pads[0], 0, pads[1]]
    xt = x if nhwc else x.transpose(0, 2, 3, 1)
    wt = w.astype(np.float64) if hwio else w.astype(np.float64).transpose(2, 3, 1, 0)
    y = _conv2d_f64(np.ascontiguousarray(xt), np.ascontiguousarray(wt), strides, pads, dil, attrs["group"])
    if not nhwc:
        y = y.transpose(0, 3, 1, 2)
    return y[:, :, 0] if one_d and not nhwc else (y[:, 0] if one_d else y)


def _conv_integer_session(w: np.ndarray, attrs: dict, group: int):
    """An onnxruntime ConvInteger (uint8 x uint8 -> exact int32) for one INT8 weight, or None."""
    from onnx import TensorProto, helper, numpy_helper

    wu = (w.astype(np.int16) + 128).astype(np.uint8)
    node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], strides=list(attrs["strides"]),
                            pads=list(attrs["pads"]), dilations=list(attrs["dilations"]), group=group,
                            kernel_shape=list(w.shape[2:]))
    graph = helper.make_graph(
        [node], "conv_integer",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, None),
         helper.make_tensor_value_info("xz", TensorProto.UINT8, [])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        [numpy_helper.from_array(wu, "w"), numpy_helper.from_array(np.array(128, np.uint8), "wz")])
    return _session(graph)


def _conv_f32_session(w: np.ndarray, attrs: dict, zp: int):
    """An onnxruntime float32 Conv of INT8 `x` less `zp` (cast inside) and `w`, plus bias `b`."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT)]
    if zp:
        nodes.append(helper.make_node("Sub", ["xf", "xz"], ["xc"]))
    nodes.append(helper.make_node("Conv", ["xc" if zp else "xf", "w", "b"], ["y"], strides=list(attrs["strides"]),
                                  pads=list(attrs["pads"]), dilations=list(attrs["dilations"]),
                                  group=attrs["group"], kernel_shape=list(w.shape[2:])))
    graph = helper.make_graph(
        nodes, "conv_f32",
        [helper.make_tensor_value_info("x", TensorProto.INT8, None),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [w.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w.astype(np.float32), "w")]
        + ([numpy_helper.from_array(np.array(zp, np.float32), "xz")] if zp else []))
    return _session(graph)


def _session(graph):
    """A non-spinning onnxruntime session of one small graph, or None where it fails."""
    import onnxruntime as ort
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=9)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads.pool_size()
    # one session per conv: idle pools must not spin (they would slow every other kernel)
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    try:
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception:                                   # noqa: BLE001 (an onnxruntime without it: float64 path)
        return None


_NO_SESSION = object()


def conv_integer(x: np.ndarray, zp: int, w: np.ndarray, attrs: dict):
    """Exact int32 sums of a 2-D NCHW conv of INT8 `x` (zero point `zp`) and INT8 `w` (OIHW)
    through onnxruntime's ConvInteger (uint8 operands, offset by 128 with the zero points
    moved to match: the same integers), or None where it does not apply: where an int32 sum
    could overflow (more than 2**31 / 255**2 taps) or the kernel is unavailable."""
    taps = int(np.prod(w.shape[1:]))
    if x.ndim != 4 or taps * 255 * 255 >= 1 << 31:
        return None
    key = ("conv_integer", tuple(attrs["strides"]), tuple(attrs["pads"]), tuple(attrs["dilations"]), attrs["group"])
    session = WEIGHTS.get(w, key, lambda: _conv_integer_session(w, attrs, attrs["group"]) or _NO_SESSION)
    if session is _NO_SESSION:
        return None
    xu = x.view(np.uint8) ^ np.uint8(0x80)             # int8 v -> uint8 v + 128 (the sign bit flipped)
    return session.run(None, {"x": xu, "xz": np.array(zp + 128, np.uint8)})[0]


def conv_f32(x: np.ndarray, zp: int, w: np.ndarray, b, attrs: dict):
    """Exact sums `conv(x - zp, w) + b` of a 2-D NCHW conv as float32, through onnxruntime's
    float Conv, or None where that is not exact: every partial sum is an integer no larger than
    255 * sum|w| + |b| per channel, so where that is below 2**24 every float32 addition is
    exact, whatever the order (products of integers below 2**15 are exact, FMA included)."""
    if x.ndim != 4:
        return None
    if WEIGHTS.get(w, ("sum_bound",), lambda: requant.sum_bound(w)) + requant.bias_bound(b) >= 1 << 24:
        return None
    key = ("conv_f32", tuple(attrs["strides"]), tuple(attrs["pads"]), tuple(attrs["dilations"]), attrs["group"], zp)
    session = WEIGHTS.get(w, key, lambda: _conv_f32_session(w, attrs, zp) or _NO_SESSION)
    if session is _NO_SESSION:
        return None
    bf = np.zeros(w.shape[0], np.float32) if b is None else \
        WEIGHTS.get(b, ("f32",), lambda: np.asarray(b, np.float32).reshape(-1))
    return session.run(None, {"x": x, "b": bf})[0]


def _matmul_integer_session(w: np.ndarray, zw: int):
    """An onnxruntime MatMulInteger (uint8 x uint8 -> exact int32) by one INT8 [K, N] weight."""
    from onnx import TensorProto, helper, numpy_helper

    wu = (w.astype(np.int16) + 128).astype(np.uint8)
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["x", "w", "xz", "wz"], ["y"])], "matmul_integer",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, None),
         helper.make_tensor_value_info("xz", TensorProto.UINT8, [])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        [numpy_helper.from_array(wu, "w"), numpy_helper.from_array(np.array(zw + 128, np.uint8), "wz")])
    return _session(graph)


def matmul_integer(x: np.ndarray, zx: int, w: np.ndarray, zw: int, right_transpose: bool):
    """Exact int32 products `(x - zx) @ (w - zw)` of INT8 operands (w 2-D, [K, N] or [N, K]
    with `right_transpose`) through onnxruntime's MatMulInteger (uint8 operands offset by 128,
    as `conv_integer`), or None where an int32 sum could overflow or the kernel is unavailable."""
    if w.ndim != 2 or x.ndim < 2:
        return None
    k = w.shape[1 if right_transpose else 0]
    if x.shape[-1] != k or k * 255 * 255 >= 1 << 31:
        return None
    session = WEIGHTS.get(w, ("matmul_integer", zw, right_transpose),
                          lambda: _matmul_integer_session(np.ascontiguousarray(w.T) if right_transpose else w, zw)
                          or _NO_SESSION)
    if session is _NO_SESSION:
        return None
    xu = np.ascontiguousarray(x).view(np.uint8) ^ np.uint8(0x80)
    return session.run(None, {"x": xu, "xz": np.array(zx + 128, np.uint8)})[0]


def _native_conv(w, b, attrs, info):
    """The native form of a 2-D conv of INT8 data (None where it has none), prepared once per op
    (kept in `info.memo`): `run(x) -> y or None`. Depthwise and ungrouped convs (8-bit data, or a
    16-bit link) run whole in the native kernels (`native.Conv`); where those decline, ungrouped
    8-bit ones as onnxruntime's ConvInteger sums with the bias and requantization fused after.
    NHWC data is transposed around the NCHW kernels."""
    hit = info.memo.get("native_conv")
    if hit is not None and hit[0] is w and hit[1] is b and hit[2] is attrs:
        return hit[3]
    run = _make_native_conv(w, b, attrs, info)
    info.memo["native_conv"] = (w, b, attrs, run)
    return run


def _make_native_conv(w, b, attrs, info):
    fused = _native_plan(attrs, info.outs[0])
    link = info.ins[0].dtype == "i16"           # a 16-bit link
    if fused is None or info.ins[0].dtype not in ("i8", "u8", "i16") or w.dtype != np.int8 or w.ndim != 4:
        return None
    nhwc = attrs["layout"] == "NHWC"
    wn = np.ascontiguousarray(w.transpose(3, 2, 0, 1)) if attrs["kernel_layout"] == "HWIO" else w
    zx = info.ins[0].zp
    prepared = native.Conv(fused, wn, b, zx, attrs, link=link)
    if prepared.kind is None and (attrs["group"] != 1 or info.ins[0].dtype != "i8"):
        return None
    bias = b if prepared.b32 is None else prepared.b32

    def run(x):
        if x.ndim != 4:
            return None
        xn = np.ascontiguousarray(x.transpose(0, 3, 1, 2)) if nhwc else x
        if prepared.kind is not None:
            y = prepared(xn)
        else:
            acc = conv_integer(xn, zx, wn, attrs)
            y = None if acc is None else fused.requant(acc, 1, bias=bias, exact32=prepared.exact32)
        return y if y is None or not nhwc else y.transpose(0, 2, 3, 1)

    return run


def _two_passes(x, zp: int, w, attrs: dict, nhwc: bool) -> np.ndarray | None:
    """Exact int64 sums of a conv of 16-bit data `x` (zero point `zp`) as the chip runs it: two
    INT8 passes, over the signed high byte and the unsigned low byte (`256 hi + lo`), each exact
    (float32 through `conv_f32` for a grouped conv where it is exact: onnxruntime's float kernels
    are faster there; else int32 through `conv_integer`); None where a pass is not."""
    xn = np.ascontiguousarray(x.transpose(0, 3, 1, 2)) if nhwc else x
    wn = WEIGHTS.get(w, ("oihw",), lambda: np.ascontiguousarray(w.transpose(3, 2, 0, 1))) \
        if attrs["kernel_layout"] == "HWIO" else w
    xi = xn.astype(np.int32)
    hi = (xi >> 8).astype(np.int8)                   # floor(x / 256): -128..127
    lo = ((xi & 0xFF) - 128).astype(np.int8)         # x mod 256, on int8 with zero point -128
    # zero point: 256 hi + lo - zp = 256 (hi - zp_hi) + (lo - zp_lo) with zp = 256 zp_hi + zp_lo
    zp_hi, zp_lo = zp >> 8, (zp & 0xFF) - 128

    def one_pass(plane, z):
        t = conv_f32(plane, z, wn, None, attrs) if attrs["group"] > 1 else None
        return conv_integer(plane, z, wn, attrs) if t is None else t

    t_hi, t_lo = one_pass(hi, zp_hi), one_pass(lo, zp_lo)
    if t_hi is None or t_lo is None:
        return None
    t_hi, t_lo = (t if t.dtype.kind == "i" else np.rint(t) for t in (t_hi, t_lo))
    acc = t_hi.astype(np.int64) * 256 + t_lo.astype(np.int64)
    return acc.transpose(0, 2, 3, 1) if nhwc else acc


def weight_planes(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The two INT8 planes (hi, lo) of 16-bit weights `q` (|q| <= 127 * 256 + 127): q = 256 hi +
    lo, both signed, so a conv of 16-bit weights is two INT8 convs of the same data."""
    q = np.asarray(q, np.int32)
    hi = (q + 128) >> 8
    return hi.astype(np.int8), (q - 256 * hi).astype(np.int8)


def _weight_passes(x, zp: int, w, attrs: dict, nhwc: bool) -> np.ndarray | None:
    """Exact int64 sums of a 2-D conv of INT8 data `x` (zero point `zp`) and 16-bit weights `w`
    as the chip runs it: one INT8 pass per byte plane of the weights (`weight_planes`), each
    exact in int32 (`conv_integer`), combined as 256 hi + lo in 64 bits; None where a pass is
    not exact that way."""
    wn = w.transpose(3, 2, 0, 1) if attrs["kernel_layout"] == "HWIO" else w
    planes = WEIGHTS.get(w, ("planes_oihw",), lambda: tuple(np.ascontiguousarray(p) for p in weight_planes(wn)))
    xn = np.ascontiguousarray(x.transpose(0, 3, 1, 2)) if nhwc else x
    t_hi, t_lo = (conv_integer(xn, zp, p, attrs) for p in planes)
    if t_hi is None or t_lo is None:
        return None
    acc = t_hi.astype(np.int64) * 256 + t_lo
    return acc.transpose(0, 2, 3, 1) if nhwc else acc


@int8("tpu.Conv")
def conv(operands, attrs, info):
    x, w, b = operands
    nhwc = attrs["layout"] == "NHWC"
    axis = x.ndim - 1 if nhwc else 1
    acc = None
    if w.dtype == np.int16:          # 16-bit weights: two INT8 passes (else exact in float64 below)
        if x.ndim == 4 and info.ins[0].dtype == "i8":
            acc = _weight_passes(x, info.ins[0].zp, w, attrs, nhwc)
        if acc is None:
            acc = np.rint(conv_accumulate(_centered(x, info.ins[0]), w, attrs)).astype(np.int64)
        if b is not None:
            acc += _per_channel(b, acc.ndim, axis)
        return [_requant(acc, attrs, info.outs[0], axis)]
    fast = _native_conv(w, b, attrs, info)
    if fast is not None:
        y = fast(x)
        if y is not None:
            return [y]
    if x.ndim == 4 and info.ins[0].dtype == "i16" and w.dtype == np.int8:
        acc = _two_passes(x, info.ins[0].zp, w, attrs, nhwc)
        if acc is not None:
            if b is not None:
                acc += _per_channel(b, acc.ndim, axis)
            return [_requant(acc, attrs, info.outs[0], axis)]
    if x.ndim == 4 and info.ins[0].dtype == "i8" and w.dtype == np.int8:
        xn = np.ascontiguousarray(x.transpose(0, 3, 1, 2)) if nhwc else x
        wn = WEIGHTS.get(w, ("oihw",), lambda: np.ascontiguousarray(w.transpose(3, 2, 0, 1))) \
            if attrs["kernel_layout"] == "HWIO" else w
        if attrs["group"] > 1:          # grouped / depthwise: onnxruntime's float kernels are faster
            t = conv_f32(xn, info.ins[0].zp, wn, b, attrs)
            if t is not None:
                if nhwc:
                    t = t.transpose(0, 2, 3, 1)
                return [_requant(t, attrs, info.outs[0], axis, saturated=True)]
        acc = conv_integer(xn, info.ins[0].zp, wn, attrs)
        if acc is not None:
            # |acc| <= 255 * sum|w| per channel: where that plus |bias| fits int32, the bias is
            # added in int32 and nothing saturates
            bound = WEIGHTS.get(wn, ("sum_bound",), lambda: requant.sum_bound(wn)) + requant.bias_bound(b)
            if bound <= rounding.INT32_MAX:
                if b is not None:
                    acc += WEIGHTS.get(b, ("nchw_i32", acc.ndim), lambda: _per_channel(b, acc.ndim, 1).astype(np.int32))
                if nhwc:
                    acc = acc.transpose(0, 2, 3, 1)
                return [_requant(acc, attrs, info.outs[0], axis, saturated=True)]
            acc = acc.astype(np.int64)
            if nhwc:
                acc = acc.transpose(0, 2, 3, 1)
    if acc is None:
        acc = np.rint(conv_accumulate(_centered(x, info.ins[0]), w, attrs)).astype(np.int64)
    if b is not None:
        acc += _per_channel(b, acc.ndim, axis)
    return [_requant(acc, attrs, info.outs[0], axis)]


@int8("tpu.MatMul")
def matmul(operands, attrs, info):
    x, w, b = operands
    rt = bool(attrs["right_transpose"])
    zw = info.ins[1].zp if info.ins[1].quantized and info.ins[1].axis is None else 0
    xi, wi = info.ins[0], info.ins[1]
    if (xi.dtype == "i8" and xi.axis is None and x.dtype == np.int8 and w.dtype == np.int8
            and (wi.axis is None or not any(wi.zero_points))):
        acc = matmul_integer(x, xi.zp, w, zw, rt)
        if acc is not None:
            acc = acc.astype(np.int64)
            if b is not None:
                acc += np.asarray(b, np.int64).reshape(-1)
            return [_requant(acc, attrs, info.outs[0], acc.ndim - 1)]
    wf = WEIGHTS.get(w, ("centered_f64", zw, rt),
                     lambda: np.ascontiguousarray(np.swapaxes(_centered(w, info.ins[1]), -1, -2) if rt
                                                  else _centered(w, info.ins[1])))
    acc = np.rint(np.matmul(_centered(x, info.ins[0]), wf)).astype(np.int64)
    if b is not None:
        acc += np.asarray(b, np.int64).reshape(-1)
    return [_requant(acc, attrs, info.outs[0], acc.ndim - 1)]


# ---------------------------------------------------------------- element-wise

def _add_sub(operands, attrs, info, sign: int):
    m, r = attrs["multiplier"], attrs["rshift"][0]
    out = info.outs[0]
    if all(i.axis is None for i in info.ins[:2]) and out.dtype in quant.STORAGE:
        lo, hi = _bounds(attrs, out)
        # the native kernel (INT8 and 16-bit links, int32 lanes where they are exact), else numpy
        y = native.add(np.asarray(operands[0]), np.asarray(operands[1]), info.ins[0].zp, info.ins[1].zp, int(m[0]),
                       sign * int(m[1]), r, lo, hi, out.zp, quant.STORAGE[out.dtype][0])
        if y is not None:
            return [y]
        if all(i.dtype in ("i8", "u8") for i in info.ins[:2]) and all(-(1 << 15) <= v < (1 << 15) for v in m[:2]) \
                and 0 <= r <= 31:
            return [_add_sub_int32(operands, m, r, lo, hi, info, sign)]
    a = (operands[0].astype(np.int64) - info.ins[0].zp) * m[0]
    b = (operands[1].astype(np.int64) - info.ins[1].zp) * m[1]
    y = rounding.rounding_divide_by_pot(a + sign * b, r).astype(np.int64) + info.outs[0].zp
    return [_clamp(y, attrs, info.outs[0])]


def _add_sub_int32(operands, m, r: int, lo: int, hi: int, info, sign: int) -> np.ndarray:
    """`_add_sub` in int32: |x - zp| <= 255 and |m| <= 2**15 keep each product under 2**23 and
    the sum plus the rounding half under 2**31. The rounding shift is `requant`'s step 2 (one
    shift where the clamp's lower bound is at or above the zero point, as its step 3)."""
    x0, x1 = np.asarray(operands[0]), np.asarray(operands[1])
    out = info.outs[0]
    z0, z1 = info.ins[0].zp, info.ins[1].zp

    def slab(a, b, y):
        a = a.astype(np.int32)
        if z0:
            a -= np.int32(z0)
        a *= np.int32(m[0])
        b = b.astype(np.int32)
        if z1:
            b -= np.int32(z1)
        b *= np.int32(sign * m[1])
        a = np.add(a, b, out=a) if a.shape == np.broadcast_shapes(a.shape, b.shape) else a + b
        if r > 0:
            if lo - out.zp < 0:
                a += a >> 31                            # - [a < 0]
            a += np.int32(1 << (r - 1))
            a >>= r
        return requant.clamp_into(a, lo, hi, out.zp, y)

    if x0.shape != x1.shape:
        return slab(x0, x1, np.dtype(quant.STORAGE[out.dtype][0]))
    y = np.empty(x0.shape, quant.STORAGE[out.dtype][0])
    requant.in_slabs(x0.shape, None, lambda sl: slab(x0[sl], x1[sl], y[sl]))
    return y


@int8("tpu.Add")
def add(operands, attrs, info):
    return _add_sub(operands, attrs, info, 1)


@int8("tpu.Sub")
def sub(operands, attrs, info):
    return _add_sub(operands, attrs, info, -1)


@int8("tpu.Mul")
def mul(operands, attrs, info):
    x0, x1 = np.asarray(operands[0]), np.asarray(operands[1])
    exact32 = _product_bound(x0, info.ins[0].zp) * _product_bound(x1, info.ins[1].zp) < 1 << 31
    wide = np.int32 if exact32 else np.int64            # (int32 holds any product but of two 16-bit factors)
    acc = np.asarray((x0.astype(wide) - wide(info.ins[0].zp)) * (x1.astype(wide) - wide(info.ins[1].zp)))
    return [_requant(acc, attrs, info.outs[0], 0, saturated=exact32)]


def _product_bound(x: np.ndarray, zp: int) -> int:
    """The largest |x - zp| that `x`'s integer type allows (a factor of a product's bound)."""
    if not np.issubdtype(x.dtype, np.integer):
        return 1 << 62
    t = np.iinfo(x.dtype)
    return max(abs(int(t.min) - zp), abs(int(t.max) - zp))


def slope_like(slope: np.ndarray, x: np.ndarray, attrs: dict) -> np.ndarray:
    """A PReLU slope shaped to broadcast against `x`, as the TOP kernel does (numpy rules, or a
    1-D slope of C values on the channel axis)."""
    try:
        np.broadcast_shapes(x.shape, slope.shape)
        return slope
    except ValueError:
        axis = x.ndim - 1 if attrs.get("layout") == "NHWC" else 1
        return slope.reshape([-1] + [1] * (x.ndim - 1 - axis))


@int8("tpu.PRelu")
def prelu(operands, attrs, info):
    """x >= 0: requantized by multiplier[0]; x < 0: times the INT8 slope, requantized by the
    slope element's own multiplier (multiplier[1:], shaped like the slope)."""
    x, slope = operands
    xc = x.astype(np.int64) - info.ins[0].zp
    m, r = np.asarray(attrs["multiplier"], np.int64), np.asarray(attrs["rshift"], np.int64)
    sq = slope_like(slope.astype(np.int64), x, attrs)
    m_neg, r_neg = slope_like(m[1:].reshape(slope.shape), x, attrs), slope_like(r[1:].reshape(slope.shape), x, attrs)
    pos = rounding.multiply_by_quantized_multiplier(np.clip(xc, 0, None), m[0], -r[0]).astype(np.int64)
    neg = rounding.multiply_by_quantized_multiplier(np.minimum(xc, 0) * sq, m_neg, -r_neg).astype(np.int64)
    y = np.where(xc >= 0, pos, neg) + info.outs[0].zp
    return [_clamp(y, attrs, info.outs[0])]


@own("tpu.Lut")
def lut(operands, attrs, info):
    """An 8-bit input indexes its table; a 16-bit one interpolates between two knots (`tpu.Lut`)."""
    x, table = operands
    if info.ins[0].dtype != "i16":
        got = native.lookup(x, np.asarray(table), info.ins[0].qmin)
        return [got if got is not None else table[x.astype(np.int32) - info.ins[0].qmin]]
    got = native.interpolate(x, np.asarray(table), Lut.KNOT_BITS, Lut.FRACTION_BITS, *_bounds({}, info.outs[0]),
                             quant.STORAGE[info.outs[0].dtype][0])
    if got is not None:
        return [got]
    u = x.astype(np.int32) - info.ins[0].qmin
    i, f = u >> Lut.KNOT_BITS, (u & ((1 << Lut.KNOT_BITS) - 1)).astype(np.int64)
    lo, hi = table[i].astype(np.int64), table[i + 1].astype(np.int64)
    shift = Lut.KNOT_BITS + Lut.FRACTION_BITS
    y = ((lo << Lut.KNOT_BITS) + (hi - lo) * f + (1 << (shift - 1))) >> shift
    return [_clamp(y, {}, info.outs[0])]


# ---------------------------------------------------------------- pools

def _same_grid_pool(top_name: str):
    kernel = KERNELS[top_name]

    def run(operands, attrs, info):
        y = kernel([operands[0]], {**attrs, "do_relu": False})[0]
        return [_clamp(np.asarray(y, np.int64), attrs, info.outs[0])]

    return run


int8("tpu.MaxPool")(_same_grid_pool("top.MaxPool"))
int8("tpu.GlobalMaxPool")(_same_grid_pool("top.GlobalMaxPool"))


@int8("tpu.AvgPool")
def avg_pool(operands, attrs, info):
    """Window sums (a depthwise conv of ones, exact), one multiplier for the constant count."""
    x = operands[0]
    nhwc = attrs["layout"] == "NHWC"
    c = x.shape[-1] if nhwc else x.shape[1]
    ones = np.ones((c, 1, *attrs["kernel_shape"]), np.float64)
    conv_attrs = {**attrs, "group": c, "kernel_layout": "OIHW",
                  "dilations": [1] * len(attrs["kernel_shape"])}    # a pool has no dilations
    acc = np.rint(conv_accumulate(_centered(x, info.ins[0]), ones, conv_attrs)).astype(np.int64)
    return [_requant(acc, attrs, info.outs[0], 0)]


@int8("tpu.GlobalAvgPool")
def global_avg_pool(operands, attrs, info):
    x = operands[0]
    nhwc = attrs["layout"] == "NHWC"
    axes = tuple(range(1, x.ndim - 1)) if nhwc else tuple(range(2, x.ndim))
    acc = (x.astype(np.int64) - info.ins[0].zp).sum(axis=axes, keepdims=bool(attrs["keepdims"]))
    return [_requant(acc, attrs, info.outs[0], 0)]


# ---------------------------------------------------------------- data movement

@int8("tpu.Concat")
def concat(operands, attrs, info):
    y = np.concatenate(operands, axis=int(attrs["axis"]) % operands[0].ndim)
    return [_clamp(y.astype(np.int64), attrs, info.outs[0]) if attrs.get("do_relu") else y]


def _movement(top_name: str):
    kernel = KERNELS[top_name]

    def run(operands, attrs, info):
        return [np.asarray(r) for r in kernel(operands, attrs)]

    return run


for _name in ("Reshape", "Flatten", "Permute", "Squeeze", "Unsqueeze", "Slice", "Split", "Pad",
              "SpaceToDepth", "DepthToSpace", "Gather"):
    int8(f"tpu.{_name}")(_movement(f"top.{_name}"))


# ---------------------------------------------------------------- casts

@own("tpu.Cast")
def cast(operands, attrs, info):
    x = operands[0]
    src, dst = info.ins[0], info.outs[0]
    if src.quantized and dst.quantized:             # requantize (one multiplier), as an accumulator is
        acc = np.asarray(x).astype(np.int32)
        if src.zp:
            acc -= np.int32(src.zp)
        return [_requant(acc, attrs, dst, axis=0, saturated=True)]
    if dst.quantized:
        return [native.quantized(x, dst.scale, dst.zp, np.dtype(quant.STORAGE[dst.dtype][0]))]
    if src.quantized:
        return [native.to_float(rounding.dequantize(x, src.scale, src.zp, "f32"), dst.dtype)]
    if dst.dtype in ("f32", "f16", "bf16"):
        return [native.to_float(native.widened(x), dst.dtype)]
    return [np.asarray(x).astype(A.numpy_dtype(dst.dtype))]
