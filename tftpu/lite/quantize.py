"""INT8 through TensorFlow's own quantizer with tftpu's ranges (the `_quantize` hook).

TF's `_quantize` calibrates then calls `mlir_quantize`; here its calibrate-only mode gives the
calibrated float model, `tftpu.lite.calibration` replaces the recorded ranges, and
`mlir_quantize` is called with exactly the arguments TF's own path passes.
"""

from __future__ import annotations

from tftpu import errors
from tftpu.lite import calibration


def quantize_with_tftpu_ranges(converter, tf_quantize, result, input_type, output_type, activations_type,
                               bias_type, allow_float, enable_variable_quantization, debug_options):
    import tensorflow as tf
    from tensorflow.lite.python.convert import mlir_quantize

    if activations_type != tf.int8:
        raise errors.UsageError(f"calibration_method works for INT8 activations; this conversion asks for "
                                f"{activations_type.name} (16x8)")
    if not converter.experimental_new_quantizer:
        raise errors.UsageError("calibration_method needs experimental_new_quantizer=True (the MLIR quantizer)")
    saved = converter._experimental_calibrate_only
    converter._experimental_calibrate_only = True
    try:
        calibrated = tf_quantize(result, input_type, output_type, activations_type, bias_type, allow_float,
                                 enable_variable_quantization, debug_options)
    finally:
        converter._experimental_calibrate_only = saved
    dataset = converter.representative_dataset
    gen = dataset.input_gen if hasattr(dataset, "input_gen") else dataset
    method = converter.calibration_method

    def quantize(changes) -> bytes:
        return mlir_quantize(
            calibration.replace_ranges(bytes(calibrated), changes),
            converter._experimental_disable_per_channel,
            input_data_type=input_type,
            output_data_type=output_type,
            enable_variable_quantization=enable_variable_quantization,
            disable_per_channel_for_dense_layers=converter._experimental_disable_per_channel_quantization_for_dense_layers,
            debug_options_str=debug_options.SerializeToString(),
        )

    if method == "auto":
        changes, chosen, score = calibration.auto_ranges(bytes(calibrated), gen, quantize)
        converter._tftpu_ranges = calibration.summary(changes, method, chosen, score)
    else:
        changes = calibration.tftpu_ranges(bytes(calibrated), gen, method)
        converter._tftpu_ranges = calibration.summary(changes, method)
    return quantize(changes)
