"""Data layouts and memory formats: NCHW, NHWC, the chip's lane-blocked format, and reorders.

A *layout* is how a tensor's logical axes are ordered in memory; the convert-layout pass tracks
it as a permutation `perm` of the logical axes (physical axis i holds logical axis perm[i]).
A *memory format* adds what a chip does to the bytes: NCHW, NHWC, or `lane_blocked` (channels
spread over the NPU lanes, each lane's block aligned to the EU width), as in TPU-MLIR's local
memory. Changing format is an explicit `layout.Reorder` op, counted and costed.

>>> perm_between("NCHW", "NHWC", 4)
(0, 2, 3, 1)
>>> MemoryFormat.parse("lane_blocked:64:64").lanes
64
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from xdsl.dialects.builtin import IntAttr, StringAttr, TensorType
from xdsl.ir import Dialect, ParametrizedAttribute
from xdsl.irdl import IRDLOperation, attr_def, irdl_attr_definition, irdl_op_definition, operand_def, result_def

from tftpu import chip as chips
from tftpu.chip import FORMAT_KINDS, NCHW, NHWC, MemoryFormat  # noqa: F401  (FORMAT_KINDS re-exported)
from tftpu.ir.base import loc_name, value_name

Perm = tuple[int, ...]

# ---------------------------------------------------------------- permutations


def identity(rank: int) -> Perm:
    """The identity permutation of `rank` axes."""
    return tuple(range(rank))


def is_identity(perm) -> bool:
    return all(i == p for i, p in enumerate(perm))


def inverse(perm) -> Perm:
    """`inverse(p)[p[i]] == i`."""
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


def compose(first, then) -> Perm:
    """The single transpose equal to transposing by `first`, then by `then`."""
    return tuple(first[t] for t in then)


def relative(src, dst) -> Perm:
    """The transpose order taking a tensor laid out as `src` to `dst` (both relative to logical)."""
    pos = inverse(src)
    return tuple(pos[d] for d in dst)


def apply_perm(shape, perm) -> tuple:
    """Shape after transposing by `perm`."""
    return tuple(shape[p] for p in perm)


def only_moves_ones(shape, order) -> bool:
    """True when transposing `shape` by `order` moves only size-1 axes: a copy-free reshape."""
    moved = [a for a in order if shape[a] != 1]
    return moved == sorted(moved)


def channels_last(rank: int) -> Perm:
    """NC... -> N...C, e.g. (0, 2, 3, 1) for rank 4."""
    return (0, *range(2, rank), 1)


def channels_first(rank: int) -> Perm:
    """N...C -> NC..., e.g. (0, 3, 1, 2) for rank 4."""
    return (0, rank - 1, *range(1, rank - 1))


DATA_LAYOUTS = ("NCHW", "NHWC")
KERNEL_LAYOUTS = ("OIHW", "HWIO")


def perm_between(src: str, dst: str, rank: int) -> Perm:
    """Transpose order from data (NCHW/NHWC) or kernel (OIHW/HWIO) layout `src` to `dst`."""
    if src == dst:
        return identity(rank)
    pair = (src, dst)
    if pair == ("NCHW", "NHWC"):
        return channels_last(rank)
    if pair == ("NHWC", "NCHW"):
        return channels_first(rank)
    if pair == ("OIHW", "HWIO"):
        return (*range(2, rank), 1, 0)
    if pair == ("HWIO", "OIHW"):
        return (rank - 1, rank - 2, *range(rank - 2))
    raise ValueError(f"no transpose from layout {src} to {dst}")


def layout_of(base: str, perm) -> str | None:
    """The data layout a tensor of layout `base` has after `perm`, or None if not NCHW/NHWC."""
    rank = len(perm)
    for name in DATA_LAYOUTS:
        if base in DATA_LAYOUTS and tuple(perm) == perm_between(base, name, rank):
            return name
    return None


def perm_name(perm) -> str:
    """A short name for a permutation, e.g. "0231"."""
    return "".join(str(p) if p < 10 else f"_{p}_" for p in perm)


# ---------------------------------------------------------------- memory formats (the chip's)

@irdl_attr_definition
class FormatAttr(ParametrizedAttribute):
    """`#layout.format<"lane_blocked", 64, 64>`: a memory format on an op or a tensor encoding."""

    name = "layout.format"
    kind: StringAttr
    lanes: IntAttr
    align: IntAttr

    @classmethod
    def of(cls, fmt: MemoryFormat | str) -> "FormatAttr":
        fmt = MemoryFormat.parse(fmt) if isinstance(fmt, str) else fmt
        return cls(StringAttr(fmt.kind), IntAttr(fmt.lanes), IntAttr(fmt.align))

    @property
    def format(self) -> MemoryFormat:
        return MemoryFormat(self.kind.data, self.lanes.data, self.align.data)


def with_format(t: TensorType, fmt: MemoryFormat | str) -> TensorType:
    """`t` with its memory format as the tensor encoding: tensor<1x64x56x56xf32, #layout.format<..>>."""
    return TensorType(t.element_type, t.get_shape(), FormatAttr.of(fmt))


def format_of(t: TensorType) -> MemoryFormat:
    """The memory format a tensor type carries (NCHW when it has none)."""
    enc = getattr(t, "encoding", None)
    return enc.format if isinstance(enc, FormatAttr) else NCHW


@irdl_op_definition
class Reorder(IRDLOperation):
    """An explicit memory-format change: same logical tensor, bytes moved from `src` to `dst`."""

    name = "layout.reorder"
    input = operand_def(TensorType)
    output = result_def(TensorType)
    src = attr_def(FormatAttr)
    dst = attr_def(FormatAttr)

    @property
    def op_name(self) -> str:
        """The op's name without its dialect, for messages."""
        return "Reorder"

    @property
    def loc(self) -> str:
        return loc_name(self)

    def attrs(self) -> dict:
        return {"src": str(self.src.format), "dst": str(self.dst.format)}

    def flops(self) -> int:
        return 0

    def verify_(self) -> None:
        from xdsl.utils.exceptions import VerifyException
        a, b = self.input.type, self.output.type
        if a.get_shape() != b.get_shape() or a.element_type != b.element_type:
            raise VerifyException(f"layout.reorder: {a} -> {b} changes the tensor, not only its format")


Layout = Dialect("layout", [Reorder], [FormatAttr])


# ---------------------------------------------------------------- chips

Chip = chips.Chip
load_chip = chips.load       # a chip from tftpu/configs/chips/NAME.yaml or a YAML path


# ---------------------------------------------------------------- reorders: plan, count, cost

@dataclass(frozen=True)
class ReorderCost:
    """Bytes a reorder reads and writes, and the time that takes at the chip's bandwidth."""

    bytes_read: int
    bytes_written: int
    seconds: float


def reorder_cost(shape, itemsize: int, src: MemoryFormat, dst: MemoryFormat, chip: Chip) -> ReorderCost:
    """Cost of changing a tensor's memory format (0 when the formats are the same)."""
    if src == dst:
        return ReorderCost(0, 0, 0.0)
    rd, wr = src.nbytes(shape, itemsize), dst.nbytes(shape, itemsize)
    bw = chip.reorder_bandwidth or chip.ddr_bandwidth
    return ReorderCost(rd, wr, (rd + wr) / bw)


@dataclass
class FormatPlan:
    """Memory format of every tensor and the reorders needed between them."""

    formats: dict[str, MemoryFormat]
    reorders: list[tuple[str, MemoryFormat, MemoryFormat, ReorderCost]]

    @property
    def count(self) -> int:
        return len(self.reorders)

    @property
    def seconds(self) -> float:
        return sum(c.seconds for *_, c in self.reorders)

    @property
    def bytes_moved(self) -> int:
        return sum(c.bytes_read + c.bytes_written for *_, c in self.reorders)

    def summary(self) -> str:
        kinds = Counter(f"{a}->{b}" for _, a, b, _ in self.reorders)
        detail = ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items())) or "none"
        return (f"{self.count} reorders ({detail}); {self.bytes_moved} bytes moved, "
                f"{self.seconds * 1e6:.1f} us at the chip's bandwidth")


def _is_4d(v) -> bool:
    t = v.type
    return isinstance(t, TensorType) and len(t.get_shape()) == 4


def plan_formats(model, chip: Chip) -> FormatPlan:
    """Give each 4-D activation the format its producer wants on `chip` (inputs: the chip's io
    format) and list one reorder per (tensor, wanted format) where a consumer wants another.
    Only moves into or out of the lane-blocked format count: plain NCHW vs NHWC order is what
    ConvertLayout settles in TOP, with explicit Permute ops. Other ranks stay plain."""
    from tftpu.ir import top

    formats: dict = {}
    reorders: dict = {}
    outputs = set(model.return_op.operands)

    def need(v, want: MemoryFormat):
        have = formats.get(v)
        if have is None or have == want or (v, want) in reorders:
            return
        if "lane_blocked" not in (have.kind, want.kind):
            return  # NCHW vs NHWC order in TOP is ConvertLayout's business: explicit Permute ops
        shape = tuple(v.type.get_shape())
        itemsize = max(1, v.type.element_type.bitwidth // 8) if hasattr(v.type.element_type, "bitwidth") else 4
        reorders[(v, want)] = (value_name(v), have, want, reorder_cost(shape, itemsize, have, want, chip))

    for op in model.ops:
        if isinstance(op, (top.Weight, top.NoneOp)):
            continue
        want = chip.io_format if isinstance(op, top.Input) else chip.format_for(op.name)
        if want.kind != "lane_blocked" and "layout" in op.attributes:
            want = NHWC if op.attributes["layout"].data == "NHWC" else NCHW
        if not isinstance(op, top.Input):
            for v in op.operands:
                if _is_4d(v):
                    need(v, want)
        for r in op.results:
            if _is_4d(r):
                formats[r] = want
    for v in outputs:
        if _is_4d(v):
            need(v, chip.io_format)
    names = {value_name(v): f for v, f in formats.items()}
    return FormatPlan(names, list(reorders.values()))


def insert_reorders(model, chip: Chip) -> FormatPlan:
    """Make the plan explicit: a `layout.reorder` op per planned reorder, shared by every use
    that wants that format; returns the plan. The TOP interpreter runs a reorder as identity."""
    from tftpu.ir import top

    plan = plan_formats(model, chip)
    by_name = {(name, str(dst)): (src, dst) for name, src, dst, _ in plan.reorders}
    if not by_name:
        return plan
    made: dict = {}
    for op in list(model.ops) + [model.return_op]:
        if isinstance(op, (top.Weight, top.NoneOp, top.Input, Reorder)):
            continue
        want = chip.io_format if op is model.return_op else chip.format_for(op.name)
        for i, v in enumerate(op.operands):
            key = (value_name(v), str(want))
            if key not in by_name or not _is_4d(v):
                continue
            if key not in made:
                src, dst = by_name[key]
                r = Reorder.create(operands=[v], result_types=[v.type],
                                   attributes={"src": FormatAttr.of(src), "dst": FormatAttr.of(dst)})
                top.set_loc(r, f"{key[0]}_{dst.kind}")
                op.parent.insert_op_before(r, op) if op is not model.return_op else \
                    model.return_op.parent.insert_op_before(r, model.return_op)
                made[key] = r.results[0]
            op.operands[i] = made[key]
    for v in model.return_op.operands:
        r = v.owner
        if isinstance(r, Reorder):
            src_op = r.input.owner
            name = value_name(r.input)
            if len(src_op.results) == 1 and not isinstance(src_op, top.Input):
                top.set_loc(src_op, f"{name}_{r.src.format.kind}")
                top.set_loc(r, name)   # an output keeps its name (a reorder keeps the values)
    return plan


def count_reorders(model) -> int:
    """Number of `layout.reorder` ops in a model."""
    return sum(isinstance(op, Reorder) for op in model.ops)
