"""INT8 data movement: reshapes, transposes, slices, pads, block rearrangements and gathers
keep their input's grid and move bytes; a Concat requantizes its inputs onto its output's
grid, unless their ranges differ so much that one grid would erase the smaller input."""

from __future__ import annotations

from xdsl.dialects.builtin import TensorType

from tftpu.ir.base import value_name
from tftpu.transforms.lowering.int8_elementwise import _grid
from tftpu.transforms.lowering.int8_pool import same_grid
from tftpu.transforms.lowering.registry import int8

# A Concat whose smallest input range is under 1/RANGE_RATIO of the output's keeps float: on the
# output's INT8 grid that input would have fewer than 127/RANGE_RATIO levels (YOLO heads
# concatenate boxes up to ~300 with scores in 0..1: one grid rounds every score to zero).
RANGE_RATIO = 16.0

MOVEMENT = ("top.Reshape", "top.Flatten", "top.Permute", "top.Squeeze", "top.Unsqueeze", "top.Slice",
            "top.Split", "top.SpaceToDepth", "top.DepthToSpace")


@int8(*MOVEMENT)
def movement(ctx, op):
    return same_grid(ctx, op)


@int8("top.Gather")
def gather(ctx, op):
    if ctx.is_weight(op.operands[0]):
        return "it gathers from a constant"
    return same_grid(ctx, op)


@int8("top.Pad")
def pad(ctx, op):
    a = op.attrs()
    x = op.operands[0]
    p = ctx.grid(x)
    if p is None:
        return f"no calibration entry for {value_name(x)!r}"
    if a["mode"] == "constant":
        q = int(p.quantize([a["val"]])[0])
        if abs(float(p.dequantize([q])[0]) - a["val"]) > p.scale / 2:
            return f"its pad value {a['val']} is outside the INT8 range of its input"
        extra = {"val": float(q)}
    else:
        extra = {}
    out = TensorType(ctx.qtype(p), op.results[0].type.get_shape())
    attributes = ctx.attributes(op, "tpu.Pad", **extra)
    new = ctx.emit("tpu.Pad", [ctx.quantized(x, p)], attributes, op.loc, [out])
    ctx.values[op.results[0]] = new.results[0]
    return None


@int8("top.Concat")
def concat(ctx, op):
    po = ctx.qparams(op.results[0])
    ins = [_grid(ctx, v) for v in op.operands]           # a float constant: its own range
    if po is None or any(p is None for p in ins):
        if any(p is None and ctx.is_weight(v) for v, p in zip(op.operands, ins)):
            return "it concatenates an integer constant"
        return "a calibration entry is missing for it or one of its inputs"
    if any(p.storage != po.storage for p in ins):
        return "it concatenates a score map on its 16-bit output grid, which one INT8 grid would coarsen"
    ranges = [p.scale * 127 for p in ins]
    smallest = min(ranges)
    if smallest * RANGE_RATIO < po.scale * 127:
        worst = value_name(op.operands[ranges.index(smallest)])
        return (f"its inputs' ranges differ {po.scale * 127 / smallest:.0f}x ({worst!r} spans "
                f"{smallest:.3g} of {po.scale * 127:.3g}): one INT8 grid would erase the smaller input")
    out = TensorType(ctx.qtype(po), op.results[0].type.get_shape())
    new = ctx.emit("tpu.Concat", [ctx.quantized(v, po) for v in op.operands], ctx.attributes(op, "tpu.Concat"),
                   op.loc, [out])
    ctx.values[op.results[0]] = new.results[0]
    return None
