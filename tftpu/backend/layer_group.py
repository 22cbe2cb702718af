"""Layer groups: runs of consecutive TPU ops that execute on chip back to back, sliced along N
and H so that each slice (its inputs with their halos, intermediates and weights) fits local
memory; the paper's LayerGroup pass (TPU-MLIR section 3.7).

Ops that can run in local memory ("local" ops: convs and pools, element-wise ops, activations,
casts, channel concats; global pools with N slices only) are grouped; every other op runs as
a "global" op, reading and writing DDR. Groups and slicings are chosen by dynamic programming
over the op sequence: a group costs its weights' DMA plus, per slice, the larger of its compute
(halo rows recomputed) and its DMA (double-buffered when memory allows, else in series), all
from `tftpu.backend.cycles`; a global op costs its own cycle estimate. A tensor made inside a
group and used outside it may only be the group's last op's result.

>>> plan = plan_groups(tpu_model, "npu1")       # doctest: +SKIP
>>> print(plan)                                   # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import OrderedDict

from xdsl.dialects.builtin import NoneType, TensorType

from tftpu import chip as chips
from tftpu import geometry
from tftpu.backend import cycles as cyc
from tftpu.backend.memory import place
from tftpu.errors import InternalError
from tftpu.ir import attrs as A
from tftpu.ir import top, tpu
from tftpu.ir.base import numel, value_name

__all__ = ["SLICING", "Group", "GroupPlan", "SliceRanges", "plan_groups", "slice_ranges", "lane_bytes",
           "MAX_GROUP_OPS", "host_preprocessing", "place_local", "weight_lane_axis", "rows_bytes",
           "slice_lane_sizes", "weight_lane_sizes"]

MAX_GROUP_OPS = 32        # the longest run the DP tries as one group
_CACHE_SIZE = 1 << 15     # candidate groups remembered across plans (see _Planner.evaluate)
_EVALUATED: OrderedDict = OrderedDict()

# How a local op's rows depend on its inputs' rows, by full op name.
_WINDOW = ("tpu.Conv", "tpu.MaxPool", "tpu.AvgPool")
_BATCH = ("tpu.GlobalAvgPool", "tpu.GlobalMaxPool")
_ELEMENTWISE = ("tpu.Cast", "tpu.Lut", "tpu.Add", "tpu.Sub", "tpu.Mul", "tpu.Div", "tpu.Max", "tpu.Min",
                "tpu.PRelu", "tpu.Scale", "tpu.BatchNorm", "tpu.Concat",
                *("tpu." + n[4:] for n in top.LOOKUP_TABLES))
SLICING = {**{n: "window" for n in _WINDOW}, **{n: "batch" for n in _BATCH},
           **{n: "elementwise" for n in _ELEMENTWISE}}


def _align(n: int, a: int) -> int:
    return -(-n // a) * a if a > 1 else n


def _itemsize(t) -> int:
    return A.numpy_dtype(A.dtype_name(t.element_type)).itemsize


def lane_bytes(shape, itemsize: int, chip, lane_axis: int = 1) -> int:
    """Bytes one lane holds of a tensor in local memory: axis `lane_axis` spread over the lanes
    (channel c in lane c % lanes), each (outer, slot) plane aligned to the EU width."""
    return _lane_bytes(tuple(shape), itemsize, chip.lanes, chip.eu_bytes, lane_axis)


@functools.lru_cache(maxsize=1 << 16)
def _lane_bytes(shape: tuple, itemsize: int, lanes: int, eu_bytes: int, lane_axis: int) -> int:
    """(`lane_bytes`, remembered: the planner sizes the same slice shapes many times over)"""
    outer = numel(shape[:lane_axis])
    c = shape[lane_axis] if len(shape) > lane_axis else 1
    inner = numel(shape[lane_axis + 1:])
    return outer * -(-c // lanes) * _align(inner * itemsize, eu_bytes)


def rows_bytes(shape, rows: tuple, itemsize: int) -> int:
    """Bytes of rows (n0, n1, h0, h1) of an N, C, H, ... tensor (what a DMA moves)."""
    n0, n1, h0, h1 = rows
    return (n1 - n0) * shape[1] * (h1 - h0) * numel(shape[3:]) * itemsize


def slice_lane_sizes(slices, types: dict, items: dict, chip) -> dict:
    """Per tensor, the most bytes per lane it takes in any of `slices` (SliceRanges)."""
    sizes: dict = {}
    for rng in slices:
        for name, (n0, n1, h0, h1) in rng.tensors.items():
            shape = types[name]
            b = lane_bytes((n1 - n0, shape[1], h1 - h0, *shape[3:]), items[name], chip)
            sizes[name] = max(sizes.get(name, 0), b)
    return sizes


def weight_lane_sizes(weights, types: dict, items: dict, chip) -> dict:
    """Bytes per lane of each weight, whole (weights stay for the group's life)."""
    return {w: lane_bytes(types[w], items[w], chip, weight_lane_axis(types[w])) for w in weights}


def weight_lane_axis(shape) -> int:
    """Weights spread their first axis over the lanes (conv filters, biases, per-channel
    vectors), or the second when the first is 1 (`[1, C, 1, 1]` scales)."""
    return 1 if len(shape) >= 2 and shape[0] == 1 else 0


# ---------------------------------------------------------------- per-op facts


@dataclasses.dataclass
class _Op:
    """What the planner needs of one TPU op."""

    index: int                    # position among the module's ops
    op: object
    name: str
    kind: str | None              # window / elementwise / batch, or None: a global op
    reason: str                   # why it is global
    ins: list                     # activation operand names (None for weights / none)
    weights: list                 # weight operand names
    outs: list
    cycles: cyc.OpCycles
    window: tuple = ()            # (kernel, stride, dilation, pad before) along H, for window ops


def _aligned(shape, rank: int) -> tuple:
    return (1,) * (rank - len(shape)) + tuple(shape)


def _local_kind(op, weights: set) -> tuple[str | None, str]:
    kind = SLICING.get(op.name)
    if kind is None:
        return None, "runs from DDR (no local form)"
    out = op.results[0].type
    if len(op.results) != 1 or not isinstance(out, TensorType):
        return None, "several results"
    rank = len(out.get_shape())
    if rank not in (3, 4):
        return None, f"{rank}-D result"
    attrs = op.attrs()
    if attrs.get("layout", "NCHW") != "NCHW":
        return None, "not NCHW"
    oshape = out.get_shape()
    if op.name == "tpu.Concat" and attrs.get("axis") not in (1, 1 - rank):
        return None, "concat off the channel axis"
    if kind == "window" and any(value_name(v) not in weights for v in op.operands[1:]
                                if not isinstance(v.type, NoneType)):
        return None, "filter is not a weight"
    if kind == "window" and op.name != "tpu.Conv" and attrs.get("ceil_mode"):
        kind = "batch"
    for i, v in enumerate(op.operands):
        if isinstance(v.type, NoneType):
            continue
        shape = v.type.get_shape()
        if value_name(v) in weights:
            if len(shape) > rank:
                return None, "weight of higher rank"
            if kind == "elementwise" and _aligned(shape, rank)[2] > 1:   # (numpy broadcasting: a 1-D
                return None, "weight varies along H"                      # weight of a 3-D op runs along H)
            continue
        if len(shape) != rank:
            return None, "operand of another rank"
        if kind == "elementwise" and (shape[2] not in (1, oshape[2]) or shape[0] not in (1, oshape[0])):
            return None, "broadcast along H or N"
    return kind, ""


_HOST_MOVES = ("tpu.Cast", "tpu.Permute", "tpu.Pad", "tpu.SpaceToDepth")


def host_preprocessing(model) -> set:
    """Indices of the ops that make a model input's space-to-depth form (casts, layout changes,
    pads and the `tpu.SpaceToDepth` itself with the window pad after it, each the only reader of
    the one before): the host runs them, as the input pipeline does in training, so the chip
    receives the rearranged image."""
    readers: dict = {}
    index = {}
    for i, op in enumerate(model.ops):
        index[op] = i
        for v in op.operands:
            readers.setdefault(v, []).append(op)
    outputs = set(model.return_op.operands)
    host = set()
    for op in model.ops:
        if not isinstance(op, top.Input):
            continue
        chain, v, found = [], op.results[0], False
        while len(readers.get(v, [])) == 1 and v not in outputs:
            nxt = readers[v][0]
            if nxt.name not in _HOST_MOVES or found and nxt.name != "tpu.Pad":
                break
            chain.append(index[nxt])
            found = found or nxt.name == "tpu.SpaceToDepth"
            v = nxt.results[0]
        if found:
            host.update(chain)
    return host


def _facts(model, chip, host: set) -> list[_Op]:
    weights = {value_name(op.results[0]) for op in model.ops if isinstance(op, top.Weight)}
    facts = []
    for i, op in enumerate(model.ops):
        if not isinstance(op, tpu.TpuOp):
            continue
        kind, reason = (None, "on the host") if i in host else _local_kind(op, weights)
        ins, ws = [], []
        for v in op.operands:
            if isinstance(v.type, NoneType):
                ins.append(None)
                continue
            name = value_name(v)
            if name in weights:
                ws.append(name)
                ins.append(None)
            else:
                ins.append(name)
        window = ()
        if kind == "window":
            a = op.attrs()
            window = (a["kernel_shape"][0], a["strides"][0], (a.get("dilations") or [1])[0], a["pads"][0])
        facts.append(_Op(i, op, value_name(op.results[0]), kind, reason, ins, ws,
                         [value_name(r) for r in op.results], cyc.op_cycles(op, chip), window))
    return facts


# ---------------------------------------------------------------- row ranges of a slice


@dataclasses.dataclass
class SliceRanges:
    """One slice of a group: per tensor its (n0, n1, h0, h1) rows, and per window op the rows
    it reads of its input and the pad rows before / after them."""

    n: tuple
    h: tuple                      # rows of the group's last result
    tensors: dict                 # name -> (n0, n1, h0, h1)
    reads: dict                   # op name -> (h0, h1, pad_before, pad_after) of its first operand


def slice_ranges(group_ops: list, types: dict, n: tuple, h: tuple) -> SliceRanges:
    """Backward propagation of one slice's rows through a group's ops (the last op makes rows
    `h` of images `n`); each tensor's range is the union of what its consumers read."""
    ranges, reads = _last_rows(group_ops[-1], n, h), {}
    for f in reversed(group_ops):
        _read_rows(f, types, ranges, reads)
    return SliceRanges(n, h, ranges, reads)


def _last_rows(last, n: tuple, h: tuple) -> dict:
    """The ranges a slice starts from: rows `h` of images `n` of the group's last results."""
    return {r: (n[0], n[1], h[0], h[1]) for r in last.outs}


def _read_rows(f, types: dict, ranges: dict, reads: dict) -> None:
    """One step of `slice_ranges`, op `f` (those after it in the group done): the rows of its
    inputs that the rows of its result needed so far read, joined into `ranges`."""
    got = ranges.get(f.outs[0])
    if got is None:
        return
    oshape = types[f.outs[0]]
    if f.kind == "batch":                 # its kernel makes every row of its images
        got = ranges[f.outs[0]] = (got[0], got[1], 0, oshape[2])
    n0, n1, h0, h1 = got
    for name in f.ins:
        if name is None:
            continue
        shape = types[name]
        nn = (0, 1) if shape[0] == 1 and oshape[0] != 1 else (n0, n1)
        if f.kind == "window":
            k, s, d, pb = f.window
            rng = geometry.input_range(h0, h1, k, s, d, pb, size=shape[2])
            need = (rng.start, rng.stop)
            reads[f.name] = (rng.start, rng.stop, rng.pad_before, rng.pad_after)
        elif f.kind == "batch":
            need = (0, shape[2])
        else:
            need = (0, 1) if shape[2] == 1 and oshape[2] != 1 else (h0, h1)
        old = ranges.get(name)
        if old is not None:
            nn = (min(nn[0], old[0]), max(nn[1], old[1]))
            need = (min(need[0], old[2]), max(need[1], old[3]))
        ranges[name] = (nn[0], nn[1], need[0], need[1])


# ---------------------------------------------------------------- a group and its plan


@dataclasses.dataclass
class Group:
    """Ops `start..stop-1` (positions in the planner's op list) run on chip as `n_slices` x
    `h_slices` slices; `local` gives each tensor its per-lane offset, bytes and copies."""

    start: int
    stop: int
    ops: list                      # _Op
    n_slices: int = 1
    h_slices: int = 1
    cycles: int = 0
    inputs: list = dataclasses.field(default_factory=list)       # activations loaded from DDR
    outputs: list = dataclasses.field(default_factory=list)      # results stored to DDR
    weights: list = dataclasses.field(default_factory=list)
    local: dict = dataclasses.field(default_factory=dict)        # (name, copy) -> offset per lane
    local_peak: int = 0
    copies: int = 1                # buffers of each input / output (2: DMA overlaps compute)
    is_global: bool = False        # one op run from DDR
    on_host: bool = False          # a global op the host runs

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.ops]

    def slices(self, types: dict) -> list[SliceRanges]:
        """Every slice's ranges, N outer, H inner."""
        out_shape = types[self.ops[-1].outs[0]]
        ns = _bounds(out_shape[0], self.n_slices)
        hs = _bounds(out_shape[2], self.h_slices)
        return [slice_ranges(self.ops, types, n, h) for n in ns for h in hs]

    def __str__(self) -> str:
        if self.is_global:
            f = self.ops[0]
            why = f.reason or "does not fit local memory"
            where = "host" if self.on_host else "global"
            return f"{where} {f.name} ({f.op.name}): {why}, {self.cycles:,} cycles"
        return (f"group {self.ops[0].name}..{self.ops[-1].name} ({len(self.ops)} ops), {self.n_slices}x{self.h_slices} "
                f"slices (N x H), local {self.local_peak:,} B per lane, {self.cycles:,} cycles")


def _bounds(size: int, parts: int) -> list[tuple]:
    cuts = [size * k // parts for k in range(parts + 1)]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


@dataclasses.dataclass
class GroupPlan:
    """The groups of a module in program order (global ops are groups of one), with the cycle
    estimate of each and of the whole."""

    chip: str
    groups: list
    types: dict                    # tensor name -> shape
    single_cycles: int             # the same program with one op per group

    @property
    def cycles(self) -> int:
        return sum(g.cycles for g in self.groups)

    @property
    def local_groups(self) -> list:
        return [g for g in self.groups if not g.is_global]

    def as_dict(self) -> dict:
        return {"cycles": self.cycles, "single_op_cycles": self.single_cycles,
                "groups": [{"ops": g.names, "global": g.is_global, "host": g.on_host, "n_slices": g.n_slices, "h_slices": g.h_slices,
                            "cycles": g.cycles, "local_bytes_per_lane": g.local_peak,
                            **({"reason": g.ops[0].reason or "does not fit local memory"} if g.is_global else {})}
                           for g in self.groups]}

    def __str__(self) -> str:
        groups = self.local_groups
        ops = sum(len(g.ops) for g in groups)
        sliced = sum(1 for g in groups if g.n_slices * g.h_slices > 1)
        return (f"layer groups on {self.chip}: {len(groups)} groups holding {ops} ops ({sliced} sliced), "
                f"{len(self.groups) - len(groups)} global ops; {self.cycles:,} cycles "
                f"against {self.single_cycles:,} with one op per group")


def _lifetimes(ops) -> tuple[dict, dict]:
    """(first, last) position in a group of each tensor its ops make or read."""
    first, last = {}, {}
    for p, f in enumerate(ops):
        for o in f.outs:
            first.setdefault(o, p)
            last.setdefault(o, p)
        for name in f.ins:
            if name is not None:
                last[name] = p
    return first, last


def local_floor(ops, sizes: dict, ins, outs, ws, copies: int, weight_sizes: dict) -> int:
    """The bytes per lane `place_local` needs at least: everything alive at its busiest step (no
    placement packs tighter), so a group over it is known not to fit without placing it."""
    end = len(ops)
    first, last = _lifetimes(ops)
    alive = [0] * (end + 1)
    whole = sum(weight_sizes[w] for w in ws)
    for name, size in sizes.items():
        if name in ins or name in outs:
            whole += copies * size
        else:
            for t in range(first.get(name, 0), last.get(name, end) + 1):
                alive[t] += size
    return whole + max(alive)


def place_local(ops, sizes: dict, ins, outs, ws, copies: int, weight_sizes: dict) -> tuple[dict, int]:
    """Per-lane offsets of a group's tensors, keyed (name, copy): weights for the whole group,
    inputs and outputs for a whole slice (`copies` of each, so the next slice's DMA overlaps this
    one's compute), intermediates from the op that makes them to their last reader."""
    end = len(ops)
    first, last = _lifetimes(ops)
    items = [((w, 0), weight_sizes[w], -1, end) for w in ws]
    for name, size in sizes.items():
        if name in ins or name in outs:
            items.extend(((name, c), size, 0, end) for c in range(copies))
        else:
            items.append(((name, 0), size, first.get(name, 0), last.get(name, end)))
    return place(items, key=lambda k: (k[0], k[1]))


class _Planner:
    def __init__(self, model, chip, host: set):
        self.chip = chip
        self.host = host
        self.preprocessing = host_preprocessing(model) & host     # what the input pipeline hides
        self.facts = _facts(model, chip, host)
        self.types: dict = {}
        self.items: dict = {}
        for op in model.ops:
            for r in op.results:
                if isinstance(r.type, TensorType):
                    self.types[value_name(r)] = tuple(r.type.get_shape())
                    self.items[value_name(r)] = _itemsize(r.type)
        outputs = {value_name(v) for v in model.return_op.operands}
        pos = {f.name: p for p, f in enumerate(self.facts)}
        for f in self.facts:
            for o in f.outs[1:]:
                pos[o] = pos[f.name]
        self.last_use = [p for p in range(len(self.facts))]
        for p, f in enumerate(self.facts):
            for name in f.ins:
                if name is not None and name in pos:
                    q = pos[name]
                    self.last_use[q] = max(self.last_use[q], p)
            if any(o in outputs for o in f.outs):
                self.last_use[p] = len(self.facts)
        self.bank = chip.local_mem_per_lane
        self.bytes_per_cycle = chip.ddr_bandwidth / chip.frequency_hz
        self._keys: list | None = None
        self._fewest: dict = {}           # (last op, rows) -> the fewest H slices its last group took
        self._slices: dict = {}           # (images, rows) -> (first op done, ranges, reads) of groups
        self._slices_stop = None          # ending before this op (`_slice`)

    # -- one candidate group

    def _io(self, ops: list) -> tuple[list, list, list]:
        made = {o for f in ops for o in f.outs}
        ins, ws = [], []
        for f in ops:
            for name in f.ins:
                if name is not None and name not in made and name not in ins:
                    ins.append(name)
            for w in f.weights:
                if w not in ws:
                    ws.append(w)
        return ins, list(ops[-1].outs), ws

    def _cost(self, ops, rng: SliceRanges, count: int, ins, outs, ws, copies: int) -> int:
        compute = 0
        for f in ops:
            got = rng.tensors.get(f.outs[0])
            if got is None:
                continue
            shape = self.types[f.outs[0]]
            share = (got[1] - got[0]) * (got[3] - got[2]) / (shape[0] * shape[2])
            compute += f.cycles.compute * share
        load = sum(rows_bytes(self.types[n], rng.tensors[n], self.items[n]) for n in ins if n in rng.tensors)
        store = sum(rows_bytes(self.types[n], rng.tensors[n], self.items[n]) for n in outs)
        wbytes = sum(numel(self.types[w]) * self.items[w] for w in ws)
        load, store, w = load / self.bytes_per_cycle, store / self.bytes_per_cycle, wbytes / self.bytes_per_cycle
        if copies > 1:
            total = w + load + store + compute + (count - 1) * max(compute, load + store)
        else:
            total = w + count * (load + compute + store)
        return math.ceil(total)

    def _fact_key(self, f) -> tuple:
        """Everything `evaluate` reads of one op: its names, kind, window, compute cycles, and
        the shapes and item sizes of the tensors it touches."""
        names = [n for n in (*f.ins, *f.outs, *f.weights) if n is not None]
        return (f.name, f.kind, tuple(f.ins), tuple(f.outs), tuple(f.weights), f.cycles.compute, f.window,
                tuple((self.types[n], self.items[n]) for n in names))

    def evaluate(self, start: int, stop: int):
        """(cycles, Group) of the best slicing of ops start..stop-1, or None if none fits.

        Remembered across plans by what it depends on (the ops' facts and the chip's memory and
        bandwidth): the mixed-precision search plans program after program that differ in a few
        ops, and the groups that do not hold one of those are the same."""
        if self._keys is None:
            self._keys = [self._fact_key(f) for f in self.facts]
        key = (self.chip.lanes, self.chip.eu_bytes, self.bank, self.bytes_per_cycle, tuple(self._keys[start:stop]))
        if key in _EVALUATED:
            _EVALUATED.move_to_end(key)
            got = _EVALUATED[key]
            if got is None:
                return None
            cost, n_slices, parts, ins, outs, ws, local, peak, copies = got
            return cost, Group(start, stop, self.facts[start:stop], n_slices, parts, cost, list(ins), list(outs),
                               list(ws), dict(local), peak, copies)
        best = self._evaluate(start, stop)
        g = best and best[1]
        _EVALUATED[key] = None if best is None else (best[0], g.n_slices, g.h_slices, tuple(g.inputs),
                                                     tuple(g.outputs), tuple(g.weights), dict(g.local),
                                                     g.local_peak, g.copies)
        if len(_EVALUATED) > _CACHE_SIZE:
            _EVALUATED.popitem(last=False)
        return best

    def _evaluate(self, start: int, stop: int):
        ops = self.facts[start:stop]
        ins, outs, ws = self._io(ops)
        oshape = self.types[ops[-1].outs[0]]
        n_total, h_total = oshape[0], oshape[2]
        h_free = all(f.kind != "batch" for f in ops)
        best = None
        fits = functools.cache(lambda n_rows, parts: self._fits(start, ops, n_rows, parts, ins, outs, ws))
        for n_rows in sorted({n_total, 1}, reverse=True):
            fewest = self._fewest_parts(fits, ops, n_rows, h_free)
            if fewest is None:
                continue
            options = {min(h_total, fewest << k) for k in range(4 if h_free else 1)}
            for parts in sorted(options):
                got = fits(n_rows, parts)
                if got is None:
                    continue
                copies, rng, local, peak = got
                count = -(-n_total // n_rows) * parts
                cost = self._cost(ops, rng, count, ins, outs, ws, copies)
                if best is None or cost < best[0]:
                    best = (cost, Group(start, stop, ops, -(-n_total // n_rows), parts, cost, ins, outs, ws, local,
                                        peak, copies))
            if best is not None:
                break                        # whole images fit: no need to slice N
        return best

    def _fewest_parts(self, fits, ops, n_rows: int, h_free: bool) -> int | None:
        """The fewest H slices that fit (`fits(n_rows, parts)`; by bisection: slices shrink as
        they multiply); only whole images unless `h_free`."""
        full = self.types[ops[-1].outs[0]][2]
        if fits(n_rows, 1) is not None:
            return 1
        if not h_free or full == 1 or fits(n_rows, full) is None:
            return None
        lo, hi = 2, full
        hint = self._fewest.get((ops[-1].index, n_rows))      # the group one op shorter: often the answer
        if hint is not None and lo < hint < hi:
            if fits(n_rows, hint) is None:
                lo = hint + 1
            elif fits(n_rows, hint - 1) is None:
                lo = hi = hint
            else:
                hi = hint - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if fits(n_rows, mid) is not None:
                hi = mid
            else:
                lo = mid + 1
        self._fewest[(ops[-1].index, n_rows)] = lo
        return lo

    def _fits(self, start: int, ops, n_rows: int, parts: int, ins, outs, ws):
        """(copies, ranges, local, peak) of the split into `parts` H slices when it fits local
        memory, else None. Sized on the split's first, middle and last slices (the pads differ
        at the edges, the halo is widest inside), each tensor at its largest; the ranges
        returned are the middle slice's (for the cost)."""
        oshape = self.types[ops[-1].outs[0]]
        h_total = oshape[2]
        cuts = _bounds(h_total, parts)
        probes = [cuts[0], cuts[len(cuts) // 2], cuts[-1]]
        ranges = [self._slice(start, start + len(ops), (0, n_rows), h) for h in dict.fromkeys(probes)]
        rng = ranges[len(ranges) // 2]
        sizes = slice_lane_sizes(ranges, self.types, self.items, self.chip)
        wsizes = weight_lane_sizes(ws, self.types, self.items, self.chip)
        for copies in (2, 1):
            io = sum(b for n, b in sizes.items() if n in ins or n in outs)
            total = sum(sizes.values()) + (copies - 1) * io + sum(wsizes.values())
            if total <= self.bank:           # everything at once fits: no placement needed yet
                return copies, rng, {}, total
            if local_floor(ops, sizes, ins, outs, ws, copies, wsizes) > self.bank:
                continue
            local, peak = place_local(ops, sizes, ins, outs, ws, copies, wsizes)
            if peak <= self.bank:
                return copies, rng, local, peak
        return None

    def _slice(self, start: int, stop: int, n: tuple, h: tuple) -> SliceRanges:
        """`slice_ranges` of ops start..stop-1, carried on from the same slice of the group one op
        shorter where that was the last asked: `plan` tries the groups ending at `stop` longest
        last, and a group's ranges are the shorter one's with its first op's reads joined in."""
        if stop != self._slices_stop:
            self._slices, self._slices_stop = {}, stop
        done, ranges, reads = self._slices.get((n, h)) or (stop, _last_rows(self.facts[stop - 1], n, h), {})
        if done < start:                    # (a longer group was asked before: start again)
            done, ranges, reads = stop, _last_rows(self.facts[stop - 1], n, h), {}
        for k in range(done - 1, start - 1, -1):
            _read_rows(self.facts[k], self.types, ranges, reads)
        self._slices[(n, h)] = (start, ranges, reads)
        return SliceRanges(n, h, dict(ranges), dict(reads))

    def _global_cycles(self, f) -> int:
        """A global op's cycles; a host op's are the host's time (its FLOPs at `host.flops` or
        its bytes at `host.bandwidth`, the longer), in chip cycles, of which the input pipeline
        hides `host.overlap` for the space-to-depth preprocessing only: an op the host runs
        between chip ops holds the chip up for all of it."""
        if f.index not in self.host:
            return f.cycles.cycles
        moved = sum(numel(self.types[n]) * self.items[n] for n in f.ins if n is not None)
        moved += sum(numel(self.types[o]) * self.items[o] for o in f.outs)
        host = self.chip.host
        seconds = max(moved / host.bandwidth, f.op.flops() / host.flops)
        hidden = host.overlap if f.index in self.preprocessing else 0.0
        return math.ceil(seconds * (1.0 - hidden) * self.chip.frequency_hz)

    def plan(self) -> GroupPlan:
        n = len(self.facts)
        best = [0] + [None] * n
        choice: list = [None] * (n + 1)
        single = 0                        # every op on its own (a group of one, or global)
        for j in range(1, n + 1):
            f = self.facts[j - 1]
            alone = self.evaluate(j - 1, j) if f.kind is not None else None
            g = alone[1] if alone else Group(j - 1, j, [f], cycles=self._global_cycles(f), is_global=True,
                                             on_host=f.index in self.host)
            single += g.cycles
            best[j], choice[j] = best[j - 1] + g.cycles, g
            for i in range(j - 2, max(-1, j - 1 - MAX_GROUP_OPS) if alone else j - 2, -1):
                if self.facts[i].kind is None or self.last_use[i] >= j:
                    break                 # a global op, or an inner result read after the group
                got = self.evaluate(i, j)
                if got is None:
                    break                 # one row does not fit: longer groups fit even less
                cost, group = got
                if best[i] + cost < best[j]:
                    best[j], choice[j] = best[i] + cost, group
        groups = []
        j = n
        while j > 0:
            g = choice[j]
            groups.append(g)
            j = g.start
        groups.reverse()
        return GroupPlan(self.chip.name, groups, self.types, single)


def plan_groups(model, chip, host: set | None = None) -> GroupPlan:
    """Layer groups and slices of a TPU module for `chip` (a name, path or Chip); `host` (op
    indices, by default `host_preprocessing(model)`) run on the host."""
    chip = chips.load(chip)
    if not any(isinstance(op, tpu.TpuOp) for op in model.ops):
        raise InternalError("layer groups", "the module has no TPU op (lower it first)")
    return _Planner(model, chip, host_preprocessing(model) if host is None else set(host)).plan()
