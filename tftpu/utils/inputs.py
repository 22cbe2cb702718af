"""Match the arrays a user gives to a model's inputs: by name, else by position."""

from __future__ import annotations

from typing import Mapping, Sequence

from tftpu.errors import ShapeError


def match_inputs(names: Sequence[str], inputs: Mapping) -> list:
    """Arrays of `inputs` in the order of `names`: by name when all names are there, else by
    position when the counts agree; a ShapeError saying what was given otherwise."""
    names = list(names)
    if set(names) <= set(inputs):
        return [inputs[n] for n in names]
    if len(inputs) == len(names):
        return list(inputs.values())
    raise ShapeError(f"inputs {sorted(inputs)} do not match the model's inputs {names}")
