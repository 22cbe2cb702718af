"""Per-device constants from `tftpu/configs/hardware/<name>.yaml` (throughput, bandwidth,
transfer, quantize/dequantize costs, supported ops), checked on load so a bad file fails with one line."""

from __future__ import annotations

import functools
from pathlib import Path

from tftpu import errors
from tftpu.utils import config as shared

_REQUIRED = {"name": str, "inference_types": list, "supported_ops": (list, str), "cost": dict,
             "transfer": dict, "quant": dict}
_OPTIONAL = {"description": str, "activation_dtypes": list, "max_rank": int, "custom_ops": list,
             "op_constraints": dict, "transformations": list}
_COST = ("throughput_gflops", "bandwidth_gbps", "op_overhead_us")
_TRANSFER = ("us_per_byte", "fixed_us")
_QUANT = ("quant_us_per_element", "dequant_us_per_element", "requant_us_per_element")


def config_dir() -> Path:
    """`$TFTPU_HARDWARE_CONFIGS`, else `$TFTPU_CONFIGS/hardware`, else the bundled `tftpu/configs/hardware`."""
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
    for key, kind in _OPTIONAL.items():
        if key in data and not isinstance(data[key], kind):
            raise errors.ConfigError(f"{path}: key '{key}' has the wrong type (expected {kind.__name__}, got "
                                     f"{type(data[key]).__name__})")
    unknown = sorted(set(data) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise errors.ConfigError(f"{path}: unknown key(s) {', '.join(map(repr, unknown))}")
    if isinstance(data.get("max_rank"), bool) or data.get("max_rank", 0) < 0:
        raise errors.ConfigError(f"{path}: 'max_rank' must be a whole number >= 0")
    for key in ("inference_types", "custom_ops", "activation_dtypes", "transformations"):
        if not all(isinstance(v, str) for v in data.get(key) or []):
            raise errors.ConfigError(f"{path}: '{key}' must be a list of names")
    for key, ops in (data.get("op_constraints") or {}).items():
        if not isinstance(ops, list) or not all(isinstance(v, str) for v in ops):
            raise errors.ConfigError(f"{path}: 'op_constraints.{key}' must be a list of op names")
    eff = data["cost"].get("efficiency", {}) or {}
    if not isinstance(eff, dict) or not all(_positive(v) for v in eff.values()):
        raise errors.ConfigError(f"{path}: 'cost.efficiency' must map op types to positive numbers")
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
