"""The `.tpumodel` file: a compiled program in the sections of `tftpu.backend.model_file`.

| section   | holds |
|-----------|-------|
| `meta`    | JSON: format, tftpu version, chip, mode, inputs and outputs (name, shape, dtype, DDR address, quantization, host preprocessing), DDR size, weight addresses, host ops |
| `chip`    | the chip description (YAML) the program was compiled for: the simulator enforces it |
| `module`  | the TPU module (`.tpu.mlir` text): each op's semantics and tensor types |
| `program` | JSON: the command list (load / store / compute / global / host, with deps and cycles) |
| `weights` | the weight region of DDR, byte for byte (each weight at its address) |

JSON is written with sorted keys and no spaces, so the same program gives the same bytes.

>>> save(program, "resnet.tpumodel")           # doctest: +SKIP
>>> program = load("resnet.tpumodel")          # doctest: +SKIP
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tftpu import chip as chips
from tftpu.backend.codegen import Program
from tftpu.backend.model_file import read_model_file, write_model_file
from tftpu.errors import ConfigError, InternalError, ModelFileError, TftpuError
from tftpu.ir import attrs as A
from tftpu.ir import top
from tftpu.ir.base import value_name
from tftpu.version import __version__

__all__ = ["save", "load", "FORMAT", "SECTIONS"]

FORMAT = "tftpu.tpumodel"
SECTIONS = ("meta", "chip", "module", "program", "weights")
_KINDS = ("load", "store", "compute", "global", "host")


def _json(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode("utf-8")


def _chip_text(program) -> str:
    if program.chip_text:
        return program.chip_text
    chip = program.chip
    path = Path(chip.path) if chip.path else None
    if path is None or not path.is_file():
        raise ConfigError(f"chip {chip.name!r}: its description file is gone, cannot embed it")
    return path.read_text(encoding="utf-8")


def save(program: Program, path, meta: dict | None = None) -> Path:
    """Write `program` to `path` atomically; `meta` adds entries (e.g. the report's figures)."""
    model = program.model
    if program.memory is None:
        raise InternalError("tpumodel.save", "a loaded program is saved by copying its file")
    weights = {}
    for op in model.ops:
        if isinstance(op, top.Weight):
            weights[op.key] = program.memory.addresses[value_name(op.results[0])][0]
    head = {"format": FORMAT, "tftpu": __version__, "chip": program.chip.name, "mode": model.mode,
            "inputs": program.inputs, "outputs": program.outputs, "ddr_bytes": program.ddr_bytes,
            "weights": weights, "host": list(program.host), **(meta or {})}
    sections = {"meta": _json(head), "chip": _chip_text(program).encode("utf-8"),
                "module": model.file_text().encode("utf-8"), "program": _json(program.commands),
                "weights": program.weight_blob()}
    write_model_file(path, sections)
    return Path(path)


def load(path) -> Program:
    """Read a `.tpumodel`; ModelFileError naming the file and the section for anything wrong."""
    import yaml

    from tftpu.ir.group import unwrap
    from tftpu.ir.module import TpuModel, parse_module

    sections = read_model_file(path)
    missing = [s for s in SECTIONS if s not in sections]
    if missing:
        raise ModelFileError(path, f"no {missing[0]!r} section (it has {', '.join(sections) or 'none'})")
    try:
        meta = json.loads(sections["meta"].decode("utf-8"))
        commands = json.loads(sections["program"].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFileError(path, f"meta or program section is not JSON: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ModelFileError(path, f"meta section is not a {FORMAT} description")
    try:
        chip_data = yaml.safe_load(sections["chip"].decode("utf-8"))
        chip = chips.from_data(chip_data, f"{path}[chip]")
    except (UnicodeDecodeError, yaml.YAMLError, TftpuError) as e:
        raise ModelFileError(path, f"chip section: {' '.join(str(e).split())[:200]}") from None
    try:
        module = parse_module(sections["module"].decode("utf-8"), f"{path}[module]")
    except UnicodeDecodeError:
        raise ModelFileError(path, "module section is not UTF-8 text") from None
    try:
        unwrap(module)
    except Exception as e:      # xDSL's errors on a malformed region are of many kinds
        raise ModelFileError(path, f"module section: malformed tpu.Group: {type(e).__name__}: {e}") from None
    model = TpuModel(module)
    blob = sections["weights"]
    try:
        model.weights = _weights(model, meta["weights"], blob)
        model.verify()
        _check_program(commands, len(model.ops), meta)
    except (KeyError, ValueError, TypeError, IndexError, AttributeError) as e:
        raise ModelFileError(path, f"not a valid program: {type(e).__name__}: {e}") from None
    return Program(chip, model, commands, meta["inputs"], meta["outputs"], int(meta["ddr_bytes"]), blob,
                   host=list(meta.get("host", [])), chip_text=sections["chip"].decode("utf-8"), meta=meta)


def _weights(model, addresses: dict, blob: bytes) -> dict:
    out = {}
    for op in model.ops:
        if not isinstance(op, top.Weight):
            continue
        t = op.results[0].type
        dtype = A.numpy_dtype(A.dtype_name(t.element_type))
        shape = tuple(t.get_shape())
        addr = int(addresses[op.key])
        n = int(np.prod(shape)) * dtype.itemsize
        if addr < 0 or addr + n > len(blob):
            raise ValueError(f"weight {op.key!r} at {addr}..{addr + n} lies outside the {len(blob)}-byte weight region")
        out[op.key] = np.frombuffer(blob, dtype, count=int(np.prod(shape)), offset=addr).reshape(shape)
    return out


def _check_program(commands, n_ops: int, meta: dict) -> None:
    """The command list's structure (the simulator checks addresses as it runs)."""
    if not isinstance(commands, list):
        raise TypeError("the program is not a list of commands")
    for i, c in enumerate(commands):
        if not isinstance(c, dict) or c.get("kind") not in _KINDS:
            raise ValueError(f"command {i} is not a known command")
        if not all(isinstance(d, int) and 0 <= d < i for d in c.get("deps", [])):
            raise ValueError(f"command {i} waits for a command that is not before it")
        if c["kind"] in ("compute", "global", "host") and not (isinstance(c.get("op"), int) and 0 <= c["op"] < n_ops):
            raise ValueError(f"command {i} names no op of the module")
        if not isinstance(c.get("cycles", 0), int) or c.get("cycles", 0) < 0:
            raise ValueError(f"command {i} has bad cycles")
    for d in list(meta["inputs"]) + list(meta["outputs"]):
        if not isinstance(d.get("ddr"), int) or not isinstance(d.get("shape"), list):
            raise ValueError(f"tensor description {d.get('name')!r} is incomplete")
