"""Reduction TOP ops: ReduceMean / Max / Min / Sum over static axes."""

from __future__ import annotations

import numpy as np

from tftpu.interp.kernels._registry import as_f32, is_float, register


def _reduce(name, fn):
    def kernel(operands, attrs):
        x = operands[0]
        if is_float(x):
            x = as_f32(x)
        axes = attrs.get("axes")
        axes = None if axes is None or len(axes) == 0 else tuple(int(a) for a in axes)
        keep = attrs.get("keepdims", True)
        y = fn(x, axis=axes, keepdims=True if keep is None else bool(keep))
        return [np.asarray(y, dtype=x.dtype)]
    kernel.__name__ = name
    kernel.__doc__ = f"top.{name}: over `axes` (all axes when empty), keeping dims if keepdims."
    register(f"top.{name}")(kernel)


_reduce("ReduceMean", np.mean)
_reduce("ReduceMax", np.max)
_reduce("ReduceMin", np.min)
_reduce("ReduceSum", np.sum)
