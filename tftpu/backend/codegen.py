"""Codegen: a TPU module, its layer groups and its DDR plan become a command list for the
chip's engines, the program a `.tpumodel` file carries.

Commands (plain dicts, in issue order):
- `load` / `store` (engine `dma`): a tensor's rows `[n0, n1) x [h0, h1)` (whole for weights)
  between its DDR address and a local-memory offset (the same offset in every lane);
- `compute` (engine `tiu`): one op of a group on local operands, with the rows each operand
  holds and the rows it reads, and the pad rows of a window op's slice;
- `global` (engine `tiu`): one op from DDR to DDR;
- `host` (engine `host`): one op the host runs on DDR before the chip reads it (the
  space-to-depth of the image, as the input pipeline does in training).
Each carries its estimated `cycles` and `deps`: the earlier commands it waits for (a slice's
computes wait for its loads, its stores for its computes, a load into a buffer for the computes
that last read it; the first command of a group or a global op waits for every engine).

>>> program = generate(tpu_model, "npu1")            # doctest: +SKIP
>>> len(program.commands), program.ddr_bytes         # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from xdsl.dialects.builtin import TensorType

from tftpu import chip as chips
from tftpu.backend.layer_group import (GroupPlan, host_preprocessing, place_local, plan_groups, rows_bytes,
                                      slice_lane_sizes, weight_lane_axis, weight_lane_sizes)
from tftpu.backend.memory import MemoryPlan, plan_memory
from tftpu.errors import InternalError
from tftpu.interp.tpu.info import info_of
from tftpu.ir import attrs as A
from tftpu.ir import top
from tftpu.ir.base import numel, value_name

__all__ = ["Program", "generate", "tensor_desc", "annotate"]


@dataclasses.dataclass
class Program:
    """Everything the simulator needs: the module (op semantics and tensor types), the command
    list, DDR's size and its weight region, and the model's inputs and outputs."""

    chip: object                     # tftpu.chip.Chip
    model: object                    # TpuModel (a loaded program's holds no weights: they are in `blob`)
    commands: list
    inputs: list                     # tensor descriptions: name, shape, dtype, ddr, quant, preprocess
    outputs: list
    ddr_bytes: int
    blob: bytes                      # DDR bytes 0..len(blob): the weights at their addresses
    memory: MemoryPlan | None = None
    groups: GroupPlan | None = None
    host: list = dataclasses.field(default_factory=list)     # op indices the host runs
    chip_text: str = ""              # the chip's YAML as a loaded file embedded it
    meta: dict = dataclasses.field(default_factory=dict)     # a loaded file's meta section
    host_plan: object | None = None  # tftpu.backend.host.HostPlan: which ops the host runs and why

    def weight_blob(self) -> bytes:
        return self.blob


def _weight_blob(model, memory: MemoryPlan) -> bytes:
    """The weight region of DDR: each weight at its address, zero padding between."""
    blob = bytearray(memory.activation_base)
    for op in model.ops:
        if isinstance(op, top.Weight):
            addr, _ = memory.addresses[value_name(op.results[0])]
            data = model.weights[op.key]
            raw = np.ascontiguousarray(data, A.numpy_dtype(A.dtype_name(op.results[0].type.element_type))).tobytes()
            blob[addr:addr + len(raw)] = raw
    return bytes(blob)


def tensor_desc(v, memory: MemoryPlan) -> dict:
    """Name, shape, dtype, DDR address and quantization of a model input or output."""
    t = v.type
    info = info_of(t)
    d = {"name": value_name(v), "shape": list(t.get_shape()), "dtype": A.dtype_name(t.element_type),
         "ddr": memory.addresses[value_name(v)][0]}
    if info is not None and info.quantized:
        d["dtype"] = info.dtype
        d["quant"] = {"scales": list(info.scales), "zero_points": list(info.zero_points), "axis": info.axis}
    return d


class _Emitter:
    def __init__(self, model, chip, groups: GroupPlan, memory: MemoryPlan):
        self.model, self.chip, self.groups, self.memory = model, chip, groups, memory
        self.commands: list = []
        self.last: dict = {}                      # engine -> index of its last command
        self.bpc = chip.ddr_bandwidth / chip.frequency_hz
        self.items = {}
        for op in model.ops:
            for r in op.results:
                if isinstance(r.type, TensorType):
                    self.items[value_name(r)] = A.numpy_dtype(A.dtype_name(r.type.element_type)).itemsize

    def emit(self, cmd: dict, deps=()) -> int:
        cmd["deps"] = sorted({d for d in deps if d is not None})
        self.commands.append(cmd)
        self.last[cmd["engine"]] = len(self.commands) - 1
        return len(self.commands) - 1

    def barrier(self, engine: str) -> list:
        return [i for e, i in self.last.items() if e != engine]

    def ddr(self, name: str) -> int:
        return self.memory.addresses[name][0]

    def dma_cycles(self, nbytes: int) -> int:
        return math.ceil(nbytes / self.bpc)

    # -- one op from DDR

    def global_op(self, g) -> None:
        f = g.ops[0]
        ins = [None if _operand_name(f, k) is None else self.ddr(_operand_name(f, k)) for k in range(len(f.ins))]
        kind, engine = ("host", "host") if g.on_host else ("global", "tiu")
        self.emit({"kind": kind, "engine": engine, "op": f.index, "name": f.name, "ins": ins,
                   "outs": [self.ddr(o) for o in f.outs], "cycles": int(g.cycles)}, self.barrier(engine))

    # -- a group

    def _place(self, g) -> tuple:
        """(slices, local offsets, peak, copies) of a group, every slice's tensors sized exactly;
        where the planner's estimate falls short, more H slices until it fits."""
        types = self.groups.types
        wsizes = weight_lane_sizes(g.weights, types, self.items, self.chip)
        bank = self.chip.local_mem_per_lane
        rows = types[g.ops[-1].outs[0]][2]
        while True:
            slices = g.slices(types)
            sizes = slice_lane_sizes(slices, types, self.items, self.chip)
            for copies in ((g.copies, 1) if len(slices) > 1 and g.copies > 1 else (1,)):
                local, peak = place_local(g.ops, sizes, g.inputs, g.outputs, g.weights, copies, wsizes)
                if peak <= bank:
                    return slices, local, peak, copies
            if g.h_slices >= rows or any(f.kind == "batch" for f in g.ops):
                raise InternalError("codegen", f"group {g.ops[0].name}: {peak} B per lane exceed the {bank} B "
                                               "of local memory")
            g.h_slices += 1

    def group(self, g, gi: int) -> None:
        types = self.groups.types
        slices, local, peak, copies = self._place(g)
        g.local, g.local_peak, g.copies = local, peak, copies
        loads: dict = {}
        last_compute: dict = {}

        def load(k: int, deps) -> None:
            rng = slices[k]
            got = []
            for name in g.inputs:
                r = rng.tensors.get(name)
                if r is None:
                    continue
                wait = list(deps)
                if k - copies >= 0:
                    wait.append(last_compute.get(k - copies))
                got.append(self.emit({"kind": "load", "engine": "dma", "tensor": name, "ddr": self.ddr(name),
                                      "local": local[(name, k % copies)], "rows": list(r), "lane_axis": 1,
                                      "cycles": self.dma_cycles(self._bytes(name, r)), "group": gi, "slice": k},
                                     wait))
                deps = []
            loads[k] = got

        barrier = self.barrier("dma")
        load(0, barrier)
        if loads[0]:
            barrier = []
        weights = {}
        for w in g.weights:
            nbytes = numel(types[w]) * self.items[w]
            weights[w] = self.emit({"kind": "load", "engine": "dma", "tensor": w, "ddr": self.ddr(w),
                                      "local": local[(w, 0)], "rows": None, "lane_axis": weight_lane_axis(types[w]),
                                      "cycles": self.dma_cycles(nbytes), "group": gi}, barrier)
            barrier = []
        # weights load in the order their ops run: each compute waits for its own weights only
        for k, rng in enumerate(slices):
            if copies > 1 and k + 1 < len(slices):
                load(k + 1, [])
            ready = list(loads.get(k, []))
            computed = None
            for f in g.ops:
                out = rng.tensors.get(f.outs[0])
                if out is None:
                    continue
                operands = []
                for pos, name in enumerate(f.ins):
                    w = _operand_name(f, pos)
                    if w is None:
                        operands.append(None)
                    elif name is None:
                        operands.append({"local": local[(w, 0)], "rows": None, "lane_axis": weight_lane_axis(types[w]),
                                         "tensor": w})
                    else:
                        held = rng.tensors[name]
                        copy = k % copies if (name in g.inputs or name in g.outputs) else 0
                        operands.append({"local": local[(name, copy)], "rows": list(held), "tensor": name,
                                         "use": list(_use(f, name, out, held, rng, types))})
                copy = k % copies if f.outs[0] in g.outputs else 0
                cmd = {"kind": "compute", "engine": "tiu", "op": f.index, "name": f.name, "operands": operands,
                       "result": {"local": local[(f.outs[0], copy)], "rows": list(out), "tensor": f.outs[0]},
                       "cycles": self._compute_cycles(f, out), "group": gi, "slice": k}
                if f.name in rng.reads:
                    cmd["pads"] = list(rng.reads[f.name][2:])
                computed = self.emit(cmd, (ready if computed is None else []) + [weights[w] for w in f.weights])
                ready = []
            last_compute[k] = computed
            for name in g.outputs:
                r = rng.tensors[name]
                self.emit({"kind": "store", "engine": "dma", "tensor": name, "ddr": self.ddr(name),
                           "local": local[(name, k % copies)], "rows": list(r), "lane_axis": 1,
                           "cycles": self.dma_cycles(self._bytes(name, r)), "group": gi, "slice": k}, [computed])
            if copies == 1 and k + 1 < len(slices):
                load(k + 1, [computed])

    def _bytes(self, name: str, r) -> int:
        return rows_bytes(self.groups.types[name], r, self.items[name])

    def _compute_cycles(self, f, r) -> int:
        shape = self.groups.types[f.outs[0]]
        return math.ceil(f.cycles.compute * (r[1] - r[0]) * (r[3] - r[2]) / (shape[0] * shape[2]))


def _operand_name(f, pos: int):
    """The tensor name of operand `pos` of a planner op (None for an absent operand)."""
    v = f.op.operands[pos]
    return None if not isinstance(v.type, TensorType) else value_name(v)


def _use(f, name, out, held, rng, types) -> tuple:
    """The rows (n0, n1, h0, h1) op `f` reads of operand `name` to make its rows `out`."""
    shape, oshape = types[name], types[f.outs[0]]
    n = (0, 1) if shape[0] == 1 and oshape[0] != 1 else (out[0], out[1])
    if f.kind == "window" and f.ins[0] == name:
        h = rng.reads[f.name][:2]
    elif f.kind == "batch":
        h = (0, shape[2])
    else:
        h = (0, 1) if shape[2] == 1 and oshape[2] != 1 else (out[2], out[3])
    return (n[0], n[1], h[0], h[1])


def generate(model, chip, groups: GroupPlan | None = None, host: str = "auto") -> Program:
    """The program of a TPU `model` on `chip`: which ops the host runs (`host="auto"`: TAC's
    exact pick over the chip's and the host's cost models, `tftpu.backend.host`; "preprocessing":
    only the space-to-depth input), layer groups (planned unless given), the DDR plan around
    them, and the command list."""
    from tftpu.backend.host import HostPlan, place_on_host

    chip = chips.load(chip)
    pre = host_preprocessing(model)
    if host == "auto":
        host_plan = place_on_host(model, chip, fixed=pre)
    elif host == "preprocessing":
        host_plan = HostPlan(pre, {value_name(model.ops[i].results[0]): "host preprocessing (the space-to-depth input)"
                                   for i in pre}, 0.0, 0.0)
    else:
        raise InternalError("codegen", f"host={host!r}: expected 'auto' or 'preprocessing'")
    groups = groups or plan_groups(model, chip, host=host_plan.ops)
    memory = plan_memory(model, chip, groups)
    em = _Emitter(model, chip, groups, memory)
    for gi, g in enumerate(groups.groups):
        if g.is_global:
            em.global_op(g)
        else:
            em.group(g, gi)
    inputs = [tensor_desc(op.results[0], memory) for op in model.ops if isinstance(op, top.Input)]
    outputs = [tensor_desc(v, memory) for v in model.return_op.operands]
    host = [g.ops[0].index for g in groups.groups if g.on_host]
    ops = model.ops
    for d in inputs:
        chain = [ops[i] for i in host if _reads(ops[i], d["name"], ops)]
        if chain:
            s2d = [op for op in chain if op.name == "tpu.SpaceToDepth"]
            d["preprocess"] = {"ops": [op.name for op in chain], "space_to_depth": s2d[0].attrs()["block_size"]
                               if s2d else None, "on": "host"}
    return Program(chip, model, em.commands, inputs, outputs, memory.activation_base + memory.peak,
                   _weight_blob(model, memory), memory, groups, host, host_plan=host_plan)


def _reads(op, input_name: str, ops) -> bool:
    """Whether `op` lies downstream of model input `input_name`."""
    seen = set()
    stack = [op]
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, top.Input):
            if o.loc == input_name:
                return True
            continue
        stack.extend(v.owner for v in o.operands if hasattr(v.owner, "operands"))
    return False


def annotate(program: Program) -> None:
    """Write what the backend decided into the program's TPU module, so its text shows it as
    TPU-MLIR's listings do: each tensor's DDR address in its type, and on every op of a layer
    group a `group_info` (group, slices, per-lane local offset and bytes, and per slice the
    N / H index and size of its result)."""
    from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, IntegerAttr, i64

    from tftpu.backend.memory import write_addresses

    def ints(values) -> ArrayAttr:
        return ArrayAttr([IntegerAttr(int(v), i64) for v in values])

    write_addresses(program.model, program.memory)
    ops = program.model.ops
    types = program.groups.types
    for gi, g in enumerate(program.groups.groups):
        if g.is_global:
            continue
        slices = g.slices(types)
        for f in g.ops:
            name = f.outs[0]
            rows = [rng.tensors.get(name) for rng in slices]
            rows = [r for r in rows if r is not None]
            offset = g.local.get((name, 0), 0)
            ops[f.index].attributes["group_info"] = DictionaryAttr({
                "group": IntegerAttr(gi, i64), "n_slices": IntegerAttr(g.n_slices, i64),
                "h_slices": IntegerAttr(g.h_slices, i64), "local_offset": IntegerAttr(offset, i64),
                "local_bytes_per_lane": IntegerAttr(g.local_peak, i64),
                "n_idx": ints(r[0] for r in rows), "n_slice": ints(r[1] - r[0] for r in rows),
                "h_idx": ints(r[2] for r in rows), "h_slice": ints(r[3] - r[2] for r in rows)})
