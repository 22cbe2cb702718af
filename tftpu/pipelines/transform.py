"""The `tftpu-transform` job as a library call: import, canonicalize, convert layout, save, verify.

>>> result = transform("face.tflite", name="face", test_input={"input": x})   # doctest: +SKIP
>>> result.passed, result.worst.cosine                                       # doctest: +SKIP
(True, 0.9999999999996)
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

from tftpu import errors


@dataclasses.dataclass
class TransformResult:
    """What `transform` wrote and what its check found."""

    model: object                         # tftpu.ir.module.TopModel
    mlir: Path
    weights: Path
    ops_before: int                       # ops imported, before canonicalization
    canonicalize_report: object
    layout_report: object | None
    seconds: float
    checks: list = dataclasses.field(default_factory=list)   # (reference name, Comparison)
    passes: list = dataclasses.field(default_factory=list)   # each pass's PassResult, in order

    @property
    def rows(self) -> list:
        return [row for _, result in self.checks for row in result.rows]

    @property
    def failed(self) -> list:
        return [row for row in self.rows if not row.passed]

    @property
    def passed(self) -> bool:
        return bool(self.rows) and not self.failed

    @property
    def worst(self):
        return min(self.rows, key=lambda r: (r.cosine, r.euclid)) if self.rows else None


def default_passes(layout: str | None = None) -> str:
    """The pipeline `transform` runs: canonicalize, then (given a layout) convert and fold."""
    return "canonicalize" + (f",convert-layout{{layout={layout}}},canonicalize" if layout else "")


def transform(model_def, *, name: str | None = None, input_shapes=None, layout: str | None = None,
              mlir=None, test_input: dict | None = None, test_result=None,
              tolerance=(0.99, 0.99), passes: str | None = None) -> TransformResult:
    """Import `model_def` into TOP, run `passes` (a pipeline string; default: canonicalize, then
    convert to `layout` when given), save it; with a `test_input`, compare every tensor TOP
    shares with onnxruntime, and the outputs with the source framework (TFLite/Keras/SavedModel),
    writing TOP's tensors to `test_result`. A test input that does not fit the model is refused
    before anything is written."""
    from tftpu.frontend import EXPORTED_AT_SHAPES, source_kind, to_onnx
    from tftpu.frontend.check import compare, onnx_tensors, tf_outputs
    from tftpu.frontend.onnx_to_top import onnx_to_top
    from tftpu.ir.weights import save_npz
    from tftpu.transforms.pipeline import parse_pipeline, run_pipeline

    if layout and layout not in ("NCHW", "NHWC"):
        raise errors.UsageError(f"layout must be NCHW or NHWC, not {layout!r}")
    if passes and layout:
        raise errors.UsageError("give either a layout or a pass pipeline (with convert-layout in it), not both")
    pipeline = parse_pipeline(passes or default_passes(layout))
    kind = source_kind(model_def)
    if kind == "mlir":
        raise errors.UsageError(f"{model_def}: an .mlir (tftpu's own TOP or TPU module) is not a source to import; "
                                "tftpu-transform imports .onnx, .tflite, Keras and SavedModel models (run or "
                                "deploy an .mlir instead)")
    name = name or Path(str(model_def)).stem
    t0 = time.perf_counter()
    proto = to_onnx(model_def, input_shapes)
    model = onnx_to_top(proto, name, None if kind in EXPORTED_AT_SHAPES else input_shapes,
                        where=str(model_def) if kind == "onnx" and isinstance(model_def, (str, Path)) else None)
    ops_before = len(model.ops)
    results = run_pipeline(model, pipeline)
    report = next((r.detail for r in results if r.name == "canonicalize"), None)
    layout_report = next((r.detail for r in results if r.name == "convert-layout"), None)
    got = None
    for key, arr in (test_input or {}).items():
        arr = np.asarray(arr)
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            raise errors.UsageError(f"test input {key!r} holds {int((~np.isfinite(arr)).sum())} NaN/Inf value(s): "
                                    f"a check on it would prove nothing")
    if test_input is not None:
        from tftpu.interp.top_interpreter import run

        got = run(model, test_input, dump_all=True)      # a wrong input fails here, before any write
    mlir_path, weight_path = model.save(Path(mlir or f"{name}.top.mlir"))
    result = TransformResult(model, mlir_path, weight_path, ops_before, report, layout_report,
                             time.perf_counter() - t0, passes=results)
    if test_input is None:
        return result
    if test_result:
        save_npz(test_result, got)
    result.checks.append(("onnxruntime", compare(onnx_tensors(proto, test_input), got, tolerance)))
    if kind != "onnx":
        src = tf_outputs(model_def, kind, test_input, [o.name for o in proto.graph.output])
        outputs = {k: np.asarray(got[k]) for k in model.output_names if k in got}
        result.checks.append((kind, compare(src, outputs, tolerance)))
    return result
