"""The estimated performance of a program: its commands scheduled on the chip's engines
(`tftpu.backend.timeline`), giving latency, per-op cycles, matrix-unit utilisation and how much
DMA hides behind compute; and its timeline as a Chrome trace.

>>> prof = profile(program)                      # doctest: +SKIP
>>> prof.latency_us, prof.top(3)                 # doctest: +SKIP
>>> prof.write_trace("resnet.trace.json")        # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses

from tftpu.backend import timeline
from tftpu.backend.cycles import op_cycles
from tftpu.ir import tpu

__all__ = ["Profile", "profile"]


@dataclasses.dataclass
class Profile:
    """Latency and where the cycles go, for one program."""

    chip: str
    frequency_hz: float
    commands: list
    slots: list
    flops: int
    ops: list                       # {"name", "type", "cycles"} in program order (compute cycles)
    utilisation: float

    @property
    def cycles(self) -> int:
        return timeline.latency(self.slots)

    @property
    def latency_us(self) -> float:
        return self.cycles / self.frequency_hz * 1e6

    @property
    def busy(self) -> dict:
        return timeline.busy(self.slots)

    @property
    def overlap(self) -> float:
        return timeline.overlap(self.slots)

    def top(self, n: int = 5) -> list:
        return sorted(self.ops, key=lambda o: (-o["cycles"], o["name"]))[:n]

    def as_dict(self) -> dict:
        return {"latency_us": round(self.latency_us, 3), "cycles": self.cycles, "flops": self.flops,
                "utilisation": round(self.utilisation, 6), "ops": self.ops, "commands": len(self.commands),
                "busy_cycles": self.busy, "dma_hidden": round(self.overlap, 6)}

    def write_trace(self, path) -> None:
        """The timeline as Chrome trace-event JSON (DMA, compute and host engines as tracks)."""
        labels = [c.get("name") or f"{c['kind']} {c.get('tensor', '')}".strip() for c in self.commands]
        timeline.write_trace(path, [dict(c, args=_args(c)) for c in self.commands], self.slots,
                             self.frequency_hz, name=f"tpumodel on {self.chip}", labels=labels)

    def __str__(self) -> str:
        busy = self.busy
        head = ", ".join(f"{o['name']} ({o['type']}) {o['cycles']:,}" for o in self.top(3))
        return (f"{self.flops:,} FLOPs; estimated latency on {self.chip}: {self.latency_us:,.1f} us ({self.cycles:,} cycles, "
                f"{len(self.commands):,} commands; compute busy {busy.get('tiu', 0):,}, DMA busy "
                f"{busy.get('dma', 0):,}, {100 * self.overlap:.0f}% of DMA hidden), matrix unit utilisation "
                f"{100 * self.utilisation:.1f}%; top ops by cycles: {head}")


def _args(c: dict) -> dict:
    keep = ("kind", "tensor", "rows", "group", "slice", "local", "ddr")
    return {k: c[k] for k in keep if k in c and c[k] is not None}


def profile(program) -> Profile:
    """Schedule `program`'s commands and total them per op."""
    slots = timeline.schedule(program.commands)
    chip = program.chip
    ops = list(program.model.ops)
    per_op: dict = {}
    for c in program.commands:
        if "op" in c:
            per_op[c["op"]] = per_op.get(c["op"], 0) + c["cycles"]
    rows, useful, matrix_cycles, flops = [], 0, 0, 0
    for i, op in enumerate(ops):
        if not isinstance(op, tpu.TpuOp):
            continue
        flops += int(op.flops())
        cycles = per_op.get(i, 0)
        rows.append({"name": op.loc, "type": op.name, "cycles": int(cycles)})
        est = op_cycles(op, chip)
        if est.issued_macs and i not in program.host:
            useful += est.useful_macs
            matrix_cycles += cycles
    unit = chip.matrix.rows * chip.matrix.cols
    util = useful / (matrix_cycles * unit) if matrix_cycles else 0.0
    return Profile(chip.name, chip.frequency_hz, program.commands, slots, flops, rows, min(util, 1.0))
