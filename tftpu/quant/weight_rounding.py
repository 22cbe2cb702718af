"""Per-layer reconstruction of the INT8 weight rounding: GPTQ / OBQ error feedback.

Rounding every weight to its nearest INT8 level treats the weights of an output channel as if
their errors did not meet; they do, in the channel's output, and early layers of detectors pass
that error on amplified (mediapipe's palm detector: 40 dB on the stem's weights, 22 dB on the
outputs). Here each conv's (and matmul's) weights are rounded one input column at a time, on
the very grid the INT8 lowering gives them (symmetric per output channel, max|w| / 127:
`tftpu.quant.params.weights_per_channel`), and the error each rounding makes is taken back by
the columns not rounded yet, through how the layer's inputs co-vary on the calibration samples
(`H = X^T X`, X the layer's input patches): the least-squares optimal update of OBQ / GPTQ
(Frantar et al. 2022), the closed-form cousin of AdaRound's learned round-up / round-down.

The result is a copy of the model whose reconstructed weights lie exactly on their INT8 grid (each
channel keeps its largest weight at +-127 levels, so the lowering derives the same scale and its
own nearest rounding gives back these integers); biases and everything else are unchanged.

>>> rounded, report = reconstruct_rounding(model, samples)   # doctest: +SKIP
>>> print(report)     # ops re-rounded, layer-output error against round-to-nearest
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from tftpu import geometry, rounding
from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.ir import top
from tftpu.ir.base import value_name
from tftpu.ir.module import TopModel
from tftpu.quant import params as P
from tftpu.utils import spd
from tftpu.utils.threads import one_blas_thread

__all__ = ["reconstruct_rounding", "restore_weights", "WeightRounding", "gptq", "keep_scale", "conv_patches", "MAX_SAMPLES"]

MAX_SAMPLES = 8
INPUT_BUDGET = 4 * 3 * 640 * 640     # input values held by the samples used, as bias correction
DAMP = 0.01                          # H + DAMP * mean(diag H) * I: the update stays bounded
BLOCK = 128                          # columns rounded before the rest is updated at once (GPTQ's lazy batch)
ROWS = 1 << 14                       # patch rows multiplied at a time (bounded memory)
MAX_ROWS = 1 << 15                   # at most this many input patches per layer and sample (evenly spaced)
QMAX = P.QMAX
MIN_ROWS = 4                         # input rows seen per column, at least: fewer, and the feedback fits the samples


@dataclasses.dataclass
class WeightRounding:
    """What `reconstruct_rounding` did: per op (name, type, columns, the layer-output error of
    nearest rounding and of the reconstruction, both in dB under the output's power on the
    samples), the samples it saw, the seconds it took, the ops left alone and why."""

    ops: list[dict]
    samples: int
    seconds: float
    skipped: dict = dataclasses.field(default_factory=dict)
    kept: bool = True                 # False: the lowering took the model as given
    check: str = ""

    @property
    def gain_db(self) -> float:
        """Mean over the ops of the layer-output SQNR gained against nearest rounding."""
        return float(np.mean([o["sqnr_db"] - o["nearest_sqnr_db"] for o in self.ops])) if self.ops else 0.0

    def as_dict(self) -> dict:
        return {"ops": len(self.ops), "samples": self.samples, "seconds": round(self.seconds, 3),
                "mean_gain_db": round(self.gain_db, 3), "skipped": len(self.skipped), "kept": self.kept,
                "check": self.check}

    def __str__(self) -> str:
        d = self.as_dict()
        return (f"{d['ops']} conv/matmul weights re-rounded over {d['samples']} samples: layer outputs "
                f"{d['mean_gain_db']:+.1f} dB SQNR on average against nearest rounding"
                + (f", {d['skipped']} skipped" if d["skipped"] else "") + (f"; {self.check}" if self.check else ""))


# ---------------------------------------------------------------------------- the rounding

def gptq(w: np.ndarray, h: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Integer levels of `w` [B, O, d] (B independent blocks: groups or depthwise channels) on
    the grid `scales` [B, O], each row rounded column by column with the error fed back through
    `h` [B, d, d] (the inputs' second moments), as GPTQ. Columns whose input is always zero
    (diag 0) are rounded to nearest and pass nothing on."""
    w = np.array(w, np.float64)
    h = np.array(h, np.float64)
    b, o, d = w.shape
    diag = np.diagonal(h, axis1=1, axis2=2).copy()
    dead = diag <= 0
    if dead.any():
        bi, ci = np.nonzero(dead)
        h[bi, ci, :] = 0.0
        h[bi, :, ci] = 0.0
        h[bi, ci, ci] = 1.0
        diag = np.diagonal(h, axis1=1, axis2=2).copy()
    h[:, np.arange(d), np.arange(d)] += DAMP * diag.mean(axis=1, keepdims=True)
    u = spd.inverse_cholesky_upper(h)
    s = scales[:, :, None]
    q = np.zeros((b, o, d), np.float64)
    for i1 in range(0, d, BLOCK):
        i2 = min(i1 + BLOCK, d)
        w1 = w[:, :, i1:i2].copy()
        err1 = np.zeros_like(w1)
        u1 = u[:, i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = w1[:, :, i:i + 1]
            level = np.clip(rounding.round_half_away(col / s), -QMAX, QMAX)
            q[:, :, i1 + i] = level[:, :, 0]
            err = (col - level * s) / u1[:, i, i][:, None, None]
            w1[:, :, i:] -= err * u1[:, None, i, i:]
            err1[:, :, i] = err[:, :, 0]
        if i2 < d:
            w[:, :, i2:] -= err1 @ u[:, i1:i2, i2:]
    return q


def keep_scale(levels: np.ndarray, w: np.ndarray) -> np.ndarray:
    """`levels` [B, O, d] of `w` with each nonzero row's largest weight at +-127 where no level
    is (in place): the lowering derives each channel's scale from that level."""
    amax = np.abs(w).max(axis=2)
    for bi, oi in zip(*np.nonzero((amax > 0) & (np.abs(levels).max(axis=2) < QMAX))):
        j = int(np.argmax(np.abs(w[bi, oi])))
        levels[bi, oi, j] = QMAX * np.sign(w[bi, oi, j])
    return levels


def _levels(w: np.ndarray, h: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, float, float]:
    """(integer levels [B, O, d], nearest rounding's and the reconstruction's layer-output SQNR in dB)."""
    q = keep_scale(gptq(w, h, scales), w)
    near = _nearest(w, scales)

    def power(x):
        return float(np.sum((x @ h) * x))

    signal = power(np.asarray(w, np.float64))
    s = scales[:, :, None]
    return q, _db(signal, power(w - near * s)), _db(signal, power(w - q * s))


def _nearest(w: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Round-to-nearest levels of `w` [B, O, d] on `scales` [B, O], as the lowering rounds."""
    return np.clip(rounding.round_half_away(w / scales[:, :, None]), -QMAX, QMAX)


def _db(signal: float, noise: float) -> float:
    if noise <= 0:
        return math.inf
    return 10.0 * math.log10(max(signal, 1e-300) / noise)


# ---------------------------------------------------------------------------- the layers' inputs

def conv_patches(x: np.ndarray, kernel: tuple, attrs: dict, max_rows: int | None = None, ones: bool = False):
    """Yield the input patches of a 2-D NCHW conv, a block of output rows at a time, as
    contiguous float32 [group, C/group * kh * kw, patches] (the order of the OIHW filter's
    flattened [C/g, kh, kw]), with a last row of ones where `ones` (a bias's input); about
    `max_rows` (MAX_ROWS) patches per image at most (every few output rows of a large map).
    Patches last, each block is filled a run of output columns at a time (a stride-1 conv's
    input rows copied whole, not a few taps at a time); contiguous, as numpy's batched matmul
    takes a path many times slower on strided blocks."""
    max_rows = MAX_ROWS if max_rows is None else max_rows
    kh, kw = kernel
    pt, pl, pb, pr = (list(attrs.get("pads") or ()) + [0, 0, 0, 0])[:4]
    sh, sw = (list(attrs.get("strides") or ()) + [1, 1])[:2]
    dh, dw = (list(attrs.get("dilations") or ()) + [1, 1])[:2]
    g = int(attrs.get("group", 1) or 1)
    n, c = x.shape[:2]
    cg, d = c // g, c // g * kh * kw
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    win = sliding_window_view(xp, (geometry.span(kh, dh), geometry.span(kw, dw)), axis=(2, 3))
    win = win[:, :, ::sh, ::sw, ::dh, ::dw]                   # [N, C, Ho, Wo, kh, kw]
    ho, wo = win.shape[2:4]
    every = max(1, math.ceil(ho * wo / max_rows))            # a large map: every few output rows
    rows = range(0, ho, every)
    step = max(1, ROWS // max(1, wo))
    for i in range(n):
        for k in range(0, len(rows), step):
            block = win[i, :, rows[k]:rows[min(k + step, len(rows)) - 1] + 1:every]    # [C, R, Wo, kh, kw]
            r = block.shape[1]
            out = np.empty((g, d + ones, r * wo), np.float32)
            out[:, :d].reshape(g, cg, kh, kw, r, wo)[...] = \
                block.reshape(g, cg, r, wo, kh, kw).transpose(0, 1, 4, 5, 2, 3)
            if ones:
                out[:, d] = 1.0
            yield out


def _accumulate(h: np.ndarray, patches: np.ndarray) -> int:
    """h [g, d, d] += X X^T per group (X: `patches` [g, d, P] float32, contiguous; float32
    products of at most ROWS output rows, summed in float64); the number of patches."""
    h += patches @ np.swapaxes(patches, 1, 2)
    return patches.shape[2]


class _Layer:
    """One weighted op: where its weights are, how they map to [B, O, d] blocks and back, and
    the input second moments gathered so far."""

    def __init__(self, op, w: np.ndarray):
        self.op, self.key, self.shape, self.dtype = op, op.operands[1].owner.key, w.shape, w.dtype
        if isinstance(op, top.MatMul):
            a = op.attrs()
            m = w.T if not a["right_transpose"] else w            # [N, K]: a row per output channel
            self.blocks = np.asarray(m, np.float64)[None]
            self.group = 1
        else:
            a = op.attrs()
            oihw = w if a["kernel_layout"] == "OIHW" else w.transpose(3, 2, 0, 1)
            self.group = int(a.get("group", 1) or 1)
            o = oihw.shape[0]
            self.blocks = np.asarray(oihw, np.float64).reshape(self.group, o // self.group, -1)
        d = self.blocks.shape[2]
        self.h = np.zeros((self.blocks.shape[0], d, d))
        self.rows = 0

    def observe(self, x: np.ndarray) -> None:
        if isinstance(self.op, top.MatMul):
            self.rows += _accumulate(self.h, np.ascontiguousarray(x.reshape(-1, x.shape[-1]).T[None], np.float32))
            return
        a = self.op.attrs()
        if a["layout"] == "NHWC":
            x = x.transpose(0, 3, 1, 2)
        kernel = tuple(a["kernel_shape"]) or self.shape[2:]
        for patches in conv_patches(x, kernel, a):
            self.rows += _accumulate(self.h, patches)

    def weights(self, levels: np.ndarray, scales: np.ndarray) -> np.ndarray:
        """The reconstructed weights in the op's own layout and dtype."""
        m = (levels * scales[:, :, None]).reshape(-1, self.blocks.shape[2])
        if isinstance(self.op, top.MatMul):
            out = m if self.op.attrs()["right_transpose"] else m.T
        else:
            oihw = m.reshape((self.shape[0],) + tuple(self.shape[1:]) if self.op.attrs()["kernel_layout"] == "OIHW"
                             else (self.shape[3], self.shape[2], self.shape[0], self.shape[1]))
            out = oihw if self.op.attrs()["kernel_layout"] == "OIHW" else oihw.transpose(2, 3, 1, 0)
        return np.ascontiguousarray(out).astype(self.dtype)


def _why_not(op, model: TopModel, uses: dict) -> str | None:
    """Why `op`'s weights are left as they are (None: they are reconstructed)."""
    w = op.operands[1]
    if not isinstance(w.owner, top.Weight):
        return "its weights are not a constant"
    arr = model.weights.get(w.owner.key)
    if arr is None or arr.dtype.kind != "f":
        return "its weights are not float"
    if uses.get(w.owner.key, 0) > 1:
        return "its weights are shared with another op"
    if isinstance(op, top.MatMul):
        if arr.ndim != 2:
            return "its weights are not a matrix"
        return None
    if arr.ndim != 4:
        return "only 2-D convolutions are reconstructed"
    return None


@one_blas_thread
def reconstruct_rounding(model: TopModel, samples: list[dict], *, float_ops: set | None = None,
                         max_samples: int = MAX_SAMPLES) -> tuple[TopModel, WeightRounding]:
    """(copy of `model` with its 2-D conv / matmul weights re-rounded on their INT8 grid, report).
    The inputs' second moments come from float runs over `samples` (the first `max_samples`,
    fewer for large inputs); `float_ops` names ops that will not run in INT8 (left alone)."""
    t0 = time.perf_counter()
    samples = list(samples)
    size = max(sum(int(np.asarray(a).size) for a in samples[0].values()), 1) if samples else 1
    samples = samples[:max(1, min(max_samples, INPUT_BUDGET // size))]
    float_ops = set(float_ops or ())
    uses: dict[str, int] = {}
    for op in model.ops:
        for v in op.operands:
            if isinstance(v.owner, top.Weight):
                uses[v.owner.key] = uses.get(v.owner.key, 0) + 1
    layers: dict[str, list[_Layer]] = {}
    skipped: dict[str, str] = {}
    for op in model.ops:
        if not isinstance(op, (top.Conv, top.MatMul)):
            continue
        why = "kept in float" if op.loc in float_ops else _why_not(op, model, uses)
        if why is not None:
            skipped[op.loc] = why
            continue
        layers.setdefault(value_name(op.operands[0]), []).append(_Layer(op, model.weights[op.operands[1].owner.key]))

    def observe(name, arr):
        for layer in layers.get(name, ()):
            layer.observe(np.asarray(arr, np.float32))
        return arr

    if layers:
        interp = TopInterpreter(model)
        for sample in samples:
            interp.run(sample, observe=observe)
    weights = dict(model.weights)
    rows = []
    for layer in (x for group in layers.values() for x in group):
        d = layer.blocks.shape[2]
        if layer.rows < MIN_ROWS * d:
            skipped[layer.op.loc] = (f"{layer.rows} input rows on the samples for {d} weights a channel: "
                                     f"too few to reconstruct from (at least {MIN_ROWS} a weight)")
            continue
        _, scales = P.weights_per_channel(layer.blocks.reshape(-1, d), 0)   # the lowering's grid
        scales = scales.reshape(layer.blocks.shape[:2])
        levels, near_db, db = _levels(layer.blocks, layer.h, scales)
        if not db >= near_db:        # the reconstruction never loses to nearest rounding on what it saw
            levels, db = _nearest(layer.blocks, scales), near_db
        weights[layer.key] = layer.weights(levels, scales)
        rows.append({"name": layer.op.loc, "op": layer.op.name, "columns": int(layer.blocks.shape[2]),
                     "nearest_sqnr_db": round(near_db, 3), "sqnr_db": round(db, 3)})
    return TopModel(model.module, weights), WeightRounding(rows, len(samples), time.perf_counter() - t0, skipped)


def restore_weights(rounded: TopModel, original: TopModel, names: set) -> TopModel:
    """`rounded` with the original weights (and biases) back for the ops named (those the
    lowering keeps in float); a bias `rounded` gave an op that had none becomes zeros."""
    weights = dict(rounded.weights)
    by_loc = {op.loc: op for op in rounded.ops if isinstance(op, (top.Conv, top.Deconv, top.MatMul))}
    for op in original.ops:
        if op.loc not in names or not isinstance(op, (top.Conv, top.Deconv, top.MatMul)):
            continue
        if isinstance(op.operands[1].owner, top.Weight):
            key = op.operands[1].owner.key
            weights[key] = original.weights[key]
        now = by_loc.get(op.loc)
        bias = now.operands[2].owner if now is not None and len(now.operands) > 2 else None
        if isinstance(bias, top.Weight):
            was = op.operands[2].owner if len(op.operands) > 2 else None
            weights[bias.key] = original.weights[was.key] if isinstance(was, top.Weight) \
                else np.zeros_like(weights[bias.key])
    return TopModel(rounded.module, weights)
