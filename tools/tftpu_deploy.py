"""tftpu-deploy: lower a TOP model to the TPU dialect for a chip and write the model file.

    tftpu-deploy --mlir=resnet.top.mlir --quantize=INT8 --chip=npu1 \
        --calibration_table=resnet_cali_table --test_input=in.npz \
        --test_reference=resnet_top_outputs.npz --tolerance=0.99,0.9 --model=resnet.tpumodel
"""

from absl import flags

from tftpu import cli

flags.DEFINE_string("mlir", None, "TOP .mlir to deploy")
flags.DEFINE_enum("quantize", "F32", ["F32", "BF16", "F16", "INT8"], "arithmetic of the TPU model")
flags.DEFINE_string("chip", None, "chip name (configs/chips/NAME.yaml) or a path")
flags.DEFINE_string("calibration_table", None, "calibration table (INT8)")
flags.DEFINE_string("test_input", None, ".npz input to verify with")
flags.DEFINE_string("test_reference", None, ".npz of reference outputs")
flags.DEFINE_string("tolerance", "0.99,0.99", "minimum cosine,euclidean similarity")
flags.DEFINE_string("model", None, "output model file")

main = cli.not_yet_available("tftpu-deploy", "TPU dialect and backend issues")


def run():
    cli.run(main, __doc__)


if __name__ == "__main__":
    run()
