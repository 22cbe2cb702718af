"""Window geometry, once: output sizes of conv / pool / deconv windows, SAME and explicit pads,
and the input rows (plus halo) that a range of output rows reads.

It sits at the bottom layer (beside `utils`) because the TF-graph side and the compiler both
need it and neither may import the other.

Everything here is per spatial axis and in plain ints, so the verifier, the kernels, the
importers, the TF lowering, the S2D pass and layer-group slicing all share one arithmetic.
Conventions are ONNX's: `pb` / `pe` are the pads at the beginning / end of the axis, `d` the
dilation; SAME_UPPER (TensorFlow's SAME) puts the odd pad at the end, SAME_LOWER at the start.

>>> conv_out(224, 7, s=2, pb=3, pe=3)
112
>>> same_pads(224, 7, s=2)
(2, 3)
>>> input_range(0, 4, 3, s=2, pb=1, size=8)
InputRange(start=0, stop=8, pad_before=1, pad_after=0)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from tftpu.errors import ShapeError

__all__ = ["span", "conv_out", "pool_out", "pool_window", "deconv_out", "same_pads", "explicit_pads",
           "deconv_pads", "transpose_same_pads", "InputRange", "input_range", "AxisPlan"]


def span(k: int, d: int = 1) -> int:
    """Extent of a dilated window: `d * (k - 1) + 1` input elements."""
    return d * (k - 1) + 1


def conv_out(size: int, k: int, s: int = 1, d: int = 1, pb: int = 0, pe: int = 0) -> int:
    """Output length of a convolution (or a floor-mode pool) window along one axis."""
    return (size + pb + pe - span(k, d)) // s + 1


def pool_window(size: int, k: int, s: int, pb: int = 0, pe: int = 0, d: int = 1,
                ceil_mode: bool = False) -> tuple[int, int]:
    """(output length, extra end pad the last window needs) of a pooling window, as ONNX and
    onnxruntime count them: ceil mode adds a partial last window unless it would start in the
    end pad."""
    num = size + pb + pe - span(k, d)
    if ceil_mode:
        out = -(-num // s) + 1
        if (out - 1) * s >= size + pb:
            out -= 1
    else:
        out = num // s + 1
    return out, max(0, (out - 1) * s + span(k, d) - (size + pb + pe))


def pool_out(size: int, k: int, s: int, pb: int = 0, pe: int = 0, ceil_mode: bool = False, d: int = 1) -> int:
    """Output length of a pooling window (see `pool_window`)."""
    return pool_window(size, k, s, pb, pe, d, ceil_mode)[0]


def deconv_out(size: int, k: int, s: int = 1, d: int = 1, pb: int = 0, pe: int = 0, output_padding: int = 0) -> int:
    """Output length of a transposed convolution (ONNX ConvTranspose) along one axis."""
    return s * (size - 1) + output_padding + span(k, d) - pb - pe


def same_pads(size: int, k: int, s: int = 1, d: int = 1, lower: bool = False) -> tuple[int, int]:
    """(pb, pe) of SAME padding: output ceil(size / s); the odd pad at the end (SAME_UPPER,
    TensorFlow's SAME) or, with `lower`, at the beginning (SAME_LOWER)."""
    out = -(-size // s)
    total = max((out - 1) * s + span(k, d) - size, 0)
    small = total // 2
    return (total - small, small) if lower else (small, total - small)


def explicit_pads(padding, size: int, k: int, s: int = 1, d: int = 1) -> tuple[int, int]:
    """(pb, pe) from a padding mode ("SAME", "SAME_UPPER", "SAME_LOWER", "VALID") or a pair."""
    if isinstance(padding, str):
        mode = padding.upper()
        if mode in ("SAME", "SAME_UPPER"):
            return same_pads(size, k, s, d)
        if mode == "SAME_LOWER":
            return same_pads(size, k, s, d, lower=True)
        if mode == "VALID":
            return 0, 0
        raise ShapeError(f"unknown padding {padding!r}")
    pb, pe = (int(v) for v in padding)
    return pb, pe


def deconv_pads(size: int, out: int, k: int, s: int = 1, d: int = 1, output_padding: int = 0,
                upper: bool = False) -> tuple[int, int]:
    """(pb, pe) giving a transposed convolution the output length `out` (ONNX `output_shape`
    or SAME); SAME_UPPER puts the smaller half first, NOTSET and SAME_LOWER the larger, as
    onnxruntime does."""
    total = s * (size - 1) + output_padding + span(k, d) - out
    if total < 0:
        raise ShapeError(f"output length {out} needs negative pads")
    return (total // 2, total - total // 2) if upper else (total - total // 2, total // 2)


def transpose_same_pads(k: int, s: int) -> tuple[int, int]:
    """(pb, pe) of TensorFlow's SAME transposed convolution (output = input * s)."""
    total = max(k - s, 0)
    return total // 2, total - total // 2


@dataclasses.dataclass(frozen=True)
class InputRange:
    """The input rows `[start, stop)` an output row range reads, and the pad rows it needs
    before and after them (zeros that lie outside the input)."""

    start: int
    stop: int
    pad_before: int
    pad_after: int

    @property
    def rows(self) -> int:
        """Rows loaded from the input (pads excluded)."""
        return self.stop - self.start


def input_range(out_start: int, out_stop: int, k: int, s: int = 1, d: int = 1, pb: int = 0,
                size: int | None = None) -> InputRange:
    """The input rows output rows `[out_start, out_stop)` of a window read: for slicing a conv
    or pool along H, where neighbouring slices overlap by the halo `span(k, d) - s` rows."""
    if out_stop <= out_start:
        raise ShapeError(f"empty output range [{out_start}, {out_stop})")
    first = out_start * s - pb
    last = (out_stop - 1) * s - pb + span(k, d)      # one past the last row read
    end = last if size is None else size
    start, stop = min(max(first, 0), end), min(max(last, 0), end)
    return InputRange(start, max(start, stop), min(max(-first, 0), last - first), max(0, last - max(first, end)))


# ---------------------------------------------------------------- space-to-depth of a strided conv

@dataclasses.dataclass(frozen=True)
class AxisPlan:
    """The S2D rewrite of one spatial axis of a convolution."""

    size: int
    kernel: int
    stride: int
    block: int
    pads: tuple[int, int]

    def __post_init__(self):
        if self.block < 1 or self.stride % self.block:
            raise ShapeError(f"block size {self.block} does not divide stride {self.stride}")
        if self.out < 1:
            raise ShapeError(f"conv axis of size {self.size} with kernel {self.kernel} has no output")

    @classmethod
    def from_padding(cls, size: int, kernel: int, stride: int, block: int,
                     padding: str | Sequence[int] = "VALID") -> "AxisPlan":
        """Plan from TF padding: "VALID", "SAME" or explicit (begin, end)."""
        if isinstance(padding, str):
            if padding.upper() == "SAME":
                pads = same_pads(size, kernel, stride)
            elif padding.upper() == "VALID":
                pads = (0, 0)
            else:
                raise ShapeError(f"unknown padding {padding!r}")
        else:
            pads = (int(padding[0]), int(padding[1]))
        return cls(size, kernel, stride, block, pads)

    @property
    def out(self) -> int:
        return conv_out(self.size, self.kernel, self.stride, 1, *self.pads)

    @property
    def ph_top(self) -> int:
        return (-self.pads[0]) % self.block

    @property
    def ph_bot(self) -> int:
        return (-(self.kernel + self.ph_top)) % self.block

    @property
    def padded_kernel(self) -> int:
        return self.kernel + self.ph_top + self.ph_bot

    @property
    def new_kernel(self) -> int:
        return self.padded_kernel // self.block

    @property
    def new_stride(self) -> int:
        return self.stride // self.block

    @property
    def blocked_size(self) -> int:
        """Size of the S2D input along this axis (input zero-padded to a multiple of b)."""
        return math.ceil(self.size / self.block)

    @property
    def size_pad(self) -> int:
        """Zeros appended to the input so that b divides its size."""
        return self.blocked_size * self.block - self.size

    @property
    def begin(self) -> int:
        return (self.pads[0] + self.ph_top) // self.block

    @property
    def end(self) -> int:
        return (self.out - 1) * self.new_stride + self.new_kernel - self.begin - self.blocked_size
