"""`tftpu.tac.run`: the whole target-aware conversion of a TFLite model.

annotate -> raise subgraphs -> alternative views (lowerings) -> costs -> exact pick -> write.

>>> result = run("model.tflite", device_specs=("GPU", "CPU"))   # doctest: +SKIP
>>> result.save("model_tac.tflite"); print(result.table())      # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import gc
import os
import time
from typing import Sequence

from tftpu import errors
from tftpu.tac import export, tflite_io
from tftpu.tac.graph import Annotation, Graph
from tftpu.tac.hardware import registry
from tftpu.tac.hardware.base import TargetHardware
from tftpu.tac.passes.pick import Pick, Problem, uniform_plan
from tftpu.tac.passes.pipeline import TAC_PASSES, TacState, pipeline
from tftpu.tac.passes.raise_subgraphs import Subgraph
from tftpu.tac.passes.views import Dropped, View
from tftpu.utils import files


@dataclasses.dataclass
class Partition:
    """TAC's work on one TFLite subgraph: annotation, raised functions, views and the pick."""

    graph: Graph
    annotation: list[Annotation]
    subgraphs: list[Subgraph]
    views: list[list[View]]
    dropped: list[list[Dropped]]
    problem: Problem
    picked: Pick
    greedy: Pick
    passes: list = dataclasses.field(default_factory=list)   # each stage's PassResult: decisions and reasons

    def chosen(self) -> list[View]:
        return [self.views[s][b] for s, b in enumerate(self.picked.plan)]

    def plan_cost(self, device: str) -> float | None:
        plan = uniform_plan(self.problem, device)
        return None if plan is None else self.problem.cost(plan)

    @property
    def annotated_cost(self) -> float:
        return self.problem.cost([0] * len(self.subgraphs))


class TacResult:
    """What `run` returns: the converted model, the decisions, and the numbers behind them."""

    def __init__(self, model, source: str, devices: list[TargetHardware], partitions: dict[int, Partition],
                 timings: dict[str, float]):
        self.model = model
        self.source = source
        self.devices = devices
        self.device_specs = [hw.name for hw in devices]
        self.partitions = partitions
        self.timings = timings
        self._bytes = None

    @property
    def cost(self) -> float:
        """Estimated cost of the picked plan, µs (all partitioned subgraphs)."""
        return sum(p.picked.cost for p in self.partitions.values())

    @property
    def greedy_cost(self) -> float:
        return sum(p.greedy.cost for p in self.partitions.values())

    @property
    def cpu_cost(self) -> float:
        return sum(p.plan_cost("CPU") for p in self.partitions.values())

    def tflite(self) -> bytes:
        """The converted model as `.tflite` bytes."""
        if self._bytes is None:
            self._bytes = tflite_io.write(self.model)
        return self._bytes

    def save(self, path) -> None:
        """Write the converted `.tflite` atomically."""
        files.write_bytes(path, self.tflite())

    def op_devices(self, subgraph: int = 0) -> list[dict]:
        """Per op of the converted subgraph: type, device, inference type, function (from the metadata)."""
        meta = export.get_metadata(self.model) or {}
        for sg in meta.get("subgraphs", []):
            if sg["index"] == subgraph:
                return [dict(zip(("type", "device", "inference_type", "function"), op)) for op in sg["ops"]]
        return []

    @property
    def report(self) -> dict:
        from tftpu.tac import report

        return report.build(self)

    def table(self) -> str:
        from tftpu.tac import report

        return report.table(self.report, self.timings)

    def mlir(self, inline_subgraphs: bool = True) -> str:
        """MLIR text of the annotated main subgraph (`tac.device`, `tac.inference_type`); with
        `inline_subgraphs=False` the raised functions, all alternative views, and the calls."""
        from tftpu.tac import mlir

        return mlir.render(self, inline_subgraphs)


def resolve_devices(device_specs) -> list[TargetHardware]:
    """Hardware instances for `device_specs` (names, `module:Class` plug-ins, classes or
    instances; a comma-separated string works too), duplicates removed, CPU last."""
    if isinstance(device_specs, str):
        device_specs = [s for s in device_specs.split(",")]
    out: list[TargetHardware] = []
    for spec in device_specs:
        if isinstance(spec, TargetHardware):
            hw = spec
            if not hw.name:
                hw.name = type(hw).__name__.upper()
        elif isinstance(spec, type) and issubclass(spec, TargetHardware):
            if not spec.name:
                spec.name = spec.__name__.upper()
            hw = _registered(spec)
        else:
            spec = str(spec).strip()
            if not spec:
                continue
            name = registry.load_plugin(spec) if ":" in spec else spec
            hw = registry.get(name)
        if hw.name.upper() == "CPU" or any(h.name == hw.name for h in out):
            continue
        out.append(hw)
    out.append(registry.get("CPU"))
    return out


def _registered(cls) -> TargetHardware:
    try:
        hw = registry.get(cls.name)
        if type(hw) is cls:
            return hw
    except errors.UsageError:
        pass
    registry.register(cls.name, cls, replace=True)
    return registry.get(cls.name)


def _control_flow_subgraphs(model) -> set[int]:
    refs = set()
    for g in model.subgraphs:
        for op in g.operators or []:
            for o in (op.builtinOptions, getattr(op, "builtinOptions2", None)):
                for k, v in (vars(o).items() if o is not None else ()):
                    if "ubgraph" in k.lower() and isinstance(v, int):
                        refs.add(v)
    return refs


def partition(graph: Graph, devices: list[TargetHardware], max_states: int = 200_000,
              timings: dict | None = None) -> Partition:
    """Run TAC's pipeline (annotate, raise, views, costs, pick: `tac.passes.pipeline`) on one subgraph."""
    timings = timings if timings is not None else {}
    by_name = {hw.name: hw for hw in devices}

    def hardware(name):
        return by_name[name] if name in by_name else registry.get(name)

    state = TacState(graph, devices, hardware)
    results = TAC_PASSES.run(state, pipeline(max_states))
    for r in results:
        key = r.name.replace("-", "_")
        timings[key] = timings.get(key, 0.0) + r.seconds
    return Partition(graph, state.annotation, state.subgraphs, state.views, state.dropped, state.problem,
                     state.picked, state.greedy, passes=results)


def run(tflite_path_or_bytes, device_specs: Sequence = ("GPU", "CPU"), *, max_states: int = 200_000) -> TacResult:
    """Target-aware conversion of a `.tflite` (path or bytes; any file a registered importer
    reads, `tftpu.tac.formats`) for `device_specs` (preference order)."""
    if isinstance(max_states, bool) or not isinstance(max_states, int) or max_states < 1:
        raise errors.UsageError(f"max_states {max_states!r}: expected a count >= 1")
    if isinstance(device_specs, (str, bytes)) or not isinstance(device_specs, Sequence) or not device_specs:
        raise errors.UsageError(f"device_specs {device_specs!r}: expected a non-empty list of device names, e.g. "
                                "('GPU', 'CPU')")
    if not isinstance(tflite_path_or_bytes, (str, bytes, bytearray, memoryview, os.PathLike)):
        raise errors.UsageError(f"tac.run takes a .tflite path or its bytes, not {type(tflite_path_or_bytes).__name__}")
    enabled = gc.isenabled()
    gc.disable()  # the pipeline makes many small objects and frees none: collection passes are wasted
    try:
        return _run(tflite_path_or_bytes, device_specs, max_states)
    finally:
        if enabled:
            gc.enable()


def _run(tflite_path_or_bytes, device_specs, max_states: int) -> TacResult:
    from tftpu.version import __version__

    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    devices = resolve_devices(device_specs)
    from tftpu.tac import formats

    model = formats.read(tflite_path_or_bytes)
    _, label = (None, "<tflite bytes>") if isinstance(tflite_path_or_bytes, (bytes, bytearray, memoryview)) \
        else (None, str(tflite_path_or_bytes))
    timings["read"] = time.perf_counter() - t0
    control = _control_flow_subgraphs(model)
    partitions: dict[int, Partition] = {}
    meta_subgraphs = []
    graphs = [Graph(model, i) for i in range(len(model.subgraphs))]
    for i, graph in enumerate(graphs):
        if i in control:
            cpu = devices[-1].name
            meta_subgraphs.append({"index": i, "functions": [],
                                   "ops": [[n.op_type, cpu, n.inference_type, None] for n in graph.nodes]})
            continue
        part = partition(graph, devices, max_states=max_states, timings=timings)
        partitions[i] = part
    t = time.perf_counter()
    for i, part in partitions.items():
        ordered, ops, funcs = [], [], []
        for sub, view in zip(part.subgraphs, part.chosen()):
            start = len(ordered)
            ordered.extend(view.nodes)
            name = f"{sub.interface_name}_{view.device}_{view.inference_type}"
            funcs.append({"name": name, "device": view.device, "inference_type": view.inference_type,
                          "ops": [start, len(ordered)]})
            ops.extend([n.op_type, view.device, view.inference_type, name] for n in view.nodes)
        export.apply_plan(model, part.graph, ordered)
        meta_subgraphs.append({"index": i, "functions": funcs, "ops": ops})
    meta_subgraphs.sort(key=lambda m: m["index"])
    export.set_metadata(model, export.METADATA_NAME, {
        "producer": f"tftpu-tac {__version__}", "device_specs": [hw.name for hw in devices],
        "subgraphs": meta_subgraphs})
    timings["write_plan"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - t0
    return TacResult(model, label, devices, partitions, timings)
