"""Host placement of TPU ops by TAC's exact pick: each op runs on the chip or on the host CPU,
whichever makes the whole program cheapest, counting the data that crosses between them.

This is the target-aware-conversion seed's "hook your own importer" applied to TPU modules: the
ops are TAC's subgraphs, the chip and the host are its hardware (the chip priced by
`tftpu.backend.cycles` on its own config, the host by the same model on `tftpu/configs/chips/cpu.yaml`,
the host machine), and `tftpu.tac.passes.pick.pick_exact` chooses, exact for the cost: an op's
time on its device, plus for every tensor crossing devices its bytes over the link and a fixed
synchronisation. Ops the chip cannot run at all (`UNSUPPORTED`) only have the host to go to.

>>> plan = place_on_host(tpu_model, "edge16")      # doctest: +SKIP
>>> plan.ops, plan.reasons                          # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses


from tftpu import chip as chips
from tftpu.backend.cycles import op_cycles, tensor_bytes
from tftpu.ir import top, tpu
from tftpu.ir.base import value_name
from tftpu.tac.passes.pick import Problem, pick_exact

__all__ = ["HostPlan", "place_on_host", "host_us", "SYNC_US", "HOST_OP_US", "UNSUPPORTED"]

SYNC_US = 10.0                 # a chip <-> host hand-over inside the program (interrupt, cache flush), µs
HOST_OP_US = 2.0               # the host's cost of launching one op (dispatch, threads), µs
# the exact pick's frontier bound: an unrolled recurrent net keeps every step's output live until
# its final Concat, and 2**steps choice combinations would take hours; past it a beam keeps the best
HOST_STATES = 1024
UNSUPPORTED: dict = {}         # chip name -> full op names it cannot run (none of the bundled chips)
_CHIP, _HOST = "CHIP", "HOST"


class _Device:
    """What TAC's pick asks of a device: switching and (here free) type-conversion costs."""

    def __init__(self, name: str, bytes_per_us: float):
        self.name = name
        self.bytes_per_us = bytes_per_us

    def get_hardware_switching_cost(self, from_hardware, buffer_size: int) -> float:
        if from_hardware.name == self.name:
            return 0.0
        return buffer_size / min(self.bytes_per_us, from_hardware.bytes_per_us) + SYNC_US

    def get_quant_dequant_cost(self, from_type: str, to_type: str, elements: int) -> float:
        return 0.0             # an op keeps its types wherever it runs


@dataclasses.dataclass
class HostPlan:
    """The ops (module op indices) the host runs, why, and the estimated cost of the program
    with them there against every op on the chip where it can run (µs)."""

    ops: set
    reasons: dict              # op name -> why it runs on the host
    cost_us: float
    all_chip_us: float

    def as_dict(self) -> dict:
        return {"host_ops": sorted(self.reasons), "reasons": self.reasons, "cost_us": round(self.cost_us, 3),
                "all_chip_us": round(self.all_chip_us, 3)}


def host_us(op, chip) -> float:
    """An op's time on the chip's host CPU: FLOPs at `host.flops` or bytes at `host.bandwidth`."""
    moved = sum(tensor_bytes(v.type) for v in op.operands) + sum(tensor_bytes(r.type) for r in op.results)
    return max(op.flops() / chip.host.flops, moved / chip.host.bandwidth) * 1e6


def place_on_host(model, chip, fixed: set | None = None) -> HostPlan:
    """Which TPU ops of `model` run on the chip's host. `fixed` op indices go to the host
    whatever the cost (e.g. the S2D input preprocessing)."""
    chip = chips.load(chip)
    fixed = set(fixed or ())
    refused = UNSUPPORTED.get(chip.name, set())
    all_ops = model.ops                  # a fresh list per access: read once
    index = [i for i, op in enumerate(all_ops) if isinstance(op, tpu.TpuOp)]
    node = {all_ops[i]: k for k, i in enumerate(index)}
    link = chip.ddr_bandwidth / 1e6
    devices = {_CHIP: _Device(_CHIP, link), _HOST: _Device(_HOST, link)}
    choices, compute, edges = [], [], {}
    host_in, host_out = [], []
    outputs = {id(v) for v in model.return_op.operands}
    for k, i in enumerate(index):
        op = all_ops[i]
        from_inputs = 0
        for v in op.operands:
            owner = v.owner
            if owner in node:
                key = (node[owner], k)
                edges[key] = (edges.get(key, (0, 0))[0] + tensor_bytes(v.type), 0)
            elif isinstance(owner, top.Input):
                from_inputs += tensor_bytes(v.type)
        to_outputs = sum(tensor_bytes(r.type) for r in op.results if id(r) in outputs)
        on_chip = op_cycles(op, chip).cycles / chip.frequency_hz * 1e6 + (from_inputs + to_outputs) / link
        on_host = host_us(op, chip) + HOST_OP_US
        if i in fixed or op.name in refused:
            choices.append([(_HOST, "host")])
            compute.append([on_host])
        else:
            choices.append([(_CHIP, "chip"), (_HOST, "host")])
            compute.append([on_chip, on_host])
        host_in.append((0, 0))
        host_out.append((0, 0))
    problem = Problem(choices, compute, edges, host_in, host_out, lambda name: devices[name], host=_HOST)
    picked = pick_exact(problem, max_states=HOST_STATES)
    ops, reasons = set(), {}
    all_chip_cost = problem.cost([0] * len(choices))       # each op on the chip where it can run
    for k, b in enumerate(picked.plan):
        if choices[k][b][0] != _HOST:
            continue
        i = index[k]
        ops.add(i)
        name = value_name(all_ops[i].results[0])
        if i in fixed:
            reasons[name] = "host preprocessing (the space-to-depth input)"
        elif len(choices[k]) == 1:
            reasons[name] = f"{chip.name} does not run {all_ops[i].name}"
        else:
            reasons[name] = (f"host {compute[k][1]:.1f} us against {compute[k][0]:.1f} us on {chip.name}, "
                             "transfers included in the pick")
    return HostPlan(ops, reasons, picked.cost, all_chip_cost)
