"""The TPU kernel registry, keyed by full op name (`tpu.Conv`), one table per kind of
arithmetic: `INT8["tpu.Conv"]` computes in integers, float ops share one rule (the TOP kernel
in float32, its result rounded to the mode's type). A kernel maps
`(operands, attrs, OpInfo) -> results`."""

from __future__ import annotations

from typing import Callable

Kernel = Callable[[list, dict, object], list]

INT8: dict[str, Kernel] = {}
OWN: dict[str, Kernel] = {}      # the TPU's own ops (tpu.Cast, tpu.Lut), any mode


def int8(*names: str):
    """Register the decorated function as the INT8 kernel of each full op name."""

    def wrap(fn: Kernel) -> Kernel:
        for name in names:
            INT8[name] = fn
        return fn

    return wrap


def own(name: str):
    def wrap(fn: Kernel) -> Kernel:
        OWN[name] = fn
        return fn

    return wrap
