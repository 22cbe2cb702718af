"""TAC's stages as passes over one TFLite subgraph, run as the pipeline
`annotate,raise-subgraphs,alternative-views,compute-costs,pick-subgraphs` (the seed's order).

Each stage is a `ModulePass` over a `TacState` and records its decisions with reasons: which
device each op was annotated for, the functions raised, the alternative views kept or dropped
(and why), and the device picked for each function with its cost against the greedy choice.

>>> state = TacState(graph, devices)                       # doctest: +SKIP
>>> results = TAC_PASSES.run(state, pipeline(max_states))  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Callable, ClassVar

from tftpu.tac.graph import Graph
from tftpu.tac.passes.annotate import annotate
from tftpu.tac.passes.pick import Problem, pick_exact, pick_greedy
from tftpu.tac.passes.raise_subgraphs import raise_subgraphs
from tftpu.tac.passes.views import alternative_views, boundaries
from tftpu.utils.decisions import PassResult
from tftpu.utils.passes import ModulePass, PassRegistry

TAC_PASSES = PassRegistry("TAC", modules=(__name__,))


@dataclasses.dataclass
class TacState:
    """One subgraph under conversion and what each stage has found so far."""

    graph: Graph
    devices: list                       # TargetHardware, in preference order, CPU last
    hardware: Callable | None = None    # device name -> TargetHardware (for switching costs)
    annotation: list | None = None
    subgraphs: list | None = None
    views: list | None = None
    dropped: list | None = None
    problem: Problem | None = None
    picked: object = None
    greedy: object = None


def pipeline(max_states: int = 200_000) -> str:
    """The TAC pipeline string."""
    return f"annotate,raise-subgraphs,alternative-views,compute-costs,pick-subgraphs{{max_states={max_states}}}"


@TAC_PASSES.register
@dataclasses.dataclass
class Annotate(ModulePass):
    """Each op gets the first device, in the user's order, that supports it (CPU last)."""

    name: ClassVar[str] = "annotate"

    def apply(self, state: TacState) -> PassResult:
        state.annotation = annotate(state.graph, state.devices)
        result = PassResult(self.name)
        for (device, itype), n in sorted(Counter((a.device, a.inference_type) for a in state.annotation).items()):
            result.apply(device, f"{n} op(s) annotated ({itype})", ops=n)
        return result


@TAC_PASSES.register
@dataclasses.dataclass
class RaiseSubgraphs(ModulePass):
    """Runs of ops on one device and inference type become functions."""

    name: ClassVar[str] = "raise-subgraphs"

    def apply(self, state: TacState) -> PassResult:
        state.subgraphs = raise_subgraphs(state.graph, state.annotation)
        result = PassResult(self.name)
        for sub in state.subgraphs:
            result.apply(sub.name, f"{len(sub.nodes)} op(s) on {sub.device}", ops=len(sub.nodes))
        return result


@TAC_PASSES.register
@dataclasses.dataclass
class AlternativeViews(ModulePass):
    """Each function's views on the other devices (with their device-specific lowerings)."""

    name: ClassVar[str] = "alternative-views"

    def apply(self, state: TacState) -> PassResult:
        state.views, state.dropped = alternative_views(state.graph, state.subgraphs, state.devices)
        result = PassResult(self.name)
        for sub, views, dropped in zip(state.subgraphs, state.views, state.dropped):
            for v in views:
                result.apply(sub.interface_name, f"view on {v.device} ({v.inference_type})", cost_us=v.cost)
            for d in dropped:
                result.decline(sub.interface_name, f"no view on {d.device}: {d.reason}")
        return result


@TAC_PASSES.register
@dataclasses.dataclass
class ComputeCosts(ModulePass):
    """The pick's problem: each view's cost and the transfer costs between functions."""

    name: ClassVar[str] = "compute-costs"

    def apply(self, state: TacState) -> PassResult:
        edges, host_in, host_out = boundaries(state.graph, state.subgraphs)
        state.problem = Problem([[v.key for v in vs] for vs in state.views], [[v.cost for v in vs] for vs in state.views],
                                edges, host_in, host_out, state.hardware, host=state.devices[-1].name)
        result = PassResult(self.name)
        result.apply("module", f"{len(state.views)} function(s), {len(edges)} edge(s) priced",
                     functions=len(state.views), edges=len(edges))
        return result


@TAC_PASSES.register
@dataclasses.dataclass
class PickSubgraphs(ModulePass):
    """The cheapest plan, exactly (dynamic programming over the functions), and the greedy one
    beside it for comparison."""

    name: ClassVar[str] = "pick-subgraphs"
    max_states: int = 200_000

    def apply(self, state: TacState) -> PassResult:
        state.picked = pick_exact(state.problem, max_states=self.max_states)
        state.greedy = pick_greedy(state.problem)
        result = PassResult(self.name)
        for sub, views, b in zip(state.subgraphs, state.views, state.picked.plan):
            v = views[b]
            result.apply(sub.interface_name, f"on {v.device} ({v.inference_type})", cost_us=v.cost)
        how = "exact" if state.picked.exact else "heuristic (state limit reached)"
        result.apply("module", f"plan {how}: {state.picked.cost:.1f} us vs greedy {state.greedy.cost:.1f} us",
                     cost_us=state.picked.cost, greedy_us=state.greedy.cost)
        return result
