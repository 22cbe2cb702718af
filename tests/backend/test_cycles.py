"""The cycle model: known answers for the matrix unit and the lanes, float modes slower than
INT8 as the chip's rates say, and the space-to-depth estimate of a stem (issue 13's goal: the
first conv at least 2x faster for ResNet50's 7x7 and MobileNetV2's 3x3 stems)."""

from __future__ import annotations

import numpy as np
import pytest

from tftpu import chip as chips
from tftpu.backend import estimate, s2d_stem
from tftpu.backend.cycles import conv_cycles
from tftpu.ir import TopBuilder
from tftpu.quant import CalibrationTable
from tftpu.transforms.lowering import lower


def test_matrix_unit_known_answers():
    npu1 = chips.load("npu1")
    # 64 -> 64 channels fill the 64x64 unit: one cycle per (pixel, tap)
    assert conv_cycles(npu1, "i8", 1, (56, 56), (3, 3), 64, 64) == (56 * 56 * 9, 56 * 56 * 9 * 64 * 64,
                                                                     56 * 56 * 9 * 64 * 64)
    # 3 input channels still take all 64 rows: the same cycles as 64 channels, 3/64 utilised
    cycles, useful, issued = conv_cycles(npu1, "i8", 1, (112, 112), (7, 7), 3, 64)
    assert cycles == 112 * 112 * 49 and useful * 64 == issued * 3
    # F32 runs the unit at 16/64 of its INT8 rate, F16 at 32/64
    assert conv_cycles(npu1, "f32", 1, (56, 56), (3, 3), 64, 64)[0] == 4 * 56 * 56 * 9
    assert conv_cycles(npu1, "f16", 1, (56, 56), (3, 3), 64, 64)[0] == 2 * 56 * 56 * 9
    # depthwise: one channel per lane on the execution units (64 lanes, 64 INT8 MACs each)
    assert conv_cycles(npu1, "i8", 1, (56, 56), (3, 3), 128, 128, group=128) == (2 * 56 * 56 * 9 // 64,
                                                                                  56 * 56 * 9 * 128, 0)


def stem(kernel: int, cout: int, size: int):
    """An image input and a stride-2 SAME stem conv with ReLU, as keras applications start."""
    rng = np.random.default_rng(0)
    b = TopBuilder(f"stem{kernel}")
    x = b.input("image", (1, 3, size, size))
    p = (kernel - 1) // 2
    pads = [p, p, kernel - 1 - p, kernel - 1 - p] if kernel % 2 == 0 else [p] * 4
    c = b.op("Conv", [x, b.weight("w", rng.normal(size=(cout, 3, kernel, kernel)).astype(np.float32)), b.none()],
             {"kernel_shape": [kernel, kernel], "strides": [2, 2], "pads": pads, "do_relu": True}, "stem")
    return b.finish([c])


@pytest.mark.parametrize("kernel,cout", [(7, 64), (3, 32)], ids=["resnet50_7x7", "mobilenetv2_3x3"])
@pytest.mark.parametrize("chip,mode", [("npu1", "INT8"), ("npu1", "F32"), ("edge16", "INT8"), ("edge16", "F16")])
def test_s2d_stem_at_least_twice_as_fast(kernel, cout, chip, mode):
    model = stem(kernel, cout, 224)
    table = CalibrationTable({"image": (1.0, -1.0, 1.0), "stem": (4.0, 0.0, 4.0)})
    tpu, _ = lower(model, chip, mode, table)
    est = s2d_stem(tpu, chip)
    assert est["name"].startswith("stem") and est["before"] >= 2 * est["after"], est   # (an output: stem_i8)
    report = estimate(tpu, chip)
    conv = [o for o in report.ops if o.type == "tpu.Conv"][0]
    assert conv.cycles >= est["before"] and report.latency_us > 0 and 0 < report.utilisation <= 1


def test_no_stem_estimate_without_a_stride_two_first_conv():
    rng = np.random.default_rng(0)
    b = TopBuilder("s1")
    x = b.input("x", (1, 3, 16, 16))
    c = b.op("Conv", [x, b.weight("w", rng.normal(size=(8, 3, 3, 3)).astype(np.float32)), b.none()],
             {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, "c")
    tpu, _ = lower(b.finish([c]), "npu1", "F32")
    assert s2d_stem(tpu, "npu1") is None


def test_sixteen_bit_links_are_priced_as_int8_compute_with_wider_dma():
    """A conv writing a 16-bit link multiplies INT8 data: the same compute as one writing 8 bits,
    only the DMA of its wider output grows; an Add reading a 16-bit link runs its lanes at
    half the INT8 width (npu1 lists no i16 rate)."""
    from tests.quant.test_links import residual_stack
    from tests.interp.test_tpu_int8_exact import feeds, table_for
    from tftpu.backend.cycles import op_cycles

    model = residual_stack(blocks=1, c=64, seed=0)
    table = table_for(model, feeds({"x": (1, 64, 6, 6)}, 0), spread=(1.0, 1.0))
    npu1 = chips.load("npu1")
    cost = {}
    for wide in (False, True):
        tm, _ = lower(model, npu1, "INT8", table, wide_links=wide)
        cost[wide] = {op.loc: op_cycles(op, npu1) for op in tm.ops if op.name in ("tpu.Conv", "tpu.Add")}
    conv, add = cost[True]["c0"], cost[True]["a0"]
    assert conv.compute == cost[False]["c0"].compute and conv.dma > cost[False]["c0"].dma
    assert add.compute == 2 * cost[False]["a0"].compute
