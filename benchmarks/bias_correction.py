"""What empirical bias correction (`tftpu.quant.bias_correction`) buys in pure INT8, held out.

    python benchmarks/bias_correction.py [--models palm_detection_lite.tflite,rnet,...] [--asymmetric auto|0|1]

Two folds: calibrate (mse) and correct on half of the samples, judge on the other half, then
the other way round. Mediapipe's models and PP-OCRv6_det_small take the 10 skimage photos
(5 / 5), mtcnn R-/O-Net 40 lfw_subset crops (20 / 20, faces and non-faces alike), keras
MobileNetV2 (random weights, no softmax) the 10 photos at 96x96. Each model is lowered to INT8
on npu1 (`mixed_precision="none"`) as it is and corrected, run by the TPU interpreter (exact
integer arithmetic) and compared with the original TOP model: per output the SQNR pooled over
the held-out samples (all their values at once: per-image SQNR means nothing on a segmentation
map that is all background), and the correction's seconds.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PHOTOS = ["chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png", "hubble_deep_field.jpg",
          "camera.png", "coins.png", "page.png", "text.png", "astronaut.png"]
MODELS = ["face_detection_short_range.tflite", "palm_detection_lite.tflite", "selfie_segmentation.tflite",
          "rnet", "onet", "mobilenetv2"]


def photo_input(name, photo):
    from tftpu import datasets
    if name == "palm_detection_lite.tflite":
        return (datasets.image(photo, (192, 192)).astype(np.float32) / 255.0)[None]
    if name == "face_detection_short_range.tflite":
        return (datasets.image(photo, (128, 128)).astype(np.float32) / 127.5 - 1)[None]
    if name == "selfie_segmentation.tflite":
        return (datasets.image(photo, (256, 256)).astype(np.float32) / 255.0)[None]
    if name == "PP-OCRv6_det_small.onnx":
        img = datasets.image(photo, (640, 640))[..., ::-1].astype(np.float32) / 255.0
        img = (img - np.array([0.485, 0.456, 0.406], np.float32)) / np.array([0.229, 0.224, 0.225], np.float32)
        return img.transpose(2, 0, 1)[None].astype(np.float32)
    if name == "mobilenetv2":
        return (datasets.image(photo, (96, 96)).astype(np.float32) / 127.5 - 1)[None]
    raise KeyError(name)


def model_and_folds(name):
    """(TOP model, [(calibration inputs, held-out inputs), ...])."""
    from tftpu import datasets, frontend
    if name in ("rnet", "onet"):
        from tests.models import mtcnn
        x, _ = mtcnn.lfw_inputs(24 if name == "rnet" else 48)
        idx = np.r_[0:10, 100:110, 10:20, 110:120]          # 10 faces + 10 non-faces a side
        xs = [x[i:i + 1] for i in idx]
        top = frontend.load(frontend.to_onnx(getattr(mtcnn, name)()))
        halves = (xs[:20], xs[20:])
    else:
        if name == "mobilenetv2":
            import keras
            keras.utils.set_random_seed(0)
            km = keras.applications.MobileNetV2(weights=None, input_shape=(96, 96, 3), classes=10,
                                                classifier_activation=None)
            top = frontend.load(frontend.to_onnx(km))
        else:
            shapes = [[1, 3, 640, 640]] if name == "PP-OCRv6_det_small.onnx" else None
            top = frontend.load(datasets.get(name), shapes)
        xs = [photo_input(name, p) for p in PHOTOS]
        halves = (xs[0::2], xs[1::2])
    feed = lambda arrs: [{top.input_names[0]: a} for a in arrs]
    return top, [(feed(halves[0]), feed(halves[1])), (feed(halves[1]), feed(halves[0]))]


def measure(name, asymmetric):
    from tftpu import quant
    from tftpu.interp.similarity import sqnr
    from tftpu.interp.top_interpreter import TopInterpreter
    from tftpu.interp.tpu import TpuInterpreter
    from tftpu.quant.bias_correction import correct_biases
    from tftpu.transforms.lowering import lower

    top, folds = model_and_folds(name)
    ref_run = TopInterpreter(top)
    pooled = {k: {n: ([], []) for n in top.output_names} for k in ("plain", "corrected")}
    seconds = []
    for cal, held in folds:
        table = quant.calibrate(top, cal, "mse", asymmetric=bool(asymmetric))
        t0 = time.perf_counter()
        corrected, report = correct_biases(top, table, cal, asymmetric=asymmetric)
        seconds.append(time.perf_counter() - t0)
        refs = [ref_run.run(s) for s in held]
        for key, model in (("plain", top), ("corrected", corrected)):
            tpu = TpuInterpreter(lower(model, "npu1", "INT8", table, asymmetric=asymmetric)[0])
            for s, ref in zip(held, refs):
                got = tpu.run(s, dequantize=True)
                for n in top.output_names:
                    pooled[key][n][0].append(ref[n].ravel())
                    pooled[key][n][1].append(got[n].ravel())
    figures = {k: [sqnr(np.concatenate(a), np.concatenate(b)) for a, b in v.values()] for k, v in pooled.items()}
    cells = ", ".join(f"{p:.2f} -> {c:.2f}" for p, c in zip(figures["plain"], figures["corrected"]))
    print(f"{name} (asymmetric={asymmetric}): SQNR dB {cells}; correction {np.mean(seconds):.1f} s "
          f"({report})", flush=True)


def main(measure=measure, doc=__doc__):
    """`measure(name, asymmetric)` for each model of --models (benchmarks/weight_rounding.py too)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--asymmetric", default="auto", choices=["auto", "0", "1"])
    args = ap.parse_args()
    asym = {"auto": "auto", "0": False, "1": True}[args.asymmetric]
    for name in args.models.split(","):
        measure(name, asym)


if __name__ == "__main__":
    main()
