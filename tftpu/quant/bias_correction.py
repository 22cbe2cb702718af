"""Empirical bias correction: the bias of each INT8 conv / matmul / deconv absorbs the mean of
its per-channel output error (and of one kept in float, the error its INT8 inputs bring).

Rounding a conv's weights to INT8 (and its input to the input's grid, clipped at the
threshold) shifts each output channel by `sum(dW * E[x])` on average: nonzero wherever the
inputs have a nonzero mean (after a ReLU, an image's offset). That shift is a constant per
channel, so the bias can take it back. As AIMET's empirical bias correction, on calibration
samples the model runs twice side by side, in float and simulated INT8 (`fake_quant` of every
tensor on the grid the lowering gives it, `tftpu.quant.params`; weights per output channel as
`int8_conv` / `int8_deconv` quantize them), and op by op in model order (sequentially, so each
correction sees the corrected ops upstream) the INT8 op's output before its fused ReLU is
compared with the float one; the per-channel mean difference is subtracted from the bias.
Two choices, measured on mediapipe's detectors and selfie segmenter (10 photos, two folds of
5 calibration / 5 held-out): with a fused ReLU only the positions the ReLU passes on count
(where the float output is in (0, limit): the rest is cut anyway; selfie segmentation pooled
SQNR 2.3 -> 5.7 dB from that alone), and each channel's mean is shrunk by how much it varies
from sample to sample (`_shrunk_mean`: a shift specific to a few images does not carry over
to the next one; +0.2 to +0.7 dB on every output over the plain mean).

The original model is left as it is (it stays the reference of every check); the corrected
copy differs from it only in those biases (an op without one gets one).

>>> corrected, report = correct_biases(model, table, samples)   # doctest: +SKIP
>>> print(report)            # ops corrected, mean |correction| in output steps
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from xdsl.dialects.builtin import NoneType

from tftpu.interp.kernels._registry import post_relu
from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.ir import attrs as A
from tftpu.ir import top
from tftpu.ir.module import TopModel
from tftpu.ir.quant import STORAGE
from tftpu.quant import params as P
from tftpu.quant.links import reach, reads_link, wide_grids, wide_weights
from tftpu.quant.refit import Fit
from tftpu.utils.names import unique_name
from tftpu.utils.threads import one_blas_thread, pool_size

__all__ = ["correct_biases", "BiasCorrection", "MAX_SAMPLES", "lowered_weights"]

# samples the correction runs on (the first ones given): the means settle on a few photos, and
# the float and INT8 runs of every sample are held at once; at most MAX_SAMPLES, fewer (not under
# 2) where they would hold more than INPUT_BUDGET input values together (4 images of 640x640:
# PP-OCRv6_det_small: 15-20 s on 2 shared cores)
MAX_SAMPLES = 8
INPUT_BUDGET = 4 * 3 * 640 * 640
GRID = 1024


@dataclasses.dataclass
class BiasCorrection:
    """What `correct_biases` did: per corrected op (name, type, channels, mean and largest
    |correction| in steps of the op's output grid), the samples and the seconds it took."""

    ops: list[dict]
    samples: int
    seconds: float
    skipped: dict = dataclasses.field(default_factory=dict)     # op name -> why it was not corrected
    kept: bool = True                                           # False: the lowering took the model as given
    check: str = ""                                             # how that was decided, when it was
    refit: int = 0                                              # convs whose weights were refit as well
    rounding: str = "nearest"                                   # how the refit weights reach their grid

    @property
    def mean_steps(self) -> float:
        """Mean |correction| over every corrected channel, in output steps."""
        n = sum(o["channels"] for o in self.ops)
        return sum(o["mean_steps"] * o["channels"] for o in self.ops) / n if n else 0.0

    def as_dict(self) -> dict:
        return {"ops": len(self.ops), "samples": self.samples, "seconds": round(self.seconds, 3),
                "mean_abs_correction_steps": round(self.mean_steps, 4),
                "max_abs_correction_steps": round(max((o["max_steps"] for o in self.ops), default=0.0), 4),
                "skipped": len(self.skipped), "kept": self.kept, "check": self.check, "refit": self.refit}

    def __str__(self) -> str:
        d = self.as_dict()
        refit = (f"{self.refit} conv weights refit to their INT8 inputs"
                 + (" (rounded by GPTQ's error feedback)" if self.rounding == "gptq" else "") + ", "
                 if self.refit else "")
        return (refit + f"{d['ops']} conv/matmul/deconv biases corrected over {d['samples']} samples: mean |correction| "
                f"{d['mean_abs_correction_steps']:.3f} output steps (largest {d['max_abs_correction_steps']:.2f})"
                + (f", {d['skipped']} skipped" if d["skipped"] else "") + (f"; {self.check}" if self.check else ""))


def _fake_quant(x: np.ndarray, q: P.QParams) -> np.ndarray:
    """x on the INT8 grid `q` (as the float values the integers stand for)."""
    if x.dtype.kind != "f":
        return x
    inv = np.float32(1.0 / q.scale)
    _, lo, hi = STORAGE[q.storage]
    v = np.asarray(x.astype(np.float32, copy=False) * inv)    # (one buffer, every step in place)
    np.rint(v, out=v)
    v += np.float32(q.zero_point)
    np.clip(v, lo, hi, out=v)
    v -= np.float32(q.zero_point)
    v *= np.float32(q.scale)
    return v.astype(x.dtype, copy=False)


def _channel_axis(op, ndim: int) -> int:
    """The axis of an op's output that holds its output channels."""
    if isinstance(op, top.MatMul):
        return ndim - 1
    return 1 if op.attrs()["layout"] == "NCHW" else ndim - 1


def _conv_axis(op) -> int:
    """The output-channel axis of a conv's filter, which its weights are quantized along."""
    return 0 if op.attrs()["kernel_layout"] == "OIHW" else -1


def _quantized_weight(op, w: np.ndarray, wide: bool = False) -> np.ndarray | None:
    """The INT8 weights an INT8 lowering gives `op`, as floats (None where it would not quantize
    them); `wide`: a conv's 16-bit weights (`tftpu.quant.links.WideWeights`)."""
    if w.dtype.kind != "f" or w.ndim < 2:
        return None
    if isinstance(op, top.Conv):
        axis = _conv_axis(op)
        q, s = P.weights_per_channel(w, axis, wide)
    elif isinstance(op, top.MatMul):
        axis = -2 if op.attrs()["right_transpose"] else -1
        q, s = P.weights_per_channel(w, axis)
    else:
        q, axis, s, _ = P.deconv_weights(w, op.attrs()["group"])
    shape = [1] * w.ndim
    shape[axis % w.ndim] = -1
    return (q.astype(np.float64) * s.reshape(shape)).astype(w.dtype)


def lowered_weights(model: TopModel, names: set, wide: set = frozenset()) -> TopModel:
    """`model` with the weights of the Conv / Deconv / MatMul ops `names` (those lowered to INT8)
    on the INT8 grid the lowering gives them (`wide`: the convs with 16-bit weights), everything
    else as it is: run in float, what the weights' rounding alone does to the outputs."""
    weights = dict(model.weights)
    for op in model.ops:
        if op.loc in names and isinstance(op, (top.Conv, top.Deconv, top.MatMul)) \
                and isinstance(op.operands[1].owner, top.Weight):
            key = op.operands[1].owner.key
            q = _quantized_weight(op, weights[key], op.loc in wide)
            if q is not None:
                weights[key] = q
    return TopModel(model.module, weights)


def _why_not(op, model, table) -> str | None:
    """Why `op` gets no correction (None: it does)."""
    x, w, b = op.operands
    if not isinstance(w.owner, top.Weight):
        return "its weights are not a constant"
    if not isinstance(b.type, NoneType) and not isinstance(b.owner, top.Weight):
        return "its bias is not a constant"
    if not isinstance(op, top.MatMul) and len(x.type.get_shape()) not in (3, 4):
        return "3-D convolutions run in float"
    from tftpu.ir.module import value_name
    if value_name(x) not in table.entries or value_name(op.results[0]) not in table.entries:
        return "no calibration entry"
    if not isinstance(b.type, NoneType):
        out = op.results[0].type.get_shape()
        if int(np.prod(b.type.get_shape())) != out[_channel_axis(op, len(out))]:
            return "its bias is not one value per output channel"
    if A.dtype_name(op.results[0].type.element_type) != "f32":
        return "not an f32 op"
    return None


def _refittable(op, model: TopModel) -> bool:
    """Whether `op`'s weights can be refit (`tftpu.quant.refit`): a 2-D NCHW conv with OIHW
    weights of its own."""
    if not isinstance(op, top.Conv) or len(op.operands[0].type.get_shape()) != 4:
        return False
    a = op.attrs()
    return a["layout"] == "NCHW" and a["kernel_layout"] == "OIHW" and len(list(op.operands[1].uses)) == 1


@one_blas_thread
def correct_biases(model: TopModel, table, samples: list[dict], asymmetric: bool | str = False, *,
                   float_ops: set | None = None, fixed: set | None = None, max_samples: int = MAX_SAMPLES,
                   wide_links: bool | str = True, refit: bool = False, rounding: str = "nearest",
                   input_budget: int = INPUT_BUDGET) -> tuple[TopModel, BiasCorrection]:
    """(corrected copy of `model`, report): each Conv / Deconv / MatMul with constant weights
    and calibrated input and output gets the bias that cancels the mean per-channel difference
    between its simulated INT8 output and its float output on `samples` (the first
    `max_samples`, fewer for large inputs: INPUT_BUDGET), in model order. `asymmetric` is the
    lowering's (False, True, "auto"); `float_ops` names ops that will not run in INT8 (simulated
    in float): a conv / matmul / deconv among them keeps its float weights and is corrected (or
    refit) to the INT8-rounded inputs it gets all the same, as a float op downstream of INT8 ones
    runs on them (an SE block's float excitation reading an INT8 pool: PP-OCRv6's text detector
    18.7 -> 19.7 dB on its held-out photo); `fixed` names ops left exactly as given (a decode
    tail, float by design). `wide_links`: the lowering's (16-bit links simulated on their grid).
    `refit`: each 2-D conv's weights and bias are refit to the simulated INT8 inputs it gets
    (`tftpu.quant.refit`: its bias takes the mean shift in the fit), the other ops' biases
    corrected as before; `rounding` ("nearest", "gptq": `Fit.rounded`) how those weights reach
    their INT8 grid. `input_budget`: the most input values the samples used hold together."""
    t0 = time.perf_counter()
    samples = list(samples)
    size = max(sum(int(np.asarray(a).size) for a in samples[0].values()), 1) if samples else 1
    samples = samples[:max(2, min(max_samples, input_budget // size))]
    float_ops, fixed = set(float_ops or ()), set(fixed or ())
    interp = TopInterpreter(model)
    grids = {name: P.activation(*entry[:3], asymmetric=asymmetric) for name, entry in table.entries.items()}
    narrow: dict[str, P.QParams] = {}       # a 16-bit link's 8-bit grid, for the INT8 ops that read 8 bits
    tables, convs = reach(wide_links)
    weights16 = wide_weights(wide_links)
    if wide_links:
        wide = wide_grids(model, table, asymmetric, lambda name: name not in float_ops, tables=tables, convs=convs)
        narrow = {name: grids[name] for name in wide}
        grids.update(wide)
    steps_ops = [op for op in model.ops if not isinstance(op, (top.NoneOp, top.Input, top.Weight))]
    assert len(steps_ops) == len(interp.steps)

    def quant(name, arr):
        g = grids.get(name)
        return arr if g is None else _fake_quant(arr, g)

    envs_f, envs_q = [], []
    for sample in samples:
        bound = interp._bind(sample)
        envs_f.append(dict(bound))
        envs_q.append({s: quant(n, bound[s]) for n, s, _, _ in interp.inputs})
    consts = interp.consts
    workers = ThreadPoolExecutor(max_workers=pool_size()) if len(samples) > 1 and pool_size() > 1 else None

    def each(fn) -> list:
        """fn(float env, INT8 env) for every sample, in order (the samples on the worker threads:
        numpy and TensorFlow let go of the interpreter lock in their kernels)."""
        if workers is None:
            return [fn(ef, eq) for ef, eq in zip(envs_f, envs_q)]
        return list(workers.map(fn, envs_f, envs_q))

    qweights: dict[int, np.ndarray] = {}
    corrections: dict[str, np.ndarray] = {}
    refits: dict[str, tuple] = {}
    skipped: dict[str, str] = {}
    rows = []
    try:
        for k, ((kernel, ins, outs, attrs, op_name, loc), op) in enumerate(zip(interp.steps, steps_ops)):
            weighted = isinstance(op, (top.Conv, top.Deconv, top.MatMul))
            why = None
            in_float = op.loc in float_ops
            # operands this INT8 op reads through a link's cast to 8 bits
            narrowed = [] if op.loc in float_ops else \
                [(i, narrow[interp.names[s]]) for i, (s, v) in enumerate(zip(ins, op.operands))
                 if s is not None and interp.names.get(s) in narrow
                 and not reads_link(op, v, narrow, tables, convs)]

            def wide(w, b) -> bool:
                """Whether the lowering gives this conv 16-bit weights `w` (asked for, and its
                bias `b` fits int32 at their scale on the grid its input is read on)."""
                if op.loc not in weights16 or not isinstance(op, top.Conv):
                    return False
                grid = dict(narrowed).get(0) or grids.get(interp.names.get(ins[0]))
                if b is None or grid is None:
                    return True
                return P.wide_bias_fits(b, grid.scale, P.weights_per_channel(w, _conv_axis(op), True)[1])

            if weighted:
                why = "left as given" if op.loc in fixed else _why_not(op, model, table)
                if why is None and not in_float:
                    wq = qweights.get(ins[1])
                    if wq is None:
                        wq = _quantized_weight(op, consts[ins[1]], wide(
                            consts[ins[1]], consts[ins[2]] if len(ins) > 2 and ins[2] is not None else None))
                        if wq is None:
                            why = "its weights are not float"
                        else:
                            qweights[ins[1]] = wq
                if why is not None:
                    skipped[op.loc] = why
            correct = weighted and why is None
            run_attrs = dict(attrs, do_relu=False) if correct else attrs
            bias_q = None
            w_used = qweights.get(ins[1]) if correct and not in_float else None   # the weights it computes with
            if correct and refit and _refittable(op, model):
                w = consts[ins[1]]
                b = consts[ins[2]] if ins[2] is not None else np.zeros(w.shape[0], w.dtype)
                fit = Fit(w, b, attrs)

                def gather(ef, eq):
                    x_q = eq[ins[0]] if ins[0] in eq else consts[ins[0]]
                    for i, grid in narrowed:
                        if i == 0:
                            x_q = _fake_quant(x_q, grid)
                    return fit.products(ef[ins[0]] if ins[0] in ef else consts[ins[0]], x_q)

                for products in each(gather):
                    fit.add(products)
                w_fit, b_fit = fit.solve()
                w_fit = w_fit.astype(w.dtype)
                sixteen = wide(w_fit, b_fit)
                if rounding == "gptq" and not in_float and not sixteen and fit.determined:
                    w_fit, b_fit = fit.rounded(w_fit, b_fit)
                w_used = w_fit if in_float else _quantized_weight(op, w_fit, sixteen)
                bias_q = b_fit.astype(np.float32)
                refits[op.loc] = (w_fit, b_fit)
            def run(ef, eq):
                """The op on one sample, float and simulated INT8: (mean-shift sums, counts, INT8
                output before its activation) where it is corrected, else its outputs stored."""
                got_f = kernel([None if s is None else (ef[s] if s in ef else consts[s]) for s in ins], run_attrs)
                args_q = [None if s is None else (eq[s] if s in eq else consts[s]) for s in ins]
                for i, grid in narrowed:
                    args_q[i] = _fake_quant(args_q[i], grid)
                if correct and w_used is not None:
                    args_q[1] = w_used
                if bias_q is not None:
                    args_q[2] = bias_q
                got_q = kernel(args_q, run_attrs)
                if correct:
                    pre_f, pre_q = np.asarray(got_f[0]), np.asarray(got_q[0])
                    ef[outs[0]] = post_relu(pre_f.copy(), attrs)
                    if bias_q is not None:              # (the refit's bias has the mean in it already)
                        return None, None, pre_q
                    axis = _channel_axis(op, pre_f.ndim)
                    reduce = tuple(a for a in range(pre_f.ndim) if a != axis)
                    diff = pre_q.astype(np.float64) - pre_f
                    slope = _slope(op, attrs, pre_f, model)
                    if slope is not None:               # weighted by how much of it the activation passes on
                        d, c = (slope * diff).sum(axis=reduce), slope.sum(axis=reduce)
                    else:
                        d, c = diff.sum(axis=reduce), pre_f.size // pre_f.shape[axis]
                    return d, np.broadcast_to(c, d.shape).astype(np.float64), pre_q
                for s, r in zip(outs, got_f):
                    ef[s] = r
                for s, r in zip(outs, got_q):
                    eq[s] = quant(interp.names[s], r) if op.loc not in float_ops else r
                return None

            ran = each(run)
            if correct:
                sums, counts, pres_q = (list(r) for r in zip(*ran))
                step = grids[interp.names[outs[0]]].scale
                if bias_q is not None:          # the refit's bias has the mean in it already
                    delta = np.zeros(pres_q[0].shape[_channel_axis(op, pres_q[0].ndim)])
                else:   # on a grid of 1/1024 output step: last-bit noise of the CPU's float kernels moves no byte
                    delta = np.rint(_shrunk_mean(np.array(sums), np.array(counts)) * (GRID / step)) * (step / GRID)
                shape = [1] * pres_q[0].ndim
                shape[_channel_axis(op, pres_q[0].ndim)] = -1
                dd = delta.reshape(shape).astype(pres_q[0].dtype)
                for eq, pre_q in zip(envs_q, pres_q):
                    out_q = post_relu(pre_q - dd if bias_q is None else pre_q, attrs)
                    eq[outs[0]] = out_q if in_float else quant(interp.names[outs[0]], out_q)
                if np.any(delta):
                    corrections[op.loc] = delta
                if bias_q is None:
                    rows.append({"name": op.loc, "op": op.name, "channels": int(delta.size), "float": in_float,
                                 "mean_steps": float(np.mean(np.abs(delta)) / step),
                                 "max_steps": float(np.max(np.abs(delta)) / step)})
            for s in interp.free_after[k]:
                for env in envs_f + envs_q:
                    env.pop(s, None)
    finally:
        if workers is not None:
            workers.shutdown()
    corrected = _apply(model, corrections, refits)
    return corrected, BiasCorrection(rows, len(samples), time.perf_counter() - t0, skipped, refit=len(refits),
                                     rounding=rounding if refits else "nearest")


def _slope(op, attrs: dict, y: np.ndarray, model: TopModel) -> np.ndarray | None:
    """|d act / dy| of the ReLU-like activation `op`'s output goes through (fused, or its only
    reader), at the float output `y`; None when there is none (every position counts alike).
    A bias shift moves what follows by this much, so the mean error is weighted by it: where a
    ReLU cuts the output, its error does not matter."""
    def window(lo, hi):
        return ((y > lo) & (y < hi)).astype(np.float64)

    if attrs.get("do_relu", False):
        lim = float(attrs.get("relu_limit", -1.0) or -1.0)
        return window(0.0, lim if lim >= 0 else np.inf)
    uses = list(op.results[0].uses)
    if len(uses) != 1 or uses[0].index != 0:
        return None
    user = uses[0].operation
    if isinstance(user, top.Relu):
        lim = float(user.attrs().get("relu_limit", -1.0) or -1.0)
        return window(0.0, lim if lim >= 0 else np.inf)
    if isinstance(user, top.Clip):
        a = user.attrs()
        return window(float(a["min"]), float(a["max"]))
    if isinstance(user, top.LeakyRelu):
        return np.where(y >= 0, 1.0, abs(float(user.attrs()["alpha"])))
    if isinstance(user, top.PRelu) and isinstance(user.operands[1].owner, top.Weight):
        k = np.abs(np.asarray(model.weights[user.operands[1].owner.key], np.float64))
        try:
            return np.where(y > 0, 1.0, np.broadcast_to(k, y.shape))
        except ValueError:
            return None
    return None


def _shrunk_mean(sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per channel, the mean difference over all samples (`sums`, `counts`: [sample, channel]),
    shrunk towards 0 by how much it varies from sample to sample: `m * m^2 / (m^2 + se^2)`,
    `se` the standard error of the per-sample means. A shift every sample shows is taken whole;
    one that depends on the image (and would not hold on the next) is mostly left alone."""
    total = counts.sum(axis=0)
    mean = sums.sum(axis=0) / np.maximum(total, 1)
    seen = counts > 0
    n = seen.sum(axis=0)
    per = np.where(seen, sums / np.maximum(counts, 1), 0.0)
    var = np.where(seen, (per - mean) ** 2, 0.0).sum(axis=0) / np.maximum(n - 1, 1)
    se2 = np.where(n > 1, var / np.maximum(n, 1), np.inf)
    m2 = mean ** 2
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        out = np.where(m2 > 0, mean * m2 / (m2 + se2), 0.0)
    return np.where(np.isfinite(out), out, 0.0)


def _apply(model: TopModel, corrections: dict[str, np.ndarray], refits: dict | None = None) -> TopModel:
    """A copy of `model` whose ops named in `corrections` have `bias - correction` as bias, and
    those in `refits` (name -> (weights, bias)) those weights and that bias before it."""
    copy = model.copy()
    block = copy.func.body.block
    refits = refits or {}
    for op in copy.ops:
        if not isinstance(op, (top.Conv, top.Deconv, top.MatMul)):
            continue
        delta, fitted = corrections.get(op.loc), refits.get(op.loc)
        if delta is None and fitted is None:
            continue
        if fitted is not None:
            copy.weights[op.operands[1].owner.key] = fitted[0]
        b = op.operands[2]
        if isinstance(b.type, NoneType):
            n = op.results[0].type.get_shape()[_channel_axis(op, len(op.results[0].type.get_shape()))]
            old, shape, dtype = np.zeros(n, np.float32), (n,), np.float32
        else:
            old = np.asarray(copy.weights[b.owner.key])
            shape, dtype = old.shape, old.dtype
        if fitted is not None:
            old = fitted[1].reshape(shape)
        delta = np.zeros(old.size) if delta is None else delta
        new = (old.astype(np.float64).reshape(-1) - delta).astype(dtype).reshape(shape)
        if not isinstance(b.type, NoneType) and len(list(b.uses)) == 1:
            copy.weights[b.owner.key] = new                  # its own weight: a new array under its key
            continue
        key = unique_name(f"{op.loc}_bias_corrected", copy.weights)
        copy.weights[key] = new
        w = top.Weight.create(result_types=[A.tensor_type(shape, A.dtype_of_numpy(np.dtype(dtype)))])
        top.set_loc(w, key)
        block.insert_op_before(w, op)
        op.operands = [op.operands[0], op.operands[1], w.results[0]]
    return copy
