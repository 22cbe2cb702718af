"""One TF lowering per TOP op, in a table keyed by the op's full name (`top.Conv`).

A lowering maps `(operand Vals, attrs, result shapes[, op_name]) -> [Val]` and raises
`NotLowered` (with the reason) for what it does not take; the builder then runs the op's numpy
kernel inside the graph instead and says so. Convs are emitted as Conv2D/DepthwiseConv2dNative +
BiasAdd + activation, the pattern TF's remapper fuses into one kernel (Conv2D always, depthwise
convs where TF runs oneDNN: `onednn_fusions`).
"""

from __future__ import annotations

import math

import numpy as np

from tftpu import geometry
from tftpu.interp.compiled.values import (
    NHWC, NotLowered, Val, _channels_last_input, _compose, _ints, _inv, _nhwc_attr, _relu, _tf, const, conv_bias,
    f32, fused_relu, logical, onednn_fusions, pad, transposed)

POINTWISE_AS_MATMUL = False  # 1x1 convs as one [NHW, C] x [C, O] matmul (fuses nothing)
LOWERINGS: dict = {}


def lowering(*names):
    """Register the decorated `(operand Vals, attrs, result shapes[, op_name]) -> [Val]`
    lowering for each TOP op (bare names here; the table is keyed by the full name, `top.Conv`);
    it raises NotLowered for what it does not take."""

    def wrap(fn):
        for n in names:
            LOWERINGS[f"top.{n}"] = fn
        return fn
    return wrap


def _tf_padding(in_hw, k, s, d, p):
    """"VALID" or "SAME" when ONNX pads [t, l, b, r] are what TF's mode pads (its fused
    kernels are fastest so), else explicit NHWC paddings."""
    if not any(p):
        return "VALID"
    same = [p for i in range(2) for p in geometry.same_pads(in_hw[i], k[i], s[i], d[i])]
    if same == [p[0], p[2], p[1], p[3]]:
        return "SAME"
    return [[0, 0], [p[0], p[2]], [p[1], p[3]], [0, 0]]


@lowering("Conv")
def _conv(ins, attrs, out_shapes):
    t = _tf()
    x, w, b = ins[0], ins[1], ins[2] if len(ins) > 2 else None
    if len(x.shape) != 4 or w.np is None:
        raise NotLowered("only constant-weight 2-D conv")
    kl = attrs.get("kernel_layout") or "OIHW"
    wn = w.np.astype(np.float32)
    if kl == "HWIO":
        wn = wn.transpose(3, 2, 0, 1)
    elif kl != "OIHW":
        raise NotLowered(kl)
    o, ig, kh, kw = wn.shape
    k = _ints(attrs, "kernel_shape", 2, 0)
    if any(k) and tuple(k) != (kh, kw):
        raise NotLowered("kernel_shape differs from the weight")
    s = _ints(attrs, "strides", 2, 1)
    p = _ints(attrs, "pads", 4, 0)
    d = _ints(attrs, "dilations", 2, 1)
    g = int(attrs.get("group", 1) or 1)
    xt, perm = _channels_last_input(x, attrs)
    xt = f32(xt)
    c = int(xt.shape[3])
    pads = _tf_padding([int(xt.shape[1]), int(xt.shape[2])], [kh, kw], s, d, p)
    fusable = True  # the result is Conv2D, which the remapper fuses with or without oneDNN
    if g == 1:
        if (kh, kw) == (1, 1) and s == [1, 1] and not any(p) and POINTWISE_AS_MATMUL:
            fusable = False
            n, h, wd = (int(v) for v in xt.shape[:3])
            y = t.reshape(t.matmul(t.reshape(xt, [-1, c]), const(
                np.ascontiguousarray(wn.reshape(o, c).T))), [n, h, wd, o])
        else:
            y = t.nn.conv2d(xt, const(np.ascontiguousarray(wn.transpose(2, 3, 1, 0))),
                            [1, *s, 1], pads, dilations=[1, *d, 1])
    elif g == c and ig == 1 and o % c == 0 and s[0] == s[1] and (s == [1, 1] or d == [1, 1]):
        fusable = onednn_fusions()  # a zero bias costs a pass where depthwise convs do not fuse
        f = wn.reshape(c, o // c, kh, kw).transpose(2, 3, 0, 1)
        if not isinstance(pads, str):
            xt = pad(xt, pads)
        y = t.nn.depthwise_conv2d(xt, const(np.ascontiguousarray(f)), [1, *s, 1],
                                  pads if isinstance(pads, str) else "VALID", dilations=d)
    else:
        fusable = False
        og = o // g
        f = wn.transpose(2, 3, 1, 0)
        xs = t.split(xt, g, axis=3)
        y = t.concat([t.nn.conv2d(xs[i], const(np.ascontiguousarray(
            f[..., i * og:(i + 1) * og])), [1, *s, 1], pads, dilations=[1, *d, 1])
            for i in range(g)], axis=3)
    if b is not None and b.np is None:
        y = t.nn.bias_add(y, t.reshape(f32(logical(b)), [-1]))
    elif (b is not None and b.np.any()) or fusable:  # Conv+BiasAdd(+Relu6/Add) fuses, zeros or not
        y = t.nn.bias_add(y, conv_bias(int(y.shape[3]) if b is None
                                       else b.np.astype(np.float32).reshape(-1)))
    return [Val(_relu(y, fused_relu(attrs)), perm, out_shapes[0])]


@lowering("Deconv")
def _deconv(ins, attrs, out_shapes):
    t = _tf()
    x, w, b = ins[0], ins[1], ins[2] if len(ins) > 2 else None
    if len(x.shape) != 4 or w.np is None or int(attrs.get("group", 1) or 1) != 1:
        raise NotLowered("only constant-weight 2-D deconv, group 1")
    wn = w.np.astype(np.float32)  # [I, O, kh, kw]
    k = _ints(attrs, "kernel_shape", 2, 0)
    if any(k) and tuple(k) != tuple(wn.shape[2:]):
        raise NotLowered("kernel_shape differs from the weight")
    s = _ints(attrs, "strides", 2, 1)
    p = _ints(attrs, "pads", 4, 0)
    d = _ints(attrs, "dilations", 2, 1)
    op_ = _ints(attrs, "output_padding", 2, 0)
    if d != [1, 1]:  # a dilated kernel as a plain one with zeros between the taps
        dk = [geometry.span(wn.shape[2 + i], d[i]) for i in range(2)]
        full_w = np.zeros(wn.shape[:2] + tuple(dk), np.float32)
        full_w[:, :, ::d[0], ::d[1]] = wn
        wn = full_w
    kh, kw = wn.shape[2:]
    xt, perm = _channels_last_input(x, attrs)
    xt = f32(xt)
    n, h, wd = (int(v) for v in xt.shape[:3])
    o = wn.shape[1]
    full = [geometry.deconv_out(h, kh, s[0]), geometry.deconv_out(wd, kw, s[1])]
    y = t.nn.conv2d_transpose(xt, const(np.ascontiguousarray(wn.transpose(2, 3, 1, 0))),
                              [n, *full, o], [1, *s, 1], "VALID")
    extra = [max(0, op_[i] - p[2 + i]) for i in range(2)]
    if any(extra):
        y = pad(y, [[0, 0], [0, extra[0]], [0, extra[1]], [0, 0]])
    ends = [full[i] + extra[i] - max(0, p[2 + i] - op_[i]) for i in range(2)]
    y = y[:, p[0]:ends[0], p[1]:ends[1], :]
    if b is not None:
        y = y + (const(b.np.astype(np.float32).reshape(-1)) if b.np is not None
                 else t.reshape(f32(logical(b)), [-1]))
    return [Val(_relu(y, fused_relu(attrs)), perm, out_shapes[0])]


@lowering("MatMul")
def _matmul(ins, attrs, out_shapes):
    t = _tf()
    a, b = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise NotLowered("1-D matmul")
    rt = bool(attrs.get("right_transpose", False))
    bt = const(b.np.astype(np.float32)) if b.np is not None else f32(logical(b))
    y = t.linalg.matmul(f32(logical(a)), bt, transpose_b=rt)
    if bias is not None and bias.np is not None and len(y.shape) == 2 and \
            bias.np.size == bias.np.shape[-1] == y.shape[1]:  # MatMul+BiasAdd fuses
        y = t.nn.bias_add(y, conv_bias(bias.np.astype(np.float32).reshape(-1)))
    elif bias is not None:
        y = y + (const(bias.np.astype(np.float32)) if bias.np is not None
                 else f32(logical(bias)))
    return [Val(_relu(y, fused_relu(attrs)), None, out_shapes[0])]


def _same_perm(ins, out_rank):
    """A common storage perm for element-wise operands (that of the first full-rank operand
    not in logical order), and each operand's tensor in it."""
    perm = next((v.perm for v in ins if v.perm is not None and len(v.shape) == out_rank), None)
    if perm is None:
        return None, [logical(v) for v in ins]
    t = _tf()
    out = []
    for v in ins:
        if len(v.shape) == out_rank:
            out.append(transposed(v, perm))
        else:
            full = (1,) * (out_rank - len(v.shape)) + tuple(v.shape)
            if v.np is not None:
                out.append(const(np.ascontiguousarray(np.transpose(
                    np.reshape(v.np, full), perm))))
            else:
                out.append(t.transpose(t.reshape(logical(v), full), perm))
    return perm, out


_BINARY = {
    "Add": lambda t, a, b: t.add(a, b), "Sub": lambda t, a, b: t.subtract(a, b),
    "Mul": lambda t, a, b: t.multiply(a, b), "Max": lambda t, a, b: t.maximum(a, b),
    "Min": lambda t, a, b: t.minimum(a, b),
}


@lowering("Add", "Sub", "Mul", "Div", "Max", "Min")
def _binary(ins, attrs, out_shapes, op_name):
    t = _tf()
    a, b = ins
    perm, (at, bt) = _same_perm([a, b], len(out_shapes[0]))
    if at.dtype.is_floating or bt.dtype.is_floating:
        at, bt = t.cast(at, t.float32), t.cast(bt, t.float32)
    elif at.dtype != bt.dtype:
        raise NotLowered("mixed integer types")
    if op_name == "Div":
        y = t.truncatediv(at, bt) if at.dtype.is_integer else t.math.divide(at, bt)
    else:
        y = _BINARY[op_name](t, at, bt)
    lim = fused_relu(attrs) if op_name in ("Add", "Sub", "Mul") else None
    return [Val(_relu(y, lim), perm, out_shapes[0])]


def _unary_fn(op_name, attrs):
    t = _tf()
    F = np.float32
    if op_name == "Relu":
        lim = attrs.get("relu_limit", -1.0)
        return lambda x: _relu(x, -1.0 if lim is None else float(lim))
    if op_name == "Clip":
        lo = -np.inf if attrs.get("min") is None else attrs["min"]
        hi = np.inf if attrs.get("max") is None else attrs["max"]
        return lambda x: t.minimum(t.maximum(x, F(lo)), F(hi))
    if op_name == "LeakyRelu":
        al = F(attrs.get("alpha", 0.01))
        return lambda x: t.where(x >= 0, x, x * al)
    if op_name == "HardSigmoid":
        al, be = F(attrs.get("alpha", 0.2)), F(attrs.get("beta", 0.5))
        return lambda x: t.clip_by_value(x * al + be, F(0), F(1))
    if op_name == "GELU":
        if (attrs.get("approximate") or "none") == "tanh":
            c = F(math.sqrt(2 / math.pi))
            return lambda x: 0.5 * x * (1 + t.tanh(c * (x + F(0.044715) * x * x * x)))
        return lambda x: 0.5 * x * (1 + t.math.erf(x * F(1 / math.sqrt(2))))
    simple = {
        "Sigmoid": t.sigmoid, "Tanh": t.tanh, "Exp": t.exp, "Log": t.math.log,
        "Sqrt": t.sqrt, "Erf": t.math.erf, "Abs": t.abs, "Neg": t.negative,
        "HardSwish": lambda x: x * t.clip_by_value(x * F(1 / 6) + F(0.5), F(0), F(1)),
        "SiLU": lambda x: x * t.sigmoid(x),
        "Floor": t.floor, "Ceil": t.math.ceil, "Round": t.round, "Sign": t.sign, "Sin": t.sin, "Cos": t.cos,
        "Softsign": t.nn.softsign,
    }
    return simple[op_name]


@lowering("Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "SiLU", "Tanh",
          "Exp", "Log", "Sqrt", "Erf", "Abs", "Neg", "GELU", "Floor", "Ceil", "Round", "Sign", "Sin", "Cos",
          "Softsign")
def _unary(ins, attrs, out_shapes, op_name):
    x = ins[0]
    if not x.t.dtype.is_floating:
        if op_name not in ("Abs", "Neg", "Relu", "Sign"):
            raise NotLowered("integer operand")
        xt = x.t
    else:
        xt = f32(x.t)
    return [Val(_unary_fn(op_name, attrs)(xt), x.perm, out_shapes[0])]


@lowering("PRelu")
def _prelu(ins, attrs, out_shapes):
    t = _tf()
    x, s = ins
    if s.np is None:
        raise NotLowered("dynamic slope")
    slope = s.np.astype(np.float32)
    try:
        np.broadcast_shapes(x.shape, slope.shape)
    except ValueError:
        ax = len(x.shape) - 1 if _nhwc_attr(attrs) else 1
        slope = slope.reshape([-1] + [1] * (len(x.shape) - 1 - ax)) if slope.ndim <= 1 else slope
    sv = Val(const(slope), None, slope.shape, slope)
    perm, (xt, st) = _same_perm([x, sv], len(out_shapes[0]))
    xt = f32(xt)
    return [Val(t.where(xt >= 0, xt, xt * st), perm, out_shapes[0])]


@lowering("Softmax")
def _softmax(ins, attrs, out_shapes):
    t = _tf()
    x = ins[0]
    axis = int(attrs.get("axis", -1)) % len(x.shape)
    fn = t.nn.log_softmax if attrs.get("log", False) else t.nn.softmax
    if x.perm is not None:
        return [Val(fn(f32(x.t), axis=x.perm.index(axis)), x.perm, out_shapes[0])]
    return [Val(fn(f32(x.t), axis=axis), None, out_shapes[0])]


def _pool_count(in_hw, k, s, p, include_pad, out):
    """How many counted elements each output window of an average pool covers."""
    counts = []
    for i in range(2):
        lo = 0 if include_pad else p[i]
        hi = in_hw[i] + p[i] + (p[2 + i] if include_pad else 0)
        starts = np.arange(out[i]) * s[i]
        counts.append(np.clip(np.minimum(starts + k[i], hi) - np.maximum(starts, lo), 0, None))
    return np.outer(counts[0], counts[1]).astype(np.float32)


@lowering("MaxPool", "AvgPool")
def _pool(ins, attrs, out_shapes, op_name):

    t = _tf()
    x = ins[0]
    if len(x.shape) != 4 or not x.t.dtype == t.float32:
        raise NotLowered("2-D float32 pools only")
    k = _ints(attrs, "kernel_shape", 2, 1)
    s = _ints(attrs, "strides", 2, 1)
    p = _ints(attrs, "pads", 4, 0)
    if _ints(attrs, "dilations", 2, 1) != [1, 1]:
        raise NotLowered("dilated pool")
    ceil_mode = bool(attrs.get("ceil_mode", False))
    xt, perm = _channels_last_input(x, attrs)
    in_hw = [int(xt.shape[1]), int(xt.shape[2])]
    geo = [geometry.pool_window(in_hw[i], k[i], s[i], p[i], p[2 + i], 1, ceil_mode) for i in range(2)]
    out = [g[0] for g in geo]
    widths = [[0, 0], [p[0], p[2] + geo[0][1]], [p[1], p[3] + geo[1][1]], [0, 0]]
    padded = any(w != [0, 0] for w in widths)
    if op_name == "MaxPool":
        if padded:
            xt = pad(xt, widths, -np.inf)
        y = t.nn.max_pool2d(xt, k, s, "VALID")
    else:
        if padded:
            xt = pad(xt, widths)
        y = t.nn.avg_pool2d(xt, k, s, "VALID")
        include_pad = bool(attrs.get("count_include_pad", False))
        if padded and not (include_pad and not any(g[1] for g in geo)):
            cnt = _pool_count(in_hw, k, s, p, include_pad, out)
            y = y * const((np.float32(math.prod(k)) / cnt).reshape(1, *out, 1))
    return [Val(_relu(y, fused_relu(attrs)), perm, out_shapes[0])]


@lowering("GlobalAvgPool", "GlobalMaxPool")
def _global_pool(ins, attrs, out_shapes, op_name):
    t = _tf()
    x = ins[0]
    keep = attrs.get("keepdims", True)
    keep = True if keep is None else bool(keep)
    r = len(x.shape)
    axes = list(range(1, r - 1)) if _nhwc_attr(attrs) else list(range(2, r))
    fn = t.reduce_mean if op_name == "GlobalAvgPool" else t.reduce_max
    xt = f32(x.t) if op_name == "GlobalAvgPool" else x.t
    if x.perm is not None and keep:
        return [Val(fn(xt, axis=[x.perm.index(a) for a in axes], keepdims=True), x.perm,
                    out_shapes[0])]
    if x.perm is not None and x.perm == NHWC and axes == [2, 3]:
        return [Val(fn(xt, axis=[1, 2]), None, out_shapes[0])]
    return [Val(fn(logical(x), axis=axes, keepdims=keep), None, out_shapes[0])]


def _channel_vec(v: Val, x: Val, attrs, perm):
    """A per-channel operand of a BatchNorm/Scale as a constant broadcasting against `x`
    stored with `perm`."""
    r = len(x.shape)
    ax = (r - 1 if _nhwc_attr(attrs) else 1) if r > 1 else 0
    shape = [1] * r
    shape[ax] = -1
    arr = np.reshape(v, shape)
    if perm is not None:
        arr = np.transpose(arr, perm)
    return const(np.ascontiguousarray(arr))


@lowering("BatchNorm")
def _batch_norm(ins, attrs, out_shapes):
    x = ins[0]
    if any(v.np is None for v in ins[1:5]):
        raise NotLowered("dynamic statistics")
    mean, var, scale, bias = (v.np.astype(np.float32) for v in ins[1:5])
    eps = np.float32(attrs.get("epsilon", 1e-5))
    inv = scale / np.sqrt(var + eps)
    perm = x.perm if x.perm is not None and len(x.shape) == 4 else None
    xt = f32(x.t) if perm is not None else f32(logical(x))
    y = xt * _channel_vec(inv, x, attrs, perm) + _channel_vec(bias - mean * inv, x, attrs, perm)
    return [Val(y, perm, out_shapes[0])]


@lowering("Scale")
def _scale(ins, attrs, out_shapes):
    x, s = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    if s.np is None or (b is not None and b.np is None):
        raise NotLowered("dynamic scale")
    perm = x.perm if x.perm is not None and len(x.shape) == 4 else None
    xt = f32(x.t) if perm is not None else f32(logical(x))
    y = xt * _channel_vec(s.np.astype(np.float32), x, attrs, perm)
    if b is not None:
        y = y + _channel_vec(b.np.astype(np.float32), x, attrs, perm)
    return [Val(_relu(y, fused_relu(attrs)), perm, out_shapes[0])]


@lowering("LayerNorm")
def _layer_norm(ins, attrs, out_shapes):
    t = _tf()
    x = f32(logical(ins[0]))
    axes = sorted(int(a) % len(ins[0].shape) for a in attrs["axes"])
    mean = t.reduce_mean(x, axis=axes, keepdims=True)
    centred = x - mean
    var = t.reduce_mean(centred * centred, axis=axes, keepdims=True)
    y = centred * (1.0 / t.sqrt(var + np.float32(attrs.get("eps", 1e-5))))
    for v, combine in zip(ins[1:3], (t.multiply, t.add)):
        if v is not None:
            y = combine(y, f32(logical(v)))
    return [Val(y, None, out_shapes[0])]


_layer_norm.takes_absent = True  # a LayerNorm may have a bias without a scale


@lowering("Concat")
def _concat(ins, attrs, out_shapes):
    t = _tf()
    r = len(out_shapes[0])
    axis = int(attrs.get("axis", 0)) % max(r, 1)
    perm, ts = _same_perm(ins, r)
    dts = {x.dtype for x in ts}
    if len(dts) > 1:
        raise NotLowered("mixed dtypes")
    y = t.concat(ts, axis=axis if perm is None else perm.index(axis))
    return [Val(_relu(y, fused_relu(attrs)), perm, out_shapes[0])]


@lowering("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def _reshape(ins, attrs, out_shapes):
    return [Val(_tf().reshape(logical(ins[0]), out_shapes[0]), None, out_shapes[0])]


@lowering("Permute")
def _permute(ins, attrs, out_shapes):
    x = ins[0]
    r = len(x.shape)
    order = attrs.get("order")
    order = tuple(range(r))[::-1] if order is None else tuple(int(o) for o in order)
    # out = transpose(logical, order); stored as it is, x.t = transpose(out, perm_out)
    cur = x.perm or tuple(range(r))
    perm_out = _compose(_inv(order), cur)
    if perm_out == tuple(range(r)):
        return [Val(x.t, None, out_shapes[0], None)]
    if r == 4 and perm_out == NHWC:
        return [Val(x.t, NHWC, out_shapes[0], None)]
    return [Val(_tf().transpose(x.t, _inv(perm_out)), None, out_shapes[0])]


@lowering("Pad")
def _pad(ins, attrs, out_shapes):
    t = _tf()
    x = ins[0]
    p = [int(v) for v in attrs["paddings"]]
    r = len(x.shape)
    mode = attrs.get("mode", "constant") or "constant"
    if mode not in ("constant", "reflect") or any(v < 0 for v in p):
        raise NotLowered(mode)
    perm = x.perm
    widths = [[p[i], p[i + r]] for i in range(r)]
    if perm is not None:
        widths = [widths[a] for a in perm]
    if mode == "constant":
        val = np.asarray(attrs.get("val", 0.0) or 0).astype(x.t.dtype.as_numpy_dtype)
        y = pad(x.t, widths, val)
    else:
        y = t.pad(x.t, widths, mode="REFLECT")
    return [Val(y, perm, out_shapes[0])]


@lowering("Slice")
def _slice(ins, attrs, out_shapes):
    from tftpu.interp.kernels.shape import onnx_slice

    x = ins[0]
    r = len(x.shape)
    starts = [int(v) for v in attrs["starts"]]
    ends = [int(v) for v in attrs["ends"]]
    axes = attrs.get("axes") or list(range(len(starts)))
    steps = attrs.get("steps") or [1] * len(starts)
    sl = [slice(None)] * r
    for a, b, e, st in zip(axes, starts, ends, steps):
        a = int(a) % r
        sl[a] = onnx_slice(x.shape[a], b, e, int(st))
    if x.perm is not None:
        sl = [sl[a] for a in x.perm]
    return [Val(x.t[tuple(sl)], x.perm, out_shapes[0])]


@lowering("Split")
def _split(ins, attrs, out_shapes):
    x = ins[0]
    r = len(x.shape)
    axis = int(attrs.get("axis", 0)) % r
    sizes = [int(s) for s in attrs["split_size"]]
    if sum(sizes) != x.shape[axis]:
        raise NotLowered("sizes do not add up")
    ys = _tf().split(x.t, sizes, axis=axis if x.perm is None else x.perm.index(axis))
    return [Val(y, x.perm, s) for y, s in zip(ys, out_shapes)]


@lowering("ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum")
def _reduce(ins, attrs, out_shapes, op_name):
    t = _tf()
    x = ins[0]
    xt = logical(x)
    if not xt.dtype.is_floating:
        raise NotLowered("integer reduction")
    xt = f32(xt)
    axes = attrs.get("axes")
    axes = None if axes is None or len(axes) == 0 else [int(a) for a in axes]
    keep = attrs.get("keepdims", True)
    fn = {"ReduceMean": t.reduce_mean, "ReduceMax": t.reduce_max, "ReduceMin": t.reduce_min,
          "ReduceSum": t.reduce_sum}[op_name]
    return [Val(fn(xt, axis=axes, keepdims=True if keep is None else bool(keep)), None,
                out_shapes[0])]


@lowering("Resize")
def _resize(ins, attrs, out_shapes):
    from tftpu.interp.kernels.resize import nearest_index, source_coords

    t = _tf()
    x = ins[0]
    mode = attrs.get("mode") or "nearest"
    coord_mode = attrs.get("coord_mode") or "half_pixel"
    nearest_mode = attrs.get("nearest_mode") or "round_prefer_floor"
    r = len(x.shape)
    axes = list(range(1, r - 1)) if _nhwc_attr(attrs) else list(range(2, r))
    target = [int(v) for v in attrs["target_shape"]]
    if len(target) != len(axes) or mode not in ("nearest", "linear"):
        raise NotLowered("bad target/mode")
    y = x.t
    phys = (lambda a: a) if x.perm is None else x.perm.index
    if mode == "linear":
        if not y.dtype.is_floating:
            raise NotLowered("integer linear resize")
        y = f32(y)
    for ax, n in zip(axes, target):
        in_len = x.shape[ax]
        c = source_coords(n, in_len, coord_mode)
        if mode == "nearest":
            if n != in_len:
                y = t.gather(y, nearest_index(c, in_len, nearest_mode), axis=phys(ax))
            continue
        c = np.clip(c, np.float32(0), np.float32(in_len - 1))
        i0 = np.minimum(c.astype(np.int64), in_len - 1)
        i1 = np.minimum(i0 + 1, in_len - 1)
        w1 = np.abs(c - i0.astype(np.float32))
        w0 = np.abs(c - i1.astype(np.float32))
        same = i0 == i1
        w0[same], w1[same] = np.float32(0.5), np.float32(0.5)
        shape = [1] * r
        shape[phys(ax)] = n
        y = t.gather(y, i0, axis=phys(ax)) * const(w0.reshape(shape)) + \
            t.gather(y, i1, axis=phys(ax)) * const(w1.reshape(shape))
    return [Val(y, x.perm, out_shapes[0])]


@lowering("DepthToSpace", "SpaceToDepth")
def _block(ins, attrs, out_shapes, op_name):
    t = _tf()
    x = ins[0]
    b = int(attrs["block_size"])
    mode = (attrs.get("mode") or "DCR").upper()
    if mode not in ("DCR", "CRD"):
        raise NotLowered(mode)
    nhwc = _nhwc_attr(attrs)
    xt = transposed(x, NHWC) if not nhwc else logical(x)
    n, h, w, c = (int(v) for v in xt.shape)
    if op_name == "DepthToSpace":
        if mode == "DCR":
            y = t.transpose(t.reshape(xt, [n, h, w, b, b, c // (b * b)]), [0, 1, 3, 2, 4, 5])
        else:
            y = t.transpose(t.reshape(xt, [n, h, w, c // (b * b), b, b]), [0, 1, 4, 2, 5, 3])
        y = t.reshape(y, [n, h * b, w * b, c // (b * b)])
    else:
        y = t.reshape(xt, [n, h // b, b, w // b, b, c])
        y = t.transpose(y, [0, 1, 3, 2, 4, 5] if mode == "DCR" else [0, 1, 3, 5, 2, 4])
        y = t.reshape(y, [n, h // b, w // b, c * b * b])
    return [Val(y, None if nhwc else NHWC, out_shapes[0])]


_CAST = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "i8": "int8", "u8": "uint8",
         "i32": "int32", "i64": "int64", "f64": "float64", "bool": "bool"}


@lowering("Cast")
def _cast(ins, attrs, out_shapes):
    t = _tf()
    x = ins[0]
    to = attrs["to"]
    if to not in _CAST:
        raise NotLowered(to)
    dt = getattr(t, _CAST[to])
    src = x.t
    if (src.dtype.is_floating and not dt.is_floating) or dt == t.bool or src.dtype == t.bool:
        raise NotLowered("float -> int casts keep numpy's out-of-range behaviour")
    return [Val(t.cast(src, dt), x.perm, out_shapes[0])]


@lowering("Gather")
def _gather(ins, attrs, out_shapes):
    t = _tf()
    x, idx = ins
    r = max(len(x.shape), 1)
    axis = int(attrs.get("axis", 0)) % r
    if idx.np is None:
        raise NotLowered("dynamic indices")
    i = np.asarray(idx.np)
    i = np.where(i < 0, i + x.shape[axis], i).astype(np.int64)
    return [Val(t.gather(logical(x), i, axis=axis), None, out_shapes[0])]
