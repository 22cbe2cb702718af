"""Inference kernels of the TOP ops, by full op name.

    from tftpu.interp.kernels import KERNELS
    y, = KERNELS["top.Conv"]([x, w, b], {"strides": [2, 2], "pads": [1, 1, 1, 1], "group": 1})

Each kernel follows onnxruntime's semantics for the matching ONNX op (tests compare them);
float kernels compute in float32 and call TensorFlow's optimized ops where that is faster
(TF is imported on first use). Results may be read-only views of TF buffers: treat them as
immutable, as kernels treat their operands. NHWC modules (`layout="NHWC"`) run fastest, TF's
CPU kernels being channels-last at heart.
"""

from tftpu.interp.kernels import _registry
from tftpu.interp.kernels._registry import KERNELS, Kernel
from tftpu.interp.kernels import (  # noqa: F401  (each module registers its ops)
    conv, elementwise, matmul, norm, pool, reduce, resize, shape)
from tftpu.interp.kernels._registry import register

register("layout.reorder")(lambda operands, attrs: [operands[0]])   # a format change keeps the values

__all__ = ["KERNELS", "Kernel", "clear_weight_cache"]


def clear_weight_cache() -> None:
    """Forget the re-laid-out conv weights (needed only if a weight array was edited in place)."""
    _registry.WEIGHTS.clear()
