"""Compiled TOP inference: lower a whole TOP module once into one TensorFlow graph.

Each TOP op becomes TF ops inside a single `tf.function` (weights become graph constants,
re-laid-out once), so a call runs the whole model with no per-op Python dispatch. 4-D tensors of
NCHW ops are kept channels-last (TF's CPU layout) between ops; a transpose is emitted only where
an op needs the logical layout. The job is split in three: `values` (tensors and their layouts
while tracing), `lowerings` (one per TOP op) and `builder` (the graph, fallbacks, running it).

>>> ex = CompiledTop(model)            # doctest: +SKIP
>>> outputs = ex.run({"input": x})     # doctest: +SKIP
"""

from tftpu.interp.compiled.builder import CompiledTop, use_caller_thread
from tftpu.interp.compiled.lowerings import LOWERINGS
from tftpu.interp.compiled.values import NotLowered, Val

__all__ = ["CompiledTop", "LOWERINGS", "NotLowered", "Val", "use_caller_thread"]
