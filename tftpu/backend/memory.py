"""DDR memory assignment of a TPU module: every tensor outside the weights gets an address,
reusing memory by liveness; weights get their own region.

Activations are placed greedily, each at the lowest address that does not overlap a placed
tensor whose lifetime overlaps its own (TFLite's arena planner's "greedy by size"), in a few
orders (by size, lifetime, size x lifetime, first use, then seeded orders by jittered size,
until one reaches the lower bound); the smallest peak wins. The lower bound on any placement is the largest total of tensors live at one moment;
the plan reports both. Addresses are written into the tensor types, as TPU-MLIR prints them:
`tensor<1x64x56x56x!quant.uniform<i8:f32, 0.04:0>, 4096 : i64>`.

>>> plan = assign_memory(tpu_model, "npu1")      # doctest: +SKIP
>>> plan.peak, plan.lower_bound                  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import random

from xdsl.dialects.builtin import FunctionType, IntegerAttr, NoneType, TensorType, i64
from xdsl.rewriter import Rewriter

from tftpu import chip as chips
from tftpu.backend.cycles import tensor_bytes
from tftpu.ir import top
from tftpu.ir.base import value_name

__all__ = ["MemoryPlan", "plan_memory", "assign_memory", "write_addresses", "place", "first_fit", "best_placement"]



def _align(n: int, a: int) -> int:
    return -(-n // a) * a if a > 1 else n


@dataclasses.dataclass
class MemoryPlan:
    """Where each tensor lives in DDR: `addresses[name] = (address, bytes)`; activations from
    `activation_base`, weights from 0."""

    addresses: dict
    weight_bytes: int
    activation_base: int
    peak: int                   # bytes of the activation region
    lower_bound: int            # the most bytes live at one moment: no placement needs less
    alignment: int

    @property
    def overhead(self) -> float:
        """peak / lower bound - 1 (0.0 means no placement could do better)."""
        return self.peak / self.lower_bound - 1.0 if self.lower_bound else 0.0

    def __str__(self) -> str:
        return (f"DDR: weights {self.weight_bytes:,} B; activations peak {self.peak:,} B, lower bound "
                f"{self.lower_bound:,} B (+{100 * self.overhead:.1f}%), {len(self.addresses)} tensors, "
                f"{self.alignment}-byte aligned")

    def as_dict(self) -> dict:
        return {"weight_bytes": self.weight_bytes, "activation_base": self.activation_base, "peak": self.peak,
                "lower_bound": self.lower_bound, "overhead": round(self.overhead, 6), "alignment": self.alignment}


# Orders the placement may try, each a sort key of (size, first, last): TFLite's greedy by
# size, then by lifetime (long-lived first), by area (size x lifetime) and by first use.
ORDERS = {"size": lambda s, f, l: (-s, f), "lifetime": lambda s, f, l: (f - l, -s),
          "area": lambda s, f, l: (-s * (l - f + 1), f), "first": lambda s, f, l: (f, -s)}


def place(items, key=None, order: str = "size") -> tuple[dict, int]:
    """Offsets for `(tensor, size, first, last)` items (sizes already aligned) so that no two
    items alive at the same step share bytes, each in turn (`order`, one of ORDERS) at the lowest
    free offset; returns (offsets by tensor, peak). `key` breaks ties deterministically."""
    rank = ORDERS[order]
    return first_fit(sorted(items, key=lambda it: (*rank(it[1], it[2], it[3]), key(it[0]) if key else it[0])))


def first_fit(ordered) -> tuple[dict, int]:
    """Place items in the order given, each at the lowest offset free over its lifetime."""
    placed: list = []                        # (offset, size, first, last)
    offsets = {}
    for v, size, lo, hi in ordered:
        clashes = sorted((o, s) for o, s, f, l in placed if not (l < lo or hi < f))
        offset = 0
        for o, s in clashes:
            if offset + size <= o:
                break
            offset = max(offset, o + s)
        placed.append((offset, size, lo, hi))
        offsets[v] = offset
    return offsets, max((o + s for o, s, _, _ in placed), default=0)


def best_placement(items, bound: int, key, tries: int = 24) -> tuple[dict, int]:
    """The smallest peak over the ORDERS and `tries` orders by size jittered by up to 50%
    (seeded: the same items give the same plan), stopping at `bound`."""
    items = sorted(items, key=lambda it: key(it[0]))
    best = None
    for o in ORDERS:
        got = place(items, key=key, order=o)
        if best is None or got[1] < best[1]:
            best = got
        if best[1] <= bound:
            return best
    rng = random.Random(0)
    for _ in range(tries):
        weights = [rng.uniform(0.5, 1.5) for _ in items]
        order = sorted(range(len(items)), key=lambda i: (-items[i][1] * weights[i], i))
        got = first_fit([items[i] for i in order])
        if got[1] < best[1]:
            best = got
        if best[1] <= bound:
            break
    return best


def plan_memory(model, chip, groups=None) -> MemoryPlan:
    """The DDR plan of a TPU (or TOP) module for `chip` (its EU width is the alignment).

    With `groups` (a `tftpu.backend.layer_group.GroupPlan`), tensors made and used only inside a
    group stay in local memory and get no address, and a group's DDR inputs and outputs are all
    alive from its first op to its last (its slices read and write them throughout)."""
    chip = chips.load(chip)
    span, inner = {}, set()
    for g in (groups.local_groups if groups is not None else []):
        first_op, last_op = g.ops[0].index, g.ops[-1].index
        for f in g.ops:
            span[f.index] = (first_op, last_op)
            if f is not g.ops[-1]:
                inner.update(f.outs)
    align = chip.eu_bytes
    ops = model.ops
    weights, tensors = {}, {}
    first, last = {}, {}
    for i, op in enumerate(ops):
        if isinstance(op, top.NoneOp):
            continue
        if isinstance(op, top.Weight):
            weights[op.results[0]] = _align(tensor_bytes(op.results[0].type), align)
            continue
        lo, hi = span.get(i, (i, i))
        for r in op.results:
            if isinstance(r.type, TensorType) and value_name(r) not in inner:
                tensors[r] = _align(tensor_bytes(r.type), align)
                first[r] = 0 if isinstance(op, top.Input) else lo
                last[r] = first[r]
        for v in op.operands:
            if v in tensors:
                last[v] = max(last[v], hi)
    end = len(ops)
    for v in model.return_op.operands:
        if v in tensors:
            last[v] = end                    # outputs stay until the host reads them
    # the lower bound: the largest total live at one op
    events = sorted({first[v] for v in tensors} | {last[v] for v in tensors})
    bound = max((sum(s for v, s in tensors.items() if first[v] <= t <= last[v]) for t in events), default=0)
    items = [(v, tensors[v], first[v], last[v]) for v in tensors]
    offsets, peak = best_placement(items, bound, value_name)
    weight_bytes, addresses, at = 0, {}, 0
    for v, size in weights.items():
        addresses[value_name(v)] = (at, size)
        at += size
    weight_bytes = at
    base = _align(weight_bytes, align)
    for v, off in offsets.items():
        addresses[value_name(v)] = (base + off, tensors[v])
    return MemoryPlan(addresses, weight_bytes, base, peak, bound, align)


def assign_memory(model, chip, groups=None) -> MemoryPlan:
    """Plan DDR memory and write each tensor's address into its type (the function's signature
    follows its arguments' and results' new types)."""
    chip = chips.load(chip)
    plan = plan_memory(model, chip, groups)
    write_addresses(model, plan)
    return plan


def write_addresses(model, plan: MemoryPlan) -> None:
    """Write each planned tensor's DDR address into its type, as TPU-MLIR prints it."""
    fn = model.func
    for op in model.ops:
        for r in list(op.results):
            if isinstance(r.type, NoneType) or not isinstance(r.type, TensorType):
                continue
            name = value_name(r)
            if name in plan.addresses:
                t = r.type
                Rewriter.replace_value_with_new_type(
                    r, TensorType(t.element_type, t.get_shape(), IntegerAttr(plan.addresses[name][0], i64)))
        if isinstance(op, top.Input):
            Rewriter.replace_value_with_new_type(op.operands[0], op.results[0].type)
    ret = model.return_op
    fn.properties["function_type"] = FunctionType.from_lists([a.type for a in fn.body.block.args],
                                                             [v.type for v in ret.operands])
