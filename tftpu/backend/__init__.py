"""The backend: what turns a TPU module into something a chip runs (memory assignment today;
layer groups, codegen and the simulator next)."""

from tftpu.backend.memory import MemoryPlan, assign_memory, plan_memory

__all__ = ["MemoryPlan", "assign_memory", "plan_memory"]
