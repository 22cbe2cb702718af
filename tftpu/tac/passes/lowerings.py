"""Device lowerings: rewrite an op a device lacks into ops it has, with the same results.

Each pattern is `f(node, graph) -> list[Node] | None` (None: does not apply). The replacement
writes the original op's output tensors, so the rest of the graph is untouched. Patterns that
would change numerics of quantized ops match float ops only.

| pattern | rewrite |
|---|---|
| LowerPackIntoConcatReshape | Pack(x_i, axis) -> Concat(Reshape(x_i, insert 1 at axis), axis) |
| UnrollSplit / UnrollSplitV | Split -> one Slice per output |
| SubToAdd | Sub(x, y) -> Add(x, Neg(y)) |
| SquaredDifference | SquaredDifference(x, y) -> Mul(Sub(x, y), Sub(x, y)) |
| EnsureBiasForConv2d | Conv2D without bias -> Conv2D with a zero bias |
| PadSlice / PadConcat | rank < 4 Slice / Concat -> Reshape to 4-D, op, Reshape back |
| FullyConnectedToConv | FC -> Reshape, 1x1 Conv2D, Reshape |
| ReduceMeanToAvgPool | Mean over H, W of NHWC -> AveragePool2D (+ Reshape) |
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from tftpu.tac.graph import FLOAT, Graph, NewTensor, Node, make_node, options

_NONE, _VALID = 0, 1  # ActivationFunctionType.NONE, Padding.VALID


class _Names:
    """Deterministic names for new tensors: `<output name>/tac_<what>_<k>`."""

    def __init__(self, graph: Graph, node: Node):
        self.base = graph.tensor_name(node.outputs[0]) if node.outputs else "tac"
        self.k = 0

    def __call__(self, what: str) -> str:
        self.k += 1
        return f"{self.base}/tac_{what}_{self.k}"


def _const(name: str, value: np.ndarray) -> NewTensor:
    dtype = {np.dtype(np.int32): "int32", np.dtype(np.float32): "float32"}[value.dtype]
    return NewTensor(value.shape, dtype, name, data=np.ascontiguousarray(value))


def _reshape(g: Graph, x, shape, names: _Names, out=None) -> tuple[Node, object]:
    shape = [int(d) for d in shape]
    if out is None:
        out = NewTensor(shape, g.dtype(x), names("reshape"), quant=g.quant(x))
    spec = _const(names("shape"), np.asarray(shape, np.int32))
    node = make_node(g, "RESHAPE", [x, spec], [out], options("ReshapeOptions", newShape=shape))
    return node, out


def _is_float(g: Graph, node: Node) -> bool:
    return node.inference_type == FLOAT and all(g.dtype(t) == "float32" for t in node.activations())


def _int_const(g: Graph, t) -> np.ndarray | None:
    v = g.const_value(t)
    return None if v is None else np.asarray(v).astype(np.int64)


# -- patterns --------------------------------------------------------------------------------------
def lower_pack(node: Node, g: Graph):
    if node.name != "PACK" or not node.inputs:
        return None
    rank = len(g.shape(node.inputs[0]))
    axis = int(getattr(node.options, "axis", 0) or 0)
    if axis < 0:
        axis += rank + 1
    names = _Names(g, node)
    ops, parts = [], []
    for x in node.inputs:
        s = list(g.shape(x))
        op, y = _reshape(g, x, s[:axis] + [1] + s[axis:], names)
        ops.append(op)
        parts.append(y)
    ops.append(make_node(g, "CONCATENATION", parts, [node.outputs[0]],
                         options("ConcatenationOptions", axis=axis, fusedActivationFunction=_NONE)))
    return ops


def _slices(node: Node, g: Graph, x, dim: int):
    names = _Names(g, node)
    rank = len(g.shape(x))
    ops, begin = [], 0
    for out in node.outputs:
        size = g.shape(out)[dim]
        b = [0] * rank
        b[dim] = begin
        s = [-1] * rank
        s[dim] = size
        begin += size
        ops.append(make_node(g, "SLICE", [x, _const(names("begin"), np.asarray(b, np.int32)),
                                          _const(names("size"), np.asarray(s, np.int32))], [out],
                             options("SliceOptions")))
    return ops


def unroll_split(node: Node, g: Graph):
    if node.name != "SPLIT" or len(node.inputs) != 2:
        return None
    return _split_to_slices(node, g, axis_input=0, data_input=1)


def unroll_splitv(node: Node, g: Graph):
    if node.name != "SPLIT_V" or len(node.inputs) != 3:
        return None
    return _split_to_slices(node, g, axis_input=2, data_input=0)


def _split_to_slices(node: Node, g: Graph, axis_input: int, data_input: int):
    """SLICE ops for a SPLIT/SPLIT_V whose axis is a constant scalar, else None."""
    axis = _int_const(g, node.inputs[axis_input])
    if axis is None or axis.size != 1:
        return None
    x = node.inputs[data_input]
    return _slices(node, g, x, int(axis.reshape(-1)[0]) % len(g.shape(x)))


def sub_to_add(node: Node, g: Graph):
    if node.name != "SUB" or not _is_float(g, node) or len(node.inputs) != 2:
        return None
    x, y = node.inputs
    names = _Names(g, node)
    neg_y = NewTensor(g.shape(y), g.dtype(y), names("neg"))
    act = int(getattr(node.options, "fusedActivationFunction", 0) or 0)
    return [make_node(g, "NEG", [y], [neg_y], options("NegOptions")),
            make_node(g, "ADD", [x, neg_y], list(node.outputs), options("AddOptions", fusedActivationFunction=act))]


def squared_difference(node: Node, g: Graph):
    if node.name != "SQUARED_DIFFERENCE" or not _is_float(g, node):
        return None
    x, y = node.inputs
    names = _Names(g, node)
    out = node.outputs[0]
    d = NewTensor(g.shape(out), g.dtype(out), names("diff"))
    return [make_node(g, "SUB", [x, y], [d], options("SubOptions", fusedActivationFunction=_NONE)),
            make_node(g, "MUL", [d, d], [out], options("MulOptions", fusedActivationFunction=_NONE))]


def ensure_bias_conv2d(node: Node, g: Graph):
    if node.name != "CONV_2D" or not _is_float(g, node):
        return None
    bias = node.inputs[2] if len(node.inputs) > 2 else -1
    if not (isinstance(bias, int) and bias < 0):
        return None
    names = _Names(g, node)
    channels = g.shape(node.outputs[0])[-1]
    bias = _const(names("bias"), np.zeros([channels], np.float32))
    return [node.clone(inputs=[node.inputs[0], node.inputs[1], bias], src=None)]


def _pad_to_4d(shape) -> list[int]:
    return [1] * (4 - len(shape)) + list(shape)


def pad_slice(node: Node, g: Graph):
    if node.name != "SLICE" or len(node.inputs) != 3:
        return None
    x, b, s = node.inputs
    shape = g.shape(x)
    begin, size = _int_const(g, b), _int_const(g, s)
    if len(shape) >= 4 or begin is None or size is None:
        return None
    names = _Names(g, node)
    out = node.outputs[0]
    r1, x4 = _reshape(g, x, _pad_to_4d(shape), names)
    y4 = NewTensor(_pad_to_4d(g.shape(out)), g.dtype(out), names("slice"), quant=g.quant(out))
    pad = 4 - len(shape)
    b4 = _const(names("begin"), np.asarray([0] * pad + list(begin), np.int32))
    s4 = _const(names("size"), np.asarray([1] * pad + list(size), np.int32))
    sl = make_node(g, "SLICE", [x4, b4, s4], [y4], options("SliceOptions"))
    r2, _ = _reshape(g, y4, g.shape(out), names, out=out)
    return [r1, sl, r2]


def pad_concat(node: Node, g: Graph):
    if node.name != "CONCATENATION" or not node.inputs:
        return None
    rank = len(g.shape(node.inputs[0]))
    if rank >= 4:
        return None
    names = _Names(g, node)
    ops, parts = [], []
    for x in node.inputs:
        op, y = _reshape(g, x, _pad_to_4d(g.shape(x)), names)
        ops.append(op)
        parts.append(y)
    out = node.outputs[0]
    axis = int(node.options.axis)
    if axis < 0:
        axis += rank
    axis += 4 - rank
    act = int(getattr(node.options, "fusedActivationFunction", 0) or 0)
    y4 = NewTensor(_pad_to_4d(g.shape(out)), g.dtype(out), names("concat"), quant=g.quant(out))
    ops.append(make_node(g, "CONCATENATION", parts, [y4],
                         options("ConcatenationOptions", axis=axis, fusedActivationFunction=act)))
    ops.append(_reshape(g, y4, g.shape(out), names, out=out)[0])
    return ops


def fully_connected_to_conv(node: Node, g: Graph):
    if node.name != "FULLY_CONNECTED" or not _is_float(g, node) or len(node.inputs) < 2:
        return None
    o = node.options
    if o is not None and int(getattr(o, "weightsFormat", 0) or 0) != 0:
        return None
    x, w = node.inputs[0], node.inputs[1]
    if g.dtype(w) != "float32" or len(g.shape(w)) != 2:
        return None
    out_units, depth = g.shape(w)
    n = g.numel(x)
    if depth == 0 or n % depth:
        return None
    width = n // depth
    names = _Names(g, node)
    ops = []
    r_in, x4 = _reshape(g, x, [1, 1, width, depth], names)
    ops.append(r_in)
    if g.is_const(w) and not isinstance(w, NewTensor) and g.tensors[w].sparsity is None:
        w4 = NewTensor([out_units, 1, 1, depth], "float32", names("filter"), buffer=g.tensors[w].buffer)
    else:
        r_w, w4 = _reshape(g, w, [out_units, 1, 1, depth], names)
        ops.append(r_w)
    bias = node.inputs[2] if len(node.inputs) > 2 else -1
    if isinstance(bias, int) and bias < 0:
        bias = _const(names("bias"), np.zeros([out_units], np.float32))
    out = node.outputs[0]
    y4 = NewTensor([1, 1, width, out_units], g.dtype(out), names("conv"))
    act = int(getattr(o, "fusedActivationFunction", 0) or 0) if o is not None else 0
    ops.append(make_node(g, "CONV_2D", [x4, w4, bias], [y4],
                         options("Conv2DOptions", padding=_VALID, strideW=1, strideH=1,
                                 fusedActivationFunction=act, dilationWFactor=1, dilationHFactor=1)))
    ops.append(_reshape(g, y4, g.shape(out), names, out=out)[0])
    return ops


def reduce_mean_to_avg_pool(node: Node, g: Graph):
    if node.name != "MEAN" or len(node.inputs) != 2 or not _is_float(g, node):
        return None
    x, axes = node.inputs
    shape = g.shape(x)
    ax = _int_const(g, axes)
    if len(shape) != 4 or ax is None or sorted(int(a) % 4 for a in ax.reshape(-1)) != [1, 2]:
        return None
    b, h, w, c = shape
    names = _Names(g, node)
    out = node.outputs[0]
    keep = bool(getattr(node.options, "keepDims", False))
    pooled = out if keep else NewTensor([b, 1, 1, c], g.dtype(out), names("avgpool"))
    ops = [make_node(g, "AVERAGE_POOL_2D", [x], [pooled],
                     options("Pool2DOptions", padding=_VALID, strideW=1, strideH=1, filterWidth=w,
                             filterHeight=h, fusedActivationFunction=_NONE))]
    if not keep:
        ops.append(_reshape(g, pooled, g.shape(out), names, out=out)[0])
    return ops


PATTERNS: dict[str, Callable] = {
    "LowerPackIntoConcatReshape": lower_pack,
    "UnrollSplit": unroll_split,
    "UnrollSplitV": unroll_splitv,
    "SubToAdd": sub_to_add,
    "SquaredDifference": squared_difference,
    "EnsureBiasForConv2d": ensure_bias_conv2d,
    "PadSlice": pad_slice,
    "PadConcat": pad_concat,
    "FullyConnectedToConv": fully_connected_to_conv,
    "ReduceMeanToAvgPool": reduce_mean_to_avg_pool,
}


def resolve(transformations) -> list[tuple[str, Callable]]:
    """Turn a device's `transformations()` (names or callables) into (name, function) pairs."""
    from tftpu import errors

    out = []
    for t in transformations:
        if callable(t):
            out.append((getattr(t, "__name__", "custom"), t))
        elif t in PATTERNS:
            out.append((t, PATTERNS[t]))
        else:
            raise errors.ConfigError(f"unknown TAC transformation '{t}' (known: {', '.join(PATTERNS)})")
    return out


def apply(nodes: list[Node], graph: Graph, patterns, max_steps: int = 10000) -> tuple[list[Node], dict]:
    """Apply `patterns` to a fixed point; return the new op list and {pattern: times applied}."""
    counts: dict[str, int] = {}
    if not patterns:
        return list(nodes), counts
    work = list(reversed(nodes))
    out: list[Node] = []
    steps = 0
    while work:
        n = work.pop()
        for name, fn in patterns:
            repl = fn(n, graph)
            if repl is not None:
                counts[name] = counts.get(name, 0) + 1
                steps += 1
                if steps > max_steps:
                    raise RuntimeError("lowerings do not reach a fixed point")
                work.extend(reversed(repl))
                break
        else:
            out.append(n)
    return out, counts
