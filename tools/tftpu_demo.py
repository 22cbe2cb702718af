"""tftpu-demo: run tftpu end to end on the bundled default model and photo.

    tftpu-demo [--output_dir=tftpu_demo_out]
"""

from absl import flags

from tftpu import cli

flags.DEFINE_string("output_dir", "tftpu_demo_out", "where the demo writes its models and reports")
flags.DEFINE_integer("image_size", 224, "side of the square input image")
FLAGS = flags.FLAGS


def main(args):
    from tftpu.pipelines import demo
    from tftpu.errors import CheckFailed

    from tftpu.errors import UsageError

    if not 32 <= FLAGS.image_size <= 1024:
        raise UsageError(f"--image_size={FLAGS.image_size}: expected 32 to 1024 pixels")
    summary = demo.run(FLAGS.output_dir, FLAGS.image_size)
    worst = min(summary["cosine"], summary["nhwc_cosine"], summary["top_min_cosine"])
    checks = (summary["passed"], summary["tpu_passed"], summary["model_passed"], summary["sim_bit_exact"],
              worst >= 0.99999, summary["s2d_max_abs_diff"] <= 1e-3)
    if not all(checks):
        raise CheckFailed(f"a stage differs from the one before it: min cosine {worst:.6f}, "
                          f"space-to-depth max |diff| {summary['s2d_max_abs_diff']:.1e}, "
                          f"TPU INT8 vs TOP cosine {summary['tpu_int8_cosine']:.6f}, simulator bit-exact "
                          f"{summary['sim_bit_exact']}")
    print(f"demo passed: outputs in {FLAGS.output_dir}/")
    return 0


def _paths(args):
    from tftpu.utils import output_paths

    output_paths.check([], directories=[("--output_dir", FLAGS.output_dir)])


def run():
    cli.run(main, __doc__, tensorflow=True, paths=_paths)


if __name__ == "__main__":
    run()
