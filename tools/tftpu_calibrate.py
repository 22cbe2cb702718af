"""tftpu-calibrate: build a calibration table for INT8 quantization of a TOP model.

    tftpu-calibrate --mlir=resnet.top.mlir --dataset=images/ --input_num=20 -o resnet_cali_table
    tftpu-calibrate --mlir=m.top.mlir --dataset=npz_dir/ --calibration_method=kl -o m_cali_table
    tftpu-calibrate --mlir=m.top.mlir --dataset=images/ --calibration_method=auto --asymmetric -o m_cali_table
    tftpu-calibrate --mlir=m.top.mlir --dataset=images/ --calibration_method=mse,minmax -o m_cali_table
    tftpu-calibrate --mlir=m.top.mlir --dataset='val/*.jpg' --input_num=0 --skip_unreadable -o m_cali_table
    tftpu-calibrate --mlir=m.top.mlir --dataset=val.tfrecord --input_num=1000 -o m_cali_table

Runs the TOP model on the first `--input_num` inputs of `--dataset` (0: all of them): a directory
(files sorted by name), a glob, or a TFRecord file of tf.train.Examples (an encoded image under
`image/encoded`, or one `tf.io.serialize_tensor` per input keyed by its name; see
`tftpu.quant.dataset`). The inputs are read one at a time, so memory stays bounded however many
there are; with fewer than asked it says so and uses them all. Images are resized to the input
and turned into `(pixel - mean) * scale`; `.npz`/`.npy` files are taken as they are. A file that
cannot be read stops the run naming it (exit 2), or with --skip_unreadable is skipped with a
warning. A progress bar (images/s, time left) goes to stderr when it is a terminal (--progress /
--noprogress to choose). It writes, for every float
tensor, the INT8 threshold chosen by the method (mse: least expected squared error;
kl: TensorRT's entropy method; percentile: 99.99% of |x|; minmax: the largest |x|;
aciq_gauss / aciq_laplace: ACIQ's closed-form clip of a fitted Gaussian / Laplace; tail_mse: mse
with the clipped values' error counted 64 times, for detectors' rare large values; auto: per
tensor, whichever of those changes the ops it feeds least, judged on the first --tune_num
inputs) with the observed min and max (with --asymmetric: the method's clipped range for INT8
asymmetric mode), in TPU-MLIR's table layout. Several methods joined by commas (the default
mse,tail_mse) each give a table from the same statistics: the first one's rows are written, the
others' follow as alternates in comment lines (`#tail_mse name threshold min max`, which
TPU-MLIR's reader skips), and tftpu-deploy with a --test_input builds the program with each in
turn where the one before misses its target, the best kept, as tftpu.compile does. Then (`--simulate`, on by default) it runs the
inputs again with simulated INT8 weights and activations and prints each output's worst cosine
and mean SQNR against float. The same inputs give a byte-identical table.

`--workers=N` starts N worker processes on this machine (tf.distribute's MultiWorkerMirroredStrategy
on loopback), each running every N-th input; `--tf_config` makes this process one worker of the
cluster the TF_CONFIG variable describes (run the same command on every machine; worker 0 writes
the table). Their statistics merge exactly: the table is byte-identical to one process's.
"""

from absl import flags, logging

from tftpu import cli

flags.DEFINE_string("mlir", None, "TOP .mlir to calibrate (its weights .npz beside it)")
cli.define_dataset_flags(20, "calibration")
flags.DEFINE_string("calibration_method", "mse,tail_mse",
                    "threshold method: minmax, percentile, kl, mse (kl broke mtcnn O-Net), aciq_gauss, aciq_laplace, "
                    "tail_mse (mse counting the clipped values' error 64 times), auto (picks per tensor); or several "
                    "joined by commas: the first one's table is written with the others' as alternates, which "
                    "tftpu-deploy with a --test_input builds with in turn where the one before misses its target "
                    "(default mse,tail_mse, as tftpu.compile)")
flags.DEFINE_bool("asymmetric", True, "also calibrate each tensor's [min, max] for INT8 asymmetric mode "
                  "(written in the min/max columns; the header says so), which tftpu-deploy then reads for the "
                  "activations whose range is one-sided, as tftpu.compile does; --noasymmetric: the observed min/max")
flags.DEFINE_integer("tune_num", 5, "inputs auto judges its candidates on (the first ones)", lower_bound=1)
flags.DEFINE_string("o", None, "output calibration table")
flags.DEFINE_bool("simulate", True, "then run the calibration inputs with simulated INT8 and print how close "
                  "the outputs stay to float")

FLAGS = flags.FLAGS


def main(args):
    from tftpu import errors, quant
    from tftpu.ir.module import TpuModel, load
    from tftpu.pipelines.calibration_choice import methods_of

    cluster = cli.dataset_tool("mlir", "dataset", "o")
    methods = methods_of(FLAGS.calibration_method)
    model = load(FLAGS.mlir)
    if isinstance(model, TpuModel):
        raise errors.ModelFileError(FLAGS.mlir, "is a TPU module (already lowered): calibrate the TOP .mlir "
                                                "it was lowered from")
    samples = cli.dataset_samples(model)
    table = quant.calibrate(model, samples, ",".join(methods), asymmetric=FLAGS.asymmetric,
                            tune_num=FLAGS.tune_num, workers=FLAGS.workers, cluster=cluster)
    if FLAGS["input_num"].present and FLAGS.input_num and table.samples < FLAGS.input_num:  # asked for more
        logging.warning("--input_num=%d, but %s holds %d input(s): calibrating on those %d",
                        FLAGS.input_num, FLAGS.dataset, table.samples, table.samples)
    if cluster is not None and not cluster.is_chief:
        print(f"worker {cluster.rank} of {cluster.size}: done (the chief writes {FLAGS.o})")
        return 0
    table.save(FLAGS.o)
    kind = " and asymmetric ranges" if FLAGS.asymmetric else ""
    print(f"{FLAGS.o}: {len(table.entries)} tensors, {table.method} thresholds{kind} "
          f"from {table.samples} inputs{cli.skipped_note(samples)}")
    if table.alternates:
        print(f"alternates: {', '.join(table.alternates)} (tftpu-deploy with --test_input builds with them in turn "
              "where the table before misses its target)")
    if table.chosen:
        print("auto chose: " + ", ".join(f"{m} for {n} tensors" for m, n in table.counts().items()))
    if FLAGS.simulate and (FLAGS.workers > 1 or cluster is not None):
        print("simulated INT8 vs float: not run with --workers / --tf_config (it runs in one process); "
              "tftpu-evaluate --workers judges the deployed model")
    elif FLAGS.simulate:
        print(f"simulated INT8 vs float on those inputs: {quant.evaluate(model, table, samples)}")
    return 0


def _paths(args):
    from tftpu.utils import output_paths

    output_paths.check([("-o", FLAGS.o)],
                       [("--mlir", FLAGS.mlir), ("--mlir's weights", output_paths.mlir_weights(FLAGS.mlir)),
                        ("--dataset", FLAGS.dataset)])


def run():
    cli.run(main, __doc__, paths=_paths)


if __name__ == "__main__":
    run()
