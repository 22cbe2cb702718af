"""ONNX -> TOP, one ONNX node at a time: TOP inference must match onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.frontend.onnx_graphs import rand, run_ort
from tftpu.frontend.onnx_to_top import onnx_to_top
from tftpu.interp.top_interpreter import run
from tftpu.transforms.canonicalize import canonicalize


def single(op_type, inputs, consts=None, attrs=None, n_out=1, opset=17):
    """A one-node model: `inputs` name -> shape (float inputs), `consts` name -> array (initializers)."""
    consts = consts or {}
    names = list(inputs) + list(consts)
    order = attrs.pop("_order", names) if attrs else names
    node = helper.make_node(op_type, order, [f"y{i}" for i in range(n_out)], name=f"{op_type}_node",
                            **(attrs or {}))
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(n_out)],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def i64(*v):
    return np.array(v, np.int64)


CASES = [
    ("conv2d_pads", "Conv", {"x": [1, 3, 9, 9]}, {"w": rand(4, 3, 3, 3)}, dict(pads=[1, 0, 2, 1], strides=[2, 1])),
    ("conv2d_same_upper", "Conv", {"x": [1, 3, 10, 9]}, {"w": rand(4, 3, 4, 3)}, dict(auto_pad="SAME_UPPER", strides=[2, 2])),
    ("conv2d_same_lower", "Conv", {"x": [1, 3, 10, 9]}, {"w": rand(4, 3, 4, 4)}, dict(auto_pad="SAME_LOWER", strides=[3, 2])),
    ("conv2d_valid_bias", "Conv", {"x": [2, 3, 8, 8]}, {"w": rand(6, 3, 3, 3), "b": rand(6)}, dict(auto_pad="VALID")),
    ("conv2d_group_dil", "Conv", {"x": [1, 4, 11, 11]}, {"w": rand(8, 2, 3, 3)}, dict(group=2, dilations=[2, 3], pads=[2, 3, 2, 3])),
    ("conv2d_depthwise", "Conv", {"x": [1, 6, 8, 8]}, {"w": rand(6, 1, 3, 3)}, dict(group=6, pads=[1, 1, 1, 1])),
    ("conv1d", "Conv", {"x": [2, 3, 17]}, {"w": rand(5, 3, 4), "b": rand(5)}, dict(strides=[2], pads=[1, 2])),
    ("conv3d", "Conv", {"x": [1, 2, 5, 6, 7]}, {"w": rand(3, 2, 2, 3, 3)}, dict(pads=[0, 1, 1, 1, 1, 0])),
    ("deconv", "ConvTranspose", {"x": [1, 4, 5, 5]}, {"w": rand(4, 3, 3, 3), "b": rand(3)}, dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])),
    ("deconv_group", "ConvTranspose", {"x": [1, 4, 5, 6]}, {"w": rand(4, 2, 4, 4)}, dict(strides=[2, 2], group=2)),
    ("deconv_outshape", "ConvTranspose", {"x": [1, 2, 5, 5]}, {"w": rand(2, 3, 3, 3)}, dict(strides=[2, 2], output_shape=[10, 10])),
    ("gemm_tb", "Gemm", {"a": [3, 5]}, {"b": rand(4, 5), "c": rand(4)}, dict(transB=1)),
    ("gemm_ab", "Gemm", {"a": [5, 3]}, {"b": rand(5, 4), "c": rand(1, 4)}, dict(transA=1, alpha=0.5, beta=2.0)),
    ("matmul_batched", "MatMul", {"a": [2, 3, 4, 5], "b": [3, 5, 6]}, {}, {}),
    ("matmul_w", "MatMul", {"a": [2, 7, 5]}, {"w": rand(5, 3)}, {}),
    ("add_bcast", "Add", {"a": [2, 3, 4], "b": [3, 1]}, {}, {}),
    ("sub_const", "Sub", {"a": [2, 3, 4]}, {"c": rand(4)}, {}),
    ("mul_scalar", "Mul", {"a": [2, 3]}, {"c": np.array(1.5, np.float32)}, {}),
    ("div", "Div", {"a": [2, 3]}, {"c": rand(2, 3, lo=0.5) if False else np.full((2, 3), 1.7, np.float32)}, {}),
    ("max", "Max", {"a": [2, 3], "b": [1, 3]}, {}, {}),
    ("min", "Min", {"a": [2, 3], "b": [2, 1]}, {}, {}),
    ("pow2", "Pow", {"a": [2, 3]}, {"e": np.array(2.0, np.float32)}, {}),
    ("pow3", "Pow", {"a": [2, 3]}, {"e": np.array(3.0, np.float32)}, {}),
    ("pow4", "Pow", {"a": [2, 3]}, {"e": np.array(4.0, np.float32)}, {}),
    ("pow_recip", "Pow", {"a": [2, 3]}, {"e": np.array(-1.0, np.float32)}, {}),
    ("relu", "Relu", {"x": [2, 3, 4]}, {}, {}),
    ("sigmoid", "Sigmoid", {"x": [2, 3, 4]}, {}, {}),
    ("tanh", "Tanh", {"x": [2, 3, 4]}, {}, {}),
    ("exp", "Exp", {"x": [2, 3]}, {}, {}),
    ("erf", "Erf", {"x": [2, 3]}, {}, {}),
    ("abs", "Abs", {"x": [2, 3]}, {}, {}),
    ("neg", "Neg", {"x": [2, 3]}, {}, {}),
    ("hardswish", "HardSwish", {"x": [2, 3, 5]}, {}, {}),
    ("hardsigmoid", "HardSigmoid", {"x": [2, 3, 5]}, {}, dict(alpha=0.3, beta=0.4)),
    ("leakyrelu", "LeakyRelu", {"x": [2, 3, 5]}, {}, dict(alpha=0.2)),
    ("prelu", "PRelu", {"x": [1, 3, 4, 4]}, {"s": rand(3, 1, 1)}, {}),
    ("clip6", "Clip", {"x": [2, 8]}, {"lo": np.array(0, np.float32), "hi": np.array(6, np.float32)}, {}),
    ("clip_max_only", "Clip", {"x": [2, 8]}, {"hi": np.array(0.5, np.float32)}, dict(_order=["x", "", "hi"])),
    ("softmax", "Softmax", {"x": [2, 3, 5]}, {}, dict(axis=1)),
    ("logsoftmax", "LogSoftmax", {"x": [2, 5]}, {}, {}),
    ("softmax11_flattened", "Softmax", {"x": [2, 3, 4]}, {}, dict(axis=1, _opset=11)),
    ("softmax9_squeezenet", "Softmax", {"x": [1, 10, 1, 1]}, {}, dict(axis=1, _opset=9)),
    ("logsoftmax11_axis0", "LogSoftmax", {"x": [2, 3]}, {}, dict(axis=0, _opset=11)),
    ("maxpool", "MaxPool", {"x": [1, 2, 9, 9]}, {}, dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("maxpool_ceil", "MaxPool", {"x": [1, 2, 10, 10]}, {}, dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ("maxpool_same", "MaxPool", {"x": [1, 2, 10, 11]}, {}, dict(kernel_shape=[2, 3], strides=[2, 2], auto_pad="SAME_UPPER")),
    ("avgpool_incl", "AveragePool", {"x": [1, 2, 9, 9]}, {}, dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1)),
    ("avgpool_excl", "AveragePool", {"x": [1, 2, 9, 9]}, {}, dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),
    ("avgpool1d", "AveragePool", {"x": [1, 2, 9]}, {}, dict(kernel_shape=[2], strides=[2])),
    ("gap", "GlobalAveragePool", {"x": [2, 3, 4, 5]}, {}, {}),
    ("gmp", "GlobalMaxPool", {"x": [2, 3, 4, 5]}, {}, {}),
    ("bn", "BatchNormalization", {"x": [2, 3, 4, 4]},
     {"g": rand(3), "b": rand(3), "m": rand(3), "v": np.array([0.5, 1, 2], np.float32)}, dict(epsilon=1e-3)),
    ("concat", "Concat", {"a": [2, 3, 4], "b": [2, 1, 4]}, {"c": rand(2, 2, 4)}, dict(axis=-2)),
    ("reshape", "Reshape", {"x": [2, 3, 4]}, {"s": i64(0, -1, 2)}, {}),
    ("flatten", "Flatten", {"x": [2, 3, 4, 5]}, {}, dict(axis=2)),
    ("transpose", "Transpose", {"x": [2, 3, 4, 5]}, {}, dict(perm=[0, 2, 3, 1])),
    ("pad_const", "Pad", {"x": [1, 2, 4, 4]}, {"p": i64(0, 0, 1, 2, 0, 0, 3, 0), "v": np.array(0.5, np.float32)}, {}),
    ("pad_reflect", "Pad", {"x": [1, 2, 4, 5]}, {"p": i64(0, 0, 2, 1, 0, 0, 1, 3)}, dict(mode="reflect")),
    ("pad_edge", "Pad", {"x": [1, 2, 4, 5]}, {"p": i64(0, 0, 2, 1, 0, 0, 1, 3)}, dict(mode="edge")),
    ("slice", "Slice", {"x": [4, 10, 6]}, {"s": i64(1, -8), "e": i64(100, -1), "a": i64(1, 2), "t": i64(3, 2)}, {}),
    ("slice_neg_step", "Slice", {"x": [4, 10]}, {"s": i64(-2), "e": i64(-100), "a": i64(1), "t": i64(-3)}, {}),
    ("split", "Split", {"x": [2, 7, 3]}, {"s": i64(2, 5)}, dict(axis=1, _n=2)),
    ("squeeze", "Squeeze", {"x": [2, 1, 3, 1]}, {"a": i64(-1)}, {}),
    ("unsqueeze", "Unsqueeze", {"x": [2, 3]}, {"a": i64(0, 3)}, {}),
    ("tile", "Tile", {"x": [2, 3, 1, 4]}, {"r": i64(1, 2, 3, 1)}, {}),
    ("tile_once", "Tile", {"x": [2, 3]}, {"r": i64(1, 1)}, {}),
    ("resize_nearest", "Resize", {"x": [1, 2, 4, 5]}, {"r": np.zeros(0, np.float32), "sc": np.array([1, 1, 2, 2], np.float32)},
     dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")),
    ("resize_bilinear_hp", "Resize", {"x": [1, 2, 4, 6]}, {"r": np.zeros(0, np.float32), "sc": np.array([1, 1, 2, 1.5], np.float32)},
     dict(mode="linear", coordinate_transformation_mode="half_pixel")),
    ("resize_bilinear_ac", "Resize", {"x": [1, 2, 4, 5]}, {"r": np.zeros(0, np.float32), "sc": np.zeros(0, np.float32), "sz": i64(1, 2, 7, 9)},
     dict(mode="linear", coordinate_transformation_mode="align_corners")),
    ("resize_nearest_hp", "Resize", {"x": [1, 2, 6, 6]}, {"r": np.zeros(0, np.float32), "sc": np.zeros(0, np.float32), "sz": i64(1, 2, 4, 9)},
     dict(mode="nearest", coordinate_transformation_mode="half_pixel", nearest_mode="round_prefer_ceil")),
    ("resize_linear_pytorch", "Resize", {"x": [1, 2, 5, 1]}, {"r": np.zeros(0, np.float32), "sc": np.zeros(0, np.float32), "sz": i64(1, 2, 8, 1)},
     dict(mode="linear", coordinate_transformation_mode="pytorch_half_pixel")),
    ("resize_nearest_tf", "Resize", {"x": [1, 2, 4, 6]}, {"r": np.zeros(0, np.float32), "sc": np.zeros(0, np.float32), "sz": i64(1, 2, 7, 3)},
     dict(mode="nearest", coordinate_transformation_mode="tf_half_pixel_for_nn", nearest_mode="ceil")),
    ("resize_linear_asym_down", "Resize", {"x": [1, 2, 9, 8]}, {"r": np.zeros(0, np.float32), "sc": np.zeros(0, np.float32), "sz": i64(1, 2, 4, 5)},
     dict(mode="linear", coordinate_transformation_mode="asymmetric")),
    ("upsample_opset9", "Upsample", {"x": [1, 2, 3, 4]}, {"sc": np.array([1, 1, 2, 3], np.float32)},
     dict(mode="nearest", _opset=9)),
    ("split18_num_outputs", "Split", {"x": [2, 7, 3]}, {}, dict(axis=1, num_outputs=3, _n=3, _opset=18)),
    ("reducemean18", "ReduceMean", {"x": [2, 3, 4]}, {"a": i64(0, -1)}, dict(keepdims=0, _opset=18)),
    ("pad18_axes", "Pad", {"x": [1, 2, 4, 5]}, {"p": i64(1, 2, 0, 3), "v": np.array(0.0, np.float32), "a": i64(2, 3)},
     dict(_opset=18)),
    ("lrn_alexnet", "LRN", {"x": [1, 12, 5, 6]}, {}, dict(size=5, alpha=1e-2, beta=0.75, bias=1.0)),
    ("lrn_wide_beta", "LRN", {"x": [2, 7, 3, 4]}, {}, dict(size=3, alpha=0.3, beta=1.5, bias=2.0)),
    ("lrn_defaults", "LRN", {"x": [1, 3, 4, 4]}, {}, dict(size=1)),
    ("instancenorm", "InstanceNormalization", {"x": [2, 3, 4, 5]}, {"s": rand(3), "b": rand(3)}, dict(epsilon=1e-3)),
    ("softplus", "Softplus", {"x": [2, 7]}, {}, {}),
    ("mish", "Mish", {"x": [2, 3, 4, 4]}, {}, dict(_opset=18)),
    ("elu", "Elu", {"x": [2, 7]}, {}, dict(alpha=0.7)),
    ("selu", "Selu", {"x": [2, 7]}, {}, {}),
    *((op.lower(), op, {"x": [2, 3, 5]}, {}, {}) for op in ("Floor", "Ceil", "Round", "Sign", "Sin", "Cos", "Softsign")),
    ("lpnorm_axis1", "LpNormalization", {"x": [2, 6, 3]}, {}, dict(axis=1, p=2)),
    ("reducel2", "ReduceL2", {"x": [2, 6, 3]}, {}, dict(axes=[1, 2], keepdims=0, _opset=13)),
    ("reducesumsquare18", "ReduceSumSquare", {"x": [2, 6, 3]}, {"a": i64(-1)}, dict(_opset=18)),
    ("mean3", "Mean", {"x": [2, 3], "y": [2, 3], "z": [1, 3]}, {}, {}),
    ("reducemean", "ReduceMean", {"x": [2, 3, 4]}, {}, dict(axes=[1, 2], keepdims=1, _opset=13)),
    ("reducesum", "ReduceSum", {"x": [2, 3, 4]}, {"a": i64(-1)}, dict(keepdims=0)),
    ("reducemax", "ReduceMax", {"x": [2, 3, 4]}, {}, dict(axes=[0], _opset=13)),
    ("s2d", "SpaceToDepth", {"x": [1, 3, 4, 6]}, {}, dict(blocksize=2)),
    ("d2s_crd", "DepthToSpace", {"x": [1, 8, 2, 3]}, {}, dict(blocksize=2, mode="CRD")),
    ("d2s_dcr", "DepthToSpace", {"x": [1, 8, 2, 3]}, {}, dict(blocksize=2, mode="DCR")),
    ("gather", "Gather", {"x": [5, 4, 3]}, {"i": i64(4, 0, 2)}, dict(axis=1 - 1)),
    ("gather_scalar", "Gather", {"x": [2, 5, 3]}, {"i": np.array(-1, np.int64)}, dict(axis=1)),
    ("identity", "Identity", {"x": [2, 3]}, {}, {}),
    ("layernorm_last", "LayerNormalization", {"x": [2, 3, 5]}, {"s": rand(5), "b": rand(5)}, dict(epsilon=1e-3)),
    ("layernorm_axis1", "LayerNormalization", {"x": [2, 3, 4, 5]}, {"s": rand(3, 4, 5)}, dict(axis=1)),
    ("expand_rank_up", "Expand", {"x": [3, 1]}, {"s": i64(2, 1, 3, 4)}, {}),
    ("expand_inner", "Expand", {"x": [1, 4, 1]}, {"s": i64(2, 4, 5)}, {}),
    ("expand_same", "Expand", {"x": [2, 3]}, {"s": i64(1, 3)}, {}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("canon", [False, True], ids=["raw", "canon"])
def test_single_op_matches_onnxruntime(case, canon):
    model, feeds, want, _ = case_model(case)
    top = onnx_to_top(model, "m")
    if canon:
        canonicalize(top)
    assert_matches(run(top, feeds), want)


def case_model(case):
    """(one-node model, input feeds, onnxruntime outputs, number of outputs) of a CASES entry."""
    _, op_type, inputs, consts, attrs = case
    attrs = dict(attrs)
    n_out = attrs.pop("_n", 1)
    opset = attrs.pop("_opset", 17)
    model = single(op_type, inputs, consts, attrs, n_out, opset)
    feeds = {n: rand(*s, seed=k + 1) for k, (n, s) in enumerate(inputs.items())}
    return model, feeds, run_ort(model, feeds), n_out


def assert_matches(got: dict, want: dict) -> None:
    """Same output names and shapes as onnxruntime, values within 2e-5 (relative to each output's scale)."""
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].shape == want[k].shape, k
        scale = max(float(np.abs(want[k]).max()), 1e-6)
        np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=2e-5 * scale, err_msg=k)


@pytest.mark.parametrize("opset", [11, 12, 13])
def test_shape_subgraph_is_folded(opset):
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape becomes one static Reshape, each op folded
    in the model's own opset (before 13 Unsqueeze takes `axes` as an attribute: ddddocr's model)."""
    unsqueeze = (helper.make_node("Unsqueeze", ["n"], ["n1"], axes=[0]) if opset < 13 else
                 helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"]))
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        unsqueeze,
        helper.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(i64(0)[0], "zero"), numpy_helper.from_array(i64(0), "axes0"),
                     numpy_helper.from_array(i64(-1), "minus1")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    top = onnx_to_top(m, "m", [[5, 3, 4]])
    assert [op.op_name for op in top.ops] == ["Input", "Reshape"]
    assert top.ops[-1].attrs()["shape"] == [5, 12]
    x = rand(5, 3, 4)
    np.testing.assert_array_equal(run(top, {"x": x})["y"], x.reshape(5, 12))


def loop_model(body_reads: str):
    """y = x + (a Loop of 3 trips adding `body_reads` to a zero carry), the body reading
    `body_reads` from the graph around it (as Keras's LSTM while-loop reads its inputs)."""
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", body_reads], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [2, 3])])
    nodes = [helper.make_node("Loop", ["trips", "true", "zero"], ["acc"], name="my_loop", body=body),
             helper.make_node("Add", ["x", "acc"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(i64(3)[0], "trips"), numpy_helper.from_array(np.array(True), "true"),
                     numpy_helper.from_array(np.zeros((2, 3), np.float32), "zero"),
                     numpy_helper.from_array(np.full((2, 3), 0.5, np.float32), "half")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def test_a_loop_over_constants_folds_and_one_over_a_runtime_tensor_is_refused():
    from tftpu.errors import UnsupportedOpError
    top = onnx_to_top(loop_model("half"), "m")
    assert [op.op_name for op in top.ops] == ["Input", "Weight", "Add"]
    x = rand(2, 3)
    np.testing.assert_allclose(run(top, {"x": x})["y"], x + 1.5)
    with pytest.raises(UnsupportedOpError, match=r"Loop \(my_loop\)"):
        onnx_to_top(loop_model("x"), "m")          # its body reads the input: not a constant


def test_dropout_declaring_a_mask_nothing_reads_is_an_identity():
    """Old exports (squeezenet, vgg19 at opset 9) declare Dropout's mask; only a mask that is read
    is refused."""
    from tftpu.errors import UnsupportedOpError
    for read in (False, True):
        nodes = [helper.make_node("Dropout", ["x"], ["d", "mask"], ratio=0.5), helper.make_node("Relu", ["d"], ["y"])]
        outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
        if read:
            outs.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, None))
        m = helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])], outs),
                              opset_imports=[helper.make_opsetid("", 9)])
        m.ir_version = 8
        if read:
            with pytest.raises(UnsupportedOpError, match="Dropout mask output is read"):
                onnx_to_top(m, "m")
            continue
        top = onnx_to_top(m, "m")
        x = rand(2, 3)
        np.testing.assert_array_equal(run(top, {"x": x})["y"], np.maximum(x, 0))
