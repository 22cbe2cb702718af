"""The one place that picks the `.tflite` interpreter: LiteRT (`ai-edge-litert`) when installed,
else TensorFlow's `tf.lite.Interpreter` (deprecated in its favour); everything in tftpu.lite
runs `.tflite` files through here.

>>> outputs = run(model_bytes, [x])        # doctest: +SKIP
"""

from __future__ import annotations

import functools
import warnings

import numpy as np

from tftpu import errors

__all__ = ["interpreter", "name", "run", "run_named", "input_details", "output_details"]


@functools.lru_cache(maxsize=None)
def _interpreter_class():
    try:
        from ai_edge_litert.interpreter import Interpreter
        return Interpreter, "LiteRT (ai-edge-litert)"
    except ImportError:  # not installable with the pinned stack on this platform
        import tensorflow as tf
        return tf.lite.Interpreter, "TensorFlow tf.lite.Interpreter"


def name() -> str:
    """Which interpreter runs `.tflite` files here."""
    return _interpreter_class()[1]


def interpreter(model, *, preserve_all_tensors: bool = False, num_threads: int | None = None):
    """An allocated interpreter for `model` (bytes or path); all tensors kept on request
    (no default delegate then, so every intermediate tensor is readable)."""
    cls, _ = _interpreter_class()
    kwargs = {"experimental_preserve_all_tensors": preserve_all_tensors}
    if num_threads is not None:
        kwargs["num_threads"] = num_threads
    try:
        with warnings.catch_warnings():   # keeping every tensor is what calibration asks for
            warnings.filterwarnings("ignore", message=".*experimental_preserve_all_tensors.*")
            if isinstance(model, (bytes, bytearray, memoryview)):
                interp = cls(model_content=bytes(model), **kwargs)
            else:
                interp = cls(model_path=str(model), **kwargs)
        interp.allocate_tensors()
    except (ValueError, RuntimeError) as exc:
        where = "<tflite bytes>" if isinstance(model, (bytes, bytearray, memoryview)) else str(model)
        raise errors.ModelFileError(where, f"the TFLite interpreter cannot load it: "
                                           f"{str(exc).strip().splitlines()[0]}") from None
    return interp


def input_details(interp) -> list[dict]:
    return sorted(interp.get_input_details(), key=lambda d: d["index"])


def output_details(interp) -> list[dict]:
    return sorted(interp.get_output_details(), key=lambda d: d["index"])


def _quantize(x: np.ndarray, detail: dict) -> np.ndarray:
    dtype = np.dtype(detail["dtype"])
    if dtype.kind in "iu" and np.asarray(x).dtype.kind == "f":
        scale, zero = detail["quantization"]
        info = np.iinfo(dtype)
        return np.clip(np.round(np.asarray(x) / scale + zero), info.min, info.max).astype(dtype)
    return np.asarray(x, dtype)


def _dequantize(y: np.ndarray, detail: dict) -> np.ndarray:
    scale, zero = detail["quantization"]
    if y.dtype.kind in "iu" and scale:
        return (y.astype(np.float32) - zero) * np.float32(scale)
    return y


def run(model_or_interp, inputs, *, dequantize: bool = True) -> list[np.ndarray]:
    """Outputs (in output-index order) for `inputs` (a list in input-index order); float inputs
    of an integer model are quantized with its input scale, integer outputs dequantized."""
    interp = model_or_interp if hasattr(model_or_interp, "invoke") else interpreter(model_or_interp)
    ins = input_details(interp)
    if len(inputs) != len(ins):
        raise errors.ShapeError(f"the model has {len(ins)} inputs, {len(inputs)} given")
    for d, x in zip(ins, inputs):
        if tuple(np.shape(x)) != tuple(d["shape"]):
            raise errors.ShapeError(f"input {d['name']!r}: shape {list(np.shape(x))}, the model wants "
                                    f"{list(map(int, d['shape']))}")
        interp.set_tensor(d["index"], _quantize(x, d))
    interp.invoke()
    outs = [interp.get_tensor(d["index"]).copy() for d in output_details(interp)]
    if dequantize:
        outs = [_dequantize(y, d) for y, d in zip(outs, output_details(interp))]
    return outs


def run_named(path, inputs: dict, *, dump_all: bool = False) -> dict[str, np.ndarray]:
    """A `.tflite` file's outputs keyed by their tensor names (every readable tensor with
    `dump_all`), for `inputs` matched to its inputs by name, else by position (as tftpu-run
    matches them); integer tensors dequantized. The file is read and checked by tftpu's own
    flatbuffer reader first (a corrupt one is a ModelFileError, not a crash of the runtime)."""
    from tftpu.tac import tflite_io
    from tftpu.utils.inputs import match_inputs, numeric

    tflite_io.read(path)
    interp = interpreter(path, preserve_all_tensors=dump_all)
    ins = input_details(interp)
    arrays = [numeric(d["name"], x) for d, x in zip(ins, match_inputs([d["name"] for d in ins], inputs))]
    outs = dict(zip((d["name"] for d in output_details(interp)), run(interp, arrays)))
    if dump_all:
        for d in sorted(interp.get_tensor_details(), key=lambda d: d["index"]):
            if d["name"] in outs:
                continue
            try:
                outs[d["name"]] = _dequantize(np.array(interp.get_tensor(d["index"])), d)
            except ValueError:          # a tensor the runtime does not keep (a constant folded away)
                continue
    return outs
