"""Estimated cycles of each op of a TPU module on its chip, and the model's latency.

An op costs max(compute, DMA) cycles (the chip overlaps them). Compute: convolutions and
matmuls on the matrix unit count the multiply-adds it issues (contraction padded to its rows,
outputs to its columns: `MatrixUnit.issued_macs`), at the rate of the op's dtype (a float mode
runs the unit at `macs_per_cycle[dtype] / macs_per_cycle[matrix dtype]` of its INT8 rate);
depthwise convolutions and element-wise work run on the lanes' execution units, one channel per
lane. DMA: every byte the op reads and writes crosses DDR at `ddr_bandwidth`. Pure views
(reshape, squeeze) cost nothing; data moves (transpose, concat, pad) cost their DMA.

>>> report = estimate(tpu_model, "npu1")        # doctest: +SKIP
>>> report.latency_us, report.top(3)            # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import math

from xdsl.dialects.builtin import TensorType

from tftpu import chip as chips
from tftpu.ir import attrs as A
from tftpu.ir import tpu
from tftpu.ir.base import numel

__all__ = ["OpCycles", "CycleReport", "estimate", "op_cycles", "conv_cycles", "s2d_stem", "tensor_bytes"]

_VIEWS = {"tpu.Reshape", "tpu.Flatten", "tpu.Squeeze", "tpu.Unsqueeze"}
_MOVES = {"tpu.Permute", "tpu.Concat", "tpu.Slice", "tpu.Split", "tpu.Pad", "tpu.SpaceToDepth",
          "tpu.DepthToSpace", "tpu.Gather"}


@dataclasses.dataclass(frozen=True)
class OpCycles:
    """One op's estimate: its cycles, the compute and DMA parts, and its useful / issued MACs."""

    name: str
    type: str
    cycles: int
    compute: int
    dma: int
    useful_macs: int = 0
    issued_macs: int = 0


@dataclasses.dataclass
class CycleReport:
    """Per op estimates, in program order, and the totals."""

    chip: str
    frequency_hz: float
    ops: list
    matrix_macs_per_cycle: int

    @property
    def cycles(self) -> int:
        return sum(o.cycles for o in self.ops)

    @property
    def latency_us(self) -> float:
        return self.cycles / self.frequency_hz * 1e6

    @property
    def utilisation(self) -> float:
        """Useful multiply-adds over what the matrix unit could do in the cycles its ops take."""
        matrix = [o for o in self.ops if o.issued_macs]
        cycles = sum(o.cycles for o in matrix)
        return sum(o.useful_macs for o in matrix) / (cycles * self.matrix_macs_per_cycle) if cycles else 0.0

    def top(self, n: int = 5) -> list:
        return sorted(self.ops, key=lambda o: (-o.cycles, o.name))[:n]

    def __str__(self) -> str:
        head = ", ".join(f"{o.name} ({o.type}) {o.cycles:,}" for o in self.top(3))
        return (f"estimated latency on {self.chip}: {self.latency_us:,.1f} us ({self.cycles:,} cycles), matrix "
                f"unit utilisation {100 * self.utilisation:.1f}%; top ops by cycles: {head}")


def tensor_bytes(t) -> int:
    """Bytes of a tensor type's data (0 for `none`)."""
    if not isinstance(t, TensorType):
        return 0
    return numel(t.get_shape()) * A.numpy_dtype(A.dtype_name(t.element_type)).itemsize


_MATRIX = ("tpu.Conv", "tpu.MatMul", "tpu.Deconv")
_INTEGER = {"u8": "i8"}


def _dtype(op) -> str:
    """The dtype an op computes in: a float op's type; an INT8 conv / matmul multiplies its data
    at the data's width whatever width it writes (a 16-bit link out costs nothing more; one in
    is two INT8 passes: i16, half the rate; 16-bit weights double the passes again), other
    integer ops work at the width of their widest tensor."""
    out = A.dtype_name(op.results[0].type.element_type)
    if not tpu.is_quantized(op.results[0]):
        return out
    if op.name in _MATRIX and tpu.is_quantized(op.operands[0]):
        data = A.dtype_name(op.operands[0].type.element_type)
        data = _INTEGER.get(data, data)
        if tpu.has_wide_weights(op):
            return {"i8": "i16", "i16": "i32"}.get(data, data)      # 16-bit weights: twice the passes
        return data
    widths = [A.dtype_name(v.type.element_type) for v in (*op.operands, *op.results)
              if isinstance(v.type, TensorType) and tpu.is_quantized(v)]
    return max((_INTEGER.get(w, w) for w in widths), key=lambda w: A.numpy_dtype(w).itemsize)


def _per_lane(chip, dtype: str) -> float:
    """Values of `dtype` one lane's execution unit handles per cycle (an integer width the
    chip does not list: its INT8 rate scaled by the width)."""
    macs = chip.macs_per_cycle
    if dtype in macs:
        return macs[dtype]
    if dtype.startswith("i") and "i8" in macs:
        return macs["i8"] / A.numpy_dtype(dtype).itemsize
    return min(macs.values())


def _rate(chip, dtype: str) -> float:
    """The matrix unit's speed in `dtype` relative to its own dtype."""
    return _per_lane(chip, dtype) / chip.macs_per_cycle[chip.matrix.dtype]


def conv_cycles(chip, dtype: str, batch: int, out_spatial, kernel, in_channels: int, out_channels: int,
                group: int = 1) -> tuple[int, int, int]:
    """(compute cycles, useful MACs, issued MACs) of a conv on `chip` in `dtype`."""
    pixels = batch * math.prod(out_spatial)
    taps = math.prod(kernel)
    cin, cout = in_channels // group, out_channels // group
    useful = pixels * taps * cin * cout * group
    if cin == 1 and group > 1:                     # depthwise: one channel per lane, on the EUs
        per_lane = _per_lane(chip, dtype)
        return math.ceil(-(-out_channels // chip.lanes) * pixels * taps / per_lane), useful, 0
    unit = chip.matrix
    issued = group * unit.issued_macs(pixels, taps, cin, cout)
    return math.ceil(issued / (unit.rows * unit.cols) / _rate(chip, dtype)), useful, issued


def op_cycles(op, chip) -> OpCycles:
    """The estimate of one TPU op run on its own (its operands from DDR, its results to DDR)."""
    dtype = _dtype(op)
    moved = sum(tensor_bytes(v.type) for v in op.operands) + sum(tensor_bytes(r.type) for r in op.results)
    bytes_per_cycle = chip.ddr_bandwidth / chip.frequency_hz
    dma = math.ceil(moved / bytes_per_cycle)
    useful = issued = compute = 0
    if op.name in _VIEWS:
        return OpCycles(op.loc, op.name, 0, 0, 0)
    if op.name == "tpu.Conv":
        a = op.attrs()
        out = op.results[0].type.get_shape()
        nhwc = a["layout"] == "NHWC"
        cin = op.operands[0].type.get_shape()[-1 if nhwc else 1]
        cout = out[-1 if nhwc else 1]
        spatial = out[1:-1] if nhwc else out[2:]
        compute, useful, issued = conv_cycles(chip, dtype, out[0], spatial, a["kernel_shape"], cin, cout, a["group"])
    elif op.name in ("tpu.MatMul", "tpu.Deconv"):
        flops = op.flops()
        useful = flops // 2
        issued = useful
        compute = math.ceil(issued / (chip.matrix.rows * chip.matrix.cols) / _rate(chip, dtype))
    elif op.name not in _MOVES:
        per_lane = _per_lane(chip, dtype)
        work = max(op.flops(), numel(op.results[0].type.get_shape()))
        compute = math.ceil(work / (chip.lanes * per_lane))
    return OpCycles(op.loc, op.name, max(compute, dma), compute, dma, useful, issued)


def estimate(model, chip) -> CycleReport:
    """Cycles of every TPU op of `model` on `chip` (a name, path or Chip)."""
    chip = chips.load(chip)
    ops = [op_cycles(op, chip) for op in model.ops if isinstance(op, tpu.TpuOp)]
    return CycleReport(chip.name, chip.frequency_hz, ops, chip.matrix.rows * chip.matrix.cols)



def s2d_stem(model, chip, block: int = 2) -> dict | None:
    """The first stride-`block` 2-D conv that reads a model input, priced as it is and as its
    space-to-depth form would run (channels x block^2, kernel padded and folded, stride 1, the
    same outputs; `tftpu/configs/chips` S2D rule): {"name", "before", "after"} in cycles, or None."""
    chip = chips.load(chip)
    for op in model.ops:
        if op.name != "tpu.Conv" or len(op.operands[0].type.get_shape()) != 4:
            continue
        src = op.operands[0]
        while src.owner.name in ("tpu.Cast", "tpu.Permute", "tpu.Reshape"):
            src = src.owner.operands[0]
        a = op.attrs()
        if src.owner.name != "top.Input" or a["group"] != 1 or any(s != block for s in a["strides"]) \
                or any(d != 1 for d in a["dilations"]):
            return None
        out = op.results[0].type.get_shape()
        nhwc = a["layout"] == "NHWC"
        cin = op.operands[0].type.get_shape()[-1 if nhwc else 1]
        cout = out[-1 if nhwc else 1]
        spatial = out[1:-1] if nhwc else out[2:]
        dtype = _dtype(op)
        before = conv_cycles(chip, dtype, out[0], spatial, a["kernel_shape"], cin, cout)[0]
        folded = []
        for i, k in enumerate(a["kernel_shape"]):
            top_pad = (-a["pads"][i]) % block
            folded.append((k + top_pad + (-(k + top_pad)) % block) // block)
        after = conv_cycles(chip, dtype, out[0], spatial, folded, cin * block * block, cout)[0]
        return {"name": op.loc, "before": before, "after": after}
    return None
