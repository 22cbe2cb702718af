"""Match the arrays a user gives to a model's inputs: by name, else by position."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from tftpu.errors import InputError, ShapeError


def match_inputs(names: Sequence[str], inputs: Mapping) -> list:
    """Arrays of `inputs` in the order of `names`: by name when all names are there, else by
    position when the counts agree; a ShapeError saying what was given otherwise."""
    names = list(names)
    if set(names) <= set(inputs):
        return [inputs[n] for n in names]
    if len(inputs) == len(names):
        return list(inputs.values())
    raise ShapeError(f"inputs {sorted(inputs)} do not match the model's inputs {names}")


def numeric(name: str, arr) -> np.ndarray:
    """`arr` as an array of numbers (bool, integers or reals), else an InputError naming input
    `name` and what it holds (text, bytes, complex numbers, dates, objects: no model input takes them)."""
    arr = np.asarray(arr)
    if arr.dtype.kind not in "biuf":
        what = _KINDS.get(arr.dtype.kind, "values")
        raise InputError(f"input {name!r} holds {what} ({arr.dtype}); the model takes real numbers")
    return arr


_KINDS = {"U": "text", "S": "bytes", "c": "complex numbers", "M": "dates", "m": "time spans", "O": "Python objects",
          "V": "raw records"}
