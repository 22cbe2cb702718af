"""TAC's importers and exporters, one registry each: any format in, any format out.

An importer turns a file into the TFLite object tree (`ModelT`) TAC works on; an exporter turns
a `TacResult` into bytes or text. Built in: `.tflite` in; `tflite`, `mlir` and `json` (the
report) out. Register your own:

>>> @register_importer(".mytf")                                       # doctest: +SKIP
... def read_mytf(path): return tflite_io.read(decode(path))
>>> @register_exporter("summary", ".txt")                             # doctest: +SKIP
... def write_summary(result): return "\\n".join(...)
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Callable

from tftpu import errors
from tftpu.tac import tflite_io
from tftpu.utils import files

__all__ = ["register_importer", "register_exporter", "importers", "exporters", "read", "export",
           "exporter_for"]


@dataclasses.dataclass(frozen=True)
class Exporter:
    name: str
    suffix: str
    write: Callable          # TacResult -> bytes | str


_IMPORTERS: dict[str, Callable] = {}
_EXPORTERS: dict[str, Exporter] = {}


def register_importer(suffix: str, fn: Callable | None = None, *, replace: bool = False):
    """Register `fn(path) -> ModelT` for files ending in `suffix` (usable as a decorator)."""
    suffix = suffix.lower() if suffix.startswith(".") else "." + suffix.lower()

    def add(f):
        if suffix in _IMPORTERS and not replace:
            raise errors.UsageError(f"an importer for {suffix} is already registered (pass replace=True)")
        _IMPORTERS[suffix] = f
        return f

    return add(fn) if fn is not None else add


def register_exporter(name: str, suffix: str, fn: Callable | None = None, *, replace: bool = False):
    """Register `fn(result) -> bytes | str` as format `name`, chosen for outputs ending in `suffix`."""
    suffix = suffix.lower() if suffix.startswith(".") else "." + suffix.lower()

    def add(f):
        if name in _EXPORTERS and not replace:
            raise errors.UsageError(f"an exporter named {name!r} is already registered (pass replace=True)")
        _EXPORTERS[name] = Exporter(name, suffix, f)
        return f

    return add(fn) if fn is not None else add


def importers() -> list[str]:
    return sorted(_IMPORTERS)


def exporters() -> list[str]:
    return sorted(_EXPORTERS)


def _suffix(path: Path, known) -> str | None:
    name = path.name.lower()
    hits = [s for s in known if name.endswith(s)]
    return max(hits, key=len) if hits else None


def read(src):
    """The `ModelT` of `src`: bytes (TFLite), a `ModelT`, or a path read by its suffix's importer."""
    if isinstance(src, (bytes, bytearray, memoryview)):
        return tflite_io.read(src)
    if hasattr(src, "subgraphs") and hasattr(src, "operatorCodes"):
        return src
    path = Path(os.fspath(src))
    suffix = _suffix(path, _IMPORTERS)
    if suffix is None:
        if not path.suffix:
            return tflite_io.read(path)   # no suffix at all: try the flatbuffer
        raise errors.ModelFileError(path, f"no TAC importer for this file type (registered: "
                                          f"{', '.join(importers())})")
    model = _IMPORTERS[suffix](path)
    if not (hasattr(model, "subgraphs") and hasattr(model, "operatorCodes")):
        raise errors.UsageError(f"the importer for {suffix} returned {type(model).__name__}, not a TFLite ModelT")
    tflite_io.validate(model, str(path))
    return model


def exporter_for(path, format: str | None = None) -> Exporter:
    """The exporter named `format`, or the one whose suffix `path` ends with."""
    if format is not None:
        if format not in _EXPORTERS:
            raise errors.UsageError(f"no TAC exporter named {format!r} (registered: {', '.join(exporters())})")
        return _EXPORTERS[format]
    by_suffix = {e.suffix: e for e in reversed(list(_EXPORTERS.values()))}
    suffix = _suffix(Path(os.fspath(path)), by_suffix)
    if suffix is None:
        raise errors.UsageError(f"{path}: no TAC exporter for this file type (registered: "
                                f"{', '.join(f'{e.name} ({e.suffix})' for e in _EXPORTERS.values())})")
    return by_suffix[suffix]


def export(result, path, format: str | None = None) -> None:
    """Write `result` to `path` with its exporter, atomically."""
    data = exporter_for(path, format).write(result)
    if isinstance(data, str):
        files.write_text(path, data)
    else:
        files.write_bytes(path, bytes(data))


register_importer(".tflite", tflite_io.read)
register_exporter("tflite", ".tflite", lambda r: r.tflite())
register_exporter("mlir", ".mlir", lambda r: r.mlir(inline_subgraphs=True))
register_exporter("json", ".json", lambda r: json.dumps(r.report, indent=2) + "\n")
