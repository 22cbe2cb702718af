"""TensorFlow -> ONNX through tf2onnx: Keras models, SavedModels, tf.functions and .tflite files.

Everything keeps TF's own layout (NHWC inputs); the TOP importer sees the transposes tf2onnx
inserts and canonicalization merges them. TensorFlow is imported lazily.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import struct
import tempfile
import warnings
from pathlib import Path

from tftpu import geometry
from tftpu.errors import ModelFileError, UnsupportedOpError, UsageError
from tftpu.utils import quiet

DEFAULT_OPSET = 17
_OPSETS = range(13, 18)


def _tf2onnx():
    from tftpu import compat
    compat.install()
    quiet.import_tensorflow()
    import tf2onnx

    from tftpu.frontend import tf2onnx_ext
    tf2onnx_ext.install()
    logging.getLogger("tf2onnx").setLevel(logging.CRITICAL)
    return tf2onnx


def _check_opset(opset: int) -> int:
    if opset not in _OPSETS:
        raise UsageError(f"opset {opset} is not supported; use {_OPSETS.start}..{_OPSETS.stop - 1}")
    return opset


@contextlib.contextmanager
def _quiet():
    """tf2onnx prints progress on stdout/stderr; keep tools' output clean. Its TFLite reader
    builds a `tf.lite.Interpreter` for tensor details, whose deprecation notice and native
    "Created TensorFlow Lite XNNPACK delegate" line are not the user's to act on (tftpu runs
    `.tflite` files through LiteRT: `tftpu.lite.runtime`); `TFTPU_VERBOSE=1` shows the native lines."""
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings(), quiet.native_stderr_silenced():
        warnings.filterwarnings("ignore", message=r"(?s).*tf\.lite\.Interpreter is deprecated", category=UserWarning)
        yield


_GENERATED = r"__\d+(:\d+)?$"


def _digest(*parts) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else str(part).encode())
        h.update(b"\0")
    return h.hexdigest()[:8]


def _stable_names(proto) -> None:
    """Rename what tf2onnx generated (`Transpose__308:0`, `const_fold_opt__374`) by what it is.

    tf2onnx numbers the tensors it creates with process-wide counters, and its optimizer does
    not always leave the same helper nodes (a no-op Reshape, one run in three), so neither the
    counters nor the order are stable. An initializer is named by a digest of its contents, a
    node output by a digest of its op, attributes, renamed inputs and output index
    (`<base>__<8 hex>`), so the same model always exports with the same names.
    """
    import re
    pattern = re.compile(_GENERATED)
    graph = proto.graph
    rename: dict[str, str] = {}
    taken: set[str] = set()

    def assign(name: str, digest: str) -> None:
        base = pattern.sub("", name)
        new = f"{base}__{digest}"
        k = 1
        while new in taken:
            new, k = f"{base}__{digest}_{k}", k + 1
        taken.add(new)
        rename[name] = new

    for t in graph.initializer:
        if pattern.search(t.name) and t.name not in rename:
            body = type(t)()
            body.CopyFrom(t)
            body.name = ""
            assign(t.name, _digest(body.SerializeToString(deterministic=True)))
    for node in graph.node:
        inputs = [rename.get(n, n) for n in node.input]
        attrs = [a.SerializeToString(deterministic=True) for a in sorted(node.attribute, key=lambda a: a.name)]
        for i, name in enumerate(node.output):
            if name and name not in rename and pattern.search(name):
                assign(name, _digest(node.domain, node.op_type, *attrs, "|", *inputs, "|", i))
    if not rename:
        return
    for node in graph.node:
        node.input[:] = [rename.get(n, n) for n in node.input]
        node.output[:] = [rename.get(n, n) for n in node.output]
    for coll in (graph.initializer,):
        for t in coll:
            t.name = rename.get(t.name, t.name)
    for coll in (graph.input, graph.output, graph.value_info):
        for vi in coll:
            vi.name = rename.get(vi.name, vi.name)


def _check_unconverted(proto, where: str):
    """tf2onnx leaves TF ops it cannot convert in the graph (continue_on_error); report them all."""
    bad = [(n.op_type, n.name) for n in proto.graph.node if n.domain not in ("", "ai.onnx")]
    if bad:
        raise UnsupportedOpError(bad, where)
    return proto


def _signature(specs, input_shapes):
    import tensorflow as tf
    sig = []
    for i, spec in enumerate(specs):
        shape = list(spec.shape)
        if input_shapes is not None:
            if i >= len(input_shapes) or len(input_shapes[i]) != len(shape):
                raise UsageError(f"--input_shapes {input_shapes} does not fit input {i} of shape {shape}")
            shape = list(input_shapes[i])
        else:
            shape = [1 if d is None else d for d in shape]
        name = (spec.name or f"input_{i}").split(":")[0]
        sig.append(tf.TensorSpec(shape, spec.dtype, name=name))
    return sig


def _keras_input_name(tensor, i: int) -> str:
    """The Input layer's name (what users call the input), else the tensor's name."""
    history = getattr(tensor, "_keras_history", None)
    name = history[0].name if history else getattr(tensor, "name", None)
    return name or f"input_{i}"


def keras_to_onnx(model, input_shapes=None, opset: int = DEFAULT_OPSET):
    """ONNX ModelProto of a Keras model (static shapes: batch 1 unless `input_shapes`)."""
    import tensorflow as tf
    specs = [tf.TensorSpec(t.shape, t.dtype, name=_keras_input_name(t, i)) for i, t in enumerate(model.inputs)]
    sig = _signature(specs, input_shapes)

    @tf.function(input_signature=sig)
    def forward(*args):
        out = model(list(args) if len(args) > 1 else args[0], training=False)
        return out

    return function_to_onnx(forward, sig, opset)


def function_to_onnx(fn, input_signature, opset: int = DEFAULT_OPSET):
    """ONNX ModelProto of a `tf.function` traced with `input_signature` (a list of TensorSpec)."""
    tf2onnx = _tf2onnx()
    with _quiet():
        proto, _ = tf2onnx.convert.from_function(fn, input_signature=list(input_signature),
                                                 opset=_check_opset(opset))
    _freeze_captures(proto, fn.get_concrete_function(*input_signature))
    _stable_names(proto)
    return _check_unconverted(proto, getattr(fn, "__name__", "tf.function"))


def _freeze_captures(proto, concrete) -> None:
    """tf2onnx turns constants a function captures (e.g. Keras Normalization's mean) into graph
    inputs; make them initializers so the model's inputs are only the real ones."""
    from onnx import numpy_helper
    n_args = len(concrete.inputs) - len(concrete.captured_inputs)
    values = {}
    for ph, cap in zip(concrete.inputs[n_args:], concrete.captured_inputs):
        if cap.dtype.name != "resource":
            values[ph.name] = cap.numpy()
    keep = [i for i in proto.graph.input if i.name not in values]
    moved = [i.name for i in proto.graph.input if i.name in values]
    if not moved:
        return
    del proto.graph.input[:]
    proto.graph.input.extend(keep)
    proto.graph.initializer.extend(numpy_helper.from_array(values[n], n) for n in moved)


def saved_model_to_onnx(path, input_shapes=None, opset: int = DEFAULT_OPSET, signature: str = "serving_default"):
    """ONNX ModelProto of a SavedModel's serving signature."""
    import tensorflow as tf
    path = Path(path)
    if not (path / "saved_model.pb").is_file():
        raise ModelFileError(path, "not a SavedModel directory (no saved_model.pb)")
    try:
        loaded = tf.saved_model.load(str(path))
    except Exception as e:  # TF raises many error types for a corrupt SavedModel
        raise ModelFileError(path, f"cannot load SavedModel: {' '.join(str(e).split())[:200]}") from None
    if signature not in loaded.signatures:
        raise ModelFileError(path, f"no signature {signature!r} (has {sorted(loaded.signatures)})")
    concrete = loaded.signatures[signature]
    _, kw_specs = concrete.structured_input_signature
    names = sorted(kw_specs)
    sig = _signature([tf.TensorSpec(kw_specs[n].shape, kw_specs[n].dtype, name=n) for n in names], input_shapes)

    @tf.function(input_signature=sig)
    def forward(*args):
        out = concrete(**dict(zip(names, args)))
        return [out[k] for k in sorted(out)] if isinstance(out, dict) else out

    proto = function_to_onnx(forward, sig, opset)
    return proto


def tflite_to_onnx(path, opset: int = DEFAULT_OPSET):
    """ONNX ModelProto of a `.tflite` flatbuffer (tf2onnx's TFLite path)."""
    tf2onnx = _tf2onnx()
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(path, "no such file")
    data = path.read_bytes()
    if len(data) < 8 or data[4:8] != b"TFL3":
        raise ModelFileError(path, "not a TFLite flatbuffer (no TFL3 identifier)")
    try:
        from tf2onnx.tflite.Model import Model

        version = Model.GetRootAsModel(data, 0).Version()
    except (IndexError, ValueError, TypeError, struct.error):  # too broken for a version: tf2onnx names it
        version = 3
    if version != 3:
        raise ModelFileError(path, f"unsupported TFLite schema version {version} (tftpu reads version 3)")
    from tftpu.tac import tflite_io
    tflite_io.read(path)        # a corrupt flatbuffer named here: TensorFlow's reader may crash on it
    source = path
    with contextlib.ExitStack() as stack:
        if _has_sparse_tensors(data):   # tf2onnx reads sparse buffers as dense: densify first
            from tftpu.frontend.tflite_densify import densify_model
            data = densify_model(data, str(path))
            source = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tftpu-densified-"))) / path.name
            source.write_bytes(data)
        try:
            with _quiet():
                proto, _ = tf2onnx.convert.from_tflite(str(source), opset=_check_opset(opset))
        except Exception as e:  # tf2onnx raises bare exceptions on malformed flatbuffers
            raise ModelFileError(path, f"tf2onnx cannot read it: {' '.join(str(e).split())[:200]}") from None
    _lower_transpose_conv_bias(proto, data)
    _stable_names(proto)
    return _check_unconverted(proto, str(path))


def _has_sparse_tensors(data: bytes) -> bool:
    from tftpu.frontend.tflite_densify import has_sparse_tensors
    try:
        return has_sparse_tensors(data)
    except (IndexError, ValueError, TypeError, struct.error):  # too broken to tell: tf2onnx names it
        return False


def _custom_ops(data: bytes) -> dict[str, tuple[str, bytes]]:
    """TFLite custom ops of the main subgraph: output tensor name -> (custom code, options)."""
    from tf2onnx.tflite.Model import Model
    model = Model.GetRootAsModel(data, 0)
    codes = [model.OperatorCodes(i).CustomCode() for i in range(model.OperatorCodesLength())]
    g = model.Subgraphs(0)
    out = {}
    for j in range(g.OperatorsLength()):
        op = g.Operators(j)
        code = codes[op.OpcodeIndex()]
        if code:
            name = g.Tensors(op.Outputs(0)).Name().decode()
            opts = b"" if op.CustomOptionsIsNone() else op.CustomOptionsAsNumpy().tobytes()
            out[name] = (code.decode(), opts)
    return out


def _lower_transpose_conv_bias(proto, data: bytes) -> None:
    """mediapipe's `Convolution2DTransposeBias` (NHWC, OHWI filter, raw TfLiteTransposeConvParams
    options {padding, stride_w, stride_h}) -> Transpose + ConvTranspose + Transpose."""
    import struct

    import numpy as np
    from onnx import helper, numpy_helper

    nodes = [n for n in proto.graph.node if n.op_type == "TFL_Convolution2DTransposeBias"]
    if not nodes:
        return
    customs = _custom_ops(data)
    inits = {i.name: i for i in proto.graph.initializer}
    for node in nodes:
        code, opts = customs.get(node.output[0], ("", b""))
        if len(opts) < 12:
            continue  # left for _check_unconverted to report
        padding, sw, sh = struct.unpack("<iii", opts[:12])
        x, w, b = node.input[:3]
        if w not in inits:
            continue
        wt = numpy_helper.to_array(inits[w])            # [O, kh, kw, I]
        o, kh, kw, _ = wt.shape
        pads = [0, 0, 0, 0]
        if padding == 1:  # TF's SAME transposed conv
            (hb, he), (wb, we) = geometry.transpose_same_pads(kh, sh), geometry.transpose_same_pads(kw, sw)
            pads = [hb, wb, he, we]
        base = node.output[0]
        new_w = f"{base}_filter_iohw"
        proto.graph.initializer.append(numpy_helper.from_array(
            np.ascontiguousarray(wt.transpose(3, 0, 1, 2)), new_w))
        new = [helper.make_node("Transpose", [x], [f"{base}_nchw_in"], perm=[0, 3, 1, 2], name=f"{base}_nchw_in"),
               helper.make_node("ConvTranspose", [f"{base}_nchw_in", new_w, b], [f"{base}_nchw"],
                                kernel_shape=[kh, kw], strides=[sh, sw], pads=pads, name=f"{base}_deconv"),
               helper.make_node("Transpose", [f"{base}_nchw"], [base], perm=[0, 2, 3, 1], name=base)]
        idx = list(proto.graph.node).index(node)
        proto.graph.node.remove(node)
        for k, n in enumerate(new):
            proto.graph.node.insert(idx + k, n)
