"""tftpu-optimize: run tftpu's TF graph passes (space-to-depth, ...) on a SavedModel.

    tftpu-optimize --saved_model_dir=IN --output_dir=OUT [--target=tpu] [--disable=space_to_depth]

Writes a SavedModel whose serving signature takes the original inputs and prints each pass's
decisions with their reasons.
"""

from absl import flags

from tftpu import cli

flags.DEFINE_string("saved_model_dir", None, "SavedModel to optimize")
flags.DEFINE_string("output_dir", None, "where to write the optimized SavedModel")
flags.DEFINE_string("target", "tpu", "target whose cost model decides (configs/targets/NAME.yaml or a path)")
flags.DEFINE_list("disable", [], "passes to skip, e.g. space_to_depth")
flags.DEFINE_integer("block_size", 2, "space-to-depth block size")

main = cli.not_yet_available("tftpu-optimize", "space-to-depth issue")


def run():
    cli.run(main, __doc__)


if __name__ == "__main__":
    run()
