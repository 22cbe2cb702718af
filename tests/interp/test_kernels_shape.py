"""Data-movement, Resize and reduction kernels against onnxruntime."""

import itertools

import ml_dtypes
import numpy as np
import onnx
import pytest

from tftpu.interp.kernels import KERNELS
from tftpu.ir.top import FLOPS
from tests.interp.onnx_ref import assert_close, run_node

RNG = np.random.default_rng(3)


def _rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# ----------------------------------------------------------------------------- Resize

COORD = ["half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel",
         "tf_half_pixel_for_nn"]
NEAREST = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
SIZES = [(8, 3), (10, 14), (3, 2), (5, 7), (1, 1), (11, 13), (15, 21), (2, 9)]


def _resize_check(x, target, mode, coord, nearest="round_prefer_floor"):
    opset = 13 if coord == "tf_half_pixel_for_nn" else 18
    sizes = np.array(list(x.shape[:2]) + list(target), np.int64)
    oattrs = dict(mode=mode, coordinate_transformation_mode=coord, nearest_mode=nearest)
    want = run_node("Resize", [x, None, None, sizes], oattrs, opset=opset,
                    initializers={3: sizes})[0]
    attrs = dict(mode=mode, coord_mode=coord, nearest_mode=nearest, target_shape=list(target))
    what = f"Resize {attrs} x{x.shape}"
    assert_close(KERNELS["top.Resize"]([x], attrs)[0], want, rtol=1e-5, atol=1e-6, what=what)
    got = KERNELS["top.Resize"]([np.moveaxis(x, 1, -1)], dict(attrs, layout="NHWC"))[0]
    assert_close(got, np.moveaxis(want, 1, -1), rtol=1e-5, atol=1e-6, what="NHWC " + what)


@pytest.mark.parametrize("coord", [c for c in COORD if c != "tf_half_pixel_for_nn"])
@pytest.mark.parametrize("target", SIZES)
def test_resize_linear(coord, target):
    _resize_check(_rand(2, 3, 5, 7), target, "linear", coord)


@pytest.mark.parametrize("coord,nearest", list(itertools.product(COORD, NEAREST)))
def test_resize_nearest(coord, nearest):
    x = _rand(1, 2, 5, 7)
    for target in SIZES:
        _resize_check(x, target, "nearest", coord, nearest)


@pytest.mark.parametrize("coord,nearest", list(itertools.product(COORD, NEAREST)))
def test_resize_nearest_index_sweep(coord, nearest):
    """Every (in, out) size pair up to 12 -> 24 on H (and out -> in on W): same picks as ORT."""
    opset = 13 if coord == "tf_half_pixel_for_nn" else 18
    oattrs = dict(mode="nearest", coordinate_transformation_mode=coord, nearest_mode=nearest)
    for i in range(1, 13):
        for o in range(1, 25):
            x = (np.arange(i)[:, None] * 100 + np.arange(o)[None, :]).astype(np.float32)
            x = x.reshape(1, 1, i, o)
            sizes = np.array([1, 1, o, i], np.int64)
            want = run_node("Resize", [x, None, None, sizes], oattrs, opset=opset,
                            initializers={3: sizes})[0]
            got = KERNELS["top.Resize"]([x], dict(mode="nearest", coord_mode=coord,
                                              nearest_mode=nearest, target_shape=[o, i]))[0]
            np.testing.assert_array_equal(got, want, err_msg=f"{coord} {nearest} {i}->{o}")


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_3d_spatial(mode):
    x = _rand(1, 2, 3, 4, 5)
    sizes = np.array([1, 2, 6, 3, 9], np.int64)
    want = run_node("Resize", [x, None, None, sizes], dict(mode=mode), initializers={3: sizes})[0]
    got = KERNELS["top.Resize"]([x], dict(mode=mode, coord_mode="half_pixel",
                                      nearest_mode="round_prefer_floor", target_shape=[6, 3, 9]))[0]
    assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_resize_flops():
    assert FLOPS["top.Resize"]([(1, 2, 4, 4)], [(1, 2, 8, 8)], {"mode": "linear"}) == 128 * 6
    assert FLOPS["top.Resize"]([(1, 2, 4, 4)], [(1, 2, 8, 8)], {"mode": "nearest"}) == 0


# ----------------------------------------------------------------------------- blocks

@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("b,shape", [(2, (2, 8, 3, 4)), (3, (1, 18, 2, 2)), (2, (1, 4, 1, 1))])
def test_depth_to_space(mode, b, shape):
    x = _rand(*shape)
    want = run_node("DepthToSpace", [x], dict(blocksize=b, mode=mode))[0]
    assert_close(KERNELS["top.DepthToSpace"]([x], dict(block_size=b, mode=mode))[0], want)
    got = KERNELS["top.DepthToSpace"]([np.moveaxis(x, 1, -1)], dict(block_size=b, mode=mode,
                                                                layout="NHWC"))[0]
    assert_close(got, np.moveaxis(want, 1, -1))
    # DepthToSpace inverts SpaceToDepth in the same mode
    back = KERNELS["top.SpaceToDepth"]([want], dict(block_size=b, mode=mode))[0]
    np.testing.assert_array_equal(back, x)


@pytest.mark.parametrize("b,shape", [(2, (2, 3, 4, 6)), (3, (1, 2, 6, 3)), (4, (1, 1, 4, 8))])
def test_space_to_depth(b, shape):
    x = _rand(*shape)
    want = run_node("SpaceToDepth", [x], dict(blocksize=b))[0]
    assert_close(KERNELS["top.SpaceToDepth"]([x], dict(block_size=b))[0], want)
    got = KERNELS["top.SpaceToDepth"]([np.moveaxis(x, 1, -1)], dict(block_size=b, layout="NHWC"))[0]
    assert_close(got, np.moveaxis(want, 1, -1))
    import tensorflow as tf  # NHWC order is TF's space_to_depth order
    np.testing.assert_array_equal(got, tf.nn.space_to_depth(np.moveaxis(x, 1, -1), b).numpy())


# ----------------------------------------------------------------------------- shape ops

@pytest.mark.parametrize("axis", [0, 1, -1, 2])
def test_concat(axis):
    xs = [_rand(2, 3, 4), _rand(2, 3, 4), _rand(2, 3, 4)]
    want = run_node("Concat", xs, dict(axis=axis))[0]
    assert_close(KERNELS["top.Concat"](xs, dict(axis=axis))[0], want)
    assert_close(KERNELS["top.Concat"](xs, dict(axis=axis, do_relu=True))[0], np.maximum(want, 0))
    ints = [np.array([1, 2], np.int64), np.array([3], np.int64)]
    assert KERNELS["top.Concat"](ints, dict(axis=0))[0].dtype == np.int64


@pytest.mark.parametrize("shape,new", [((2, 3, 4), [6, 4]), ((2, 3, 4), [2, -1]),
                                       ((24,), [1, 2, 3, 4]), ((1, 2048, 1, 1), [1, 2048])])
def test_reshape(shape, new):
    x = _rand(*shape)
    want = run_node("Reshape", [x, np.array(new, np.int64)], initializers={1: np.array(new)})[0]
    assert_close(KERNELS["top.Reshape"]([x], dict(shape=new))[0], want)
    assert FLOPS["top.Reshape"]([shape], [want.shape], {}) == 0


@pytest.mark.parametrize("shape,start,end,onnx_axis", [
    ((2, 3, 4, 5), 1, -1, 1), ((2, 3, 4, 5), 1, 3, 1), ((2, 3, 4), 2, 2, None),
    ((2, 3, 4, 5), 0, 1, None), ((2, 3, 4, 5), 1, 2, None)])
def test_flatten(shape, start, end, onnx_axis):
    x = _rand(*shape)
    got = KERNELS["top.Flatten"]([x], dict(start_dim=start, end_dim=end))[0]
    if onnx_axis is not None:
        assert_close(got, run_node("Flatten", [x], dict(axis=onnx_axis))[0])
    e = end % len(shape)
    assert got.shape == shape[:start] + (int(np.prod(shape[start:e + 1])),) + shape[e + 1:]
    np.testing.assert_array_equal(got.ravel(), x.ravel())


@pytest.mark.parametrize("order", [[0, 2, 3, 1], [0, 3, 1, 2], [3, 2, 1, 0], [1, 0, 2, 3]])
def test_permute(order):
    x = _rand(2, 3, 4, 5)
    want = run_node("Transpose", [x], dict(perm=order))[0]
    got = KERNELS["top.Permute"]([x], dict(order=order))[0]
    assert_close(got, want)
    assert got.flags.c_contiguous


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("pads", [[0, 0, 1, 2, 0, 0, 2, 1], [1, 0, 0, 3, 0, 1, 2, 0],
                                  [0, 0, -1, 1, 0, 0, 2, -2]])
def test_pad(mode, pads):
    x = _rand(2, 3, 5, 6)
    p = np.array(pads, np.int64)
    want = run_node("Pad", [x, p, np.float32(1.5)], dict(mode=mode),
                    initializers={1: p, 2: np.float32(1.5)})[0]
    got = KERNELS["top.Pad"]([x], dict(paddings=pads, mode=mode, val=1.5))[0]
    assert_close(got, want, what=f"Pad {mode} {pads}")


SLICES = [([1], [3], [1], [1]), ([0, 1], [2, -1], [0, 2], [1, 2]), ([-1], [-100], [2], [-1]),
          ([10], [-10], [3], [-2]), ([2], [2 ** 62], [1], [1]), ([0], [-1], [3], [1]),
          ([-2, 0], [0, 5], [3, 1], [-1, 2]), ([4], [-(2 ** 62)], [2], [-3]),
          ([-100], [100], [0], [1])]


@pytest.mark.parametrize("starts,ends,axes,steps", SLICES)
def test_slice(starts, ends, axes, steps):
    x = _rand(3, 4, 5, 6)
    init = {i + 1: np.array(v, np.int64) for i, v in enumerate([starts, ends, axes, steps])}
    want = run_node("Slice", [x, 0, 0, 0, 0], initializers=init)[0]
    got = KERNELS["top.Slice"]([x], dict(starts=starts, ends=ends, axes=axes, steps=steps))[0]
    assert_close(got, want, what=f"Slice {starts} {ends} {axes} {steps}")


@pytest.mark.parametrize("axis,sizes", [(1, [1, 2]), (-1, [2, 2, 1]), (0, [4])])
def test_split(axis, sizes):
    x = _rand(4, 3, 5)
    s = np.array(sizes, np.int64)
    want = run_node("Split", [x, s], dict(axis=axis), n_outputs=len(sizes), initializers={1: s})
    got = KERNELS["top.Split"]([x], dict(axis=axis, split_size=sizes))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_close(g, w)


@pytest.mark.parametrize("shape,axes", [((1, 3, 1, 5), [0]), ((1, 3, 1, 5), [0, 2]),
                                        ((1, 3, 1, 5), [-2]), ((1, 3, 1, 1), [])])
def test_squeeze(shape, axes):
    x = _rand(*shape)
    init = {1: np.array(axes, np.int64)} if axes else {}
    want = run_node("Squeeze", [x, 0] if axes else [x], initializers=init)[0]
    assert_close(KERNELS["top.Squeeze"]([x], dict(axes=axes))[0], want)


@pytest.mark.parametrize("axes", [[0], [1, 3], [-1], [0, -1], [4, 0]])
def test_unsqueeze(axes):
    x = _rand(3, 4, 5)
    want = run_node("Unsqueeze", [x, 0], initializers={1: np.array(axes, np.int64)})[0]
    assert_close(KERNELS["top.Unsqueeze"]([x], dict(axes=axes))[0], want)


@pytest.mark.parametrize("to,onnx_to", [("f32", 1), ("f16", 10), ("bf16", 16), ("i8", 3),
                                        ("u8", 2), ("i32", 6), ("i64", 7)])
def test_cast(to, onnx_to):
    x = np.concatenate([np.linspace(-100, 100, 81, dtype=np.float32),
                        np.array([0.5, -0.5, 1.5, 2.5, -2.7, 3.14159], np.float32)])
    if to == "u8":
        x = np.abs(x)
    got = KERNELS["top.Cast"]([x], dict(to=to))[0]
    if to == "bf16":  # numpy cannot take bfloat16 out of onnxruntime: cast back to f32 there
        want = _run_cast_chain(x, [onnx_to, onnx.TensorProto.FLOAT])
        assert got.dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(got.astype(np.float32), want)
    else:
        want = run_node("Cast", [x], dict(to=onnx_to))[0]
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def _run_cast_chain(x, types):
    import onnxruntime as ort
    from onnx import helper
    nodes = [helper.make_node("Cast", [f"t{i}"], [f"t{i + 1}"], to=t) for i, t in enumerate(types)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("t0", onnx.TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info(f"t{len(types)}", types[-1], x.shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"t0": x})[0]


@pytest.mark.parametrize("axis,idx", [(0, [[0, 2], [1, -1]]), (1, [3, 0, -2]), (-1, 2),
                                      (2, [[1]])])
def test_gather(axis, idx):
    x = _rand(3, 4, 5)
    i = np.array(idx, np.int64)
    want = run_node("Gather", [x, i], dict(axis=axis))[0]
    assert_close(KERNELS["top.Gather"]([x, i], dict(axis=axis))[0], want)
    xi = (x * 10).astype(np.int64)
    np.testing.assert_array_equal(KERNELS["top.Gather"]([xi, i], dict(axis=axis))[0],
                                  run_node("Gather", [xi, i], dict(axis=axis))[0])


# ----------------------------------------------------------------------------- reductions

@pytest.mark.parametrize("op", ["ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum"])
@pytest.mark.parametrize("axes,keep", [([1], True), ([2, 3], False), ([-1], True), ([], False),
                                       ([0, 2], True)])
def test_reduce(op, axes, keep):
    x = _rand(2, 3, 4, 5)
    init = {1: np.array(axes, np.int64)} if axes else {}
    want = run_node(op, [x, 0] if axes else [x], dict(keepdims=int(keep)), initializers=init)[0]
    got = KERNELS[f"top.{op}"]([x], dict(axes=axes, keepdims=keep))[0]
    assert_close(got, want, rtol=1e-5, atol=1e-6, what=f"{op} {axes} {keep}")
    assert FLOPS[f"top.{op}"]([x.shape], [want.shape], {}) == x.size
