"""The built-in devices, modelled on TFLite's CPU kernels, GPU delegate and NNAPI delegate.

Their op sets and constants are in `tftpu/configs/hardware/{cpu,gpu,nnapi}.yaml`; the registry
registers them under their names.
"""

from __future__ import annotations

from tftpu.tac.hardware.base import ConfiguredHardware


class CpuHardware(ConfiguredHardware):
    """TFLite's CPU kernels: every op and inference type; the fallback of every plan."""

    name = "CPU"
    config_name = "cpu"


class GpuHardware(ConfiguredHardware):
    """TFLite GPU delegate: float only; Pack/Split/SplitV/Sub/SquaredDifference need lowering."""

    name = "GPU"
    config_name = "gpu"


class NnapiHardware(ConfiguredHardware):
    """Android NNAPI delegate: float and int8 ops; no custom ops."""

    name = "NNAPI"
    config_name = "nnapi"


BUILTIN = (CpuHardware, GpuHardware, NnapiHardware)
