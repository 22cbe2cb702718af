"""tftpu-tac: target-aware conversion of a TFLite model: place each op on a device by cost.

    tftpu-tac model.tflite -o model_tac.tflite --device_specs=GPU,CPU [--output_mlir=model.mlir]
        [--inline_subgraphs=false] [--report=report.json]

A --device_specs entry may be a plug-in: package.module:ClassName or path/to/file.py:ClassName
(a tftpu.tac.SimpleHardware / TargetHardware subclass).
"""

import json

from absl import flags

from tftpu import cli, errors

flags.DEFINE_string("o", None, "output .tflite")
flags.DEFINE_list("device_specs", ["GPU", "CPU"], "devices in order of preference (CPU is always last)")
flags.DEFINE_string("output_mlir", None, "also write the annotated graph as MLIR text")
flags.DEFINE_bool("inline_subgraphs", True, "inline raised subgraphs in the MLIR output")
flags.DEFINE_string("report", None, "write the JSON report here")

FLAGS = flags.FLAGS


def main(args):
    if len(args) != 2:
        raise errors.UsageError("expected exactly one INPUT.tflite argument")
    from tftpu import tac
    from tftpu.utils import files

    result = tac.run(args[1], device_specs=FLAGS.device_specs)
    if FLAGS.o:
        result.save(FLAGS.o)
    if FLAGS.output_mlir:
        files.write_text(FLAGS.output_mlir, result.mlir(inline_subgraphs=FLAGS.inline_subgraphs))
    report = result.report
    if FLAGS.report:
        files.write_text(FLAGS.report, json.dumps(report, indent=2) + "\n")
    print(result.table())
    return 0


def _paths(args):
    from tftpu.utils import output_paths

    plugins = [spec.rsplit(":", 1)[0] for spec in FLAGS.device_specs if ".py:" in spec]
    output_paths.check([("-o", FLAGS.o), ("--output_mlir", FLAGS.output_mlir), ("--report", FLAGS.report)],
                       [("the input", args[1] if len(args) == 2 else None)]
                       + [("--device_specs", p) for p in plugins])


def run():
    cli.run(main, __doc__, positional=True, paths=_paths)


if __name__ == "__main__":
    run()
