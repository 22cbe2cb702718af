"""INT8 calibration quality on mtcnn R-Net / O-Net with their real weights, against TFLite.

    python benchmarks/calibration_quality.py [--methods mse,kl,percentile,minmax,aciq_gauss,aciq_laplace,auto]

As PEERS.md measures TFLite: calibrate on 50 faces + 50 non-faces of lfw_subset, evaluate on
all 200. The peer is TFLite's full-integer post-training quantization (TFLiteConverter with the
same 100 calibration inputs, int8 in and out), converted and run in this process. tftpu's side
is each calibration method's table twice: under simulated INT8 (`tftpu.quant.simulate`:
per-channel weights, per-tensor activations) and deployed (`tftpu.pipelines.deploy`, INT8 on
the npu1 chip, pure INT8, run with exact integer arithmetic by the TPU interpreter; symmetric,
and asymmetric with --asymmetric). Printed per method: face/non-face accuracy (float and INT8),
the largest move of the face score, its ratio to TFLite's, and the calibration time.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _tflite_scores(km, calib, images):
    """TFLite full-integer INT8: the face score of each image."""
    import tensorflow as tf
    conv = tf.lite.TFLiteConverter.from_keras_model(km)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = lambda: ([x[None].astype(np.float32)] for x in calib)
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = conv.inference_output_type = tf.int8
    interp = tf.lite.Interpreter(model_content=conv.convert())
    interp.allocate_tensors()
    inp = interp.get_input_details()[0]
    outs = [d for d in interp.get_output_details() if d["shape"][-1] == 2]
    scores = []
    for x in images:
        s, z = inp["quantization"]
        interp.set_tensor(inp["index"], np.clip(np.round(x[None] / s + z), -128, 127).astype(np.int8))
        interp.invoke()
        o = outs[0]
        s, z = o["quantization"]
        scores.append((interp.get_tensor(o["index"]).astype(np.float32)[0, 1] - z) * s)
    return np.array(scores)


def deploy_counts(tpu) -> dict:
    """Compute ops per mode of a TPU model (INT8 where its result is quantized)."""
    from tftpu.ir import tpu as T
    counts: dict = {}
    for op in tpu.ops:
        if isinstance(op, T.TpuOp) and op.name not in ("tpu.Cast",):
            mode = "INT8" if op.quantized else op.results[0].type.element_type.name.upper()
            counts[mode] = counts.get(mode, 0) + 1
    return counts


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="mse,kl,percentile,minmax,aciq_gauss,aciq_laplace,auto")
    ap.add_argument("--asymmetric", action="store_true", help="also deploy asymmetric INT8 tables")
    args = ap.parse_args()
    from tests.models import mtcnn
    from tftpu import frontend, quant
    from tftpu.interp.top_interpreter import TopInterpreter
    from tftpu.interp.tpu import TpuInterpreter
    from tftpu.pipelines.deploy import deploy

    print("net   method      acc f32  acc int8  max score move  vs TFLite  calibration s")
    for net, size in (("rnet", 24), ("onet", 48)):
        km = getattr(mtcnn, net)(weights=True)
        images, labels = mtcnn.lfw_inputs(size)
        images = images.astype(np.float32)
        calib_idx = np.concatenate([np.where(labels == 1)[0][:50], np.where(labels == 0)[0][:50]])
        model = frontend.load(km)
        name = model.input_names[0]
        calib = [{name: images[i:i + 1]} for i in calib_idx]
        evals = [{name: images[i:i + 1]} for i in range(len(images))]
        ref = TopInterpreter(model)
        floats = [ref.run(e) for e in evals]
        prob = next(n for n in model.output_names if floats[0][n].shape[-1] == 2)
        pf = np.array([f[prob][0, 1] for f in floats])
        acc_f = float(np.mean((pf > 0.5) == labels))
        t = time.perf_counter()
        pt = _tflite_scores(km, images[calib_idx], images)
        t_tfl = time.perf_counter() - t
        move_tfl = float(np.abs(pt - pf).max())
        print(f"{net:5s} {'TFLite':10s} {acc_f:8.3f} {np.mean((pt > 0.5) == labels):9.3f} {move_tfl:15.4f} "
              f"{1.0:9.2f}x {t_tfl:13.1f}  (peer, converted in this run)")
        for method in args.methods.split(","):
            t = time.perf_counter()
            table = quant.calibrate(model, calib, method)
            t_cal = time.perf_counter() - t
            pq = np.array([q[prob][0, 1] for q in quant.simulate(model, table, evals)])
            move = float(np.abs(pq - pf).max())
            print(f"{net:5s} {method:10s} {acc_f:8.3f} {np.mean((pq > 0.5) == labels):9.3f} {move:15.4f} "
                  f"{move / move_tfl:9.2f}x {t_cal:13.1f}  (simulated)")
            for asym in ((False, True) if args.asymmetric else (False,)):
                t_table = quant.calibrate(model, calib, method, asymmetric=True) if asym else table
                tpu = deploy(model, quantize="INT8", chip="npu1", calibration_table=t_table, asymmetric=asym,
                             mixed_precision="none").model
                run = TpuInterpreter(tpu)
                pi = np.array([run.run(e)[prob][0, 1] for e in evals])
                move = float(np.abs(pi - pf).max())
                kind = "TPU INT8 asym" if asym else "TPU INT8"
                print(f"{net:5s} {method:10s} {acc_f:8.3f} {np.mean((pi > 0.5) == labels):9.3f} {move:15.4f} "
                      f"{move / move_tfl:9.2f}x {'':13s}  ({kind}: integer inference, "
                      f"{', '.join(f'{n} {m}' for m, n in sorted(deploy_counts(tpu).items()))})")
    print("PEERS.md (TFLite 2.21, same protocol): accuracy 1.00; max score move 0.024 (R-Net), 0.069 (O-Net)")


if __name__ == "__main__":
    main()
