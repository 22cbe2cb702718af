"""TOP -> TPU lowering, per op family and mode: INT8 lowerings by full op name
(`registry.INT8["top.Conv"]`), one float lowering for F32/BF16/F16, and the driver `lower`."""

from tftpu.transforms.lowering.context import Decision
from tftpu.transforms.lowering.lower import LoweringReport, float_mode_of, lower
from tftpu.transforms.lowering.registry import INT8
from tftpu.transforms.lowering import int8_deconv, int8_scale, int8_softmax  # noqa: F401,E402  (registers INT8 lowerings)

__all__ = ["lower", "LoweringReport", "Decision", "INT8", "float_mode_of"]
