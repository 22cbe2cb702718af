"""16-bit links: a tensor that only INT8 element-wise ops read is written on a 16-bit grid.

A conv whose output goes only into a residual Add (or an SE block's Mul) or, with `tables`, into
a smooth activation (SiLU, HardSwish, Sigmoid, GELU, ...: its table then interpolated from 16
bits), or an Add whose output goes only into a PReLU or into ops kept in float (and an op kept in float
whose output goes only into such INT8 ops; and an activation table read so), would round its
int32 accumulator to 8 bits just for the next element-wise op to rescale it and round again. Written on a 16-bit grid
instead (the conv still multiplies INT8 by INT8), that rounding all but disappears, as in a
fused conv + add + activation kernel, and the FLOPs stay INT8: only the link between the two ops
is wider. On detectors built of residual blocks this is a large share of the INT8 noise
(`benchmarks/detectors.py`). A link passes through the INT8 ops that only move values
(`PASS_THROUGH`: an FPN's upsampling Resize, a max pool, a channel Pad), which keep its grid, to
the element-wise ops behind them. A depthwise conv reads a 16-bit link too (`is_depthwise`): its
INT8 kernel runs two passes, over the link's signed high byte and its unsigned low byte, and adds
them (256 high + low) exactly in int32; its input is where the 8-bit rounding of detectors built of
depthwise blocks costs most (a quiet channel on its tensor's grid, a large folded kernel after it).
With `convs`, a dense conv reads 16 bits the same way (its two passes' int32 sums combined in 64
bits before requantization), where the chip affords it (`tftpu.pipelines.deploy` prices it).

The 16-bit grid is symmetric (zero point 0) over twice the tensor's calibrated range. Where the
reader is an Add or Sub, its scale is the reader's output scale over a power of two, so that the
Add's integer multiplier for it is exact (`tftpu.quant.params.add_multipliers`).

>>> wide_grids(model, table, "auto", lambda name: True)     # doctest: +SKIP
{'conv_3': QParams(scale=..., zero_point=0, storage='i16'), ...}
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np

from tftpu.errors import UsageError
from tftpu.ir import top
from tftpu.ir.base import value_name
from tftpu.quant import params as P

__all__ = ["wide_grids", "reach", "WideWeights", "wide_weights", "InputConvs", "input_convs", "input_rounding_noise",
           "reads_wide", "int8_reads_wide",
           "reads_link",
           "is_depthwise", "WIDE_PRODUCERS",
           "WIDE_READERS", "INTERPOLATED", "MAX_TAPS", "PASS_THROUGH", "LOOKUP_TABLES", "I16_MAX", "HEADROOM"]

# activations whose INT8 form is a 256-entry lookup table (the lowering registers these)
LOOKUP_TABLES = top.LOOKUP_TABLES
# ops whose INT8 kernel requantizes its result and can write it on a 16-bit grid: a conv, Add,
# Sub, Mul or PReLU rounds its wide intermediate there; a table holds 16-bit entries as well as 8-bit
WIDE_PRODUCERS = ("top.Conv", "top.Add", "top.Sub", "top.Mul", "top.PRelu", *LOOKUP_TABLES)
# INT8 ops that read a 16-bit data operand (their integer rule works on any width: a Mul's
# product of two links, zero point 0, stays under 2**30, within its int32 accumulator)
WIDE_READERS = ("top.Add", "top.Sub", "top.Mul", "top.PRelu")
# activation tables that a 16-bit input reads by interpolating 513 knots (`tpu.Lut`): the smooth
# functions (a step function such as Floor keeps its exact 256-entry table on 8 bits)
INTERPOLATED = top.INTERPOLABLE
# INT8 ops that move their data operand's values without arithmetic (their result keeps its grid):
# a link passes through them on its 16 bits to the element-wise ops behind them (an FPN's conv ->
# upsampling Resize -> lateral Add; a max pool -> channel Pad -> residual Add). One that shrinks
# its data (a strided pool) does so only from a tensor that is a link already (a block output the
# next Add reads): a stem widened to 16 bits just to be pooled would cost more DMA than it saves
PASS_THROUGH = ("top.Resize", "top.MaxPool", "top.Pad", "top.Reshape", "top.Flatten", "top.Permute",
                "top.Squeeze", "top.Unsqueeze", "top.DepthToSpace", "top.SpaceToDepth")
I16_MAX = 32767
# a link's grid spans this many times the calibrated range: 16 bits afford the room (a step still
# 1/8192 of the range), and an image beyond the calibration photos is not clipped there
HEADROOM = 2.0
_ADD_LIKE = ("top.Add", "top.Sub")
# a depthwise conv reads a 16-bit link up to this many taps (7x7): its sums of 16-bit values by
# 8-bit weights, 2**22 * 49 at most, stay far inside int32 with the bias beside them
MAX_TAPS = 49


def _range(entry) -> float:
    """The largest magnitude a calibration entry (threshold, min, max, ...) saw."""
    return max(abs(float(entry[0])), abs(float(entry[1])), abs(float(entry[2])))


class InputConvs(frozenset):
    """A `wide_links` of conv names that read 16 bits on the default links (True), the tables not
    interpolated: the convs reading a model input (`input_convs`), whose 8-bit rounding of the
    image every later op carries (PP-OCRv4's text detector, all INT8 with interpolated tables:
    6.7 -> 12.3 dB; `tftpu.pipelines.deploy` prices it)."""


def input_convs(model) -> frozenset:
    """The convs that read a model input as their data, directly or through pass-through ops (an
    NHWC model's transpose)."""
    names, stack = set(), [op.results[0] for op in model.ops if isinstance(op, top.Input)]
    while stack:
        v = stack.pop()
        for use in v.uses:
            r = use.operation
            if r.name == "top.Conv" and r.operands[0] is v:
                names.add(r.loc)
            elif _passes(r, v):
                stack.append(r.results[0])
    return frozenset(names)


class WideWeights(NamedTuple):
    """An item of a `wide_links` set: the conv `name` multiplies 16-bit weights, in two INT8
    passes over their byte planes (`tftpu.interp.tpu.int8_kernels.weight_planes`), its data as it is."""

    name: str


def reach(wide_links) -> tuple[bool, bool | frozenset]:
    """(tables, convs) of a lowering's `wide_links`: True the element-wise readers' and depthwise
    convs' links; "tables" with the interpolated tables too; "convs" with every conv reading 16
    bits; a set of conv names: the tables, and those convs reading 16 bits (an `InputConvs`: those
    convs, without the tables; `WideWeights` items name the convs with 16-bit weights instead,
    `wide_weights`). A model input is a link only where convs read 16 bits."""
    if isinstance(wide_links, (set, frozenset)):
        names = frozenset(n for n in wide_links if not isinstance(n, WideWeights))
        return not isinstance(wide_links, InputConvs), names
    return wide_links in ("tables", "convs"), wide_links == "convs"


def wide_weights(wide_links) -> frozenset:
    """The convs a lowering's `wide_links` gives 16-bit weights (its `WideWeights` items)."""
    if isinstance(wide_links, (set, frozenset)):
        return frozenset(n.name for n in wide_links if isinstance(n, WideWeights))
    return frozenset()


def reads_wide(reader, v, in_int8, tables: bool = False, convs: bool | frozenset = False) -> bool:
    """Whether `reader` takes `v` on a 16-bit grid as it is: an INT8 Add / Sub / Mul / PReLU (as its
    data) or, with `tables`, smooth activation, or an op kept in float (its cast from 16 bits is
    as cheap, and finer)."""
    if reader.name == "func.return":
        return False
    if not in_int8(reader.loc):
        return True
    return int8_reads_wide(reader, v, tables, convs)


def int8_reads_wide(reader, v, tables: bool = False, convs: bool | frozenset = False) -> bool:
    """Whether `reader`, run in INT8, reads `v` as a 16-bit operand (others read 8 bits): an Add,
    Sub, Mul or PReLU's data, a depthwise conv's data (in two passes), or with `tables` a smooth
    activation's input; with `convs` (True, or a set of conv names), every conv's (those convs')
    data, dense ones too, in the same two passes."""
    if tables and reader.name in INTERPOLATED:
        return True
    if reader.name == "top.Conv" and reader.operands[0] is v and (
            convs is True or bool(convs) and reader.loc in convs or is_depthwise(reader)):
        return True
    return reader.name in WIDE_READERS and (reader.name != "top.PRelu" or
                                            reader.operands[0] is v and reader.operands[1] is not v)


def is_depthwise(op) -> bool:
    """Whether the TOP conv `op` is depthwise (one input channel a group, at most `MAX_TAPS` taps):
    in INT8 it reads a 16-bit link in two passes (high and low byte), its int32 sums exact."""
    a = op.attrs()
    shape = op.operands[0].type.get_shape()
    g = int(a.get("group", 1) or 1)
    axis = 1 if a.get("layout", "NCHW") == "NCHW" else len(shape) - 1
    kernel = op.operands[1].type.get_shape()
    taps = math.prod(kernel[2:] if a.get("kernel_layout", "OIHW") == "OIHW" else kernel[:-2])
    return len(shape) == 4 and g > 1 and g == shape[axis] and taps <= MAX_TAPS


def _passes(reader, v) -> bool:
    """Whether `reader` is a pass-through op taking `v` as its moved data (a Concat of copies of
    `v` too: an imported Tile, as Keras's UpSampling2D exports)."""
    if reader.name == "top.Concat":
        return all(o is v for o in reader.operands) and not reader.attrs().get("do_relu")
    return reader.name in PASS_THROUGH and reader.operands[0] is v and len(reader.results) == 1


def _size(v) -> int:
    return math.prod(v.type.get_shape())


def reads_link(reader, v, wide, tables: bool = False, convs: bool | frozenset = False) -> bool:
    """Whether the INT8 op `reader` reads the link `v` on its 16 bits, given the links `wide`
    (names): an Add / Sub / Mul / PReLU as its data, or a pass-through op whose result is a link too."""
    return int8_reads_wide(reader, v, tables, convs) or (
        _passes(reader, v) and value_name(reader.results[0]) in wide)


def wide_grids(model, table, asymmetric: bool | str, in_int8: Callable[[str], bool],
               split: bool = True, tables: bool = False, convs: bool | frozenset = False) -> dict[str, P.QParams]:
    """Tensor name -> 16-bit grid, for each tensor made by an INT8 conv / Add / Sub / Mul / PReLU / table
    (`in_int8` of the op's name) or by an op kept in float, that is not a model output and whose
    every reader is an INT8 Add, Sub, Mul or PReLU reading it as data or an INT8 depthwise conv
    (`is_depthwise`), or an op kept in float (a
    mixed-precision island: the cast from 16 bits spares it a rounding; and an island's output
    that such INT8 ops read is cast to 16 bits, not rounded to 8 on its way back).

    `split`: a tensor that such ops read beside others (a residual block's input, which the next
    Add reads and the next conv too) is a link as well; the others read it requantized to its
    8-bit grid (one cast), so the residual path is never rounded to 8 bits, as a fused kernel
    keeps it. A pass-through op (`PASS_THROUGH`) whose result is read so in turn carries the link
    on the same grid (its result is in the map too). Every other tensor keeps the 8-bit grid of
    its calibration entry. `tables`: a smooth activation table (`INTERPOLATED`) reads 16 bits as
    well, interpolating its knots (`tpu.Lut`), so a conv that only such tables read is a link.
    Off by default (`wide_links="tables"` turns it on): on the measured detectors it lifts pure
    INT8 but can cost the mixed-precision search's float set its gain. `convs` (with `tables`:
    `wide_links="convs"`): every INT8 conv reads its data on 16 bits, in two INT8 passes (W8A16
    with INT8 multiplies), so nearly every activation is a link."""
    outputs = set(model.output_names)

    def accepted(readers: list, wide: list) -> bool:
        """Whether a tensor that `readers` read, `wide` of them on 16 bits, is a link."""
        if len(wide) == len(readers):
            return bool(wide)
        # a split link: only where an INT8 op reads the 16 bits
        return bool(wide) and split and not any(r.name == "func.return" for r in readers) and \
            any(in_int8(r.loc) for r in wide)

    def through(v, readers) -> list:
        """The readers of `v` that read it wide, a pass-through one where its own result is read
        wide in turn (and leaves the model only through such readers)."""
        wide = []
        direct = any(reads_wide(r, v, in_int8, tables, convs) for r in readers if not _passes(r, v))
        for r in readers:
            if _passes(r, v) and in_int8(r.loc):
                out = r.results[0]
                if _size(out) < _size(v) and not direct:
                    continue                # no tensor is widened only to be pooled down
                inner = [u.operation for u in out.uses]
                if value_name(out) not in outputs and accepted(inner, through(out, inner)):
                    wide.append(r)
            elif reads_wide(r, v, in_int8, tables, convs):
                wide.append(r)
        return wide

    links: dict[str, list] = {}
    moved: dict[str, str] = {}              # a pass-through op's link -> the link it moves
    for op in model.ops:
        if not op.results or isinstance(op, top.Weight) or isinstance(op, top.Input) and not convs or (
                in_int8(op.loc) and op.name not in WIDE_PRODUCERS and not isinstance(op, top.Input)):
            continue
        v = op.results[0]
        name = value_name(v)
        if name in outputs or name not in table.entries or _range(table.entries[name]) <= 0:
            continue
        readers = [use.operation for use in v.uses]
        wide = through(v, readers)
        if not accepted(readers, wide):
            continue
        # an op kept in float links only where an INT8 reader casts it (to 16 bits, not 8)
        if in_int8(op.loc) or any(in_int8(r.loc) for r in wide):
            links[name] = wide
            stack = [r for r in wide if _passes(r, v) and in_int8(r.loc)]
            while stack:                    # the pass-through ops carry the same grid
                r = stack.pop()
                out = r.results[0]
                moved[value_name(out)] = name
                stack += [u for u in through(out, [x.operation for x in out.uses]) if _passes(u, out)]
    grids: dict[str, P.QParams] = {}

    def grid_of(name: str) -> P.QParams | None:
        """The grid a tensor is written on: its 16-bit one if it is a link, else its 8-bit one."""
        if name in links or name in moved:
            return link_grid(moved.get(name, name))
        entry = table.entries.get(name)
        return None if entry is None else P.activation(*entry[:3], asymmetric=asymmetric)

    def operand_grid(v) -> P.QParams | None:
        """The grid the Add's lowering reads another operand on (a constant: its own range)."""
        if isinstance(v.owner, top.Weight):
            arr = model.weights.get(v.owner.key)
            return None if arr is None or arr.dtype.kind != "f" else P.QParams(P.weights_per_tensor(arr)[1])
        name = value_name(v)
        return None if name in links or name in moved else grid_of(name)

    def final_readers(readers: list, name: str) -> list:
        """(reader, the name it reads) of a link's readers, through the pass-through ops that move it."""
        out = []
        for r in readers:
            moved_name = value_name(r.results[0]) if r.results else None
            if moved_name in moved:
                out += final_readers([u.operation for u in r.results[0].uses], moved_name)
            else:
                out.append((r, name))
        return out

    def link_grid(name: str) -> P.QParams:
        if name in grids:
            return grids[name]
        span = HEADROOM * _range(table.entries[name])
        scale = span / I16_MAX
        add, read = next(((r, n) for r, n in final_readers(links[name], name)
                          if r.name in _ADD_LIKE and in_int8(r.loc)), (None, name))
        out = None if add is None else grid_of(value_name(add.results[0]))
        if out is not None:
            # the reader's output scale over 2**k (k < 0 where that output is 16-bit too and
            # narrower): the Add's int16 multiplier for this input is then exact, as long as k
            # is within the Add's shift (other 16-bit inputs aside)
            k = math.floor(math.log2(I16_MAX * out.scale / span))
            others = [operand_grid(x) for x in add.operands if value_name(x) != read]
            ratios = [p.scale / out.scale for p in others if p is not None]
            try:
                _, rshift = P.add_multipliers(ratios + [2.0 ** -k])
            except UsageError:                  # the Add cannot run in INT8: it says why
                rshift = k
            scale = out.scale * 2.0 ** -min(k, rshift)
        grids[name] = P.QParams(scale, 0, "i16")
        return grids[name]

    for name in links:
        link_grid(name)
    for name, source in moved.items():
        grids[name] = grids[source]
    return grids


def input_rounding_noise(model, table, asymmetric: bool | str, sample: dict, names,
                         dump: dict | None = None) -> dict[str, float]:
    """Conv name -> the noise its input's 8-bit rounding adds to its output, over that output's
    power on `sample` (step**2 / 12 times each output channel's sum of squared weights, against
    the output's mean square), for the TOP convs `names` with a calibrated input and constant
    weights: where a 16-bit input buys most (a conv whose output is small beside its terms).
    `dump`: TOP's every tensor on `sample`, where already run."""
    from tftpu.interp.top_interpreter import TopInterpreter

    names = set(names)
    dumps = dump if dump is not None else TopInterpreter(model).run(sample, dump_all=True)
    noise: dict[str, float] = {}
    for op in model.ops:
        if op.loc not in names or not isinstance(op.operands[1].owner, top.Weight):
            continue
        entry = table.entries.get(value_name(op.operands[0]))
        w = model.weights.get(op.operands[1].owner.key)
        y = dumps.get(value_name(op.results[0]))
        if entry is None or w is None or y is None:
            continue
        w = np.asarray(w, np.float64)
        out_axis = 0 if op.attrs().get("kernel_layout", "OIHW") == "OIHW" else w.ndim - 1
        per_channel = np.moveaxis(w, out_axis, 0).reshape(w.shape[out_axis], -1)
        step = P.activation(*entry[:3], asymmetric=asymmetric).scale
        power = float(np.mean(np.square(np.asarray(y, np.float64))))
        noise[op.loc] = step ** 2 / 12 * float(np.mean(np.sum(per_channel ** 2, axis=1))) / max(power, 1e-30)
    return noise
