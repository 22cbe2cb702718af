"""INT8 lowerings by full TOP op name. A lowering `fn(ctx, op) -> str | None` appends the TPU
ops for `op` and returns None, or returns why it declines (the op then runs in a float mode)."""

from __future__ import annotations

from typing import Callable

Lowering = Callable[[object, object], "str | None"]

INT8: dict[str, Lowering] = {}


def int8(*names: str):
    """Register the decorated function as the INT8 lowering of each full TOP op name."""

    def wrap(fn: Lowering) -> Lowering:
        for name in names:
            INT8[name] = fn
        return fn

    return wrap
