"""Ranges no wider than their readers can tell apart.

A tensor read only by functions that saturate (HardSigmoid, Clip, ReLU6, ReLU and HardSwish
below their knee: exactly; Sigmoid, Tanh, SiLU, GELU: within SOFT_TAIL of their asymptotes),
directly or through data moves and shifts or scales by constants, gains nothing from grid
levels outside the interval where those readers still change: clipping its calibrated range
to that interval spends the 8 bits where the outputs move. PP-OCRv3's text detector holds
its logits (-112 .. 53 on the held-out photo) on an INT8 grid of step 1.39 ahead of the
sigmoid, about seven levels where the text probability moves.

>>> table, clipped = clip_to_readers(model, table)    # doctest: +SKIP
>>> print(clipped.line)                               # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from tftpu.ir import top
from tftpu.ir.base import value_name

__all__ = ["SOFT_TAIL", "READERS", "reader_intervals", "clip_to_readers", "Clipped"]

# a smooth function's input is clipped where it lies within this of its asymptote: far below
# any 8-bit output step, and below the centred variation of a near-empty sigmoid map
# (YOLOX's objectness on a photo with no object: values about 3e-5)
SOFT_TAIL = 1e-7
_SIGMOID = math.log(1.0 / SOFT_TAIL)            # sigmoid(-x) < SOFT_TAIL beyond
_INF = math.inf


def _hard_sigmoid(attrs) -> tuple[float, float]:
    alpha, beta = float(attrs["alpha"]), float(attrs["beta"])
    if alpha == 0:
        return -_INF, _INF
    a, b = sorted((-beta / alpha, (1.0 - beta) / alpha))
    # (the knees widened a little: alpha * x + beta rounds, so x at the knee computed in
    # float may sit a last bit inside it)
    return a - 1e-6 * max(1.0, abs(a)), b + 1e-6 * max(1.0, abs(b))


def _relu(attrs) -> tuple[float, float]:
    limit = float(attrs.get("relu_limit", -1.0))
    return 0.0, (limit if limit >= 0 else _INF)


#: op name -> the input interval outside which the op's output no longer changes (or changes by
#: less than SOFT_TAIL), from the op's attributes
READERS = {
    "top.Sigmoid": lambda attrs: (-_SIGMOID, _SIGMOID),
    "top.Tanh": lambda attrs: (-(_SIGMOID + math.log(2.0)) / 2, (_SIGMOID + math.log(2.0)) / 2),   # 2 sigmoid(2x) - 1
    "top.HardSigmoid": _hard_sigmoid,
    "top.Clip": lambda attrs: (float(attrs["min"]), float(attrs["max"])),
    "top.Relu": _relu,
    "top.HardSwish": lambda attrs: (-3.0, _INF),
    # x * sigmoid(x) and x * Phi(x) under SOFT_TAIL below these
    "top.SiLU": lambda attrs: (-(_SIGMOID + math.log(_SIGMOID)), _INF),
    "top.GELU": lambda attrs: (-6.0, _INF),
}
# ops whose output is some of their input's values, moved: a clip of the input is a clip of the output
_MOVES = {"top.Reshape", "top.Permute", "top.Squeeze", "top.Unsqueeze", "top.Flatten", "top.Slice",
          "top.MaxPool", "top.Concat", "top.DepthToSpace", "top.SpaceToDepth"}


def _constant(model, v) -> np.ndarray | None:
    owner = v.owner
    if isinstance(owner, top.Weight):
        arr = model.weights.get(owner.key)
        return None if arr is None else np.asarray(arr, np.float64)
    return None


def _through_affine(op, index: int, out: tuple[float, float], model) -> tuple[float, float] | None:
    """The interval operand `index` of the element-wise `op` (Add, Sub, Mul, Div with a constant
    other operand; Scale) may be clipped to for its output to stay clipped to `out`; None where
    the op is not one of those."""
    lo, hi = out
    name = op.name
    if name == "top.Scale":
        if index != 0:
            return None
        s, b = _constant(model, op.operands[1]), _constant(model, op.operands[2])
        if s is None or b is None:
            return None
        return _divided((lo - b.max(), hi - b.min()), s)
    if name not in ("top.Add", "top.Sub", "top.Mul", "top.Div") or len(op.operands) != 2:
        return None
    c = _constant(model, op.operands[1 - index])
    if c is None or c.size == 0 or not np.all(np.isfinite(c)):
        return None
    if name == "top.Add":
        return lo - c.max(), hi - c.min()
    if name == "top.Sub":
        return (lo + c.min(), hi + c.max()) if index == 0 else (c.min() - hi, c.max() - lo)
    if name == "top.Mul":
        return _divided((lo, hi), c)
    if index == 0:                                   # x / c
        return _divided((lo, hi), 1.0 / c) if np.all(c != 0) else None
    return None


def _divided(out: tuple[float, float], k: np.ndarray) -> tuple[float, float] | None:
    """The hull of {x : k * x in out} over the elements of `k` (none of them 0)."""
    k = np.ravel(np.asarray(k, np.float64))
    if k.size == 0 or np.any(k == 0) or not np.all(np.isfinite(k)):
        return None
    with np.errstate(invalid="ignore"):
        ends = np.concatenate([out[0] / k, out[1] / k])
    if np.any(np.isnan(ends)):
        return None
    return float(ends.min()), float(ends.max())


def reader_intervals(model) -> dict[str, tuple[float, float]]:
    """Tensor name -> the interval its readers can tell apart, for every tensor all of whose
    readers saturate (through moves and constant shifts and scales); no model output is in it."""
    outputs = {value_name(v) for v in model.return_op.operands}
    readers: dict = {}
    for op in model.ops:
        for i, v in enumerate(op.operands):
            readers.setdefault(v, []).append((op, i))
    memo: dict = {}

    def interval(v) -> tuple[float, float] | None:
        if v in memo:
            return memo[v]
        memo[v] = None                               # (a cycle cannot occur; this guards anyway)
        if value_name(v) in outputs or not readers.get(v):
            return None
        lo, hi = _INF, -_INF
        for op, i in readers[v]:
            if op.name in READERS:
                got = READERS[op.name](op.attrs())
            elif op.name in _MOVES or (op.name == "top.Resize" and op.attrs().get("mode") == "nearest"):
                got = interval(op.results[0]) if i == 0 or op.name == "top.Concat" else None
            elif op.results and op.name in ("top.Add", "top.Sub", "top.Mul", "top.Div", "top.Scale"):
                after = interval(op.results[0])
                got = None if after is None else _through_affine(op, i, after, model)
            else:
                got = None
            if got is None:
                return None
            lo, hi = min(lo, got[0]), max(hi, got[1])
        memo[v] = (lo, hi) if (lo > -_INF or hi < _INF) and lo < hi else None
        return memo[v]

    found = {}
    for op in model.ops:
        for r in op.results:
            got = interval(r)
            if got is not None:
                found[value_name(r)] = got
    return found


@dataclasses.dataclass
class Clipped:
    """What `clip_to_readers` did: tensor -> (range before, range after)."""

    changed: dict

    @property
    def line(self) -> str:
        if not self.changed:
            return "no tensor's range is wider than its saturating readers can tell apart"
        names = sorted(self.changed, key=lambda n: -_shrink(*self.changed[n]))
        shown = ", ".join(f"{n} [{a[0]:.3g}, {a[1]:.3g}] -> [{b[0]:.3g}, {b[1]:.3g}]"
                          for n in names[:3] for a, b in [self.changed[n]])
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        return f"{len(names)} ranges clipped to what their saturating readers tell apart: {shown}{more}"


def _shrink(before, after) -> float:
    return (before[1] - before[0]) / max(after[1] - after[0], 1e-30)


def clip_to_readers(model, table):
    """(`table` with each tensor's range clipped to `reader_intervals`, a `Clipped` report). An
    entry whose calibrated values lie wholly outside its interval, or that it would not narrow,
    stays as it is; a range keeps 0 inside it (the INT8 grid holds 0 exactly)."""
    intervals = reader_intervals(model)
    entries, changed = dict(table.entries), {}
    for name, (lo_r, hi_r) in intervals.items():
        entry = entries.get(name)
        if entry is None:
            continue
        t, lo, hi = (float(x) for x in entry[:3])
        new_lo, new_hi = max(lo, min(lo_r, 0.0)), min(hi, max(hi_r, 0.0))
        if not new_lo < new_hi:
            continue
        new_t = min(t, max(-new_lo, new_hi))
        if (new_t, new_lo, new_hi) == (t, lo, hi) or new_t <= 0:
            continue
        entries[name] = (new_t, new_lo, new_hi, *entry[3:])
        changed[name] = ((lo, hi), (new_lo, new_hi))
    alternates = {m: clip_to_readers(model, t)[0] for m, t in table.alternates.items()}
    return dataclasses.replace(table, entries=entries, alternates=alternates), Clipped(changed)
