"""The backend: what turns a TPU module into something a chip runs (DDR memory assignment and a
per-op cycle model today; layer groups, codegen and the simulator next)."""

from tftpu.backend.cycles import CycleReport, estimate, s2d_stem
from tftpu.backend.memory import MemoryPlan, assign_memory, plan_memory

__all__ = ["MemoryPlan", "assign_memory", "plan_memory", "CycleReport", "estimate", "s2d_stem"]
