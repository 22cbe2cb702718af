"""Inference of a TPU module: each op's kernel for its mode (INT8 integer kernels, float kernels
rounding to BF16/F16), over the same plan as the TOP interpreter.

>>> out = TpuInterpreter(tpu_model).run({"input": x})                            # doctest: +SKIP
>>> every = TpuInterpreter(tpu_model).run({"input": x}, dump_all=True, dequantize=True)  # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np

from tftpu.interp.kernels import KERNELS
from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.interp.tpu import float_kernels, int8_kernels, int8_resize  # noqa: F401  (registers the kernels)
from tftpu.interp.tpu.info import OpInfo, info_of
from tftpu.interp.tpu.registry import INT8, OWN
from tftpu.ir import tpu
from tftpu.ir.base import value_name


def module_mode(op) -> str | None:
    """The mode ("INT8", "F16", ...) of the TPU module holding `op`, None outside one."""
    parent = op.parent_op()
    while parent is not None:
        mode = parent.attributes.get("module.mode")
        if mode is not None:
            return mode.data
        parent = parent.parent_op()
    return None


def kernel_of(op, exact_rows: bool = True):
    """A `(operands, attrs) -> results` callable for one TPU (or TOP) op, None if none exists.
    Float window ops run by rows (bit-equal to the simulator's slices) except in F32 modules,
    whose ops are the TOP kernels on whole tensors (bit-equal to TOP), and without
    `exact_rows` (whole tensors: the same up to the float kernels' summation order, many times
    faster; for accuracy figures, not for the simulator's bit-for-bit check)."""
    if not isinstance(op, tpu.TpuOp):
        return KERNELS.get(op.name)
    info = OpInfo.of(op)
    fn = OWN.get(op.name)
    if fn is None:
        fn = INT8.get(op.name) if op.quantized else \
            float_kernels.float_kernel(op.TOP.name, by_rows=exact_rows and module_mode(op) != "F32")
    if fn is None:
        return None

    def kernel(operands, attrs):
        return fn(operands, attrs, info)

    kernel.__name__ = getattr(fn, "__name__", op.name)
    return kernel


class TpuInterpreter(TopInterpreter):
    """A compiled plan for running one TPU model many times (per-op path only). `exact_rows`:
    see `kernel_of`; INT8 ops are bit-exact either way."""

    def __init__(self, model, exact_rows: bool = True):
        self.exact_rows = exact_rows
        super().__init__(model, backend="eager")
        self.infos = {}
        for op in model.ops:
            for r in op.results:
                info = info_of(r.type)
                if info is not None and info.quantized:
                    self.infos[value_name(r)] = info

    def kernel_for(self, op):
        return kernel_of(op, self.exact_rows)

    def run(self, inputs: dict, dump_all: bool = False, observe=None, dequantize: bool = False, keep=()) -> dict:
        """Outputs (every tensor when `dump_all`, and those named in `keep`) by name;
        `dequantize` turns INT8 tensors into the float values they stand for (to compare with TOP)."""
        out = super().run(inputs, dump_all=dump_all, observe=observe, keep=keep)
        if dequantize:
            out = {k: self.infos[k].dequantize(np.asarray(v)) if k in self.infos else v for k, v in out.items()}
        return out


def run(model, inputs: dict, dump_all: bool = False, dequantize: bool = False) -> dict:
    """Run a TPU `model` on `inputs` (name -> array)."""
    return TpuInterpreter(model).run(inputs, dump_all=dump_all, dequantize=dequantize)
