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


@dataclasses.dataclass
class Decision:
    """One candidate a pass looked at: applied or declined, why, and the numbers behind it."""

    where: str
    applied: bool
    reason: str
    numbers: dict = dataclasses.field(default_factory=dict)

    def __str__(self):
        mark = "applied" if self.applied else "declined"
        nums = ", ".join(f"{k}={_fmt(v)}" for k, v in self.numbers.items())
        return f"{self.where}: {mark}: {self.reason}" + (f" [{nums}]" if nums else "")


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


@dataclasses.dataclass
class PassResult:
    """What one pass did: its decisions, in the order it made them."""

    name: str
    decisions: list[Decision] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    disabled: bool = False

    @property
    def changed(self) -> list[Decision]:
        return [d for d in self.decisions if d.applied]

    @property
    def declined(self) -> list[Decision]:
        return [d for d in self.decisions if not d.applied]

    def apply(self, where: str, reason: str, **numbers) -> Decision:
        d = Decision(where, True, reason, numbers)
        self.decisions.append(d)
        return d

    def decline(self, where: str, reason: str, **numbers) -> Decision:
        d = Decision(where, False, reason, numbers)
        self.decisions.append(d)
        return d

    def __str__(self):
        if self.disabled:
            return f"{self.name}: disabled"
        head = f"{self.name}: {len(self.changed)} rewrite(s), {len(self.declined)} declined ({self.seconds:.3f} s)"
        return "\n".join([head] + [f"  {d}" for d in self.decisions])


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
        return {"passes": [dataclasses.asdict(p) for p in self.passes]}

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
