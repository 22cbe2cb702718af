"""top.Conv and top.Deconv (ONNX Conv / ConvTranspose semantics), 1-D/2-D/3-D.

Float kernels run TensorFlow's optimized convolutions (oneDNN on CPU) on NCHW or NHWC data as
given, with weights re-laid-out once per weight array; a numpy path covers what TF lacks.
"""

from __future__ import annotations

import numpy as np

from tftpu import geometry
from tftpu.interp.kernels._registry import (
    WEIGHTS, as_f32, channels_last, ints, per_channel, post_relu, register, relu,
    relu_limit, tf, tf_epilogue, bias_const, to_numpy, nchw_supported)


def _geometry(x, w_spatial, attrs):
    nsp = x.ndim - 2
    k = ints(attrs, "kernel_shape", nsp, 0)
    if not any(k):
        k = list(w_spatial)
    return (nsp, k, ints(attrs, "strides", nsp, 1), ints(attrs, "pads", 2 * nsp, 0),
            ints(attrs, "dilations", nsp, 1), int(attrs.get("group", 1) or 1))


def _weight_oik(w, attrs):
    """The conv weight as [O, I/g, *k] whatever its `kernel_layout`."""
    kl = attrs["kernel_layout"]
    if kl in ("HWIO", "DHWIO", "WIO"):
        return WEIGHTS.get(w, ("oik",), lambda: np.ascontiguousarray(
            as_f32(w).transpose([w.ndim - 1, w.ndim - 2] + list(range(w.ndim - 2)))))
    if kl not in ("OIHW", "OIDHW", "OIW"):
        raise ValueError(f"kernel_layout must be OIHW or HWIO, not {kl!r}")
    return as_f32(w)


# ----------------------------------------------------------------------------- Conv

def _conv_numpy(x, w, strides, pads, dil, group):
    """Reference N-D grouped conv, NC* layout, weight [O, I/g, *k]: one einsum per tap."""
    nsp = x.ndim - 2
    k = w.shape[2:]
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + nsp]) for i in range(nsp)])
    out = [geometry.conv_out(x.shape[2 + i], k[i], strides[i], dil[i], pads[i], pads[i + nsp])
           for i in range(nsp)]
    n, c = x.shape[:2]
    o = w.shape[0]
    cg, og = c // group, o // group
    y = np.zeros((n, group, og, *out), np.float32)
    for off in np.ndindex(*k):
        sl = tuple(slice(off[i] * dil[i], off[i] * dil[i] + strides[i] * (out[i] - 1) + 1,
                         strides[i]) for i in range(nsp))
        patch = xp[(slice(None), slice(None)) + sl].reshape(n, group, cg, *out)
        wk = w[(slice(None), slice(None)) + off].reshape(group, og, cg)
        y += np.einsum("ngc...,goc->ngo...", patch, wk, optimize=True)
    return y.reshape(n, o, *out)


def _conv_tf_2d(x, w, b, strides, pads, dil, group, nhwc, fused_relu):
    """2-D conv (+ bias + relu) through TF's raw Conv2D / DepthwiseConv2dNative / MatMul ops
    on the data's own layout (the tf.nn wrappers cost more than the op on small tensors)."""
    t = tf()
    raw = t.raw_ops
    n = x.shape[0]
    c = x.shape[3 if nhwc else 1]
    o = w.shape[0]
    kh, kw = w.shape[2:]
    if group == 1 and not nhwc and (kh, kw) == (1, 1) and not any(pads) and strides == [1, 1] \
            and n == 1:
        # 1x1 conv on NCHW data: one [O, C] x [C, H*W] matmul, no transposes
        h, wd = x.shape[2:]
        w2 = WEIGHTS.get(w, ("pointwise",), lambda: t.constant(w.reshape(o, c)))
        y = raw.MatMul(a=w2, b=x.reshape(c, h * wd))
        bias = None if b is None else bias_const(b, (o, 1))
        return tf_epilogue(y, bias, fused_relu).reshape(1, o, h, wd)
    if group == 1 and nhwc and (kh, kw) == (1, 1) and not any(pads) and strides == [1, 1]:
        # 1x1 conv on NHWC data: one [N*H*W, C] x [C, O] matmul
        lead = x.shape[:3]
        w2 = WEIGHTS.get(w, ("pointwise_t",), lambda: t.constant(w.reshape(o, c).T))
        y = raw.MatMul(a=x.reshape(-1, c), b=w2)
        bias = None if b is None else bias_const(b, (o,))
        return tf_epilogue(y, bias, fused_relu).reshape(*lead, o)
    if not nhwc and not nchw_supported():
        y = _conv_tf_2d(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), w, b, strides, pads, dil,
                        group, True, fused_relu)
        return np.ascontiguousarray(y.transpose(0, 3, 1, 2))
    fmt = "NHWC" if nhwc else "NCHW"
    sp = [pads[0], pads[2], pads[1], pads[3]]
    explicit = [0, 0] + sp + [0, 0] if nhwc else [0, 0, 0, 0] + sp
    st = [1, strides[0], strides[1], 1] if nhwc else [1, 1, strides[0], strides[1]]
    dl = [1, dil[0], dil[1], 1] if nhwc else [1, 1, dil[0], dil[1]]
    depthwise = group == c and group > 1 and o % c == 0 and w.shape[1] == 1
    if depthwise and (strides == [1, 1] or dil == [1, 1]):
        m = o // c
        f = WEIGHTS.get(w, ("dw",), lambda: t.constant(
            w.reshape(c, m, kh, kw).transpose(2, 3, 0, 1)))
        y = raw.DepthwiseConv2dNative(input=x, filter=f, strides=st, padding="EXPLICIT",
                                      explicit_paddings=explicit, data_format=fmt, dilations=dl)
    else:
        f = WEIGHTS.get(w, ("hwio",), lambda: t.constant(w.transpose(2, 3, 1, 0)))
        y = raw.Conv2D(input=x, filter=f, strides=st, padding="EXPLICIT",
                       explicit_paddings=explicit, data_format=fmt, dilations=dl)
    bias = None if b is None else bias_const(b, (o,) if nhwc else (o, 1, 1))
    return tf_epilogue(y, bias, fused_relu)


def _conv_tf_3d(x, w, strides, pads, dil, nhwc):
    t = tf()
    if not nhwc:
        x = x.transpose(0, 2, 3, 4, 1)
    f = WEIGHTS.get(w, ("dhwio",), lambda: t.constant(w.transpose(2, 3, 4, 1, 0)))
    xp = np.pad(x, [(0, 0)] + [(pads[i], pads[i + 3]) for i in range(3)] + [(0, 0)])
    y = to_numpy(t.nn.conv3d(xp, f, [1, *strides, 1], "VALID", dilations=[1, *dil, 1]))
    return y if nhwc else y.transpose(0, 4, 1, 2, 3)


def _TF_LIMITS():
    errors = tf().errors
    return (errors.UnimplementedError, errors.InvalidArgumentError)


def conv_forward(x, w, b, strides, pads, dil, group, nhwc, fused_relu=None):
    """Conv + bias (or None) + relu (`fused_relu`: None, <0 plain, else the limit):
    x in NC* (or N*C when nhwc), w as [O, I/g, *k]."""
    nsp = x.ndim - 2
    if nsp == 1:
        x2 = x[:, None] if nhwc else x[:, :, None]
        y = conv_forward(x2, w[:, :, None], b, [1, strides[0]], [0, pads[0], 0, pads[1]],
                         [1, dil[0]], group, nhwc, fused_relu)
        return y[:, 0] if nhwc else y[:, :, 0]
    y = None
    if nsp == 2:
        try:
            return _conv_tf_2d(x, w, b, strides, pads, dil, group, nhwc, fused_relu)
        except _TF_LIMITS():  # a geometry this TF build's CPU kernels do not take
            pass
    elif nsp == 3 and group == 1:
        try:
            y = _conv_tf_3d(x, w, strides, pads, dil, nhwc)
        except _TF_LIMITS():
            pass
    if y is None:
        if nhwc:
            x = np.moveaxis(x, -1, 1)
        y = _conv_numpy(x, w, strides, pads, dil, group)
        y = np.moveaxis(y, 1, -1) if nhwc else y
    if b is not None:
        y = y + per_channel(as_f32(b), y.ndim, y.ndim - 1 if nhwc else 1)
    return y if fused_relu is None else relu(y, fused_relu)


@register("top.Conv")
def conv(operands, attrs):
    """top.Conv: ONNX Conv (+ bias, + fused relu) on NCHW or NHWC data."""
    x, w = as_f32(operands[0]), _weight_oik(operands[1], attrs)
    b = operands[2] if len(operands) > 2 else None
    nhwc = channels_last(attrs)
    _, _, strides, pads, dil, group = _geometry(x, w.shape[2:], attrs)
    fused = relu_limit(attrs) if attrs.get("do_relu", False) else None
    return [conv_forward(x, w, b, strides, pads, dil, group, nhwc, fused)]


# ----------------------------------------------------------------------------- Deconv

def _deconv_numpy(x, w, strides, dil, group):
    """Full (unpadded) N-D transposed conv, NC* layout, weight [I, O/g, *k]: scatter per tap."""
    nsp = x.ndim - 2
    k = w.shape[2:]
    n, c = x.shape[:2]
    og = w.shape[1]
    cg = c // group
    ins = x.shape[2:]
    full = [geometry.deconv_out(ins[i], k[i], strides[i], dil[i]) for i in range(nsp)]
    y = np.zeros((n, group, og, *full), np.float32)
    xg = x.reshape(n, group, cg, *ins)
    wg = w.reshape(group, cg, og, *k)
    for off in np.ndindex(*k):
        sl = tuple(slice(off[i] * dil[i], off[i] * dil[i] + strides[i] * (ins[i] - 1) + 1,
                         strides[i]) for i in range(nsp))
        wk = wg[(slice(None), slice(None), slice(None)) + off]
        y[(slice(None), slice(None), slice(None)) + sl] += np.einsum(
            "ngc...,gco->ngo...", xg, wk, optimize=True)
    return y.reshape(n, group * og, *full)


def _dilate_kernel(w, dil):
    """Insert zeros between kernel taps: a dilated kernel as a plain one."""
    if all(d == 1 for d in dil):
        return w
    k = w.shape[2:]
    dk = [geometry.span(kk, d) for d, kk in zip(dil, k)]
    out = np.zeros(w.shape[:2] + tuple(dk), w.dtype)
    out[(slice(None), slice(None)) + tuple(slice(None, None, d) for d in dil)] = w
    return out


def _deconv_tf_2d(x, w, strides, dil):
    """Full transposed 2-D conv, group 1, NCHW in and out, through tf.nn.conv2d_transpose."""
    t = tf()
    f = WEIGHTS.get(w, ("deconv", tuple(dil)), lambda: t.constant(
        _dilate_kernel(w, dil).transpose(2, 3, 1, 0)))
    kh, kw = int(f.shape[0]), int(f.shape[1])
    n, _, h, wd = x.shape
    o = w.shape[1]
    shape = [n, o, geometry.deconv_out(h, kh, strides[0]), geometry.deconv_out(wd, kw, strides[1])]
    return to_numpy(t.nn.conv2d_transpose(x, f, shape, [1, 1, *strides], "VALID",
                                          data_format="NCHW"))


def deconv_forward(x, w, strides, pads, dil, group, output_padding):
    """ConvTranspose without bias, NC* layout, weight [I, O/g, *k]."""
    nsp = x.ndim - 2
    full = None
    try:
        if nsp == 2 and group == 1:
            full = _deconv_tf_2d(x, w, strides, dil)
        elif nsp == 1 and group == 1:
            full = _deconv_tf_2d(x[:, :, None], w[:, :, None], [1, strides[0]],
                                 [1, dil[0]])[:, :, 0]
    except _TF_LIMITS():
        full = None
    if full is None:
        full = _deconv_numpy(x, w, strides, dil, group)
    extra = [(0, 0), (0, 0)] + [(0, max(0, output_padding[i] - pads[nsp + i]))
                                for i in range(nsp)]
    if any(e[1] for e in extra):
        full = np.pad(full, extra)
    sl = tuple(slice(pads[i], full.shape[2 + i] - max(0, pads[nsp + i] - output_padding[i]))
               for i in range(nsp))
    return full[(slice(None), slice(None)) + sl]


@register("top.Deconv")
def deconv(operands, attrs):
    """top.Deconv: ONNX ConvTranspose (+ bias, + fused relu); output_padding at the end."""
    x, w = as_f32(operands[0]), as_f32(operands[1])
    b = operands[2] if len(operands) > 2 else None
    nhwc = channels_last(attrs)
    if nhwc:
        x = np.moveaxis(x, -1, 1)
    nsp, _, strides, pads, dil, group = _geometry(x, w.shape[2:], attrs)
    y = deconv_forward(x, w, strides, pads, dil, group, ints(attrs, "output_padding", nsp, 0))
    if b is not None:
        y = y + per_channel(as_f32(b), y.ndim, 1)
    if nhwc:
        y = np.moveaxis(y, 1, -1)
    return [post_relu(y, attrs)]
