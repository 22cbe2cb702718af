"""Hardware registry: device names -> `TargetHardware` factories, and plug-in loading.

>>> from tftpu.tac import SimpleHardware, register
>>> @register("FOO")
... class Foo(SimpleHardware):
...     def advantage_over_cpu(self): return 5.0
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Callable

from tftpu import errors
from tftpu.tac.hardware import builtin, config
from tftpu.tac.hardware.base import ConfiguredHardware, SimpleHardware, TargetHardware

_FACTORIES: dict[str, Callable] = {}
_INSTANCES: dict[str, object] = {}


def register(name: str, factory: Callable | None = None, *, replace: bool = False):
    """Register `factory` (a `TargetHardware` subclass or a callable) under `name`; usable as a decorator."""

    def deco(f):
        key = name.upper()
        if key in _FACTORIES and _FACTORIES[key] is not f and not replace:
            raise errors.ConfigError(f"hardware {key} is already registered")
        _FACTORIES[key] = f
        _INSTANCES.pop(key, None)
        if isinstance(f, type) and not getattr(f, "name", ""):
            f.name = key
        return f

    return deco(factory) if factory is not None else deco


def names() -> list[str]:
    """Registered device names, plus those with a YAML file in tftpu/configs/hardware."""
    _builtins()
    found = {p.stem.upper() for p in config.config_dir().glob("*.yaml")} - {"SIMPLE"}
    return sorted(set(_FACTORIES) | found)


def get(name: str):
    """The (shared) hardware instance registered as `name` (case-insensitive)."""
    _builtins()
    key = name.upper()
    if key not in _INSTANCES:
        factory = _FACTORIES.get(key)
        if factory is None:
            hw = _from_yaml(key)
        else:
            try:
                hw = factory()
            except TypeError as e:  # e.g. a plug-in that leaves an abstract method undefined
                raise errors.UsageError(f"hardware '{key}' cannot be created: {e}") from None
        if not getattr(hw, "name", ""):
            hw.name = key
        if hw.name.upper() != key:
            hw.name = key
        if isinstance(hw, SimpleHardware):
            hw.reference = lambda: get("CPU")    # costs relative to the registered CPU
        _INSTANCES[key] = hw
    return _INSTANCES[key]


def _from_yaml(key: str):
    path = config.find(key)
    if path is None:
        raise errors.UsageError(f"unknown hardware '{key}' (known: {', '.join(names())}; a plug-in is "
                                "given as package.module:Class or path/to/file.py:Class)")
    hw = ConfiguredHardware(path)
    hw.name = key
    return hw


def load_plugin(spec: str) -> str:
    """Import `pkg.module:Class` or `path/to/file.py:Class`, register the class, return its name."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise errors.UsageError(f"bad hardware plug-in '{spec}': expected package.module:Class or file.py:Class")
    if target.endswith(".py") or os.sep in target:
        path = Path(target)
        if not path.is_file():
            raise errors.UsageError(f"hardware plug-in file {path} not found")
        if path.suffix != ".py":
            raise errors.UsageError(f"hardware plug-in file {path} is not a Python file (.py)")
        import hashlib

        mod_name = "tftpu_tac_plugin_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
        module = sys.modules.get(mod_name)
        if module is None:
            spec_ = importlib.util.spec_from_file_location(mod_name, path)
            module = importlib.util.module_from_spec(spec_)
            sys.modules[mod_name] = module
            try:
                spec_.loader.exec_module(module)
            except (Exception, SystemExit) as e:  # a user's plug-in file: report its failure on one line
                del sys.modules[mod_name]
                raise errors.UsageError(f"hardware plug-in {path} failed to load: {type(e).__name__}: {e}") from None
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise errors.UsageError(f"hardware plug-in module {target} cannot be imported: {e}") from None
        except (Exception, SystemExit) as e:  # a user's plug-in module: report its failure on one line
            raise errors.UsageError(f"hardware plug-in module {target} failed to load: {type(e).__name__}: {e}") from None
    cls = getattr(module, attr, None)
    if cls is None:
        raise errors.UsageError(f"hardware plug-in {target} has no attribute {attr}")
    if not (isinstance(cls, type) and issubclass(cls, TargetHardware)):
        raise errors.UsageError(f"hardware plug-in {spec} is not a TargetHardware subclass")
    for key, f in _FACTORIES.items():
        if f is cls:
            return key
    name = (getattr(cls, "name", "") or cls.__name__).upper()
    register(name, cls, replace=True)
    return name


_LOADED = False


def _builtins() -> None:
    global _LOADED
    if not _LOADED:
        _LOADED = True
        for cls in builtin.BUILTIN:
            _FACTORIES.setdefault(cls.name, cls)   # a device the user registered first keeps its name
