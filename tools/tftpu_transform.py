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

main = cli.not_yet_available("tftpu-transform", "TOP dialect issue")


def run():
    cli.run(main, __doc__)


if __name__ == "__main__":
    run()
