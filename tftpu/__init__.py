"""tftpu: TensorFlow/Keras graph optimizer and model compiler for NPU-style accelerators.

The public API is imported lazily, so `import tftpu` stays fast and TensorFlow is only loaded
by the parts that need it.

>>> import tftpu
>>> tftpu.__version__
'0.1.0'
"""

from __future__ import annotations

import importlib

from tftpu.version import __version__  # noqa: E402,F401

from tftpu import errors  # noqa: E402  (light, no TensorFlow)

# public name -> "module:attribute" (attribute empty for a submodule)
_LAZY = {
    "optimize": "tftpu.pipelines.optimize:optimize",
    "compile": "tftpu.compiler:compile",
    "CompiledModel": "tftpu.compiler:CompiledModel",
    "OptimizedFunction": "tftpu.pipelines.optimize:OptimizedFunction",
    "evaluate": "tftpu.pipelines.evaluate:evaluate",
    "keras": "tftpu.keras:",
    "data": "tftpu.data:",
    "tac": "tftpu.tac:",
    "frontend": "tftpu.frontend:",
    "ir": "tftpu.ir:",
    "models": "tftpu.models:",
    "compat": "tftpu.compat:",
    "quant": "tftpu.quant:",
    "lite": "tftpu.lite:",
    "datasets": "tftpu.datasets:",
}


def __getattr__(name: str):
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'tftpu' has no attribute {name!r}")
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    value = getattr(module, attr) if attr else module
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
