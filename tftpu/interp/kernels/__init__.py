"""Inference kernels of the TOP ops and their FLOPs counts, by op name (without "top.").

    from tftpu.interp.kernels import KERNELS, FLOPS
    y, = KERNELS["Conv"]([x, w, b], {"strides": [2, 2], "pads": [1, 1, 1, 1], "group": 1})
    n = FLOPS["Conv"]([x.shape, w.shape, b.shape], [y.shape], attrs)

Each kernel follows onnxruntime's semantics for the matching ONNX op (tests compare them);
float kernels compute in float32 and call TensorFlow's optimized ops where that is faster
(TF is imported on first use). Results may be read-only views of TF buffers: treat them as
immutable, as kernels treat their operands. NHWC modules (`layout="NHWC"`) run fastest, TF's
CPU kernels being channels-last at heart.
"""

from tftpu.interp.kernels import _registry
from tftpu.interp.kernels._registry import FLOPS, KERNELS, FlopsFn, Kernel
from tftpu.interp.kernels import (  # noqa: F401  (each module registers its ops)
    conv, elementwise, matmul, norm, pool, reduce, resize, shape)

__all__ = ["KERNELS", "FLOPS", "Kernel", "FlopsFn", "clear_weight_cache"]


def clear_weight_cache() -> None:
    """Forget the re-laid-out conv weights (needed only if a weight array was edited in place)."""
    _registry.WEIGHTS.clear()
