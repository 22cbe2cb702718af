"""Lower a TOP model to the TPU dialect for one chip and mode: each op in the mode asked (or
the qtable's), INT8 where an INT8 lowering takes it, otherwise the chip's float mode, with
every choice and its reason kept for the report.

>>> tpu_model, report = lower(top_model, "npu1", "INT8", table)   # doctest: +SKIP
>>> print(report)                                                  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from absl import logging
from xdsl.dialects.builtin import NoneType, TensorType

from tftpu import chip as chips
from tftpu.errors import UsageError
from tftpu.ir import attrs as A
from tftpu.ir import top, tpu
from tftpu.ir.base import set_loc, loc_names, value_name
from tftpu.quant.links import int8_reads_wide, reach, wide_grids, wide_weights
from tftpu.transforms.lowering import int8_conv, int8_elementwise, int8_movement, int8_pool, int8_resize  # noqa: F401
from tftpu.transforms.lowering.context import Decision, Lowering, float_dtype
from tftpu.transforms.lowering.decode_tail import decode_tail, tail_mode
from tftpu.transforms.lowering.float_ops import lower_float
from tftpu.transforms.lowering.registry import INT8

__all__ = ["lower", "LoweringReport", "float_mode_of", "TWO_PASSES", "WIDE_WEIGHTS", "FOUR_PASSES", "WIDE_LINKS",
           "producer_names"]

# the note on an INT8 depthwise conv that reads a 16-bit link (`tftpu.quant.links`)
TWO_PASSES = "16-bit input, two INT8 passes"
WIDE_WEIGHTS = "16-bit weights, two INT8 passes"
FOUR_PASSES = "16-bit input and weights, four INT8 passes"
# the links a lowering may write (`tftpu.quant.links`): none, the element-wise readers' and
# depthwise convs', with the interpolated activation tables, with every conv (W8A16)
WIDE_LINKS = (False, True, "tables", "convs")

# cheap ops that follow their input's mode rather than cast it back to INT8
_FOLLOWERS = set(int8_movement.MOVEMENT) | {"top.Pad", "top.Gather", "top.MaxPool", "top.GlobalMaxPool",
                                             "top.Concat"}


def _follower(op) -> bool:
    """Whether `op` is a cheap data move that follows its input's mode (nearest Resize too)."""
    return op.name in _FOLLOWERS or op.name == "top.Resize" and int8_resize.is_data_move(op)


def float_mode_of(chip) -> str:
    """The float mode a chip falls back to: F32 where it has one, else F16, else BF16."""
    for mode in ("F32", "F16", "BF16"):
        if mode in chip.modes:
            return mode
    raise UsageError(f"chip {chip.name} has no float mode to run ops that INT8 cannot")


@dataclasses.dataclass
class LoweringReport:
    """Each TOP op's mode and why, with counts."""

    chip: str
    mode: str
    decisions: list[Decision]

    def counts(self) -> dict[str, int]:
        return dict(Counter(d.mode for d in self.decisions))

    def flop_shares(self) -> dict[str, float]:
        """The share of the model's FLOPs each mode runs (what decides speed on a chip whose
        INT8 rate is a multiple of its float rate, where op counts mislead)."""
        by_mode: Counter = Counter()
        for d in self.decisions:
            by_mode[d.mode] += d.flops
        total = sum(by_mode.values())
        return {m: (n / total if total else 0.0) for m, n in sorted(by_mode.items())}

    @property
    def fallbacks(self) -> list[Decision]:
        """Ops that did not run in the mode asked for, with the reason."""
        return [d for d in self.decisions if d.mode != self.mode]

    def __str__(self) -> str:
        counts = ", ".join(f"{n} {m}" for m, n in sorted(self.counts().items()))
        shares = self.flop_shares()
        flops = ""
        if len(shares) > 1:
            flops = " (FLOPs: " + ", ".join(f"{share:.1%} {m}" for m, share in shares.items()) + ")"
        lines = [f"lowered for {self.chip} in {self.mode}: {counts}{flops}"]
        for d in self.fallbacks:
            lines.append(f"  {d.name} ({d.op}): {d.mode}: {d.reason}")
        for reasons, what in (((TWO_PASSES, FOUR_PASSES), "read a 16-bit link"),
                              ((WIDE_WEIGHTS, FOUR_PASSES), "multiply 16-bit weights")):
            two = [d.name for d in self.decisions if d.mode == "INT8" and d.reason in reasons]
            if two:
                shown = ", ".join(two[:4]) + (f" and {len(two) - 4} more" if len(two) > 4 else "")
                lines.append(f"  {len(two)} conv(s) {what} in two INT8 passes: {shown}")
        return "\n".join(lines)


ASYMMETRIC = (False, True, "auto")


def lower(model, chip, mode: str, table=None, qtable: dict | None = None, asymmetric: bool | str = False,
          wide_links: bool | str = True, split_links: bool = True, float_tail: bool = True):
    """(TpuModel, LoweringReport): `model` lowered for `chip` (name, path or Chip) in `mode`.

    `table` (a CalibrationTable) is required for INT8. `qtable` maps TOP op names to the mode
    each must run in (TPU-MLIR's quantize table). `asymmetric`: activations with zero points
    (True), symmetric (False), or "auto": a zero point where the range is one-sided (best with a
    table calibrated `asymmetric=True`, whose min/max are the clipped asymmetric ranges).
    `wide_links`: a tensor that only INT8 Add / Sub / PReLU ops or depthwise convs (two INT8
    passes, high and low byte) read is written on a 16-bit grid by its INT8 conv or Add
    (`tftpu.quant.links`); False keeps every activation on 8 bits;
    "tables": a conv that only smooth activations read (SiLU, HardSwish, GELU, ...) too, their
    tables then interpolated from 16 bits; "convs": with the tables, every conv reads its data on
    16 bits (dense ones too: W8A16 in two INT8 passes), so nearly every activation is a link; a
    set of conv names: the tables, and those convs reading 16 bits.
    `split_links`: so is one they read beside other ops (which read it through a cast to 8 bits).
    `float_tail` (INT8): the decode tail (`decode_tail`: score sigmoids, a DFL softmax and its
    expectation, box arithmetic after the last feature layers) runs in float by design, unless
    `qtable` names its ops."""
    chip = chips.load(chip)
    mode = mode.upper()
    if mode not in chips.MODES:
        raise UsageError(f"mode {mode!r}: expected one of {', '.join(chips.MODES)}")
    if mode not in chip.modes:
        raise UsageError(f"chip {chip.name} does not run {mode} (it runs {', '.join(chip.modes)})")
    if asymmetric not in ASYMMETRIC:
        raise UsageError(f"asymmetric={asymmetric!r}: expected one of False, True, 'auto'")
    if asymmetric is True and mode != "INT8":
        raise UsageError("asymmetric quantization is an INT8 mode")
    qtable = dict(qtable or {})
    if mode == "INT8" and table is None and any(m == "INT8" for m in qtable.values()) or \
            mode == "INT8" and table is None:
        raise UsageError("INT8 needs a calibration table (make one with tftpu-calibrate)")
    names = {op.loc for op in model.ops}
    unknown = sorted(set(qtable) - names)
    if unknown:
        raise UsageError(f"quantize table names op(s) the model does not have: {', '.join(unknown[:5])}")
    for name, m in qtable.items():
        if m not in chip.modes:
            raise UsageError(f"quantize table: {name}: chip {chip.name} does not run {m}")
    fallback = float_mode_of(chip)
    by_design = {}
    if mode == "INT8" and float_tail:
        by_design = {n: why for n, why in decode_tail(model).items() if n not in qtable}
        qtable.update(dict.fromkeys(by_design, tail_mode(model, by_design, chip, table, fallback)))
    if wide_links not in WIDE_LINKS and not isinstance(wide_links, (set, frozenset)):
        raise UsageError(f"wide_links={wide_links!r}: expected one of {', '.join(map(repr, WIDE_LINKS))} "
                         "or a set of conv names")
    wide = None
    tables, convs = reach(wide_links)
    if wide_links and table is not None:
        wide = wide_grids(model, table, asymmetric, lambda name: qtable.get(name, mode) == "INT8", split_links,
                          tables=tables, convs=convs)
    ctx = Lowering(model, chip, mode, table, asymmetric, wide, tables=tables, convs=convs,
                   weights16=wide_weights(wide_links))
    for op in model.ops:
        if isinstance(op, top.NoneOp):
            continue
        if isinstance(op, top.Weight):
            continue                                     # weights are made where they are used
        if isinstance(op, top.Input):
            new = top.Input.create(operands=[ctx.block.insert_arg(op.output.type, len(ctx.block.args))],
                                   result_types=[op.output.type])
            set_loc(new, op.loc)
            ctx.block.add_op(new)
            ctx.input_types.append(op.output.type)
            ctx.values[op.results[0]] = new.results[0]
            continue
        why = by_design.get(op.loc, "quantize table" if op.loc in qtable else "")
        _lower_op(ctx, op, qtable.get(op.loc, mode), fallback, why)
    outputs, names_out = [], []
    for v in model.return_op.operands:
        name = value_name(v)
        cur = ctx.current(v)
        if A.is_float(cur.type) and A.dtype_name(cur.type.element_type) == "f32" or \
                not A.is_float(cur.type) and not tpu.is_quantized(cur):
            outputs.append(cur)
        else:                                            # the output keeps its name, in f32
            _rename(cur, ctx.fresh_name(f"{name}_{A.dtype_name(cur.type.element_type)}"))   # (`producer_names`)
            out = ctx.floating(v, "f32")
            set_loc(out.owner, name)
            outputs.append(out)
        names_out.append(name)
    tpu_model = ctx.finish(outputs, names_out)
    report = LoweringReport(chip.name, mode, ctx.decisions)
    for d in report.fallbacks:
        logging.info("%s (%s) runs in %s: %s", d.name, d.op, d.mode, d.reason)
    return tpu_model, report


def _reads_link_in_two_passes(ctx, op) -> bool:
    """Whether the INT8 `op` is a conv reading its data on a 16-bit link."""
    return op.name == "top.Conv" and value_name(op.operands[0]) in ctx.wide and \
        int8_reads_wide(op, op.operands[0], ctx.tables, ctx.convs)


def _passes(ctx, op) -> str:
    """An INT8 op's decision reason where it runs in more than one INT8 pass: a conv reading a
    16-bit link (`TWO_PASSES`), multiplying 16-bit weights (`WIDE_WEIGHTS`), or both."""
    link = _reads_link_in_two_passes(ctx, op)
    lowered = ctx.values.get(op.results[0]) if op.results else None
    weights = lowered is not None and tpu.has_wide_weights(lowered.owner)
    if link and weights:
        return FOUR_PASSES
    return TWO_PASSES if link else WIDE_WEIGHTS if weights else ""


def _rename(value, new: str) -> None:
    names = loc_names(value.owner) or [value_name(value)]
    names = list(names) + [f"{names[0]}_{i}" for i in range(len(names), len(value.owner.results))]
    names[value.index] = new
    set_loc(value.owner, names if len(names) > 1 else names[0])


def _lower_op(ctx, op, want: str, fallback: str, why: str) -> None:
    if op.name not in tpu.FROM_TOP and op.name != "top.Cast":
        raise UsageError(f"{op.name} at {op.loc!r} has no TPU op")
    if want == "INT8":
        reason = None
        follows_float = _follower(op) and _float_input(ctx, op)
        rule = INT8.get(op.name)
        if follows_float:
            reason = "follows its float input (a data move costs nothing to keep in float)"
        elif rule is None:
            reason = f"no INT8 lowering for {op.name}"
        else:
            ctx.reading = op
            try:
                reason = rule(ctx, op)
            finally:
                ctx.reading = None
        if reason is None:
            ctx.record(op, "INT8", _passes(ctx, op))
            return
        mode = _input_float_mode(ctx, op) if follows_float else fallback
        if mode not in ctx.chip.modes:                    # a model input is f32; edge16 has no F32
            mode = fallback
        ctx.record(op, mode, reason)
        lower_float(ctx, op, float_dtype(mode))
        return
    ctx.record(op, want, why)
    lower_float(ctx, op, float_dtype(want))


def _input_float_mode(ctx, op) -> str:
    """The float mode of a data move's input (F16 after an F16 op), so it adds no cast."""
    for v in op.operands:
        if isinstance(v.type, NoneType) or ctx.is_weight(v) or isinstance(v.owner, top.Input):
            continue
        cur = ctx.current(v)
        if isinstance(cur.type, TensorType) and A.is_float(cur.type):
            return {"f32": "F32", "f16": "F16", "bf16": "BF16"}[A.dtype_name(cur.type.element_type)]
    return "F32"


def _float_input(ctx, op) -> bool:
    """Whether a data move reads the output of an op that runs in float (a model input is not
    one: it is quantized where it enters, as every INT8 input is); a Concat, any of its inputs
    (requantizing a float part onto one grid could erase it: scores kept float beside boxes)."""
    data = op.operands if op.name == "top.Concat" else op.operands[:1]
    for v in data:
        if isinstance(v.type, NoneType) or ctx.is_weight(v) or isinstance(v.owner, top.Input):
            continue
        cur = ctx.current(v)
        if isinstance(cur.type, TensorType) and A.is_float(cur.type):
            return True
    return False


# the dtypes a model output's producer is renamed with (`<name>_<dtype>`, by `lower`)
_OUTPUT_DTYPES = ("i8", "u8", "i16", "u16", "i32", "f16", "bf16")


def producer_names(name: str) -> list[str]:
    """The names the TPU op computing TOP op `name` may carry, in order: its own, or, where it
    makes a model output, `<name>_<dtype>` (`lower` renames it so; the f32 cast to the output
    takes the name)."""
    return [f"{name}_{t}" for t in _OUTPUT_DTYPES] + [name]
