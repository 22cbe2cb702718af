"""tftpu-tac: target-aware conversion of a TFLite model: place each op on a device by cost.

    tftpu-tac model.tflite -o model_tac.tflite --device_specs=GPU,CPU [--output_mlir=model.mlir]
"""

from absl import flags

from tftpu import cli

flags.DEFINE_string("o", None, "output .tflite")
flags.DEFINE_list("device_specs", ["GPU", "CPU"], "devices in order of preference (CPU is always last)")
flags.DEFINE_string("output_mlir", None, "also write the annotated graph as MLIR text")
flags.DEFINE_bool("inline_subgraphs", True, "inline raised subgraphs in the MLIR output")
flags.DEFINE_string("report", None, "write the JSON report here")

main = cli.not_yet_available("tftpu-tac", "TAC issue")


def run():
    cli.run(main, __doc__, positional=True)


if __name__ == "__main__":
    run()
