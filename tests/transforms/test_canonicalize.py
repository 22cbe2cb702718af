"""Each canonicalization pattern on its own: the rewritten module computes the same tensors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tftpu.interp.top_interpreter import run
from tftpu.ir import TopBuilder
from tftpu.transforms import canonicalize as C

RNG = np.random.default_rng(0)


def rand(*shape, lo=None, hi=None):
    if lo is not None:
        return RNG.uniform(lo, hi, shape).astype(np.float32)
    return RNG.standard_normal(shape).astype(np.float32)


def op_names(model):
    return [op.op_name for op in model.ops if op.op_name not in ("Weight", "None", "Input")]


def check(model, inputs, patterns, expect_ops=None, rtol=1e-5):
    """Run patterns alone; outputs (by name) must match the original within float32 round-off."""
    before = run(model, inputs)
    report = C.canonicalize(model, patterns=patterns)
    after = run(model, inputs)
    assert list(after) == list(before), "output names changed"
    for k in before:
        scale = max(float(np.abs(before[k]).max()), 1e-6)
        np.testing.assert_allclose(after[k], before[k], rtol=rtol, atol=rtol * scale, err_msg=k)
    if expect_ops is not None:
        assert op_names(model) == expect_ops
    return report


def bn_weights(b, c, tag):
    return [b.weight(f"{tag}_mean", rand(c)), b.weight(f"{tag}_var", rand(c, lo=0.2, hi=2.0)),
            b.weight(f"{tag}_gamma", rand(c, lo=0.5, hi=1.5)), b.weight(f"{tag}_beta", rand(c))]


@pytest.mark.parametrize("dims,group,bias,stride", [
    (1, 1, True, 1), (2, 1, False, 2), (2, 4, True, 1), (2, 8, False, 2), (3, 2, True, 1), (2, 1, True, 3)])
def test_fold_batchnorm_into_conv(dims, group, bias, stride):
    b = TopBuilder("m")
    c_in, c_out, k = 8, 8 if group == 8 else 12, 3
    spatial = [9] * dims
    x = b.input("x", (2, c_in, *spatial))
    w = b.weight("w", rand(c_out, c_in // group, *[k] * dims))
    bias_v = b.weight("b", rand(c_out)) if bias else b.none()
    y = b.op("Conv", [x, w, bias_v], {"kernel_shape": [k] * dims, "strides": [stride] * dims,
                                     "pads": [1] * (2 * dims), "group": group}, "conv")
    z = b.op("BatchNorm", [y, *bn_weights(b, c_out, "bn")], {"epsilon": 1e-3}, "bn")
    m = b.finish([z])
    rep = check(m, {"x": rand(2, c_in, *spatial)}, [C.FoldBatchNorm, C.DeadCode], ["Conv"])
    assert rep.counts["fold-batchnorm-into-conv"] == 1
    assert m.ops[-1].loc == "bn"
    assert set(m.weights) == {"bn_filter", "bn_bias"}


@pytest.mark.parametrize("group,stride", [(1, 2), (2, 2), (4, 1)])
def test_fold_batchnorm_into_deconv(group, stride):
    b = TopBuilder("m")
    c_in, c_out = 8, 12
    x = b.input("x", (1, c_in, 5, 6))
    w = b.weight("w", rand(c_in, c_out // group, 3, 3))
    y = b.op("Deconv", [x, w, b.weight("b", rand(c_out))],
             {"kernel_shape": [3, 3], "strides": [stride, stride], "pads": [1, 0, 1, 0], "group": group}, "dc")
    z = b.op("BatchNorm", [y, *bn_weights(b, c_out, "bn")], {}, "bn")
    m = b.finish([z])
    check(m, {"x": rand(1, c_in, 5, 6)}, [C.FoldBatchNorm, C.DeadCode], ["Deconv"])


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_batchnorm_to_scale_when_not_after_conv(layout):
    b = TopBuilder("m")
    shape = (2, 6, 4, 5) if layout == "NCHW" else (2, 4, 5, 6)
    x = b.input("x", shape)
    r = b.op("Relu", [x], {}, "r")
    z = b.op("BatchNorm", [r, *bn_weights(b, 6, "bn")], {"epsilon": 1e-5, "layout": layout}, "bn")
    m = b.finish([z])
    rep = check(m, {"x": rand(*shape)}, [C.FoldBatchNorm, C.DeadCode], ["Relu", "Scale"])
    assert rep.counts["batchnorm-to-scale"] == 1


def test_batchnorm_not_folded_into_shared_conv():
    b = TopBuilder("m")
    x = b.input("x", (1, 3, 6, 6))
    y = b.op("Conv", [x, b.weight("w", rand(4, 3, 1, 1)), b.none()], {"kernel_shape": [1, 1]}, "conv")
    z = b.op("BatchNorm", [y, *bn_weights(b, 4, "bn")], {}, "bn")
    m = b.finish([y, z])
    check(m, {"x": rand(1, 3, 6, 6)}, [C.FoldBatchNorm, C.DeadCode], ["Conv", "Scale"])


def test_fold_scale_into_conv():
    b = TopBuilder("m")
    x = b.input("x", (1, 3, 6, 6))
    y = b.op("Conv", [x, b.weight("w", rand(4, 3, 3, 3)), b.none()], {"kernel_shape": [3, 3]}, "conv")
    z = b.op("Scale", [y, b.weight("s", rand(4)), b.weight("t", rand(4))], {}, "scale")
    m = b.finish([z])
    check(m, {"x": rand(1, 3, 6, 6)}, [C.FoldScaleIntoConv, C.DeadCode], ["Conv"])


@pytest.mark.parametrize("lo,hi,expect", [(0.0, 6.0, "Relu"), (0.0, 1.0, "Relu"), (-1.0, 1.0, "Clip"),
                                          (0.0, float(np.finfo(np.float32).max), "Relu")])
def test_clip_to_relu(lo, hi, expect):
    b = TopBuilder("m")
    x = b.input("x", (3, 7))
    m = b.finish([b.op("Clip", [x], {"min": lo, "max": hi}, "clip")])
    check(m, {"x": rand(3, 7) * 5}, [C.ClipToRelu], [expect])


HOSTS = {
    "Conv": lambda b, x: b.op("Conv", [x, b.weight("w", rand(4, 4, 3, 3)), b.weight("b", rand(4))],
                              {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, "h"),
    "Deconv": lambda b, x: b.op("Deconv", [x, b.weight("w", rand(4, 4, 2, 2)), b.none()],
                                {"kernel_shape": [2, 2], "strides": [2, 2]}, "h"),
    "MatMul": lambda b, x: b.op("MatMul", [x, b.weight("w", rand(6, 6)), b.weight("b", rand(6))], {}, "h"),
    "Add": lambda b, x: b.op("Add", [x, b.weight("c", rand(6))], {}, "h"),
    "Sub": lambda b, x: b.op("Sub", [x, b.weight("c", rand(6))], {}, "h"),
    "Mul": lambda b, x: b.op("Mul", [x, b.weight("c", rand(6))], {}, "h"),
    "Scale": lambda b, x: b.op("Scale", [x, b.weight("s", rand(4)), b.weight("t", rand(4))], {}, "h"),
    "MaxPool": lambda b, x: b.op("MaxPool", [x], {"kernel_shape": [2, 2], "strides": [1, 1]}, "h"),
    "AvgPool": lambda b, x: b.op("AvgPool", [x], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, "h"),
    "Concat": lambda b, x: b.op("Concat", [x, x], {"axis": 1}, "h"),
}


@pytest.mark.parametrize("host,limit", list(itertools.product(sorted(HOSTS), [-1.0, 6.0, 0.5])))
def test_fuse_relu(host, limit):
    b = TopBuilder("m")
    shape = (2, 4, 6, 6) if host not in ("MatMul", "Add", "Sub", "Mul") else (2, 3, 6)
    x = b.input("x", shape)
    h = HOSTS[host](b, x)
    m = b.finish([b.op("Relu", [h], {"relu_limit": limit}, "relu")])
    rep = check(m, {"x": rand(*shape) * 4}, [C.FuseRelu])
    if host == "Concat" and limit >= 0:
        assert op_names(m) == ["Concat", "Relu"]
        return
    assert op_names(m) == [host] and rep.counts["fuse-relu"] == 1
    assert m.ops[-1].attrs()["do_relu"] and m.ops[-1].loc == "relu"


def test_fuse_relu_skips_shared_producer():
    b = TopBuilder("m")
    x = b.input("x", (2, 6))
    a = b.op("Add", [x, x], {}, "a")
    m = b.finish([b.op("Relu", [a], {}, "r"), a])
    check(m, {"x": rand(2, 6)}, [C.FuseRelu], ["Add", "Relu"])


@pytest.mark.parametrize("swap", [False, True])
def test_fuse_silu(swap):
    b = TopBuilder("m")
    x = b.input("x", (2, 5, 3))
    s = b.op("Sigmoid", [x], {}, "sig")
    m = b.finish([b.op("Mul", [s, x] if swap else [x, s], {}, "swish")])
    check(m, {"x": rand(2, 5, 3) * 3}, [C.FuseSiLU, C.DeadCode], ["SiLU"])


def test_fold_constants():
    b = TopBuilder("m")
    x = b.input("x", (2, 3))
    c = b.op("Mul", [b.weight("a", rand(3)), b.weight("b", rand(3))], {}, "ab")
    c = b.op("Reshape", [c], {"shape": [1, 3]}, "ab_r")
    m = b.finish([b.op("Add", [x, c], {}, "y")])
    rep = check(m, {"x": rand(2, 3)}, [C.FoldConstants, C.DeadCode], ["Add"])
    assert rep.counts["fold-constants"] == 2 and set(m.weights) == {"ab_r"}


NOOPS = [
    ("Reshape", {"shape": [2, 3, 4]}), ("Flatten", {"start_dim": 1, "end_dim": 1}),
    ("Permute", {"order": [0, 1, 2]}), ("Cast", {"to": "f32"}),
    ("Slice", {"starts": [0], "ends": [100], "axes": [2]}), ("Pad", {"paddings": [0] * 6}),
    ("Squeeze", {"axes": []}), ("Unsqueeze", {"axes": []}), ("Concat", {"axis": 1}),
    ("Split", {"axis": 1, "split_size": [3]}),
]


@pytest.mark.parametrize("op,attrs", NOOPS, ids=[n for n, _ in NOOPS])
@pytest.mark.parametrize("is_output", [False, True])
def test_drop_noop(op, attrs, is_output):
    b = TopBuilder("m")
    x = b.input("x", (2, 3, 4))
    e = b.op("Exp", [x], {}, "e")
    n = b.op(op, [e], attrs, "noop")
    outs = [n] if is_output else [b.op("Neg", [n], {}, "y")]
    m = b.finish(outs)
    check(m, {"x": rand(2, 3, 4)}, [C.DropNoOps], ["Exp"] if is_output else ["Exp", "Neg"])
    assert m.output_names == (["noop"] if is_output else ["y"])


def test_drop_noop_keeps_names_of_a_returned_input():
    b = TopBuilder("m")
    x = b.input("x", (2, 3))
    m = b.finish([b.op("Reshape", [x], {"shape": [2, 3]}, "same")])
    check(m, {"x": rand(2, 3)}, [C.DropNoOps], ["Reshape"])


def test_not_noop_reversing_slice():
    b = TopBuilder("m")
    x = b.input("x", (2, 5))
    m = b.finish([b.op("Slice", [x], {"starts": [-1], "ends": [-100], "steps": [-1], "axes": [1]}, "rev")])
    check(m, {"x": rand(2, 5)}, [C.DropNoOps], ["Slice"])


@pytest.mark.parametrize("seed", range(8))
def test_merge_permutes(seed):
    r = np.random.default_rng(seed)
    a = [int(v) for v in r.permutation(4)]
    c = [int(v) for v in r.permutation(4)]
    if [a[i] for i in c] == [0, 1, 2, 3]:
        c = [c[1], c[0], c[2], c[3]]
    b = TopBuilder("m")
    x = b.input("x", (2, 3, 4, 5))
    p = b.op("Permute", [x], {"order": a}, "p1")
    m = b.finish([b.op("Permute", [p], {"order": c}, "p2")])
    check(m, {"x": rand(2, 3, 4, 5)}, [C.MergePermutes, C.DropNoOps, C.DeadCode])
    composed = [a[i] for i in c]
    assert op_names(m) == ["Permute"]
    assert m.ops[-1].attrs()["order"] == composed and m.output_names == ["p2"]


def test_merge_inverse_permutes_disappear():
    b = TopBuilder("m")
    x = b.input("x", (2, 3, 4, 5))
    e = b.op("Exp", [x], {}, "e")
    p = b.op("Permute", [e], {"order": [0, 2, 3, 1]}, "nhwc")
    q = b.op("Permute", [p], {"order": [0, 3, 1, 2]}, "nchw")
    m = b.finish([b.op("Neg", [q], {}, "y")])
    check(m, {"x": rand(2, 3, 4, 5)}, [C.MergePermutes, C.DropNoOps, C.DeadCode], ["Exp", "Neg"])


def test_merge_reshapes():
    b = TopBuilder("m")
    x = b.input("x", (2, 3, 4))
    r = b.op("Reshape", [x], {"shape": [6, 4]}, "r1")
    r = b.op("Unsqueeze", [r], {"axes": [0]}, "r2")
    r = b.op("Flatten", [r], {"start_dim": 0, "end_dim": 1}, "r3")
    m = b.finish([b.op("Neg", [r], {}, "y")])
    check(m, {"x": rand(2, 3, 4)}, [C.MergeReshapes, C.DeadCode], ["Reshape", "Neg"])


def test_dead_code():
    b = TopBuilder("m")
    x = b.input("x", (2, 3))
    dead = b.op("Exp", [x], {}, "dead")
    b.op("Neg", [dead], {}, "dead2")
    b.weight("unused", rand(3))
    m = b.finish([b.op("Abs", [x], {}, "y")])
    rep = check(m, {"x": rand(2, 3)}, [C.DeadCode], ["Abs"])
    assert rep.counts["dead-code"] == 2 and m.weights == {}


def test_full_pipeline_is_idempotent_and_deterministic():
    def build():
        b = TopBuilder("m")
        x = b.input("x", (1, 3, 8, 8))
        y = b.op("Conv", [x, b.weight("w", np.ones((4, 3, 3, 3), np.float32)), b.none()],
                 {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, "conv")
        y = b.op("BatchNorm", [y, *[b.weight(f"p{i}", np.full(4, 0.5 + i, np.float32)) for i in range(4)]],
                 {}, "bn")
        y = b.op("Clip", [y], {"min": 0.0, "max": 6.0}, "relu6")
        return b.finish([y])
    m1, m2 = build(), build()
    C.canonicalize(m1)
    C.canonicalize(m2)
    assert m1.text() == m2.text() and op_names(m1) == ["Conv"]
    text = m1.text()
    rep = C.canonicalize(m1)
    assert m1.text() == text and not rep.counts


@pytest.mark.parametrize("kind,const_shape,layout,folds", [
    ("Mul", (1, 4, 1, 1), "NCHW", True), ("Add", (4, 1, 1), "NCHW", True), ("Mul", (), "NCHW", True),
    ("Add", (4,), "NHWC", True), ("Mul", (1, 1, 1, 4), "NHWC", True),
    ("Mul", (4, 7, 7), "NCHW", False), ("Add", (4,), "NCHW", False)])
@pytest.mark.parametrize("relu", [False, True])
def test_fold_mul_add_into_conv(kind, const_shape, layout, folds, relu):
    b = TopBuilder("m")
    shape = (1, 3, 7, 7) if layout == "NCHW" else (1, 7, 7, 3)
    x = b.input("x", shape)
    w = rand(4, 3, 3, 3) if layout == "NCHW" else rand(3, 3, 3, 4)
    y = b.op("Conv", [x, b.weight("w", w), b.weight("b", rand(4))],
             {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "layout": layout,
              "kernel_layout": "OIHW" if layout == "NCHW" else "HWIO"}, "conv")
    if not folds and const_shape == (4,) and layout == "NCHW":
        const_shape = (7,)  # broadcasts along W, not channels
    c = b.weight("c", rand(*const_shape) if const_shape else np.float32(1.7))
    z = b.op(kind, [y, c] if kind == "Add" else [c, y], {"do_relu": relu, "relu_limit": 6.0 if relu else -1.0},
             "affine")
    m = b.finish([z])
    layout_folds = folds and layout == "NCHW"  # HWIO filters are left alone
    check(m, {"x": rand(*shape)}, [C.FoldMulAddIntoConv, C.DeadCode],
          ["Conv"] if layout_folds else ["Conv", kind])
    if layout_folds:
        assert m.ops[-1].attrs()["do_relu"] == relu and m.ops[-1].loc == "affine"


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("pads,folds", [([0, 0, 1, 0, 0, 0, 2, 1], True), ([0, 1, 0, 0, 0, 0, 0, 0], False)])
def test_fold_pad_into_conv(layout, pads, folds):
    b = TopBuilder("m")
    if layout == "NHWC":  # same pads, axes moved: [N,H,W,C]
        pads = [pads[0], pads[2], pads[3], pads[1], pads[4], pads[6], pads[7], pads[5]]
    shape = (1, 3, 8, 8) if layout == "NCHW" else (1, 8, 8, 3)
    x = b.input("x", shape)
    p = b.op("Pad", [x], {"paddings": pads}, "pad")
    w = rand(4, 3, 3, 3) if layout == "NCHW" else rand(3, 3, 3, 4)
    c_in = 4 if not folds else 3
    if not folds:
        w = rand(4, c_in, 3, 3) if layout == "NCHW" else rand(3, 3, c_in, 4)
    y = b.op("Conv", [p, b.weight("w", w), b.none()],
             {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 1, 0, 1], "layout": layout,
              "kernel_layout": "OIHW" if layout == "NCHW" else "HWIO"}, "conv")
    m = b.finish([y])
    check(m, {"x": rand(*shape)}, [C.FoldPadIntoConv, C.DeadCode], ["Conv"] if folds else ["Pad", "Conv"])


@pytest.mark.parametrize("pads,folds", [([0, 0, 1, 0, 0, 2, 1, 0], True), ([0, 1, 2, 0, 0, 0, 1, 0], True),
                                        ([0, 0, 0, 1, 0, 1, 0, 0], False)])
def test_fold_pad_through_permute_into_conv(pads, folds):
    """A TFLite import's NHWC zero pad, then its transpose to NCHW, then the conv: the pad folds
    into the conv's pads (unless it pads channels) and the transpose reads the unpadded input."""
    b = TopBuilder("m")
    x = b.input("x", (1, 9, 8, 3 if folds else 2))       # NHWC; pads are [N, H, W, C] begins then ends
    p = b.op("Pad", [x], {"paddings": pads}, "pad")
    t = b.op("Permute", [p], {"order": [0, 3, 1, 2]}, "to_nchw")
    y = b.op("Conv", [t, b.weight("w", rand(4, 3, 3, 3)), b.weight("b", rand(4))],
             {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 0, 1]}, "conv")
    m = b.finish([y])
    check(m, {"x": rand(1, 9, 8, 3 if folds else 2)}, [C.FoldPadIntoConv, C.DeadCode],
          ["Permute", "Conv"] if folds else ["Pad", "Permute", "Conv"])
    if folds:
        conv = m.ops[-1]
        h0, w0, h1, w1 = pads[1], pads[2], pads[5], pads[6]
        assert conv.attrs()["pads"] == [1 + h0, 0 + w0, 0 + h1, 1 + w1]
        assert m.ops[-2].loc == "to_nchw_unpadded"          # not the padded tensor's name


@pytest.mark.parametrize("swap_add,swap_mul", [(False, False), (True, True)])
@pytest.mark.parametrize("slope_shape", [(1, 4, 1, 1), (4, 1, 1), ()])
def test_fuse_prelu(swap_add, swap_mul, slope_shape):
    b = TopBuilder("m")
    x = b.input("x", (2, 4, 5, 5))
    e = b.op("Exp", [x], {}, "e")
    t = b.op("Sub", [e, b.weight("one", np.float32(1.5))], {}, "t")
    pos = b.op("Relu", [t], {}, "pos")
    neg = b.op("Relu", [b.op("Neg", [t], {}, "negx")], {}, "neg")
    c = b.weight("c", -np.abs(rand(*slope_shape)) if slope_shape else np.float32(-0.25))
    m_ = b.op("Mul", [c, neg] if swap_mul else [neg, c], {}, "scaled")
    m = b.finish([b.op("Add", [m_, pos] if swap_add else [pos, m_], {}, "prelu")])
    check(m, {"x": rand(2, 4, 5, 5)}, [C.FusePRelu, C.DeadCode], ["Exp", "Sub", "PRelu"])


def test_prelu_not_fused_when_inputs_differ():
    b = TopBuilder("m")
    x = b.input("x", (2, 4))
    y = b.input("y", (2, 4))
    pos = b.op("Relu", [x], {}, "pos")
    neg = b.op("Relu", [b.op("Neg", [y], {}, "negy")], {}, "neg")
    m_ = b.op("Mul", [neg, b.weight("c", rand(4))], {}, "scaled")
    m = b.finish([b.op("Add", [pos, m_], {}, "out")])
    check(m, {"x": rand(2, 4), "y": rand(2, 4)}, [C.FusePRelu, C.DeadCode], ["Relu", "Neg", "Relu", "Mul", "Add"])


@pytest.mark.parametrize("div", [False, True])
@pytest.mark.parametrize("swap", [False, True])
def test_fuse_hardsigmoid_and_hardswish(div, swap):
    """x * (relu6(x + 3) / 6), as tf2onnx writes Keras hard_swish: Add, Clip(0,6), Mul|Div, Mul."""
    b = TopBuilder("m")
    x = b.input("x", (2, 4, 5))
    t = b.op("Add", [b.weight("three", np.float32(3.0)), x] if swap else [x, b.weight("three", np.float32(3.0))],
             {}, "t")
    r6 = b.op("Clip", [t], {"min": 0.0, "max": 6.0}, "r6")
    k = b.weight("k", np.float32(6.0) if div else np.float32(1.0 / 6.0))
    hsig = b.op("Div" if div else "Mul", [r6, k] if div or not swap else [k, r6], {}, "hsig")
    m = b.finish([b.op("Mul", [hsig, x] if swap else [x, hsig], {}, "hswish")])
    rep = check(m, {"x": rand(2, 4, 5) * 4},
                [C.ClipToRelu, C.FuseRelu, C.FuseHardSigmoid, C.FuseHardSwish, C.DeadCode], ["HardSwish"])
    assert rep.counts["fuse-hardsigmoid"] == 1 and rep.counts["fuse-hardswish"] == 1
    assert m.output_names == ["hswish"]


def test_hardsigmoid_needs_relu6_and_three():
    b = TopBuilder("m")
    x = b.input("x", (2, 4))
    t = b.op("Add", [x, b.weight("two", np.float32(2.0))], {"do_relu": True, "relu_limit": 6.0}, "t")
    m = b.finish([b.op("Mul", [t, b.weight("k", np.float32(1 / 6))], {}, "h")])
    check(m, {"x": rand(2, 4) * 4}, [C.FuseHardSigmoid], ["Add", "Mul"])


def _gelu_graph(form):
    """GELU written the ways exporters write it."""
    b = TopBuilder("m")
    x = b.input("x", (2, 5, 3))
    w = lambda name, v: b.weight(name, np.array(v, np.float32))  # noqa: E731
    if form == "tf_erfc":  # (0.5 * x) * (1 - erf(-x * 0.7071))
        half_x = b.op("Mul", [w("half", 0.5), x], {}, "hx")
        arg = b.op("Mul", [b.op("Neg", [x], {}, "neg"), w("c", 0.7071067690849304)], {}, "arg")
        factor = b.op("Sub", [w("one", 1.0), b.op("Erf", [arg], {}, "erf")], {}, "f")
        y = b.op("Mul", [half_x, factor], {}, "gelu")
    elif form == "torch":  # ((x * (1 + erf(x / 1.4142))) * 0.5
        arg = b.op("Div", [x, w("sqrt2", 1.4142135381698608)], {}, "arg")
        factor = b.op("Add", [b.op("Erf", [arg], {}, "erf"), w("one", 1.0)], {}, "f")
        y = b.op("Mul", [b.op("Mul", [x, factor], {}, "xf"), w("half", 0.5)], {}, "gelu")
    else:  # x * (0.5 * (1 + erf(x * 0.7071)))
        arg = b.op("Mul", [x, w("c", 0.7071067690849304)], {}, "arg")
        factor = b.op("Add", [w("one", 1.0), b.op("Erf", [arg], {}, "erf")], {}, "f")
        y = b.op("Mul", [x, b.op("Mul", [factor, w("half", 0.5)], {}, "hf")], {}, "gelu")
    return b.finish([y])


@pytest.mark.parametrize("form", ["tf_erfc", "torch", "half_factor"])
def test_fuse_gelu(form):
    m = _gelu_graph(form)
    rep = check(m, {"x": rand(2, 5, 3) * 3}, [C.FuseGELU, C.DeadCode], ["GELU"])
    assert rep.counts["fuse-gelu"] == 1 and m.output_names == ["gelu"]


def test_gelu_lookalikes_stay():
    """A sign, a constant or an operand that differs keeps the ops as they are."""
    b = TopBuilder("m")
    x, z = b.input("x", (2, 3)), b.input("z", (2, 3))
    w = lambda name, v: b.weight(name, np.array(v, np.float32))  # noqa: E731
    arg = b.op("Mul", [x, w("c", 0.7071067690849304)], {}, "arg")
    factor = b.op("Sub", [w("one", 1.0), b.op("Erf", [arg], {}, "erf")], {}, "f")  # 1 - erf(+x/√2)
    y1 = b.op("Mul", [b.op("Mul", [x, w("half", 0.5)], {}, "hx"), factor], {}, "y1")
    factor2 = b.op("Add", [w("one2", 1.0), b.op("Erf", [arg], {}, "erf2")], {}, "f2")
    y2 = b.op("Mul", [b.op("Mul", [z, w("half2", 0.5)], {}, "hz"), factor2], {}, "y2")  # z, not x
    y3 = b.op("Mul", [b.op("Mul", [x, w("third", 0.3)], {}, "h3"), factor2], {}, "y3")  # 0.3, not 0.5
    m = b.finish([y1, y2, y3])
    rep = check(m, {"x": rand(2, 3), "z": rand(2, 3)}, [C.FuseGELU, C.DeadCode])
    assert rep.counts["fuse-gelu"] == 0 and "GELU" not in op_names(m)


def _keras_layernorm(shape, axes, gamma, beta, form="add"):
    """Keras' LayerNormalization as tf2onnx writes it: x * m + (-mean * m + beta), m = gamma / sqrt(var + eps)."""
    b = TopBuilder("m")
    x = b.input("x", shape)
    w = lambda name, v: b.weight(name, np.asarray(v, np.float32))  # noqa: E731
    mean = b.op("ReduceMean", [x], {"axes": axes, "keepdims": True}, "mean")
    d = b.op("Sub", [x, mean], {}, "d")
    var = b.op("ReduceMean", [b.op("Mul", [d, d], {}, "sq")], {"axes": axes, "keepdims": True}, "var")
    inv = b.op("Div", [w("one", 1.0), b.op("Sqrt", [b.op("Add", [var, w("eps", 1e-3)], {}, "ve")], {}, "s")],
               {}, "inv")
    m = inv if gamma is None else b.op("Mul", [w("gamma", gamma), inv], {}, "m")
    if form == "sub":  # beta - mean * m
        shift = b.op("Sub", [w("beta", beta), b.op("Mul", [mean, m], {}, "mm")], {}, "shift")
    else:
        shift = b.op("Mul", [b.op("Neg", [mean], {}, "neg"), m], {}, "nm")
        if beta is not None:
            shift = b.op("Add", [shift, w("beta", beta)], {}, "shift")
    return b.finish([b.op("Add", [b.op("Mul", [x, m], {}, "xm"), shift], {}, "ln")])


@pytest.mark.parametrize("shape,axes,affine,form", [
    ((2, 5, 8), [2], "both", "add"), ((2, 5, 8), [-1], "none", "add"), ((2, 5, 8), [2], "gamma", "add"),
    ((1, 6, 3, 4), [1], "both", "sub"), ((1, 6, 3, 4), [2, 3], "both", "add")])
def test_fuse_layernorm(shape, axes, affine, form):
    rank_axes = {a % len(shape) for a in axes}
    aff = [shape[a] if a in rank_axes else 1 for a in range(len(shape))][-(len(shape) - min(rank_axes)):]
    gamma = rand(*aff, lo=0.5, hi=1.5) if affine in ("both", "gamma") else None
    beta = rand(*aff) if affine == "both" else None
    m = _keras_layernorm(shape, axes, gamma, beta, form)
    rep = check(m, {"x": rand(*shape) * 4 + 1}, [C.FuseLayerNorm, C.DeadCode], ["LayerNorm"])
    assert rep.counts["fuse-layernorm"] == 1
    ln = next(op for op in m.ops if op.op_name == "LayerNorm")
    assert ln.attrs()["axes"] == sorted(rank_axes) and ln.attrs()["eps"] == pytest.approx(1e-3)


def test_layernorm_lookalikes_stay():
    """Moments over different axes, or a mean of another tensor, are not a LayerNorm."""
    b = TopBuilder("m")
    x, z = b.input("x", (2, 4, 6)), b.input("z", (2, 4, 6))
    w = lambda name, v: b.weight(name, np.asarray(v, np.float32))  # noqa: E731
    outs = []
    for tag, mean_src, var_axes in (("a", x, [1]), ("b", z, [2])):
        mean = b.op("ReduceMean", [mean_src], {"axes": [2], "keepdims": True}, f"{tag}_mean")
        d = b.op("Sub", [x, mean], {}, f"{tag}_d")
        var = b.op("ReduceMean", [b.op("Mul", [d, d], {}, f"{tag}_sq")], {"axes": var_axes, "keepdims": True},
                   f"{tag}_var")
        inv = b.op("Div", [w(f"{tag}_one", 1.0), b.op("Sqrt", [b.op("Add", [var, w(f"{tag}_eps", 1e-3)], {},
                                                                       f"{tag}_ve")], {}, f"{tag}_s")], {}, f"{tag}_inv")
        shift = b.op("Mul", [b.op("Neg", [mean], {}, f"{tag}_neg"), inv], {}, f"{tag}_nm")
        outs.append(b.op("Add", [b.op("Mul", [x, inv], {}, f"{tag}_xm"), shift], {}, f"{tag}_ln"))
    m = b.finish(outs)
    rep = check(m, {"x": rand(2, 4, 6), "z": rand(2, 4, 6)}, [C.FuseLayerNorm, C.DeadCode])
    assert rep.counts["fuse-layernorm"] == 0


def _div_layernorm(shape, axes, gamma, beta, var_axes=None):
    """PaddlePaddle's / PyTorch's LayerNorm as their exporters write it: (x - mean) / sqrt(var + eps),
    then * gamma + beta."""
    b = TopBuilder("m")
    x = b.input("x", shape)
    w = lambda name, v: b.weight(name, np.asarray(v, np.float32))  # noqa: E731
    mean = b.op("ReduceMean", [x], {"axes": axes, "keepdims": True}, "mean")
    d = b.op("Sub", [x, mean], {}, "d")
    var = b.op("ReduceMean", [b.op("Mul", [d, d], {}, "sq")], {"axes": var_axes or axes, "keepdims": True}, "var")
    y = b.op("Div", [d, b.op("Sqrt", [b.op("Add", [var, w("eps", 1e-5)], {}, "ve")], {}, "s")], {}, "y")
    if gamma is not None:
        y = b.op("Mul", [y, w("gamma", gamma)], {}, "yg")
    if beta is not None:
        y = b.op("Add", [y, w("beta", beta)], {}, "yb")
    return b.finish([y])


@pytest.mark.parametrize("shape,axes,affine", [((2, 5, 8), [2], "both"), ((2, 5, 8), [-1], "none"),
                                               ((1, 6, 3, 4), [2, 3], "gamma"), ((3, 7), [1], "beta")])
def test_fuse_div_layernorm(shape, axes, affine):
    """The division form becomes one LayerNorm, its gamma and beta folded in."""
    last = shape[-1]
    gamma = rand(last, lo=0.5, hi=1.5) if affine in ("both", "gamma") else None
    beta = rand(last) if affine in ("both", "beta") else None
    m = _div_layernorm(shape, axes, gamma, beta)
    rep = check(m, {"x": rand(*shape) * 4 + 1}, [C.FuseDivLayerNorm, C.FoldAffineIntoLayerNorm, C.DeadCode],
                ["LayerNorm"])
    assert rep.counts["fuse-div-layernorm"] == 1
    assert rep.counts["fold-affine-into-layernorm"] == (gamma is not None) + (beta is not None)
    ln = next(op for op in m.ops if op.op_name == "LayerNorm")
    assert ln.attrs()["axes"] == sorted(a % len(shape) for a in axes) and ln.attrs()["eps"] == pytest.approx(1e-5)


def test_div_layernorm_lookalikes_stay():
    """A variance over other axes than the mean's is not a LayerNorm."""
    m = _div_layernorm((2, 4, 6), [2], None, None, var_axes=[1])
    rep = check(m, {"x": rand(2, 4, 6)}, [C.FuseDivLayerNorm, C.DeadCode])
    assert rep.counts["fuse-div-layernorm"] == 0 and "LayerNorm" not in op_names(m)


@pytest.mark.parametrize("bias,right_transpose,relu", [(False, False, False), (True, False, True),
                                                       (True, True, False)])
def test_pointwise_matmul_becomes_1x1_conv(bias, right_transpose, relu):
    b = TopBuilder("m")
    x = b.input("x", (2, 3, 5, 4))
    flat = b.op("Reshape", [x], {"shape": [30, 4]}, "flat")
    w = b.weight("w", rand(6, 4) if right_transpose else rand(4, 6))
    bv = b.weight("b", rand(6)) if bias else b.none()
    mm = b.op("MatMul", [flat, w, bv], {"right_transpose": right_transpose, "do_relu": relu}, "mm")
    m = b.finish([b.op("Reshape", [mm], {"shape": [2, 3, 5, 6]}, "dense")])
    rep = check(m, {"x": rand(2, 3, 5, 4)}, [C.PointwiseMatMulToConv, C.DeadCode], ["Conv"])
    assert rep.counts["pointwise-matmul-to-conv"] == 1 and m.output_names == ["dense"]
    conv = next(op for op in m.ops if op.op_name == "Conv")
    assert conv.attrs()["layout"] == "NHWC" and conv.attrs()["do_relu"] == relu


def test_matmul_over_other_axes_stays():
    b = TopBuilder("m")
    x = b.input("x", (2, 3, 5, 4))
    flat = b.op("Reshape", [x], {"shape": [6, 20]}, "flat")   # merges W and C: not pointwise
    mm = b.op("MatMul", [flat, b.weight("w", rand(20, 8)), b.none()], {}, "mm")
    m = b.finish([b.op("Reshape", [mm], {"shape": [2, 3, 8]}, "y")])
    rep = check(m, {"x": rand(2, 3, 5, 4)}, [C.PointwiseMatMulToConv, C.DeadCode], ["Reshape", "MatMul", "Reshape"])
    assert rep.counts["pointwise-matmul-to-conv"] == 0


@pytest.mark.parametrize("layout,sizes,bias,relu,kernel,returned", [
    ("NCHW", [10, 32], True, False, 1, True), ("NCHW", [3, 3, 2], False, True, 3, False),
    ("NHWC", [4, 4], True, False, 3, True), ("NCHW", [1, 7], True, True, 1, False)])
def test_split_conv_by_parts(layout, sizes, bias, relu, kernel, returned):
    """conv -> Split along its output channels -> one conv per part, same values and names."""
    c = sum(sizes)
    b = TopBuilder("head")
    shape = (1, 5, 7, 6) if layout == "NCHW" else (1, 7, 6, 5)
    x = b.input("x", shape)
    w = rand(c, 5, kernel, kernel) if layout == "NCHW" else rand(kernel, kernel, 5, c)
    conv = b.op("Conv", [x, b.weight("w", w), b.weight("b", rand(c)) if bias else b.none()],
                {"kernel_shape": [kernel, kernel], "pads": [kernel // 2] * 4, "layout": layout, "do_relu": relu,
                 "kernel_layout": "OIHW" if layout == "NCHW" else "HWIO"}, "head_conv")
    parts = b.op("Split", [conv], {"axis": 1 if layout == "NCHW" else 3, "split_size": sizes},
                 [f"part{i}" for i in range(len(sizes))])
    outs = list(parts) if returned else [b.op("Sigmoid", [p], {}, f"act{i}") for i, p in enumerate(parts)]
    model = b.finish(outs)
    report = check(model, {"x": rand(*shape)}, [C.SplitConvByParts, C.DeadCode],
                   expect_ops=["Conv"] * len(sizes) + ([] if returned else ["Sigmoid"] * len(sizes)))
    assert report.counts["split-conv-by-parts"] == 1
    convs = [op for op in model.ops if op.op_name == "Conv"]
    assert [op.loc for op in convs] == [f"part{i}" for i in range(len(sizes))]
    assert [op.output.type.get_shape()[1 if layout == "NCHW" else 3] for op in convs] == sizes


def test_split_conv_by_parts_leaves_shared_and_spatial_splits():
    b = TopBuilder("keep")
    x = b.input("x", (1, 4, 6, 6))
    conv = b.op("Conv", [x, b.weight("w", rand(6, 4, 1, 1)), b.none()], {"kernel_shape": [1, 1]}, "c")
    spatial = b.op("Split", [conv], {"axis": 2, "split_size": [3, 3]}, ["s0", "s1"])
    model = b.finish(list(spatial))
    report = check(model, {"x": rand(1, 4, 6, 6)}, [C.SplitConvByParts])
    assert not report.counts
    b = TopBuilder("shared")
    x = b.input("x", (1, 4, 6, 6))
    conv = b.op("Conv", [x, b.weight("w", rand(6, 4, 1, 1)), b.none()], {"kernel_shape": [1, 1]}, "c")
    chans = b.op("Split", [conv], {"axis": 1, "split_size": [2, 4]}, ["s0", "s1"])
    model = b.finish(list(chans) + [conv])
    report = check(model, {"x": rand(1, 4, 6, 6)}, [C.SplitConvByParts])
    assert not report.counts
