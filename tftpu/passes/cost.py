"""Per-chip cost model that decides whether space-to-depth pays (`tftpu/configs/chips/*.yaml`).

A convolution costs max(compute, memory) on the device; compute counts the multiply-adds the
matrix unit actually issues, with the contraction padded to its rows (per kernel tap on a
TPU-like unit, over the whole im2col row on a CPU) and output channels padded to its columns.
S2D adds the host transform, of which the host's overlap is hidden behind the device. A chip may
add a fixed time to every convolution (`conv_overhead_us`: a GPU's kernel launches and set-up),
which both forms pay, so small batches gain nothing.

>>> t = Target.load("tpu")                                   # doctest: +SKIP
>>> t.s2d_estimate(stem, stem_s2d)["speedup"] > 1            # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Sequence

from tftpu import chip as chips
from tftpu.chip import DTYPE_BYTES


@dataclasses.dataclass(frozen=True)
class ConvGeometry:
    """Shapes of one convolution: batch, spatial sizes, kernel, channels."""

    batch: int
    in_spatial: Sequence[int]
    out_spatial: Sequence[int]
    kernel: Sequence[int]
    in_channels: int
    out_channels: int
    host_dtype_bytes: int = 4     # bytes per element of the image on the host


@dataclasses.dataclass(frozen=True)
class Target:
    """What the S2D cost model reads of a chip (`tftpu.chip.Chip`): its matrix unit, memory
    and host."""

    name: str
    contraction: str
    matrix_rows: int
    matrix_cols: int
    peak_flops: float
    memory_bandwidth: float
    dtype_bytes: int
    host_bandwidth: float
    host_overlap: float
    min_speedup: float
    description: str = ""
    overhead_s: float = 0.0       # fixed time of each convolution, either form (a GPU's launches)

    @classmethod
    def of(cls, chip: chips.Chip) -> "Target":
        """The cost view of a chip."""
        m = chip.matrix
        return cls(chip.name, m.contraction, m.rows, m.cols, chip.peak_flops(), chip.ddr_bandwidth,
                   DTYPE_BYTES[m.dtype], chip.host.bandwidth, chip.host.overlap, chip.s2d_min_speedup,
                   chip.description, chip.conv_overhead_us * 1e-6)

    @classmethod
    def load(cls, name_or_path: str | os.PathLike) -> "Target":
        """The target of chip `tftpu/configs/chips/NAME.yaml`, or of a chip yaml at a path."""
        if isinstance(name_or_path, Target):
            return name_or_path
        return cls.of(chips.load(name_or_path))

    def conv_seconds(self, g: ConvGeometry) -> dict:
        """Estimated device time of a convolution, with its parts."""
        taps = math.prod(g.kernel)
        pixels = g.batch * math.prod(g.out_spatial)
        unit = chips.MatrixUnit(self.contraction, self.matrix_rows, self.matrix_cols, "")
        macs = unit.issued_macs(pixels, taps, g.in_channels, g.out_channels)
        useful = pixels * taps * g.in_channels * g.out_channels
        elems = (g.batch * math.prod(g.in_spatial) * g.in_channels + pixels * g.out_channels
                 + taps * g.in_channels * g.out_channels)
        compute = 2.0 * macs / self.peak_flops
        memory = elems * self.dtype_bytes / self.memory_bandwidth
        return {"seconds": max(compute, memory) + self.overhead_s, "compute_s": compute, "memory_s": memory,
                "utilization": useful / macs}

    def s2d_estimate(self, original: ConvGeometry, rewritten: ConvGeometry) -> dict:
        """Costs of the original conv and of its S2D form (host transform included)."""
        a = self.conv_seconds(original)
        b = self.conv_seconds(rewritten)
        image_bytes = original.batch * math.prod(original.in_spatial) * original.in_channels * original.host_dtype_bytes
        host = 2.0 * image_bytes / self.host_bandwidth * (1.0 - self.host_overlap)
        total = b["seconds"] + host
        speedup = a["seconds"] / total if total > 0 else float("inf")
        return {
            "original_us": a["seconds"] * 1e6, "s2d_us": b["seconds"] * 1e6, "host_us": host * 1e6,
            "speedup": speedup, "util_original": a["utilization"], "util_s2d": b["utilization"],
            "min_speedup": self.min_speedup,
        }

