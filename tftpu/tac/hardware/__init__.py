"""Hardware models of TAC: base classes, registry, built-in CPU/GPU/NNAPI."""

from tftpu.tac.hardware.base import ConfiguredHardware, SimpleHardware, TargetHardware
from tftpu.tac.hardware.registry import get, load_plugin, names, register

__all__ = ["TargetHardware", "SimpleHardware", "ConfiguredHardware", "register", "get", "names", "load_plugin"]
