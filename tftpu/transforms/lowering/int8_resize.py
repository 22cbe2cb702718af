"""INT8 Resize on its input's grid (a resize does not change the range): nearest moves int8
bytes; linear interpolates in exact integers (10-bit fixed-point source coordinates, the rule
in `tftpu.interp.tpu.int8_resize`)."""

from __future__ import annotations

from tftpu.transforms.lowering.int8_pool import same_grid
from tftpu.transforms.lowering.registry import int8

# the modes with an integer rule (the TOP op has no others today; a cubic one would overshoot
# its input's range, so it could not keep the input's grid)
MODES = ("nearest", "linear")


def is_data_move(op) -> bool:
    """Whether a `top.Resize` only moves elements (nearest): it then follows a float input."""
    return op.attrs()["mode"] == "nearest"


@int8("top.Resize")
def resize(ctx, op):
    mode = op.attrs()["mode"]
    if mode not in MODES:
        return f"{mode} resize has no INT8 rule (nearest and linear do)"
    if mode == "linear" and len(op.attrs()["target_shape"]) > 3:
        return "a linear resize of more than 3 axes runs in float (its integer sums would pass 2**40)"
    return same_grid(ctx, op)
