"""Benchmark: the whole TAC pipeline (read, annotate, raise, views, costs, exact pick, write) on a
~700-op TFLite model, next to TensorFlow's own TFLite converter building that model in the same run.

    python benchmarks/tac_pipeline.py [--blocks 108] [--repeat 5]

Also runs the mediapipe models (selfie segmentation, face detection) and prints the plan costs:
exact pick vs TensorFlow's greedy pick vs all-CPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def build(blocks: int, width: int = 32, size: int = 32):
    """A conv chain with Pack/Split/Sub every other block, plus two-way branches that rejoin."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    ks = [rng.standard_normal((3, 3, width, width)).astype(np.float32) * 0.05 for _ in range(blocks)]
    k0 = rng.standard_normal((3, 3, 3, width)).astype(np.float32) * 0.1

    def fn(x):
        y = tf.nn.relu(tf.nn.conv2d(x, k0, 1, "SAME"))
        for i, k in enumerate(ks):
            z = tf.nn.conv2d(y, k, 1, "SAME")
            if i % 2 == 0:
                a, b = tf.split(z, 2, axis=3)
                z = tf.concat([a - b, tf.math.squared_difference(a, b)], axis=3)
                z3 = tf.reshape(z, [size, size, width])
                z = tf.stack([z3, z3 * 0.5], axis=0)[:1]
            y = tf.nn.relu6(z + y)
        return y

    spec = tf.TensorSpec((1, size, size, 3), tf.float32)
    conc = tf.function(fn).get_concrete_function(spec)
    t = time.perf_counter()
    data = tf.lite.TFLiteConverter.from_concrete_functions([conc], fn).convert()
    return data, time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=118)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    import tftpu.tac as tac
    from tftpu.tac import tflite_io
    from tftpu.tac.graph import Graph

    data, convert_s = build(args.blocks)
    ops = len(Graph(tflite_io.read(data)).nodes)
    tac.run(data)  # warm caches (YAML, schema)
    runs = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        result = tac.run(data, device_specs=("GPU", "CPU"))
        result.tflite()
        runs.append((time.perf_counter() - t, result))
    runs.sort(key=lambda r: r[0])
    med, result = runs[len(runs) // 2]
    times = [r[0] for r in runs]
    print(f"model: {ops} ops, {len(data) / 1024:.0f} KiB")
    print(f"TensorFlow TFLiteConverter (same run, peer): {convert_s:.3f} s")
    print(f"tftpu.tac.run whole pipeline (median of {args.repeat}): {med:.3f} s   "
          f"(min {times[0]:.3f}, max {times[-1]:.3f})  [{'PASS' if med < 2.0 else 'FAIL'} < 2 s]  "
          f"ratio tac/converter = {med / convert_s:.3f}")
    print("stages (ms): " + "  ".join(f"{k}={v * 1e3:.1f}" for k, v in result.timings.items()))
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "model.tflite"
        src.write_bytes(data)
        t = time.perf_counter()
        subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "tools" / "tftpu_tac.py"), str(src),
                        "-o", str(Path(tmp) / "out.tflite"), "--device_specs=GPU,CPU",
                        "--output_mlir", str(Path(tmp) / "out.mlir"), "--report", str(Path(tmp) / "r.json")],
                       check=True, capture_output=True)
        print(f"tftpu-tac command line, process start to exit (+MLIR, +report): {time.perf_counter() - t:.3f} s")
    rep = result.report
    c = rep["cost_us"]
    print(f"plan: {rep['ops_per_device']}, {len(rep['subgraphs'][0]['functions'])} raised subgraphs, "
          f"DP max states {rep['subgraphs'][0]['dp_max_states']}")
    print(f"estimated cost (us): picked {c['picked']:.0f}  greedy(TF) {c['greedy_tf']:.0f}  "
          f"annotated {c['annotated']:.0f}  all-CPU {c['all_CPU']:.0f}  -> "
          f"{c['all_CPU'] / c['picked']:.2f}x vs CPU, {c['greedy_tf'] / c['picked']:.3f}x vs greedy")

    from tftpu import datasets as material
    for name in ("selfie_segmentation.tflite", "face_detection_short_range.tflite"):
        path = material.get(name)
        for specs in (("GPU", "CPU"), ("NNAPI", "GPU", "CPU")):
            t = time.perf_counter()
            r = tac.run(path, device_specs=specs)
            r.tflite()
            dt = time.perf_counter() - t
            c = r.report["cost_us"]
            print(f"{name} {','.join(specs)}: {dt * 1e3:.0f} ms; {r.report['ops_per_device']}; cost us picked "
                  f"{c['picked']:.0f} greedy {c['greedy_tf']:.0f} all-CPU {c['all_CPU']:.0f}")


if __name__ == "__main__":
    main()
