"""tftpu-evaluate: how close a compiled model stays to float over a whole dataset.

    tftpu-evaluate --model=det.tpu.mlir --reference=det.top.mlir --dataset='val/*.jpg' --json=eval.json
    tftpu-evaluate --model=det.tpumodel --reference=det.onnx --dataset=val.tfrecord --html=eval.html
    tftpu-evaluate --model=det.tpu.mlir --reference=det.top.mlir --dataset=val/ --tolerance=0.99,20

Runs the TPU model (`--model`: a .tpu.mlir on the TPU interpreter, or a .tpumodel on the
simulator) and the float reference (`--reference`: a .top.mlir on the TOP interpreter, or an
.onnx on onnxruntime) on every input of `--dataset` (a directory, a glob or a TFRecord file, read
one input at a time, so memory stays bounded; `--input_num` limits it, 0 = all). Per output, and
per part of an output made by concatenation, it prints the cosine and SQNR against float: mean,
1st percentile (p1) and worst, naming the worst image; `--json` writes them with the `--worst`
worst images of each, `--html` a self-contained page with per-image plots. With `--tolerance`
(cosine,SQNR dB) the run fails (exit 1) where an output's or part's 1st percentile is below it.
A file that cannot be read stops the run naming it (exit 2), unless --skip_unreadable.
`--workers=N` runs the images on N worker processes of this machine, `--tf_config` as one worker
of TF_CONFIG's tf.distribute cluster (worker 0 writes --json / --html): the same per-image figures.
"""

from absl import flags

from tftpu import cli

flags.DEFINE_string("model", None, "the compiled model: a .tpu.mlir (its weights beside it) or a .tpumodel")
flags.DEFINE_string("reference", None, "the float model: a .top.mlir or an .onnx")
cli.define_dataset_flags(0, "evaluation")
flags.DEFINE_enum("engine", None, ["interpreter", "simulator"], "what runs the model (default: the TPU "
                  "interpreter for a .tpu.mlir, the simulator for a .tpumodel)")
flags.DEFINE_integer("worst", 5, "worst images named per output and part", lower_bound=0)
flags.DEFINE_string("json", None, "write the figures as JSON here")
flags.DEFINE_string("html", None, "write a self-contained HTML page with plots here")
flags.DEFINE_string("tolerance", None, "cosine,SQNR_dB the 1st percentile of every output and part must reach "
                    "(else exit 1), e.g. 0.99,20")

FLAGS = flags.FLAGS


def main(args):
    from tftpu.backend import tpumodel
    from tftpu.ir.module import load
    from tftpu.pipelines.evaluate import evaluate, parse_target

    cluster = cli.dataset_tool("model", "reference", "dataset")
    target = parse_target(FLAGS.tolerance) if FLAGS.tolerance else None
    program = FLAGS.model.endswith(".tpumodel")
    model = tpumodel.load(FLAGS.model) if program else load(FLAGS.model)
    samples = cli.dataset_samples(model.model if program else model)
    result = evaluate(model, samples, reference=FLAGS.reference, worst=FLAGS.worst, json=FLAGS.json,
                      html=FLAGS.html, engine=FLAGS.engine or ("simulator" if program else "interpreter"),
                      workers=FLAGS.workers, cluster=cluster)
    print(result)
    for path in (FLAGS.json, FLAGS.html):
        if path and (cluster is None or cluster.is_chief):
            print(f"wrote {path}")
    bad = result.below(*target) if target is not None else []
    if bad:
        print(f"under the tolerance (1st percentile cosine >= {target[0]:g}, SQNR >= {target[1]:g} dB): "
              + "; ".join(bad))
        return 1
    return 0


def _paths(args):
    from tftpu.utils import output_paths

    output_paths.check([("--json", FLAGS.json), ("--html", FLAGS.html)],
                       [("--model", FLAGS.model), ("--model's weights", output_paths.mlir_weights(FLAGS.model)),
                        ("--reference", FLAGS.reference),
                        ("--reference's weights", output_paths.mlir_weights(FLAGS.reference)),
                        ("--dataset", FLAGS.dataset)])


def run():
    cli.run(main, __doc__, paths=_paths)


if __name__ == "__main__":
    run()
