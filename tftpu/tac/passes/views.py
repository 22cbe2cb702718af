"""Alternative subgraph views and their costs.

Every raised subgraph is copied once per device; the device's lowerings are applied to the
copy, and the copy is kept only if the device then supports every op in it. Each kept view is
priced with the device's cost model (the sum of its ops' costs).
"""

from __future__ import annotations

import dataclasses

from tftpu.tac.graph import Graph, Node
from tftpu.tac.passes import lowerings
from tftpu.tac.passes.raise_subgraphs import Subgraph, producers


@dataclasses.dataclass
class View:
    """One way to run a subgraph: on `device`, as `nodes` (lowered), at `cost` µs."""

    device: str
    inference_type: str
    nodes: list[Node]
    cost: float
    lowerings: dict

    @property
    def key(self) -> tuple[str, str]:
        return (self.device, self.inference_type)


@dataclasses.dataclass
class Dropped:
    """A device whose view of a subgraph was dropped, and why."""

    device: str
    reason: str


def _reason(hw, node: Node) -> str:
    why = getattr(hw, "why_not_supported", None)
    text = why(node) if why else None
    return text or f"{node.op_type} not supported"


def alternative_views(graph: Graph, subgraphs: list[Subgraph], devices) -> tuple[list[list[View]], list[list[Dropped]]]:
    """Per subgraph: its views (the annotated device first) and the devices dropped with reasons."""
    patterns = {hw.name: lowerings.resolve(hw.transformations()) for hw in devices}
    all_views, all_dropped = [], []
    for sub in subgraphs:
        original = [graph.nodes[i] for i in sub.nodes]
        views, dropped = [], []
        order = [hw for hw in devices if hw.name == sub.device] + [hw for hw in devices if hw.name != sub.device]
        host = devices[-1].name
        for hw in order:
            if hw.name != host:
                flow = next((n for n in original if n.subgraph_refs()), None)
                if flow is not None:
                    dropped.append(Dropped(hw.name, f"{flow.op_type} holds subgraphs: control flow stays on {host}"))
                    continue
            nodes, counts = lowerings.apply(original, graph, patterns[hw.name])
            bad = next((n for n in nodes if not hw.is_op_supported(n)), None)
            if bad is not None and counts:
                if all(hw.is_op_supported(n) for n in original):
                    nodes, counts, bad = list(original), {}, None
            if bad is not None:
                dropped.append(Dropped(hw.name, _reason(hw, bad)))
                continue
            views.append(View(hw.name, sub.inference_type, nodes, float(hw.get_func_cost(nodes)), counts))
        if not views or views[0].device != sub.device:  # pragma: no cover - annotation guarantees support
            raise RuntimeError(f"{sub.name}: its own device cannot run it")
        all_views.append(views)
        all_dropped.append(dropped)
    return all_views, all_dropped


def boundaries(graph: Graph, subgraphs: list[Subgraph]):
    """Data crossing subgraph borders: {(producer, consumer): [bytes, elements]} plus per-subgraph
    [bytes, elements] read from and written to the host (model inputs and outputs)."""
    owner = producers(graph, subgraphs)
    graph_inputs = set(graph.inputs)
    edges: dict = {}
    host_in = [[0, 0] for _ in subgraphs]
    host_out = [[0, 0] for _ in subgraphs]
    for s, sub in enumerate(subgraphs):
        seen = set()
        for i in sub.nodes:
            for t in graph.nodes[i].inputs:
                if isinstance(t, int) and t < 0 or t in seen:
                    continue
                seen.add(t)
                p = owner.get(t)
                if p == s:
                    continue
                if p is not None:
                    e = edges.setdefault((p, s), [0, 0])
                elif t in graph_inputs or not graph.is_const(t):
                    e = host_in[s]
                else:
                    continue
                e[0] += graph.nbytes(t)
                e[1] += graph.numel(t)
    for t in dict.fromkeys(graph.outputs):
        p = owner.get(t)
        if p is not None:
            host_out[p][0] += graph.nbytes(t)
            host_out[p][1] += graph.numel(t)
    return edges, host_in, host_out
