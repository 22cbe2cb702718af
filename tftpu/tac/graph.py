"""A light op/tensor view over one subgraph of a `ModelT`, shared by hardware models and passes.

`Node` is one TFLite op (original, or new from a lowering); its inputs and outputs are tensor
indices of the subgraph, `-1` for an absent optional input, or `NewTensor` objects that a
lowering created and that only get an index when the chosen plan is written out.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from tftpu.tac.schema import builtin_codes, builtin_names, schema, tensor_type_names

FLOAT, HYBRID = "FLOAT", "HYBRID"
QUANTIZED_INT8, QUANTIZED_UINT8, QUANTIZED_INT16 = "QUANTIZED_INT8", "QUANTIZED_UINT8", "QUANTIZED_INT16"
_QUANT_TYPE = {"int8": QUANTIZED_INT8, "uint8": QUANTIZED_UINT8, "int16": QUANTIZED_INT16}
_FLOATS = ("float32", "float16", "bfloat16", "float64")
_CONTROL_FLOW = ("WHILE", "IF", "CALL_ONCE", "CALL")


class NewTensor:
    """A tensor made by a lowering: shape, dtype, optional constant data or a shared buffer."""

    __slots__ = ("shape", "dtype", "name", "data", "buffer", "quant")

    def __init__(self, shape, dtype: str, name: str, data: np.ndarray | None = None,
                 buffer: int = 0, quant=None):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype
        self.name = name
        self.data = data
        self.buffer = buffer
        self.quant = quant


class Node:
    """One op: `name` is the builtin name ("CONV_2D") or "CUSTOM"; `op_type` adds the custom code."""

    __slots__ = ("name", "custom_code", "inputs", "outputs", "options", "options_type", "src",
                 "index", "graph", "version", "_itype")

    def __init__(self, name: str, inputs, outputs, options=None, options_type: int = 0, *,
                 graph: "Graph", src=None, index: int | None = None, custom_code: str | None = None,
                 version: int = 1):
        self.name = name
        self.custom_code = custom_code
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.options = options
        self.options_type = options_type
        self.src = src
        self.index = index
        self.graph = graph
        self.version = version
        self._itype = None

    @property
    def op_type(self) -> str:
        """"CONV_2D", or the custom code of a custom op ("Convolution2DTransposeBias")."""
        return self.custom_code if self.name == "CUSTOM" and self.custom_code else self.name

    @property
    def label(self) -> str:
        """A short name for messages: the op type and its first output tensor's name."""
        out = self.outputs[0] if self.outputs else None
        return f"{self.op_type} ({self.graph.tensor_name(out) if out is not None else '?'})"

    def input_shapes(self) -> list[tuple[int, ...]]:
        return [self.graph.shape(t) for t in self.inputs if not _absent(t)]

    def output_shapes(self) -> list[tuple[int, ...]]:
        return [self.graph.shape(t) for t in self.outputs]

    def activations(self) -> list:
        """Non-constant inputs and all outputs: the tensors that flow at run time."""
        return [t for t in self.inputs if not _absent(t) and not self.graph.is_const(t)] + list(self.outputs)

    def weights(self) -> list:
        return [t for t in self.inputs if not _absent(t) and self.graph.is_const(t)]

    @property
    def inference_type(self) -> str:
        """FLOAT, HYBRID (float activations, quantized weights) or QUANTIZED_INT8/UINT8/INT16."""
        if self._itype is None:
            self._itype = self._inference_type()
        return self._itype

    def _inference_type(self) -> str:
        g = self.graph
        for t in self.activations():
            q = _QUANT_TYPE.get(g.dtype(t))
            if q and g.is_quantized(t):
                return q
        if self.name != "DEQUANTIZE":
            for t in self.weights():
                if g.dtype(t) in ("int8", "uint8", "int4") and g.is_quantized(t):
                    return HYBRID
        return FLOAT

    def subgraph_refs(self) -> bool:
        return self.name in _CONTROL_FLOW

    def clone(self, **changes) -> "Node":
        n = Node(self.name, self.inputs, self.outputs, self.options, self.options_type, graph=self.graph,
                 src=self.src, index=self.index, custom_code=self.custom_code, version=self.version)
        for k, v in changes.items():
            setattr(n, k, v)
        return n


def _absent(t) -> bool:
    return isinstance(t, (int, np.integer)) and t < 0


class Graph:
    """Subgraph `index` of `model` as `Node`s with tensor facts (shape, dtype, constness)."""

    def __init__(self, model, index: int = 0):
        self.model = model
        self.index = index
        self.sg = model.subgraphs[index]
        self.tensors = self.sg.tensors or []
        names = builtin_names()
        codes = []
        for code in model.operatorCodes or []:
            builtin = max(code.builtinCode, code.deprecatedBuiltinCode)
            cc = code.customCode.decode() if isinstance(code.customCode, bytes) else code.customCode
            codes.append((names[builtin], cc, code.version))
        self.nodes: list[Node] = []
        for i, op in enumerate(self.sg.operators or []):
            name, cc, version = codes[op.opcodeIndex]
            ins = [int(t) for t in op.inputs] if op.inputs is not None else []
            outs = [int(t) for t in op.outputs] if op.outputs is not None else []
            self.nodes.append(Node(name, ins, outs, op.builtinOptions, op.builtinOptionsType, graph=self,
                                   src=op, index=i, custom_code=cc, version=version))
        self.inputs = [int(t) for t in self.sg.inputs] if self.sg.inputs is not None else []
        self.outputs = [int(t) for t in self.sg.outputs] if self.sg.outputs is not None else []
        self._types = tensor_type_names()
        self._const = {}

    # -- tensor facts ------------------------------------------------------------------------
    def shape(self, t) -> tuple[int, ...]:
        """Static shape; unknown (-1) dimensions of the signature count as 1."""
        if isinstance(t, NewTensor):
            return t.shape
        tensor = self.tensors[t]
        shape = tensor.shape if tensor.shape is not None else ()
        return tuple(max(int(d), 1) if int(d) < 0 else int(d) for d in shape)

    def dtype(self, t) -> str:
        if isinstance(t, NewTensor):
            return t.dtype
        return self._types[self.tensors[t].type]

    def numel(self, t) -> int:
        return int(np.prod(self.shape(t), dtype=np.int64))

    def nbytes(self, t) -> int:
        return self.numel(t) * _itemsize(self.dtype(t))

    def is_const(self, t) -> bool:
        if isinstance(t, NewTensor):
            return t.data is not None or t.buffer > 0
        hit = self._const.get(t)
        if hit is None:
            tensor = self.tensors[t]
            buffers = self.model.buffers or []
            data = buffers[tensor.buffer].data if 0 < tensor.buffer < len(buffers) else None
            hit = data is not None and len(data) > 0
            self._const[t] = hit
        return hit

    def const_value(self, t) -> np.ndarray | None:
        """The constant's value as a numpy array (dense, non-string dtypes), else None."""
        if isinstance(t, NewTensor):
            if t.data is not None:
                return t.data
            t_buf, shape, dtype = t.buffer, t.shape, t.dtype
        else:
            if _absent(t) or not self.is_const(t) or self.tensors[t].sparsity is not None:
                return None
            t_buf, shape, dtype = self.tensors[t].buffer, self.shape(t), self.dtype(t)
        if dtype not in _NP or t_buf <= 0:
            return None
        data = self.model.buffers[t_buf].data
        return np.frombuffer(np.asarray(data, np.uint8).tobytes(), _NP[dtype]).reshape(shape)

    def is_quantized(self, t) -> bool:
        q = t.quant if isinstance(t, NewTensor) else self.tensors[t].quantization
        return q is not None and q.scale is not None and len(q.scale) > 0

    def quant(self, t):
        return t.quant if isinstance(t, NewTensor) else self.tensors[t].quantization

    def tensor_name(self, t) -> str:
        if isinstance(t, NewTensor):
            return t.name
        if _absent(t):
            return "<none>"
        n = self.tensors[t].name
        return n.decode("utf-8", "replace") if isinstance(n, bytes) else str(n)

    # -- structure -------------------------------------------------------------------------
    def producers(self) -> dict:
        """tensor -> index in `nodes` of the op that writes it."""
        return {t: i for i, n in enumerate(self.nodes) for t in n.outputs}

    def consumers(self) -> dict:
        """tensor -> indices in `nodes` of the ops that read it."""
        out: dict = {}
        for i, n in enumerate(self.nodes):
            for t in n.inputs:
                if not _absent(t):
                    out.setdefault(t, []).append(i)
        return out


_NP = {"float32": np.float32, "float16": np.float16, "int32": np.int32, "uint8": np.uint8,
       "int64": np.int64, "bool": np.bool_, "int16": np.int16, "int8": np.int8, "float64": np.float64,
       "uint32": np.uint32, "uint16": np.uint16, "uint64": np.uint64}


def _itemsize(dtype: str) -> int:
    if dtype in _NP:
        return np.dtype(_NP[dtype]).itemsize
    return {"bfloat16": 2, "complex64": 8, "complex128": 16, "int4": 1, "int2": 1, "uint4": 1}.get(dtype, 4)


def make_node(graph: Graph, name: str, inputs, outputs, options: Any = None, options_class: str | None = None,
              version: int = 1) -> Node:
    """A new builtin op for a lowering; `options_class` names its BuiltinOptions table."""
    if name not in builtin_codes():
        raise ValueError(f"unknown TFLite builtin {name}")
    otype = 0
    if options is not None:
        from tftpu.tac.schema import options_type_code
        otype = options_type_code(options_class or type(options).__name__[:-1])
    return Node(name, inputs, outputs, options, otype, graph=graph, version=version)


def options(class_name: str, **fields):
    """A BuiltinOptions object (`options("ConcatenationOptions", axis=3)`)."""
    obj = getattr(schema(), class_name + "T")()
    for k, v in fields.items():
        if not hasattr(obj, k):
            raise AttributeError(f"{class_name} has no field {k}")
        setattr(obj, k, v)
    return obj


@dataclasses.dataclass
class Annotation:
    """Where one op runs: device name and inference type."""

    device: str
    inference_type: str
