"""Kernels on real material: the mtcnn R-Net / O-Net layers with their trained weights on real
photo crops, and Resize on a real photo, each step against onnxruntime."""

import numpy as np
import pytest

from tftpu.interp.kernels import KERNELS
from tftpu.interp.similarity import compare_arrays
from tests import material
from tests.interp.onnx_ref import assert_close, run_node


def _crops(size, n=6):
    """`n` real `size`x`size` crops of the astronaut photo, NCHW float32 in [-1, 1]."""
    img = material.image("skimage/astronaut.png").astype(np.float32)
    out = []
    for i in range(n):
        y, x, s = 30 + 50 * i, 120 + 30 * i, 96 + 16 * i
        crop = img[y:y + s, x:x + s]
        idx = (np.arange(size) * s) // size
        out.append(crop[idx][:, idx])
    return np.stack(out).transpose(0, 3, 1, 2) / 127.5 - 1.0


def _step(kind, onnx_op, x, consts, attrs, onnx_attrs=None, nhwc_consts=None):
    """One layer: TOP kernel (NCHW, and NHWC with HWIO weights) against ORT; returns ORT's."""
    want = run_node(onnx_op, [x] + consts, attrs if onnx_attrs is None else onnx_attrs)[0]
    got = KERNELS[f"top.{kind}"]([x] + consts, attrs)[0]
    assert_close(got, want, rtol=1e-4, atol=2e-5, what=f"{kind} {x.shape}")
    if nhwc_consts is not None and x.ndim == 4:
        nattrs = dict(attrs, layout="NHWC")
        if kind == "Conv":
            nattrs["kernel_layout"] = "HWIO"
        got_nhwc = KERNELS[f"top.{kind}"]([np.moveaxis(x, 1, -1)] + nhwc_consts, nattrs)[0]
        assert_close(got_nhwc, np.moveaxis(want, 1, -1), rtol=1e-4, atol=2e-5,
                     what=f"NHWC {kind} {x.shape}")
    return want


def _conv_prelu_pool(x, w_hwio, b, slope, pool):
    w = np.ascontiguousarray(w_hwio.transpose(3, 2, 0, 1))
    k = list(w.shape[2:])
    x = _step("Conv", "Conv", x, [w, b], dict(kernel_shape=k), nhwc_consts=[w_hwio, b])
    s = slope.reshape(-1)
    x = _step("PRelu", "PRelu", x, [s.reshape(-1, 1, 1)], {}, nhwc_consts=[s])
    if pool is not None:
        k, st, ceil = pool
        attrs = dict(kernel_shape=[k, k], strides=[st, st], ceil_mode=ceil)
        x = _step("MaxPool", "MaxPool", x, [], attrs,
                  dict(kernel_shape=[k, k], strides=[st, st], ceil_mode=int(ceil)), [])
    return x


@pytest.mark.parametrize("net,size,pools", [
    ("rnet", 24, [(3, 2, True), (3, 2, False), None]),
    ("onet", 48, [(3, 2, True), (3, 2, False), (2, 2, False), None]),
])
def test_mtcnn_layers_real_weights(net, size, pools):
    ws = material.mtcnn_weights(net)
    x = _crops(size)
    for i, pool in enumerate(pools):
        x = _conv_prelu_pool(x, ws[3 * i], ws[3 * i + 1], ws[3 * i + 2], pool)
    flat = KERNELS["top.Flatten"]([np.ascontiguousarray(np.moveaxis(x, 1, -1))],
                              dict(start_dim=1, end_dim=-1))[0]   # Keras flattens NHWC
    j = 3 * len(pools)
    dense, bias, slope = ws[j], ws[j + 1], ws[j + 2]
    h = _step("MatMul", "Gemm", flat, [dense, bias], {}, {})
    h = _step("PRelu", "PRelu", h, [slope], {})
    logits_w, logits_b = ws[-2], ws[-1]
    logits = _step("MatMul", "Gemm", h, [logits_w, logits_b], {}, {})
    probs = KERNELS["top.Softmax"]([logits], dict(axis=-1))[0]
    want = run_node("Softmax", [logits], dict(axis=-1))[0]
    row = compare_arrays("probs", want, probs, (0.99999, 0.9999))
    assert row.passed, row
    assert np.allclose(probs.sum(-1), 1, atol=1e-5)


@pytest.mark.parametrize("mode,coord,target", [
    ("linear", "half_pixel", (300, 257)), ("linear", "align_corners", (777, 513)),
    ("linear", "pytorch_half_pixel", (123, 1)), ("linear", "asymmetric", (1024, 1024)),
    ("nearest", "half_pixel", (300, 257)), ("nearest", "asymmetric", (1024, 768)),
    ("nearest", "tf_half_pixel_for_nn", (129, 384)), ("nearest", "align_corners", (511, 2))])
def test_resize_real_photo(mode, coord, target):
    img = material.image("skimage/chelsea.png").astype(np.float32)[None].transpose(0, 3, 1, 2)
    sizes = np.array([1, 3, *target], np.int64)
    opset = 13 if coord == "tf_half_pixel_for_nn" else 18
    nearest = "round_prefer_ceil" if coord == "tf_half_pixel_for_nn" else "round_prefer_floor"
    want = run_node("Resize", [img, None, None, sizes],
                    dict(mode=mode, coordinate_transformation_mode=coord, nearest_mode=nearest),
                    opset=opset, initializers={3: sizes})[0]
    got = KERNELS["top.Resize"]([img], dict(mode=mode, coord_mode=coord, nearest_mode=nearest,
                                        target_shape=list(target)))[0]
    assert_close(got, want, rtol=1e-5, atol=1e-6)
