"""Float TPU ops (F32, BF16, F16): the TOP op's kernel in float32 on the (exactly widened)
operands, its result rounded to the mode's type (ties to even), as a chip that computes in
float32 and stores BF16/F16 does. Window ops and global pools run by rows and by images
(`float_rows`), so that the simulator's slices of a tensor are bit-equal to it; in an F32
module they run whole instead, and the result is the TOP kernel's, bit for bit."""

from __future__ import annotations

from tftpu.interp.kernels import KERNELS
from tftpu.interp.tpu import native
from tftpu.interp.tpu.float_rows import canonical


def float_kernel(top_name: str, by_rows: bool = True):
    """The float kernel of the TPU op mirroring `top_name`, or None when TOP has none;
    `by_rows=False` runs the TOP kernel on whole tensors (F32 modules)."""
    kernel = KERNELS.get(top_name)
    if kernel is None:
        return None
    if by_rows:
        kernel = canonical(top_name, kernel)

    def run(operands, attrs, info):
        results = kernel([native.widened(x) for x in operands], attrs)
        return [native.to_float(r, i.dtype) if i.dtype in ("f32", "f16", "bf16") and r.dtype.kind == "f" else r
                for r, i in zip(results, info.outs)]

    run.__name__ = f"float_{top_name.replace('.', '_')}"
    return run
