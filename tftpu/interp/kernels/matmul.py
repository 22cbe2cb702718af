"""top.MatMul: batched matmul with numpy broadcasting, optional transposed right operand,
bias and fused relu (ONNX MatMul, and Gemm with alpha/beta folded into the weights)."""

from __future__ import annotations

import numpy as np

from tftpu.interp.kernels._registry import as_f32, numel, post_relu, register


def _flops(ins, outs, attrs):
    a = ins[0]
    k = a[-1] if len(a) else 1
    n = numel(outs[0])
    has_bias = len(ins) > 2 and ins[2] is not None
    return n * 2 * k + (n if has_bias else 0) + (n if attrs.get("do_relu") else 0)


@register("MatMul", flops=_flops)
def matmul(operands, attrs):
    """top.MatMul: a @ b (b transposed on its last two axes when right_transpose) + bias."""
    a, b = as_f32(operands[0]), as_f32(operands[1])
    bias = operands[2] if len(operands) > 2 else None
    if attrs.get("right_transpose", False):
        b = np.swapaxes(b, -1, -2)
    y = np.matmul(a, b)
    if bias is not None:
        y = y + as_f32(bias)
    return [post_relu(np.asarray(y, np.float32), attrs)]
