"""Pick subgraphs: choose one view per subgraph so the whole plan costs least.

Cost of a plan = each subgraph's view cost + for every edge between subgraphs (producer view
a, consumer view b) the consumer device's switching cost for the bytes crossing it and the
quantize/dequantize cost when the inference types differ + moving model inputs from and
outputs to the host (CPU).

`pick_exact` is a dynamic program over a topological order of the subgraph DAG whose state is
the choice of every subgraph still feeding an unprocessed one (the "frontier"): exact for this
cost, linear in the number of subgraphs, exponential only in the frontier width.
`pick_greedy` is TensorFlow TAC's pick: each subgraph assumes its inputs independent, decisions
propagate back from the outputs, and a conflict makes it fall back to the annotated plan.
`brute_force` tries every plan (tests).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Callable, Sequence


@dataclasses.dataclass
class Problem:
    """The pick problem: per subgraph its views' (device, inference type) and compute costs, the
    border traffic `edges[(i, j)] = (bytes, elements)` (i before j), and host traffic."""

    choices: list[list[tuple[str, str]]]
    compute: list[list[float]]
    edges: dict
    host_in: list
    host_out: list
    hardware: Callable  # device name -> TargetHardware
    host: str = "CPU"

    def __post_init__(self):
        n = len(self.choices)
        self.preds = [[] for _ in range(n)]
        self.succs = [[] for _ in range(n)]
        for (i, j) in sorted(self.edges):
            self.preds[j].append(i)
            self.succs[i].append(j)
        host = self.hardware(self.host)
        self.unary = []
        for v in range(n):
            row = []
            for b, (dev, _) in enumerate(self.choices[v]):
                hw = self.hardware(dev)
                c = self.compute[v][b]
                if self.host_in[v][0]:
                    c += hw.get_hardware_switching_cost(host, self.host_in[v][0])
                if self.host_out[v][0]:
                    c += host.get_hardware_switching_cost(hw, self.host_out[v][0])
                row.append(c)
            self.unary.append(row)
        self.pair = {}
        for (i, j), (nbytes, elems) in self.edges.items():
            m = []
            for dev_a, type_a in self.choices[i]:
                hw_a = self.hardware(dev_a)
                row = []
                for dev_b, type_b in self.choices[j]:
                    hw_b = self.hardware(dev_b)
                    row.append(hw_b.get_hardware_switching_cost(hw_a, nbytes)
                               + hw_b.get_quant_dequant_cost(type_a, type_b, elems))
                m.append(row)
            self.pair[(i, j)] = m

    def cost(self, plan: Sequence[int]) -> float:
        """Total cost of `plan` (one view index per subgraph)."""
        total = sum(self.unary[v][plan[v]] for v in range(len(plan)))
        for (i, j), m in self.pair.items():
            total += m[plan[i]][plan[j]]
        return total


@dataclasses.dataclass
class Pick:
    """A chosen plan, its cost, and how it was found."""

    plan: list[int]
    cost: float
    exact: bool = True
    states: int = 0  # largest DP frontier state count
    fell_back: bool = False  # greedy only: a conflict sent it back to the annotated plan


def _order(problem: Problem) -> list[int]:
    """A topological order that keeps the frontier (subgraphs still feeding later ones) small."""
    n = len(problem.choices)
    indeg = [len(p) for p in problem.preds]
    remaining = [len(s) for s in problem.succs]
    ready = [v for v in range(n) if indeg[v] == 0]
    order = []
    while ready:
        def score(v):
            retired = sum(1 for p in problem.preds[v] if remaining[p] == 1)
            return (-(retired - (1 if remaining[v] else 0)), v)
        v = min(ready, key=score)
        ready.remove(v)
        order.append(v)
        for p in problem.preds[v]:
            remaining[p] -= 1
        for s in problem.succs[v]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    return order


def pick_exact(problem: Problem, max_states: int = 200_000) -> Pick:
    """The cheapest plan, by dynamic programming over the subgraph DAG (exact unless the
    frontier ever holds more than `max_states` choice combinations; then a beam keeps the best)."""
    n = len(problem.choices)
    if n == 0:
        return Pick([], 0.0)
    remaining = [len(s) for s in problem.succs]
    frontier: list[int] = []
    states = {(): 0.0}
    history = []
    exact, widest = True, 1
    for v in _order(problem):
        preds = problem.preds[v]
        pos = {f: k for k, f in enumerate(frontier)}
        pred_pos = [(pos[p], problem.pair[(p, v)]) for p in preds]
        for p in preds:
            remaining[p] -= 1
        keep = [k for k, f in enumerate(frontier) if remaining[f] > 0]
        add = remaining[v] > 0
        unary = problem.unary[v]
        nv = len(unary)
        new_states: dict = {}
        back: dict = {}
        for key, base in states.items():
            kept = tuple(key[k] for k in keep)
            for b in range(nv):
                c = base + unary[b]
                for k, m in pred_pos:
                    c += m[key[k]][b]
                nk = kept + (b,) if add else kept
                old = new_states.get(nk)
                if old is None or c < old:
                    new_states[nk] = c
                    back[nk] = (key, b)
        if len(new_states) > max_states:
            exact = False
            best = sorted(new_states.items(), key=lambda kv: kv[1])[:max_states]
            new_states = dict(best)
            back = {k: back[k] for k in new_states}
        widest = max(widest, len(new_states))
        history.append((v, back))
        frontier = [frontier[k] for k in keep] + ([v] if add else [])
        states = new_states
    (final_key, total), = states.items()
    plan = [0] * n
    key = final_key
    for v, back in reversed(history):
        key, b = back[key]
        plan[v] = b
    return Pick(plan, problem.cost(plan), exact=exact, states=widest)


def pick_greedy(problem: Problem) -> Pick:
    """TensorFlow TAC's greedy pick (see its pick_subgraphs.cc), priced with the same cost."""
    n = len(problem.choices)
    # aggregated[v][b] = (cost, {input subgraph: its view}) assuming inputs independent
    aggregated = []
    for v in range(n):
        row = []
        for b in range(len(problem.choices[v])):
            total = problem.unary[v][b]
            plans = {}
            for p in problem.preds[v]:
                m = problem.pair[(p, v)]
                best_a = min(range(len(problem.choices[p])),
                             key=lambda a: (problem.unary[p][a] + m[a][b], a))
                total += problem.unary[p][best_a] + m[best_a][b]
                plans[p] = best_a
            row.append((total, plans))
        aggregated.append(row)
    decisions: dict[int, int] = {}
    outputs = [v for v in range(n) if not problem.succs[v] or problem.host_out[v][0]]
    queue = []
    for v in outputs:
        b = min(range(len(aggregated[v])), key=lambda b: (aggregated[v][b][0], b))
        if v in decisions and decisions[v] != b:
            return _fallback(problem)
        decisions[v] = b
        queue.append((v, b))
    while queue:
        v, b = queue.pop(0)
        for p, a in aggregated[v][b][1].items():
            if p not in decisions:
                decisions[p] = a
                queue.append((p, a))
            elif decisions[p] != a:
                return _fallback(problem)
    plan = [decisions.get(v, 0) for v in range(n)]
    return Pick(plan, problem.cost(plan), exact=False)


def _fallback(problem: Problem) -> Pick:
    plan = [0] * len(problem.choices)
    return Pick(plan, problem.cost(plan), exact=False, fell_back=True)


def brute_force(problem: Problem) -> Pick:
    """Try every plan (small problems only)."""
    best = None
    for plan in itertools.product(*(range(len(c)) for c in problem.choices)):
        c = problem.cost(plan)
        if best is None or c < best.cost:
            best = Pick(list(plan), c)
    return best if best is not None else Pick([], 0.0)


def uniform_plan(problem: Problem, device: str) -> list[int] | None:
    """The plan that runs every subgraph on `device`, or None if some subgraph has no such view."""
    plan = []
    for choices in problem.choices:
        idx = next((k for k, (d, _) in enumerate(choices) if d == device), None)
        if idx is None:
            return None
        plan.append(idx)
    return plan
