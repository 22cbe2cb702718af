"""`space-to-depth{block=2 chip=npu1}`: the S2D rewrite of a TOP module's first strided conv on
the model input (ONNX models from anywhere), as the TF graph pass does for training graphs.

The image is zero-padded to a multiple of the block, rearranged by `top.SpaceToDepth` (the
channel order of ONNX / `tf.nn.space_to_depth`), padded or cropped to the rewritten conv's
window, and convolved, stride `s / block`, VALID, with the kernel zero-padded and folded to
`[O, C*b*b, K'/b, K'/b]` (`tftpu.geometry.AxisPlan`: the arithmetic the TF pass uses, swept
exact there). The result equals the original up to float round-off. With a chip, the pass
applies only where the chip's matrix unit issues at least `s2d_min_speedup` times fewer
multiply-adds for the rewritten conv (a 3-channel stem fills 3 of 64 contraction rows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from tftpu import chip as chips
from tftpu.errors import ShapeError
from tftpu.geometry import AxisPlan
from tftpu.ir import attrs as A
from tftpu.ir import top
from tftpu.ir.module import make_op
from tftpu.transforms.pipeline import ModulePass, register
from tftpu.utils.decisions import PassResult

__all__ = ["SpaceToDepthPass", "fold_kernel", "stem_candidate"]


def fold_kernel(w: np.ndarray, plans) -> np.ndarray:
    """An OIHW kernel zero-padded per axis (`ph_top` before, `ph_bot` after) and folded to
    `[O, b*b*C, K'/b, K'/b]`, input channel `(bh * b + bw) * C + c` as SpaceToDepth orders it."""
    (ph, pw) = plans
    o, c = w.shape[:2]
    w = np.pad(w, ((0, 0), (0, 0), (ph.ph_top, ph.ph_bot), (pw.ph_top, pw.ph_bot)))
    b = ph.block
    kh, kw = ph.new_kernel, pw.new_kernel
    w = w.reshape(o, c, kh, b, kw, b).transpose(0, 3, 5, 1, 2, 4)      # [O, bh, bw, C, i, j]
    return np.ascontiguousarray(w.reshape(o, b * b * c, kh, kw))


def stem_candidate(model):
    """(conv op, why not) for the first conv of the module: it must read a model input (directly
    or through one transpose; canonicalization folds a zero pad before it into its pads), be 2-D,
    ungrouped and undilated."""
    for op in model.ops:
        if not isinstance(op, top.Conv):
            continue
        src = op.operands[0].owner
        if isinstance(src, top.Permute):
            src = src.operands[0].owner
        if not isinstance(src, top.Input):
            return None, f"{op.loc}: the first conv does not read a model input"
        a = op.attrs()
        if len(a["kernel_shape"]) != 2 or a["group"] != 1 or any(d != 1 for d in a["dilations"]):
            return None, f"{op.loc}: only 2-D, ungrouped, undilated convs"
        if a["kernel_layout"] != "OIHW" or not isinstance(op.operands[1].owner, top.Weight):
            return None, f"{op.loc}: its kernel is not a constant OIHW weight"
        return op, ""
    return None, "no conv in the module"


@register
@dataclass
class SpaceToDepthPass(ModulePass):
    """`space-to-depth{block=2 chip=}`: rewrite the first strided conv on the model input."""

    name: ClassVar[str] = "space-to-depth"
    block: int = 2
    chip: str = ""

    def apply(self, model) -> PassResult:
        result = PassResult(self.name)
        conv, why = stem_candidate(model)
        if conv is None:
            result.decline("module", why)
            return result
        a = conv.attrs()
        b = self.block
        if b < 2 or any(s % b for s in a["strides"]):
            result.decline(conv.loc, f"stride {a['strides']} is not a multiple of block {b}")
            return result
        x = conv.operands[0]
        nhwc = a["layout"] == "NHWC"
        shape = x.type.get_shape()
        sizes = shape[1:3] if nhwc else shape[2:]
        cin = shape[3] if nhwc else shape[1]
        pads = a["pads"]
        try:
            plans = [AxisPlan(sizes[i], a["kernel_shape"][i], a["strides"][i], b, (pads[i], pads[i + 2]))
                     for i in range(2)]
        except ShapeError as e:
            result.decline(conv.loc, str(e))
            return result
        w = np.asarray(model.weights[conv.operands[1].owner.key], np.float32)
        pixels = shape[0] * plans[0].out * plans[1].out
        numbers = {}
        if self.chip:
            unit = chips.load(self.chip).matrix
            before = unit.issued_macs(pixels, math.prod(a["kernel_shape"]), cin, w.shape[0])
            after = unit.issued_macs(pixels, plans[0].new_kernel * plans[1].new_kernel, cin * b * b, w.shape[0])
            numbers = {"issued_macs_before": before, "issued_macs_after": after, "speedup": before / after}
            need = chips.load(self.chip).s2d_min_speedup
            if before / after < need:
                result.decline(conv.loc, f"on {self.chip} the matrix unit issues {before / after:.2f}x fewer "
                                         f"multiply-adds, under its {need}x threshold", **numbers)
                return result
        self._rewrite(model, conv, plans, w, nhwc)
        result.apply(conv.loc, f"space-to-depth block {b}: {cin} -> {cin * b * b} channels, kernel "
                               f"{a['kernel_shape']} -> {[p.new_kernel for p in plans]}, stride "
                               f"{a['strides']} -> {[p.new_stride for p in plans]}", **numbers)
        return result

    def _rewrite(self, model, conv, plans, w, nhwc) -> None:
        block = conv.parent
        layout = "NHWC" if nhwc else "NCHW"
        name = conv.loc
        b = self.block

        def add(op_name, operands, attrs, loc):
            op = make_op(op_name, operands, attrs, loc)
            block.insert_op_before(op, conv)
            return op.results[0]

        def pad4(before, after):
            """`top.Pad` paddings for [N, C, H, W] or [N, H, W, C]: begins then ends."""
            if nhwc:
                return [0, before[0], before[1], 0, 0, after[0], after[1], 0]
            return [0, 0, before[0], before[1], 0, 0, after[0], after[1]]

        x = conv.operands[0]
        if any(p.size_pad for p in plans):
            x = add("top.Pad", [x], {"paddings": pad4((0, 0), [p.size_pad for p in plans])}, f"{name}_s2d_align")
        x = add("top.SpaceToDepth", [x], {"block_size": b, "mode": "DCR", "layout": layout}, f"{name}_s2d")
        if any(p.begin or p.end for p in plans):
            x = add("top.Pad", [x], {"paddings": pad4([p.begin for p in plans], [p.end for p in plans])},
                    f"{name}_s2d_window")
        key = conv.operands[1].owner.key
        wkey = f"{key}_s2d"
        while wkey in model.weights:
            wkey += "_"
        model.weights[wkey] = fold_kernel(w, plans)
        wop = top.Weight.create(result_types=[A.tensor_type(model.weights[wkey].shape)])
        top.set_loc(wop, wkey)
        block.insert_op_before(wop, conv)
        attrs = {k: v for k, v in conv.attrs().items() if k not in ("strides", "pads", "kernel_shape", "dilations")}
        attrs.update(kernel_shape=[p.new_kernel for p in plans], strides=[p.new_stride for p in plans],
                     pads=[0, 0, 0, 0])
        bias = conv.operands[2]
        new = make_op("top.Conv", [x, wop.results[0], bias], attrs, name)
        block.insert_op_before(new, conv)
        conv.results[0].replace_all_uses_with(new.results[0])
        old_w = conv.operands[1].owner
        block.erase_op(conv)
        if not old_w.results[0].uses:
            block.erase_op(old_w)
        model.weights = model.used_weights()

