"""Hardware models: what a device runs, what an op costs there, what switching to it costs.

`TargetHardware` is the full interface (as TensorFlow's TAC): `is_op_supported`, `get_op_cost`,
`get_hardware_switching_cost`, `get_quant_dequant_cost`, `transformations`. `SimpleHardware`
asks only which ops it refuses and how much faster than the CPU it is. `ConfiguredHardware`
reads everything from `tftpu/configs/hardware/<name>.yaml` (the built-in CPU, GPU and NNAPI).
Costs are in microseconds.
"""

from __future__ import annotations

import abc
from typing import ClassVar, Sequence

from tftpu import errors
from tftpu.tac.graph import FLOAT, HYBRID, QUANTIZED_INT8, QUANTIZED_UINT8, QUANTIZED_INT16
from tftpu.tac.hardware import config, opcost

_FLOATISH = (FLOAT, HYBRID)
_QUANTIZED = (QUANTIZED_INT8, QUANTIZED_UINT8, QUANTIZED_INT16)


class TargetHardware(abc.ABC):
    """A device TAC can place ops on; subclass, set `name`, register it (see `registry`)."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    # per-byte / fixed cost of moving data onto or off this device (µs); used by switching costs
    transfer_us_per_byte: float = 0.0
    transfer_fixed_us: float = 0.0

    @abc.abstractmethod
    def is_op_supported(self, op) -> bool:
        """Whether `op` (a `tftpu.tac.graph.Node`) can run on this device as it is."""

    @abc.abstractmethod
    def get_op_cost(self, op) -> float:
        """Estimated time of `op` on this device, µs."""

    def get_hardware_switching_cost(self, from_hardware: "TargetHardware", buffer_size: int) -> float:
        """Cost of bringing `buffer_size` bytes produced on `from_hardware` to this device, µs."""
        if from_hardware.name == self.name:
            return 0.0
        per_byte = max(self.transfer_us_per_byte, getattr(from_hardware, "transfer_us_per_byte", 0.0))
        fixed = max(self.transfer_fixed_us, getattr(from_hardware, "transfer_fixed_us", 0.0))
        return buffer_size * per_byte + fixed

    def get_quant_dequant_cost(self, from_type: str, to_type: str, elements: int) -> float:
        """Cost of converting `elements` values from inference type `from_type` to `to_type`, µs."""
        if from_type == to_type:
            return 0.0
        q = self.quant_costs()
        if from_type in _FLOATISH and to_type in _FLOATISH:
            return 0.0
        if from_type in _FLOATISH and to_type in _QUANTIZED:
            return q["quant_us_per_element"] * elements
        if from_type in _QUANTIZED and to_type in _FLOATISH:
            return q["dequant_us_per_element"] * elements
        return q["requant_us_per_element"] * elements

    def quant_costs(self) -> dict:
        return config.load(_simple_config())["quant"]

    def transformations(self) -> Sequence:
        """Lowerings to apply in this device's alternative views: names from
        `tftpu.tac.passes.lowerings.PATTERNS` or callables `f(node, graph) -> [Node] | None`."""
        return ()

    def get_func_cost(self, ops) -> float:
        """Cost of a whole subgraph view: the sum of its ops' costs."""
        return float(sum(self.get_op_cost(op) for op in ops))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class SimpleHardware(TargetHardware):
    """A device described by the ops it refuses and its speed-up over the CPU (as TF's TAC).

    Switching costs come from `tftpu/configs/hardware/simple.yaml`.
    """

    def __init__(self):
        cfg = config.load(_simple_config())
        self.transfer_us_per_byte = float(cfg["transfer"]["us_per_byte"])
        self.transfer_fixed_us = float(cfg["transfer"]["fixed_us"])

    def is_not_supported_op(self, op) -> bool:
        """True for ops this device cannot run."""
        return False

    @abc.abstractmethod
    def advantage_over_cpu(self) -> float:
        """How many times faster than the CPU this device runs a supported op."""

    def is_op_supported(self, op) -> bool:
        return not self.is_not_supported_op(op)

    def get_op_cost(self, op) -> float:
        advantage = float(self.advantage_over_cpu())
        if advantage <= 0:
            raise errors.ConfigError(f"hardware {self.name}: advantage_over_cpu must be > 0, got {advantage}")
        return self.reference().get_op_cost(op) / advantage

    def reference(self) -> "TargetHardware":
        """The CPU whose costs this device divides (the registry gives the registered one)."""
        if not hasattr(self, "_cpu"):
            self._cpu = ConfiguredHardware(config.find("cpu"))
            self._cpu.name = "CPU"
        return self._cpu


class ConfiguredHardware(TargetHardware):
    """A device whose op support and costs come from `tftpu/configs/hardware/<config_name>.yaml`."""

    config_name: ClassVar[str] = ""

    def __init__(self, path=None):
        path = path or config.find(self.config_name or self.name)
        if path is None:
            raise errors.ConfigError(f"no hardware config {self.config_name or self.name.lower()}.yaml in "
                                     f"{config.config_dir()}")
        self.config = cfg = config.load(path)
        self.path = path
        self.inference_types = set(cfg["inference_types"])
        ops = cfg["supported_ops"]
        self.all_ops = ops == "all"
        self.supported_ops = set() if self.all_ops else set(ops)
        self.custom_ops = set(cfg.get("custom_ops", []) or [])
        self.activation_dtypes = set(cfg.get("activation_dtypes", []) or [])
        self.max_rank = int(cfg.get("max_rank", 0) or 0)
        cons = cfg.get("op_constraints", {}) or {}
        self.rank4_only = set(cons.get("rank4_only", []) or [])
        self.const_input_only = set(cons.get("const_input_only", []) or [])
        self.float_only = set(cons.get("float_only", []) or [])
        cost = cfg["cost"]
        self.throughput = {k: float(v) for k, v in cost["throughput_gflops"].items()}
        self.bandwidth = float(cost["bandwidth_gbps"])
        self.overhead = float(cost["op_overhead_us"])
        self.efficiency = {k: float(v) for k, v in (cost.get("efficiency", {}) or {}).items()}
        self.transfer_us_per_byte = float(cfg["transfer"]["us_per_byte"])
        self.transfer_fixed_us = float(cfg["transfer"]["fixed_us"])
        self._quant = cfg["quant"]
        self._transforms = tuple(cfg.get("transformations", []) or [])

    def quant_costs(self) -> dict:
        return self._quant

    def transformations(self) -> Sequence:
        return self._transforms

    def is_op_supported(self, op) -> bool:
        return self.why_not_supported(op) is None

    def why_not_supported(self, op) -> str | None:
        """None if `op` runs here, else the reason (for reports)."""
        t = op.op_type
        if op.name == "CUSTOM":
            if not self.all_ops and t not in self.custom_ops:
                return f"custom op {t} not supported"
        elif not self.all_ops and t not in self.supported_ops:
            return f"{t} not supported"
        if op.subgraph_refs() and not self.all_ops:
            return f"{t} holds subgraphs"
        itype = op.inference_type
        if itype not in self.inference_types:
            return f"{t}: inference type {itype} not supported"
        g = op.graph
        if self.activation_dtypes:
            for v in op.activations():
                if g.dtype(v) not in self.activation_dtypes:
                    return f"{t}: dtype {g.dtype(v)} not supported"
        if self.max_rank:
            for v in op.activations():
                if len(g.shape(v)) > self.max_rank:
                    return f"{t}: rank {len(g.shape(v))} > {self.max_rank}"
        if t in self.rank4_only and any(len(g.shape(v)) != 4 for v in op.activations()):
            return f"{t}: only 4-D tensors"
        if t in self.const_input_only and op.inputs and not g.is_const(op.inputs[0]):
            return f"{t}: only on constant input"
        if t in self.float_only and itype != FLOAT:
            return f"{t}: float only"
        return None

    def get_op_cost(self, op) -> float:
        itype = op.inference_type
        gflops = self.throughput.get(itype) or self.throughput.get(FLOAT) or min(self.throughput.values())
        eff = self.efficiency.get(op.op_type, self.efficiency.get("default", 1.0))
        compute = opcost.arithmetic_count(op) / (gflops * 1e3 * eff)
        memory = opcost.bytes_moved(op) / (self.bandwidth * 1e3)
        return max(compute, memory) + self.overhead


def _simple_config():
    path = config.find("simple")
    if path is None:
        raise errors.ConfigError(f"no hardware config simple.yaml in {config.config_dir()}")
    return path
