"""Module passes over TOP (and later TPU) models: one small class per pass, registered by name,
run as a pipeline string in MLIR's syntax and verified after each pass.

>>> results = run_pipeline(model, "canonicalize,convert-layout{layout=NHWC}")   # doctest: +SKIP
>>> print(results[1])                                                         # doctest: +SKIP
convert-layout: 1 rewrite(s), 0 declined (0.012 s)
  module: applied: permutes 37 -> 0 ...

A pass is a dataclass whose fields are its options (`convert-layout{layout=NHWC}` sets
`layout`), with a `name` and one `apply(model) -> PassResult` that records each decision with
its reason. A pass that leaves an invalid module is a bug: `InternalError` naming the pass.
"""

from __future__ import annotations

import abc
import dataclasses
import time
from typing import ClassVar, Sequence

from tftpu.errors import InternalError, ShapeError, UsageError
from tftpu.utils.decisions import PassResult

PASSES: dict[str, type["ModulePass"]] = {}
BUILTIN = ("tftpu.transforms.canonicalize", "tftpu.transforms.convert_layout")   # modules that register passes


def registered() -> dict[str, type["ModulePass"]]:
    """Every registered pass by name (the built-in pass modules imported first)."""
    import importlib

    for module in BUILTIN:
        importlib.import_module(module)
    return PASSES


class ModulePass(abc.ABC):
    """Base of a module pass: a dataclass of options with a `name` and an `apply`."""

    name: ClassVar[str] = ""

    @abc.abstractmethod
    def apply(self, model) -> PassResult:
        """Rewrite `model` in place; return what was done and declined, with reasons."""

    def spec(self) -> str:
        """The pass as a pipeline element, options included: `convert-layout{layout=NHWC}`."""
        opts = " ".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                        if getattr(self, f.name) != f.default)
        return f"{self.name}{{{opts}}}" if opts else self.name


def register(cls: type[ModulePass]) -> type[ModulePass]:
    """Register a pass class under its `name` (a class decorator)."""
    if not cls.name or cls.name in PASSES and PASSES[cls.name] is not cls:
        raise ValueError(f"pass name {cls.name!r} is empty or taken")
    PASSES[cls.name] = cls
    return cls


def _option(cls, key: str, values: tuple):
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if key not in fields:
        raise UsageError(f"pass {cls.name}: unknown option {key!r} (options: {', '.join(fields) or 'none'})")
    if len(values) != 1:
        raise UsageError(f"pass {cls.name}: option {key} takes one value, got {list(values)}")
    value, kind = values[0], fields[key].type
    want = {"str": str, "int": int, "float": float, "bool": bool}.get(str(kind).split(" |")[0], str)
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if want is str and not isinstance(value, str):
        value = str(value).lower() if isinstance(value, bool) else str(value)
    if not isinstance(value, want) or isinstance(value, bool) and want is not bool:
        raise UsageError(f"pass {cls.name}: option {key} must be a {want.__name__}, got {value!r}")
    return value


def parse_pipeline(spec: str) -> list[ModulePass]:
    """Passes from a pipeline string, `canonicalize,convert-layout{layout=NHWC}` (MLIR's pass
    pipeline syntax, parsed by xDSL); UsageError for a bad string, pass or option."""
    from xdsl.utils.arg_spec import parse_pipeline as xdsl_parse
    from xdsl.utils.exceptions import ArgSpecParseError

    try:
        specs = list(xdsl_parse(spec))
    except ArgSpecParseError as e:
        lines = str(e).strip().splitlines()
        raise UsageError(f"--passes={spec!r}: {lines[-1].strip() if lines else 'cannot parse'}") from None
    if not specs:
        raise UsageError(f"--passes={spec!r}: no pass named")
    passes, known = [], registered()
    for s in specs:
        cls = known.get(s.name)
        if cls is None:
            raise UsageError(f"unknown pass {s.name!r} (passes: {', '.join(sorted(known))})")
        options = {k: _option(cls, k, v) for k, v in s.parameters.items()}
        try:
            passes.append(cls(**options))
        except (TypeError, ValueError) as e:
            raise UsageError(f"pass {s.name}: {e}") from None
    return passes


def run_pipeline(model, passes: str | Sequence[ModulePass], verify: bool = True) -> list[PassResult]:
    """Run `passes` (a pipeline string or pass objects) over `model` in place, verifying the
    module after each; each pass's result, in order."""
    if isinstance(passes, str):
        passes = parse_pipeline(passes)
    results = []
    for p in passes:
        t0 = time.perf_counter()
        result = p.apply(model)
        result.seconds = time.perf_counter() - t0
        if verify:
            try:
                model.verify()
            except ShapeError as e:
                raise InternalError(f"pass {p.name}", f"left an invalid module: {e}") from None
        results.append(result)
    return results
