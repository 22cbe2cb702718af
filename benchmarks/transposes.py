"""Transposes left in real models: tf2onnx's own optimizer, onnxsim, and tftpu's ConvertLayout.

    python benchmarks/transposes.py [--models ResNet50,MobileNetV2,...] [--size 96] [--chip npu1]

For keras.applications ResNet50, MobileNetV2, EfficientNetB0, MobileNetV3Small, ConvNeXtTiny (weights=None,
through tf2onnx; PEERS.md: tf2onnx leaves 106 transposes in MobileNetV3Small) and
the mediapipe selfie-segmentation and BlazeFace TFLite models (through tf2onnx's TFLite path),
and MTCNN R-Net/O-Net with real weights (Keras Permute + Flatten + Dense, where tf2onnx's
transpose optimizer gets stuck),
prints per model: Transpose nodes in tf2onnx's output (its transpose optimizer has run), after
onnxsim on the same ONNX, Permute ops in TOP after import + canonicalize, and after ConvertLayout
to NCHW and to NHWC (with how many sit at a model input/output and how many inside), the
worst output cosine of the converted model against the unconverted one (TOP interpreter),
the pass's time against onnxsim's on the same model (same run), and the explicit reorders
the chip config asks for (lane-blocked data for conv/pool/elementwise, plain NCHW rows for
reshapes, softmax and matmul): `tftpu.ir.layout.plan_formats`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the clone's tests.models.mtcnn, from anywhere

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

KERAS = ("ResNet50", "MobileNetV2", "EfficientNetB0", "MobileNetV3Small", "ConvNeXtTiny")
TFLITE = ("selfie_segmentation.tflite", "face_detection_short_range.tflite")
MTCNN = ("mtcnn_rnet", "mtcnn_onet")


def _onnx(name: str, size: int):
    from tftpu.frontend.tf_export import keras_to_onnx, tflite_to_onnx
    if name in KERAS:
        import keras
        keras.utils.set_random_seed(0)
        return keras_to_onnx(getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3)))
    if name in MTCNN:
        from tests.models import mtcnn
        return keras_to_onnx(getattr(mtcnn, name[6:])())
    from tftpu import datasets
    return tflite_to_onnx(datasets.get(name))


def _transposes(proto) -> int:
    return sum(n.op_type == "Transpose" for n in proto.graph.node)


def _onnxsim(proto):
    try:
        import onnxsim
    except ImportError:
        return None, None, None
    t = time.perf_counter()
    simplified, ok = onnxsim.simplify(proto)
    dt = time.perf_counter() - t
    return (_transposes(simplified) if ok else "failed"), dt, onnxsim.__version__ if hasattr(onnxsim, "__version__") else "?"


def _cos(a, b) -> float:
    import numpy as np
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-300))


def measure(name: str, size: int, chip_name: str) -> dict:
    import numpy as np

    from tftpu.frontend.onnx_to_top import onnx_to_top
    from tftpu.interp.top_interpreter import run
    from tftpu.ir import layout as L
    from tftpu.ir.module import TopModel, parse_module
    from tftpu.transforms.canonicalize import canonicalize
    from tftpu.transforms.convert_layout import convert_layout, count_permutes

    proto = _onnx(name, size)
    row = {"model": name.split(".")[0], "nodes": len(proto.graph.node), "tf2onnx": _transposes(proto)}
    row["onnxsim"], row["onnxsim_s"], row["onnxsim_version"] = _onnxsim(proto)
    model = onnx_to_top(proto, row["model"])
    row["top_import"] = count_permutes(model)[0]
    canonicalize(model)
    row["top_canon"] = count_permutes(model)[0]
    rng = np.random.default_rng(0)
    feeds = {}
    for op in model.ops:
        if op.name == "top.Input":
            feeds[op.loc] = rng.standard_normal(tuple(op.output.type.get_shape())).astype(np.float32)
    ref = run(model, feeds)
    chip = L.load_chip(chip_name)
    for target in ("NCHW", "NHWC"):
        new = TopModel(parse_module(model.text()), {k: v.copy() for k, v in model.weights.items()})
        t = time.perf_counter()
        rep = convert_layout(new, layout=target)
        row[f"{target}_s"] = time.perf_counter() - t
        got = run(new, feeds)
        row[f"{target}_cos"] = min(_cos(got[k], ref[k]) for k in ref)
        row[target] = (rep.permutes_after, rep.at_inputs, rep.at_outputs, rep.inside)
        if target == "NHWC":
            row["reorders"] = L.plan_formats(new, chip)
    row["io"] = len(model.input_names) + len(model.output_names)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(KERAS + TFLITE + MTCNN))
    ap.add_argument("--size", type=int, default=96, help="input size of the Keras models")
    ap.add_argument("--chip", default="npu1")
    args = ap.parse_args()
    try:
        import onnxsim  # noqa: F401
    except ImportError:
        print("# onnxsim not installed (pip install -e '.[bench]' adds it): its columns will read '-'", flush=True)
    rows = []
    for name in args.models.split(","):
        t = time.perf_counter()
        rows.append(measure(name, args.size, args.chip))
        print(f"# {name}: measured in {time.perf_counter() - t:.1f} s", flush=True)
    head = (f"{'model':<28}{'nodes':>6}{'tf2onnx':>8}{'onnxsim':>8}{'TOP':>5}{'canon':>6}"
            f"{'->NCHW (in/out/inside)':>24}{'->NHWC (in/out/inside)':>24}{'min cos':>11}"
            f"{'pass/onnxsim time':>19}{f'{args.chip} reorders':>15}")
    print(head)
    for r in rows:
        nchw, nhwc = r["NCHW"], r["NHWC"]
        ratio = "-" if not r["onnxsim_s"] else f"{(r['NCHW_s'] + r['NHWC_s']) / 2 / r['onnxsim_s']:.2f}x"
        print(f"{r['model']:<28}{r['nodes']:>6}{r['tf2onnx']:>8}{'-' if r['onnxsim'] is None else r['onnxsim']:>8}{r['top_import']:>5}"
              f"{r['top_canon']:>6}{f'{nchw[0]} ({nchw[1]}/{nchw[2]}/{nchw[3]})':>24}"
              f"{f'{nhwc[0]} ({nhwc[1]}/{nhwc[2]}/{nhwc[3]})':>24}"
              f"{min(r['NCHW_cos'], r['NHWC_cos']):>11.7f}{ratio:>19}"
              f"{r['reorders'].count:>15}")
    tot = {k: sum(r[k] for r in rows) for k in ("tf2onnx", "top_canon")}
    ours = {t: sum(r[t][0] for r in rows) for t in ("NCHW", "NHWC")}
    sim = "not installed" if not rows or rows[0]["onnxsim_version"] is None else \
        sum(r["onnxsim"] for r in rows if isinstance(r["onnxsim"], int))
    print(f"total transposes: tf2onnx {tot['tf2onnx']}, onnxsim {sim}, TOP canonicalized {tot['top_canon']}, "
          f"ConvertLayout NCHW {ours['NCHW']}, NHWC {ours['NHWC']}; model inputs+outputs "
          f"{sum(r['io'] for r in rows)}")
    if rows and rows[0]["onnxsim_version"]:
        print(f"onnxsim {rows[0]['onnxsim_version']}")
    else:
        print("onnxsim not installed (pip install -e '.[bench]' adds it): its columns read '-'")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
