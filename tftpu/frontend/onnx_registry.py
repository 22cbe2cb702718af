"""The ONNX converter table: `converter("Conv")` registers a function that emits TOP ops for one
ONNX node; a converter raises `Unsupported` for a case it cannot express (collected by the
importer and reported at the end, with the node's name)."""

from __future__ import annotations

from typing import Callable

__all__ = ["CONVERTERS", "Unsupported", "converter"]


class Unsupported(Exception):
    """Raised by a converter for a case it cannot express (collected, reported at the end)."""


CONVERTERS: dict[str, Callable] = {}   # full ONNX op name ("onnx.Conv") -> converter


def converter(*op_types: str):
    """Register the decorated converter for each ONNX op type of the default domain (keys are
    full names, `onnx.Conv`, as every op table of tftpu is)."""
    def wrap(fn):
        for t in op_types:
            CONVERTERS[f"onnx.{t}"] = fn
        return fn
    return wrap
