"""The compiled TOP path (one TF graph per module) against the per-op interpreter: every op
family swept over its attributes, NCHW data kept channels-last inside, numpy fallbacks, real
models."""

from __future__ import annotations

import functools
import itertools
import numpy as np
import pytest

from tftpu import errors
from tftpu.interp.compiled import CompiledTop
from tftpu.interp.top_interpreter import TopInterpreter, run
from tftpu.ir import TopBuilder

RNG = np.random.default_rng(7)


def rand(*shape, lo=-1.0, hi=1.0):
    return RNG.uniform(lo, hi, shape).astype(np.float32)


def check(model, inputs, fallbacks=(), cos_min=0.99999, tol=2e-5):
    """Compiled outputs equal the per-op ones to float32 round-off; `fallbacks`: the op names
    expected to run their numpy kernel inside the graph (none else may)."""
    want = TopInterpreter(model).run(inputs)
    ex = CompiledTop(model)
    got = ex.run(inputs)
    assert sorted(set(ex.fallbacks)) == sorted(set(fallbacks)), ex.fallback_notes
    assert list(got) == list(want)
    for name in want:
        w, g = np.asarray(want[name]), got[name]
        assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, w.shape, g.dtype, w.dtype)
        if w.dtype.kind != "f" and w.dtype.name != "bfloat16":
            np.testing.assert_array_equal(g, w, err_msg=name)
            continue
        w64, g64 = w.astype(np.float64).ravel(), g.astype(np.float64).ravel()
        scale = max(1.0, float(np.abs(w64).max(initial=0)))
        err = float(np.abs(w64 - g64).max(initial=0))
        assert err <= tol * scale, f"{name}: max abs error {err:.3g} (scale {scale:.3g})"
        nw, ng = np.linalg.norm(w64), np.linalg.norm(g64)
        if nw > 1e-6:
            cos = float(w64 @ g64 / (nw * ng))
            assert cos >= cos_min, f"{name}: cosine {cos}"
    return got


# ----------------------------------------------------------------------------- Conv

@pytest.mark.parametrize("c,o,g", [(4, 6, 1), (4, 6, 2), (6, 6, 6), (4, 8, 4), (3, 3, 3)])
def test_conv_sweep_all_layouts(c, o, g):
    b = TopBuilder("conv")
    x = b.input("x", (1, c, 9, 10))
    xn = b.input("xn", (1, 9, 10, c))
    outs = []
    i = 0
    for k, s, d, (pads, bias, relu) in itertools.product(
            [(1, 1), (3, 3), (2, 3), (5, 5)], [(1, 1), (2, 2), (1, 2)], [(1, 1), (2, 2)],
            [((0, 0, 0, 0), True, None), ((1, 1, 1, 1), False, -1.0), ((0, 1, 2, 0), True, 6.0)]):
        wn = rand(o, c // g, *k)
        attrs = dict(kernel_shape=list(k), strides=list(s), pads=list(pads), dilations=list(d),
                     group=g, do_relu=relu is not None, relu_limit=-1.0 if relu is None else relu)
        w = b.weight(f"w{i}", wn)
        bb = b.weight(f"b{i}", rand(o)) if bias else b.none()
        outs.append(b.op("Conv", [x, w, bb], attrs, f"nchw{i}"))
        outs.append(b.op("Conv", [xn, w, bb], dict(attrs, layout="NHWC"), f"nhwc{i}"))
        whwio = b.weight(f"h{i}", np.ascontiguousarray(wn.transpose(2, 3, 1, 0)))
        outs.append(b.op("Conv", [xn, whwio, bb], dict(attrs, layout="NHWC", kernel_layout="HWIO"),
                         f"hwio{i}"))
        i += 1
    check(b.finish(outs), {"x": rand(1, c, 9, 10), "xn": rand(1, 9, 10, c)})


def test_conv_1d_and_3d_fall_back_to_the_kernels():
    b = TopBuilder("conv13")
    x1 = b.input("x1", (2, 4, 11))
    x3 = b.input("x3", (1, 2, 5, 6, 7))
    y1 = b.op("Conv", [x1, b.weight("w1", rand(6, 2, 3)), b.weight("b1", rand(6))],
              dict(kernel_shape=[3], strides=[2], pads=[1, 2], group=2), "c1")
    y3 = b.op("Conv", [x3, b.weight("w3", rand(3, 2, 3, 3, 3)), b.none()],
              dict(kernel_shape=[3, 3, 3], pads=[1, 1, 1, 1, 1, 1]), "c3")
    check(b.finish([y1, y3]), {"x1": rand(2, 4, 11), "x3": rand(1, 2, 5, 6, 7)},
          fallbacks=["Conv"])


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_deconv_sweep(layout):
    b = TopBuilder("deconv")
    shape = (1, 4, 5, 6) if layout == "NCHW" else (1, 5, 6, 4)
    x = b.input("x", shape)
    outs = []
    for i, (k, s, d, pads, op_pad, bias, relu) in enumerate(itertools.product(
            [(1, 1), (3, 3), (2, 3)], [(1, 1), (2, 2), (1, 2)], [(1, 1), (2, 1)],
            [(0, 0, 0, 0), (1, 1, 1, 1), (0, 1, 2, 0)], [(0, 0), (1, 1)], [True], [None, 6.0])):
        if any(op_pad[j] >= max(s[j], d[j]) for j in range(2)):
            continue
        attrs = dict(kernel_shape=list(k), strides=list(s), pads=list(pads), dilations=list(d),
                     output_padding=list(op_pad), layout=layout, do_relu=relu is not None,
                     relu_limit=-1.0 if relu is None else relu)
        bb = b.weight(f"b{i}", rand(3)) if (bias and i % 2) else b.none()
        outs.append(b.op("Deconv", [x, b.weight(f"w{i}", rand(4, 3, *k)), bb], attrs, f"d{i}"))
    check(b.finish(outs), {"x": rand(*shape)})


def test_grouped_deconv_falls_back_inside_a_lowered_chain():
    b = TopBuilder("deconv")
    x = b.input("x", (1, 4, 6, 7))
    c = b.op("Conv", [x, b.weight("w", rand(4, 4, 3, 3)), b.none()],
             dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), "c")
    d = b.op("Deconv", [c, b.weight("wd", rand(4, 3, 3, 3)), b.weight("bd", rand(6))],
             dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1],
                  group=2), "d")
    r = b.op("Relu", [d], {}, "r")
    check(b.finish([r]), {"x": rand(1, 4, 6, 7)}, fallbacks=["Deconv"])


# ----------------------------------------------------------------------------- element-wise

BROADCAST = [((2, 3, 4, 5), (2, 3, 4, 5)), ((2, 3, 4, 5), (3, 1, 1)), ((2, 3, 4, 5), (5,)),
             ((2, 3, 4, 5), ()), ((1, 3, 1, 5), (2, 1, 4, 1)), ((4, 5), (3, 1, 5))]


@pytest.mark.parametrize("sa,sb", BROADCAST)
def test_binary_broadcast_inputs_and_weights(sa, sb):
    b = TopBuilder("bin")
    a = b.input("a", sa)
    bi = b.input("b", sb)
    bw = b.weight("bw", rand(*sb, lo=0.5, hi=2.0))
    outs = []
    for op in ("Add", "Sub", "Mul", "Div", "Max", "Min"):
        outs.append(b.op(op, [a, bi], {}, f"{op}_in"))
        outs.append(b.op(op, [bw, a], {}, f"{op}_w"))
    for op, lim in itertools.product(("Add", "Sub", "Mul"), (-1.0, 0.5)):
        outs.append(b.op(op, [a, bw], dict(do_relu=True, relu_limit=lim), f"{op}_relu{lim}"))
    check(b.finish(outs), {"a": rand(*sa), "b": rand(*sb, lo=0.5, hi=2.0)})


def test_binary_int64_keeps_dtype():
    b = TopBuilder("int")
    a = b.input("a", (3, 4), "i64")
    c = b.input("c", (4,), "i64")
    outs = [b.op(op, [a, c], {}, op) for op in ("Add", "Sub", "Mul", "Div", "Max", "Min")]
    outs.append(b.op("Neg", [a], {}, "neg"))
    outs.append(b.op("Abs", [a], {}, "abs"))
    check(b.finish(outs), {"a": RNG.integers(-20, 20, (3, 4)),
                           "c": np.array([3, -2, 5, 7], np.int64)})


UNARY = [("Relu", {}), ("Relu", {"relu_limit": 6.0}), ("Relu", {"relu_limit": 0.3}),
         ("Clip", {"min": -0.5, "max": 0.5}), ("Clip", {"min": 0.0, "max": 6.0}),
         ("LeakyRelu", {"alpha": 0.1}), ("Sigmoid", {}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
         ("HardSwish", {}), ("SiLU", {}), ("Tanh", {}), ("Exp", {}), ("Erf", {}), ("Abs", {}),
         ("Neg", {}), ("GELU", {}), ("GELU", {"approximate": "tanh"}), ("Floor", {}), ("Ceil", {}), ("Round", {}),
         ("Sign", {}), ("Sin", {}), ("Cos", {}), ("Softsign", {})]


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (3, 7)])
def test_unary_ops(shape):
    b = TopBuilder("unary")
    x = b.input("x", shape)
    pos = b.input("pos", shape)
    outs = [b.op(op, [x], attrs, f"{op}{i}") for i, (op, attrs) in enumerate(UNARY)]
    outs += [b.op(op, [pos], {}, op) for op in ("Log", "Sqrt")]
    check(b.finish(outs), {"x": rand(*shape, lo=-4, hi=4), "pos": rand(*shape, lo=0.1, hi=5)})


def test_prelu_softmax_reduce():
    b = TopBuilder("misc")
    x = b.input("x", (2, 3, 4, 5))
    m = b.input("m", (2, 10))
    outs = [b.op("PRelu", [x, b.weight("s1", rand(3, 1, 1))], {}, "prelu_bcast"),
            b.op("PRelu", [x, b.weight("s2", rand(3))], {}, "prelu_vec"),
            b.op("PRelu", [m, b.weight("s3", rand(10))], {}, "prelu_2d")]
    for axis, log in itertools.product((-1, 1, 0), (False, True)):
        outs.append(b.op("Softmax", [x], dict(axis=axis, log=log), f"sm{axis}{log}"))
    for op, axes, keep in itertools.product(("ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum"),
                                            ([1], [2, 3], [], [-1]), (True, False)):
        outs.append(b.op(op, [x], dict(axes=axes, keepdims=keep), f"{op}{axes}{keep}"))
    check(b.finish(outs), {"x": rand(2, 3, 4, 5), "m": rand(2, 10)})


def test_layernorm():
    b = TopBuilder("ln")
    x = b.input("x", (2, 3, 4, 5))
    outs = [b.op("LayerNorm", [x, b.weight("g", rand(1, 1, 1, 5)), b.weight("b", rand(1, 1, 1, 5))],
                 {"axes": [3], "eps": 1e-5}, "last"),
            b.op("LayerNorm", [x, b.none(), b.weight("b1", rand(1, 3, 1, 1))], {"axes": [1], "eps": 1e-3}, "chan"),
            b.op("LayerNorm", [x, b.weight("g2", rand(1, 1, 4, 5)), b.none()], {"axes": [-2, -1]}, "two")]
    check(b.finish(outs), {"x": rand(2, 3, 4, 5) * 3 + 1})


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (2, 3), (2, 3, 7)])
def test_batchnorm_scale(shape):
    b = TopBuilder("bn")
    x = b.input("x", shape)
    c = shape[1]
    stats = [b.weight("mean", rand(c)), b.weight("var", rand(c, lo=0.1, hi=2)),
             b.weight("gamma", rand(c)), b.weight("beta", rand(c))]
    outs = [b.op("BatchNorm", [x, *stats], dict(epsilon=eps), f"bn{eps}") for eps in (1e-5, 1e-3)]
    for relu in (False, True):
        outs.append(b.op("Scale", [x, b.weight("s", rand(c)), b.weight("t", rand(c))],
                         dict(do_relu=relu), f"scale{relu}"))
    check(b.finish(outs), {"x": rand(*shape)})


def test_matmul():
    b = TopBuilder("mm")
    a = b.input("a", (4, 8))
    a3 = b.input("a3", (2, 3, 4, 8))
    outs = [b.op("MatMul", [a, b.weight("w", rand(8, 5)), b.none()], {}, "mm"),
            b.op("MatMul", [a, b.weight("wt", rand(5, 8)), b.weight("bias", rand(5))],
                 dict(right_transpose=True, do_relu=True, relu_limit=0.5), "gemm"),
            b.op("MatMul", [a, b.weight("wz", rand(8, 5)), b.weight("zb", np.zeros(5, np.float32))],
                 dict(do_relu=True, relu_limit=6.0), "zero_bias"),
            b.op("MatMul", [a, b.weight("w2", rand(8, 5)), b.weight("b2", rand(1, 5))], {},
                 "row_bias"),
            b.op("MatMul", [a, b.weight("w4", rand(8, 5)), b.weight("b4", rand(4, 5))], {},
                 "full_bias"),
            b.op("MatMul", [b.input("sq", (5, 8)), b.weight("w5", rand(8, 5)),
                            b.weight("b5", rand(5, 1))], {}, "column_bias"),
            b.op("MatMul", [a3, b.weight("w3", rand(3, 8, 6)), b.none()], {}, "batched"),
            b.op("MatMul", [a3, a3, b.none()], dict(right_transpose=True), "dynamic")]
    check(b.finish(outs), {"a": rand(4, 8), "a3": rand(2, 3, 4, 8), "sq": rand(5, 8)})


# ----------------------------------------------------------------------------- pools

@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_pool_sweep(layout):
    b = TopBuilder("pool")
    shape = (1, 3, 8, 9) if layout == "NCHW" else (1, 8, 9, 3)
    x = b.input("x", shape)
    outs = []
    for kind, k, s, pads, ceil, cip in itertools.product(
            ("MaxPool", "AvgPool"), ((2, 2), (3, 3), (2, 3)), ((1, 1), (2, 2), (2, 1)),
            ((0, 0, 0, 0), (1, 1, 1, 1), (0, 1, 1, 0)), (False, True), (False, True)):
        if kind == "MaxPool" and cip:
            continue
        attrs = dict(kernel_shape=list(k), strides=list(s), pads=list(pads), ceil_mode=ceil,
                     count_include_pad=cip, layout=layout)
        outs.append(b.op(kind, [x], attrs, f"{kind}{k}{s}{pads}{ceil}{cip}"))
    outs.append(b.op("MaxPool", [x], dict(kernel_shape=[2, 2], do_relu=True, relu_limit=0.3,
                                          layout=layout), "relu"))
    for kind, keep in itertools.product(("GlobalAvgPool", "GlobalMaxPool"), (True, False)):
        outs.append(b.op(kind, [x], dict(keepdims=keep, layout=layout), f"{kind}{keep}"))
    check(b.finish(outs), {"x": rand(*shape)})


def test_pool_1d_and_3d_fall_back():
    b = TopBuilder("pool1")
    x = b.input("x", (2, 3, 10))
    x3 = b.input("x3", (1, 2, 5, 6, 7))
    outs = [b.op("AvgPool", [x], dict(kernel_shape=[3], strides=[2], pads=[1, 1]), "a1"),
            b.op("MaxPool", [x3], dict(kernel_shape=[2, 2, 2], pads=[1, 0, 1, 0, 1, 0]), "m3")]
    check(b.finish(outs), {"x": rand(2, 3, 10), "x3": rand(1, 2, 5, 6, 7)},
          fallbacks=["AvgPool", "MaxPool"])


# ----------------------------------------------------------------------------- data movement

def test_shape_ops():
    b = TopBuilder("shape")
    x = b.input("x", (2, 8, 4, 6))
    xn = b.input("xn", (2, 4, 6, 8))
    outs = [
        b.op("Reshape", [x], dict(shape=[2, 8, 24]), "reshape"),
        b.op("Flatten", [x], dict(start_dim=1, end_dim=2), "flatten"),
        b.op("Permute", [x], dict(order=[0, 2, 3, 1]), "perm_nhwc"),
        b.op("Permute", [x], dict(order=[3, 1, 0, 2]), "perm_other"),
        b.op("Pad", [x], dict(paddings=[0, 1, 2, 0, 0, 0, 1, 3], mode="constant", val=0.5), "pad_c"),
        b.op("Pad", [x], dict(paddings=[0, 0, 1, 2, 0, 0, 2, 1], mode="reflect"), "pad_r"),
        b.op("Slice", [x], dict(starts=[1, -1, 0], ends=[7, -100, 100], steps=[2, -1, 3],
                                axes=[1, 2, 3]), "slice"),
        b.op("Squeeze", [b.op("Unsqueeze", [x], dict(axes=[0, 3]), "unsq")], dict(axes=[0, 3]),
             "sq"),
        b.op("Gather", [x, b.weight("idx", np.array([[0, -1], [2, 1]], np.int64))], dict(axis=3),
             "gather"),
        b.op("Cast", [x], dict(to="f16"), "f16"),
        b.op("Cast", [b.op("Cast", [x], dict(to="bf16"), "bf16")], dict(to="f32"), "bf16_f32"),
        b.op("Concat", [x, x], dict(axis=2, do_relu=True), "concat"),
    ]
    outs += b.op("Split", [x], dict(axis=1, split_size=[3, 5]), ["s0", "s1"])
    for op, mode, layout in itertools.product(("DepthToSpace", "SpaceToDepth"), ("DCR", "CRD"),
                                              ("NCHW", "NHWC")):
        outs.append(b.op(op, [x if layout == "NCHW" else xn],
                         dict(block_size=2, mode=mode, layout=layout), f"{op}{mode}{layout}"))
    check(b.finish(outs), {"x": rand(2, 8, 4, 6), "xn": rand(2, 4, 6, 8)})


def test_constant_subgraphs_fold():
    b = TopBuilder("fold")
    x = b.input("x", (2, 6))
    w = b.op("Reshape", [b.weight("w", rand(3, 2))], dict(shape=[6]), "w6")
    e = b.op("Exp", [w], {}, "e")
    y = b.op("Add", [x, b.op("Mul", [w, e], {}, "we")], {}, "y")
    check(b.finish([y, e]), {"x": rand(2, 6)})


def test_integer_casts_and_edge_pad_fall_back():
    b = TopBuilder("cast")
    x = b.input("x", (3, 5))
    outs = [b.op("Cast", [x], dict(to="i32"), "i32"),
            b.op("Pad", [x], dict(paddings=[1, 0, 0, 2], mode="edge"), "edge")]
    check(b.finish(outs), {"x": rand(3, 5, lo=-9, hi=9)}, fallbacks=["Cast", "Pad"])


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_resize_sweep(layout):
    b = TopBuilder("resize")
    shape = (1, 3, 5, 7) if layout == "NCHW" else (1, 5, 7, 3)
    x = b.input("x", shape)
    outs = []
    for target, coord in itertools.product(((10, 14), (3, 2), (11, 13), (5, 7)),
                                           ("half_pixel", "align_corners", "asymmetric",
                                            "pytorch_half_pixel")):
        outs.append(b.op("Resize", [x], dict(mode="linear", coord_mode=coord, layout=layout,
                                             target_shape=list(target)), f"lin{target}{coord}"))
        for nearest in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"):
            outs.append(b.op("Resize", [x], dict(mode="nearest", coord_mode=coord, layout=layout,
                                                 nearest_mode=nearest, target_shape=list(target)),
                             f"near{target}{coord}{nearest}"))
    check(b.finish(outs), {"x": rand(*shape)})


# ----------------------------------------------------------------------------- layouts inside

def test_channels_last_chain_from_nhwc_input():
    """tf2onnx's shape: NHWC input -> Permute -> NCHW convs and friends -> Permute back; the
    compiled graph keeps the data channels-last throughout."""
    b = TopBuilder("chain")
    x = b.input("x", (1, 12, 10, 3))
    t = b.op("Permute", [x], dict(order=[0, 3, 1, 2]), "to_nchw")
    c = b.op("Conv", [t, b.weight("w1", rand(8, 3, 3, 3)), b.weight("b1", rand(8))],
             dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], do_relu=True,
                  relu_limit=6.0), "c1")
    bn = b.op("BatchNorm", [c, b.weight("m", rand(8)), b.weight("v", rand(8, lo=0.5)),
                            b.weight("g", rand(8)), b.weight("be", rand(8))], {}, "bn")
    a = b.op("Add", [bn, b.weight("cb", rand(8, 1, 1))], {}, "add_c")
    dw = b.op("Conv", [a, b.weight("wd", rand(8, 1, 3, 3)), b.none()],
              dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=8), "dw")
    r = b.op("Add", [dw, a], dict(do_relu=True), "residual")
    cat = b.op("Concat", [r, c], dict(axis=1), "cat")
    hs = b.op("HardSwish", [cat], {}, "hs")
    mp = b.op("MaxPool", [hs], dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), "mp")
    s0, s1 = b.op("Split", [mp], dict(axis=1, split_size=[10, 6]), ["s0", "s1"])
    sl = b.op("Slice", [s0], dict(starts=[1], ends=[3], axes=[2]), "sl")
    rs = b.op("Resize", [s1], dict(mode="linear", target_shape=[6, 6]), "rs")
    gp = b.op("GlobalAvgPool", [s0], {}, "gp")
    fl = b.op("Flatten", [gp], dict(start_dim=1), "fl")
    fc = b.op("MatMul", [fl, b.weight("fw", rand(10, 4)), b.weight("fb", rand(4))], {}, "fc")
    sm = b.op("Softmax", [fc], dict(axis=1), "sm")
    back = b.op("Permute", [rs], dict(order=[0, 2, 3, 1]), "to_nhwc")
    got = check(b.finish([sm, back, sl]), {"x": rand(1, 12, 10, 3)})
    assert got["sm"].shape == (1, 4)


# ----------------------------------------------------------------------------- the interpreter

def _tiny():
    b = TopBuilder("tiny")
    x = b.input("x", (1, 2, 5, 5))
    c = b.op("Conv", [x, b.weight("w", rand(4, 2, 3, 3)), b.weight("b", rand(4))],
             dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], do_relu=True), "c")
    return b.finish([b.op("GlobalAvgPool", [c], {}, "gp")])


def test_interpreter_backends_agree_and_dump_all_uses_the_per_op_path():
    model = _tiny()
    x = rand(1, 2, 5, 5)
    interp = TopInterpreter(model, backend="compiled")
    got = interp.run({"x": x})
    want = run(model, {"x": x})
    np.testing.assert_allclose(got["gp"], want["gp"], rtol=1e-5, atol=1e-6)
    dump = interp.run({"x": x}, dump_all=True)
    assert set(dump) == {"x", "c", "gp"}
    np.testing.assert_allclose(run(model, {"anything": x}, backend="compiled")["gp"], want["gp"],
                               rtol=1e-5, atol=1e-6)


def test_extra_outputs_return_inner_tensors_beside_the_outputs():
    """What evaluate observes inside the reference (a concat's parts) without the per-op path."""
    model = _tiny()
    x = rand(1, 2, 5, 5)
    got = CompiledTop(model, extra_outputs={"c", "gp"}).run({"x": x})
    want = run(model, {"x": x}, dump_all=True)
    assert list(got) == ["gp", "c"]
    for name in ("c", "gp"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)
    with pytest.raises(errors.ShapeError, match="no tensor named 'nope'"):
        CompiledTop(model, extra_outputs={"nope"})


def test_interpreter_errors():
    with pytest.raises(errors.UsageError, match="backend"):
        TopInterpreter(_tiny(), backend="fast")
    interp = TopInterpreter(_tiny(), backend="compiled")
    with pytest.raises(errors.ShapeError, match="shape"):
        interp.run({"x": rand(1, 2, 5, 6)})
    with pytest.raises(errors.ShapeError, match="do not match"):
        interp.run({"a": rand(1, 2, 5, 5), "b": rand(1)})


def test_compiled_runs_are_deterministic():
    ex = CompiledTop(_tiny())
    x = rand(1, 2, 5, 5)
    a, b = ex.run({"x": x}), ex.run({"x": x})
    assert a["gp"].tobytes() == b["gp"].tobytes()


def test_xla_option_same_outputs_and_off_with_fallbacks():
    model = _tiny()
    x = rand(1, 2, 5, 5)
    ex = CompiledTop(model, jit_compile=True)
    assert ex.jit
    np.testing.assert_allclose(ex.run({"x": x})["gp"], run(model, {"x": x})["gp"],
                               rtol=1e-5, atol=1e-6)
    b = TopBuilder("fb")
    y = b.input("y", (3, 5))
    m = b.finish([b.op("Pad", [y], dict(paddings=[1, 0, 0, 2], mode="edge"), "edge")])
    ex = CompiledTop(m, jit_compile=True)
    assert not ex.jit and ex.fallbacks == ["Pad"]
    np.testing.assert_array_equal(ex.run({"y": rand(3, 5)})["edge"].shape, (4, 7))


def _optimized_op_types(ex, inputs):
    """Op types of the graph TF runs for `ex` after grappler and the oneDNN rewrites (reported
    when the function is first instantiated, i.e. on the first run)."""
    return _graph_op_types(lambda: ex.run(inputs))


def _graph_op_types(call):
    """(`call()`, the op types of the graphs TF instantiates while it runs)."""
    from tensorflow.python.eager import context

    ctx = context.context()
    ctx.enable_run_metadata()
    ctx.export_run_metadata()          # drop what earlier runs left (eager ops are recorded too)
    try:
        out = call()
        md = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    return out, [n.op for fg in md.function_graphs for pg in fg.partition_graphs for n in pg.node]


def _remapper_fuses_depthwise() -> bool:
    """Whether TF's remapper fuses DepthwiseConv2dNative + BiasAdd + Relu6 on this CPU and TF
    build, seen on a one-conv graph."""
    import tensorflow as tf

    w, b = tf.constant(rand(3, 3, 4, 1)), tf.constant(rand(4))

    @tf.function
    def block(x):
        return tf.nn.relu6(tf.nn.bias_add(tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], "VALID"), b))

    _, types = _graph_op_types(lambda: block(tf.constant(rand(1, 6, 6, 4))))
    return any("FusedDepthwiseConv2dNative" in t for t in types)


def _inverted_residual(bias):
    """A MobileNetV2 block (BN folded): 1x1 expand + Relu6, depthwise 3x3 + Relu6 (stride 1 and
    2), 1x1 project, residual Add; `bias`: "none", "zero" or "random" conv biases."""
    b = TopBuilder(f"block_{bias}")
    x = b.input("x", (1, 8, 9, 9))

    def bb(n, i):
        if bias == "none":
            return b.none()
        return b.weight(f"b{i}", np.zeros(n, np.float32) if bias == "zero" else rand(n))
    r6 = dict(do_relu=True, relu_limit=6.0)
    e = b.op("Conv", [x, b.weight("we", rand(24, 8, 1, 1)), bb(24, 0)],
             dict(kernel_shape=[1, 1], **r6), "expand")
    d = b.op("Conv", [e, b.weight("wd", rand(24, 1, 3, 3)), bb(24, 1)],
             dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=24, **r6), "dw")
    p = b.op("Conv", [d, b.weight("wp", rand(8, 24, 1, 1)), bb(8, 2)],
             dict(kernel_shape=[1, 1]), "project")
    y = b.op("Add", [p, x], {}, "add")
    d2 = b.op("Conv", [y, b.weight("wd2", rand(8, 1, 3, 3)), bb(8, 3)],
              dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1], group=8, **r6), "dw2")
    return b.finish([y, d2])


@pytest.mark.parametrize("bias", ["none", "zero", "random"])
def test_conv_bias_relu6_fuse_even_with_zero_or_no_bias(bias):
    """Absent and all-zero conv biases still give Conv+BiasAdd+Relu6 (read from a zeros
    Variable, which grappler cannot fold away) where the remapper fuses the conv: Conv2D
    always, DepthwiseConv2dNative only where TF runs oneDNN (by default only on CPUs with
    AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX). That premise is probed on the CPU at hand (a
    one-conv graph through the remapper) and must be what the lowering assumes (`onednn_fusions`);
    the graph asserted is the one this CPU runs: where depthwise convs do not fuse, they get no
    zero bias (a wasted pass) and keep their own BiasAdd and Relu6."""
    from tftpu.interp.compiled.values import onednn_fusions

    fuses_depthwise = _remapper_fuses_depthwise()
    assert onednn_fusions() == fuses_depthwise
    model = _inverted_residual(bias)
    x = rand(1, 8, 9, 9)
    want = TopInterpreter(model).run({"x": x})
    ex = CompiledTop(model)
    got, types = _optimized_op_types(ex, {"x": x})
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=2e-5)
    assert ex.fallbacks == []
    fused = [o for o in types if "FusedConv2D" in o or "FusedDepthwiseConv2dNative" in o]
    if fuses_depthwise:                            # all four convs, their relus and biases fused
        assert "Relu6" not in types and "BiasAdd" not in types, types
        assert len(fused) == 4, types
    else:                                          # the two Conv2Ds fused, the expand's Relu6 too
        assert len(fused) == 2 and types.count("DepthwiseConv2dNative") == 2, types
        assert types.count("Relu6") == 2, types
        assert types.count("BiasAdd") == (2 if bias == "random" else 0), types
    jit = CompiledTop(model, jit_compile=True)     # a second trace reuses the zeros Variables
    for k, v in jit.run({"x": x}).items():
        np.testing.assert_allclose(v, want[k], rtol=1e-5, atol=2e-5)


def test_conv_bias_from_a_tensor_and_grouped_convs_keep_their_numbers():
    b = TopBuilder("dynbias")
    x = b.input("x", (1, 6, 7, 7))
    bias = b.input("bias", (6,))
    y = b.op("Conv", [x, b.weight("w", rand(6, 6, 3, 3)), bias],
             dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], do_relu=True, relu_limit=6.0), "dyn")
    g = b.op("Conv", [x, b.weight("wg", rand(6, 3, 1, 1)), b.weight("bg", np.zeros(6, np.float32))],
             dict(kernel_shape=[1, 1], group=2, do_relu=True, relu_limit=6.0), "grouped")
    check(b.finish([y, g]), {"x": rand(1, 6, 7, 7, lo=-3, hi=3), "bias": rand(6)})


# ----------------------------------------------------------------------------- real models

@functools.lru_cache(maxsize=None)
def _keras_onnx(name, size):
    """keras.applications `name` (random weights, logits out) exported to ONNX once."""
    import keras

    from tftpu import frontend

    km = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3),
                                           classifier_activation=None)
    return frontend.to_onnx(km)


def test_keras_model_loads_directly():
    import keras

    from tftpu import frontend

    km = keras.applications.MobileNetV2(weights=None, input_shape=(32, 32, 3), alpha=0.35)
    top = frontend.load(km, input_shapes=[[1, 32, 32, 3]])
    check(top, {top.input_names[0]: rand(1, 32, 32, 3)})


@pytest.mark.parametrize("name,size", [("MobileNetV2", 64), ("ResNet50", 32)])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_keras_applications(name, size, layout):
    from tftpu import frontend

    top = frontend.load(_keras_onnx(name, size), name=name)
    if layout == "NHWC":
        from tftpu.transforms.convert_layout import convert_layout
        convert_layout(top, "NHWC")
    x = np.random.default_rng(1).uniform(-1, 1, (1, size, size, 3)).astype(np.float32)
    got = check(top, {top.input_names[0]: x}, tol=1e-5)   # logits: no softmax to hide errors
    if name == "ResNet50" and layout == "NCHW":   # weights captured, not graph constants
        ex = CompiledTop(top, capture_weights=True)
        graph = ex._fn.get_concrete_function().graph.as_graph_def()
        assert graph.ByteSize() < 4_000_000   # ResNet50's ~94 MB of weights stay outside
        again = ex.run({top.input_names[0]: x})
        for k in got:
            np.testing.assert_allclose(again[k], got[k], rtol=1e-4, atol=1e-5 * np.abs(got[k]).max())


def test_selfie_segmentation_tflite():
    from tests import material
    from tftpu import frontend

    top = frontend.load(material.get("selfie_segmentation.tflite"))
    x = material.image("astronaut.png")
    import tensorflow as tf
    x = tf.image.resize(x[None].astype(np.float32) / 255.0, (256, 256)).numpy()
    got = check(top, {top.input_names[0]: x}, tol=5e-5)
    mask = next(iter(got.values()))
    assert 0.05 < float((mask > 0.5).mean()) < 0.95   # a person is found, not everything


def test_every_op_has_a_lowering():
    """Every computing TOP op has a TF lowering (keyed by its full name); graph ops need none."""
    from tftpu.interp.compiled import LOWERINGS
    from tftpu.ir import top

    assert set(top.OPS_BY_NAME) - set(LOWERINGS) == {"top.Input", "top.Weight", "top.None"}
    assert set(LOWERINGS) <= set(top.OPS_BY_NAME)


def test_importing_the_executor_changes_no_environment():
    import os
    import subprocess
    import sys

    code = ("import os; import tftpu.interp.compiled; "
            "print('TF_ONEDNN_THREADPOOL_USE_CALLER_THREAD' in os.environ)")
    env = {k: v for k, v in os.environ.items() if k != "TF_ONEDNN_THREADPOOL_USE_CALLER_THREAD"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "False"


def test_fallbacks_are_named_and_logged(caplog):
    """An op whose lowering declines runs its numpy kernel, and the log says which and why."""
    import logging

    from absl import logging as absl_logging

    b = TopBuilder("fb")
    x = b.input("x", (1, 2, 3))
    m = b.finish([b.op("Conv", [x, b.weight("w", np.ones((2, 2, 1), np.float32)), b.none()],
                       {"kernel_shape": [1]}, "conv1d")])
    absl_logging.set_verbosity(absl_logging.INFO)
    with caplog.at_level(logging.INFO):
        ex = CompiledTop(m)
    assert ex.fallbacks == ["Conv"] and "conv1d" in ex.fallback_notes[0]
    assert any("runs its numpy kernel" in r.getMessage() and "conv1d" in r.getMessage() for r in caplog.records)
