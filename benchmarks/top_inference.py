"""TOP F32 inference throughput against onnxruntime, batch 1, 224x224 (issue 4 target: >= 0.5x).

    python benchmarks/top_inference.py [--models ResNet50,MobileNetV2] [--runs 10] [--jit]

Both sides run the same ONNX export of keras.applications (weights=None) in one process, timed
in alternating blocks; the ratio is TOP images/s over onnxruntime images/s. onnxruntime flushes
denormals to zero (`session.set_denormal_as_zero`) as TF does, else random-weight models crawl
through denormal arithmetic there. Its workers stop spinning when a run ends
(`session.force_spinning_stop`): left spinning, they took a core from the TOP calls timed after
them (1.2-1.7x slower on 2 cores); its own time per run changes by under ~5%. TOP paths:
"eager" (numpy/TF kernel per op) and "compiled" (the whole module as one TF graph), each on the
imported NCHW module and after convert_layout(NHWC).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def throughputs(fns, runs: int, block: int = 5) -> list[float]:
    """Images/s of each fn: blocks of `block` timed calls, the blocks of the fns interleaved
    (the machine is shared and noisy), median time per call; each block starts with one
    untimed call."""
    for fn in fns:
        for _ in range(3):
            fn()  # warm up (kernels, TF graph caches, weight re-layouts)
    times = [[] for _ in fns]
    for _ in range(max(1, -(-runs // block))):
        for i, fn in enumerate(fns):
            fn()
            for _ in range(block):
                times[i].append(timed(fn))
    return [1.0 / float(np.median(t)) for t in times]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="ResNet50,MobileNetV2")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--layout", default="NCHW,NHWC", help="TOP layouts to time (NHWC via convert_layout)")
    ap.add_argument("--backends", default="eager,compiled")
    ap.add_argument("--jit", action="store_true", help="also time the compiled graph under XLA")
    ap.add_argument("--threads", type=int, default=0,
                    help="intra-op threads for both onnxruntime and TF (0: each one's default, "
                         "one per core for both)")
    args = ap.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import onnxruntime as ort
    import tensorflow as tf

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)

    from tftpu import frontend
    from tftpu.interp.compiled import CompiledTop
    from tftpu.interp.top_interpreter import TopInterpreter

    print(f"threads: onnxruntime {args.threads or 'default'}, TF intra-op "
          f"{tf.config.threading.get_intra_op_parallelism_threads() or 'default'}; "
          f"{os.cpu_count()} CPUs")
    print(f"{'model':<12} {'layout':<6} {'path':<9} {'ops':>5} {'onnxruntime img/s':>18} "
          f"{'TOP img/s':>10} {'ratio':>7}")
    for name in args.models.split(","):
        km = getattr(keras.applications, name)(weights=None, input_shape=(args.size, args.size, 3))
        proto = frontend.to_onnx(km)
        x = np.random.default_rng(0).uniform(-1, 1, (1, args.size, args.size, 3)).astype(np.float32)
        so = ort.SessionOptions()
        so.add_session_config_entry("session.set_denormal_as_zero", "1")
        # its workers still spin while it runs, but stop when a run ends, not into our run
        so.add_session_config_entry("session.force_spinning_stop", "1")
        so.intra_op_num_threads = args.threads
        sess = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
        feed = {sess.get_inputs()[0].name: x}
        for layout in args.layout.split(","):
            top = frontend.load(proto, name=name)
            if layout == "NHWC":
                from tftpu.transforms.convert_layout import convert_layout
                convert_layout(top, "NHWC")
            paths = []
            for backend in args.backends.split(","):
                if backend == "eager":
                    paths.append(("eager", TopInterpreter(top).run))
                else:
                    paths.append(("compiled", CompiledTop(top).run))
                    if args.jit:
                        paths.append(("xla", CompiledTop(top, jit_compile=True).run))
            for label, run in paths:
                ort_tp, top_tp = throughputs([lambda: sess.run(None, feed), lambda: run({"x": x})],
                                             args.runs)
                print(f"{name:<12} {layout:<6} {label:<9} {len(top.ops):>5} {ort_tp:>18.2f} "
                      f"{top_tp:>10.2f} {top_tp / ort_tp:>6.2f}x", flush=True)


if __name__ == "__main__":
    main()
