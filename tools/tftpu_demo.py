"""tftpu-demo: run tftpu end to end on the bundled default model and photo.

    tftpu-demo [--output_dir=tftpu_demo_out]
"""

from absl import flags

from tftpu import cli

flags.DEFINE_string("output_dir", "tftpu_demo_out", "where the demo writes its models and reports")
flags.DEFINE_integer("image_size", 224, "side of the square input image")
FLAGS = flags.FLAGS


def main(args):
    from tftpu import demo
    from tftpu.errors import CheckFailed

    summary = demo.run(FLAGS.output_dir, FLAGS.image_size)
    if summary["cosine"] < 0.99999:
        raise CheckFailed(f"onnxruntime output differs from Keras: cosine {summary['cosine']:.6f}")
    print(f"demo passed: outputs in {FLAGS.output_dir}/")
    return 0


def run():
    cli.run(main, __doc__, tensorflow=True)


if __name__ == "__main__":
    run()
