"""Each op rule, checked numerically: NHWC data reaches the op through a tf2onnx-style Permute;
after the pass the Permute is gone, the op's axis/pad/layout attributes are rewritten and the
outputs equal the original ones."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tftpu.ir import top
from tftpu.ir.module import TopBuilder
from tests.layout.helpers import TO_NCHW, convert_and_compare, feeder, permutes, randn, wrapped

PERMS4 = [TO_NCHW, [0, 2, 3, 1], [0, 1, 3, 2], [3, 2, 1, 0], [1, 0, 2, 3]]


def _absorbed(model, op_name):
    """The op under test reads the model input directly: its input Permute was absorbed."""
    op, src = feeder(model, op_name)
    assert isinstance(src, (top.Input, top.Reshape)), f"{op_name} is fed by {src.name}"
    return op


@pytest.mark.parametrize("perm", PERMS4)
@pytest.mark.parametrize("op_name,attrs", [
    ("Relu", {}), ("Sigmoid", {}), ("Clip", {"min": -0.5, "max": 0.5}), ("HardSwish", {}),
    ("LeakyRelu", {"alpha": 0.2}), ("GELU", {}), ("Cast", {"to": "f16"}),
])
def test_agnostic_unary(op_name, attrs, perm):
    model = wrapped(op_name, attrs, perm=perm)
    new, rep = convert_and_compare(model, desired={}, atol=1e-3 if op_name == "Cast" else 1e-5)
    _absorbed(new, op_name)
    assert not permutes(new) and rep.absorbed == 2


@pytest.mark.parametrize("perm", PERMS4)
@pytest.mark.parametrize("other_shape,const", [
    ((1, 4, 6, 8), False),   # same rank, runtime
    ((4, 1, 1), True),       # per-channel constant (NCHW broadcast)
    ((8,), True),            # last-axis constant
    ((1, 1, 1, 1), True),    # scalar-like
    ((6, 8), False),         # lower-rank runtime operand: reshaped + permuted
])
@pytest.mark.parametrize("op_name", ["Add", "Mul", "Sub", "Max"])
def test_binary_broadcast(op_name, other_shape, const, perm):
    logical = tuple(np.array([1, 6, 8, 4])[perm])   # shape after the input permute
    b = TopBuilder("bin")
    x = b.input("x", (1, 6, 8, 4))
    xp = b.op("Permute", [x], {"order": perm}, "x_t")
    shape = tuple(logical[len(logical) - len(other_shape) + i] if d != 1 else 1
                  for i, d in enumerate(other_shape))
    other = b.weight("c", randn(shape, 3)) if const else b.input("z", shape)
    y = b.op(op_name, [xp, other], {}, "y")
    model = b.finish([b.op("Permute", [y], {"order": [int(v) for v in np.argsort(perm)]}, "out")])
    new, _ = convert_and_compare(model, desired={})
    _absorbed(new, op_name)
    if const:
        assert not permutes(new)
    elif len(other_shape) == 4 and perm != [0, 1, 2, 3]:
        assert len(permutes(new)) <= 1   # z (the minority layout) is transposed once at most


@pytest.mark.parametrize("perm", PERMS4[:3])
def test_prelu_slope_follows(perm):
    logical = tuple(np.array([1, 6, 8, 4])[perm])
    model = wrapped("PRelu", {}, perm=perm,
                    extra=[lambda b: b.weight("slope", randn((logical[1], 1, 1), 2))])
    new, _ = convert_and_compare(model, desired={})
    _absorbed(new, "PRelu")
    assert not permutes(new)


@pytest.mark.parametrize("perm", PERMS4)
@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1])
def test_concat_axis(axis, perm):
    b = TopBuilder("cat")
    x = b.input("x", (2, 6, 8, 4))
    z = b.input("z", (2, 6, 8, 4))
    xp = b.op("Permute", [x], {"order": perm}, "x_t")
    zp = b.op("Permute", [z], {"order": perm}, "z_t")
    c = b.op("Concat", [xp, zp, xp], {"axis": axis}, "y")
    model = b.finish([b.op("Permute", [c], {"order": [int(v) for v in np.argsort(perm)]}, "out")])
    new, _ = convert_and_compare(model, desired={})
    op = _absorbed(new, "Concat")
    assert op.attrs()["axis"] == perm[axis % 4]
    assert not permutes(new)


def test_concat_mixed_layouts_majority():
    """Two NHWC inputs and one NCHW input: the odd one is transposed, once."""
    b = TopBuilder("cat")
    x = b.input("x", (1, 6, 8, 4))
    z = b.input("z", (1, 6, 8, 4))
    w = b.input("w", (1, 4, 6, 8))
    c = b.op("Concat", [b.op("Permute", [x], {"order": TO_NCHW}, "xt"),
                        b.op("Permute", [z], {"order": TO_NCHW}, "zt"), w], {"axis": 1}, "y")
    new, rep = convert_and_compare(b.finish([c]), desired={})
    assert len(permutes(new)) == 2   # w into NHWC, the result back to the NCHW output


@pytest.mark.parametrize("perm", PERMS4)
@pytest.mark.parametrize("axis", [1, 2, 3])
def test_softmax_axis(axis, perm):
    new, _ = convert_and_compare(wrapped("Softmax", {"axis": axis}, perm=perm), desired={})
    assert _absorbed(new, "Softmax").attrs()["axis"] == perm[axis]
    assert not permutes(new)


@pytest.mark.parametrize("perm", PERMS4[:3])
@pytest.mark.parametrize("op_name", ["ReduceMean", "ReduceMax", "ReduceSum", "ReduceMin"])
@pytest.mark.parametrize("axes,keepdims", [([1], True), ([2, 3], True), ([2, 3], False), ([1], False),
                                          ([0, 2], False)])
def test_reduce_axes(op_name, axes, keepdims, perm):
    model = wrapped(op_name, {"axes": axes, "keepdims": keepdims}, perm=perm, back=keepdims)
    new, _ = convert_and_compare(model, desired={})
    op = _absorbed(new, op_name)
    assert op.attrs()["axes"] == sorted(perm[a] for a in axes)
    if keepdims:
        assert not permutes(new)


@pytest.mark.parametrize("perm", PERMS4)
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_paddings(mode, perm):
    pads = [0, 1, 2, 0, 0, 3, 1, 2]
    new, _ = convert_and_compare(wrapped("Pad", {"paddings": pads, "mode": mode, "val": 0.5}, perm=perm),
                                 desired={})
    op = _absorbed(new, "Pad")
    state = [int(v) for v in np.argsort(perm)]  # physical axis i holds logical axis state[i]
    assert op.attrs()["paddings"] == [pads[a] for a in state] + [pads[a + 4] for a in state]
    assert not permutes(new)


@pytest.mark.parametrize("perm", PERMS4)
def test_slice_axes(perm):
    attrs = {"starts": [1, 0, -3], "ends": [100, 3, -1], "steps": [2, 1, 1], "axes": [2, 1, 3]}
    new, _ = convert_and_compare(wrapped("Slice", attrs, perm=perm), desired={})
    assert _absorbed(new, "Slice").attrs()["axes"] == [perm[a] for a in (2, 1, 3)]
    assert not permutes(new)


@pytest.mark.parametrize("perm", PERMS4)
@pytest.mark.parametrize("axis", [1, 2, 3])
def test_split_axis(axis, perm):
    dim = np.array([1, 6, 8, 4])[perm][axis]
    sizes = [1, dim - 1]
    new, _ = convert_and_compare(wrapped("Split", {"axis": axis, "split_size": sizes}, perm=perm), desired={})
    _absorbed(new, "Split")
    assert not permutes(new)


@pytest.mark.parametrize("perm", PERMS4[:3])
def test_squeeze_unsqueeze(perm):
    model = wrapped("Squeeze", {"axes": [perm.index(0)]}, perm=perm, back=False)
    new, _ = convert_and_compare(model, desired={})
    _absorbed(new, "Squeeze")
    for axes in ([0], [1, 4], [2], [0, 5]):
        model = wrapped("Unsqueeze", {"axes": axes}, perm=perm, back=False)
        new, _ = convert_and_compare(model, desired={})
        _absorbed(new, "Unsqueeze")


@pytest.mark.parametrize("perm", PERMS4[:3])
@pytest.mark.parametrize("idx_shape", [(), (3,)])
def test_gather_axis(perm, idx_shape):
    idx = np.array(2) if idx_shape == () else np.array([0, 2, 1])
    model = wrapped("Gather", {"axis": 2}, perm=perm, back=False,
                    extra=[lambda b: b.weight("idx", idx.astype(np.int64))])
    new, _ = convert_and_compare(model, desired={})
    assert _absorbed(new, "Gather").attrs()["axis"] == perm[2]


def _per_channel(b, n=4):
    return [b.weight(f"p{i}", np.abs(randn((n,), i)) + 0.5) for i in range(4)]


@pytest.mark.parametrize("op_name", ["BatchNorm", "Scale"])
def test_per_channel_layout_attr(op_name):
    b = TopBuilder("pc")
    x = b.input("x", (1, 6, 8, 4))
    xp = b.op("Permute", [x], {"order": TO_NCHW}, "x_t")
    params = _per_channel(b)
    y = b.op(op_name, [xp, *(params if op_name == "BatchNorm" else params[:2])], {}, "y")
    model = b.finish([b.op("Permute", [y], {"order": [0, 2, 3, 1]}, "out")])
    new, _ = convert_and_compare(model, desired={})
    assert _absorbed(new, op_name).attrs()["layout"] == "NHWC"
    assert not permutes(new)


@pytest.mark.parametrize("mode,coord", [("nearest", "asymmetric"), ("linear", "half_pixel"),
                                        ("linear", "align_corners")])
def test_resize_follows_nhwc(mode, coord):
    model = wrapped("Resize", {"mode": mode, "coord_mode": coord, "nearest_mode": "floor",
                               "target_shape": [12, 16]})
    new, _ = convert_and_compare(model, desired={})
    assert _absorbed(new, "Resize").attrs()["layout"] == "NHWC"
    assert not permutes(new)


# ---------------------------------------------------------------- heavy ops

@pytest.mark.parametrize("target", ["NHWC", "NCHW"])
@pytest.mark.parametrize("kernel", ["default", "OIHW", "HWIO"])
@pytest.mark.parametrize("group,stride,pads", [(1, 1, [1, 1, 1, 1]), (1, 2, [0, 1, 1, 0]), (4, 1, [1, 0, 1, 2]),
                                               (2, 2, [1, 1, 1, 1])])
def test_conv_desired(target, kernel, group, stride, pads):
    b = TopBuilder("conv")
    x = b.input("x", (1, 6, 8, 4))
    xp = b.op("Permute", [x], {"order": TO_NCHW}, "x_t")
    w = b.weight("w", randn((8, 4 // group, 3, 3), 1))
    bias = b.weight("bias", randn((8,), 2))
    y = b.op("Conv", [xp, w, bias], {"kernel_shape": [3, 3], "strides": [stride, stride], "pads": pads,
                                    "group": group}, "y")
    y2 = b.op("Conv", [y, b.weight("w2", randn((5, 8, 1, 1), 3)), b.none()],
              {"kernel_shape": [1, 1], "do_relu": True}, "y2")
    model = b.finish([b.op("Permute", [y2], {"order": [0, 2, 3, 1]}, "out")])
    new, rep = convert_and_compare(model, desired={"top.Conv": [target, kernel]})
    convs = [op for op in new.ops if isinstance(op, top.Conv)]
    want_k = {"default": "HWIO" if target == "NHWC" else "OIHW"}.get(kernel, kernel)
    assert all(c.attrs()["layout"] == target and c.attrs()["kernel_layout"] == want_k for c in convs)
    # NHWC: nothing to transpose; NCHW: one at the input and one at the output
    assert len(permutes(new)) == (0 if target == "NHWC" else 2)
    assert rep.at_inputs + rep.at_outputs == len(permutes(new))


def test_conv_runtime_weight_is_transposed_at_run_time():
    b = TopBuilder("conv")
    x = b.input("x", (1, 4, 6, 8))
    w = b.input("w", (8, 4, 3, 3))
    y = b.op("Conv", [x, w, b.none()], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, "y")
    new, rep = convert_and_compare(b.finish([y]), desired={"top.Conv": ["NHWC", "HWIO"]})
    assert len(permutes(new)) == 3  # x in, w to HWIO, y out


@pytest.mark.parametrize("op_name,attrs", [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("AvgPool", {"kernel_shape": [2, 3], "strides": [1, 2], "pads": [0, 1, 1, 0], "count_include_pad": True}),
    ("AvgPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": True}),
    ("GlobalAvgPool", {"keepdims": True}),
    ("GlobalMaxPool", {"keepdims": True}),
    ("SpaceToDepth", {"block_size": 2, "mode": "DCR"}),
    ("SpaceToDepth", {"block_size": 2, "mode": "CRD"}),
    ("DepthToSpace", {"block_size": 2, "mode": "DCR"}),
    ("DepthToSpace", {"block_size": 2, "mode": "CRD"}),
])
@pytest.mark.parametrize("target", ["NHWC", "NCHW"])
def test_window_ops_desired(op_name, attrs, target):
    model = wrapped(op_name, attrs, nhwc_shape=(1, 6, 8, 8))
    new, _ = convert_and_compare(model, desired={f"top.{op_name}": [target]})
    op, _src = feeder(new, op_name)
    assert op.attrs()["layout"] == target
    # NCHW: a transpose in; out too, except [N,C,1,1] which is reshaped for free
    assert len(permutes(new)) == (0 if target == "NHWC" else 1 if op_name.startswith("Global") else 2)


@pytest.mark.parametrize("target", ["NHWC", "NCHW"])
def test_deconv_desired(target):
    b = TopBuilder("deconv")
    x = b.input("x", (1, 5, 6, 4))
    xp = b.op("Permute", [x], {"order": TO_NCHW}, "x_t")
    y = b.op("Deconv", [xp, b.weight("w", randn((4, 3, 3, 3), 1)), b.weight("bias", randn((3,), 2))],
             {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 0, 0], "output_padding": [1, 0]}, "y")
    model = b.finish([b.op("Permute", [y], {"order": [0, 2, 3, 1]}, "out")])
    new, _ = convert_and_compare(model, desired={"top.Deconv": [target]})
    assert len(permutes(new)) == (0 if target == "NHWC" else 2)


@pytest.mark.parametrize("perm", list(itertools.permutations(range(4)))[::5])
def test_permute_chains_cancel(perm):
    """tf2onnx-style Permute pairs around every op collapse; a real transpose stays one."""
    inv = [int(v) for v in np.argsort(perm)]
    b = TopBuilder("chain")
    x = b.input("x", (1, 6, 8, 4))
    v = x
    for i in range(4):
        v = b.op("Permute", [v], {"order": list(perm)}, f"p{i}")
        v = b.op("Relu" if i % 2 else "Sigmoid", [v], {}, f"a{i}")
        v = b.op("Permute", [v], {"order": inv}, f"q{i}")
    v = b.op("Permute", [v], {"order": [0, 1, 3, 2]}, "real")
    new, rep = convert_and_compare(b.finish([v]), desired={})
    assert rep.permutes_before == 9
    assert len(permutes(new)) == 1 and rep.inside == 0   # hoisted to the input


@pytest.mark.parametrize("target", ["NHWC", "NCHW"])
def test_batchnorm_desired(target):
    b = TopBuilder("bn")
    x = b.input("x", (1, 4, 6, 8))
    y = b.op("BatchNorm", [x, *_per_channel(b)], {"epsilon": 1e-3}, "bn")
    new, _ = convert_and_compare(b.finish([y]), desired={"top.BatchNorm": [target]})
    assert feeder(new, "BatchNorm")[0].attrs()["layout"] == target
    assert len(permutes(new)) == (2 if target == "NHWC" else 0)


@pytest.mark.parametrize("perm", PERMS4)
@pytest.mark.parametrize("axes", [[1], [2, 3], [3]])
def test_layernorm_axes_and_affine_follow(axes, perm):
    """LayerNorm's axes move with the layout, and its full-rank scale/bias are transposed too."""
    shape = [(1, 6, 8, 4)[p] for p in perm]  # the logical shape after the Permute
    affine = [1 if a not in axes else shape[a] for a in range(4)]
    extra = [lambda b: b.weight("g", randn(affine, 1) + 1), lambda b: b.weight("beta", randn(affine, 2))]
    model = wrapped("LayerNorm", {"axes": axes, "eps": 1e-3}, perm=perm, extra=extra)
    new, _ = convert_and_compare(model, desired={})
    assert _absorbed(new, "LayerNorm").attrs()["axes"] == sorted(perm[a] for a in axes)
    assert not permutes(new)
