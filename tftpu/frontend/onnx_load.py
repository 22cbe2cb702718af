"""Read an ONNX model and make it static: fixed input shapes, shape inference, folded constants.

`prepare(model, input_shapes)` returns a `Prepared` graph view: every tensor's static shape and
dtype, the constant arrays (initializers, Constant nodes and every node whose inputs are all
constant, shape sub-graphs included), and the nodes left to import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from absl import logging

from tftpu.errors import ModelFileError, ShapeError, UsageError

_NO_FOLD = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
            "Bernoulli"}
_MAX_PASSES = 4


def read_model(model):
    """An `onnx.ModelProto` from a path, bytes or ModelProto; ModelFileError if it is not ONNX."""
    import onnx
    from google.protobuf.message import DecodeError

    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray)):
        data, where = bytes(model), "<bytes>"
    else:
        path = Path(model)
        if not path.is_file():
            raise ModelFileError(path, "no such file")
        data, where = path.read_bytes(), str(path)
    try:
        proto = onnx.ModelProto.FromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise ModelFileError(where, f"not an ONNX model (truncated or corrupt protobuf: {e})") from None
    if not proto.graph.node and not proto.graph.output:
        raise ModelFileError(where, "not an ONNX model (empty graph)")
    return proto


def parse_shapes(text: str | None) -> list[list[int]] | None:
    """`[[1,3,224,224],[1,10]]` (or one `[1,3,224,224]`) -> list of shapes; UsageError if malformed."""
    if text is None or text == "":
        return None
    import json
    try:
        val = json.loads(text)
    except json.JSONDecodeError:
        raise UsageError(f"--input_shapes: cannot read {text!r}; expected e.g. [[1,3,224,224]]") from None
    def is_dim(d):
        return isinstance(d, int) and not isinstance(d, bool)

    if isinstance(val, list) and all(is_dim(d) for d in val):
        val = [val]
    if not isinstance(val, list) or not all(isinstance(s, list) and all(is_dim(d) and d > 0 for d in s)
                                            for s in val):
        raise UsageError(f"--input_shapes: {text!r} must be a list of shapes of positive ints")
    for shape in val:
        check_size(shape, "--input_shapes")
    return val


MAX_DIM = 2 ** 31 - 1


def check_size(shape, what: str, itemsize: int = 4) -> None:
    """Refuse a tensor shape that no machine here could hold: a dimension past 2^31 - 1, or more
    bytes than this machine's memory (naming the size)."""
    import math
    import os

    if any(d > MAX_DIM for d in shape):
        raise UsageError(f"{what}: dimension {max(shape)} of {list(shape)} is out of range (at most {MAX_DIM})")
    nbytes = math.prod(shape) * itemsize
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        memory = 1 << 40
    if nbytes > memory:
        raise UsageError(f"{what}: shape {list(shape)} needs {nbytes / 2 ** 30:,.0f} GiB, more than this "
                         f"machine's {memory / 2 ** 30:,.0f} GiB of memory")


@dataclass
class Prepared:
    """A static view of an ONNX graph, ready to import."""

    model: object
    opset: int
    inputs: list[str]
    outputs: list[str]
    shapes: dict[str, tuple] = field(default_factory=dict)
    dtypes: dict[str, np.dtype] = field(default_factory=dict)
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    nodes: list = field(default_factory=list)


def _dims(type_proto) -> tuple | None:
    t = type_proto.tensor_type
    if not t.HasField("shape"):
        return None
    dims = []
    for d in t.shape.dim:
        if not d.HasField("dim_value") or d.dim_value < 0:
            return None
        dims.append(int(d.dim_value))
    return tuple(dims)


def _fix_inputs(model, input_shapes) -> list[str]:
    init = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in init]
    if input_shapes is not None and len(input_shapes) != len(inputs):
        raise ShapeError(f"--input_shapes gives {len(input_shapes)} shape(s), the model has "
                         f"{len(inputs)} input(s): {[i.name for i in inputs]}")
    for k, inp in enumerate(inputs):
        dims = inp.type.tensor_type.shape.dim
        if input_shapes is not None:
            want = input_shapes[k]
            if len(dims) and len(want) != len(dims):
                raise ShapeError(f"input {inp.name!r} has rank {len(dims)}, --input_shapes gives {want}")
            for j, d in enumerate(dims):
                if d.HasField("dim_value") and d.dim_value > 0 and d.dim_value != want[j]:
                    raise ShapeError(f"input {inp.name!r} has fixed dim {j} = {d.dim_value}, "
                                     f"--input_shapes gives {want}")
            del inp.type.tensor_type.shape.dim[:]
            for v in want:
                inp.type.tensor_type.shape.dim.add().dim_value = v
        else:
            shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or "?")
                     for d in dims]
            for j, d in enumerate(dims):
                if d.HasField("dim_value") and d.dim_value > 0:
                    continue
                if j > 0:
                    raise ShapeError(f"input {inp.name!r} has shape {shape}: dimension {j} "
                                     f"({d.dim_param or 'unnamed'}) is dynamic; give --input_shapes "
                                     f"(input_shapes=) with every size, e.g. {[[1] + [int(v) if isinstance(v, int) else 224 for v in shape[1:]]]}")
                logging.warning("input %r has a dynamic batch dimension (%s): assuming 1; give --input_shapes "
                                "to choose another", inp.name, d.dim_param or "unnamed")
                d.Clear()
                d.dim_value = 1
    return [i.name for i in inputs]


def _infer(model):
    import onnx
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    except Exception as e:  # onnx raises its own InferenceError / RuntimeError variants
        raise ShapeError(f"ONNX shape inference failed: {' '.join(str(e).split())[:300]}") from None


def _evaluate(node, opset_imports, inputs: list):
    from onnx.reference import ReferenceEvaluator
    ev = ReferenceEvaluator(node, opsets=opset_imports)
    feeds = {name: arr for name, arr in zip(node.input, inputs) if name}
    return ev.run(None, feeds)


def _check_topology(model) -> None:
    """Every tensor a node reads is a graph input, an initializer or an earlier node's output
    (ONNX requires topological order); ModelFileError naming the node and the tensor otherwise."""
    defined = {i.name for i in model.graph.input} | {i.name for i in model.graph.initializer}
    for k, node in enumerate(model.graph.node):
        for name in node.input:
            if name and name not in defined:
                who = node.name or f"node {k}"
                raise ModelFileError(model.graph.name or "<onnx>",
                                     f"{node.op_type} {who!r} reads tensor {name!r}, which no input, initializer "
                                     f"or earlier node defines")
        defined.update(o for o in node.output if o)
    for out in model.graph.output:
        if out.name not in defined:
            raise ModelFileError(model.graph.name or "<onnx>", f"graph output {out.name!r} is never computed")


def prepare(model, input_shapes=None) -> Prepared:
    """Fix input shapes (batch 1 for dynamic dims), infer shapes and fold every constant sub-graph."""
    import onnx
    from onnx import numpy_helper

    model = onnx.ModelProto.FromString(read_model(model).SerializeToString())
    opsets = {o.domain or "": o.version for o in model.opset_import}
    opset = opsets.get("", opsets.get("ai.onnx", 13))
    newest = onnx.defs.onnx_opset_version()
    if not 1 <= opset <= newest:
        raise ModelFileError(model.graph.name or "<onnx>", f"ONNX opset {opset} is not one this tftpu reads "
                                                           f"(1 to {newest}, onnx {onnx.__version__})")
    _check_topology(model)
    inputs = _fix_inputs(model, input_shapes)
    outputs = [o.name for o in model.graph.output]
    try:
        consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    except (ValueError, TypeError) as e:
        raise ModelFileError(model.graph.name or "<onnx>", f"an initializer is corrupt: {e}") from None
    for _ in range(_MAX_PASSES):
        model = _infer(model)
        shapes, dtypes = {}, {}
        for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
            s = _dims(vi.type)
            if s is not None:
                shapes[vi.name] = s
            et = vi.type.tensor_type.elem_type
            if et:
                dtypes[vi.name] = onnx.helper.tensor_dtype_to_np_dtype(et)
        folded, kept = False, []
        for node in model.graph.node:
            value = _fold(node, consts, shapes, opsets)
            if value is None:
                kept.append(node)
                continue
            for name, arr in zip(node.output, value):
                if name:
                    consts[name] = np.asarray(arr)
            folded = True
        if not folded:
            break
        del model.graph.node[:]
        model.graph.node.extend(kept)
        used = {i for n in kept for i in n.input} | set(outputs)
        del model.graph.initializer[:]
        model.graph.initializer.extend(numpy_helper.from_array(consts[k], k) for k in sorted(consts) if k in used)
        consts = {k: v for k, v in consts.items() if k in used}
    for name, arr in consts.items():
        shapes[name] = tuple(arr.shape)
        dtypes[name] = arr.dtype
    return Prepared(model, opset, inputs, outputs, shapes, dtypes, consts, _live(model.graph.node, outputs))


def _live(nodes, outputs) -> list:
    """Nodes some graph output depends on, in graph order (dead ones are never imported)."""
    need = set(outputs)
    keep = []
    for node in reversed(list(nodes)):
        if any(o in need for o in node.output):
            keep.append(node)
            need.update(i for i in node.input if i)
    return keep[::-1]


def _fold(node, consts, shapes, opsets):
    """The folded outputs of `node`, or None when it depends on a runtime value."""
    if node.domain not in ("", "ai.onnx") or node.op_type in _NO_FOLD:
        return None
    if node.op_type == "Constant":
        return _evaluate(node, opsets, [])
    if node.op_type in ("Shape", "Size") and node.input[0] not in consts:
        s = shapes.get(node.input[0])
        if s is None:
            return None
        if node.op_type == "Size":
            return [np.array(int(np.prod(s)), np.int64)]
        arr = np.array(s, np.int64)
        start = end = None
        for a in node.attribute:
            if a.name == "start":
                start = a.i
            if a.name == "end":
                end = a.i
        return [arr[start:end]]
    ins = [i for i in node.input if i]
    if not ins or any(i not in consts for i in ins):
        return None
    return _evaluate(node, opsets, [consts[i] if i else None for i in node.input])
