"""Element-wise, activation, MatMul and normalisation kernels against onnxruntime."""

import numpy as np
import pytest

from tftpu.interp.kernels import KERNELS
from tftpu.ir.top import FLOPS
from tests.interp.onnx_ref import assert_close, run_node

RNG = np.random.default_rng(2)
BROADCAST = [((2, 3, 4, 5), (2, 3, 4, 5)), ((2, 3, 4, 5), (1, 3, 1, 1)), ((2, 3, 4, 5), (5,)),
             ((3, 1, 5), (4, 1)), ((), (3, 2)), ((1, 4), (3, 1)), ((2, 1, 3, 1), (1, 4, 1, 6))]


def _rand(shape, positive=False):
    x = RNG.standard_normal(shape).astype(np.float32)
    return np.abs(x) + 0.1 if positive else x


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min"])
@pytest.mark.parametrize("sa,sb", BROADCAST)
def test_binary_broadcast(op, sa, sb):
    a, b = _rand(sa), _rand(sb)
    if op == "Div":
        b = np.where(np.abs(b) < 0.1, 0.5, b).astype(np.float32)
    want = run_node(op, [a, b])[0]
    got = KERNELS[f"top.{op}"]([a, b], {})[0]
    assert_close(got, want, what=f"{op} {sa} {sb}")
    assert got.dtype == np.float32
    assert FLOPS[f"top.{op}"]([sa, sb], [want.shape], {}) == want.size
    if op in ("Add", "Sub", "Mul"):
        for limit in (-1.0, 0.5):
            want_r = np.maximum(want, 0) if limit < 0 else np.clip(want, 0, limit)
            got_r = KERNELS[f"top.{op}"]([a, b], {"do_relu": True, "relu_limit": limit})[0]
            assert_close(got_r, want_r)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min"])
def test_binary_int64_keeps_dtype(op):
    a = np.array([[7, -7, 9], [4, 5, -6]], np.int64)
    b = np.array([2, 3, -4], np.int64)
    want = run_node(op, [a, b])[0]
    got = KERNELS[f"top.{op}"]([a, b], {})[0]
    assert_close(got, want, what=op)


X = np.concatenate([np.linspace(-8, 8, 161, dtype=np.float32),
                    np.array([0, -0.0, 1e-8, -1e-8, 30, -30, 88, -88], np.float32)])
UNARY = [("Sigmoid", "Sigmoid", {}, {}), ("Tanh", "Tanh", {}, {}), ("Exp", "Exp", {}, {}),
         ("Abs", "Abs", {}, {}), ("Neg", "Neg", {}, {}), ("Erf", "Erf", {}, {}),
         ("HardSwish", "HardSwish", {}, {}),
         ("HardSigmoid", "HardSigmoid", {"alpha": 0.2, "beta": 0.5}, None),
         ("HardSigmoid", "HardSigmoid", {"alpha": 1 / 6, "beta": 0.5}, None),
         ("LeakyRelu", "LeakyRelu", {"alpha": 0.1}, None),
         ("LeakyRelu", "LeakyRelu", {"alpha": 0.01}, None),
         ("Relu", "Relu", {}, {}), ("GELU", "Gelu", {"approximate": "none"}, None),
         ("GELU", "Gelu", {"approximate": "tanh"}, None),
         ("Floor", "Floor", {}, {}), ("Ceil", "Ceil", {}, {}), ("Round", "Round", {}, {}), ("Sign", "Sign", {}, {}),
         ("Sin", "Sin", {}, {}), ("Cos", "Cos", {}, {}), ("Softsign", "Softsign", {}, {})]


@pytest.mark.parametrize("op,onnx_op,attrs,onnx_attrs", UNARY)
def test_unary(op, onnx_op, attrs, onnx_attrs):
    x = X.reshape(1, -1)
    opset = 20 if onnx_op == "Gelu" else 18
    want = run_node(onnx_op, [x], attrs if onnx_attrs is None else onnx_attrs, opset=opset)[0]
    got = KERNELS[f"top.{op}"]([x], attrs)[0]
    assert_close(got, want, rtol=2e-6, atol=1e-7, what=op)
    assert got.dtype == np.float32 and got.shape == x.shape
    assert FLOPS[f"top.{op}"]([x.shape], [x.shape], attrs) >= x.size


@pytest.mark.parametrize("op", ["Log", "Sqrt"])
def test_unary_positive(op):
    x = _rand((3, 50), positive=True) * 10
    assert_close(KERNELS[f"top.{op}"]([x], {})[0], run_node(op, [x])[0], rtol=2e-6, atol=1e-7)


def test_silu():
    x = X.reshape(1, -1)
    want = x * run_node("Sigmoid", [x])[0]
    assert_close(KERNELS["top.SiLU"]([x], {})[0], want, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("lo,hi", [(0.0, 6.0), (-1.0, 1.0), (None, 0.5), (-0.5, None)])
def test_clip(lo, hi):
    x = X.reshape(13, 13)
    init = {1: np.float32(lo)} if lo is not None else {}
    if hi is not None:
        init[2] = np.float32(hi)
    want = run_node("Clip", [x, None if lo is None else 0, None if hi is None else 0],
                    initializers=init)[0]
    assert_close(KERNELS["top.Clip"]([x], {"min": lo, "max": hi})[0], want)


@pytest.mark.parametrize("limit", [-1.0, 0.0, 6.0])
def test_relu_limit(limit):
    x = X * 2
    want = np.maximum(x, 0) if limit < 0 else np.clip(x, 0, limit)
    np.testing.assert_array_equal(KERNELS["top.Relu"]([x], {"relu_limit": limit})[0], want)


@pytest.mark.parametrize("xs,ss,layout", [((2, 3, 4, 5), (3, 1, 1), "NCHW"),
                                          ((2, 3, 4, 5), (1,), "NCHW"),
                                          ((2, 3, 4, 5), (5,), "NCHW"),
                                          ((4, 6), (6,), "NCHW")])
def test_prelu(xs, ss, layout):
    x, slope = _rand(xs), _rand(ss)
    want = run_node("PRelu", [x, slope])[0]
    assert_close(KERNELS["top.PRelu"]([x, slope], {})[0], want)


def test_prelu_channel_vector():
    x, slope = _rand((2, 3, 4, 5)), _rand((3,))
    want = run_node("PRelu", [x, slope.reshape(3, 1, 1)])[0]
    assert_close(KERNELS["top.PRelu"]([x, slope], {})[0], want)
    got = KERNELS["top.PRelu"]([np.moveaxis(x, 1, -1), slope], {"layout": "NHWC"})[0]
    assert_close(got, np.moveaxis(want, 1, -1))


@pytest.mark.parametrize("shape,axis", [((2, 10), -1), ((2, 3, 4, 5), 1), ((2, 3, 4), 0),
                                        ((1, 1000), 1), ((3, 4), -2)])
@pytest.mark.parametrize("log", [False, True])
def test_softmax(shape, axis, log):
    x = _rand(shape) * 10
    want = run_node("LogSoftmax" if log else "Softmax", [x], {"axis": axis})[0]
    got = KERNELS["top.Softmax"]([x], {"axis": axis, "log": log})[0]
    assert_close(got, want, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- MatMul

@pytest.mark.parametrize("sa,sb", [((4, 8), (8, 5)), ((1, 2048), (2048, 1000)),
                                   ((2, 3, 4, 8), (8, 6)), ((2, 3, 4, 8), (3, 8, 6)),
                                   ((3, 1, 4, 8), (1, 2, 8, 5)), ((8,), (8, 3)), ((4, 8), (8,))])
def test_matmul_broadcast(sa, sb):
    a, b = _rand(sa), _rand(sb)
    want = run_node("MatMul", [a, b])[0]
    assert_close(KERNELS["top.MatMul"]([a, b, None], {})[0], want, rtol=1e-4, atol=1e-5)
    if len(sb) >= 2:
        bt = np.ascontiguousarray(np.swapaxes(b, -1, -2))
        got = KERNELS["top.MatMul"]([a, bt, None], {"right_transpose": True})[0]
        assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert FLOPS["top.MatMul"]([sa, sb, None], [want.shape], {}) == 2 * want.size * sa[-1]


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("limit", [None, -1.0, 1.0])
def test_matmul_bias_relu_as_gemm(trans_b, limit):
    a, b, c = _rand((5, 7)), _rand((7, 3)), _rand((3,))
    bb = np.ascontiguousarray(b.T) if trans_b else b
    want = run_node("Gemm", [a, bb, c], {"transB": trans_b})[0]
    attrs = {"right_transpose": bool(trans_b)}
    if limit is not None:
        attrs.update(do_relu=True, relu_limit=limit)
        want = np.maximum(want, 0) if limit < 0 else np.clip(want, 0, limit)
    assert_close(KERNELS["top.MatMul"]([a, bb, c], attrs)[0], want, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- norms

@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (2, 3), (2, 3, 7), (1, 3, 2, 3, 4)])
@pytest.mark.parametrize("eps", [1e-5, 1e-3])
def test_batchnorm(shape, eps):
    x = _rand(shape)
    c = shape[1]
    mean, var, scale, bias = _rand((c,)), _rand((c,), True), _rand((c,)), _rand((c,))
    want = run_node("BatchNormalization", [x, scale, bias, mean, var], {"epsilon": eps})[0]
    got = KERNELS["top.BatchNorm"]([x, mean, var, scale, bias], {"epsilon": eps})[0]
    assert_close(got, want, rtol=1e-5, atol=1e-6)
    got = KERNELS["top.BatchNorm"]([np.moveaxis(x, 1, -1), mean, var, scale, bias],
                               {"epsilon": eps, "layout": "NHWC"})[0]
    assert_close(got, np.moveaxis(want, 1, -1), rtol=1e-5, atol=1e-6)
    assert FLOPS["top.BatchNorm"]([shape] + [(c,)] * 4, [shape], {}) == 2 * x.size


@pytest.mark.parametrize("sshape", [(3,), (1, 3, 1, 1)])
@pytest.mark.parametrize("do_relu", [False, True])
def test_scale(sshape, do_relu):
    x, s, b = _rand((2, 3, 4, 5)), _rand(sshape), _rand(sshape)
    want = x * s.reshape(1, 3, 1, 1) + b.reshape(1, 3, 1, 1)
    if do_relu:
        want = np.maximum(want, 0)
    got = KERNELS["top.Scale"]([x, s, b], {"do_relu": do_relu})[0]
    assert_close(got, want)
    got = KERNELS["top.Scale"]([np.moveaxis(x, 1, -1), s, b], {"do_relu": do_relu, "layout": "NHWC"})[0]
    assert_close(got, np.moveaxis(want, 1, -1))
    assert FLOPS["top.Scale"]([x.shape, sshape, sshape], [x.shape], {}) == 2 * x.size


def test_every_spec_op_has_kernel_and_flops():
    spec = ("Conv Deconv MatMul Add Sub Mul Div Max Min Relu Clip LeakyRelu PRelu Sigmoid "
            "HardSwish SiLU Tanh Exp Log Sqrt Erf Abs Neg HardSigmoid GELU Softmax MaxPool "
            "AvgPool GlobalAvgPool GlobalMaxPool BatchNorm Scale Concat Reshape Flatten Permute "
            "Pad Slice Split Squeeze Unsqueeze Resize ReduceMean ReduceMax ReduceMin ReduceSum "
            "SpaceToDepth DepthToSpace Cast Gather Floor Ceil Round Sign Sin Cos Softsign").split()
    for op in spec:
        assert callable(KERNELS[f"top.{op}"]) and callable(FLOPS[f"top.{op}"]), op
    assert {f"top.{op}" for op in spec} <= set(KERNELS) & set(FLOPS)


FLOPS_CASES = [
    ("Conv", [(1, 8, 10, 10), (16, 8, 3, 3), (16,)], [(1, 16, 10, 10)], {},
     1600 * (2 * 72 + 1)),
    ("Conv", [(1, 8, 10, 10), (16, 2, 3, 3), None], [(1, 16, 10, 10)],
     {"group": 4, "do_relu": True}, 1600 * (2 * 18 + 1)),
    ("Conv", [(1, 10, 10, 8), (3, 3, 8, 16), None], [(1, 10, 10, 16)],
     {"layout": "NHWC", "kernel_layout": "HWIO"}, 1600 * 2 * 72),
    ("Deconv", [(1, 4, 5, 5), (4, 6, 3, 3), None], [(1, 6, 11, 11)], {}, 100 * 2 * 54),
    ("MatMul", [(2, 3, 8), (8, 5), (5,)], [(2, 3, 5)], {"do_relu": True}, 30 * 16 + 60),
    ("AvgPool", [(1, 3, 8, 8)], [(1, 3, 4, 4)], {"kernel_shape": [2, 2]}, 48 * 4),
    ("Softmax", [(2, 10)], [(2, 10)], {}, 100),
    ("Reshape", [(2, 10)], [(20,)], {}, 0),
    ("Concat", [(2, 3), (2, 3)], [(2, 6)], {"do_relu": True}, 12),
    ("ReduceMean", [(2, 3, 4)], [(2, 1, 4)], {}, 24),
    ("Cast", [(2, 3)], [(2, 3)], {"to": "f16"}, 6),
]


@pytest.mark.parametrize("op,ins,outs,attrs,want", FLOPS_CASES)
def test_flops_counts(op, ins, outs, attrs, want):
    got = FLOPS[f"top.{op}"](ins, outs, attrs)
    assert isinstance(got, int) and got == want


def test_flops_every_op_non_negative_int():
    shape = (1, 4, 6, 6)
    for op, fn in FLOPS.items():
        ins = [shape, (4, 4, 1, 1), None] if op in ("Conv", "Deconv") else [shape, shape]
        attrs = {"kernel_shape": [1, 1], "mode": "linear"}
        n = fn(ins, [shape], attrs)
        assert isinstance(n, int) and n >= 0, op


def test_round_takes_halves_to_even_as_onnx():
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 2.4999998, -3.5000002], np.float32)
    want = run_node("Round", [x])[0]
    np.testing.assert_array_equal(KERNELS["top.Round"]([x], {})[0], want)
    np.testing.assert_array_equal(want, [-2, -2, -0, 0, 2, 2, 2, -4])
