"""Module passes over TOP (and later TPU) models, registered by name and run as a pipeline
string in MLIR's syntax, the module verified after each pass (see `tftpu.utils.passes`).

>>> results = run_pipeline(model, "canonicalize,convert-layout{layout=NHWC}")   # doctest: +SKIP
>>> print(results[1])                                                         # doctest: +SKIP
convert-layout: 1 rewrite(s), 0 declined (0.012 s)

A pass is a dataclass whose fields are its options (`convert-layout{layout=NHWC}` sets
`layout`), with a `name` and one `apply(model) -> PassResult` that records each decision with
its reason. A pass that leaves an invalid module is a bug: `InternalError` naming the pass.
"""

from __future__ import annotations

from typing import Sequence

from tftpu.utils.decisions import PassResult
from tftpu.utils.passes import ModulePass, PassRegistry

__all__ = ["ModulePass", "TOP_PASSES", "register", "registered", "parse_pipeline", "run_pipeline"]

TOP_PASSES = PassRegistry("TOP", verify=lambda model: model.verify(),
                          modules=("tftpu.transforms.canonicalize", "tftpu.transforms.convert_layout",
                                   "tftpu.transforms.space_to_depth"))
register = TOP_PASSES.register


def registered() -> dict[str, type[ModulePass]]:
    """Every TOP pass by name."""
    return TOP_PASSES.passes()


def parse_pipeline(spec: str) -> list[ModulePass]:
    """TOP passes from a pipeline string; UsageError for a bad string, pass or option."""
    return TOP_PASSES.parse(spec)


def run_pipeline(model, passes: str | Sequence[ModulePass], verify: bool = True) -> list[PassResult]:
    """Run `passes` over `model` in place, verifying it after each; each pass's result."""
    return TOP_PASSES.run(model, passes, verify)
