"""tftpu.tac: target-aware conversion of TFLite models (place ops on CPU/GPU/NNAPI/... by cost).

>>> import tftpu.tac as tac
>>> result = tac.run("model.tflite", device_specs=("GPU", "CPU"))   # doctest: +SKIP
>>> result.save("model_tac.tflite")                                 # doctest: +SKIP

Add hardware by subclassing `SimpleHardware` or `TargetHardware` and registering it by name.
"""

from tftpu.tac.api import TacResult, resolve_devices, run
from tftpu.tac.formats import register_exporter, register_importer
from tftpu.tac.hardware import ConfiguredHardware, SimpleHardware, TargetHardware
from tftpu.tac.hardware.registry import get as get_hardware
from tftpu.tac.hardware.registry import load_plugin, names as hardware_names, register

__all__ = ["run", "TacResult", "SimpleHardware", "TargetHardware", "ConfiguredHardware", "register",
           "get_hardware", "hardware_names", "load_plugin", "resolve_devices",
           "register_importer", "register_exporter"]
