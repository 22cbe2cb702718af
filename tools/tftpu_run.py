"""tftpu-run: inference of an .onnx (onnxruntime), a .tflite (LiteRT), .top.mlir / .tpu.mlir (TOP /
TPU interpreter) or a compiled .tpumodel (the simulated chip runs its command list).

    tftpu-run --model=resnet.top.mlir --input=in.npz --output=out.npz [--dump_all_tensors]
    tftpu-run --model=resnet.tpumodel --input=images.npz --output=out.npz
    tftpu-run --model=palm.tflite --input=in.npz --output=out.npz

A .tpumodel takes the original images even when it was compiled with space-to-depth: the host
preprocessing it records runs first. INT8 tensors are written as the float values they stand
for; --dump_all_tensors on a .tpumodel writes every tensor that reaches DDR (tensors inside a
layer group stay in local memory).

Inputs: the arrays of --input are matched to the model's inputs by name when the archive holds
a key for every input name (extra keys are ignored), else by position (the archive's order)
when it holds exactly as many arrays as the model has inputs; anything else is refused, naming
both lists. Each array must have the input's shape and is cast to its element type.
Outputs are written keyed by output tensor name (every tensor by its name with
--dump_all_tensors), so tftpu-compare can match two runs tensor by tensor.
"""

from absl import flags

from tftpu import cli

flags.DEFINE_string("model", None, "model to run: .onnx, .tflite, .mlir or a tftpu model file")
flags.DEFINE_string("input", None, ".npz of inputs: keys are input names, or one array per input in order")
flags.DEFINE_string("output", None, ".npz to write outputs to, keyed by output tensor name")
flags.DEFINE_bool("dump_all_tensors", False, "write every intermediate tensor, keyed by location")

FLAGS = flags.FLAGS


def main(args):
    import os
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from pathlib import Path

    from tftpu import errors
    from tftpu.ir.weights import load_npz, save_npz

    for flag in ("model", "input", "output"):
        if not getattr(FLAGS, flag):
            raise errors.UsageError(f"--{flag} is required")
    model_path = Path(FLAGS.model)
    if not model_path.is_file():
        raise errors.ModelFileError(model_path, "no such file")
    inputs = load_npz(FLAGS.input)
    suffix = model_path.suffix.lower()
    if suffix == ".onnx":
        from tftpu.frontend.check import onnx_tensors
        from tftpu.frontend.onnx_load import read_model
        outputs = onnx_tensors(read_model(model_path), inputs, all_tensors=FLAGS.dump_all_tensors)
    elif suffix == ".mlir":
        from tftpu.interp.top_interpreter import run as run_top
        from tftpu.interp.tpu import run as run_tpu
        from tftpu.ir.module import TpuModel, load
        model = load(model_path)
        if isinstance(model, TpuModel):
            # INT8 tensors are written as the float values they stand for, so dumps compare with TOP's
            outputs = run_tpu(model, inputs, dump_all=FLAGS.dump_all_tensors, dequantize=True)
        else:
            # per-op: for one inference it beats building the compiled graph (backend="compiled"
            # pays off from a few runs on: ResNet50 224 one-shot 0.3 s per-op vs 2.8 s compiled)
            outputs = run_top(model, inputs, dump_all=FLAGS.dump_all_tensors)
    elif suffix == ".tflite":
        from tftpu.lite.runtime import run_named
        outputs = run_named(model_path, inputs, dump_all=FLAGS.dump_all_tensors)
    elif suffix == ".tpumodel":
        from tftpu.backend import tpumodel
        from tftpu.backend.simulator import Simulator
        outputs = Simulator(tpumodel.load(model_path)).run(inputs, dump_all=FLAGS.dump_all_tensors, dequantize=True)
    else:
        raise errors.ModelFileError(model_path, f"cannot run a {suffix or 'suffix-less'} file; "
                                                "expected .onnx, .tflite, .mlir or .tpumodel")
    save_npz(FLAGS.output, outputs)
    print(f"{FLAGS.output}: {len(outputs)} tensor(s)")
    return 0


def _paths(args):
    from tftpu.utils import output_paths

    output_paths.check([("--output", FLAGS.output)],
                       [("--model", FLAGS.model), ("--model's weights", output_paths.mlir_weights(FLAGS.model)),
                        ("--input", FLAGS.input)])


def run():
    cli.run(main, __doc__, tensorflow=True, paths=_paths)


if __name__ == "__main__":
    run()
