"""Cross-layer equalization: each output channel of a conv that only dense convs read brought
nearer the tensor's widest, by a per-channel factor the readers' weights take back.

The conv's output is written on one 8-bit grid, set by its widest channel; a quiet channel lies
on a few of its levels. Where the conv ends in nothing or in a plain ReLU (positively
homogeneous: `relu(k x) = k relu(x)` for `k > 0`), its weights and bias of channel c times
`k_c` give that channel `k_c` times wider, and the readers' weights for input channel c divided
by `k_c` give the same result: the float program is unchanged (up to float rounding), no op is
added, and the quiet channels use more of the grid. Each conv's weights have their own scale per
output channel, so the producer's factors cost nothing; the readers' rows mix input channels,
so the factors are a square root of the range ratio (`POWER`), as in Nagel et al. 2019 (Data-Free
Quantization), here on the calibration samples' activation ranges rather than weight ranges.
A ReLU with a limit (ReLU6), a conv read by anything but a dense conv's data, a model output and
shared weights are left as they are.

>>> eq = equalize_cross_layer(model, samples)                     # doctest: +SKIP
>>> print(eq)                                                     # doctest: +SKIP
14 conv output(s) equalized across layers (factors up to 16.0, taken back by the 14 conv(s) reading them)
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tftpu.ir import top
from tftpu.ir.base import value_name
from tftpu.ir.module import TopModel
from tftpu.quant.equalize import channel_ranges, check_factors, range_factors

__all__ = ["equalize_cross_layer", "CrossLayer", "pairs", "POWER", "MAX_FACTOR", "MIN_FACTOR"]

POWER = 0.5          # k_c = (R / r_c) ** POWER
MAX_FACTOR = 16.0    # the largest factor (a channel silent on the samples is not blown up)
MIN_FACTOR = 1.5     # a tensor whose largest factor is smaller is left as it is


@dataclasses.dataclass
class CrossLayer:
    """The equalized model (`model` itself where nothing applied), each equalized tensor's
    factors, and the convs that took them back."""

    model: TopModel
    factors: dict          # conv output name -> per-channel factors
    readers: dict          # conv output name -> names of the convs reading it

    def __str__(self) -> str:
        if not self.factors:
            return "no conv output to equalize across layers"
        top_k = max(float(k.max()) for k in self.factors.values())
        n = len({r for names in self.readers.values() for r in names})
        return (f"{len(self.factors)} conv output(s) equalized across layers (factors up to {top_k:.1f}, "
                f"taken back by the {n} conv(s) reading them)")


def _weight(op, i: int):
    """The top.Weight feeding operand `i` of `op`, or None."""
    return op.operands[i].owner if len(op.operands) > i and isinstance(op.operands[i].owner, top.Weight) else None


def _plain_conv(op) -> bool:
    """A top.Conv in NCHW / OIHW with constant weights (and a constant bias or none)."""
    if not isinstance(op, top.Conv) or _weight(op, 1) is None:
        return False
    attrs = op.attrs()
    bias_ok = len(op.operands) < 3 or isinstance(op.operands[2].owner, (top.Weight, top.NoneOp))
    return attrs.get("layout", "NCHW") == "NCHW" and attrs.get("kernel_layout", "OIHW") == "OIHW" and bias_ok


def pairs(model: TopModel) -> list[tuple]:
    """(conv, [convs reading it]) for each conv whose output may be equalized: it ends in nothing
    or a ReLU without a limit, it is not a model output, and only dense convs (group 1) read it, as
    their data, none sharing weights with another conv."""
    readers: dict[int, list] = {}
    uses: dict[str, int] = {}
    for op in model.ops:
        for i, v in enumerate(op.operands):
            readers.setdefault(id(v), []).append((op, i))
        if isinstance(op, top.Weight):
            continue
        for v in op.operands:
            if isinstance(v.owner, top.Weight):
                uses[v.owner.key] = uses.get(v.owner.key, 0) + 1
    outputs = set(model.output_names)
    found = []
    for a in model.ops:
        if not _plain_conv(a) or a.attrs().get("relu_limit", -1.0) > 0 or value_name(a.results[0]) in outputs:
            continue
        owned = [w.key for w in (_weight(a, 1), _weight(a, 2)) if w is not None]
        if any(uses[k] != 1 for k in owned):
            continue
        rs = readers.get(id(a.results[0]), [])
        if rs and all(i == 0 and _plain_conv(b) and b.attrs().get("group", 1) == 1 and uses[_weight(b, 1).key] == 1
                      for b, i in rs):
            found.append((a, [b for b, _ in rs]))
    return found


def factors_for(r: np.ndarray, power: float = POWER, max_factor: float = MAX_FACTOR) -> np.ndarray | None:
    """Per-channel factors for channel ranges `r`, None where none reaches `MIN_FACTOR`."""
    k = range_factors(r, power, max_factor)
    return k if k is not None and k.max() >= MIN_FACTOR else None


def equalize_cross_layer(model: TopModel, samples, power: float = POWER,
                         max_factor: float = MAX_FACTOR) -> CrossLayer:
    """`model` with each conv output that `pairs` finds equalized per channel on `samples` (input
    dicts, whose ranges set the factors): a copy; `model` itself where nothing applies. See the
    module doc."""
    check_factors("cross-layer equalization", power, max_factor)
    samples = list(samples)
    found = pairs(model)
    if not found or not samples:
        return CrossLayer(model, {}, {})
    ranges = channel_ranges(model, {value_name(a.results[0]): 1 for a, _ in found}, samples)
    weights = dict(model.weights)
    factors, readers = {}, {}
    for a, bs in found:
        name = value_name(a.results[0])
        k = factors_for(ranges[name], power, max_factor) if name in ranges else None
        if k is None:
            continue
        for w in (_weight(a, 1), _weight(a, 2)):
            if w is not None:
                arr = weights[w.key]
                weights[w.key] = (arr * k.reshape(-1, *([1] * (arr.ndim - 1)))).astype(arr.dtype)
        for b in bs:
            key = _weight(b, 1).key
            arr = weights[key]
            weights[key] = (arr / k.reshape(1, -1, *([1] * (arr.ndim - 2)))).astype(arr.dtype)
        factors[name] = k
        readers[name] = [b.loc for b in bs]
    if not factors:
        return CrossLayer(model, {}, {})
    return CrossLayer(TopModel(model.module.clone(), weights), factors, readers)
