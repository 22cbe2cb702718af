"""tftpu-optimize: run tftpu's TF graph passes (space-to-depth, ...) on a SavedModel.

    tftpu-optimize --saved_model_dir=IN --output_dir=OUT [--target=tpu] [--disable=space_to_depth]

Writes a SavedModel whose serving signature takes the original inputs and prints each pass's
decisions with their reasons. The target is the chip whose cost model decides whether a pass
pays: `tpu` (128x128 matrix units) applies space-to-depth to a first stride-2 conv on few
channels, `cpu` (this kind of x86 machine) declines it with its numbers; the targets are the
chips of tftpu/configs/chips/ (listed under --target), or a path to a chip YAML of the same form.
"""

from absl import flags

from tftpu import chip, cli

flags.DEFINE_string("saved_model_dir", None, "SavedModel to optimize")
flags.DEFINE_string("output_dir", None, "where to write the optimized SavedModel")
flags.DEFINE_string("target", "tpu", f"chip whose cost model decides: {', '.join(chip.known())} "
                    "(tftpu/configs/chips/NAME.yaml), or a path to a chip YAML")
flags.DEFINE_list("disable", [], "passes to skip, e.g. space_to_depth")
flags.DEFINE_integer("block_size", 2, "space-to-depth block size")

FLAGS = flags.FLAGS


def main(args):
    from tftpu.errors import UsageError

    if not FLAGS.saved_model_dir or not FLAGS.output_dir:
        raise UsageError("--saved_model_dir and --output_dir are required")
    if FLAGS.block_size < 2:
        raise UsageError(f"--block_size must be at least 2, got {FLAGS.block_size}")
    from tftpu.pipelines.saved_model import optimize_saved_model
    from tftpu.passes.cost import Target

    Target.load(FLAGS.target)  # a bad target fails before the model is loaded
    reports = optimize_saved_model(
        FLAGS.saved_model_dir, FLAGS.output_dir, target=FLAGS.target, disable=FLAGS.disable,
        pass_options={"space_to_depth": {"block_size": FLAGS.block_size}})
    for key, report in reports.items():
        print(f"signature {key}:")
        print("\n".join("  " + line for line in str(report).splitlines()))
    print(f"wrote {FLAGS.output_dir}")
    return 0


def _paths(args):
    from tftpu.utils import output_paths

    output_paths.check([], [("--saved_model_dir", FLAGS.saved_model_dir)],
                       directories=[("--output_dir", FLAGS.output_dir)])


def run():
    cli.run(main, __doc__, tensorflow=True, paths=_paths)


if __name__ == "__main__":
    run()
