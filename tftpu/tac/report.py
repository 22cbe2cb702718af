"""TAC report: ops per device, raised subgraphs with their views, and the plan's estimated cost
against all-CPU, the annotation as is, and TensorFlow's greedy pick. JSON-ready and as a table."""

from __future__ import annotations

from collections import Counter


def _r(x):
    return None if x is None else round(float(x), 3)


def build(result) -> dict:
    """The report of a `TacResult` as plain data (deterministic: no timings)."""
    parts = []
    totals = Counter()
    cost = Counter()
    for index, part in result.partitions.items():
        chosen = part.chosen()
        per_device = Counter()
        for view in chosen:
            per_device[view.device] += len(view.nodes)
        totals.update(per_device)
        functions = []
        for s, sub in enumerate(part.subgraphs):
            view = chosen[s]
            functions.append({
                "name": sub.name,
                "ops": len(sub.nodes),
                "op_types": dict(sorted(Counter(part.graph.nodes[i].op_type for i in sub.nodes).items())),
                "picked": f"{sub.interface_name}_{view.device}_{view.inference_type}",
                "picked_lowerings": dict(sorted(view.lowerings.items())),
                "greedy": part.views[s][part.greedy.plan[s]].device,
                "views": [{"device": v.device, "inference_type": v.inference_type, "ops": len(v.nodes),
                           "cost_us": _r(v.cost), "lowerings": dict(sorted(v.lowerings.items()))}
                          for v in part.views[s]],
                "dropped": [{"device": d.device, "reason": d.reason} for d in part.dropped[s]],
            })
        uniform = {f"all_{hw.name}": _r(part.plan_cost(hw.name)) for hw in result.devices}
        costs = {"picked": _r(part.picked.cost), "greedy_tf": _r(part.greedy.cost), "annotated": _r(part.annotated_cost),
                 **uniform}
        for k, v in costs.items():
            if v is not None and cost.get(k, 0) is not None:
                cost[k] += v
            else:
                cost[k] = None
        parts.append({
            "subgraph": index,
            "ops_in": len(part.graph.nodes),
            "ops_out": sum(len(v.nodes) for v in chosen),
            "ops_per_device": dict(sorted(per_device.items())),
            "functions": functions,
            "cost_us": costs,
            "greedy_fell_back": part.greedy.fell_back,
            "exact": part.picked.exact,
            "dp_max_states": part.picked.states,
        })
    cpu = cost.get("all_CPU")
    return {
        "model": result.source,
        "device_specs": result.device_specs,
        "ops_per_device": dict(sorted(totals.items())),
        "cost_us": {k: _r(v) for k, v in cost.items()},
        "speedup_vs_cpu": _r(cpu / cost["picked"]) if cpu and cost.get("picked") else None,
        "subgraphs": parts,
    }


def table(report: dict, timings: dict | None = None, max_rows: int = 40) -> str:
    """A readable summary of `report` (at most `max_rows` functions per subgraph; the JSON has all)."""
    lines = [f"TAC {report['model']}  devices: {','.join(report['device_specs'])}"]
    for part in report["subgraphs"]:
        lines.append(f"subgraph {part['subgraph']}: {part['ops_in']} ops in, {part['ops_out']} ops out; "
                     + ", ".join(f"{d}: {n}" for d, n in part["ops_per_device"].items()))
        lines.append(f"  {'function':<24} {'ops':>5}  {'picked':<6} {'greedy':<6}  view costs (us)")
        funcs = part["functions"]
        for f in funcs[:max_rows]:
            views = "  ".join(f"{v['device']}={v['cost_us']:.1f}" + (f"(+{sum(v['lowerings'].values())} lowered)"
                                                                    if v["lowerings"] else "")
                              for v in f["views"])
            dropped = "; ".join(f"{d['device']}: {d['reason']}" for d in f["dropped"])
            picked = f["picked"].split("_")[2]
            lines.append(f"  {f['name']:<24} {f['ops']:>5}  {picked:<6} {f['greedy']:<6}  {views}"
                         + (f"  [dropped {dropped}]" if dropped else ""))
        if len(funcs) > max_rows:
            lines.append(f"  ... {len(funcs) - max_rows} more functions in the JSON report")
    c = report["cost_us"]
    lines.append("estimated cost (us): " + "  ".join(f"{k}={v:.1f}" for k, v in c.items() if v is not None))
    if c.get("all_CPU") and c.get("picked"):
        lines.append(f"picked plan: {c['all_CPU'] / c['picked']:.2f}x faster than all-CPU, "
                     f"{c['greedy_tf'] / c['picked']:.3f}x vs TensorFlow's greedy pick")
    if timings:
        lines.append("time (ms): " + "  ".join(f"{k}={v * 1e3:.1f}" for k, v in timings.items()))
    return "\n".join(lines)
