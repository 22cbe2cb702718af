"""Canonicalization of TOP modules: xDSL rewrite patterns run to a fixed point.

Folds BatchNorm into the preceding Conv/Deconv (else into Scale) and Scale into Conv, turns
Clip(0, m) into Relu, fuses Relu into its producer (`do_relu`, `relu_limit`), fuses
x * sigmoid(x) into SiLU, hard sigmoid / hard swish as exporters decompose them into
HardSigmoid / HardSwish, 0.5 * x * (1 + erf(x / sqrt 2)) into GELU and Keras' decomposed
layer normalization into LayerNorm, turns Dense layers on feature maps into 1x1 Convs, folds
ops on constants, drops no-op Reshape/Permute/Cast/..., merges consecutive Permutes and
Reshapes, and removes dead code. A fused op takes the
location of the op it absorbs (the tensor it now computes), as TPU-MLIR does.

>>> report = canonicalize(model)  # doctest: +SKIP
>>> report.counts                  # doctest: +SKIP
{'fold-batchnorm-into-conv': 53, 'fuse-relu': 49, ...}
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import NoneType
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import InsertPoint

from tftpu.ir import attrs as A
from tftpu.ir import top
from tftpu.ir.base import Commutative, value_name
from tftpu.ir.module import TopModel, make_op
from tftpu.transforms.pipeline import ModulePass, register
from tftpu.utils.decisions import PassResult
from tftpu.utils.names import unique_name

F32_MAX = float(np.finfo(np.float32).max)


@dataclass
class Report:
    """How many times each pattern fired."""

    counts: Counter = field(default_factory=Counter)

    def __str__(self) -> str:
        return ", ".join(f"{k}: {v}" for k, v in sorted(self.counts.items())) or "no rewrites"


class Weights:
    """Access to the module's weight arrays from inside patterns."""

    def __init__(self, model: TopModel):
        self.model = model

    def get(self, value):
        """The constant array behind `value`, or None if it is not a `top.Weight`."""
        owner = value.owner
        if isinstance(owner, top.Weight):
            return self.model.weights[owner.key]
        return None

    def add(self, rewriter: PatternRewriter, before, name: str, array: np.ndarray):
        """Insert a new `top.Weight` (unique name derived from `name`) before `before`."""
        name = unique_name(name, self.model.weights)
        array = np.asarray(array, order="C")
        self.model.weights[name] = array
        op = top.Weight.create(result_types=[A.tensor_type(array.shape, A.dtype_of_numpy(array.dtype))])
        top.set_loc(op, name)
        rewriter.insert(op, InsertPoint.before(before))
        return op.results[0]


class TopPattern(RewritePattern):
    """A named TOP rewrite with access to weights and a shared report."""

    NAME = ""

    def __init__(self, weights: Weights, report: Report):
        self.w = weights
        self.report = report

    def fired(self) -> None:
        self.report.counts[self.NAME] += 1


def _single_use(value) -> bool:
    return len(list(value.uses)) == 1


def commuted(op) -> tuple:
    """The operand pairs of a binary op to try in a match: both orders when the op is
    commutative (its `Commutative` trait), as they stand otherwise."""
    a, b = op.operands[0], op.operands[1]
    return ((a, b), (b, a)) if op.has_trait(Commutative) else ((a, b),)


def _mul_operands(v):
    """The two operands of a plain Mul producing `v` (both orders), else ()."""
    op = v.owner
    return commuted(op) if isinstance(op, top.Mul) and not op.do_relu else ()


def _used_by_return(value) -> bool:
    return any(isinstance(u.operation, func.ReturnOp) for u in value.uses)


def _replace(rewriter: PatternRewriter, old_op, new_op, loc: str | None = None) -> None:
    top.set_loc(new_op, loc if loc is not None else old_op.loc)
    rewriter.replace(old_op, new_op)


def _bypass(rewriter: PatternRewriter, op, value) -> bool:
    """Replace `op`'s single result by `value`; keep output names by renaming the producer."""
    result = op.results[0]
    if _used_by_return(result):
        owner = value.owner
        if not isinstance(owner, top.TopOp) or isinstance(owner, (top.Input, top.Weight)) \
                or len(owner.results) != 1 or not _single_use(value):
            return False
        top.set_loc(owner, op.loc)
    rewriter.replace(op, [], [value])
    return True


def _bn_params(w: Weights, op):
    mean, var, scale, bias = (w.get(v) for v in op.operands[1:])
    if any(a is None for a in (mean, var, scale, bias)):
        return None
    eps = op.attrs()["epsilon"]
    s = scale.astype(np.float64).ravel() / np.sqrt(var.astype(np.float64).ravel() + eps)
    b = bias.astype(np.float64).ravel() - mean.astype(np.float64).ravel() * s
    return s, b


def _fold_affine_into_conv(pattern: TopPattern, rewriter, op, s, b, conv_value=None, relu=None) -> bool:
    """Fold y = conv(x) * s + b (per output channel) into the conv's filter and bias."""
    conv = (conv_value or op.operands[0]).owner
    if not isinstance(conv, (top.Conv, top.Deconv)) or not _single_use(conv.output):
        return False
    attrs = conv.attrs()
    if attrs["do_relu"] or attrs.get("kernel_layout", "OIHW") != "OIHW" or \
            attrs["layout"] != op.attrs().get("layout", attrs["layout"]):
        return False
    wt = pattern.w.get(conv.filter)
    has_bias = not isinstance(conv.bias.type, NoneType)
    cb = pattern.w.get(conv.bias) if has_bias else np.zeros(len(s), np.float32)
    if wt is None or cb is None:
        return False
    w64 = wt.astype(np.float64)
    if isinstance(conv, top.Conv):
        w64 = w64 * s.reshape((-1,) + (1,) * (wt.ndim - 1))
    else:
        g = attrs["group"]
        i_total, o_per = wt.shape[0], wt.shape[1]
        group_of_i = np.arange(i_total) // (i_total // g)
        idx = group_of_i[:, None] * o_per + np.arange(o_per)[None, :]
        w64 = w64 * s[idx].reshape(i_total, o_per, *([1] * (wt.ndim - 2)))
    new_b = cb.astype(np.float64).ravel() * s + b
    loc = op.loc
    nw = pattern.w.add(rewriter, conv, f"{loc}_filter", w64.astype(np.float32))
    nb = pattern.w.add(rewriter, conv, f"{loc}_bias", new_b.astype(np.float32))
    if relu is not None:
        attrs["do_relu"], attrs["relu_limit"] = relu
    new = make_op(conv.op_name, [conv.input, nw, nb], attrs, loc)
    rewriter.insert(new, InsertPoint.before(conv))
    rewriter.replace(op, [], [new.output])
    rewriter.erase(conv)
    return True


class FoldBatchNorm(TopPattern):
    """BatchNorm after a single-use Conv/Deconv -> new filter and bias; otherwise -> Scale."""

    NAME = "fold-batchnorm"

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: top.BatchNorm, rewriter: PatternRewriter) -> None:
        params = _bn_params(self.w, op)
        if params is None:
            return
        s, b = params
        if _fold_affine_into_conv(self, rewriter, op, s, b):
            self.report.counts["fold-batchnorm-into-conv"] += 1
            return
        shape = A.shape_of(op.operands[1].type)
        ns = self.w.add(rewriter, op, f"{op.loc}_scale", s.astype(np.float32).reshape(shape))
        nb = self.w.add(rewriter, op, f"{op.loc}_bias", b.astype(np.float32).reshape(shape))
        _replace(rewriter, op, make_op("Scale", [op.input, ns, nb], {"layout": op.attrs()["layout"]}, op.loc))
        self.report.counts["batchnorm-to-scale"] += 1


class FoldScaleIntoConv(TopPattern):
    """Scale (no ReLU) after a single-use Conv/Deconv -> new filter and bias."""

    NAME = "fold-scale-into-conv"

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: top.Scale, rewriter: PatternRewriter) -> None:
        if op.do_relu:
            return
        s, b = self.w.get(op.scale), self.w.get(op.bias)
        if s is None or b is None:
            return
        if _fold_affine_into_conv(self, rewriter, op, s.astype(np.float64).ravel(), b.astype(np.float64).ravel()):
            self.fired()


def _per_channel(arr: np.ndarray, out_shape, layout: str):
    """The C values of a constant that broadcasts only along the channel axis, else None."""
    rank = len(out_shape)
    if arr.ndim > rank:
        return None
    full = (1,) * (rank - arr.ndim) + tuple(arr.shape)
    axis = rank - 1 if layout == "NHWC" else 1
    c = out_shape[axis]
    if any(d != 1 for i, d in enumerate(full) if i != axis) or full[axis] not in (1, c):
        return None
    return np.broadcast_to(arr.reshape(-1) if arr.size > 1 else arr.reshape(1), (c,)).astype(np.float64)


class FoldMulAddIntoConv(TopPattern):
    """conv * c or conv + c (c constant per output channel, conv single-use) -> new filter and bias."""

    NAME = "fold-mul-add-into-conv"

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: top.Mul | top.Add, rewriter: PatternRewriter) -> None:
        for conv_v, const_v in commuted(op):
            if not isinstance(conv_v.owner, top.Conv):
                continue
            arr = self.w.get(const_v)
            out = A.shape_of(op.output.type)
            if arr is None or A.shape_of(conv_v.type) != out:
                continue
            c = _per_channel(arr, out, conv_v.owner.attrs()["layout"])
            if c is None:
                continue
            s, b = (c, np.zeros_like(c)) if isinstance(op, top.Mul) else (np.ones_like(c), c)
            a = op.attrs()
            if _fold_affine_into_conv(self, rewriter, op, s, b, conv_v, (a["do_relu"], a["relu_limit"])):
                self.fired()
                return


class FoldPadIntoConv(TopPattern):
    """Zero Pad of the spatial axes, single-use, feeding a Conv (directly or through one
    single-use Permute, as a TFLite model's explicit pad before its NHWC -> NCHW transpose)
    -> the Conv's own pads, the Permute then reading the unpadded tensor."""

    NAME = "fold-pad-into-conv"

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: top.Conv, rewriter: PatternRewriter) -> None:
        perm, pad = None, op.input.owner
        if isinstance(pad, top.Permute) and _single_use(pad.output):
            perm, pad = pad, pad.input.owner
        if not isinstance(pad, top.Pad):
            return
        pa, ca = pad.attrs(), op.attrs()
        if pa["mode"] != "constant" or pa["val"] != 0.0 or not _single_use(pad.output):
            return
        rank = len(A.shape_of(pad.output.type))
        begins, ends = pa["paddings"][:rank], pa["paddings"][rank:]
        if perm is not None:                 # the pads as the conv's input axes see them
            order = perm.attrs()["order"]
            begins, ends = [begins[a] for a in order], [ends[a] for a in order]
        spatial = list(range(1, rank - 1)) if ca["layout"] == "NHWC" else list(range(2, rank))
        if any(begins[i] or ends[i] for i in range(rank) if i not in spatial):
            return
        n = len(spatial)
        pads = [ca["pads"][k] + begins[ax] for k, ax in enumerate(spatial)] + \
               [ca["pads"][n + k] + ends[ax] for k, ax in enumerate(spatial)]
        x = pad.input
        if perm is not None:                 # a new name: the tensor named perm.loc was padded
            taken = {o.loc for o in self.w.model.ops}
            moved = make_op("Permute", [x], perm.attrs(), unique_name(f"{perm.loc}_unpadded", taken))
            rewriter.insert(moved, InsertPoint.before(op))
            x = moved.results[0]
        _replace(rewriter, op, make_op("Conv", [x, op.filter, op.bias], dict(ca, pads=pads), op.loc))
        self.fired()


class ClipToRelu(TopPattern):
    """Clip(0, m) -> Relu(relu_limit=m) (Relu6 included), so it can fuse."""

    NAME = "clip-to-relu"

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: top.Clip, rewriter: PatternRewriter) -> None:
        a = op.attrs()
        if a["min"] != 0.0 or a["max"] <= 0.0:
            return
        limit = -1.0 if a["max"] >= F32_MAX else a["max"]
        _replace(rewriter, op, make_op("Relu", [op.input], {"relu_limit": limit}, op.loc))
        self.fired()


_RELU_HOSTS = (top.Conv, top.Deconv, top.MatMul, top.Add, top.Sub, top.Mul, top.Scale, top.MaxPool,
               top.AvgPool)


class FuseRelu(TopPattern):
    """Relu after a single-use Conv/Deconv/MatMul/Add/Sub/Mul/Scale/pool -> its do_relu."""

    NAME = "fuse-relu"

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: top.Relu, rewriter: PatternRewriter) -> None:
        prod = op.input.owner
        limit = op.attrs()["relu_limit"]
        if isinstance(prod, top.Concat):
            if limit >= 0:
                return
        elif not isinstance(prod, _RELU_HOSTS):
            return
        if not _single_use(prod.results[0]) or prod.attrs()["do_relu"]:
            return
        attrs = dict(prod.attrs())
        attrs["do_relu"] = True
        if "relu_limit" in attrs:
            attrs["relu_limit"] = limit
        new = make_op(prod.op_name, list(prod.operands), attrs, op.loc)
        rewriter.insert(new, InsertPoint.before(prod))
        rewriter.replace(op, [], [new.results[0]])
        rewriter.erase(prod)
        self.fired()


class FuseSiLU(TopPattern):
    """x * sigmoid(x) (either operand order) -> SiLU(x)."""

    NAME = "fuse-silu"

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: top.Mul, rewriter: PatternRewriter) -> None:
        for a, b in _mul_operands(op.results[0]):
            sig = b.owner
            if isinstance(sig, top.Sigmoid) and sig.input is a and A.shape_of(a.type) == A.shape_of(op.output.type):
                _replace(rewriter, op, make_op("SiLU", [a], {}, op.loc))
                self.fired()
                return


class FusePRelu(TopPattern):
    """relu(x) + relu(-x) * c (Keras PReLU as tf2onnx writes it) -> PRelu(x, slope=-c)."""

    NAME = "fuse-prelu"

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: top.Add, rewriter: PatternRewriter) -> None:
        if op.do_relu:
            return
        for pos, neg in commuted(op):
            relu = pos.owner
            mul = neg.owner
            if not (isinstance(relu, top.Relu) and relu.attrs()["relu_limit"] < 0 and isinstance(mul, top.Mul)):
                continue
            if mul.attrs()["do_relu"]:
                continue
            for r, c in ((mul.input, mul.other), (mul.other, mul.input)):
                c_arr = self.w.get(c)
                relu2 = r.owner
                if c_arr is None or not isinstance(relu2, top.Relu) or relu2.attrs()["relu_limit"] >= 0:
                    continue
                neg_op = relu2.input.owner
                if not isinstance(neg_op, top.Neg) or neg_op.input is not relu.input:
                    continue
                x = relu.input
                if A.shape_of(op.output.type) != A.shape_of(x.type):
                    continue
                slope = self.w.add(rewriter, op, f"{op.loc}_slope", (-c_arr).astype(np.float32))
                _replace(rewriter, op, make_op("PRelu", [x, slope], {}, op.loc))
                self.fired()
                return


def _scalar(w: Weights, value):
    """The float value of a one-element constant, else None."""
    arr = w.get(value)
    if arr is None or arr.size != 1 or arr.dtype.kind != "f":
        return None
    return float(arr.reshape(()))


def _plain(op) -> bool:
    """A Mul/Add/Div with no fused ReLU."""
    return not op.attrs().get("do_relu", False)


def _product(w: Weights, op):
    """(factors, k): `op`, a plain Mul or a Div by a scalar constant, as k times the product of
    the values `factors`, looking through single-use plain Mul and Div-by-constant operands
    (so every grouping and order exporters write); None where it is no such product."""
    factors, k = [], [1.0]

    def expand(o) -> bool:
        if isinstance(o, top.Mul) and _plain(o):
            return visit(o.input) and visit(o.other)
        if isinstance(o, top.Div):
            d = _scalar(w, o.other)
            if not d:
                return False
            k[0] /= d
            return visit(o.input)
        return False

    def visit(v) -> bool:
        c = _scalar(w, v)
        if c is not None:
            k[0] *= c
            return True
        if isinstance(v.owner, (top.Mul, top.Div)) and _single_use(v) and len(factors) < 3 and expand(v.owner):
            return True
        factors.append(v)
        return len(factors) <= 3

    return (factors, k[0]) if expand(op) else None


def _clipped(v, limit: float):
    """The plain Add under min(max(., 0), limit) computing `v` (a ReLU fused into the Add, or a
    Relu / Clip(0, limit) of a single-use plain Add), else None."""
    op = v.owner
    if isinstance(op, top.Add):
        a = op.attrs()
        return op if a["do_relu"] and _near(a["relu_limit"], limit) else None
    if isinstance(op, top.Relu) and _near(op.attrs()["relu_limit"], limit) or \
            isinstance(op, top.Clip) and op.attrs()["min"] == 0.0 and _near(op.attrs()["max"], limit):
        add = op.input.owner
        if isinstance(add, top.Add) and _plain(add) and _single_use(op.input):
            return add
    return None


def _relu6_of_x_plus_3(w: Weights, v):
    """x when `v` computes min(max(x + 3, 0), 6) (x not broadcast), else None."""
    add = _clipped(v, 6.0)
    if add is None:
        return None
    x, three = _const_operand(w, add)
    if x is None or not _near(three, 3.0) or A.shape_of(x.type) != A.shape_of(add.output.type):
        return None
    return x


def _clip01_affine(w: Weights, v):
    """(x, alpha, beta) when `v` computes min(max(alpha * x + beta, 0), 1) with scalar constants,
    alpha * x a single-use plain Mul (or x / d a Div), else None."""
    add = _clipped(v, 1.0)
    if add is None:
        return None
    t, beta = _const_operand(w, add)
    if t is None or not _single_use(t):
        return None
    x, alpha, scaled = None, None, t.owner
    if isinstance(scaled, top.Mul) and _plain(scaled):
        x, alpha = _const_operand(w, scaled)
    elif isinstance(scaled, top.Div) and _scalar(w, scaled.other):
        x, alpha = scaled.input, 1.0 / _scalar(w, scaled.other)
    if x is None or A.shape_of(x.type) != A.shape_of(add.output.type):
        return None
    return x, alpha, beta


def _is_hard_sigmoid_of(v, x) -> bool:
    """Whether `v` is HardSigmoid(x, 1/6, 1/2) (HardSwish's factor)."""
    hs = v.owner
    return isinstance(hs, top.HardSigmoid) and hs.input is x and _near(hs.attrs()["alpha"], 1.0 / 6.0) and \
        _near(hs.attrs()["beta"], 0.5)


class FuseHardSigmoid(TopPattern):
    """relu6(x + 3) / 6 (or * (1/6), any grouping: Keras via tf2onnx, PyTorch) ->
    HardSigmoid(x, 1/6, 0.5); clip(alpha * x + beta, 0, 1) (Paddle's decomposed hardsigmoid,
    Clip(0, 1) turned into a ReLU fused into the Add) -> HardSigmoid(x, alpha, beta)."""

    NAME = "fuse-hardsigmoid"

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: top.Mul | top.Div | top.Add | top.Relu | top.Clip,
                          rewriter: PatternRewriter) -> None:
        found = None
        if isinstance(op, (top.Mul, top.Div)):
            product = _product(self.w, op)
            if product is not None and len(product[0]) == 1 and _near(product[1], 1.0 / 6.0):
                x = _relu6_of_x_plus_3(self.w, product[0][0])
                found = None if x is None else (x, 1.0 / 6.0, 0.5)
        if found is None and not isinstance(op, (top.Mul, top.Div)):
            found = _clip01_affine(self.w, op.results[0])
        if found is None or A.shape_of(found[0].type) != A.shape_of(op.results[0].type):
            return
        x, alpha, beta = found
        _replace(rewriter, op, make_op("HardSigmoid", [x], {"alpha": float(alpha), "beta": float(beta)}, op.loc))
        self.fired()


class FuseHardSwish(TopPattern):
    """x * HardSigmoid(x, 1/6, 0.5), x * relu6(x + 3) / 6, x * relu6(x + 3) * (1/6), in any
    order and grouping (PyTorch, Paddle, Keras exports) -> HardSwish(x)."""

    NAME = "fuse-hardswish"

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: top.Mul | top.Div, rewriter: PatternRewriter) -> None:
        product = _product(self.w, op)
        if product is None or len(product[0]) != 2:
            return
        (a, b), k = product
        for x, g in ((a, b), (b, a)):
            if A.shape_of(x.type) != A.shape_of(op.output.type):
                continue
            if _near(k, 1.0) and _is_hard_sigmoid_of(g, x) or \
                    _near(k, 1.0 / 6.0) and _relu6_of_x_plus_3(self.w, g) is x:
                _replace(rewriter, op, make_op("HardSwish", [x], {}, op.loc))
                self.fired()
                return


_SQRT1_2 = 0.7071067811865476


def _near(value, want: float) -> bool:
    return value is not None and abs(value - want) <= 1e-6 * abs(want)


def _const_operand(w: Weights, op):
    """(other operand, scalar) of a binary op with one scalar constant operand, else (None, None)."""
    for v, c in ((op.input, op.other), (op.other, op.input)):
        k = _scalar(w, c)
        if k is not None:
            return v, k
    return None, None


def _erf_argument(w: Weights, v):
    """(x, sign) when `v` is x / sqrt(2) (sign 1) or -x / sqrt(2) (sign -1), else (None, 0)."""
    op = v.owner
    sign = 1
    if isinstance(op, top.Neg):
        op, sign = op.input.owner, -1
    if isinstance(op, top.Mul) and not op.attrs()["do_relu"]:
        x, k = _const_operand(w, op)
        if x is not None and (_near(k, _SQRT1_2) or _near(-k, _SQRT1_2)):
            sign *= 1 if k > 0 else -1
        else:
            return None, 0
    elif isinstance(op, top.Div) and _near(_scalar(w, op.other), 2 ** 0.5):
        x = op.input
    else:
        return None, 0
    if isinstance(x.owner, top.Neg):
        return x.owner.input, -sign
    return x, sign


def _gelu_factor(w: Weights, v):
    """x when `v` computes 1 + erf(x / sqrt(2)) (or 1 - erf(-x / sqrt(2)), TF's erfc form), else None."""
    op = v.owner
    if not isinstance(op, (top.Add, top.Sub)) or op.attrs().get("do_relu"):
        return None
    if isinstance(op, top.Sub):
        if _scalar(w, op.input) != 1.0 or not isinstance(op.other.owner, top.Erf):
            return None
        x, sign = _erf_argument(w, op.other.owner.input)
        return x if sign == -1 else None
    erf, one = _const_operand(w, op)
    if one != 1.0 or erf is None or not isinstance(erf.owner, top.Erf):
        return None
    x, sign = _erf_argument(w, erf.owner.input)
    return x if sign == 1 else None


class FuseGELU(TopPattern):
    """0.5 * x * (1 + erf(x / sqrt(2))), in the orders tf2onnx and PyTorch write it -> GELU(x).

    TF's exact GELU arrives as `(0.5 * x) * (1 - erf(-x * (1/sqrt(2))))` (its Erfc, expanded).
    """

    NAME = "fuse-gelu"

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: top.Mul, rewriter: PatternRewriter) -> None:
        if op.do_relu:
            return
        x = self._match(op)
        if x is not None and A.shape_of(x.type) == A.shape_of(op.output.type):
            _replace(rewriter, op, make_op("GELU", [x], {"approximate": "none"}, op.loc))
            self.fired()

    def _match(self, op):
        for p, q in ((op.input, op.other), (op.other, op.input)):
            x = _gelu_factor(self.w, q)
            if x is not None:  # (0.5 * x) * factor(x)   or   x * factor(x) ... * 0.5 below
                if isinstance(p.owner, top.Mul) and _const_operand(self.w, p.owner) == (x, 0.5):
                    return x
            inner = q.owner
            if isinstance(inner, top.Mul) and not inner.attrs()["do_relu"]:
                f, half = _const_operand(self.w, inner)  # x * (0.5 * factor(x))
                if half == 0.5 and f is not None and _gelu_factor(self.w, f) is p:
                    return p
                for a, b in ((inner.input, inner.other), (inner.other, inner.input)):
                    if _gelu_factor(self.w, b) is a and _scalar(self.w, p) == 0.5:  # (x * factor(x)) * 0.5
                        return a
        return None


def _inv_std(w: Weights, v):
    """(variance value, eps) when `v` computes 1 / sqrt(variance + eps), else None."""
    op = v.owner
    if not isinstance(op, top.Div) or _scalar(w, op.input) != 1.0 or not isinstance(op.other.owner, top.Sqrt):
        return None
    add = op.other.owner.input.owner
    if not isinstance(add, top.Add) or add.attrs()["do_relu"]:
        return None
    var, eps = _const_operand(w, add)
    return None if var is None else (var, eps)


def _times_inv_std(w: Weights, v):
    """(inverse-std value, gamma array or None) when `v` is inv_std or inv_std * gamma."""
    op = v.owner
    if isinstance(op, top.Mul) and not op.attrs()["do_relu"]:
        for a, b in ((op.input, op.other), (op.other, op.input)):
            g = w.get(b)
            if g is not None and _inv_std(w, a) is not None:
                return a, g
    return (v, None) if _inv_std(w, v) is not None else (None, None)


class FuseLayerNorm(TopPattern):
    """x * m + (-mean * m [+ beta]) with m = gamma / sqrt(var + eps), the moments over the same
    axes (Keras' LayerNormalization as tf2onnx writes it) -> LayerNorm(x, gamma, beta)."""

    NAME = "fuse-layernorm"

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: top.Add, rewriter: PatternRewriter) -> None:
        if op.do_relu:
            return
        for p, q in commuted(op):
            for x, m in _mul_operands(p):
                found = self._match(x, m, q)
                if found is not None:
                    self._rewrite(rewriter, op, x, *found)
                    return

    def _match(self, x, m, q):
        inv, gamma = _times_inv_std(self.w, m)
        if inv is None:
            return None
        beta, shift = None, q  # q = -mean * m, or that + beta, or beta - mean * m
        q_op = q.owner
        if isinstance(q_op, top.Add) and not q_op.attrs()["do_relu"]:
            for a, b in ((q_op.input, q_op.other), (q_op.other, q_op.input)):
                if self.w.get(b) is not None:
                    shift, beta = a, self.w.get(b)
        negated = True
        if isinstance(q_op, top.Sub) and self.w.get(q_op.input) is not None:
            shift, beta, negated = q_op.other, self.w.get(q_op.input), False
        mean = None
        for a, b in _mul_operands(shift):
            if b is m:
                if negated and isinstance(a.owner, top.Neg):
                    mean = a.owner.input
                elif not negated:
                    mean = a
        mean_op = None if mean is None else mean.owner
        if not (isinstance(mean_op, top.ReduceMean) and mean_op.input is x and mean_op.attrs()["keepdims"]):
            return None
        var, eps = _inv_std(self.w, inv)
        var_op = var.owner
        if not (isinstance(var_op, top.ReduceMean) and var_op.attrs()["keepdims"]):
            return None
        rank = len(A.shape_of(x.type))
        axes = sorted({a % rank for a in mean_op.attrs()["axes"]})
        if sorted({a % rank for a in var_op.attrs()["axes"]}) != axes:
            return None
        sq = var_op.input.owner
        d = sq.input if isinstance(sq, top.Mul) and sq.input is sq.other else None
        if d is None or not isinstance(d.owner, top.Sub) or (d.owner.input, d.owner.other) != (x, mean):
            return None
        return axes, eps, gamma, beta

    def _rewrite(self, rewriter, op, x, axes, eps, gamma, beta):
        shape = A.shape_of(x.type)
        if A.shape_of(op.output.type) != shape or eps < 0:
            return
        arrays = []
        for arr in (gamma, beta):
            if arr is not None:
                arr = _broadcast_param(arr, shape)
                if arr is None:
                    return
            arrays.append(arr)
        operands = [x]
        for name, arr in zip(("scale", "bias"), arrays):
            if arr is None:
                none = top.NoneOp.create(result_types=[NoneType()])
                rewriter.insert(none, InsertPoint.before(op))
                operands.append(none.results[0])
            else:
                operands.append(self.w.add(rewriter, op, f"{op.loc}_{name}", arr))
        _replace(rewriter, op, make_op("LayerNorm", operands, {"axes": axes, "eps": float(eps)}, op.loc))
        self.fired()


def _broadcast_param(arr: np.ndarray, shape) -> np.ndarray | None:
    """`arr` at `shape`'s rank when it broadcasts against `shape` without growing it, else None."""
    full = (1,) * (len(shape) - arr.ndim) + arr.shape
    if len(full) != len(shape) or any(d not in (1, e) for d, e in zip(full, shape)):
        return None
    return arr.astype(np.float32).reshape(full)


class FuseDivLayerNorm(TopPattern):
    """(x - mean) / sqrt(mean((x - mean)^2) + eps), the moments over the same axes (PaddlePaddle's and
    PyTorch's LayerNorm as their ONNX exporters write it) -> LayerNorm(x). In INT8 the pieces
    would each round (the square overflows an 8-bit grid and a variance rounded to zero divides by
    zero); one LayerNorm runs in float."""

    NAME = "fuse-div-layernorm"

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: top.Div, rewriter: PatternRewriter) -> None:
        d, sqrt = op.input, op.other.owner
        if not isinstance(sqrt, top.Sqrt) or not isinstance(sqrt.input.owner, top.Add) \
                or sqrt.input.owner.attrs()["do_relu"]:
            return
        var, eps = _const_operand(self.w, sqrt.input.owner)
        sub = d.owner
        if var is None or eps is None or eps < 0 or not isinstance(sub, top.Sub) or sub.attrs()["do_relu"]:
            return
        x, mean = sub.input, sub.other
        var_op, mean_op = var.owner, mean.owner
        sq = var_op.input.owner if isinstance(var_op, top.ReduceMean) else None
        if not (isinstance(mean_op, top.ReduceMean) and mean_op.input is x and isinstance(sq, top.Mul)
                and sq.input is d and sq.other is d and not sq.attrs()["do_relu"]):
            return
        rank = len(A.shape_of(x.type))
        axes = sorted({a % rank for a in mean_op.attrs()["axes"]})
        if not (mean_op.attrs()["keepdims"] and var_op.attrs()["keepdims"] and axes
                and sorted({a % rank for a in var_op.attrs()["axes"]}) == axes
                and A.shape_of(op.output.type) == A.shape_of(x.type)):
            return
        nones = []
        for _ in range(2):
            none = top.NoneOp.create(result_types=[NoneType()])
            rewriter.insert(none, InsertPoint.before(op))
            nones.append(none.results[0])
        _replace(rewriter, op, make_op("LayerNorm", [x, *nones], {"axes": axes, "eps": float(eps)}, op.loc))
        self.fired()


class FoldAffineIntoLayerNorm(TopPattern):
    """LayerNorm(x) * gamma, then + beta (constants, the LayerNorm single-use and without that
    parameter yet) -> the LayerNorm's own scale and bias."""

    NAME = "fold-affine-into-layernorm"

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: top.Mul | top.Add, rewriter: PatternRewriter) -> None:
        if op.attrs()["do_relu"]:
            return
        for v, c in commuted(op):
            ln = v.owner
            arr = self.w.get(c)
            if not isinstance(ln, top.LayerNorm) or arr is None or not _single_use(v):
                continue
            shape = A.shape_of(ln.output.type)
            arr = _broadcast_param(np.asarray(arr), shape)
            if arr is None or A.shape_of(op.output.type) != shape:
                continue
            scale, bias = ln.scale, ln.bias
            old_scale = self.w.get(scale) if not isinstance(scale.type, NoneType) else None
            if isinstance(op, top.Mul):
                if not isinstance(bias.type, NoneType):
                    continue  # (x_hat * s + b) * g: leave it
                scale = self.w.add(rewriter, op, f"{op.loc}_scale",
                                   arr if old_scale is None else np.asarray(old_scale, np.float32) * arr)
            else:
                if not isinstance(bias.type, NoneType):
                    continue
                bias = self.w.add(rewriter, op, f"{op.loc}_bias", arr)
            _replace(rewriter, op, make_op("LayerNorm", [ln.input, scale, bias], ln.attrs(), op.loc))
            self.fired()
            return


class PointwiseMatMulToConv(TopPattern):
    """Reshape [N,H,W,C] -> [N*H*W, C], MatMul by a constant [C, O], Reshape -> [N,H,W,O] (a Keras
    Dense layer on a feature map, as tf2onnx writes it) -> one 1x1 NHWC Conv.

    A MatMul pins the channels last; a Conv lets ConvertLayout run it in the chip's layout, so
    ConvNeXt's pointwise layers need no transposes in NCHW either.
    """

    NAME = "pointwise-matmul-to-conv"

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: top.Reshape, rewriter: PatternRewriter) -> None:
        mm = op.input.owner
        if not isinstance(mm, top.MatMul) or not _single_use(op.input):
            return
        flat = mm.input.owner
        if not isinstance(flat, top.Reshape) or not _single_use(mm.input):
            return
        x = flat.input
        xs, out = A.shape_of(x.type), A.shape_of(op.output.type)
        if len(xs) != 4 or len(out) != 4 or xs[:3] != out[:3]:
            return
        if A.shape_of(mm.input.type) != (xs[0] * xs[1] * xs[2], xs[3]):
            return
        w = self.w.get(mm.right)
        a = mm.attrs()
        if w is None or w.ndim != 2:
            return
        kernel = w.T if a["right_transpose"] else w  # [C, O]
        if kernel.shape != (xs[3], out[3]):
            return
        bias = mm.bias
        if not isinstance(bias.type, NoneType):
            b = self.w.get(bias)
            if b is None or b.size != out[3]:
                return
            bias = self.w.add(rewriter, op, f"{op.loc}_bias", b.reshape(-1).astype(np.float32))
        hwio = self.w.add(rewriter, op, f"{op.loc}_kernel", np.ascontiguousarray(kernel.reshape(1, 1, *kernel.shape)))
        attrs = {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1,
                 "do_relu": a["do_relu"], "relu_limit": a["relu_limit"], "layout": "NHWC", "kernel_layout": "HWIO"}
        _replace(rewriter, op, make_op("Conv", [x, hwio, bias], attrs, op.loc))
        self.fired()


class FoldConstants(TopPattern):
    """An op whose operands are all constants -> `top.Weight`(s) holding its result."""

    NAME = "fold-constants"

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: top.TopOp, rewriter: PatternRewriter) -> None:
        if isinstance(op, (top.Weight, top.Input, top.NoneOp)):
            return
        arrays = []
        for v in op.operands:
            if isinstance(v.type, NoneType):
                arrays.append(None)
                continue
            arr = self.w.get(v)
            if arr is None:
                return
            arrays.append(arr)
        from tftpu.interp.kernels import KERNELS
        kernel = KERNELS.get(op.name)
        if kernel is None:
            return
        results = kernel(arrays, op.attrs())
        names = top.loc_names(op)
        new = []
        for i, (r, res) in enumerate(zip(op.results, results)):
            dt = A.numpy_dtype(A.dtype_name(r.type.element_type))
            name = names[i] if i < len(names) else f"{op.loc}_{i}"
            new.append(self.w.add(rewriter, op, name, np.asarray(res).astype(dt, copy=False)))
        rewriter.replace(op, [], new)
        self.fired()


def _is_noop(op) -> bool:
    shapes = op.operand_shapes()
    out = A.shape_of(op.results[0].type) if len(op.results) == 1 else None
    same = out is not None and shapes and shapes[0] == out
    if isinstance(op, (top.Reshape, top.Flatten)):
        return bool(same)
    if isinstance(op, (top.Squeeze, top.Unsqueeze)):
        return not op.attrs()["axes"]
    if isinstance(op, top.Permute):
        order = op.attrs()["order"]
        return order == sorted(order)
    if isinstance(op, top.Cast):
        return A.dtype_name(op.operands[0].type.element_type) == op.attrs()["to"]
    if isinstance(op, top.Slice):
        return bool(same) and all(s == 1 for s in op.attrs()["steps"])
    if isinstance(op, top.Pad):
        return not any(op.attrs()["paddings"])
    if isinstance(op, top.Concat):
        return len(op.operands) == 1 and not op.attrs()["do_relu"]
    if isinstance(op, top.Split):
        return len(op.results) == 1
    return False


class DropNoOps(TopPattern):
    """Reshape/Flatten to the same shape, identity Permute, same-type Cast, full Slice, zero Pad, ... -> gone."""

    NAME = "drop-noop"

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: top.TopOp, rewriter: PatternRewriter) -> None:
        if isinstance(op, (top.Weight, top.Input, top.NoneOp)):
            return
        if _is_noop(op) and _bypass(rewriter, op, op.operands[0]):
            self.fired()


class MergePermutes(TopPattern):
    """Permute(Permute(x, a), b) -> Permute(x, a[b])."""

    NAME = "merge-permutes"

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: top.Permute, rewriter: PatternRewriter) -> None:
        if not isinstance(op.input.owner, top.Permute):
            return
        inner = op.input.owner
        a, b = inner.attrs()["order"], op.attrs()["order"]
        _replace(rewriter, op, make_op("Permute", [inner.input], {"order": [a[i] for i in b]}, op.loc))
        self.fired()


class MergeReshapes(TopPattern):
    """Reshape/Flatten/Squeeze/Unsqueeze of a Reshape -> one Reshape."""

    NAME = "merge-reshapes"

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: top.Reshape | top.Flatten | top.Squeeze | top.Unsqueeze,
                          rewriter: PatternRewriter) -> None:
        if not isinstance(op.operands[0].owner, (top.Reshape, top.Flatten, top.Squeeze, top.Unsqueeze)):
            return
        inner = op.operands[0].owner
        shape = list(A.shape_of(op.results[0].type))
        _replace(rewriter, op, make_op("Reshape", [inner.operands[0]], {"shape": shape}, op.loc))
        self.fired()


class DeadCode(TopPattern):
    """Ops none of whose results is used -> erased."""

    NAME = "dead-code"

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: top.TopOp, rewriter: PatternRewriter) -> None:
        if isinstance(op, top.Input):
            return
        if all(not list(r.uses) for r in op.results):
            rewriter.erase(op)
            if not isinstance(op, (top.Weight, top.NoneOp)):
                self.fired()


class SplitConvByParts(TopPattern):
    """A Split along the output channels of a conv that only it reads -> one conv per part
    (its slice of the filter and bias). The same FLOPs and values, but each part is its own
    tensor with its own INT8 grid: a detector head's conv that computes class logits and box
    distributions together (PicoDet, YOLO heads) no longer puts both on one grid that erases
    the narrower part."""

    NAME = "split-conv-by-parts"

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: top.Split, rewriter: PatternRewriter) -> None:
        conv = op.operands[0].owner
        if not isinstance(conv, top.Conv) or not _single_use(conv.output) or len(op.results) < 2:
            return
        attrs = conv.attrs()
        shape = conv.output.type.get_shape()
        axis = op.attrs()["axis"] % len(shape)
        if attrs["group"] != 1 or axis != (1 if attrs["layout"] == "NCHW" else len(shape) - 1):
            return
        wt = self.w.get(conv.filter)
        has_bias = not isinstance(conv.bias.type, NoneType)
        bias = self.w.get(conv.bias) if has_bias else None
        if wt is None or (has_bias and bias is None):
            return
        w_axis = 0 if attrs.get("kernel_layout", "OIHW") == "OIHW" else wt.ndim - 1
        start, parts = 0, []
        for size, result in zip(op.attrs()["split_size"], op.results):
            name = value_name(result)
            part = np.take(wt, np.arange(start, start + size), axis=w_axis)
            nw = self.w.add(rewriter, op, f"{name}_filter", part)
            nb = self.w.add(rewriter, op, f"{name}_bias", bias.reshape(-1)[start:start + size]) if has_bias \
                else conv.bias
            new = make_op(conv.op_name, [conv.input, nw, nb], attrs, name)
            rewriter.insert(new, InsertPoint.before(op))
            parts.append(new.output)
            start += size
        rewriter.replace(op, [], parts)
        rewriter.erase(conv)
        self.fired()


PATTERNS = [DeadCode, FoldConstants, ClipToRelu, FoldBatchNorm, FoldScaleIntoConv, FoldMulAddIntoConv, FuseRelu,
            FuseSiLU, FusePRelu, FuseHardSigmoid, FuseHardSwish, FuseGELU, FuseLayerNorm, FuseDivLayerNorm,
            FoldAffineIntoLayerNorm, PointwiseMatMulToConv,
            FoldPadIntoConv, SplitConvByParts,
            DropNoOps, MergePermutes, MergeReshapes]


def canonicalize(model: TopModel, patterns=None, verify: bool = True) -> Report:
    """Rewrite `model` in place to a fixed point; drop unused weights; return what fired."""
    report = Report()
    w = Weights(model)
    pats = [cls(w, report) for cls in (patterns or PATTERNS)]
    # dce off: DeadCode does it, counted in the report, in a fixed order
    walker = PatternRewriteWalker(GreedyRewritePatternApplier(pats, dce_enabled=False), apply_recursively=True)
    walker.rewrite_module(model.module)
    # a reverse sweep removes chains of dead ops in one go
    PatternRewriteWalker(DeadCode(w, report), apply_recursively=True, walk_reverse=True).rewrite_module(model.module)
    model.weights = model.used_weights()
    if verify:
        model.verify()
    return report


@register
@dataclass
class Canonicalize(ModulePass):
    """`canonicalize`: the patterns above to a fixed point; a decision per pattern that fired."""

    name: ClassVar[str] = "canonicalize"

    def apply(self, model: TopModel) -> PassResult:
        report = canonicalize(model, verify=False)
        result = PassResult(self.name, detail=report)
        for pattern, n in sorted(report.counts.items()):
            result.apply(pattern, f"rewrote {n} op(s)", count=n)
        if not report.counts:
            result.decline("module", "nothing to rewrite: already canonical")
        return result
