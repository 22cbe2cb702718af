"""tftpu's INT8 ranges for TensorFlow's quantizer: replace the min/max TFLite's calibrator records.

TF's post-training quantization first calibrates (the float `.tflite` gets each activation's
observed min/max in its `quantization` table), then `mlir_quantize` turns those ranges into
scales and zero points. Here the calibrated float model is run on the same representative
samples with every tensor kept; each float activation's |x| histogram gives tftpu's threshold
`t` (`tftpu.quant.thresholds`: mse, kl, percentile, minmax) and the recorded range becomes
`[max(min, -t), min(max, t)]`: outliers clip, a one-sided range (ReLU's) stays one-sided, and
TF's own quantizer then writes the INT8 model. Model inputs keep their observed range (an
input clipped is information lost before the first op). Tensors are matched by index in the
one flatbuffer, so there is no name mapping to get wrong.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tftpu import errors
from tftpu.lite import runtime
from tftpu.quant.calibrate import BINS
from tftpu.quant.thresholds import METHODS, threshold
from tftpu.tac import tflite_io

__all__ = ["METHODS", "RangeChange", "tftpu_ranges", "replace_ranges", "check_method"]


@dataclasses.dataclass(frozen=True)
class RangeChange:
    """One activation: TFLite's recorded range, tftpu's threshold and the range written."""

    index: int
    name: str
    tflite: tuple[float, float]
    threshold: float
    written: tuple[float, float]

    @property
    def clipped(self) -> bool:
        return self.written != self.tflite


def check_method(method: str) -> str:
    if method not in METHODS:
        raise errors.UsageError(f"calibration_method {method!r}: expected one of {', '.join(METHODS)}")
    return method


def _feed(interp, sample, inputs) -> None:
    """Set one representative sample (TF's forms: list, dict by name, (signature, dict))."""
    if isinstance(sample, tuple) and len(sample) == 2 and isinstance(sample[1], dict):
        sample = sample[1]
    if isinstance(sample, dict):
        detail = interp.get_signature_list()
        key = next(iter(detail)) if detail else None
        if key is None:
            raise errors.UsageError("representative_dataset yields dicts but the model has no signature")
        runner_inputs = interp.get_signature_runner(key).get_input_details()
        for name, d in runner_inputs.items():
            if name not in sample:
                raise errors.UsageError(f"representative sample lacks input {name!r} "
                                        f"(it has {', '.join(sorted(sample))})")
            interp.set_tensor(d["index"], np.asarray(sample[name], d["dtype"]))
        return
    arrays = list(sample) if isinstance(sample, (list, tuple)) else [sample]
    if len(arrays) != len(inputs):
        raise errors.UsageError(f"representative sample has {len(arrays)} arrays, the model {len(inputs)} inputs")
    for d, x in zip(inputs, arrays):
        x = np.asarray(x)
        if tuple(x.shape) != tuple(d["shape"]):
            raise errors.ShapeError(f"representative sample for input {d['name']!r}: shape {list(x.shape)}, "
                                    f"the model wants {list(map(int, d['shape']))}")
        interp.set_tensor(d["index"], x.astype(d["dtype"]))


def _activations(model) -> dict[int, tuple[str, float, float]]:
    """Float activations of subgraph 0 that TF's calibrator gave a range: index -> (name, min, max)."""
    sg = model.subgraphs[0]
    inputs = set(int(i) for i in (sg.inputs if sg.inputs is not None else []))
    out = {}
    for i, t in enumerate(sg.tensors or []):
        q = t.quantization
        if q is None or q.min is None or q.max is None or len(q.min) != 1 or i in inputs:
            continue
        data = model.buffers[t.buffer].data if t.buffer > 0 else None
        if t.type != 0 or (data is not None and len(data)):   # 0: FLOAT32; constants are weights
            continue
        name = t.name.decode("utf-8", "replace") if isinstance(t.name, bytes) else str(t.name)
        out[i] = (name, float(q.min[0]), float(q.max[0]))
    return out


def tftpu_ranges(calibrated: bytes, dataset_gen, method: str, bins: int = BINS) -> list[RangeChange]:
    """tftpu's range for every calibrated activation of `calibrated` (TF's calibrate-only output)."""
    check_method(method)
    model = tflite_io.read(calibrated)
    acts = _activations(model)
    interp = runtime.interpreter(calibrated, preserve_all_tensors=True)
    inputs = runtime.input_details(interp)
    absmax = {i: 0.0 for i in acts}
    lo_seen = {i: np.inf for i in acts}
    hi_seen = {i: -np.inf for i in acts}
    count = 0
    for sample in dataset_gen():
        _feed(interp, sample, inputs)
        interp.invoke()
        for i in acts:
            a = interp.get_tensor(i)
            if a.size:
                lo_seen[i] = min(lo_seen[i], float(a.min()))
                hi_seen[i] = max(hi_seen[i], float(a.max()))
                absmax[i] = max(absmax[i], -lo_seen[i], hi_seen[i])
        count += 1
    if not count:
        raise errors.InputError("the representative dataset gave no samples")
    hists = {i: np.zeros(bins, np.int64) for i in acts}
    signed = {i: np.zeros(bins, np.int64) for i in acts}
    for sample in dataset_gen():
        _feed(interp, sample, inputs)
        interp.invoke()
        for i in acts:
            if absmax[i] > 0:
                mags = np.abs(interp.get_tensor(i).astype(np.float64)).ravel()
                hists[i] += np.histogram(mags[mags != 0], bins, (0.0, absmax[i]))[0]
                if method == "mse" and hi_seen[i] > lo_seen[i]:
                    signed[i] += np.histogram(interp.get_tensor(i).astype(np.float64).ravel(), bins,
                                              (lo_seen[i], hi_seen[i]))[0]
    changes = []
    for i, (name, lo, hi) in acts.items():
        if method == "minmax":
            t, written = max(-lo, hi), (lo, hi)          # TFLite's own ranges, untouched
        elif method == "mse" and hi_seen[i] > lo_seen[i]:
            written = asymmetric_mse(signed[i], lo_seen[i], hi_seen[i], lo, hi)
            t = max(-written[0], written[1])
        else:
            t = threshold(method, hists[i], absmax[i]) if absmax[i] > 0 else 0.0
            written = (lo, hi) if t <= 0 else (max(lo, -t), min(hi, t))
        changes.append(RangeChange(i, name, (lo, hi), float(t), (float(written[0]), float(written[1]))))
    return changes


def asymmetric_mse(hist: np.ndarray, lo: float, hi: float, tf_lo: float, tf_hi: float,
                   levels: int = 255) -> tuple[float, float]:
    """The clip range [a, b] (bin edges, 0 inside) of least expected squared error on TFLite's
    asymmetric INT8 grid: rounding noise ((b - a) / 255)^2 / 12 for the values inside, (x - a)^2
    or (x - b)^2 for those clipped, x at its bin's centre; TF's own range when nothing beats it."""
    n = len(hist)
    width = (hi - lo) / n
    edges = lo + np.arange(n + 1) * width
    centre = edges[:-1] + width / 2
    h = hist.astype(np.float64)
    c0 = np.concatenate([[0.0], np.cumsum(h)])                  # counts below edge k
    c1 = np.concatenate([[0.0], np.cumsum(h * centre)])
    c2 = np.concatenate([[0.0], np.cumsum(h * centre ** 2)])
    zero = int(np.clip(np.searchsorted(edges, 0.0), 0, n))
    ka = np.arange(0, zero + 1)                                 # a = edges[ka] <= 0
    kb = np.arange(max(zero, 1), n + 1)                         # b = edges[kb] >= 0
    a, b = edges[ka][:, None], edges[kb][None, :]
    below = c2[ka][:, None] - 2 * a * c1[ka][:, None] + a * a * c0[ka][:, None]
    above = (c2[n] - c2[kb])[None, :] - 2 * b * (c1[n] - c1[kb])[None, :] + b * b * (c0[n] - c0[kb])[None, :]
    inside = (c0[kb][None, :] - c0[ka][:, None])
    err = inside * ((b - a) / levels) ** 2 / 12.0 + below + above
    full = inside[0, -1] * ((tf_hi - tf_lo) / levels) ** 2 / 12.0
    i, j = np.unravel_index(int(np.argmin(err)), err.shape)
    if err[i, j] >= full:
        return (tf_lo, tf_hi)
    return (float(min(a[i, 0], 0.0)) if ka[i] > 0 else tf_lo, float(b[0, j]) if kb[j] < n else tf_hi)


def replace_ranges(calibrated: bytes, changes: list[RangeChange]) -> bytes:
    """`calibrated` with each activation's recorded min/max replaced by tftpu's."""
    model = tflite_io.read(calibrated)
    acts = _activations(model)
    sg = model.subgraphs[0]
    for c in changes:
        if c.index in acts:
            i = c.index
            q = sg.tensors[i].quantization
            q.min = [np.float32(c.written[0])]
            q.max = [np.float32(c.written[1])]
    return tflite_io.write(model)


def summary(changes: list[RangeChange], method: str) -> dict:
    """The report's view: how many ranges tftpu narrowed, and each one."""
    return {"method": method, "activations": len(changes),
            "clipped": sum(c.clipped for c in changes),
            "ranges": [{"tensor": c.name, "tflite": list(c.tflite), "threshold": c.threshold,
                        "written": list(c.written)} for c in changes]}
