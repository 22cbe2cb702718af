"""Work an op does, from its shapes: arithmetic operations and bytes moved.

Device cost models turn these into time with their own throughput and bandwidth.
"""

from __future__ import annotations

import math

# ops whose work is a few arithmetic operations per output element
_ELEMENTWISE = {"ADD": 1, "SUB": 1, "MUL": 1, "DIV": 4, "NEG": 1, "ABS": 1, "MAXIMUM": 1, "MINIMUM": 1,
                "RELU": 1, "RELU6": 1, "RELU_N1_TO_1": 1, "RELU_0_TO_1": 1, "LEAKY_RELU": 2, "PRELU": 2,
                "HARD_SWISH": 4, "LOGISTIC": 8, "TANH": 8, "EXP": 8, "LOG": 8, "SQRT": 4, "RSQRT": 4,
                "SQUARE": 1, "SQUARED_DIFFERENCE": 2, "POW": 10, "SIN": 8, "COS": 8, "ELU": 8, "GELU": 12,
                "FLOOR": 1, "CEIL": 1, "ROUND": 1, "QUANTIZE": 3, "DEQUANTIZE": 2, "CAST": 1, "SOFTMAX": 10,
                "LOG_SOFTMAX": 12, "L2_NORMALIZATION": 4, "ADD_N": 1, "SELECT": 1, "SELECT_V2": 1,
                "RESIZE_BILINEAR": 8, "RESIZE_NEAREST_NEIGHBOR": 1}
_REDUCE = {"MEAN": 1, "SUM": 1, "REDUCE_MAX": 1, "REDUCE_MIN": 1, "REDUCE_PROD": 1, "ARG_MAX": 1, "ARG_MIN": 1}


def arithmetic_count(op) -> int:
    """Arithmetic operations (a multiply-add counts 2) of `op`, from its tensor shapes."""
    t = op.op_type
    outs = op.output_shapes()
    out = _numel(outs[0]) if outs else 0
    ins = [s for s in op.input_shapes()]
    if t == "CONV_2D" and len(ins) >= 2:
        o, kh, kw, ci = _pad4(ins[1])
        return 2 * out * kh * kw * ci
    if t == "DEPTHWISE_CONV_2D" and len(ins) >= 2:
        _, kh, kw, _ = _pad4(ins[1])
        return 2 * out * kh * kw
    if t == "CONV_3D" and len(ins) >= 2:
        return 2 * out * _numel(ins[1][:-1])
    if t in ("TRANSPOSE_CONV", "Convolution2DTransposeBias"):
        w_index = 1
        if len(ins) > w_index:
            o, kh, kw, _ = _pad4(ins[w_index])
            data = ins[2] if t == "TRANSPOSE_CONV" and len(ins) > 2 else ins[0]
            return 2 * _numel(data) * kh * kw * o
    if t == "FULLY_CONNECTED" and len(ins) >= 2:
        depth = ins[1][-1] if ins[1] else 1
        return 2 * out * depth
    if t == "BATCH_MATMUL" and len(ins) >= 2:
        adj_x = bool(getattr(op.options, "adjX", False))
        k = ins[0][-2] if adj_x else ins[0][-1]
        return 2 * out * k
    if t in ("AVERAGE_POOL_2D", "MAX_POOL_2D", "L2_POOL_2D", "MaxPoolingWithArgmax2D"):
        o = op.options
        kh = getattr(o, "filterHeight", 1) or 1
        kw = getattr(o, "filterWidth", 1) or 1
        return out * kh * kw
    if t in _REDUCE:
        return _numel(ins[0]) if ins else out
    if t in _ELEMENTWISE:
        return _ELEMENTWISE[t] * max(out, max((_numel(s) for s in ins), default=0) if t == "SOFTMAX" else out)
    return 0


def bytes_moved(op) -> int:
    """Bytes read and written: every input (weights included) and every output."""
    g = op.graph
    total = 0
    for t in op.inputs:
        if not (isinstance(t, int) and t < 0):
            total += g.nbytes(t)
    for t in op.outputs:
        total += g.nbytes(t)
    return total


def _numel(shape) -> int:
    return int(math.prod(shape)) if shape else 1


def _pad4(shape):
    s = tuple(shape)
    return (1,) * (4 - len(s)) + s if len(s) < 4 else s[-4:]
