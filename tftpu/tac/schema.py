"""The TFLite flatbuffer schema module that ships inside TensorFlow, loaded without TensorFlow.

`tensorflow/lite/python/schema_py_generated.py` only needs `flatbuffers`; importing it through
the `tensorflow` package would first run TensorFlow's whole `__init__` (seconds), so it is
loaded straight from the installed file. Falls back to the ordinary import.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

from tftpu import errors

_NAME = "tensorflow.lite.python.schema_py_generated"


@functools.lru_cache(maxsize=None)
def schema():
    """Return TensorFlow's generated TFLite schema module (`Model`, `ModelT`, `BuiltinOperator`...)."""
    if _NAME in sys.modules:
        return sys.modules[_NAME]
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        raise errors.ConfigError("TensorFlow is not installed: the TFLite schema ships inside it")
    for root in spec.submodule_search_locations:
        path = Path(root) / "lite" / "python" / "schema_py_generated.py"
        if path.is_file():
            file_spec = importlib.util.spec_from_file_location("tftpu_tflite_schema", path)
            module = importlib.util.module_from_spec(file_spec)
            file_spec.loader.exec_module(module)
            return module
    return importlib.import_module(_NAME)


@functools.lru_cache(maxsize=None)
def builtin_names() -> dict[int, str]:
    """BuiltinOperator code -> name ("CONV_2D")."""
    ops = schema().BuiltinOperator
    return {v: k for k, v in vars(ops).items() if not k.startswith("_") and isinstance(v, int)}


@functools.lru_cache(maxsize=None)
def builtin_codes() -> dict[str, int]:
    """BuiltinOperator name -> code."""
    return {v: k for k, v in builtin_names().items()}


@functools.lru_cache(maxsize=None)
def tensor_type_names() -> dict[int, str]:
    """TensorType code -> lower-case name ("float32", "int8", ...)."""
    types = schema().TensorType
    return {v: k.lower() for k, v in vars(types).items() if not k.startswith("_") and isinstance(v, int)}


@functools.lru_cache(maxsize=None)
def tensor_type_codes() -> dict[str, int]:
    """Lower-case TensorType name -> code."""
    return {v: k for k, v in tensor_type_names().items()}


@functools.lru_cache(maxsize=None)
def options_type_code(class_name: str) -> int:
    """BuiltinOptions union tag of an options class name ("ConcatenationOptions")."""
    return getattr(schema().BuiltinOptions, class_name)
