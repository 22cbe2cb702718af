"""ConvertLayout: rewrite a TOP module so its heavy ops run in the layouts asked for, with the
fewest transposes (TVM's ConvertLayout pass, carried past the ops where it and tf2onnx stop).

The pass walks the ops once, tracking for every value the permutation its physical tensor has
relative to the original (logical) one. Every `top.Permute` is absorbed into that state (so
tf2onnx's NHWC<->NCHW pairs cancel), each op's rule (`layout_rules`) says which layout it needs
and rewrites its axis/pad/layout attributes, and a transform is emitted only where a value's
layout and a use's need really differ: a `top.Permute` (or a copy-free `top.Reshape` when only
size-1 axes move), reused per (value, order). Constant weights are transposed at compile time.
Model inputs and outputs keep their original layout.

>>> report = ConvertLayout({"top.Conv": ["NHWC", "default"]}).apply(model)  # doctest: +SKIP
>>> report = convert_layout(model, layout="NCHW")                           # doctest: +SKIP
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from xdsl.dialects.builtin import NoneType

from tftpu.errors import ShapeError, UsageError
from tftpu.ir import attrs as A
from tftpu.ir import layout as L
from tftpu.ir import top
from tftpu.ir.module import TopModel, make_op, value_name
from tftpu.transforms import layout_rules as R
from tftpu.transforms.pipeline import ModulePass, register
from tftpu.utils.decisions import PassResult
from tftpu.utils.names import unique_name


@dataclass
class LayoutReport:
    """What the pass did: Permute counts before/after, where the remaining ones sit, rewrites."""

    permutes_before: int = 0
    permutes_after: int = 0
    at_inputs: int = 0
    at_outputs: int = 0
    inside: int = 0  # neither right after a model input nor right before an output
    absorbed: int = 0
    inserted: int = 0
    permute_bytes: int = 0  # bytes the remaining Permutes write at run time
    weights_transformed: int = 0
    layouts: Counter = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    layout: str = ""        # the layout asked for (convert_layout's), "" for a desired-layouts map

    def __str__(self) -> str:
        lay = ", ".join(f"{k}: {v}" for k, v in sorted(self.layouts.items()))
        return (f"permutes {self.permutes_before} -> {self.permutes_after} "
                f"(at inputs {self.at_inputs}, at outputs {self.at_outputs}, inside {self.inside}; "
                f"{self.permute_bytes} bytes moved); "
                f"absorbed {self.absorbed}, inserted {self.inserted}, weights transformed at compile "
                f"time {self.weights_transformed}; heavy ops: {lay or 'none'}")


def _check_desired(desired: dict) -> dict[str, list[str]]:
    out = {}
    for key, val in dict(desired).items():
        name = key if key.startswith("top.") else f"top.{key}"
        if name not in R.HEAVY and name not in ("top.Resize", "top.BatchNorm", "top.Scale"):
            raise UsageError(f"desired_layouts: {key!r} is not a layout-sensitive op "
                             f"(one of {sorted(R.HEAVY)} or Resize)")
        val = [val] if isinstance(val, str) else list(val)
        if not 1 <= len(val) <= 2 or val[0] not in (*L.DATA_LAYOUTS, "default"):
            raise UsageError(f"desired_layouts[{key!r}] = {val}: expected [data layout (NCHW, NHWC or "
                             f"default), kernel layout (OIHW, HWIO or default)]")
        if len(val) == 2 and val[1] not in (*L.KERNEL_LAYOUTS, "default"):
            raise UsageError(f"desired_layouts[{key!r}]: kernel layout {val[1]!r} is not OIHW, HWIO or default")
        out[name] = val
    return out


def desired_for_chip(chip) -> dict[str, list[str]]:
    """`desired_layouts` from a chip config (`tftpu.ir.layout.Chip` or its name): each heavy op
    takes the data layout its memory format comes from."""
    if not isinstance(chip, L.Chip):
        chip = L.load_chip(chip)
    return {n: ([chip.data_layout(n), "default"] if n == "top.Conv" else [chip.data_layout(n)])
            for n in sorted(R.HEAVY)}


def desired_for(layout: str, kernel_layout: str = "default") -> dict[str, list[str]]:
    """`desired_layouts` putting every heavily layout-sensitive op in `layout`."""
    if layout not in L.DATA_LAYOUTS:
        raise UsageError(f"layout must be NCHW or NHWC, got {layout!r}")
    return {n: ([layout, kernel_layout] if n == "top.Conv" else [layout]) for n in sorted(R.HEAVY)}


class ConvertLayout:
    """The pass: `ConvertLayout(desired_layouts).apply(model)` rewrites `model` in place.

    `desired_layouts` maps heavy ops to `[data layout, kernel layout]`, e.g.
    `{"top.Conv": ["NHWC", "default"]}`; "default" picks OIHW for NCHW data and HWIO for NHWC.
    """

    name = "convert-layout"

    def __init__(self, desired_layouts: dict):
        self.desired = _check_desired(desired_layouts)

    def apply(self, model, weights: dict | None = None) -> LayoutReport:
        """Rewrite `model` (a TopModel, or an xDSL module plus its weights dict) in place."""
        if not isinstance(model, TopModel):
            if weights is None:
                raise UsageError("ConvertLayout.apply: pass the weights dict with a bare module")
            model = TopModel(model, weights)
        return _Run(model, self.desired).run()


def convert_layout(model, weights=None, layout: str = "NHWC", kernel_layout: str = "default") -> LayoutReport:
    """Convert every heavy op of `model` to `layout` (convert_layout(model, "NCHW") works too)."""
    if isinstance(weights, str):
        weights, layout = None, weights
    report = ConvertLayout(desired_for(layout, kernel_layout)).apply(model, weights)
    report.layout = layout
    return report


@register
@dataclass
class ConvertLayoutPass(ModulePass):
    """`convert-layout{layout=NHWC kernel_layout=default}`: every heavy op to `layout`, with the
    fewest transposes left (run `canonicalize` after it to fold what it leaves)."""

    name: ClassVar[str] = "convert-layout"
    layout: str = "NHWC"
    kernel_layout: str = "default"

    def __post_init__(self):
        if self.layout not in L.DATA_LAYOUTS:
            raise ValueError(f"layout must be NCHW or NHWC, not {self.layout!r}")
        if self.kernel_layout not in (*L.KERNEL_LAYOUTS, "default"):
            raise ValueError(f"kernel_layout must be OIHW, HWIO or default, not {self.kernel_layout!r}")

    def apply(self, model: TopModel) -> PassResult:
        rep = convert_layout(model, self.layout, self.kernel_layout)
        result = PassResult(self.name, detail=rep)
        numbers = dict(permutes_before=rep.permutes_before, permutes_after=rep.permutes_after,
                       absorbed=rep.absorbed, inserted=rep.inserted, weights_transformed=rep.weights_transformed)
        for kind, n in sorted(rep.layouts.items()):
            result.apply(kind, f"{n} op(s) now in this layout")
        if rep.permutes_after:
            result.decline("module", f"{rep.permutes_after} Permute(s) stay: {rep.at_inputs} at inputs, "
                                     f"{rep.at_outputs} at outputs, {rep.inside} inside", **numbers)
        else:
            result.apply("module", "no Permute left", **numbers)
        for note in rep.notes:
            result.decline("module", note)
        return result


def count_permutes(model: TopModel) -> tuple[int, int, int, int]:
    """(top.Permute ops, those reading a model input, those feeding a model output, the others)."""
    outs = set(model.return_op.operands)
    total = at_in = at_out = inside = 0
    for op in model.ops:
        if isinstance(op, top.Permute):
            total += 1
            src = op.operands[0].owner
            a = isinstance(src, top.Input) or (
                isinstance(src, top.Reshape) and isinstance(src.operands[0].owner, top.Input))
            b = op.results[0] in outs
            at_in, at_out, inside = at_in + a, at_out + b, inside + (not a and not b)
    return total, at_in, at_out, inside


def _nbytes(v) -> int:
    t = v.type
    bits = getattr(t.element_type, "bitwidth", 32)
    return int(np.prod(A.shape_of(t))) * max(1, bits // 8)


def _before(a, b) -> bool:
    """Whether op `a` comes before op `b` in their block."""
    op = a.next_op
    while op is not None:
        if op is b:
            return True
        op = op.next_op
    return False


def _suffix(st: R.State) -> str:
    """Name suffix of a tensor held in another layout than its original: a name keeps meaning
    one tensor's contents, so by-name comparisons (e.g. against onnxruntime) stay valid."""
    rank = len(st.perm)
    tag = "nhwc" if st.perm == L.channels_last(rank) else "nchw" if st.perm == L.channels_first(rank) \
        else f"p{L.perm_name(st.perm)}"
    return tag + ("_rows" if st.sigma is not None else "")


class _Run(R.Context):
    """One application of the pass to one model."""

    def __init__(self, model: TopModel, desired: dict):
        self.model = model
        self.desired = desired
        self.block = model.func.body.block
        self.ret = model.return_op
        self.old_ops = list(model.ops)
        self.users = defaultdict(list)
        for op in [*self.old_ops, self.ret]:
            for i, v in enumerate(op.operands):
                self.users[v].append((op, i))
        self.outputs = set(self.ret.operands)
        self.env: dict = {}
        self.cache: dict = {}
        self.names = {n for op in self.old_ops for n in top.loc_names(op)} | set(model.weights)
        self.report = LayoutReport()
        self._consumer = ""

    # ------------------------------------------------------------ Context for the rules
    def shape(self, v):
        return None if isinstance(v.type, NoneType) else A.shape_of(v.type)

    def state(self, v):
        got = self.env.get(v)
        return None if got is None else got[1]

    def is_const(self, v):
        got = self.env.get(v)
        return isinstance((v if got is None else got[0]).owner, top.Weight)

    def const_array(self, v):
        new, st = self.env[v]
        arr = self.model.weights[new.owner.key]
        return np.transpose(arr, L.inverse(st.perm)) if not L.is_identity(st.perm) else arr

    def uses(self, v):
        return self.users[v]

    def is_output(self, v):
        return v in self.outputs

    # ------------------------------------------------------------ emitting
    def _unique(self, name: str) -> str:
        name = unique_name(name, self.names)
        self.names.add(name)
        return name

    def _emit(self, op_name: str, operands: list, attrs: dict, loc):
        op = make_op(op_name, operands, attrs, loc)
        self.block.insert_op_before(op, self.ret)
        return op

    def _weight(self, base: str, array: np.ndarray):
        array = np.ascontiguousarray(array)
        name = self._unique(base)
        self.model.weights[name] = array
        op = top.Weight.create(result_types=[A.tensor_type(array.shape, A.dtype_of_numpy(array.dtype))])
        top.set_loc(op, name)
        self.block.insert_op_before(op, self.ret)
        self.report.weights_transformed += 1
        return op.results[0]

    def _transpose(self, new, order):
        """`new` transposed by `order`: a Permute, a copy-free Reshape, or a new weight."""
        if L.is_identity(order):
            return new
        key = (new, tuple(order))
        if key in self.cache:
            return self.cache[key]
        shape = A.shape_of(new.type)
        src = new.owner
        if isinstance(src, top.Weight):
            out = self._weight(f"{src.loc}_{L.perm_name(order)}", self.model.weights[src.key].transpose(order))
        elif L.only_moves_ones(shape, order):
            out = self._emit("Reshape", [new], {"shape": list(L.apply_perm(shape, order))},
                             self._unique(f"{value_name(new)}_r{L.perm_name(order)}")).results[0]
        else:
            out = self._emit("Permute", [new], {"order": list(order)},
                             self._unique(f"{value_name(new)}_p{L.perm_name(order)}")).results[0]
            self.report.inserted += 1
            self.report.notes.append(f"{self._consumer}: {value_name(new)!r} transposed by {list(order)}")
        self.cache[key] = out
        return out

    def _deliver(self, v, spec):
        if spec is None:
            return self.env[v][0]
        new, st = self.env[v]
        if isinstance(spec, R.Want):
            if st.sigma is not None:
                raise ShapeError(f"convert-layout: value {value_name(v)!r} has a scrambled axis")
            return self._transpose(new, L.relative(st.perm, spec.perm))
        if isinstance(spec, R.Const):
            if not isinstance(new.owner, top.Weight):
                raise ShapeError(f"convert-layout: {value_name(v)!r} must be a constant")
            key = (new, spec.key, st.perm)
            if key not in self.cache:
                self.cache[key] = self._weight(f"{new.owner.loc}_{spec.key}", spec.fn(self.const_array(v)))
            return self.cache[key]
        if isinstance(spec, R.Expand):
            flat = self._deliver(v, R.Want(L.identity(len(st.perm))))
            key = (flat, "expand", spec.rank, spec.perm)
            if key not in self.cache:
                full = (1,) * (spec.rank - len(st.perm)) + A.shape_of(flat.type)
                padded = self._emit("Reshape", [flat], {"shape": list(full)},
                                    self._unique(f"{value_name(flat)}_r{spec.rank}d")).results[0]
                self.cache[key] = self._transpose(padded, spec.perm)
            return self.cache[key]
        raise TypeError(spec)

    # ------------------------------------------------------------ the walk
    def _visit(self, op):
        if isinstance(op, (top.Input, top.Weight, top.NoneOp)):
            for r in op.results:
                s = self.shape(r)
                self.env[r] = (r, None if s is None else R.State(L.identity(len(s))))
            return
        attrs = op.attrs()
        if isinstance(op, top.Permute):
            new, st = self.env[op.operands[0]]
            if st.sigma is None:
                inv = L.inverse(attrs["order"])
                self.env[op.results[0]] = (new, R.State(tuple(inv[a] for a in st.perm)))
                self.report.absorbed += 1
                return
        fn = R.RULES.get(op.name, R.keep_all)
        plan = fn(op, attrs, self)
        self._consumer = f"{op.name} at {op.loc!r} needs another layout"
        operands = [self._deliver(v, s) for v, s in zip(op.operands, plan.operands)]
        names = top.loc_names(op) or [op.loc]
        names = [n if st.plain else self._unique(f"{n}_{_suffix(st)}") for n, st in zip(names, plan.outs)] \
            + names[len(plan.outs):]
        new_op = self._emit(plan.op_name or op.op_name, operands, plan.attrs, names)
        if "layout" in plan.attrs and op.name in R.HEAVY:
            self.report.layouts[f"{op.op_name}:{plan.attrs['layout']}"] += 1
        if plan.note:
            self.report.notes.append(f"{op.loc}: {plan.note}")
        for old, new, st in zip(op.results, new_op.results, plan.outs):
            want = L.apply_perm(self.shape(old), st.perm)
            if A.shape_of(new.type) != want:
                raise ShapeError(f"convert-layout: {op.name} at {op.loc!r} gives {A.shape_of(new.type)}, "
                                 f"expected {want} for layout {st.perm}")
            self.env[old] = (new, st)

    def run(self) -> LayoutReport:
        self.report.permutes_before = count_permutes(self.model)[0]
        for op in self.old_ops:
            self._visit(op)
        self._consumer = "model output keeps its layout"
        outs = [self._deliver(v, R.Want(L.identity(len(self.shape(v))))) for v in self.ret.operands]
        taken: set = set()
        self.ret.operands = [self._keep_output_name(old, new, taken)
                             for old, new in zip(list(self.ret.operands), outs)]
        for op in reversed(self.old_ops):
            if not isinstance(op, (top.Input, top.Weight, top.NoneOp)):
                self.block.erase_op(op)
        self._hoist_permutes()
        self._dead_code()
        self.model.verify()
        r = self.report
        r.permutes_after, r.at_inputs, r.at_outputs, r.inside = count_permutes(self.model)
        r.permute_bytes = sum(_nbytes(op.results[0]) for op in self.model.ops if isinstance(op, top.Permute))
        return r

    def _keep_output_name(self, old, new, taken: set):
        """Outputs keep their names: the op now computing an output is renamed after it (an op
        that computes it in another layout first becomes NAME_<order>); an input or weight
        returned as is, or a value returned twice, gets a copy-free Reshape with the name."""
        name, got = value_name(old), value_name(new)
        if name == got and new not in taken:
            taken.add(new)
            return new
        owner = new.owner
        if isinstance(owner, (top.Input, top.Weight)) or new in taken:
            new = self._emit("Reshape", [new], {"shape": list(A.shape_of(new.type))}, name).results[0]
            taken.add(new)
            return new
        inner = self.env[old][0]
        if inner is not new and len(inner.owner.results) == 1 and inner.owner.loc == name:
            top.set_loc(inner.owner, self._unique(f"{name}_{L.perm_name(self.env[old][1].perm)}"))
        names = top.loc_names(owner) or [owner.loc]
        names = names + [f"{names[0]}_{i}" for i in range(len(names), len(owner.results))]
        names[new.index] = name
        top.set_loc(owner, names)
        taken.add(new)
        return new

    def _hoist_permutes(self):
        """Move each Permute above the single-use elementwise ops that feed it (a normalizing
        prologue, say), so a transpose the data needs sits at the model input."""
        moved = True
        while moved:
            moved = False
            for p in [op for op in self.model.ops if isinstance(op, top.Permute)]:
                x = p.operands[0].owner
                if isinstance(x, top.TopOp) and x.name in R.AGNOSTIC and len(x.results) == 1 \
                        and x.results[0].uses.get_length() == 1 and self._hoist(p, x):
                    moved = True

    def _hoist(self, p, x) -> bool:
        order = tuple(p.attrs()["order"])
        rank = len(order)
        runtime = [v for v in x.operands if not isinstance(v.owner, top.Weight)
                   and any(d != 1 for d in A.shape_of(v.type))]
        if len(runtime) != 1 or len(A.shape_of(runtime[0].type)) != rank:
            return False
        operands = []
        for v in x.operands:
            shape = A.shape_of(v.type)
            if v is runtime[0]:
                same = [u.operation for u in v.uses if isinstance(u.operation, top.Permute)
                        and tuple(u.operation.attrs()["order"]) == order and u.operation is not p]
                if same and same[0].parent is not None and _before(same[0], x):
                    operands.append(same[0].results[0])
                else:
                    q = make_op("Permute", [v], {"order": list(order)},
                                self._unique(f"{value_name(v)}_p{L.perm_name(order)}"))
                    self.block.insert_op_before(q, x)
                    operands.append(q.results[0])
            elif all(d == 1 for d in shape):
                operands.append(v)
            else:
                arr = np.reshape(self.model.weights[v.owner.key], (1,) * (rank - len(shape)) + tuple(shape))
                w = self._weight(f"{v.owner.loc}_{L.perm_name(order)}", arr.transpose(order))
                w.owner.detach()
                self.block.insert_op_before(w.owner, x)
                operands.append(w)
        y = make_op(x.op_name, operands, x.attrs(), p.loc)
        self.block.insert_op_before(y, p)
        p.results[0].replace_all_uses_with(y.results[0])
        self.block.erase_op(p)
        self.block.erase_op(x)
        return True

    def _dead_code(self):
        dropped, live = set(), set()
        for op in reversed(list(self.model.ops)):
            if isinstance(op, top.Input):
                continue
            if all(not r.uses for r in op.results):
                if isinstance(op, top.Weight):
                    dropped.add(op.loc)
                self.block.erase_op(op)
            elif isinstance(op, top.Weight):
                live.add(op.loc)
        for name in dropped - live:
            self.model.weights.pop(name, None)
