"""Read and write `.tflite` files with TensorFlow's own flatbuffer schema (object API).

`read` checks the file identifier, the schema version and every index the model holds before
anything uses it, so a truncated, foreign or corrupt file fails with one `ModelFileError` line.
`write` packs the object tree back; reading then writing an unchanged model runs identically.

>>> model = read("model.tflite")           # doctest: +SKIP
>>> data = write(model)                    # doctest: +SKIP
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

from tftpu import errors
from tftpu.tac.schema import builtin_names, schema, tensor_type_names
from tftpu.utils import files

FILE_IDENTIFIER = b"TFL3"
SCHEMA_VERSION = 3
_ITEMSIZE = {"float32": 4, "float16": 2, "int32": 4, "uint8": 1, "int64": 8, "bool": 1,
             "int16": 2, "int8": 1, "float64": 8, "complex64": 8, "complex128": 16,
             "uint64": 8, "uint32": 4, "uint16": 2, "bfloat16": 2}


def load_bytes(src) -> tuple[bytes, str]:
    """Return (file bytes, label for messages) from a path or a bytes-like object."""
    if isinstance(src, (bytes, bytearray, memoryview)):
        return bytes(src), "<tflite bytes>"
    path = Path(os.fspath(src))
    try:
        return path.read_bytes(), str(path)
    except FileNotFoundError:
        raise errors.ModelFileError(path, "no such file") from None
    except IsADirectoryError:
        raise errors.ModelFileError(path, "is a directory, not a .tflite file") from None
    except OSError as e:
        raise errors.ModelFileError(path, f"cannot read: {e.strerror}") from None


def read(src):
    """Parse a `.tflite` (path or bytes) into a mutable `ModelT`; raise ModelFileError if bad."""
    data, label = load_bytes(src)
    _check_header(data, label)
    fb = schema()
    try:
        model = fb.ModelT.InitFromObj(fb.Model.GetRootAsModel(data, 0))
    except (struct.error, IndexError, ValueError, TypeError, UnicodeDecodeError, OverflowError) as e:
        raise errors.ModelFileError(label, f"corrupt or truncated TFLite flatbuffer ({type(e).__name__}: {e})") from None
    _resolve_offsets(model, data, label)
    validate(model, label)
    model.tftpu_trailing = _trailing_zip(data)
    return model


def write(model) -> bytes:
    """Pack a `ModelT` into `.tflite` bytes (file identifier TFL3)."""
    import flatbuffers

    builder = flatbuffers.Builder(1 << 16)
    builder.Finish(model.Pack(builder), file_identifier=FILE_IDENTIFIER)
    return bytes(builder.Output()) + getattr(model, "tftpu_trailing", b"")


def save(model, path) -> None:
    """Write a `ModelT` to `path` atomically."""
    files.write_bytes(path, write(model))


def _check_header(data: bytes, label: str) -> None:
    if len(data) < 8:
        raise errors.ModelFileError(label, f"too short to be a TFLite model ({len(data)} bytes)")
    ident = data[4:8]
    if ident != FILE_IDENTIFIER:
        raise errors.ModelFileError(
            label, f"not a TFLite flatbuffer (file identifier {ident!r}, expected {FILE_IDENTIFIER!r})")
    (root,) = struct.unpack_from("<I", data, 0)
    if root + 4 > len(data):
        raise errors.ModelFileError(label, f"truncated TFLite flatbuffer (root table at {root}, "
                                           f"file has {len(data)} bytes)")


def _trailing_zip(data: bytes) -> bytes:
    """The zip of associated files (labels...) that TFLite metadata appends after the flatbuffer."""
    import io
    import zipfile

    if b"PK\x05\x06" not in data[-(1 << 16) - 22:]:
        return b""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            start = min([i.header_offset for i in z.infolist()] + [z.start_dir])
    except (zipfile.BadZipFile, ValueError, OSError):
        return b""
    (root,) = struct.unpack_from("<I", data, 0)
    return data[start:] if root < start < len(data) else b""


def _resolve_offsets(model, data: bytes, label: str) -> None:
    """Models over 2 GB keep buffers after the flatbuffer: pull them in (as flatbuffer_utils does)."""
    for i, buf in enumerate(model.buffers or []):
        if buf.offset:
            if buf.offset + buf.size > len(data):
                raise errors.ModelFileError(label, f"buffer {i} lies past the end of the file (truncated)")
            buf.data = np.frombuffer(data, np.uint8, buf.size, buf.offset).copy()
            buf.offset = buf.size = 0
    for subgraph in model.subgraphs or []:
        for op in subgraph.operators or []:
            if op.largeCustomOptionsOffset:
                end = op.largeCustomOptionsOffset + op.largeCustomOptionsSize
                if end > len(data):
                    raise errors.ModelFileError(label, "custom options lie past the end of the file (truncated)")
                op.customOptions = np.frombuffer(data[op.largeCustomOptionsOffset:end], np.uint8).copy()
                op.largeCustomOptionsOffset = op.largeCustomOptionsSize = 0


def validate(model, label: str = "<model>") -> None:
    """Check the schema version and every cross-reference; raise ModelFileError naming the spot."""
    if model.version != SCHEMA_VERSION:
        raise errors.ModelFileError(label, f"unsupported TFLite schema version {model.version} "
                                           f"(expected {SCHEMA_VERSION})")
    if not model.subgraphs:
        raise errors.ModelFileError(label, "model has no subgraphs")
    codes = model.operatorCodes or []
    buffers = model.buffers or []
    names = builtin_names()
    for c, code in enumerate(codes):
        if max(code.builtinCode, code.deprecatedBuiltinCode) not in names:
            raise errors.ModelFileError(label, f"operator code {c}: unknown builtin "
                                               f"{max(code.builtinCode, code.deprecatedBuiltinCode)}")
    types = tensor_type_names()
    for s, sg in enumerate(model.subgraphs):
        tensors = sg.tensors or []
        n = len(tensors)
        for t, tensor in enumerate(tensors):
            where = f"subgraph {s} tensor {t} ({_str(tensor.name)})"
            if tensor.type not in types:
                raise errors.ModelFileError(label, f"{where}: unknown tensor type {tensor.type}")
            if not 0 <= tensor.buffer < max(len(buffers), 1):
                raise errors.ModelFileError(label, f"{where}: buffer index {tensor.buffer} out of range")
            _check_buffer_size(model, tensor, types[tensor.type], label, where)
        for field in ("inputs", "outputs"):
            for t in getattr(sg, field) if getattr(sg, field) is not None else []:
                if not 0 <= t < n:
                    raise errors.ModelFileError(label, f"subgraph {s} {field[:-1]} tensor {t} out of range")
        for o, op in enumerate(sg.operators or []):
            if not 0 <= op.opcodeIndex < len(codes):
                raise errors.ModelFileError(label, f"subgraph {s} op {o}: opcode index {op.opcodeIndex} "
                                                   "out of range")
            for t in list(op.inputs if op.inputs is not None else []) + \
                    list(op.outputs if op.outputs is not None else []):
                if not -1 <= t < n:
                    raise errors.ModelFileError(label, f"subgraph {s} op {o}: tensor index {t} out of range")
    for m in model.metadata or []:
        if not 0 <= m.buffer < len(buffers):
            raise errors.ModelFileError(label, f"metadata {_str(m.name)!r}: buffer {m.buffer} out of range")


def _check_buffer_size(model, tensor, dtype: str, label: str, where: str) -> None:
    if tensor.buffer <= 0 or tensor.sparsity is not None or dtype not in _ITEMSIZE:
        return
    data = model.buffers[tensor.buffer].data
    if data is None or len(data) == 0:
        return
    shape = tensor.shape if tensor.shape is not None else []
    need = int(np.prod(shape, dtype=np.int64)) * _ITEMSIZE[dtype]
    if len(data) != need:
        raise errors.ModelFileError(label, f"{where}: buffer holds {len(data)} bytes, shape "
                                           f"{list(map(int, shape))} {dtype} needs {need} (truncated or corrupt)")


def _str(s) -> str:
    return s.decode("utf-8", "replace") if isinstance(s, bytes) else str(s)
