"""tftpu's INT8 ranges for TensorFlow's quantizer: replace the min/max TFLite's calibrator records.

TF's post-training quantization first calibrates (the float `.tflite` gets each activation's
observed min/max in its `quantization` table), then `mlir_quantize` turns those ranges into
scales and zero points. Here the calibrated float model is run on the same representative
samples with every tensor kept; each float activation gets `tftpu.quant`'s streaming statistics
(`TensorStatistics`: one pass, signed histogram, exact zeros left out), the same code as
`tftpu.quant.calibrate`. `mse` (and `tail_mse`) take the joint asymmetric range of least expected error on a
256-level grid (`TensorStatistics.range_of`, i.e. `thresholds.asymmetric_range`), which is
TFLite's INT8 activation grid; the other methods clip at their symmetric threshold t (on
mtcnn O-Net, kl and ACIQ judged each side of zero on its own lose accuracy). The range written
is kept within TF's recorded one; `minmax` writes TF's own ranges back (TFLite's INT8, byte for
byte). Model inputs keep their
observed range (an input clipped is information lost before the first op). Tensors are matched by
index in the one flatbuffer, so there is no name mapping to get wrong.

What TF's quantizer then does with the ranges (so the report can be read right): a same-scale op
(MAX_POOL_2D, RESHAPE, ...) takes its input's scale, so its own written range is not used;
SOFTMAX/LOGISTIC outputs get TFLite's fixed scale; weights, biases and PReLU slopes are TF's.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tftpu import errors
from tftpu.lite import runtime
from tftpu.quant.calibrate import BINS, TensorStatistics
from tftpu.quant.thresholds import CLIP_WEIGHTS, METHODS
from tftpu.tac import tflite_io
from tftpu.utils.progress import progress

__all__ = ["METHODS", "LITE_METHODS", "RangeChange", "tftpu_ranges", "replace_ranges", "check_method", "summary",
           "AUTO_CANDIDATES", "auto_ranges"]

LITE_METHODS = (*METHODS, "auto")
AUTO_CANDIDATES = ("mse", "minmax", "percentile")    # per-tensor choices `auto` weighs


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
    if method not in LITE_METHODS:
        raise errors.UsageError(f"calibration_method {method!r}: expected one of {', '.join(LITE_METHODS)}")
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


def _statistics(calibrated: bytes, dataset_gen, bins: int = BINS, keep: int = 0):
    """(activations, their statistics, the first `keep` samples) over the representative
    samples, in one pass."""
    model = tflite_io.read(calibrated)
    acts = _activations(model)
    interp = runtime.interpreter(calibrated, preserve_all_tensors=True)
    inputs = runtime.input_details(interp)
    stats = {i: TensorStatistics(2 * bins) for i in acts}
    count, kept = 0, []
    for sample in dataset_gen():
        if len(kept) < keep:
            kept.append(sample)
        _feed(interp, sample, inputs)
        interp.invoke()
        for i, st in stats.items():
            a = interp.get_tensor(i)
            if a.size:
                try:
                    st.add(a)
                except ValueError:
                    raise errors.InputError(f"representative sample {count}: tensor {acts[i][0]!r} has "
                                            f"non-finite values (NaN or inf)") from None
        count += 1
    if not count:
        raise errors.InputError("the representative dataset gave no samples")
    return acts, stats, kept


def _changes(acts: dict, stats: dict, method: str) -> list[RangeChange]:
    changes = []
    for i, (name, lo, hi) in acts.items():
        st = stats[i]
        if method == "minmax" or st.hist is None:
            t, written = max(-lo, hi), (lo, hi)          # TFLite's own ranges, untouched
        else:
            t = st.threshold(method)
            a, b = st.range_of(method) if method in CLIP_WEIGHTS else (-t, t)
            written = (max(lo, a), min(hi, b))
            if not written[0] < written[1]:
                written = (lo, hi)
        changes.append(RangeChange(i, name, (lo, hi), float(t), (float(written[0]), float(written[1]))))
    return changes


def tftpu_ranges(calibrated: bytes, dataset_gen, method: str, bins: int = BINS) -> list[RangeChange]:
    """tftpu's range for every calibrated activation of `calibrated` (TF's calibrate-only output)."""
    check_method(method)
    if method == "auto":
        raise errors.InternalError("lite calibration", "auto ranges come from auto_ranges (they need the quantizer)")
    acts, stats, _ = _statistics(calibrated, dataset_gen, bins)
    return _changes(acts, stats, method)


def auto_ranges(calibrated: bytes, dataset_gen, quantize, bins: int = BINS, max_samples: int = 64):
    """`auto`: per activation, the candidate range (`AUTO_CANDIDATES`) that brings the INT8
    model's outputs closest to float, judged end to end through TF's own quantizer
    (`quantize(changes) -> int8 .tflite bytes`) on up to `max_samples` representative samples:
    the best whole-model method first, then one greedy pass that tries each other candidate on
    each tensor (so 3 + 2 x activations quantizations: seconds for small nets, minutes for big
    ones; a progress bar shows on a terminal). The score is the sum over outputs of the largest |INT8 - float| relative to
    the output's range (the worst sample decides), the mean as tie-break.
    Returns (changes, per-tensor method, score)."""
    acts, stats, samples = _statistics(calibrated, dataset_gen, bins, keep=max_samples)
    ref_interp = runtime.interpreter(calibrated)
    ins = runtime.input_details(ref_interp)

    def arrays(sample) -> list:
        if isinstance(sample, tuple) and len(sample) == 2 and isinstance(sample[1], dict):
            sample = sample[1]
        if isinstance(sample, dict):
            return [sample[d["name"]] if d["name"] in sample else next(iter(sample.values())) for d in ins]
        return list(sample) if isinstance(sample, (list, tuple)) else [sample]

    feeds = [arrays(s) for s in samples]
    floats = [runtime.run(ref_interp, f) for f in feeds]
    spans = [max(float(np.max(np.abs(np.stack([o[k] for o in floats])))), 1e-12) for k in range(len(floats[0]))]
    options = {m: {c.index: c for c in _changes(acts, stats, m)} for m in AUTO_CANDIDATES}

    def score(choice: dict) -> tuple:
        model = quantize([options[m][i] for i, m in choice.items()])
        interp = runtime.interpreter(model)
        worst = [0.0] * len(spans)
        total = 0.0
        for f, ref in zip(feeds, floats):
            got = runtime.run(interp, f)
            for k, (a, b) in enumerate(zip(got, ref)):
                d = np.abs(a.astype(np.float64) - b) / spans[k]
                worst[k] = max(worst[k], float(d.max()))
                total += float(d.mean())
        return (sum(worst), total / len(feeds))

    order = list(acts)
    best_choice, best = None, None
    for m in AUTO_CANDIDATES:
        choice = {i: m for i in order}
        got = score(choice)
        if best is None or got < best:
            best_choice, best = choice, got
    for i in progress(order, desc="auto ranges", unit="tensor"):
        for m in AUTO_CANDIDATES:
            if m == best_choice[i]:
                continue
            trial = {**best_choice, i: m}
            got = score(trial)
            if got < best:
                best_choice, best = trial, got
    return [options[m][i] for i, m in best_choice.items()], best_choice, best


def replace_ranges(calibrated: bytes, changes: list[RangeChange]) -> bytes:
    """`calibrated` with each activation's recorded min/max replaced by tftpu's."""
    model = tflite_io.read(calibrated)
    acts = _activations(model)
    sg = model.subgraphs[0]
    for c in changes:
        if c.index in acts:
            q = sg.tensors[c.index].quantization
            q.min = [np.float32(c.written[0])]
            q.max = [np.float32(c.written[1])]
    return tflite_io.write(model)


def summary(changes: list[RangeChange], method: str, chosen: dict | None = None, score=None) -> dict:
    """The report's view: how many ranges tftpu narrowed, and each one (with `auto`, the
    method chosen for it and the end-to-end score reached)."""
    out = {"method": method, "activations": len(changes),
           "clipped": sum(c.clipped for c in changes),
           "ranges": [{"tensor": c.name, "tflite": list(c.tflite), "threshold": c.threshold,
                       "written": list(c.written), **({"chosen": chosen[c.index]} if chosen else {})}
                      for c in changes]}
    if score is not None:
        out["auto_score"] = {"worst_relative_error": round(score[0], 6), "mean_relative_error": round(score[1], 8)}
    return out
