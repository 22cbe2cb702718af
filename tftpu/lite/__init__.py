"""tftpu.lite: the TFLite converter extension (drop-in `TFLiteConverter`, `tftpu-convert`).

>>> converter = tftpu.lite.TFLiteConverter.from_keras_model(model)     # doctest: +SKIP
>>> converter.device_specs = ("GPU", "CPU"); converter.space_to_depth = True   # doctest: +SKIP
>>> tflite_bytes = converter.convert(); converter.report                     # doctest: +SKIP
"""

from tftpu.lite.converter import TFTPU_OPTIONS, TFLiteConverter

__all__ = ["TFLiteConverter", "TFTPU_OPTIONS"]
