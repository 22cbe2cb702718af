"""INT8 of mtcnn R-Net / O-Net (real weights) through tftpu.lite.TFLiteConverter vs TFLite's own.

    python benchmarks/lite_int8.py [--methods auto,mse,percentile,kl,minmax]

PEERS.md's protocol: calibrate on 50 faces + 50 non-faces of lfw_subset, evaluate on all 200;
int8 in and out, full-integer ops. The peer is `tf.lite.TFLiteConverter` (its calibrator's
min/max), converted in this run; tftpu's side is the same converter with `calibration_method`
(tftpu's ranges written into the calibrated model, TF's quantizer after). Both `.tflite`s run in
the same interpreter (`tftpu.lite.runtime`). Printed: accuracy (float, INT8), the largest and
mean face-score move against float, the ratio to TFLite's, and the conversion time.
"""

import argparse
import contextlib
import io
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _convert(cls, km, calib, method=None):
    import tensorflow as tf

    conv = cls.from_keras_model(km)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = lambda: ([x[None]] for x in calib)
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = conv.inference_output_type = tf.int8
    if method is not None:
        conv.calibration_method = method
    t = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):      # Keras prints "Saved artifact at ..."
        data = conv.convert()
    return data, time.perf_counter() - t, getattr(conv, "report", None)


def _scores(data, images):
    from tftpu.lite import runtime

    interp = runtime.interpreter(data)
    k = next(i for i, d in enumerate(runtime.output_details(interp)) if d["shape"][-1] == 2)
    return np.array([runtime.run(interp, [x[None]])[k][0, 1] for x in images])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="auto,mse,percentile,kl,minmax")
    args = ap.parse_args()
    import tensorflow as tf

    from tests.models import mtcnn
    from tftpu import lite
    from tftpu.lite import runtime

    print(f"runtime: {runtime.name()}")
    print("net   converter          acc f32  acc int8  max move  mean move  vs TFLite  clipped  convert s")
    for net, size in (("rnet", 24), ("onet", 48)):
        km = getattr(mtcnn, net)(weights=True)
        images, labels = mtcnn.lfw_inputs(size)
        images = images.astype(np.float32)
        calib = images[np.concatenate([np.where(labels == 1)[0][:50], np.where(labels == 0)[0][:50]])]
        pf = km.predict(images, verbose=0)[-1][:, 1]
        acc_f = float(np.mean((pf > 0.5) == labels))
        data, secs, _ = _convert(tf.lite.TFLiteConverter, km, calib)
        pt = _scores(data, images)
        peer = float(np.abs(pt - pf).max())
        print(f"{net:5s} {'TFLite (peer)':18s} {acc_f:8.3f} {np.mean((pt > 0.5) == labels):9.3f} {peer:9.4f} "
              f"{np.abs(pt - pf).mean():10.5f} {1.0:9.2f}x {'-':>8s} {secs:10.1f}")
        for method in args.methods.split(","):
            data, secs, report = _convert(lite.TFLiteConverter, km, calib, method)
            pq = _scores(data, images)
            move = float(np.abs(pq - pf).max())
            print(f"{net:5s} {'tftpu ' + method:18s} {acc_f:8.3f} {np.mean((pq > 0.5) == labels):9.3f} "
                  f"{move:9.4f} {np.abs(pq - pf).mean():10.5f} {move / peer:9.2f}x "
                  f"{report['int8']['clipped']:>4d}/{report['int8']['activations']:<3d} {secs:10.1f}")
    print("PEERS.md (TFLite 2.21, same protocol): accuracy 1.00; max score move 0.024 (R-Net), 0.069 (O-Net)")


if __name__ == "__main__":
    main()
