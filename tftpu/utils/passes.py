"""The shape every module pass has, wherever it runs (TOP / TPU modules, TAC's TFLite graphs):
a dataclass of options with a `name` and one `apply(target) -> PassResult`, registered by name
in a `PassRegistry` and run as a pipeline string in MLIR's syntax, checked after each pass.

>>> TOP = PassRegistry("TOP", verify=lambda model: model.verify())   # doctest: +SKIP
>>> TOP.run(model, "canonicalize,convert-layout{layout=NHWC}")       # doctest: +SKIP
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
import time
from typing import Callable, ClassVar, Sequence

from tftpu.errors import InputError, InternalError, UsageError
from tftpu.utils.decisions import PassResult


class ModulePass(abc.ABC):
    """Base of a pass: a dataclass of options with a `name` and an `apply`."""

    name: ClassVar[str] = ""

    @abc.abstractmethod
    def apply(self, target) -> PassResult:
        """Rewrite `target` in place; return what was done and declined, with reasons."""

    def spec(self) -> str:
        """The pass as a pipeline element, options included: `convert-layout{layout=NHWC}`."""
        opts = " ".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                        if getattr(self, f.name) != f.default)
        return f"{self.name}{{{opts}}}" if opts else self.name


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


class PassRegistry:
    """The passes of one kind of target, by name; `verify` checks the target after each pass."""

    def __init__(self, kind: str, verify: Callable | None = None, modules: Sequence[str] = ()):
        self.kind, self.verify, self.modules = kind, verify, tuple(modules)
        self._passes: dict[str, type[ModulePass]] = {}

    def register(self, cls: type[ModulePass]) -> type[ModulePass]:
        """Register a pass class under its `name` (a class decorator)."""
        if not cls.name or self._passes.get(cls.name, cls) is not cls:
            raise ValueError(f"{self.kind} pass name {cls.name!r} is empty or taken")
        self._passes[cls.name] = cls
        return cls

    def passes(self) -> dict[str, type[ModulePass]]:
        """Every registered pass by name (the modules that define them imported first)."""
        for module in self.modules:
            importlib.import_module(module)
        return dict(self._passes)

    def parse(self, spec: str) -> list[ModulePass]:
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
        out, known = [], self.passes()
        for s in specs:
            cls = known.get(s.name)
            if cls is None:
                raise UsageError(f"unknown {self.kind} pass {s.name!r} (passes: {', '.join(sorted(known))})")
            options = {k: _option(cls, k, v) for k, v in s.parameters.items()}
            try:
                out.append(cls(**options))
            except (TypeError, ValueError) as e:
                raise UsageError(f"pass {s.name}: {e}") from None
        return out

    def run(self, target, passes: str | Sequence[ModulePass], verify: bool = True) -> list[PassResult]:
        """Run `passes` (a pipeline string or pass objects) over `target` in place, checking it
        after each; each pass's result, in order."""
        if isinstance(passes, str):
            passes = self.parse(passes)
        results = []
        for p in passes:
            t0 = time.perf_counter()
            result = p.apply(target)
            result.seconds = time.perf_counter() - t0
            if verify and self.verify is not None:
                try:
                    self.verify(target)
                except InputError as e:
                    raise InternalError(f"pass {p.name}", f"left an invalid module: {e}") from None
            results.append(result)
        return results
