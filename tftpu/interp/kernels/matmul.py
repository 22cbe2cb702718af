"""top.MatMul: batched matmul with numpy broadcasting, optional transposed right operand,
bias and fused relu (ONNX MatMul, and Gemm with alpha/beta folded into the weights).

Float32 matmuls of rank >= 2 run TF's MatMul / BatchMatMulV2 (multi-threaded, and steady on
a loaded machine, unlike a spinning BLAS pool); the right operand is converted once per array.
"""

from __future__ import annotations

import numpy as np

from tftpu.interp.kernels._registry import (
    WEIGHTS, as_f32, bias_const, post_relu, register, relu_limit, tf, tf_epilogue)


@register("top.MatMul")
def matmul(operands, attrs):
    """top.MatMul: a @ b (b transposed on its last two axes when right_transpose) + bias."""
    a, b = as_f32(operands[0]), as_f32(operands[1])
    bias = operands[2] if len(operands) > 2 else None
    rt = bool(attrs["right_transpose"])
    fused = relu_limit(attrs) if attrs.get("do_relu", False) else None
    if a.ndim >= 2 and b.ndim >= 2 and a.size and b.size:
        t = tf()
        bt = WEIGHTS.get(b, ("matmul",), lambda: t.constant(b))
        if a.ndim == 2 and b.ndim == 2:
            y = t.raw_ops.MatMul(a=a, b=bt, transpose_b=rt)
        else:
            y = t.raw_ops.BatchMatMulV2(x=a, y=bt, adj_y=rt)
        return [tf_epilogue(y, None if bias is None else bias_const(bias, np.shape(bias)),
                            fused)]
    if rt:
        b = np.swapaxes(b, -1, -2)
    y = np.matmul(a, b)
    if bias is not None:
        y = y + as_f32(bias)
    return [post_relu(np.asarray(y, np.float32), attrs)]
