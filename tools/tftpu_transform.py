"""tftpu-transform: import a model (ONNX, Keras, SavedModel, TFLite) into the TOP dialect.

    tftpu-transform --model_name=resnet --model_def=resnet.onnx --input_shapes=[[1,3,224,224]] \
        --test_input=in.npz --test_result=resnet_top_outputs.npz --mlir=resnet.top.mlir

Writes NAME.top.mlir and its weights .npz; with a test input, checks every shared tensor
against the source framework and exits 1 below tolerance.
"""

from absl import flags

from tftpu import cli

flags.DEFINE_string("model_name", None, "name of the model (module.name)")
flags.DEFINE_string("model_def", None, "model file: .onnx, .tflite, .keras/.h5, or a SavedModel directory")
flags.DEFINE_string("input_shapes", None, "input shapes, e.g. [[1,3,224,224]]")
flags.DEFINE_string("test_input", None, ".npz (or .npy) input to verify the import with")
flags.DEFINE_string("test_result", None, ".npz to write the TOP outputs of the test input to")
flags.DEFINE_string("tolerance", "0.99,0.99", "minimum cosine,euclidean similarity")
flags.DEFINE_string("layout", None, "convert data layout: NCHW or NHWC")
flags.DEFINE_string("mlir", None, "output .top.mlir path")

FLAGS = flags.FLAGS


def main(args):
    import os
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import time
    from pathlib import Path

    from tftpu import errors
    from tftpu.frontend import source_kind, to_onnx
    from tftpu.frontend.check import compare, onnx_tensors, table, tf_outputs
    from tftpu.interp.similarity import parse_tolerance
    from tftpu.frontend.onnx_load import parse_shapes
    from tftpu.frontend.onnx_to_top import onnx_to_top
    from tftpu.ir.weights import load_npz, save_npz
    from tftpu.transforms.canonicalize import canonicalize

    if not FLAGS.model_def:
        raise errors.UsageError("--model_def is required")
    if FLAGS.layout and FLAGS.layout not in ("NCHW", "NHWC"):
        raise errors.UsageError(f"--layout must be NCHW or NHWC, not {FLAGS.layout!r}")
    tolerance = parse_tolerance(FLAGS.tolerance)
    shapes = parse_shapes(FLAGS.input_shapes)
    kind = source_kind(FLAGS.model_def)
    if kind == "mlir":
        raise errors.UsageError("--model_def is already a TOP .mlir; use tftpu-run to run it")
    name = FLAGS.model_name or Path(FLAGS.model_def).stem
    mlir = Path(FLAGS.mlir or f"{name}.top.mlir")
    inputs = load_npz(FLAGS.test_input) if FLAGS.test_input else None

    t0 = time.perf_counter()
    proto = to_onnx(FLAGS.model_def, shapes)
    model = onnx_to_top(proto, name, shapes if kind == "onnx" else None)
    n_before = len(model.ops)
    report = canonicalize(model)
    if FLAGS.layout:
        from tftpu.transforms.convert_layout import convert_layout
        print(f"convert layout to {FLAGS.layout}: {convert_layout(model, FLAGS.layout)}")
        canonicalize(model)
    _, weight_path = model.save(mlir)
    print(f"{mlir}: {len(model.ops)} ops ({n_before} before canonicalize: {report}); "
          f"{_flops(model.flops())}; weights {weight_path}; {time.perf_counter() - t0:.2f} s")
    if inputs is None:
        return 0

    from tftpu.interp.top_interpreter import run
    got = run(model, inputs, dump_all=True)
    if FLAGS.test_result:
        save_npz(FLAGS.test_result, got)
    ref = onnx_tensors(proto, inputs)
    results = [("onnxruntime", compare(ref, got, tolerance))]
    if kind != "onnx":
        src = tf_outputs(FLAGS.model_def, kind, inputs, [o.name for o in proto.graph.output])
        results.append((kind, compare(src, {k: got[k] for k in model.output_names if k in got}, tolerance)))
    rows = []
    for ref_name, result in results:
        print(f"TOP vs {ref_name}:")
        print(table(result, (ref_name, "TOP")), end="")
        rows += result.rows
    if not rows:
        raise errors.CheckFailed("no tensor is shared between TOP and the reference; nothing was checked")
    bad = [r for r in rows if not r.passed]
    worst = min(rows, key=lambda r: (r.cosine, r.euclid))
    if bad:
        raise errors.ToleranceError(f"{len(bad)} of {len(rows)} tensors below tolerance {FLAGS.tolerance}; "
                                    f"worst {worst.name!r}: cosine {worst.cosine:.6f}, euclidean {worst.euclid:.6f}")
    print(f"all {len(rows)} tensors within tolerance; min cosine {worst.cosine:.9f} ({worst.name})")
    return 0


def _flops(n: int) -> str:
    return f"{n / 1e9:.2f} GFLOPs" if n >= 1e9 else f"{n / 1e6:.2f} MFLOPs"


def run():
    cli.run(main, __doc__, tensorflow=True)


if __name__ == "__main__":
    run()
