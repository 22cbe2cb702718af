"""INT8 TPU inference throughput against onnxruntime float and onnxruntime's own INT8, batch 1,
plus deploy time per stage and calibration images/s (issue 12 target: INT8 >= 0.5x of
onnxruntime float).

    python benchmarks/tpu_inference.py [--models ResNet50,MobileNetV2] [--size 224] [--runs 10]
    python benchmarks/tpu_inference.py --wide_links convs     # every conv reads 16 bits (W8A16)

All sides run the same ONNX export of keras.applications (weights=None) in one process, timed
in alternating blocks (`benchmarks/top_inference.py`'s `throughputs`). tftpu's side is the
model deployed for npu1 in INT8 (calibrated with mse on --calib random-uniform inputs, pure
INT8, no mixed precision; `--wide_links convs`: every conv reading its data on 16 bits, two INT8
passes over the bytes), run by the TPU interpreter with exact integer arithmetic. The
peers: onnxruntime float32 on the ONNX model, and onnxruntime on the model quantized by its
own `quantize_static` (QDQ, per-channel weights, the same calibration inputs).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from top_inference import throughputs  # noqa: E402


def ort_session(model_bytes: bytes):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.add_session_config_entry("session.set_denormal_as_zero", "1")
    so.add_session_config_entry("session.force_spinning_stop", "1")
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


def ort_int8(proto, samples: list[dict]) -> bytes:
    """onnxruntime's own static INT8 (QDQ, per-channel) of `proto`, calibrated on `samples`."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(samples)

        def get_next(self):
            return next(self.it, None)

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "f32.onnx", Path(tmp) / "int8.onnx"
        onnx.save(proto, src)
        quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
        return dst.read_bytes()


def machine_line() -> str:
    """Which native INT8 build tftpu runs here, and whether onnxruntime may run wider vector code
    (a build forced below the CPU's best with TFTPU_ISA: onnxruntime cannot be held back likewise,
    so the ratios then understate what an AVX2-only CPU shows)."""
    import onnxruntime as ort

    from tftpu.utils import isa, native

    build, flags = native.chosen_isa(), native.cpu_flags()
    best = isa.supported(flags)[0] if isa.is_x86() else build
    wide = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "baseline"
    note = f"; onnxruntime runs its {wide} kernels (forced: TFTPU_ISA={build}, this CPU's best is {best})" \
        if build != best else ""
    return f"tftpu native INT8 kernels: {build} build; onnxruntime {ort.__version__}{note}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="ResNet50,MobileNetV2")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--calib", type=int, default=8, help="calibration inputs")
    ap.add_argument("--chip", default="npu1")
    ap.add_argument("--wide_links", default="auto", choices=["auto", "convs"],
                    help="deploy's wide_links: convs = every conv reads a 16-bit link (W8A16)")
    args = ap.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    from tftpu import frontend, quant
    from tftpu.interp.tpu import TpuInterpreter
    from tftpu.pipelines.deploy import deploy

    print(machine_line(), flush=True)
    print(f"{'model':<12} {'ORT f32 img/s':>14} {'ORT INT8 img/s':>15} {'TPU INT8 img/s':>15} "
          f"{'vs ORT f32':>11} {'vs ORT INT8':>12}")
    for name in args.models.split(","):
        km = getattr(keras.applications, name)(weights=None, input_shape=(args.size, args.size, 3))
        t0 = time.perf_counter()
        proto = frontend.to_onnx(km)
        top = frontend.load(proto, name=name)
        t_import = time.perf_counter() - t0
        rng = np.random.default_rng(0)
        inp = top.input_names[0]
        shape = top.func.function_type.inputs.data[0].get_shape()
        samples = [{inp: rng.uniform(-1, 1, shape).astype(np.float32)} for _ in range(args.calib)]
        t0 = time.perf_counter()
        table = quant.calibrate(top, samples, "mse")
        t_cal = time.perf_counter() - t0
        result = deploy(top, quantize="INT8", chip=args.chip, calibration_table=table, test_input=samples[0],
                        mixed_precision="none", **({"wide_links": "convs"} if args.wide_links == "convs" else {}))
        run = TpuInterpreter(result.model).run
        f32 = ort_session(proto.SerializeToString())
        ort_name = f32.get_inputs()[0].name
        i8 = ort_session(ort_int8(proto, [{ort_name: s[inp]} for s in samples]))
        x = {inp: samples[0][inp]}
        feed = {ort_name: samples[0][inp]}
        tp_f32, tp_i8, tp_tpu = throughputs([lambda: f32.run(None, feed), lambda: i8.run(None, feed),
                                             lambda: run(x)], args.runs)
        print(f"{name:<12} {tp_f32:>14.2f} {tp_i8:>15.2f} {tp_tpu:>15.2f} {tp_tpu / tp_f32:>10.2f}x "
              f"{tp_tpu / tp_i8:>11.2f}x", flush=True)
        stages = {"import (tf2onnx + TOP)": t_import, "calibrate": t_cal, **result.seconds}
        print("    deploy stages: " + ", ".join(f"{k} {v:.2f} s" for k, v in stages.items())
              + f"; calibration {args.calib / t_cal:.1f} images/s; output cosine vs TOP "
              f"{result.outputs[0].cosine:.5f}", flush=True)


if __name__ == "__main__":
    main()
