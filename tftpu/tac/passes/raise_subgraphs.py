"""Raise target subgraphs: group ops of one device and inference type into functions.

Ops are list-scheduled in a topological order that keeps running ops of the current
(device, inference type) while any is ready, so each group is as large as dependencies allow;
every group is a contiguous run of that order, hence the groups form a DAG. Groups are named
like TensorFlow's TAC: `func_<N>_<DEVICE>_<TYPE>`.
"""

from __future__ import annotations

import dataclasses
import heapq

from tftpu.tac.graph import Annotation, Graph


@dataclasses.dataclass
class Subgraph:
    """A raised function: ops (indices into `graph.nodes`, in execution order) of one device/type."""

    index: int
    device: str
    inference_type: str
    nodes: list[int]

    @property
    def interface_name(self) -> str:
        return f"func_{self.index}"

    @property
    def name(self) -> str:
        return f"func_{self.index}_{self.device}_{self.inference_type}"


def producers(graph: Graph, subgraphs: list[Subgraph]) -> dict:
    """{tensor: position in `subgraphs` of the subgraph whose op writes it}."""
    return {t: s for s, sub in enumerate(subgraphs) for i in sub.nodes for t in graph.nodes[i].outputs}


def raise_subgraphs(graph: Graph, annotation: list[Annotation]) -> list[Subgraph]:
    """Group the annotated ops of `graph` into `Subgraph`s, in a valid execution order."""
    n = len(graph.nodes)
    producers = graph.producers()
    preds = [set() for _ in range(n)]
    succs = [[] for _ in range(n)]
    for i, node in enumerate(graph.nodes):
        for t in node.inputs:
            p = producers.get(t)
            if p is not None and p != i and p not in preds[i]:
                preds[i].add(p)
                succs[p].append(i)
    indeg = [len(p) for p in preds]
    keys = [(a.device, a.inference_type) for a in annotation]
    ready: dict = {}
    for i in range(n):
        if indeg[i] == 0:
            heapq.heappush(ready.setdefault(keys[i], []), i)
    groups: list[Subgraph] = []
    current = None
    done = 0
    while done < n:
        if current is None or not ready.get(current):
            current = min((heap[0], key) for key, heap in ready.items() if heap)[1]
            groups.append(Subgraph(len(groups), current[0], current[1], []))
        i = heapq.heappop(ready[current])
        groups[-1].nodes.append(i)
        done += 1
        for s in succs[i]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready.setdefault(keys[s], []), s)
    if done != n:  # pragma: no cover - a TFLite graph is acyclic
        raise ValueError("graph has a cycle")
    return groups
