"""Chip YAML files for tests: a bundled chip with some fields changed or removed."""

from __future__ import annotations

import yaml

from tftpu.utils.config import DEFAULT_ROOT

REMOVE = object()


def chip_data(base: str = "npu1", **fields) -> dict:
    """The fields of bundled chip `base`, with `fields` replacing (or, as REMOVE, deleting) some."""
    data = yaml.safe_load((DEFAULT_ROOT / "chips" / f"{base}.yaml").read_text())
    for key, value in fields.items():
        if value is REMOVE:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def chip_file(path, base: str = "npu1", **fields):
    """Write `chip_data(base, **fields)` to `path`; returns the path."""
    path.write_text(yaml.safe_dump(chip_data(base, **fields), sort_keys=False))
    return path
