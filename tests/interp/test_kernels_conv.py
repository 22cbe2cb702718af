"""Conv and Deconv kernels against onnxruntime's Conv / ConvTranspose, swept over geometry."""

import itertools

import numpy as np
import pytest

from tftpu.interp.kernels import KERNELS
from tftpu.ir.top import FLOPS
from tests.interp.onnx_ref import assert_close, run_node

RNG = np.random.default_rng(0)


def _rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _to_nhwc(x):
    return np.moveaxis(x, 1, -1)


def _conv_case(nsp, c, o, k, s, pads, d, g, bias, size):
    x = _rand(2, c, *size)
    w = _rand(o, c // g, *k)
    b = _rand(o) if bias else None
    attrs = dict(kernel_shape=list(k), strides=list(s), pads=list(pads), dilations=list(d),
                 group=g)
    want = run_node("Conv", [x, w, b], attrs)[0]
    got = KERNELS["top.Conv"]([x, w, b], dict(attrs, do_relu=False, relu_limit=-1.0))[0]
    what = f"Conv {attrs} x{x.shape}"
    assert_close(got, want, rtol=1e-4, atol=2e-5, what=what)
    # NHWC data with OIHW and with HWIO weights gives the NCHW result transposed
    got_nhwc = KERNELS["top.Conv"]([_to_nhwc(x), w, b], dict(attrs, layout="NHWC"))[0]
    assert_close(got_nhwc, _to_nhwc(want), rtol=1e-4, atol=2e-5, what="NHWC " + what)
    w_hwio = np.moveaxis(np.moveaxis(w, 0, -1), 0, -2)
    got_hwio = KERNELS["top.Conv"]([_to_nhwc(x), w_hwio, b],
                               dict(attrs, layout="NHWC", kernel_layout="HWIO"))[0]
    assert_close(got_hwio, _to_nhwc(want), rtol=1e-4, atol=2e-5, what="HWIO " + what)
    flops = FLOPS["top.Conv"]([x.shape, w.shape] + ([b.shape] if bias else [None]), [want.shape],
                          attrs)
    assert flops == want.size * (2 * w[0].size + (1 if bias else 0))


GROUPS_2D = [(4, 6, 1), (4, 6, 2), (6, 6, 6), (4, 8, 4), (3, 3, 3)]   # (c, o, group)


@pytest.mark.parametrize("k,s,d", list(itertools.product(
    [(1, 1), (3, 3), (2, 3), (5, 5)], [(1, 1), (2, 2), (1, 2)], [(1, 1), (2, 2), (2, 1)])))
@pytest.mark.parametrize("cog", GROUPS_2D)
def test_conv2d_sweep(k, s, d, cog):
    c, o, g = cog
    for pads, bias in (((0, 0, 0, 0), True), ((1, 1, 1, 1), False), ((0, 1, 2, 0), True)):
        if max(pads) >= max(k) * max(d) + 1:
            continue
        _conv_case(2, c, o, k, s, pads, d, g, bias, (9, 10))


@pytest.mark.parametrize("k,s,d,pads", [
    (1, 1, 1, (0, 0)), (3, 1, 1, (1, 1)), (3, 2, 1, (0, 2)), (4, 3, 2, (2, 1)), (5, 1, 3, (2, 2))])
@pytest.mark.parametrize("cog", [(4, 6, 1), (4, 4, 2), (4, 8, 4)])
def test_conv1d_sweep(k, s, d, pads, cog):
    c, o, g = cog
    _conv_case(1, c, o, (k,), (s,), pads, (d,), g, True, (13,))


@pytest.mark.parametrize("k,s,d,pads,cog", [
    ((3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1, 1, 1, 1), (3, 4, 1)),
    ((2, 3, 1), (2, 1, 2), (1, 2, 1), (0, 1, 0, 1, 2, 0), (3, 5, 1)),
    ((3, 3, 3), (2, 2, 2), (2, 1, 1), (1, 0, 1, 0, 1, 0), (4, 4, 2)),
    ((3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1, 1, 1, 1), (4, 4, 4)),
])
def test_conv3d(k, s, d, pads, cog):
    c, o, g = cog
    _conv_case(3, c, o, k, s, pads, d, g, True, (6, 7, 5))


@pytest.mark.parametrize("limit", [-1.0, 0.5, 6.0])
def test_conv_fused_relu(limit):
    x, w, b = _rand(1, 3, 8, 8), _rand(5, 3, 3, 3), _rand(5)
    attrs = dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    want = run_node("Conv", [x, w, b], attrs)[0]
    want = np.maximum(want, 0) if limit < 0 else np.clip(want, 0, limit)
    got = KERNELS["top.Conv"]([x, w, b], dict(attrs, do_relu=True, relu_limit=limit))[0]
    assert_close(got, want, rtol=1e-4, atol=2e-5)
    assert got.min() >= 0 and (limit < 0 or got.max() <= limit)


def test_conv_weight_cache_sees_in_place_edits():
    x = _rand(1, 2, 5, 5)
    w, b = _rand(3, 2, 3, 3), _rand(3)
    attrs = dict(kernel_shape=[3, 3])
    KERNELS["top.Conv"]([x, w, b], attrs)
    w *= 2.0
    b += 1.0
    assert_close(KERNELS["top.Conv"]([x, w, b], attrs)[0], run_node("Conv", [x, w, b], attrs)[0],
                 rtol=1e-4, atol=2e-5)


def test_conv_weight_cache_follows_identity():
    x = _rand(1, 2, 5, 5)
    w1, w2 = _rand(3, 2, 3, 3), _rand(3, 2, 3, 3)
    attrs = dict(kernel_shape=[3, 3])
    y1 = KERNELS["top.Conv"]([x, w1, None], attrs)[0]
    y2 = KERNELS["top.Conv"]([x, w2, None], attrs)[0]
    assert not np.allclose(y1, y2)
    assert_close(y2, run_node("Conv", [x, w2], attrs)[0], rtol=1e-4, atol=2e-5)


# ----------------------------------------------------------------------------- Deconv

def _deconv_case(c, o, k, s, pads, d, g, op, bias, size):
    x = _rand(2, c, *size)
    w = _rand(c, o // g, *k)
    b = _rand(o) if bias else None
    attrs = dict(kernel_shape=list(k), strides=list(s), pads=list(pads), dilations=list(d),
                 group=g, output_padding=list(op))
    want = run_node("ConvTranspose", [x, w, b], attrs)[0]
    what = f"Deconv {attrs} x{x.shape}"
    got = KERNELS["top.Deconv"]([x, w, b], attrs)[0]
    assert_close(got, want, rtol=1e-4, atol=2e-5, what=what)
    got_nhwc = KERNELS["top.Deconv"]([_to_nhwc(x), w, b], dict(attrs, layout="NHWC"))[0]
    assert_close(got_nhwc, _to_nhwc(want), rtol=1e-4, atol=2e-5, what="NHWC " + what)
    assert FLOPS["top.Deconv"]([x.shape, w.shape, b.shape if bias else None], [want.shape],
                           attrs) > 0


@pytest.mark.parametrize("k,s,d", list(itertools.product(
    [(1, 1), (3, 3), (2, 4)], [(1, 1), (2, 2), (3, 2)], [(1, 1), (2, 1)])))
@pytest.mark.parametrize("cog", [(4, 6, 1), (4, 6, 2), (4, 4, 4)])
def test_deconv2d_sweep(k, s, d, cog):
    c, o, g = cog
    for pads, op in (((0, 0, 0, 0), (0, 0)), ((1, 0, 0, 1), (1, 0)), ((1, 1, 2, 1), (0, 1))):
        if any(p >= si or p >= di * (ki - 1) + 1 for p, si, di, ki in zip(op, s, d, k)):
            op = (0, 0)
        if max(pads) >= min(k) * min(d):
            pads = (0, 0, 0, 0)
        _deconv_case(c, o, k, s, pads, d, g, op, bool(sum(pads) % 2), (5, 6))


@pytest.mark.parametrize("k,s,d,pads,op,cog", [
    ((3,), (2,), (1,), (1, 0), (1,), (3, 4, 1)),
    ((4,), (1,), (2,), (0, 2), (0,), (4, 4, 2)),
    ((2, 3, 2), (2, 1, 2), (1, 1, 1), (0, 1, 0, 0, 1, 1), (1, 0, 0), (3, 4, 1)),
    ((3, 3, 3), (1, 2, 1), (1, 1, 2), (1, 0, 0, 1, 0, 0), (0, 1, 0), (4, 6, 2)),
])
def test_deconv_1d_3d(k, s, d, pads, op, cog):
    c, o, g = cog
    _deconv_case(c, o, k, s, pads, d, g, op, True, (5, 4, 6)[:len(k)])


def _random_geometry(rng, nsp, deconv=False):
    k = [int(v) for v in rng.integers(1, 5, nsp)]
    s = [int(v) for v in rng.integers(1, 4, nsp)]
    d = [int(v) for v in rng.integers(1, 3, nsp)]
    span = [di * (ki - 1) + 1 for di, ki in zip(d, k)]
    pads = [int(rng.integers(0, sp)) for sp in span] + [int(rng.integers(0, sp)) for sp in span]
    size = [int(v) for v in rng.integers(1, 9, nsp)]
    size = [max(sz, sp - pads[i] - pads[i + nsp] + 1) for i, (sz, sp) in enumerate(zip(size, span))]
    g = int(rng.choice([1, 2, 3]))
    c = g * int(rng.integers(1, 4))
    o = g * int(rng.integers(1, 4))
    op = [int(rng.integers(0, si)) if deconv else 0 for si in s]   # ORT: output_padding < stride
    return k, s, d, pads, size, g, c, o, op


@pytest.mark.parametrize("seed", range(4))
def test_conv_random_fuzz(seed):
    """Random 1-D/2-D/3-D geometries (kernel, stride, dilation, asymmetric pads, groups)."""
    rng = np.random.default_rng(100 + seed)
    for _ in range(25):
        nsp = int(rng.integers(1, 4))
        k, s, d, pads, size, g, c, o, _ = _random_geometry(rng, nsp)
        _conv_case(nsp, c, o, k, s, pads, d, g, bool(rng.integers(0, 2)), size)


@pytest.mark.parametrize("seed", range(4))
def test_deconv_random_fuzz(seed):
    rng = np.random.default_rng(200 + seed)
    for _ in range(20):
        nsp = int(rng.integers(1, 4))
        k, s, d, pads, size, g, c, o, op = _random_geometry(rng, nsp, deconv=True)
        span = [dd * (kk - 1) + 1 for kk, dd in zip(k, d)]
        pb = [min(pads[i], span[i] - 1) for i in range(nsp)]
        pads = pb + [min(pads[nsp + i], span[i] - 1 - pb[i]) for i in range(nsp)]
        _deconv_case(c, o, k, s, pads, d, g, op, bool(rng.integers(0, 2)), size)


@pytest.mark.parametrize("op,make", [
    ("Conv", lambda: ([_rand(1, 16, 28, 28), _rand(32, 16, 3, 3), _rand(32)],
                      dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], do_relu=True))),
    ("Conv", lambda: ([_rand(1, 32, 14, 14), _rand(32, 1, 3, 3), None],
                      dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=32))),
    ("Conv", lambda: ([_rand(1, 64, 14, 14), _rand(128, 64, 1, 1), _rand(128)], {})),
    ("Deconv", lambda: ([_rand(1, 8, 7, 7), _rand(8, 4, 4, 4), _rand(4)],
                        dict(kernel_shape=[4, 4], strides=[2, 2], pads=[1, 1, 1, 1]))),
    ("MatMul", lambda: ([_rand(3, 512), _rand(512, 100), _rand(100)], {})),
])
def test_deterministic(op, make):
    """Same inputs, byte-identical results, run after run."""
    operands, attrs = make()
    first = KERNELS[f"top.{op}"](operands, attrs)[0].tobytes()
    for _ in range(3):
        assert KERNELS[f"top.{op}"](operands, attrs)[0].tobytes() == first
