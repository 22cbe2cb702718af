r"""tftpu-transform: import a model (ONNX, Keras, SavedModel, TFLite) into the TOP dialect.

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
flags.DEFINE_string("passes", None, "TOP pass pipeline, MLIR syntax, e.g. "
                    "\"canonicalize,convert-layout{layout=NHWC},canonicalize\" (default: canonicalize, "
                    "plus convert-layout with --layout)")
flags.DEFINE_string("mlir", None, "output .top.mlir path")

FLAGS = flags.FLAGS


def main(args):
    from tftpu import errors
    from tftpu.frontend.check import table
    from tftpu.frontend.onnx_load import parse_shapes
    from tftpu.pipelines.transform import transform
    from tftpu.interp.similarity import parse_tolerance
    from tftpu.ir.weights import load_npz

    if not FLAGS.model_def:
        raise errors.UsageError("--model_def is required")
    tolerance = parse_tolerance(FLAGS.tolerance)
    r = transform(FLAGS.model_def, name=FLAGS.model_name, input_shapes=parse_shapes(FLAGS.input_shapes),
                  layout=FLAGS.layout, mlir=FLAGS.mlir, passes=FLAGS.passes,
                  test_input=load_npz(FLAGS.test_input) if FLAGS.test_input else None,
                  test_result=FLAGS.test_result, tolerance=tolerance)
    for p in r.passes:
        if p.name == "convert-layout":
            print(f"convert layout to {p.detail.layout}: {p.detail}")
    ran = "; ".join(f"{p.name}: {p.detail}" for p in r.passes)
    print(f"{r.mlir}: {len(r.model.ops)} ops ({r.ops_before} imported; {ran}); "
          f"{_flops(r.model.flops())}; weights {r.weights}; {r.seconds:.2f} s")
    if not FLAGS.test_input:
        return 0
    for ref_name, result in r.checks:
        print(f"TOP vs {ref_name}:")
        print(table(result, (ref_name, "TOP")), end="")
    if not r.rows:
        raise errors.CheckFailed("no tensor is shared between TOP and the reference; nothing was checked")
    worst = r.worst
    if r.failed:
        raise errors.ToleranceError(f"{len(r.failed)} of {len(r.rows)} tensors below tolerance {FLAGS.tolerance}; "
                                    f"worst {worst.name!r}: cosine {worst.cosine:.6f}, euclidean {worst.euclid:.6f}")
    print(f"all {len(r.rows)} tensors within tolerance; min cosine {worst.cosine:.9f} ({worst.name})")
    return 0


def _paths(args):
    """--mlir (default NAME.top.mlir), its weights beside it and --test_result, against the inputs."""
    from pathlib import Path

    from tftpu.ir.module import default_weight_file
    from tftpu.utils import output_paths

    name = FLAGS.model_name or (Path(str(FLAGS.model_def)).stem if FLAGS.model_def else None)
    mlir = FLAGS.mlir or (f"{name}.top.mlir" if name else None)
    weights = Path(mlir).parent / default_weight_file(name) if mlir and name else None
    output_paths.check([("--mlir", mlir), ("--mlir's weights", weights), ("--test_result", FLAGS.test_result)],
                       [("--model_def", FLAGS.model_def), ("--test_input", FLAGS.test_input)])


def _flops(n: int) -> str:
    return f"{n / 1e9:.2f} GFLOPs" if n >= 1e9 else f"{n / 1e6:.2f} MFLOPs"


def run():
    cli.run(main, __doc__, tensorflow=True, paths=_paths)


if __name__ == "__main__":
    run()
