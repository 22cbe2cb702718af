"""tftpu-convert: TensorFlow's tflite_convert plus tftpu's options (S2D, TAC devices, better INT8).

    tftpu-convert --saved_model_dir=DIR | --keras_model_file=M.keras --output_file=m.tflite
        [--signature_key=serving_default] [--device_specs=GPU,CPU] [--space_to_depth [--s2d_block_size=2]
        [--s2d_input] [--s2d_target=tpu]] [--quantize=int8 --representative_data=DIR
        [--calibration_method=mse] [--mean=127.5 --scale=0.0078125] [--skip_unreadable]] [--report=report.json]

Without tftpu flags the output is TensorFlow's converter output, byte for byte.

`--representative_data` is read as tftpu-calibrate reads `--dataset`: a directory (files sorted
by name), a glob or a TFRecord file of images or `.npz`/`.npy` inputs, streamed one sample at a
time (memory stays bounded however many there are), with a progress bar on stderr when it is a
terminal. A file that cannot be read stops the conversion naming it (exit 2), or with
--skip_unreadable is skipped with a warning.
"""

from absl import flags

from tftpu import cli

flags.DEFINE_string("saved_model_dir", None, "SavedModel directory to convert")
flags.DEFINE_string("keras_model_file", None, "Keras model file (.keras or .h5) to convert")
flags.DEFINE_string("output_file", None, "output .tflite")
flags.DEFINE_string("signature_key", None, "SavedModel signature to convert (default: all / the serving one)")
flags.DEFINE_list("device_specs", [], "TAC: devices in order of preference, e.g. GPU,CPU (CPU is always last)")
flags.DEFINE_bool("space_to_depth", False, "S2D of the first stride-2 conv; the target's cost model decides "
                  "unless --s2d_block_size forces a block size")
flags.DEFINE_integer("s2d_block_size", None, "force S2D with this block size", lower_bound=2)
flags.DEFINE_bool("s2d_input", False, "the model takes space-to-depth input (Keras sources; the host "
                  "transform is recorded in the metadata)")
flags.DEFINE_string("s2d_target", "tpu", "chip whose cost model decides S2D (tftpu/configs/chips/NAME.yaml or a path)")
cli.define_mode("quantize", None, ["int8"], "full-integer post-training quantization")
flags.DEFINE_string("representative_data", None, "INT8 calibration inputs: a directory, a glob (quoted: "
                    "'val/*.jpg') or a TFRecord file of images or .npz/.npy inputs, read lazily")
flags.DEFINE_integer("input_num", 100, "number of calibration inputs (the first, by file name); 0 for all",
                     lower_bound=0)
flags.DEFINE_list("mean", ["0"], "per-channel mean subtracted from image pixels")
flags.DEFINE_list("scale", ["1"], "per-channel scale applied after the mean")
flags.DEFINE_enum("pixel_format", "rgb", ["rgb", "bgr", "gray"], "channel order images are fed in")
flags.DEFINE_bool("skip_unreadable", False, "skip (with a warning) representative files that cannot be read, "
                  "instead of stopping at the first")
flags.DEFINE_bool("progress", None, "a progress bar (images/s, time left) on stderr; by default only when "
                  "stderr is a terminal")
flags.DEFINE_enum("calibration_method", None, ["mse", "tail_mse", "kl", "percentile", "minmax", "aciq_gauss",
                                               "aciq_laplace", "auto"],
                  "tftpu's ranges for INT8 (default mse with --quantize=int8)")
flags.DEFINE_string("report", None, "write the JSON report here")

FLAGS = flags.FLAGS



def main(args):
    from tftpu import errors
    from tftpu.lite import command
    from tftpu.utils import progress

    progress.show(FLAGS.progress)

    if FLAGS.s2d_block_size and not FLAGS.space_to_depth:
        raise errors.UsageError("--s2d_block_size needs --space_to_depth")
    s2d = (FLAGS.s2d_block_size or True) if FLAGS.space_to_depth else None
    report = command.convert(
        FLAGS.output_file, saved_model_dir=FLAGS.saved_model_dir, keras_model_file=FLAGS.keras_model_file,
        signature_key=FLAGS.signature_key, device_specs=FLAGS.device_specs, space_to_depth=s2d,
        s2d_input=FLAGS.s2d_input, s2d_target=FLAGS.s2d_target, quantize=FLAGS.quantize,
        representative_data=FLAGS.representative_data, input_num=FLAGS.input_num,
        mean=cli.floats(FLAGS.mean, "mean"), scale=cli.floats(FLAGS.scale, "scale"), pixel_format=FLAGS.pixel_format,
        skip_unreadable=FLAGS.skip_unreadable, calibration_method=FLAGS.calibration_method, report=FLAGS.report)
    print(command.summary(FLAGS.output_file, report))
    return 0


def _paths(args):
    from tftpu.utils import output_paths

    output_paths.check([("--output_file", FLAGS.output_file), ("--report", FLAGS.report)],
                       [("--saved_model_dir", FLAGS.saved_model_dir), ("--keras_model_file", FLAGS.keras_model_file),
                        ("--representative_data", FLAGS.representative_data)])


def run():
    cli.run(main, __doc__, tensorflow=True, paths=_paths)


if __name__ == "__main__":
    run()
