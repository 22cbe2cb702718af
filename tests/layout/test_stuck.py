"""The cases where TVM's ConvertLayout and tf2onnx's transpose optimizer get stuck: Reshape and
Flatten that merge or split axes, MatMul/Gemm after a flatten (the weight rows are permuted
instead of the data), SpaceToDepth/DepthToSpace; plus reuse of one transform per value."""

from __future__ import annotations

import numpy as np
import pytest

from tftpu.ir import top
from tftpu.ir.module import TopBuilder
from tftpu.transforms import layout_rules as R
from tests.layout.helpers import TO_NCHW, TO_NHWC, convert_and_compare, permutes, randn


def _conv(b, x, cin, cout, name, k=3, layout="NCHW"):
    w = b.weight(f"{name}_w", randn((cout, cin, k, k), hash(name) % 100))
    return b.op("Conv", [x, w, b.weight(f"{name}_b", randn((cout,), 7))],
                {"kernel_shape": [k, k], "pads": [k // 2] * 4, "layout": layout}, name)


@pytest.mark.parametrize("target", ["NHWC", "NCHW"])
def test_reshape_merge_and_split_pass_through(target):
    """conv -> reshape [N,C,H*W] -> softmax over C -> reshape back -> conv: no transpose inside."""
    b = TopBuilder("rs")
    x = b.input("x", (1, 4, 6, 8))
    y = _conv(b, x, 4, 6, "c1")
    y = b.op("Reshape", [y], {"shape": [1, 6, 48]}, "merge")
    y = b.op("Softmax", [y], {"axis": 1}, "sm")
    y = b.op("Reshape", [y], {"shape": [1, 6, 6, 8]}, "split")
    y = b.op("Reshape", [y], {"shape": [1, 2, 3, 6, 8]}, "split_c")
    y = b.op("ReduceMax", [y], {"axes": [1], "keepdims": False}, "red")
    y = _conv(b, y, 3, 5, "c2")
    new, rep = convert_and_compare(b.finish([y]), layout=target)
    assert rep.inside == 0
    assert len(permutes(new)) == (2 if target == "NHWC" else 0)


def test_reshape_layout_function():
    # merge H,W of an NHWC-laid-out NCHW tensor: physical [N,H*W,C]
    phys, out, scr = R.reshape_layout((1, 4, 6, 8), (1, 4, 48), (0, 2, 3, 1))
    assert phys == (1, 48, 4) and out == (0, 2, 1) and scr is None
    # merge C,H: not contiguous in NHWC order -> impossible without a transpose
    assert R.reshape_layout((1, 4, 6, 8), (1, 24, 8), (0, 2, 3, 1)) is None
    # flatten C,H,W in NHWC order: the last axis is scrambled (MatMul trick)
    phys, out, scr = R.reshape_layout((1, 4, 6, 8), (1, 192), (0, 2, 3, 1))
    assert phys == (1, 192) and scr == ([2, 3, 1], [1, 2, 3])
    # size-1 axes move freely
    phys, out, scr = R.reshape_layout((1, 5, 1, 1), (1, 5), (0, 2, 3, 1))
    assert phys == (1, 5) and out == (0, 1) and scr is None


def test_channel_shuffle_is_still_exact():
    """A reshape-permute-reshape channel shuffle cannot pass: it stays a real transpose, exact."""
    for target in ("NHWC", "NCHW"):
        new, rep = convert_and_compare(_shuffle_model(), layout=target)
        assert rep.permutes_after <= rep.permutes_before + 2


def _shuffle_model():
    b = TopBuilder("shuffle")
    x = b.input("x", (1, 8, 6, 6))
    y = _conv(b, x, 8, 8, "c1")
    y = b.op("Reshape", [y], {"shape": [1, 2, 4, 6, 6]}, "r1")
    y = b.op("Permute", [y], {"order": [0, 2, 1, 3, 4]}, "shuffle")
    y = b.op("Reshape", [y], {"shape": [1, 8, 6, 6]}, "r2")
    return b.finish([_conv(b, y, 8, 4, "c2")])


@pytest.mark.parametrize("flatten", ["Reshape", "Flatten"])
@pytest.mark.parametrize("right_transpose", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_flatten_matmul_permutes_weight_rows(flatten, right_transpose, bias):
    """PyTorch-style NCHW conv -> flatten -> Gemm, converted to NHWC: the flatten reads NHWC
    memory and the Gemm's weight rows are permuted at compile time; no transpose before it."""
    b = TopBuilder("fc")
    x = b.input("x", (2, 3, 6, 5))
    y = _conv(b, x, 3, 4, "c1")
    if flatten == "Reshape":
        y = b.op("Reshape", [y], {"shape": [2, 120]}, "flat")
    else:
        y = b.op("Flatten", [y], {"start_dim": 1, "end_dim": -1}, "flat")
    w = b.weight("fc_w", randn((10, 120) if right_transpose else (120, 10), 5))
    bb = b.weight("fc_b", randn((10,), 6)) if bias else b.none()
    y = b.op("MatMul", [y, w, bb], {"right_transpose": right_transpose}, "fc")
    y2 = b.op("MatMul", [y, b.weight("fc2_w", randn((10, 3), 8)), b.none()], {}, "fc2")
    new, rep = convert_and_compare(b.finish([y2]), layout="NHWC")
    assert len(permutes(new)) == 1 and rep.at_inputs == 1   # only the model input
    mm = [op for op in new.ops if isinstance(op, top.MatMul)][0]
    assert isinstance(mm.operands[0].owner, top.Reshape)
    assert any("weight rows" in n for n in rep.notes)


def test_keras_flatten_dense_to_nchw():
    """Keras-style NHWC flatten (tf2onnx puts a transpose before it) converted to NCHW."""
    b = TopBuilder("keras_fc")
    x = b.input("x", (1, 6, 5, 3))
    y = b.op("Permute", [x], {"order": TO_NCHW}, "x_t")
    y = _conv(b, y, 3, 4, "c1")
    y = b.op("Permute", [y], {"order": TO_NHWC}, "c1_t")
    y = b.op("Reshape", [y], {"shape": [1, 120]}, "flat")
    y = b.op("MatMul", [y, b.weight("fc_w", randn((120, 7), 5)), b.weight("fc_b", randn((7,), 6))], {}, "fc")
    new, rep = convert_and_compare(b.finish([y]), layout="NCHW")
    assert rep.permutes_before == 2 and len(permutes(new)) == 1 and rep.at_inputs == 1


def test_flatten_with_other_users_falls_back():
    b = TopBuilder("fc")
    x = b.input("x", (1, 3, 4, 4))
    y = _conv(b, x, 3, 2, "c1")
    f = b.op("Reshape", [y], {"shape": [1, 32]}, "flat")
    m = b.op("MatMul", [f, b.weight("fc_w", randn((32, 4), 5)), b.none()], {}, "fc")
    r = b.op("Relu", [f], {}, "flat_relu")
    new, rep = convert_and_compare(b.finish([m, r]), layout="NHWC")
    assert not any("weight rows" in n for n in rep.notes)   # flatten feeds a Relu too: exact fallback


@pytest.mark.parametrize("target", ["NHWC", "NCHW"])
@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_space_to_depth_between_convs(target, mode):
    """tf2onnx wraps TF's NHWC SpaceToDepth/DepthToSpace in transposes: all of them go."""
    b = TopBuilder("s2d")
    x = b.input("x", (1, 8, 8, 3))
    y = b.op("Permute", [x], {"order": TO_NCHW}, "x_t")
    y = _conv(b, y, 3, 4, "c1")
    y = b.op("Permute", [y], {"order": TO_NHWC}, "c1_nhwc")
    y = b.op("Permute", [y], {"order": TO_NCHW}, "c1_nchw")
    y = b.op("SpaceToDepth", [y], {"block_size": 2, "mode": mode}, "s2d")
    y = _conv(b, y, 16, 8, "c2")
    y = b.op("DepthToSpace", [y], {"block_size": 2, "mode": mode}, "d2s")
    y = _conv(b, y, 2, 2, "c3")
    y = b.op("Permute", [y], {"order": TO_NHWC}, "out")
    new, rep = convert_and_compare(b.finish([y]), layout=target)
    assert rep.permutes_before == 4
    assert len(permutes(new)) == (0 if target == "NHWC" else 2) and rep.inside == 0


def test_transform_reused_per_value():
    """One NCHW value read by three NHWC convs is transposed once."""
    b = TopBuilder("reuse")
    x = b.input("x", (1, 4, 6, 6))
    ys = [_conv(b, x, 4, 2, f"c{i}") for i in range(3)]
    s = b.op("Add", [b.op("Add", [ys[0], ys[1]], {}, "s1"), ys[2]], {}, "s2")
    new, rep = convert_and_compare(b.finish([s]), layout="NHWC")
    assert rep.inserted == 2 and len(permutes(new)) == 2  # x in, s2 out


def test_desired_layouts_validation():
    from tftpu.errors import UsageError
    from tftpu.transforms.convert_layout import ConvertLayout
    for bad in ({"top.Relu": ["NHWC"]}, {"top.Conv": ["NCWH"]}, {"top.Conv": ["NHWC", "IOHW"]},
                {"top.Conv": []}):
        with pytest.raises(UsageError):
            ConvertLayout(bad)
    ConvertLayout({"Conv": "NHWC", "top.MaxPool": ["default"]})


@pytest.mark.parametrize("target", ["NCHW", "NHWC"])
def test_transpose_hoisted_above_normalizing_prologue(target):
    """Keras' Rescaling/Normalization run on NHWC input before tf2onnx's transpose: the one
    transpose NCHW needs moves up to the model input (constants are re-laid-out)."""
    b = TopBuilder("prologue")
    x = b.input("x", (1, 6, 8, 3))
    y = b.op("Mul", [x, b.weight("scale", np.array([0.5, 2.0, 1.5], np.float32))], {}, "rescale")
    y = b.op("Sub", [y, b.weight("mean", randn((1, 1, 1, 3), 4))], {}, "center")
    y = b.op("Sigmoid", [y], {}, "squash")
    y = b.op("Permute", [y], {"order": TO_NCHW}, "x_t")
    y = _conv(b, y, 3, 4, "c1")
    new, rep = convert_and_compare(b.finish([y]), layout=target)
    if target == "NCHW":
        assert len(permutes(new)) == 1 and rep.at_inputs == 1
        assert isinstance(permutes(new)[0].operands[0].owner, top.Input)
    else:
        assert len(permutes(new)) == 1 and rep.at_outputs == 1


def test_layout_changed_tensors_are_renamed():
    """A tensor now held in another layout gets a new name, so by-name checks stay valid."""
    from tftpu.interp.top_interpreter import run
    from tests.layout.helpers import clone, inputs_for
    b = TopBuilder("names")
    x = b.input("x", (1, 3, 6, 6))
    y = b.op("Relu", [_conv(b, x, 3, 4, "c1")], {}, "act")
    model = b.finish([_conv(b, y, 4, 2, "c2")])
    new = clone(model)
    from tftpu.transforms.convert_layout import convert_layout
    convert_layout(new, layout="NHWC")
    feeds = inputs_for(model)
    a, c = run(model, feeds, dump_all=True), run(new, feeds, dump_all=True)
    shared = set(a) & set(c)
    assert {"x", "c2"} <= shared and "c1" not in c and "c1_nhwc" in c
    for k in shared:
        np.testing.assert_allclose(a[k], c[k], rtol=1e-5, atol=1e-5)
