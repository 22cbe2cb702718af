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
    """An `onnx.ModelProto` from a path, bytes or ModelProto; ModelFileError if it is not ONNX.

    Tensors kept in external data files are read in (see `_load_external_data`): only from
    files inside the model's folder, so a model given as bytes or a ModelProto must not need any.
    """
    import onnx
    from google.protobuf.message import DecodeError

    if isinstance(model, onnx.ModelProto):
        _load_external_data(model, model.graph.name or "<onnx>", None)  # refuses, never reads
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
    _load_external_data(proto, where, None if where == "<bytes>" else path.parent)
    return proto


def _external_tensors(proto):
    """Every TensorProto of the model that keeps its data in an external file (subgraphs too)."""
    from onnx import TensorProto
    from onnx.external_data_helper import _get_all_tensors

    return [t for t in _get_all_tensors(proto) if t.data_location == TensorProto.EXTERNAL]


def _load_external_data(proto, where: str, folder: Path | None) -> None:
    """Read each external tensor's bytes into the model, refusing (one ModelFileError naming the
    tensor and file) a location outside `folder` (absolute, `..`, a link leading out), a missing
    file or a range past its end. Nothing outside the model's folder is ever opened."""
    import os

    tensors = _external_tensors(proto)
    if not tensors:
        return
    if folder is None:
        raise ModelFileError(where, f"tensor {tensors[0].name!r} keeps its data in an external file; "
                                    f"give the model's path so the file can be found beside it")
    root = folder.resolve()
    for t in tensors:
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        what = f"tensor {t.name!r}: external data {loc!r}"
        if not loc or os.path.isabs(loc) or "\0" in loc:
            raise ModelFileError(where, f"{what} is not a file name relative to the model's folder")
        target = (root / loc).resolve()
        if not target.is_relative_to(root):
            raise ModelFileError(where, f"{what} points outside the model's folder {root}; refused")
        if not target.is_file():
            reason = "is not a regular file" if target.exists() else f"no such file in {root}"
            raise ModelFileError(where, f"{what}: {reason}")
        try:
            offset = int(info.get("offset", 0) or 0)
            length = int(info["length"]) if info.get("length") else None
        except ValueError:
            raise ModelFileError(where, f"{what}: offset/length are not integers") from None
        size = target.stat().st_size
        if offset < 0 or (length is not None and length < 0) or offset + (length or 0) > size:
            raise ModelFileError(where, f"{what}: bytes {offset}..{offset + (length or 0)} are past the "
                                        f"end of the file ({size} bytes)")
        with open(target, "rb") as f:
            f.seek(offset)
            t.raw_data = f.read(size - offset if length is None else length)
        t.data_location = t.DEFAULT
        del t.external_data[:]


def parse_shapes(text: str | None) -> list[list[int]] | None:
    """`[[1,3,224,224],[1,10]]` (or one `[1,3,224,224]`) -> list of shapes; UsageError if malformed."""
    if text is None or text == "":
        return None
    import json
    try:
        val = json.loads(text)
    except json.JSONDecodeError:
        raise UsageError(f"--input_shapes: cannot read {text!r}; expected e.g. [[1,3,224,224]]") from None
    return check_shapes(val, text)


def check_shapes(val, text=None) -> list[list[int]]:
    """`val` (a list of shapes, or one shape) as a list of shapes of positive ints within the size
    limits; a UsageError naming `text` (what the user wrote; `val` itself by default) otherwise."""
    def is_dim(d):
        return isinstance(d, (int, np.integer)) and not isinstance(d, bool)

    if isinstance(val, (list, tuple)) and val and all(is_dim(d) for d in val):
        val = [val]
    if not isinstance(val, (list, tuple)) or not val or not all(
            isinstance(s, (list, tuple)) and all(is_dim(d) and d > 0 for d in s) for s in val):
        raise UsageError(f"--input_shapes: {text if text is not None else val!r} must be a list of shapes of "
                         "positive ints")
    val = [[int(d) for d in s] for s in val]
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
    where: str = "<onnx>"   # the file (or graph) errors name


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
    if input_shapes is not None:
        input_shapes = check_shapes(input_shapes)
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
            dynamic = [j for j, d in enumerate(dims) if not (d.HasField("dim_value") and d.dim_value > 0)]
            for j in dynamic:   # refuse before warning, so a refusal is the only line
                d = dims[j]
                if j > 0:
                    raise ShapeError(f"input {inp.name!r} has shape {shape}: dimension {j} "
                                     f"({d.dim_param or 'unnamed'}) is dynamic; give --input_shapes "
                                     f"(input_shapes=) with every size, e.g. {[[1] + [int(v) if isinstance(v, int) else 224 for v in shape[1:]]]}")
            for j in dynamic:
                d = dims[j]
                logging.warning("input %r has a dynamic batch dimension (%s): assuming 1; give --input_shapes "
                                "to choose another", inp.name, d.dim_param or "unnamed")
                d.Clear()
                d.dim_value = 1
    for out in model.graph.output:      # a symbolic size is stale once the inputs are fixed, and a
        t = out.type.tensor_type        # wrong declared rank stops inference at the output
        if t.HasField("shape") and any(not d.HasField("dim_value") for d in t.shape.dim):
            t.ClearField("shape")
    return [i.name for i in inputs]


def _infer(model):
    import onnx
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    except Exception as e:  # onnx raises its own InferenceError / RuntimeError variants
        raise ShapeError(f"ONNX shape inference failed: {' '.join(str(e).split())[:300]}") from None


def node_ident(node, k: int | None = None) -> str:
    """How errors name a node: its name, else its first output, else its position."""
    return node.name or (node.output[0] if node.output and node.output[0] else f"node {k}")


def _short(e: Exception) -> str:
    """ONNX's message in one short line (no C++ context lines, no `[ShapeInferenceError]` tag)."""
    import re
    text = str(e).split("==>")[0]
    text = re.sub(r"\[\w*(Inference|Validation)Error\]\s*", "", " ".join(text.split()))
    return text[:300] or type(e).__name__


_SMALL_CONST = 4096  # constants ONNX's shape inference reads as data (shapes, axes, pads), not weights


class NodeCheck:
    """Each node of the default domain checked once, before it is folded or converted, by ONNX's
    own schema of its op: input and output counts, attribute names and types, required
    attributes (`onnx.checker.check_node`), then its attributes against the rank and shapes of
    its inputs (the op's strict shape inference: kernel_shape, strides, pads and dilations per
    spatial axis, perm, axis and axes in range, operand shapes that fit). A node that fails is a
    ModelFileError naming it, so converters only ever see nodes ONNX itself accepts."""

    def __init__(self, model, where: str, opsets: dict[str, int]):
        import onnx
        from onnx import checker

        self.where = where
        self.ctx = checker.C.CheckerContext()
        ir = model.ir_version
        self.ir_version = ir if 3 <= ir <= onnx.IR_VERSION else onnx.IR_VERSION
        self.ctx.ir_version = self.ir_version
        self.ctx.opset_imports = opsets
        self.opsets = opsets
        self.opset_protos = list(model.opset_import)
        self.done: set = set()
        self.checked: set = set()
        self._data: dict = {}

    def fail(self, node, k, message: str):
        raise ModelFileError(self.where, f"{node.op_type} {node_ident(node, k)!r}: {message}")

    def schema(self, node, k):
        """ONNX's schema of `node`'s op after checking the node against it; None for a node of
        another domain, an op ONNX does not know (the importer lists it as unsupported) or
        control flow (its subgraphs read the outer scope; never imported)."""
        import onnx
        from onnx import checker

        if node.domain not in ("", "ai.onnx"):
            return None
        try:
            schema = onnx.defs.get_schema(node.op_type, self.opsets.get("", 1), "")
        except (onnx.defs.SchemaError, TypeError, ValueError):
            return None
        graph_types = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
        if any(a.type in graph_types for a in schema.attributes.values()):
            return None
        key = (node.op_type, tuple(node.input), tuple(node.output), node.name)
        if key not in self.checked:
            self.checked.add(key)
            try:
                checker.check_node(node, self.ctx)
            except Exception as e:  # onnx.checker.ValidationError and C++ errors
                self.fail(node, k, _short(e))
        return schema

    def __call__(self, node, k, elem_types: dict, shapes: dict, consts: dict) -> None:
        from onnx import helper, numpy_helper, shape_inference

        key = (node.op_type, tuple(node.input), tuple(node.output), node.name)
        if key in self.done:
            return
        self.done.add(key)
        schema = self.schema(node, k)
        if schema is None:
            return
        types, data = {}, {}
        for name in node.input:
            if not name:
                continue
            et = elem_types.get(name)
            if not et:
                return  # an input of unknown type: nothing to check the attributes against
            types[name] = helper.make_tensor_type_proto(et, shapes.get(name))
            arr = consts.get(name)
            if arr is not None and arr.size <= _SMALL_CONST:
                if name not in self._data:
                    try:
                        self._data[name] = numpy_helper.from_array(np.asarray(arr), name)
                    except (TypeError, ValueError):
                        self._data[name] = None
                if self._data[name] is not None:
                    data[name] = self._data[name]
        try:
            inferred = shape_inference.infer_node_outputs(schema, node, types, data,
                                                          opset_imports=self.opset_protos,
                                                          ir_version=self.ir_version)
        except Exception as e:  # InferenceError and C++ errors: the node contradicts its inputs
            self.fail(node, k, _short(e))
        for name, type_proto in inferred.items():
            got, declared = _dims(type_proto), shapes.get(name)
            if got is not None:
                try:
                    check_size(got, f"output {name!r}", _itemsize(type_proto.tensor_type.elem_type))
                except UsageError as e:  # before a constant of that size is computed
                    self.fail(node, k, str(e))
            if got is not None and declared is not None and name not in consts and got != tuple(declared):
                self.fail(node, k, f"output {name!r} is declared with shape {list(declared)}, but the node "
                                   f"computes {list(got)}")


def _evaluate(node, opset_imports, inputs: list, where: str = "<onnx>", outer: dict | None = None):
    """The outputs of `node` on constant `inputs`, by ONNX's reference evaluator, in the model's
    opset (given a bare node the evaluator takes each op's newest version: opset 12's Unsqueeze
    with its `axes` attribute then fails as opset 13's). `outer`: the constants its subgraphs
    read from around it."""
    import onnx
    from onnx import helper
    from onnx.reference import ReferenceEvaluator
    version = opset_imports.get("", opset_imports.get("ai.onnx"))
    try:
        outer = outer or {}
        graph = helper.make_graph([node], "fold", [helper.make_value_info(n, onnx.TypeProto())
                                                   for n in dict.fromkeys([*(i for i in node.input if i), *outer])],
                                  [helper.make_value_info(n, onnx.TypeProto()) for n in node.output if n])
        ev = ReferenceEvaluator(helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", version)] if version else None))
        feeds = {**outer, **{name: arr for name, arr in zip(node.input, inputs) if name}}
        return ev.run(None, feeds)
    except Exception as e:  # the reference kernels raise whatever numpy raises
        raise ModelFileError(where, f"{node.op_type} {node_ident(node)!r}: cannot be computed from its "
                                    f"constant inputs ({type(e).__name__}: {_short(e)})") from None


def _check_topology(model, where: str) -> None:
    """Every tensor a node reads is a graph input, an initializer or an earlier node's output
    (ONNX requires topological order); ModelFileError naming the node and the tensor otherwise."""
    defined = {i.name for i in model.graph.input} | {i.name for i in model.graph.initializer}
    for k, node in enumerate(model.graph.node):
        for name in node.input:
            if name and name not in defined:
                who = node.name or f"node {k}"
                raise ModelFileError(where,
                                     f"{node.op_type} {who!r} reads tensor {name!r}, which no input, initializer "
                                     f"or earlier node defines")
        defined.update(o for o in node.output if o)
    for out in model.graph.output:
        if out.name not in defined:
            raise ModelFileError(where, f"graph output {out.name!r} is never computed")


def prepare(model, input_shapes=None, where: str | None = None) -> Prepared:
    """Fix input shapes (batch 1 for dynamic dims), infer shapes, check every node against its
    op's schema (`NodeCheck`) and fold every constant sub-graph. Errors name `where` (the
    file, by default the path given or the graph's name)."""
    import onnx
    from onnx import numpy_helper

    if where is None and isinstance(model, (str, Path)):
        where = str(model)
    model = onnx.ModelProto.FromString(read_model(model).SerializeToString())
    where = where or model.graph.name or "<onnx>"
    opsets = {o.domain or "": o.version for o in model.opset_import}
    opset = opsets.get("", opsets.get("ai.onnx", 13))
    newest = onnx.defs.onnx_opset_version()
    if not 1 <= opset <= newest:
        raise ModelFileError(where, f"ONNX opset {opset} is not one this tftpu reads "
                                    f"(1 to {newest}, onnx {onnx.__version__})")
    _check_topology(model, where)
    inputs = _fix_inputs(model, input_shapes)
    outputs = [o.name for o in model.graph.output]
    try:
        consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    except (ValueError, TypeError, KeyError) as e:
        raise ModelFileError(where, f"an initializer is corrupt: {e}") from None
    check = NodeCheck(model, where, {**opsets, "": opset})
    for k, node in enumerate(model.graph.node):
        check.schema(node, k)  # before shape inference, which trips over a node missing inputs
    for _ in range(_MAX_PASSES):
        model = _infer(model)
        shapes, dtypes, elem_types = {}, {}, {}
        for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
            s = _dims(vi.type)
            if s is not None:
                shapes[vi.name] = s
            et = vi.type.tensor_type.elem_type
            if et:
                try:
                    dtypes[vi.name] = onnx.helper.tensor_dtype_to_np_dtype(et)
                except KeyError:
                    raise ModelFileError(where, f"tensor {vi.name!r} has an unknown element type {et}") from None
                elem_types[vi.name] = et
        for name, arr in consts.items():
            shapes[name] = tuple(arr.shape)
            elem_types[name] = _elem_type(arr.dtype)
        folded, kept = False, []
        for k, node in enumerate(model.graph.node):
            check(node, k, elem_types, shapes, consts)
            value = _fold(node, consts, shapes, opsets, where)
            if value is None:
                kept.append(node)
                continue
            for name, arr in zip(node.output, value):
                if name:
                    consts[name] = np.asarray(arr)
                    shapes[name] = tuple(consts[name].shape)
                    elem_types[name] = _elem_type(consts[name].dtype)
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
    return Prepared(model, opset, inputs, outputs, shapes, dtypes, consts, _live(model.graph.node, outputs), where)


def _itemsize(elem_type: int) -> int:
    from onnx import helper
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return 4


def _elem_type(dtype) -> int:
    """ONNX's element type of a numpy dtype (0, unknown, for one ONNX has none for)."""
    from onnx import helper
    try:
        return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    except (KeyError, TypeError, ValueError):
        return 0


def _live(nodes, outputs) -> list:
    """Nodes some graph output depends on, in graph order (dead ones are never imported)."""
    need = set(outputs)
    keep = []
    for node in reversed(list(nodes)):
        if any(o in need for o in node.output):
            keep.append(node)
            need.update(i for i in node.input if i)
    return keep[::-1]


def _fold(node, consts, shapes, opsets, where: str = "<onnx>"):
    """The folded outputs of `node`, or None when it depends on a runtime value."""
    if node.domain not in ("", "ai.onnx") or node.op_type in _NO_FOLD:
        return None
    if node.op_type == "Constant":
        return _evaluate(node, opsets, [], where)
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
    if node.op_type == "Loop" and (len(node.input) < 2 or not node.input[1]):
        return None     # onnx's reference evaluator runs a Loop without `cond` zero times
    ins, outer = [i for i in node.input if i], _outer_names(node)
    if not ins or any(i not in consts for i in ins + outer):
        return None
    return _evaluate(node, opsets, [consts[i] if i else None for i in node.input], where,
                     {n: consts[n] for n in outer})


def _outer_names(node) -> list[str]:
    """The names a node's subgraphs (Loop, If, Scan bodies) read from the graph around them: its
    inputs as much as its operands are (a Loop over a runtime tensor is not constant)."""
    from onnx import AttributeProto

    graphs = [a.g for a in node.attribute if a.type == AttributeProto.GRAPH]
    graphs += [g for a in node.attribute if a.type == AttributeProto.GRAPHS for g in a.graphs]
    outer: list[str] = []
    for g in graphs:
        inner = {i.name for i in g.input} | {i.name for i in g.initializer}
        for n in g.node:
            outer += [i for i in [*n.input, *_outer_names(n)] if i and i not in inner]
            inner.update(n.output)
    return outer
