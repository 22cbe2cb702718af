"""Run one ONNX node in onnxruntime: the reference the kernel tests compare against."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

ort.set_default_logger_severity(3)
from onnx import helper, numpy_helper

_DTYPES = {np.dtype(np.float32): onnx.TensorProto.FLOAT, np.dtype(np.int64): onnx.TensorProto.INT64,
           np.dtype(np.int32): onnx.TensorProto.INT32, np.dtype(np.float16): onnx.TensorProto.FLOAT16,
           np.dtype(np.int8): onnx.TensorProto.INT8, np.dtype(np.uint8): onnx.TensorProto.UINT8}


def run_node(op_type, inputs, attrs=None, n_outputs=1, opset=18, initializers=None,
             output_dtype=None, domain=""):
    """Outputs of a single `op_type` node on `inputs` (a list of arrays, None = omitted input).

    `initializers` maps input index -> array given as a constant (e.g. Resize sizes).
    """
    initializers = initializers or {}
    names, graph_inputs, feeds, inits = [], [], {}, []
    for i, x in enumerate(inputs):
        if x is None and i not in initializers:
            names.append("")
            continue
        name = f"in{i}"
        names.append(name)
        if i in initializers:
            inits.append(numpy_helper.from_array(np.asarray(initializers[i]), name))
            continue
        x = np.asarray(x)
        graph_inputs.append(helper.make_tensor_value_info(name, _DTYPES[x.dtype], x.shape))
        feeds[name] = x
    outs = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, names, outs, domain=domain, **(attrs or {}))
    graph = helper.make_graph([node], "g", graph_inputs, [], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    inferred = {v.name: v.type.tensor_type.elem_type for v in
                onnx.shape_inference.infer_shapes(model).graph.value_info}
    for o in outs:
        model.graph.output.append(helper.make_tensor_value_info(
            o, output_dtype or inferred.get(o, onnx.TensorProto.FLOAT), None))
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def assert_close(got, want, rtol=1e-5, atol=1e-5, what=""):
    """float32 round-off agreement: |got - want| <= atol * max|want| + rtol * |want|."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if want.dtype.kind in "iub":
        assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol,
                               atol=atol * max(scale, 1e-30) + 1e-30, err_msg=what)
