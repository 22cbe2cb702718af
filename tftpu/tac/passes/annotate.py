"""Target annotation: each op gets the first device, in the user's order, that supports it.

The CPU runs everything and always comes last, so every op gets a device.
"""

from __future__ import annotations

from tftpu.tac.graph import Annotation, Graph


def annotate(graph: Graph, devices) -> list[Annotation]:
    """One `Annotation(device, inference_type)` per op of `graph` (ops with subgraphs stay on CPU)."""
    out = []
    for node in graph.nodes:
        device = devices[-1].name
        if not node.subgraph_refs():
            for hw in devices:
                if hw.is_op_supported(node):
                    device = hw.name
                    break
        out.append(Annotation(device, node.inference_type))
    return out
