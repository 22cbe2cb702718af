"""The backend: what turns a TPU module into a program a chip runs, and runs it on a simulated
chip: layer groups (`layer_group`), host placement (`host`), the DDR plan (`memory`), codegen
(`codegen`), the `.tpumodel` file (`model_file`, `tpumodel`), the simulator (`simulator`), the
cycle model and the estimated timeline (`cycles`, `timeline`, `profile`)."""

from tftpu.backend.cycles import CycleReport, estimate, s2d_stem
from tftpu.backend.memory import MemoryPlan, assign_memory, plan_memory

__all__ = ["MemoryPlan", "assign_memory", "plan_memory", "CycleReport", "estimate", "s2d_stem"]
