"""tftpu.transforms: passes over TOP (and later TPU) modules, one module per pass.

Each pass is a `pipeline.ModulePass` registered by name (`canonicalize`, `convert-layout`)
and runs from Python or a tool as a pipeline string:

>>> from tftpu.transforms.pipeline import run_pipeline
>>> results = run_pipeline(model, "canonicalize,convert-layout{layout=NHWC},canonicalize")  # doctest: +SKIP
"""
