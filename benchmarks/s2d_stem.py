"""Forward and backprop-filter time of ResNet's 7x7/2 stem on this CPU, original vs S2D.

    python benchmarks/s2d_stem.py [--batches 1 8 32] [--repeat 7]
    python benchmarks/s2d_stem.py --gpu     # the gpu target's decisions beside the H100 figures

Two views, both against the original stem measured in the same run:
- "conv only": the 4x4/1 conv over the 115x115x12 S2D input (the figure PEERS.md quotes:
  0.77x / 0.76x / 0.63x at batch 1 / 8 / 32);
- "rewritten graph": what `tftpu.optimize(..., target=..., force)` produces, host S2D and kernel
  transform included.
These are the numbers the cpu target's cost model rests on (tftpu/configs/chips/cpu.yaml); the
script also prints that model's estimate for each batch. Ratios > 1 mean S2D is faster.

`--gpu` measures nothing (no GPU here): it runs `tftpu.optimize(..., target="gpu")` on the stem's
training step (forward and weight gradient) at each batch of PEERS.md's H100 table and prints the
gpu target's decision and estimate beside the ratios measured there (tftpu/configs/chips/gpu.yaml
is fitted to the forward + backward column).
"""

import argparse
import statistics
import time


def _median_time(fn, repeat):
    fn()  # warm up (tracing, oneDNN primitive creation)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# PEERS.md, "Space-to-depth on a real GPU": H100, cuDNN bf16 channels-last, ResNet stem, S2D / original
GPU_MEASURED = {1: (1.37, 1.03), 8: (1.18, 0.95), 32: (1.70, 1.19), 128: (2.10, 1.67), 256: (2.10, 1.77)}


def gpu_table():
    import numpy as np
    import tensorflow as tf

    from tftpu.pipelines.optimize import optimize

    kernel = tf.Variable(np.random.default_rng(0).standard_normal((7, 7, 3, 64)).astype(np.float32) * 0.1)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            y = tf.nn.conv2d(tf.pad(x, [[0, 0], [3, 3], [3, 3], [0, 0]]), kernel, 2, "VALID")
            loss = tf.reduce_mean(y * y)
        return tape.gradient(loss, kernel)

    print("ResNet stem 7x7/2 3->64 at 224x224, training step; gpu target (H100 model) vs PEERS.md's H100")
    print(f"{'batch':>5} {'decision':>9} {'estimate':>9} {'measured fwd+bwd':>17} {'measured fwd':>13}")
    for n, (fwd, both) in GPU_MEASURED.items():
        d = optimize(step, tf.zeros((n, 224, 224, 3)), target="gpu").report["space_to_depth"].decisions[0]
        print(f"{n:>5} {'applies' if d.applied else 'declines':>9} {d.numbers['speedup']:>8.2f}x {both:>16.2f}x "
              f"{fwd:>12.2f}x")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--gpu", action="store_true", help="the gpu target's decisions beside PEERS.md's H100 figures")
    args = ap.parse_args()
    if args.gpu:
        return gpu_table()
    import numpy as np
    import tensorflow as tf

    from tftpu.pipelines.optimize import optimize
    from tftpu.passes import s2d_geometry as geo

    rng = np.random.default_rng(0)
    kernel = tf.Variable(rng.standard_normal((7, 7, 3, 64)).astype(np.float32) * 0.1)
    plans = [geo.AxisPlan.from_padding(224, 7, 2, 2, (3, 3))] * 2
    s2d_kernel = tf.Variable(geo.transform_kernel(kernel, plans))
    print("ResNet stem: 7x7/2, 3->64 over 230x230 (224 + ZeroPadding 3) vs S2D 4x4/1, 12->64 over 115x115")
    print(f"{'batch':>5} {'view':<16} {'forward':>22} {'backprop-filter':>22}")
    for n in args.batches:
        x = tf.constant(rng.standard_normal((n, 224, 224, 3)).astype(np.float32))
        xs = geo.pad_blocked(geo.space_to_depth(geo.pad_input(x, plans), [2, 2]), plans)
        dy = tf.constant(rng.standard_normal((n, 112, 112, 64)).astype(np.float32))

        @tf.function
        def fwd(x):
            return tf.nn.conv2d(tf.pad(x, [[0, 0], [3, 3], [3, 3], [0, 0]]), kernel, 2, "VALID")

        @tf.function
        def bwd(x):
            with tf.GradientTape() as tape:
                y = tf.nn.conv2d(tf.pad(x, [[0, 0], [3, 3], [3, 3], [0, 0]]), kernel, 2, "VALID")
            return tape.gradient(y, kernel, output_gradients=dy)

        @tf.function
        def fwd_s2d(xs):
            return tf.nn.conv2d(xs, s2d_kernel, 1, "VALID")

        @tf.function
        def bwd_s2d(xs):
            with tf.GradientTape() as tape:
                y = tf.nn.conv2d(xs, s2d_kernel, 1, "VALID")
            return tape.gradient(y, s2d_kernel, output_gradients=dy)

        force = {"space_to_depth": {"force": True}}
        fwd_rw = optimize(fwd, x, target="cpu", pass_options=force)
        bwd_rw = optimize(bwd, x, target="cpu", pass_options=force)
        assert fwd_rw.report.applied("space_to_depth") and bwd_rw.report.applied("space_to_depth")
        np.testing.assert_allclose(fwd_rw(x), fwd(x), rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(bwd_rw(x), bwd(x), rtol=1e-4, atol=1e-2)
        t = {name: _median_time(lambda f=f, a=a: f(a).numpy(), args.repeat)
             for name, f, a in [("fwd", fwd, x), ("bwd", bwd, x), ("fwd_s2d", fwd_s2d, xs),
                                ("bwd_s2d", bwd_s2d, xs), ("fwd_rw", fwd_rw, x), ("bwd_rw", bwd_rw, x)]}
        print(f"{n:>5} {'original':<16} {t['fwd'] * 1e3:>19.2f} ms {t['bwd'] * 1e3:>19.2f} ms")
        print(f"{n:>5} {'S2D conv only':<16} {t['fwd_s2d'] * 1e3:>13.2f} ms {t['fwd'] / t['fwd_s2d']:>5.2f}x"
              f" {t['bwd_s2d'] * 1e3:>13.2f} ms {t['bwd'] / t['bwd_s2d']:>5.2f}x")
        print(f"{n:>5} {'rewritten graph':<16} {t['fwd_rw'] * 1e3:>13.2f} ms {t['fwd'] / t['fwd_rw']:>5.2f}x"
              f" {t['bwd_rw'] * 1e3:>13.2f} ms {t['bwd'] / t['bwd_rw']:>5.2f}x")
        decision = optimize(fwd, x, target="cpu").report["space_to_depth"].decisions[0]
        print(f"{'':>5} cpu cost model: {'applies' if decision.applied else 'declines'}, "
              f"estimated {decision.numbers['speedup']:.2f}x")
    print("peer (PEERS.md, TF 2.21 oneDNN, forward, conv only): 0.77x (batch 1), 0.76x (8), 0.63x (32)")


if __name__ == "__main__":
    main()
