"""Per-op layout rules of the convert-layout pass, in the three categories of TVM's ConvertLayout.

A rule sees an op, its attributes and the layout *state* of each operand (the permutation its
physical tensor has relative to the op's logical operand) and returns a `Plan`: in which layout
each operand must arrive, the op's rewritten attributes, and the states of its results.

- layout-agnostic ops (elementwise, activations) adopt the incoming layout;
- lightly sensitive ops (Pad, Concat, Slice, Split, Reduce*, Softmax, LayerNorm, BatchNorm, Scale, Resize,
  Squeeze/Unsqueeze, Gather, Reshape/Flatten, MatMul) rewrite axis/pad/shape attributes;
- heavily sensitive ops (Conv, Deconv, pools, SpaceToDepth/DepthToSpace) take the layout asked
  for in `desired_layouts` (and, for Conv, the kernel layout), else adapt like light ones.

>>> sorted(HEAVY)[:3]
['top.AvgPool', 'top.Conv', 'top.Deconv']
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tftpu.ir import layout as L
from tftpu.ir import top
from tftpu.ir.layout import Perm


@dataclass(frozen=True)
class State:
    """How a value is laid out: physical = transpose(logical, perm); `sigma` (only after a
    reshape feeding MatMuls) means the last axis is further scrambled: physical[..., k] =
    logical[..., sigma[k]]."""

    perm: Perm
    sigma: tuple | None = None

    @property
    def plain(self) -> bool:
        return self.sigma is None and L.is_identity(self.perm)


@dataclass(frozen=True)
class Want:
    """Deliver the operand laid out by `perm` (a Permute at run time, or a transposed weight)."""

    perm: Perm


@dataclass(frozen=True)
class Const:
    """The operand must be a constant; use `fn(logical array)` instead (done at compile time)."""

    key: str
    fn: Callable


@dataclass(frozen=True)
class Expand:
    """A lower-rank runtime operand of a broadcasting op: reshape to `rank` axes, then `perm`."""

    rank: int
    perm: Perm


@dataclass
class Plan:
    """What the pass should emit for one op."""

    operands: list  # per operand: Want, Const, Expand, or None (as it is, e.g. a scrambled input)
    attrs: dict
    outs: list[State]
    op_name: str | None = None  # emit this op instead (e.g. Flatten -> Reshape)
    note: str = ""


class Context:
    """What rules may ask about values (implemented by the pass)."""

    desired: dict[str, list[str]]

    def shape(self, value) -> tuple | None: ...
    def state(self, value) -> State | None: ...
    def is_const(self, value) -> bool: ...
    def const_array(self, value): ...
    def uses(self, value) -> list: ...
    def is_output(self, value) -> bool: ...


RULES: dict[str, Callable] = {}
AGNOSTIC: set[str] = set()
LIGHT: set[str] = set()
HEAVY: set[str] = set()


def rule(category: set, *names: str):
    """Register the decorated rule for each TOP op named (bare names here; keys are full names)."""
    def wrap(fn):
        for n in names:
            RULES[f"top.{n}"] = fn
            category.add(f"top.{n}")
        return fn
    return wrap


def _ident(n: int) -> Perm:
    return L.identity(n)


def keep_all(op, attrs, ctx) -> Plan:
    """The fallback: every operand in its original layout, results too."""
    specs = [None if ctx.shape(v) is None else Want(_ident(len(ctx.shape(v)))) for v in op.operands]
    return Plan(specs, attrs, [State(_ident(len(ctx.shape(r)))) for r in op.results])


def _in_perm(op, ctx, i: int = 0) -> Perm | None:
    st = ctx.state(op.operands[i])
    if st is None or st.sigma is not None:
        return None
    return st.perm


def _follows_input(fn):
    """A rule `fn(op, attrs, ctx, p)` for an op that follows the layout `p` of its first operand;
    it runs only when that layout is a plain permutation, else every layout is kept."""
    @functools.wraps(fn)
    def wrapped(op, attrs, ctx):
        p = _in_perm(op, ctx)
        return keep_all(op, attrs, ctx) if p is None else fn(op, attrs, ctx, p)
    return wrapped


def _as_input(p: Perm, attrs: dict, n_out: int = 1) -> Plan:
    """Operand 0 and every result laid out by `p`, with the (rewritten) `attrs`."""
    return Plan([Want(p)], attrs, [State(p) for _ in range(n_out)])


# ---------------------------------------------------------------- layout-agnostic

@rule(AGNOSTIC, *(n[4:] for n in top.LOOKUP_TABLES), "Cast")
@_follows_input
def unary(op, attrs, ctx, p):
    return _as_input(p, attrs)


def _majority(perms: list[Perm], rank: int) -> Perm:
    if not perms:
        return _ident(rank)
    counts = Counter(perms)
    best = max(counts.values())
    return next(p for p in perms if counts[p] == best)


def _majority_of_operands(op, ctx, rank: int, votes: Callable) -> Perm | None:
    """The most common layout among the operands for which `votes(v)` holds (identity if none
    votes); None when some operand has no plain layout."""
    cands = []
    for v in op.operands:
        st = ctx.state(v)
        if st is None or st.sigma is not None:
            return None
        if votes(v):
            cands.append(st.perm)
    return _majority(cands, rank)


def _broadcast_spec(ctx, v, rank: int, p: Perm):
    """How a broadcasting operand follows the chosen layout `p` of a rank-`rank` result."""
    shape = ctx.shape(v)
    if all(d == 1 for d in shape) and len(shape) <= rank:
        return Want(ctx.state(v).perm)  # a broadcast scalar: any layout is the same bytes
    if len(shape) == rank:
        return Want(p)
    if ctx.is_const(v):
        full = (1,) * (rank - len(shape)) + tuple(shape)
        return Const(f"b{L.perm_name(p)}", lambda a, full=full, p=p: np.ascontiguousarray(
            np.reshape(a, full).transpose(p)))
    return Expand(rank, p)


@rule(AGNOSTIC, "Add", "Sub", "Mul", "Div", "Max", "Min")
def binary(op, attrs, ctx):
    rank = len(ctx.shape(op.results[0]))
    p = _majority_of_operands(op, ctx, rank, lambda v: len(ctx.shape(v)) == rank and not ctx.is_const(v)
                              and not all(d == 1 for d in ctx.shape(v)))
    if p is None:
        return keep_all(op, attrs, ctx)
    return Plan([_broadcast_spec(ctx, v, rank, p) for v in op.operands], attrs, [State(p)])


@rule(AGNOSTIC, "PRelu")
def prelu(op, attrs, ctx):
    p = _in_perm(op, ctx)
    if p is None or ctx.state(op.operands[1]).sigma is not None:
        return keep_all(op, attrs, ctx)
    return Plan([Want(p), _broadcast_spec(ctx, op.operands[1], len(p), p)], attrs, [State(p)])


# ---------------------------------------------------------------- lightly sensitive

def _axis(a: int, rank: int) -> int:
    return a % rank if rank else 0


def _phys_axis(p: Perm, a: int) -> int:
    """Where logical axis `a` (may be negative) sits in a tensor laid out by `p`."""
    return p.index(_axis(a, len(p)))


@rule(LIGHT, "Concat")
def concat(op, attrs, ctx):
    rank = len(ctx.shape(op.results[0]))
    p = _majority_of_operands(op, ctx, rank, lambda v: not ctx.is_const(v))
    if p is None:
        return keep_all(op, attrs, ctx)
    ax = _axis(attrs["axis"], rank)
    return Plan([Want(p) for _ in op.operands], {**attrs, "axis": p.index(ax)}, [State(p)])


@rule(LIGHT, "Softmax")
@_follows_input
def softmax(op, attrs, ctx, p):
    return _as_input(p, {**attrs, "axis": _phys_axis(p, attrs["axis"])})


def _drop_axes(p: Perm, axes: set[int]) -> Perm:
    """The layout left when logical `axes` are removed from a tensor laid out by `p`."""
    kept = [a for a in range(len(p)) if a not in axes]
    return tuple(kept.index(a) for a in p if a not in axes)


@rule(LIGHT, "LayerNorm")
@_follows_input
def layer_norm(op, attrs, ctx, p):
    axes = sorted(p.index(_axis(a, len(p))) for a in attrs["axes"])
    specs = [Want(p)] + [None if ctx.shape(v) is None else Want(p) for v in op.operands[1:]]
    return Plan(specs, {**attrs, "axes": axes}, [State(p)])


@rule(LIGHT, "ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum")
@_follows_input
def reduce(op, attrs, ctx, p):
    return _over_axes(p, attrs, attrs["keepdims"])


@rule(LIGHT, "Squeeze")
@_follows_input
def squeeze(op, attrs, ctx, p):
    return _over_axes(p, attrs, keepdims=False)


def _over_axes(p: Perm, attrs: dict, keepdims: bool) -> Plan:
    """An op over logical `attrs["axes"]` that keeps them (size 1) or drops them from its result."""
    axes = {_axis(a, len(p)) for a in attrs["axes"]}
    out = p if keepdims else _drop_axes(p, axes)
    return Plan([Want(p)], {**attrs, "axes": sorted(p.index(a) for a in axes)}, [State(out)])


@rule(LIGHT, "Unsqueeze")
@_follows_input
def unsqueeze(op, attrs, ctx, p):
    rank = len(p) + len(attrs["axes"])
    new_axes = sorted({_axis(a, rank) for a in attrs["axes"]})
    old_to_new = [a for a in range(rank) if a not in new_axes]  # logical input axis -> output axis
    it = iter(p)
    out = tuple(a if a in new_axes else old_to_new[next(it)] for a in range(rank))
    return Plan([Want(p)], {**attrs, "axes": new_axes}, [State(out)])


@rule(LIGHT, "Pad")
@_follows_input
def pad(op, attrs, ctx, p):
    n, pads = len(p), attrs["paddings"]
    return _as_input(p, {**attrs, "paddings": [pads[a] for a in p] + [pads[a + n] for a in p]})


@rule(LIGHT, "Slice")
@_follows_input
def slice_(op, attrs, ctx, p):
    return _as_input(p, {**attrs, "axes": [_phys_axis(p, a) for a in attrs["axes"]]})


@rule(LIGHT, "Split")
@_follows_input
def split(op, attrs, ctx, p):
    return _as_input(p, {**attrs, "axis": _phys_axis(p, attrs["axis"])}, len(op.results))


@rule(LIGHT, "Gather")
def gather(op, attrs, ctx):
    p = _in_perm(op, ctx)
    idx = ctx.shape(op.operands[1])
    if p is None or len(idx) > 1:
        return keep_all(op, attrs, ctx)
    ax = _axis(attrs["axis"], len(p))
    out = p if len(idx) == 1 else _drop_axes(p, {ax})
    return Plan([Want(p), Want(_ident(len(idx)))], {**attrs, "axis": p.index(ax)}, [State(out)])


def _adapt_layout_attr(op, attrs, ctx, key: str = "layout"):
    """Layout-attribute ops (BatchNorm, Scale, Resize, pools...) follow an NCHW/NHWC input."""
    p = _in_perm(op, ctx)
    base = attrs.get(key, "NCHW")
    if p is None or L.layout_of(base, p) is None:
        return None
    return p, L.layout_of(base, p)


def _per_channel_op(op, attrs, ctx):
    p, lay = _data_plan(op, attrs, ctx)
    rest = [Want(_ident(len(ctx.shape(v)))) if ctx.shape(v) is not None else None for v in op.operands[1:]]
    return Plan([Want(p), *rest], {**attrs, "layout": lay}, [State(p)])


for _name in ("BatchNorm", "Scale"):
    rule(LIGHT, _name)(_per_channel_op)


# ---------------------------------------------------------------- reshape, flatten, matmul

def _groups(src, dst):
    """Split the non-1 axes of shapes `src` and `dst` into minimal runs of equal product."""
    s_axes = [a for a, d in enumerate(src) if d != 1]
    d_axes = [b for b, d in enumerate(dst) if d != 1]
    groups, i, j = [], 0, 0
    while i < len(s_axes) and j < len(d_axes):
        gs, gd = [s_axes[i]], [d_axes[j]]
        ps, pd = src[s_axes[i]], dst[d_axes[j]]
        i, j = i + 1, j + 1
        while ps != pd:
            if ps < pd:
                gs.append(s_axes[i])
                ps *= src[s_axes[i]]
                i += 1
            else:
                gd.append(d_axes[j])
                pd *= dst[d_axes[j]]
                j += 1
        groups.append((gs, gd))
    return groups


def _with_ones(order: list[int], dst) -> Perm:
    """Complete a physical order of dst's non-1 axes with its size-1 axes, each placed right
    after the logical axis before it (so an in-order result is the identity)."""
    out = list(order)
    for b, d in enumerate(dst):
        if d == 1:
            out.insert(0 if b == 0 else out.index(b - 1) + 1, b)
    return tuple(out)


def reshape_layout(src, dst, p: Perm):
    """For a reshape src -> dst of a tensor laid out by `p`: (physical dst shape, dst layout,
    scrambled group or None). The reshape runs on the physical tensor when every merge/split
    group is contiguous and in order there; a last group out of order is returned as
    (src axes in physical order, src axes in logical order) for the MatMul weight trick."""
    groups = _groups(src, dst)
    phys = [a for a in p if src[a] != 1]
    group_of = {a: gi for gi, (gs, _) in enumerate(groups) for a in gs}
    order, pos, scrambled = [], 0, None
    while pos < len(phys):
        gi = group_of[phys[pos]]
        gs = groups[gi][0]
        chunk = phys[pos:pos + len(gs)]
        if sorted(chunk) != sorted(gs):
            return None
        if chunk != gs:
            if scrambled is not None:
                return None
            scrambled = (gi, chunk)
        order.append(gi)
        pos += len(gs)
    out = _with_ones([b for gi in order for b in groups[gi][1]], dst)
    if scrambled is None:
        return L.apply_perm(dst, out), out, None
    gi, chunk = scrambled
    gs, gd = groups[gi]
    last = max(b for b, d in enumerate(dst) if d != 1)
    if gd != [last] or not L.is_identity(out) or any(d != 1 for d in dst[last + 1:]):
        return None
    return tuple(dst), out, (chunk, gs)


def _sigma(src, chunk, gs) -> tuple:
    """Logical index held at each physical position of a merged axis read in `chunk` order."""
    idx = np.arange(math.prod(src[a] for a in gs)).reshape([src[a] for a in gs])
    return tuple(int(i) for i in idx.transpose([gs.index(a) for a in chunk]).reshape(-1))


def _feeds_only_matmul_weights(op, ctx) -> bool:
    """True when every use of the op's result is input 0 of a MatMul with a constant 2-D right side."""
    r = op.results[0]
    if ctx.is_output(r):
        return False
    uses = ctx.uses(r)
    for user, idx in uses:
        if user.name != "top.MatMul" or idx != 0 or not ctx.is_const(user.operands[1]):
            return False
        if len(ctx.shape(user.operands[1])) != 2 or user.operands[1] is r:
            return False
    return bool(uses)


def _grouped(src, dst, p: Perm) -> Perm:
    """The layout nearest to `p` in which every merge/split group of src -> dst is contiguous and
    in order: groups keep their physical order of first appearance, size-1 axes stay put."""
    groups = _groups(src, dst)
    group_of = {a: gi for gi, (gs, _) in enumerate(groups) for a in gs}
    seq, seen = [], set()
    for a in p:
        if src[a] != 1 and group_of[a] not in seen:
            seen.add(group_of[a])
            seq.extend(groups[group_of[a]][0])
    it = iter(seq)
    return tuple(a if src[a] == 1 else next(it) for a in p)


@rule(LIGHT, "Reshape", "Flatten")
def reshape(op, attrs, ctx):
    p = _in_perm(op, ctx)
    src, dst = ctx.shape(op.operands[0]), ctx.shape(op.results[0])
    if p is None or L.is_identity(p):
        return keep_all(op, attrs, ctx)
    got = reshape_layout(src, dst, p)
    if got is None or (got[2] is not None and not _feeds_only_matmul_weights(op, ctx)):
        # one real transpose to the nearest layout where the reshape is a plain reshape
        p = _grouped(src, dst, p)
        got = reshape_layout(src, dst, p)
        if got is None or got[2] is not None:
            return keep_all(op, attrs, ctx)
    phys, out, scrambled = got
    if scrambled is not None:
        sigma = _sigma(src, *scrambled)
        return Plan([Want(p)], {"shape": list(phys)}, [State(out, sigma)], op_name="Reshape",
                    note="matmul weight rows permuted instead of the data")
    return Plan([Want(p)], {"shape": list(phys)}, [State(out)], op_name="Reshape")


@rule(LIGHT, "MatMul")
def matmul(op, attrs, ctx):
    st = ctx.state(op.operands[0])
    rank = len(ctx.shape(op.operands[0]))
    bias = ctx.shape(op.operands[2])
    bias_spec = None if bias is None else Want(_ident(len(bias)))
    if st is not None and st.sigma is not None:
        sigma = np.asarray(st.sigma)
        if attrs["right_transpose"]:
            fn = lambda w, s=sigma: np.ascontiguousarray(w[:, s])  # noqa: E731
        else:
            fn = lambda w, s=sigma: np.ascontiguousarray(w[s, :])  # noqa: E731
        key = "rows" + str(abs(hash(st.sigma)) % 10 ** 8)
        return Plan([None, Const(key, fn), bias_spec], attrs, [State(_ident(rank))],
                    note="weight rows permuted for a flatten")
    p = _in_perm(op, ctx)
    right = ctx.shape(op.operands[1])
    if p is not None and not L.is_identity(p) and p[-1] == rank - 1 and len(right) == 2 \
            and (bias is None or len(bias) <= 1):
        return Plan([Want(p), Want((0, 1)), bias_spec], attrs, [State(p)])
    return keep_all(op, attrs, ctx)


# ---------------------------------------------------------------- heavily sensitive

def _desired(op, ctx) -> list[str] | None:
    return ctx.desired.get(op.name) or ctx.desired.get(op.name[4:])


def _data_plan(op, attrs, ctx):
    """(input layout perm, new `layout` attr) for an op with a data `layout` attribute."""
    want = _desired(op, ctx)
    base = attrs.get("layout", "NCHW")
    rank = len(ctx.shape(op.operands[0]))
    if want and want[0] != "default":
        return L.perm_between(base, want[0], rank), want[0]
    got = _adapt_layout_attr(op, attrs, ctx)
    if got is not None:
        return got
    return _ident(rank), base


@rule(HEAVY, "Conv")
def conv(op, attrs, ctx):
    p, lay = _data_plan(op, attrs, ctx)
    want = _desired(op, ctx) or []
    k0 = attrs.get("kernel_layout", "OIHW")
    k1 = want[1] if len(want) > 1 and want[1] != "default" else ("HWIO" if want and lay == "NHWC" else
                                                                  "OIHW" if want else k0)
    if k1 not in L.KERNEL_LAYOUTS:
        raise ValueError(f"top.Conv kernel layout must be one of {L.KERNEL_LAYOUTS} or default, got {k1!r}")
    wrank = len(ctx.shape(op.operands[1]))
    bias = ctx.shape(op.operands[2])
    specs = [Want(p), Want(L.perm_between(k0, k1, wrank)), None if bias is None else Want(_ident(len(bias)))]
    return Plan(specs, {**attrs, "layout": lay, "kernel_layout": k1}, [State(p)])


@rule(HEAVY, "Deconv")
def deconv(op, attrs, ctx):
    p, lay = _data_plan(op, attrs, ctx)
    bias = ctx.shape(op.operands[2])
    specs = [Want(p), Want(_ident(len(ctx.shape(op.operands[1])))),
             None if bias is None else Want(_ident(len(bias)))]
    return Plan(specs, {**attrs, "layout": lay}, [State(p)])


@rule(HEAVY, "MaxPool", "AvgPool", "SpaceToDepth", "DepthToSpace")
def window(op, attrs, ctx):
    p, lay = _data_plan(op, attrs, ctx)
    return Plan([Want(p)], {**attrs, "layout": lay}, [State(p)])


rule(LIGHT, "Resize")(window)


@rule(HEAVY, "GlobalAvgPool", "GlobalMaxPool")
def global_pool(op, attrs, ctx):
    p, lay = _data_plan(op, attrs, ctx)
    out = p if attrs["keepdims"] else (0, 1)
    return Plan([Want(p)], {**attrs, "layout": lay}, [State(out)])


CATEGORIES = {"agnostic": AGNOSTIC, "light": LIGHT, "heavy": HEAVY}
