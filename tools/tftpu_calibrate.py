"""tftpu-calibrate: build a calibration table for INT8 quantization of a TOP model.

    tftpu-calibrate --mlir=resnet.top.mlir --dataset=images/ --input_num=20 -o resnet_cali_table
"""

from absl import flags

from tftpu import cli

flags.DEFINE_string("mlir", None, "TOP .mlir to calibrate")
flags.DEFINE_string("dataset", None, "directory of images or .npz/.npy inputs")
flags.DEFINE_integer("input_num", 20, "number of calibration inputs")
flags.DEFINE_enum("calibration_method", "kl", ["minmax", "percentile", "kl", "mse"], "threshold method")
flags.DEFINE_string("o", None, "output calibration table")

main = cli.not_yet_available("tftpu-calibrate", "quantization issue")


def run():
    cli.run(main, __doc__)


if __name__ == "__main__":
    run()
