"""Pooling kernels against onnxruntime's MaxPool / AveragePool / Global*Pool."""

import itertools

import numpy as np
import pytest

from tftpu.interp.kernels import KERNELS
from tftpu.ir.top import FLOPS
from tests.interp.onnx_ref import assert_close, run_node

RNG = np.random.default_rng(1)


def _check(kind, x, attrs):
    onnx_op = {"MaxPool": "MaxPool", "AvgPool": "AveragePool"}[kind]
    oattrs = {k: (int(v) if isinstance(v, bool) else v) for k, v in attrs.items()}
    want = run_node(onnx_op, [x], oattrs)[0]
    what = f"{kind} {attrs} x{x.shape}"
    got = KERNELS[f"top.{kind}"]([x], attrs)[0]
    assert_close(got, want, rtol=1e-5, atol=1e-6, what=what)
    got_nhwc = KERNELS[f"top.{kind}"]([np.moveaxis(x, 1, -1)], dict(attrs, layout="NHWC"))[0]
    assert_close(got_nhwc, np.moveaxis(want, 1, -1), rtol=1e-5, atol=1e-6, what="NHWC " + what)
    assert FLOPS[f"top.{kind}"]([x.shape], [want.shape], attrs) == want.size * int(
        np.prod(attrs["kernel_shape"]))


@pytest.mark.parametrize("kind", ["MaxPool", "AvgPool"])
@pytest.mark.parametrize("k,s", list(itertools.product([(1, 1), (2, 2), (3, 3), (2, 3)],
                                                      [(1, 1), (2, 2), (3, 1)])))
@pytest.mark.parametrize("size", [(7, 7), (8, 9)])
def test_pool2d_sweep(kind, k, s, size):
    x = RNG.standard_normal((2, 3, *size)).astype(np.float32)
    for pads in ((0, 0, 0, 0), (1, 1, 1, 1), (0, 1, 1, 0)):
        if max(pads) >= min(k):
            continue
        for ceil_mode in (False, True):
            for cip in ((False, True) if kind == "AvgPool" else (False,)):
                attrs = dict(kernel_shape=list(k), strides=list(s), pads=list(pads),
                             ceil_mode=ceil_mode)
                if kind == "AvgPool":
                    attrs["count_include_pad"] = cip
                _check(kind, x, attrs)


@pytest.mark.parametrize("kind", ["MaxPool", "AvgPool"])
@pytest.mark.parametrize("k,s,pads,ceil_mode,cip", [
    ((3,), (2,), (1, 1), True, True), ((2,), (1,), (0, 1), False, False),
    ((4,), (3,), (1, 2), True, False), ((3,), (3,), (0, 0), True, True),
    ((2, 2, 2), (2, 2, 2), (0, 0, 0, 0, 0, 0), False, False),
    ((3, 2, 3), (2, 1, 2), (1, 0, 1, 1, 1, 0), True, True),
    ((3, 3, 3), (2, 2, 2), (1, 1, 1, 1, 1, 1), True, False),
])
def test_pool_1d_3d(kind, k, s, pads, ceil_mode, cip):
    x = RNG.standard_normal((2, 3) + (9, 8, 7)[:len(k)]).astype(np.float32)
    attrs = dict(kernel_shape=list(k), strides=list(s), pads=list(pads), ceil_mode=ceil_mode)
    if kind == "AvgPool":
        attrs["count_include_pad"] = cip
    _check(kind, x, attrs)


@pytest.mark.parametrize("d", [(2, 2), (1, 3)])
def test_maxpool_dilated(d):
    x = RNG.standard_normal((1, 2, 10, 11)).astype(np.float32)
    _check("MaxPool", x, dict(kernel_shape=[3, 2], strides=[1, 2], pads=[1, 0, 1, 1],
                              dilations=list(d), ceil_mode=False))


@pytest.mark.parametrize("limit", [-1.0, 0.3])
def test_pool_fused_relu(limit):
    x = RNG.standard_normal((1, 2, 6, 6)).astype(np.float32)
    attrs = dict(kernel_shape=[2, 2], strides=[2, 2])
    for kind, onnx_op in (("MaxPool", "MaxPool"), ("AvgPool", "AveragePool")):
        want = run_node(onnx_op, [x], attrs)[0]
        want = np.maximum(want, 0) if limit < 0 else np.clip(want, 0, limit)
        got = KERNELS[f"top.{kind}"]([x], dict(attrs, do_relu=True, relu_limit=limit))[0]
        assert_close(got, want)


@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 4, 7, 6), (2, 2, 3, 4, 5)])
@pytest.mark.parametrize("kind,onnx_op", [("GlobalAvgPool", "GlobalAveragePool"),
                                          ("GlobalMaxPool", "GlobalMaxPool")])
def test_global_pool(shape, kind, onnx_op):
    x = RNG.standard_normal(shape).astype(np.float32)
    want = run_node(onnx_op, [x])[0]
    assert_close(KERNELS[f"top.{kind}"]([x], {})[0], want)
    assert_close(KERNELS[f"top.{kind}"]([x], {"keepdims": False})[0], want.reshape(shape[:2]))
    got = KERNELS[f"top.{kind}"]([np.moveaxis(x, 1, -1)], {"layout": "NHWC"})[0]
    assert_close(got, np.moveaxis(want, 1, -1))
    assert FLOPS[f"top.{kind}"]([shape], [want.shape], {}) == x.size


@pytest.mark.parametrize("seed", range(4))
def test_pool_random_fuzz(seed):
    """Random 1-D/2-D/3-D pools: kernel, stride, asymmetric pads, ceil_mode, count_include_pad."""
    rng = np.random.default_rng(300 + seed)
    for _ in range(25):
        nsp = int(rng.integers(1, 4))
        k = [int(v) for v in rng.integers(1, 5, nsp)]
        s = [int(v) for v in rng.integers(1, 4, nsp)]
        pads = [int(rng.integers(0, kk)) for kk in k] + [int(rng.integers(0, kk)) for kk in k]
        size = [int(rng.integers(kk, kk + 7)) for kk in k]
        x = rng.standard_normal((1, 2, *size)).astype(np.float32)
        attrs = dict(kernel_shape=k, strides=s, pads=pads, ceil_mode=bool(rng.integers(0, 2)))
        if rng.integers(0, 2):
            _check("MaxPool", x, attrs)
        else:
            _check("AvgPool", x, dict(attrs, count_include_pad=bool(rng.integers(0, 2))))
