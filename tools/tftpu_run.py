"""tftpu-run: inference of an .onnx (onnxruntime), .mlir (TOP/TPU interpreter) or model file.

    tftpu-run --model=resnet.top.mlir --input=in.npz --output=out.npz [--dump_all_tensors]
"""

from absl import flags

from tftpu import cli

flags.DEFINE_string("model", None, "model to run: .onnx, .mlir or a tftpu model file")
flags.DEFINE_string("input", None, ".npz of inputs")
flags.DEFINE_string("output", None, ".npz to write outputs to")
flags.DEFINE_bool("dump_all_tensors", False, "write every intermediate tensor, keyed by location")

main = cli.not_yet_available("tftpu-run", "TOP dialect issue")


def run():
    cli.run(main, __doc__)


if __name__ == "__main__":
    run()
