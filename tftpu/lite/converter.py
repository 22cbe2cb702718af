"""`tftpu.lite.TFLiteConverter`: TensorFlow's `tf.lite.TFLiteConverter` plus tftpu's options.

The constructors build TensorFlow's own converter and give it a subclass that adds four
attributes; with none of them set, `convert()` is TensorFlow's, byte for byte:

- `space_to_depth` (True: the target cost model decides, with block 2; an int: that block size)
  and `s2d_input`: the S2D rewrite of the first stride-2 conv before conversion (`tftpu.lite.s2d`).
- `calibration_method` ("mse", "kl", "percentile", "minmax") for INT8: tftpu's thresholds
  replace the ranges TFLite's calibrator recorded, then TF's quantizer writes the model.
- `device_specs` (e.g. ("GPU", "CPU")): TAC on the converted model (`tftpu.tac.run`).

`converter.report` holds what each of them did, with the numbers behind it.
"""

from __future__ import annotations


__all__ = ["TFLiteConverter", "TFTPU_OPTIONS"]

from tftpu.lite.options import TFTPU_OPTIONS


class _TftpuOptions:
    """Mixed into TensorFlow's converter classes: tftpu's attributes and the convert() around TF's."""

    device_specs = None
    space_to_depth = None
    s2d_input = False
    s2d_target = "tpu"
    calibration_method = None
    report = None
    _tftpu_source = None

    def _tftpu_active(self) -> bool:
        return bool(self.device_specs) or not (self.space_to_depth is None or self.space_to_depth is False) \
            or self.calibration_method is not None or bool(self.s2d_input)

    def convert(self):
        """TensorFlow's conversion, then tftpu's options in order: S2D, INT8 ranges, TAC."""
        if not self._tftpu_active():            # (the report says so: no option ran)
            from tftpu.lite import runtime

            self.report = {"interpreter": runtime.name()}
            return super().convert()
        from tftpu.lite import pipeline

        model, self.report = pipeline.convert(self, TFLiteConverter)
        return model

    def _tf_convert(self):
        """TensorFlow's convert() on this converter (with the INT8 range hook when asked)."""
        return super().convert()

    def _quantize(self, result, input_type, output_type, activations_type, bias_type, allow_float,
                  enable_variable_quantization, debug_options):
        if self.calibration_method is None:
            return super()._quantize(result, input_type, output_type, activations_type, bias_type, allow_float,
                                     enable_variable_quantization, debug_options)
        from tftpu.lite import quantize

        return quantize.quantize_with_tftpu_ranges(
            self, super()._quantize, result, input_type, output_type, activations_type, bias_type,
            allow_float, enable_variable_quantization, debug_options)


_CLASSES: dict[type, type] = {}


def _adopt(converter, source):
    """Give TF's `converter` the tftpu subclass of its own class (nothing else changes)."""
    cls = type(converter)
    sub = _CLASSES.get(cls)
    if sub is None:
        sub = type(cls.__name__, (_TftpuOptions, cls), {"__module__": __name__,
                                                         "__doc__": f"tftpu's {cls.__name__}."})
        _CLASSES[cls] = sub
    converter.__class__ = sub
    converter._tftpu_source = source
    return converter


class TFLiteConverter:
    """Drop-in for `tf.lite.TFLiteConverter`: same constructors and attributes, plus
    `device_specs`, `space_to_depth`, `s2d_input`, `s2d_target`, `calibration_method`, `report`.
    Like TensorFlow's, it is built from concrete functions directly too: `TFLiteConverter(funcs,
    trackable_obj)`; what any constructor returns is TensorFlow's own converter (an instance of
    `tf.lite.TFLiteConverter`'s class for that source) with tftpu's attributes added."""

    def __new__(cls, funcs, trackable_obj=None):
        import tensorflow as tf

        return _adopt(tf.lite.TFLiteConverter(funcs, trackable_obj), ("concrete_functions", list(funcs), trackable_obj))

    @classmethod
    def from_keras_model(cls, model):
        import tensorflow as tf

        return _adopt(tf.lite.TFLiteConverter.from_keras_model(model), ("keras", model))

    @classmethod
    def from_saved_model(cls, saved_model_dir, signature_keys=None, tags=None):
        import tensorflow as tf

        return _adopt(tf.lite.TFLiteConverter.from_saved_model(saved_model_dir, signature_keys, tags),
                      ("saved_model", str(saved_model_dir), signature_keys, tags))

    @classmethod
    def from_concrete_functions(cls, funcs, trackable_obj=None):
        import tensorflow as tf

        return _adopt(tf.lite.TFLiteConverter.from_concrete_functions(funcs, trackable_obj),
                      ("concrete_functions", list(funcs), trackable_obj))

    @classmethod
    def experimental_from_jax(cls, serving_funcs, inputs):
        import tensorflow as tf

        return _adopt(tf.lite.TFLiteConverter.experimental_from_jax(serving_funcs, inputs), ("jax",))
