"""Per-device constants from `configs/hardware/<name>.yaml` (throughput, bandwidth, transfer,
quantize/dequantize costs, supported ops), checked on load so a bad file fails with one line."""

from __future__ import annotations

import functools
from pathlib import Path

from tftpu import errors
from tftpu.utils import config as shared

_REQUIRED = {"name": str, "inference_types": list, "supported_ops": (list, str), "cost": dict,
             "transfer": dict, "quant": dict}
_COST = ("throughput_gflops", "bandwidth_gbps", "op_overhead_us")
_TRANSFER = ("us_per_byte", "fixed_us")
_QUANT = ("quant_us_per_element", "dequant_us_per_element", "requant_us_per_element")


def config_dir() -> Path:
    """`$TFTPU_HARDWARE_CONFIGS`, else `$TFTPU_CONFIGS/hardware`, else `configs/hardware` of the source tree."""
    return shared.config_dir("hardware")


def find(name: str) -> Path | None:
    """The YAML file describing device `name` (case-insensitive file stem), or None."""
    return shared.find("hardware", name.lower())


@functools.lru_cache(maxsize=None)
def load(path) -> dict:
    """Load and check one hardware YAML file; raise ConfigError naming the file and key."""
    path = Path(path)
    data = shared.load_yaml(path, "hardware config")
    for key, kind in _REQUIRED.items():
        if key not in data:
            raise errors.ConfigError(f"{path}: missing key '{key}'")
        if not isinstance(data[key], kind):
            raise errors.ConfigError(f"{path}: key '{key}' has the wrong type")
    for section, keys in (("cost", _COST), ("transfer", _TRANSFER), ("quant", _QUANT)):
        for key in keys:
            if key not in data[section]:
                raise errors.ConfigError(f"{path}: missing key '{section}.{key}'")
    tp = data["cost"]["throughput_gflops"]
    if not isinstance(tp, dict) or not all(_positive(v) for v in tp.values()):
        raise errors.ConfigError(f"{path}: 'cost.throughput_gflops' must map inference types to positive numbers")
    for section, key in (("cost", "bandwidth_gbps"),):
        if not _positive(data[section][key]):
            raise errors.ConfigError(f"{path}: '{section}.{key}' must be a positive number")
    for section, keys in (("cost", ("op_overhead_us",)), ("transfer", _TRANSFER), ("quant", _QUANT)):
        for key in keys:
            v = data[section][key]
            if not isinstance(v, (int, float)) or v < 0:
                raise errors.ConfigError(f"{path}: '{section}.{key}' must be a number >= 0")
    return data


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
