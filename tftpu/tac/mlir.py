"""MLIR text of a TAC result, in the shape of TensorFlow's `tac-translate -output-mlir`.

Ops print in MLIR generic syntax (`"tfl.conv_2d"(...) {tac.device = "GPU", ...}`); weights as
`tfl.pseudo_const` (small ones with their values, large ones by buffer index). Inline: one
`@main` in the picked plan's order. Not inline: every raised function and every alternative
view as `func.func private @func_N_<DEVICE>_<TYPE>`, and `@main` calling the picked views.
"""

from __future__ import annotations

import functools
import re

import numpy as np

from tftpu.tac.graph import Graph, NewTensor, Node
from tftpu.tac.passes.raise_subgraphs import producers
from tftpu.tac.schema import schema

_ELEM = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int32": "i32",
         "int64": "i64", "int16": "i16", "int8": "i8", "uint8": "ui8", "uint16": "ui16", "uint32": "ui32",
         "uint64": "ui64", "bool": "i1", "int4": "i4", "complex64": "complex<f32>"}
_ENUM_FIELDS = {"fusedActivationFunction": "ActivationFunctionType", "padding": "Padding",
                "mode": "MirrorPadMode", "weightsFormat": "FullyConnectedOptionsWeightsFormat"}
_SMALL = 16


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


@functools.lru_cache(maxsize=None)
def _enum_names(enum: str) -> dict[int, str]:
    cls = getattr(schema(), enum, None)
    return {} if cls is None else {v: k for k, v in vars(cls).items() if not k.startswith("_") and isinstance(v, int)}


def tensor_type(graph: Graph, t) -> str:
    elem = _ELEM.get(graph.dtype(t), "none")
    shape = graph.shape(t)
    return f"tensor<{''.join(f'{d}x' for d in shape)}{elem}>"


def _attr_value(field: str, v) -> str | None:
    if field in _ENUM_FIELDS:
        return f'"{_enum_names(_ENUM_FIELDS[field]).get(int(v), int(v))}"'
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return f"{int(v)} : i32"
    if isinstance(v, (float, np.floating)):
        return f"{float(v)!r} : f32"
    if isinstance(v, (bytes, str)):
        s = v.decode("utf-8", "replace") if isinstance(v, bytes) else v
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (list, np.ndarray)) and len(v) and all(isinstance(x, (int, np.integer)) for x in v):
        return f"array<i32: {', '.join(str(int(x)) for x in v)}>"
    return None


def _dense(value: np.ndarray, ty: str) -> str:
    flat = value.reshape(-1)
    if value.dtype.kind == "f":
        items = [repr(float(x)) for x in flat]
    elif value.dtype.kind == "b":
        items = ["true" if x else "false" for x in flat]
    else:
        items = [str(int(x)) for x in flat]
    body = items[0] if value.ndim == 0 else "[" + ", ".join(items) + "]"
    return f"dense<{body}> : {ty}"


class _Printer:
    def __init__(self, graph: Graph):
        self.g = graph
        self.lines: list[str] = []
        self.names: dict = {}
        self.new_k = 0

    def name(self, t) -> str:
        key = id(t) if isinstance(t, NewTensor) else int(t)
        hit = self.names.get(key)
        if hit is None:
            if isinstance(t, NewTensor):
                hit = f"%n{self.new_k}"
                self.new_k += 1
            else:
                hit = f"%t{int(t)}"
            self.names[key] = hit
        return hit

    def reset(self):
        self.names = {}
        self.new_k = 0

    def const(self, t, indent: str, device: str | None) -> None:
        g = self.g
        ty = tensor_type(g, t)
        value = g.const_value(t)
        if value is not None and value.ndim <= 1 and value.size <= _SMALL and value.dtype.kind in "fiub":
            attr = f"value = {_dense(np.asarray(value), ty)}"
        else:
            buf = t.buffer if isinstance(t, NewTensor) else g.tensors[t].buffer
            attr = f"tac.buffer = {int(buf)} : i32"
        self.lines.append(f'{indent}{self.name(t)} = "tfl.pseudo_const"() {{{attr}}} : () -> {ty}')

    def op(self, node: Node, device: str, itype: str, indent: str) -> None:
        g = self.g
        attrs = []
        if node.name == "CUSTOM":
            attrs.append(f'custom_code = "{node.custom_code}"')
        if node.options is not None:
            for field, v in vars(node.options).items():
                a = _attr_value(field, v)
                if a is not None:
                    attrs.append(f"{_snake(field)} = {a}")
        attrs += [f'tac.device = "{device}"', f'tac.inference_type = "{itype}"']
        ins = [t for t in node.inputs if not (isinstance(t, int) and t < 0)]
        operands = ", ".join(self.name(t) for t in ins)
        results = ", ".join(self.name(t) for t in node.outputs)
        in_types = ", ".join(tensor_type(g, t) for t in ins)
        out_types = ", ".join(tensor_type(g, t) for t in node.outputs)
        op_name = "tfl.custom" if node.name == "CUSTOM" else "tfl." + node.name.lower()
        lhs = f"{results} = " if node.outputs else ""
        self.lines.append(f'{indent}{lhs}"{op_name}"({operands}) {{{", ".join(attrs)}}} : '
                          f"({in_types}) -> ({out_types})")

    def body(self, items, indent: str, defined: set) -> None:
        """Print ops, each preceded by the constants it reads that are not yet defined."""
        g = self.g
        for node, device, itype in items:
            for t in node.inputs:
                if isinstance(t, int) and t < 0:
                    continue
                key = id(t) if isinstance(t, NewTensor) else int(t)
                if key not in defined and g.is_const(t):
                    self.const(t, indent, device)
                    defined.add(key)
            self.op(node, device, itype, indent)
            for t in node.outputs:
                defined.add(id(t) if isinstance(t, NewTensor) else int(t))


def _signature(p: _Printer, args, results) -> tuple[str, str]:
    g = p.g
    arg_text = ", ".join(f"{p.name(t)}: {tensor_type(g, t)}" for t in args)
    res_text = ", ".join(tensor_type(g, t) for t in results)
    return arg_text, f"({res_text})"


def render(result, inline_subgraphs: bool = True) -> str:
    """MLIR text of every partitioned subgraph of `result` (a `TacResult`)."""
    out = ["module {"]
    for index, part in result.partitions.items():
        fname = "main" if index == 0 else f"subgraph_{index}"
        out += _render_partition(part, fname, inline_subgraphs)
    out.append("}")
    return "\n".join(out) + "\n"


def _render_partition(part, fname: str, inline: bool) -> list[str]:
    g = part.graph
    p = _Printer(g)
    lines: list[str] = []
    chosen = part.chosen()
    if not inline:
        owner = {}
        for s, view in enumerate(chosen):
            for n in view.nodes:
                for t in n.outputs:
                    owner[t] = s
        io = _func_io(part)
        for s, sub in enumerate(part.subgraphs):
            args, results = io[s]
            for v, view in enumerate(part.views[s]):
                p.reset()
                p.lines = []
                arg_text, res_text = _signature(p, args, results)
                fn = f"{sub.interface_name}_{view.device}_{view.inference_type}"
                attrs = (f'tac.cost = {view.cost!r} : f32, tac.device = "{view.device}", '
                         f'tac.inference_type = "{view.inference_type}", tac.interface_name = "{sub.interface_name}"')
                lines.append(f"  func.func private @{fn}({arg_text}) -> {res_text} attributes {{{attrs}}} {{")
                p.body([(n, view.device, view.inference_type) for n in view.nodes], "    ",
                       {int(t) for t in args})
                lines += p.lines
                lines.append(f"    func.return {', '.join(p.name(t) for t in results)} : "
                             f"{', '.join(tensor_type(g, t) for t in results)}" if results else "    func.return")
                lines.append("  }")
    p.reset()
    p.lines = []
    arg_text, res_text = _signature(p, g.inputs, g.outputs)
    lines.append(f"  func.func @{fname}({arg_text}) -> {res_text} {{")
    if inline:
        items = [(n, view.device, view.inference_type) for view in chosen for n in view.nodes]
        p.body(items, "    ", set(int(t) for t in g.inputs))
        lines += p.lines
    else:
        io = _func_io(part)
        for s, (sub, view) in enumerate(zip(part.subgraphs, chosen)):
            args, results = io[s]
            fn = f"{sub.interface_name}_{view.device}_{view.inference_type}"
            res = ", ".join(p.name(t) for t in results)
            lhs = f"{res} = " if results else ""
            lines.append(f'    {lhs}"func.call"({", ".join(p.name(t) for t in args)}) <{{callee = @{fn}}}> '
                         f'{{tac.device = "{view.device}", tac.inference_type = "{view.inference_type}", '
                         f'tac.interface_name = "{sub.interface_name}"}} : '
                         f"({', '.join(tensor_type(g, t) for t in args)}) -> "
                         f"({', '.join(tensor_type(g, t) for t in results)})")
    outs = ", ".join(p.name(t) for t in g.outputs)
    lines.append(f"    func.return {outs} : {', '.join(tensor_type(g, t) for t in g.outputs)}" if g.outputs
                 else "    func.return")
    lines.append("  }")
    return lines


def _func_io(part) -> list[tuple[list[int], list[int]]]:
    """Per raised function: its arguments (tensors from outside, not constants) and results
    (tensors used by later functions or returned), in first-use order."""
    g = part.graph
    subs = part.subgraphs
    produced_in = producers(g, subs)
    used_outside: dict[int, None] = {}
    io_args = []
    for s, sub in enumerate(subs):
        args: dict[int, None] = {}
        for i in sub.nodes:
            for t in g.nodes[i].inputs:
                if isinstance(t, int) and t < 0 or g.is_const(t):
                    continue
                if produced_in.get(t) != s:
                    args[int(t)] = None
                    used_outside[int(t)] = None
        io_args.append(list(args))
    outputs = set(g.outputs)
    io = []
    for s, sub in enumerate(subs):
        results = [int(t) for i in sub.nodes for t in g.nodes[i].outputs if t in used_outside or t in outputs]
        io.append((io_args[s], list(dict.fromkeys(results))))
    return io
