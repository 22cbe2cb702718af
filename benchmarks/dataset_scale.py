"""Dataset scale (issue 23): streaming calibration and evaluation of a 640x640 detector.

    python benchmarks/dataset_scale.py [--images 100] [--compare 20] [--eval 20] [--calib 8]

The model: PP-OCRv6_det_small (the real DB text detector of tftpu.datasets, input fixed to
1x3x640x640, BGR with ImageNet mean/std). The images: JPEG files of 640x640 made from the real
skimage photos of tftpu.datasets (each photo, mirrored, and shifted crops, so every file differs),
written once to a temporary directory.

Printed, each measurement in a fresh process (so peak resident memory is its own):
1. calibration (mse) of the first `--compare` images, in memory (`load_samples`, a list) against
   streamed (`iter_samples`): seconds, images/s, peak RSS, and whether the two tables are
   byte-identical;
2. streamed calibration of all `--images` images: images/s and peak RSS (the in-memory path would
   hold 4.9 MB per image on top of the model);
3. evaluation of `--eval` images: the INT8 TPU model (compiled on `--calib` images, pure INT8)
   on the TPU interpreter, against onnxruntime float (its default threads) on the same ONNX model
   and images, image by image in turn (the ratio of images/s), and `tftpu.evaluate` as a whole
   (which also runs the TOP float reference).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODEL = "PP-OCRv6_det_small.onnx"
SIZE = 640
MEAN = [255 * v for v in (0.485, 0.456, 0.406)]
SCALE = [1 / (255 * v) for v in (0.229, 0.224, 0.225)]


def _status_mb(field: str) -> float:
    """A memory figure of this process from /proc/self/status (VmHWM: peak resident, VmRSS: now)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mb() -> float:
    return _status_mb("VmHWM")


def rss_mb() -> float:
    return _status_mb("VmRSS")


def make_images(directory: Path, count: int) -> None:
    """`count` distinct 640x640 JPEGs from the real photos: resized, mirrored, shifted crops."""
    import tensorflow as tf

    from tftpu import datasets
    photos = sorted(datasets.PHOTOS)
    have = len(list(directory.glob("*.jpg")))
    big = {}
    for i in range(have, count):
        name = photos[i % len(photos)]
        variant = i // len(photos)
        if name not in big:
            big[name] = datasets.image(name, (SIZE + 64, SIZE + 64))
        dy, dx = (variant * 7) % 64, (variant * 13) % 64
        img = big[name][dy:dy + SIZE, dx:dx + SIZE]
        if variant % 2:
            img = img[:, ::-1]
        (directory / f"{i:05d}.jpg").write_bytes(tf.io.encode_jpeg(np.ascontiguousarray(img), quality=90).numpy())


def _model():
    from tftpu import datasets, frontend
    return frontend.load(str(datasets.get(MODEL)), [[1, 3, SIZE, SIZE]])


def child_calibrate(images: Path, count: int, mode: str, table: Path) -> dict:
    from tftpu import quant
    model = _model()
    base = rss_mb()
    t0 = time.perf_counter()
    if mode == "memory":
        samples = quant.load_samples(model, images, count, MEAN, SCALE, "bgr")
    else:
        samples = quant.iter_samples(model, images, count, MEAN, SCALE, "bgr")
    result = quant.calibrate(model, samples, "mse")
    seconds = time.perf_counter() - t0
    result.save(table)
    return {"mode": mode, "images": result.samples, "seconds": seconds, "base_rss_mb": base,
            "peak_rss_mb": peak_rss_mb()}


def compile_int8(model, images: Path, calib: int):
    """(the model compiled pure INT8 for npu1, calibrated on the first `calib` images; seconds)."""
    import tftpu
    from tftpu import quant

    shapes = {model.input_names[0]: (1, 3, SIZE, SIZE)}
    t0 = time.perf_counter()
    compiled = tftpu.compile(model, chip="npu1", calibration_data=quant.iter_samples(
        shapes, images, calib, MEAN, SCALE, "bgr"), mixed_precision="none", bias_correction=False,
        space_to_depth=False)
    return compiled, time.perf_counter() - t0


def child_evaluate(images: Path, count: int, calib: int) -> dict:
    import onnxruntime as ort

    import tftpu
    from tftpu import datasets, quant
    from tftpu.interp.tpu import TpuInterpreter

    model = _model()
    compiled, compile_s = compile_int8(model, images, calib)
    # streamed, each image decoded once for both sides (a list of 1,000 decoded images would be
    # 4.9 GB of this process's peak memory, which is evaluate's figure below)
    xs = iter(quant.iter_samples(model, images, count, MEAN, SCALE, "bgr"))
    tpu = TpuInterpreter(compiled.tpu_model)
    sess = ort.InferenceSession(str(datasets.get(MODEL)), providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    first = next(xs)[model.input_names[0]]
    tpu.run({model.input_names[0]: first})                                    # warm-up
    sess.run(None, {name: first})
    tpu_s = ort_s = 0.0
    for x in itertools.chain([first], (s[model.input_names[0]] for s in xs)):             # interleaved, so a shared machine's changing load falls on both alike
        t0 = time.perf_counter()
        tpu.run({model.input_names[0]: x}, dequantize=True)
        t1 = time.perf_counter()
        sess.run(None, {name: x})
        tpu_s, ort_s = tpu_s + t1 - t0, ort_s + time.perf_counter() - t1
    result = tftpu.evaluate(compiled, quant.iter_samples(model, images, count, MEAN, SCALE, "bgr"))
    worst = min(result.rows, key=lambda r: min(r.sqnr))
    return {"images": count, "compile_s": compile_s, "tpu_s": tpu_s, "ort_s": ort_s,
            "evaluate_s": result.seconds, "evaluate_ips": result.images_per_s, "int8_ops": compiled.report.get(
                "modes", {}), "worst": str(result).splitlines()[1].strip(), "min_sqnr": min(worst.sqnr),
            "peak_rss_mb": peak_rss_mb()}


def _child(*args) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", *map(str, args)], capture_output=True, text=True,
                         env={**os.environ, "TFTPU_PROGRESS": "0"})
    if out.returncode:
        sys.exit(f"child {args} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=100, help="images for the streamed calibration at scale")
    ap.add_argument("--compare", type=int, default=20, help="images for in-memory vs streamed")
    ap.add_argument("--eval", type=int, default=20, help="images to evaluate")
    ap.add_argument("--calib", type=int, default=8, help="calibration images of the compile evaluated")
    ap.add_argument("--dir", help="where the generated JPEGs go (kept; default a temporary directory)")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: compare,scale,eval")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "calibrate":
            res = child_calibrate(Path(rest[0]), int(rest[1]), rest[2], Path(rest[3]))
        else:
            res = child_evaluate(Path(rest[0]), int(rest[1]), int(rest[2]))
        print(json.dumps(res))
        return
    skip = set(filter(None, args.skip.split(",")))
    tmp = tempfile.TemporaryDirectory(prefix="tftpu_dataset_scale_")
    images = Path(args.dir) if args.dir else Path(tmp.name) / "images"
    images.mkdir(parents=True, exist_ok=True)
    n_all = max(args.images, args.compare, args.eval, args.calib)
    t0 = time.perf_counter()
    make_images(images, n_all)
    print(f"{MODEL} at {SIZE}x{SIZE}; {n_all} JPEGs of {SIZE}x{SIZE} from the tftpu.datasets photos "
          f"({time.perf_counter() - t0:.1f} s); cores: {os.cpu_count()}\n")
    if "compare" not in skip:
        rows = {}
        for mode in ("memory", "stream"):
            rows[mode] = _child("calibrate", images, args.compare, mode, Path(tmp.name) / f"{mode}.txt")
        same = (Path(tmp.name) / "memory.txt").read_bytes() == (Path(tmp.name) / "stream.txt").read_bytes()
        print(f"calibration (mse) of {args.compare} images   seconds  images/s  RSS after import  peak RSS")
        for mode, r in rows.items():
            print(f"  {'in memory (list)' if mode == 'memory' else 'streamed':28s} {r['seconds']:8.1f} "
                  f"{r['images'] / r['seconds']:9.3f} {r['base_rss_mb']:13.0f} MB {r['peak_rss_mb']:7.0f} MB")
        m, s = rows["memory"], rows["stream"]
        print(f"  streamed / in memory: {m['seconds'] / s['seconds']:.2f}x the images/s, "
              f"{s['peak_rss_mb'] - m['peak_rss_mb']:+.0f} MB peak; tables byte-identical: {same}\n")
    if "scale" not in skip:
        r = _child("calibrate", images, args.images, "stream", Path(tmp.name) / "scale.txt")
        print(f"streamed calibration of {r['images']} images: {r['seconds']:.1f} s, "
              f"{r['images'] / r['seconds']:.3f} images/s, peak RSS {r['peak_rss_mb']:.0f} MB "
              f"(after import {r['base_rss_mb']:.0f} MB); in memory the images alone would be "
              f"{r['images'] * 3 * SIZE * SIZE * 4 / 2**20:.0f} MB\n")
    if "eval" not in skip:
        r = _child("evaluate", images, args.eval, args.calib)
        tpu_ips, ort_ips = args.eval / r["tpu_s"], args.eval / r["ort_s"]
        print(f"evaluation of {args.eval} images (compiled pure INT8 on {args.calib} images in {r['compile_s']:.1f} s; "
              f"ops {r['int8_ops']})")
        print(f"  INT8 TPU interpreter   {tpu_ips:7.3f} images/s")
        print(f"  onnxruntime float      {ort_ips:7.3f} images/s")
        print(f"  ratio INT8 / ORT float {tpu_ips / ort_ips:7.2f}x   (issue 23 target: >= 0.5x)")
        print(f"  tftpu.evaluate         {r['evaluate_ips']:7.3f} images/s (TPU model + TOP float reference + "
              f"figures), peak RSS {r['peak_rss_mb']:.0f} MB")
        print(f"  {r['worst']}")


if __name__ == "__main__":
    main()
