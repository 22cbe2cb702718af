"""Small ONNX graphs built with onnx.helper, and an onnxruntime runner that dumps every tensor."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def model(nodes, inputs, outputs, inits=None, opset=13):
    """An ONNX model: `inputs`/`outputs` are (name, shape) pairs (float32), `inits` name -> array."""
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def run_ort(m, feeds, all_tensors=False):
    """onnxruntime outputs by name (every node output too when `all_tensors`)."""
    if all_tensors:
        m = onnx.shape_inference.infer_shapes(m)
        m = onnx.ModelProto.FromString(m.SerializeToString())
        have = {o.name for o in m.graph.output}
        types = {v.name: v for v in m.graph.value_info}
        for node in m.graph.node:
            for o in node.output:
                if o and o not in have and o in types:
                    m.graph.output.append(types[o])
                    have.add(o)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def rand(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def conv_bn_relu_net(opset=13):
    """conv(3->8, 3x3 s2 SAME_UPPER) + BN + Relu + MaxPool + conv 1x1 + Add + Clip(0,6) + GAP + Flatten + Gemm."""
    r = np.random.default_rng(1)
    inits = {
        "w1": rand(8, 3, 3, 3, seed=2, scale=0.3), "b1": rand(8, seed=3),
        "g": r.uniform(0.5, 1.5, 8).astype(np.float32), "beta": rand(8, seed=4),
        "mean": rand(8, seed=5), "var": r.uniform(0.5, 2, 8).astype(np.float32),
        "w2": rand(8, 8, 1, 1, seed=6, scale=0.3),
        "fc_w": rand(10, 8, seed=7), "fc_b": rand(10, seed=8),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], strides=[2, 2],
                         auto_pad="SAME_UPPER", name="conv1"),
        helper.make_node("BatchNormalization", ["c1", "g", "beta", "mean", "var"], ["bn1"], epsilon=1e-3,
                         name="bn1"),
        helper.make_node("Relu", ["bn1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                         name="pool1"),
        helper.make_node("Conv", ["p1", "w2"], ["c2"], kernel_shape=[1, 1], name="conv2"),
        helper.make_node("Add", ["c2", "p1"], ["a1"], name="add1"),
        helper.make_node("Clip", ["a1", "zero", "six"], ["r6"], name="relu6"),
        helper.make_node("GlobalAveragePool", ["r6"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], axis=1, name="flatten"),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["y"], transB=1, name="fc"),
    ]
    inits["zero"] = np.array(0, np.float32)
    inits["six"] = np.array(6, np.float32)
    return model(nodes, [("x", ["N", 3, 32, 32])], [("y", ["N", 10])], inits, opset)
