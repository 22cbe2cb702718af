"""Simulated INT8 inference: what a calibration table costs in accuracy, before deployment.

The INT8 arithmetic is simulated in float (fake quantization): every tensor in the table is
rounded to the nearest of the 255 levels of [-t, t] (and clipped) as it is produced, and the
weights of Conv and MatMul are quantized symmetrically per output channel with their own
largest |w|, as an INT8 deployment would. Biases stay float (INT32 in a deployment). This is an
estimate of accuracy, not the bit-exact integer inference of a compiled model.

>>> report = evaluate(model, table, samples)  # doctest: +SKIP
>>> print(report)                             # per output: worst cosine, mean SQNR vs float
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from tftpu.interp.similarity import cosine_similarity, sqnr
from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.ir import top
from tftpu.ir.module import TopModel

__all__ = ["fake_quant", "fake_quant_asymmetric", "quantize_weights", "simulate", "evaluate", "Evaluation"]

QMAX = 127


def fake_quant(x: np.ndarray, threshold, axis: int | None = None) -> np.ndarray:
    """x rounded to the symmetric INT8 grid of `threshold` (per `axis` when it is an array)."""
    t = np.asarray(threshold, np.float64)
    if axis is not None:
        shape = [1] * x.ndim
        shape[axis] = -1
        t = t.reshape(shape)
    step = np.where(t > 0, t / QMAX, 1.0)
    q = np.clip(np.rint(x / step), -QMAX, QMAX) * step
    return np.where(t > 0, q, x).astype(x.dtype, copy=False)


def fake_quant_asymmetric(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """x rounded to the 256-level asymmetric INT8 grid of [lo, hi] (zero point an integer, so 0 stays exact)."""
    lo, hi = float(lo), float(hi)
    if not hi > lo:
        return x
    scale = (hi - lo) / 255.0
    zp = float(np.clip(np.rint(-128.0 - lo / scale), -128, 127))
    q = np.clip(np.rint(x / scale) + zp, -128, 127)
    return ((q - zp) * scale).astype(x.dtype, copy=False)


def _weight_axis(op) -> tuple[object, int] | None:
    """(weight operand, output-channel axis) of an op whose weights an INT8 deployment quantizes."""
    if isinstance(op, top.Conv):
        return op.filter, 0 if op.attrs()["kernel_layout"] == "OIHW" else -1
    if isinstance(op, top.MatMul):
        return op.right, -2 if op.attrs()["right_transpose"] else -1
    return None


def quantize_weights(model: TopModel) -> TopModel:
    """The same module with its Conv/MatMul weights fake-quantized per output channel."""
    weights = dict(model.weights)
    for op in model.ops:
        found = _weight_axis(op)
        if found is None or not isinstance(found[0].owner, top.Weight):
            continue
        name = found[0].owner.loc
        w = np.asarray(model.weights[name])
        if w.dtype.kind != "f" or w.ndim < 2:
            continue
        axis = found[1] % w.ndim
        reduce = tuple(a for a in range(w.ndim) if a != axis)
        weights[name] = fake_quant(w, np.abs(w).max(axis=reduce), axis)
    return TopModel(model.module, weights)


def _observer(table):
    """An `observe` hook that fake-quantizes each activation on its `table` entry."""
    entries = table.entries
    asymmetric = getattr(table, "asymmetric", False)

    def observe(name, arr):
        e = entries.get(name)
        if e is None or arr.dtype.kind != "f":
            return arr
        return fake_quant_asymmetric(arr, e[1], e[2]) if asymmetric else fake_quant(arr, e[0])
    return observe


def simulate(model: TopModel, table, samples: list[dict]) -> list[dict[str, np.ndarray]]:
    """Outputs of `model` with INT8-quantized weights and activations (from `table`), per sample.

    Activations are symmetric on each threshold, or asymmetric on each [min, max] when the table
    is asymmetric.
    """
    observe = _observer(table)
    interp = TopInterpreter(quantize_weights(model))
    return [interp.run(sample, observe=observe) for sample in samples]


@dataclasses.dataclass
class Evaluation:
    """Per model output: the worst cosine and the mean SQNR (dB) of INT8 against float."""

    rows: dict[str, tuple[float, float]]
    samples: int

    def __str__(self) -> str:
        return "; ".join(f"{name}: cosine >= {cos:.6f}, SQNR {snr:.1f} dB" for name, (cos, snr) in self.rows.items())


def evaluate(model: TopModel, table, samples) -> Evaluation:
    """Simulated INT8 outputs against the float ones over `samples` (a list, or any iterable
    such as `tftpu.quant.iter_samples`, read once, one sample at a time)."""
    ref, quant = TopInterpreter(model), TopInterpreter(quantize_weights(model))
    observe = _observer(table)
    cos: dict[str, list] = {name: [] for name in model.output_names}
    snr: dict[str, list] = {name: [] for name in model.output_names}
    count = 0
    for count, sample in enumerate(samples, 1):
        f, q = ref.run(sample), quant.run(sample, observe=observe)
        for name in model.output_names:
            cos[name].append(cosine_similarity(f[name], q[name]))
            snr[name].append(sqnr(f[name], q[name]))
    if count == 0:
        from tftpu.errors import InputError
        raise InputError("evaluation needs at least one sample input")
    rows = {}
    for name in model.output_names:
        finite = [v for v in snr[name] if math.isfinite(v)]
        rows[name] = (min(cos[name]), float(np.mean(finite)) if finite else math.inf)
    return Evaluation(rows, count)
