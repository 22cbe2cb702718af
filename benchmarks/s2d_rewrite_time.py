"""Time to rewrite a ResNet50 training step with the S2D pass (target: under 2 s).

    python benchmarks/s2d_rewrite_time.py [--batch 32] [--size 224]

Traces one SGD training step (GradientTape + optimizer update + next(iterator)), then times
capture (GraphDef + library), the pass manager (S2D on target tpu) and the re-import as a callable.
The peer is TensorFlow's own trace of the step, measured in the same run.
"""

import argparse
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    import keras
    import tensorflow as tf

    from tftpu.graph.capture import capture
    from tftpu.pipelines.optimize import OptimizedFunction, default_passes
    from tftpu.graph.pass_manager import GraphContext, PassManager
    from tftpu.graph.surgery import GraphEditor
    from tftpu.passes.cost import Target

    model = keras.applications.ResNet50(weights=None, input_shape=(args.size, args.size, 3))
    opt = keras.optimizers.SGD(0.1, momentum=0.9)
    opt.build(model.trainable_variables)
    ds = tf.data.Dataset.from_tensors((tf.zeros((args.size, args.size, 3), tf.uint8), 0)).repeat().batch(args.batch)
    it = iter(ds)

    @tf.function
    def step():
        x, y = next(it)
        x = tf.cast(x, tf.float32) / 127.5 - 1.0
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, model(x, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    t0 = time.perf_counter()
    step.get_concrete_function()
    trace = time.perf_counter() - t0
    rows = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        cap = capture(step)
        t1 = time.perf_counter()
        ed = GraphEditor(cap.graph_def)
        report = PassManager(default_passes()).run(GraphContext(ed, cap.arg_names, Target.load("tpu")))
        t2 = time.perf_counter()
        fast = OptimizedFunction(cap, ed.graph_def, report)
        t3 = time.perf_counter()
        rows.append((t1 - t0, t2 - t1, t3 - t2, t3 - t0))
    best = min(rows, key=lambda r: r[-1])
    print(report)
    print(f"ResNet50 training step, batch {args.batch}, {args.size}x{args.size}: {len(cap.graph_def.node)} nodes")
    print(f"TensorFlow trace of the step (peer): {trace:.2f} s")
    print(f"rewrite: capture {best[0]:.2f} s + passes {best[1]:.2f} s + re-import {best[2]:.2f} s "
          f"= {best[3]:.2f} s (target < 2 s: {'OK' if best[3] < 2 else 'MISSED'}); "
          f"{best[3] / trace:.2f}x the trace time")
    assert fast.report.applied("space_to_depth")


if __name__ == "__main__":
    main()
