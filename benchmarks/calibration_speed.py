"""Calibration time of a 640x640 detector on 20 real photos: streaming pass against the two-pass one.

    python benchmarks/calibration_speed.py [--images 20] [--methods mse,auto] [--size 640]

The model: a Keras MobileNetV2 backbone at 640x640 with a small FPN-like head (three levels,
bilinear upsampling, per level box and sigmoid-score convolutions, reshaped and concatenated into
one output of box coordinates around 320 next to scores in 0..1, as YOLO-style heads end), random
weights (timing does not need trained ones), exported with `tftpu.frontend.load`. Calibration
inputs: the 10 skimage photos of tftpu.datasets and their mirror images, resized to 640x640;
similarity is judged on 3 other views (centre crops) under simulated INT8, on the boxes and the
scores of the output separately. Printed: each path's time, the ratio against the previous
two-pass implementation measured in this run, and against TPU-MLIR's 182 s (PEERS.md).
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TPU_MLIR_S = 182.0   # PEERS.md: TPU-MLIR 1.30 run_calibration of the 640x640 detector, 20 photos


def detector(size=640, classes=18, seed=0, images=None):
    """MobileNetV2 + FPN-like head; output [1, anchors, 4 + classes]: boxes then sigmoid scores.

    With random weights the signal dies out layer after layer, so each BatchNorm's moving mean and
    variance are set from `images` (one training-mode call with momentum 0), as training would.
    """
    import keras
    from keras import layers
    keras.utils.set_random_seed(seed)
    inp = keras.Input((size, size, 3), name="image")
    base = keras.applications.MobileNetV2(input_tensor=inp, include_top=False, weights=None)
    feats = [base.get_layer(n).output for n in ("block_6_expand_relu", "block_13_expand_relu", "out_relu")]
    lat = [layers.Conv2D(64, 1, name=f"lat{i}")(f) for i, f in enumerate(feats)]
    p, pyramid = lat[2], [lat[2]]
    for i in (1, 0):
        p = layers.Add(name=f"fpn_add{i}")([layers.UpSampling2D(2, interpolation="bilinear", name=f"up{i}")(p), lat[i]])
        pyramid.append(p)
    outs = []
    for i, f in enumerate(pyramid):
        f = layers.Conv2D(64, 3, padding="same", activation="relu", name=f"head{i}")(f)
        box = layers.Reshape((-1, 4), name=f"box_r{i}")(layers.Conv2D(4 * 3, 1, name=f"box{i}")(f))
        box = layers.Rescaling(80.0, size / 2, name=f"box_scale{i}")(box)
        score = layers.Conv2D(classes * 3, 1, activation="sigmoid", name=f"score{i}")(f)
        outs.append(layers.Concatenate(axis=-1, name=f"det{i}")([box, layers.Reshape((-1, classes), name=f"score_r{i}")(score)]))
    model = keras.Model(inp, layers.Concatenate(axis=1, name="detections")(outs), name=f"det{size}")
    if images is not None:
        bns = [layer for layer in model.layers if isinstance(layer, layers.BatchNormalization)]
        for layer in bns:
            layer.momentum = 0.0
        model(images, training=True)
        for layer in bns:
            layer.momentum = 0.99
    return model


def photos(size, count):
    from tftpu import datasets as material
    calib, test = [], []
    for name in sorted(material.PHOTOS):
        img = material.image(name, (size, size)).astype(np.float32) / 127.5 - 1
        calib += [img, img[:, ::-1]]
    for name in material.COLOUR_PHOTOS[:3]:
        big = material.image(name, (2 * size, 2 * size)).astype(np.float32) / 127.5 - 1
        test.append(big[size // 2:size // 2 + size, size // 2:size // 2 + size])
    return [np.ascontiguousarray(x[None]) for x in calib[:count]], [np.ascontiguousarray(x[None]) for x in test]


def parts(model, table, tests, name):
    """Worst cosine and mean SQNR of boxes and of scores (the two parts of the output) under simulated INT8."""
    from tftpu import quant
    from tftpu.interp.similarity import cosine_similarity, sqnr
    from tftpu.interp.top_interpreter import TopInterpreter
    ref = TopInterpreter(model)
    out = model.output_names[0]
    floats = [ref.run({name: x})[out] for x in tests]
    quants = [q[out] for q in quant.simulate(model, table, [{name: x} for x in tests])]
    res = []
    for sl in (np.s_[..., :4], np.s_[..., 4:]):
        cos = min(cosine_similarity(f[sl], q[sl]) for f, q in zip(floats, quants))
        snr = float(np.mean([sqnr(f[sl], q[sl]) for f, q in zip(floats, quants)]))
        res.append(f"{cos:.5f} / {snr:5.1f} dB")
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=20)
    ap.add_argument("--size", type=int, default=640)
    ap.add_argument("--methods", default="mse,auto", help="new-path methods to time (mse is also run two-pass)")
    ap.add_argument("--no_old", action="store_true", help="skip the two-pass reference (slow)")
    args = ap.parse_args()
    from tftpu import frontend, quant

    t = time.perf_counter()
    calib, tests = photos(args.size, args.images)
    model = frontend.load(detector(args.size, images=np.concatenate(calib[::7])))
    print(f"model: MobileNetV2 + FPN head at {args.size}x{args.size}, {len(model.ops)} TOP ops "
          f"(built and imported in {time.perf_counter() - t:.1f} s)")
    name = model.input_names[0]
    samples = [{name: x} for x in calib]
    print(f"{len(samples)} calibration photos; similarity on {len(tests)} other views: boxes and scores apart\n")
    print(f"{'path':34s} {'time s':>7s} {'vs two-pass':>11s} {'vs TPU-MLIR':>11s}   boxes cos / SQNR      scores cos / SQNR")
    old_s = None
    if not args.no_old:
        t = time.perf_counter()
        old = quant.calibrate_two_pass(model, samples, "mse")
        old_s = time.perf_counter() - t
        b, s = parts(model, old, tests, name)
        print(f"{'two-pass (previous), mse':34s} {old_s:7.1f} {1.0:10.2f}x {TPU_MLIR_S / old_s:10.2f}x   {b}   {s}")
    for method in args.methods.split(","):
        for asym in (False, True) if method == "auto" else (False,):
            t = time.perf_counter()
            table = quant.calibrate(model, samples, method, asymmetric=asym)
            dt = time.perf_counter() - t
            b, s = parts(model, table, tests, name)
            ratio = f"{old_s / dt:10.2f}x" if old_s else f"{'-':>11s}"
            label = f"streaming, {method}{' asymmetric' if asym else ''}"
            print(f"{label:34s} {dt:7.1f} {ratio} {TPU_MLIR_S / dt:10.2f}x   {b}   {s}")
            if table.chosen:
                print(f"{'':34s} auto chose: {', '.join(f'{m} {n}' for m, n in table.counts().items())}")
    print(f"\nPEERS.md: TPU-MLIR 1.30 calibrated the 640x640 detector (20 photos, KL + auto-tune) in {TPU_MLIR_S:.0f} s; "
          f"goal: under {TPU_MLIR_S / 3:.0f} s.  'vs' columns: how many times faster.")


if __name__ == "__main__":
    main()
