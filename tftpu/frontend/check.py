"""Check an imported TOP model against its source: every shared tensor, by name.

The source side is onnxruntime on the ONNX model with every node output exposed (and, for a
TF/TFLite source, TF itself for the model outputs); the TOP side is the TOP interpreter.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from tftpu.errors import ModelFileError, ShapeError


def onnx_tensors(proto, inputs: dict, all_tensors: bool = True) -> dict[str, np.ndarray]:
    """onnxruntime results by tensor name: graph outputs, plus every node output if `all_tensors`."""
    import onnx
    import onnxruntime as ort

    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    if all_tensors:
        try:
            inferred = onnx.shape_inference.infer_shapes(proto)
        except Exception:  # shape inference is only used to type the extra outputs
            inferred = proto
        have = {o.name for o in proto.graph.output}
        types = {v.name: v for v in inferred.graph.value_info}
        for node in proto.graph.node:
            for o in node.output:
                if o and o not in have and o in types and types[o].type.tensor_type.elem_type:
                    proto.graph.output.append(types[o])
                    have.add(o)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    sess = ort_session(proto, so)
    consts = {i.name for i in proto.graph.initializer}
    feeds = bind_inputs([(i.name, tuple(i.shape), i.type) for i in sess.get_inputs() if i.name not in consts],
                        inputs)
    names = [o.name for o in sess.get_outputs()]
    try:
        return dict(zip(names, sess.run(names, feeds)))
    except Exception as e:  # onnxruntime raises its own Fail/InvalidArgument on a model it cannot run
        raise ModelFileError("the ONNX model", f"onnxruntime cannot run it: {_first_line(e)}") from None


def ort_session(proto, options):
    """An onnxruntime CPU session of `proto` (changed in place where its IR version is newer than
    this onnxruntime reads: the pinned onnx writes 14 by default, and such a model is read at the
    newest version onnxruntime knows, its ops and types being the same); a model onnxruntime still
    refuses is a ModelFileError."""
    import onnxruntime as ort

    for _ in range(2):
        try:
            return ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime's Fail / InvalidGraph / NotImplemented
            newest = re.search(r"Unsupported model IR version: (\d+), max supported IR version: (\d+)", str(e))
            if newest is None or int(newest.group(2)) >= proto.ir_version:
                raise ModelFileError("the ONNX model", f"onnxruntime cannot load it: {_first_line(e)}") from None
            proto.ir_version = int(newest.group(2))
    raise AssertionError("unreachable")


def _first_line(e: Exception) -> str:
    """onnxruntime's message without its source location prefix, on one line, shortened."""
    text = " ".join(str(e).split())
    return re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : (\S+\.(cc|h):\d+ \S.*?\) )?", "", text)[:300]


_ORT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
              "tensor(int32)": np.int32, "tensor(uint8)": np.uint8, "tensor(int8)": np.int8,
              "tensor(double)": np.float64, "tensor(bool)": np.bool_}


def bind_inputs(specs, inputs: dict) -> dict[str, np.ndarray]:
    """Match `inputs` to (name, shape, type) specs by name, else by order; cast to the input type."""
    from tftpu.utils.inputs import match_inputs, numeric

    arrays = match_inputs([s[0] for s in specs], inputs)
    out = {}
    for (name, shape, typ), arr in zip(specs, arrays):
        arr = numeric(name, arr)
        if len(arr.shape) != len(shape) or any(isinstance(d, int) and d != a for d, a in zip(shape, arr.shape)):
            raise ShapeError(f"input {name!r} has shape {list(arr.shape)}, the model wants {list(shape)}")
        out[name] = arr.astype(_ORT_TYPES.get(typ, arr.dtype), copy=False)
    return out


def tf_outputs(model_def, kind: str, inputs: dict, onnx_outputs: list[str]) -> dict[str, np.ndarray]:
    """The source framework's own outputs (TFLite interpreter, Keras, SavedModel), keyed by ONNX output name."""
    arrays = list(inputs.values())
    if kind == "tflite":
        import warnings

        import tensorflow as tf
        with warnings.catch_warnings():  # tf.lite.Interpreter's deprecation notice: it is still the reference
            warnings.simplefilter("ignore", UserWarning)
            interp = tf.lite.Interpreter(model_path=str(model_def))
        interp.allocate_tensors()
        for det, arr in zip(interp.get_input_details(), arrays):
            interp.set_tensor(det["index"], np.asarray(arr).astype(det["dtype"]))
        interp.invoke()
        outs = {d["name"]: interp.get_tensor(d["index"]) for d in interp.get_output_details()}
        return {n: outs[n] for n in onnx_outputs if n in outs}
    if kind == "keras":
        import keras
        model = model_def if not isinstance(model_def, (str, Path)) else \
            keras.models.load_model(str(model_def), compile=False, safe_mode=True)
        res = model(arrays if len(arrays) > 1 else arrays[0], training=False)
    elif kind == "saved_model":
        import tensorflow as tf
        fn = tf.saved_model.load(str(model_def)).signatures["serving_default"]
        _, kw = fn.structured_input_signature
        res = fn(**{n: tf.constant(a) for n, a in zip(sorted(kw), arrays)})
        res = [res[k] for k in sorted(res)]
    else:
        return {}
    res = res if isinstance(res, (list, tuple)) else [res]
    return {n: np.asarray(r) for n, r in zip(onnx_outputs, res)}


def compare(ref: dict, got: dict, tolerance=(0.99, 0.99)):
    """`tftpu.interp.similarity.Comparison` of every tensor both hold, in `got`'s (TOP) order."""
    from tftpu.interp.similarity import compare_tensors
    shared = [k for k in got if k in ref]
    return compare_tensors({k: ref[k] for k in shared}, {k: got[k] for k in shared}, tolerance)


def table(result, names=("reference", "TOP")) -> str:
    """The per-tensor table of a comparison."""
    from tftpu.interp.similarity import format_table
    return format_table(result, names)
