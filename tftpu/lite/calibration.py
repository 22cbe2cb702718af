"""tftpu's INT8 ranges for TensorFlow's quantizer: replace the min/max TFLite's calibrator records.

TF's post-training quantization first calibrates (the float `.tflite` gets each activation's
observed min/max in its `quantization` table), then `mlir_quantize` turns those ranges into
scales and zero points. Here the calibrated float model is run on the same representative
samples with every tensor kept; each float activation gets `tftpu.quant`'s streaming statistics
(`TensorStatistics`: one pass, signed histogram, exact zeros left out), the same code as
`tftpu.quant.calibrate`. `mse` takes the joint asymmetric range of least expected error on a
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
from tftpu.quant.thresholds import METHODS
from tftpu.tac import tflite_io

__all__ = ["METHODS", "RangeChange", "tftpu_ranges", "replace_ranges", "check_method", "summary"]


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
    stats = {i: TensorStatistics(2 * bins) for i in acts}
    count = 0
    for sample in dataset_gen():
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
    changes = []
    for i, (name, lo, hi) in acts.items():
        st = stats[i]
        if method == "minmax" or st.hist is None:
            t, written = max(-lo, hi), (lo, hi)          # TFLite's own ranges, untouched
        else:
            t = st.threshold(method)
            a, b = st.range_of(method) if method == "mse" else (-t, t)
            written = (max(lo, a), min(hi, b))
            if not written[0] < written[1]:
                written = (lo, hi)
        changes.append(RangeChange(i, name, (lo, hi), float(t), (float(written[0]), float(written[1]))))
    return changes


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


def summary(changes: list[RangeChange], method: str) -> dict:
    """The report's view: how many ranges tftpu narrowed, and each one."""
    return {"method": method, "activations": len(changes),
            "clipped": sum(c.clipped for c in changes),
            "ranges": [{"tensor": c.name, "tflite": list(c.tflite), "threshold": c.threshold,
                        "written": list(c.written)} for c in changes]}
