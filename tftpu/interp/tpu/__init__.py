"""Inference of TPU modules: exact INT8 kernels, BF16/F16 float kernels, one interpreter."""

from tftpu.interp.tpu.info import OpInfo, TensorInfo, info_of
from tftpu.interp.tpu.interpreter import TpuInterpreter, kernel_of, run
from tftpu.interp.tpu import int8_deconv, int8_scale, int8_softmax  # noqa: F401,E402  (registers INT8 kernels)

__all__ = ["TpuInterpreter", "run", "kernel_of", "TensorInfo", "OpInfo", "info_of"]
