"""Write the chosen plan back into the `ModelT`: lowered ops in place, new tensors and buffers
appended, operator codes added as needed, and each op's device recorded in the model metadata
(`tftpu.tac` metadata entry, JSON), which TFLite's interpreter ignores.
"""

from __future__ import annotations

import json

import numpy as np

from tftpu.tac.graph import Graph, NewTensor, Node
from tftpu.tac.schema import builtin_codes, schema, tensor_type_codes

METADATA_NAME = "tftpu.tac"


class _Writer:
    """Turns `Node`s of one subgraph into `OperatorT`s of `model`."""

    def __init__(self, model, graph: Graph):
        self.fb = schema()
        self.model = model
        self.graph = graph
        self.sg = graph.sg
        self.codes: dict = {}
        for k, code in enumerate(model.operatorCodes):
            builtin = max(code.builtinCode, code.deprecatedBuiltinCode)
            cc = code.customCode.decode() if isinstance(code.customCode, bytes) else code.customCode
            self.codes.setdefault((builtin, cc), k)
        self.new_index: dict[int, int] = {}
        self.types = tensor_type_codes()

    def opcode(self, node: Node) -> int:
        builtin = builtin_codes()[node.name]
        key = (builtin, node.custom_code if node.name == "CUSTOM" else None)
        if key not in self.codes:
            code = self.fb.OperatorCodeT()
            code.builtinCode = builtin
            code.deprecatedBuiltinCode = min(builtin, 127)
            code.customCode = key[1]
            code.version = node.version
            self.model.operatorCodes.append(code)
            self.codes[key] = len(self.model.operatorCodes) - 1
        return self.codes[key]

    def tensor(self, t) -> int:
        if not isinstance(t, NewTensor):
            return int(t)
        hit = self.new_index.get(id(t))
        if hit is not None:
            return hit
        tensor = self.fb.TensorT()
        tensor.shape = np.asarray(t.shape, np.int32)
        tensor.type = self.types[t.dtype]
        tensor.name = t.name.encode()
        tensor.quantization = t.quant
        tensor.hasRank = True
        if t.data is not None:
            buf = self.fb.BufferT()
            buf.data = np.frombuffer(np.ascontiguousarray(t.data).tobytes(), np.uint8)
            self.model.buffers.append(buf)
            tensor.buffer = len(self.model.buffers) - 1
        else:
            tensor.buffer = t.buffer
        self.sg.tensors.append(tensor)
        idx = len(self.sg.tensors) - 1
        self.new_index[id(t)] = idx
        return idx

    def operator(self, node: Node):
        if node.src is not None and not any(isinstance(t, NewTensor) for t in node.inputs + node.outputs) \
                and list(node.inputs) == [int(t) for t in node.src.inputs] \
                and list(node.outputs) == [int(t) for t in node.src.outputs]:
            return node.src
        op = self.fb.OperatorT()
        op.opcodeIndex = self.opcode(node)
        op.inputs = np.asarray([self.tensor(t) for t in node.inputs], np.int32)
        op.outputs = np.asarray([self.tensor(t) for t in node.outputs], np.int32)
        op.builtinOptionsType = node.options_type
        op.builtinOptions = node.options
        if node.src is not None:
            for field in ("customOptions", "customOptionsFormat", "builtinOptions2Type", "builtinOptions2",
                          "intermediates", "mutatingVariableInputs"):
                if hasattr(node.src, field):
                    setattr(op, field, getattr(node.src, field))
        return op


def apply_plan(model, graph: Graph, ordered_nodes: list[Node]) -> None:
    """Replace the ops of `graph`'s subgraph by `ordered_nodes` (an execution order)."""
    writer = _Writer(model, graph)
    graph.sg.operators = [writer.operator(n) for n in ordered_nodes]


def set_metadata(model, name: str, payload: dict) -> None:
    """Store `payload` as JSON in metadata entry `name` (replacing an earlier one)."""
    fb = schema()
    data = json.dumps(payload, sort_keys=False, separators=(",", ":")).encode()
    buf = fb.BufferT()
    buf.data = np.frombuffer(data, np.uint8)
    for m in model.metadata or []:
        if _name(m.name) == name:
            model.buffers[m.buffer].data = None
    model.metadata = [m for m in (model.metadata or []) if _name(m.name) != name]
    model.buffers.append(buf)
    entry = fb.MetadataT()
    entry.name = name.encode()
    entry.buffer = len(model.buffers) - 1
    model.metadata.append(entry)


def get_metadata(model, name: str = METADATA_NAME) -> dict | None:
    """The JSON stored under metadata entry `name`, or None."""
    for m in model.metadata or []:
        if _name(m.name) == name:
            return json.loads(np.asarray(model.buffers[m.buffer].data, np.uint8).tobytes())
    return None


def _name(n) -> str:
    return n.decode() if isinstance(n, bytes) else str(n)
