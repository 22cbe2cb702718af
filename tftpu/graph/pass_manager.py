"""A small Grappler-style pass manager: passes run in order over one `GraphContext`.

Each pass is a class with a `name` and one `apply(ctx) -> PassResult` that edits `ctx.editor`
and records, per candidate, what it changed or why it declined (with the numbers behind it).

>>> report = PassManager([SpaceToDepthPass()], disable=()).run(ctx)   # doctest: +SKIP
>>> print(report)                                                     # doctest: +SKIP
"""

from __future__ import annotations

import abc
import dataclasses
import time
from typing import Any, Sequence

from tftpu.errors import UsageError
from tftpu.utils.decisions import Decision, PassResult  # noqa: F401  (re-exported: graph passes use them)


@dataclasses.dataclass
class Report:
    """Every pass's result, in run order."""

    passes: list[PassResult] = dataclasses.field(default_factory=list)

    def __getitem__(self, name: str) -> PassResult:
        for p in self.passes:
            if p.name == name:
                return p
        raise KeyError(name)

    def applied(self, name: str) -> bool:
        """True when pass `name` changed the graph."""
        return any(p.name == name and p.changed for p in self.passes)

    def to_dict(self) -> dict:
        return {"passes": [{k: v for k, v in dataclasses.asdict(p).items() if k != "detail"} for p in self.passes]}

    def __str__(self):
        return "\n".join(str(p) for p in self.passes) if self.passes else "no passes ran"


@dataclasses.dataclass
class GraphContext:
    """What a pass works on: the graph being edited and what it needs to know about it."""

    editor: Any                     # tftpu.graph.surgery.GraphEditor
    arg_names: list[str]            # function arguments (serving inputs), tensor names
    target: Any                     # tftpu.passes.cost.Target
    options: dict = dataclasses.field(default_factory=dict)


class Pass(abc.ABC):
    """Base of a graph pass: override `name` and `apply`."""

    name = "pass"

    @abc.abstractmethod
    def apply(self, ctx: GraphContext) -> PassResult:
        """Rewrite `ctx.editor`'s graph; return each decision with its reason."""


class PassManager:
    """Run passes in order; names in `disable` are skipped and reported as disabled."""

    def __init__(self, passes: Sequence[Pass], disable: Sequence[str] = ()):
        self.passes = list(passes)
        known = {p.name for p in self.passes}
        disable = [disable] if isinstance(disable, str) else list(disable)
        unknown = sorted(set(disable) - known)
        if unknown:
            raise UsageError(f"unknown pass(es) to disable: {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        self.disable = set(disable)

    def run(self, ctx: GraphContext) -> Report:
        report = Report()
        for p in self.passes:
            if p.name in self.disable:
                report.passes.append(PassResult(p.name, disabled=True))
                continue
            t0 = time.perf_counter()
            result = p.apply(ctx)
            result.seconds = time.perf_counter() - t0
            report.passes.append(result)
        return report
