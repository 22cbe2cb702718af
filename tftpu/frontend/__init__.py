"""tftpu.frontend: any supported model -> a TOP model (`load`), and -> ONNX (`to_onnx`).

Accepted: an ONNX path/bytes/ModelProto, a `.tflite` file, a Keras model or `.keras`/`.h5`
file, a SavedModel directory, a `tf.function` with an input signature, a `.mlir` TOP file.

>>> from tftpu import frontend
>>> model = frontend.load("resnet50.onnx", input_shapes=[[1, 3, 224, 224]])  # doctest: +SKIP
>>> model.save("resnet50.top.mlir")                                          # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path

from tftpu.errors import ModelFileError, UsageError

__all__ = ["load", "to_onnx", "source_kind", "onnx_to_top", "parse_shapes", "EXPORTED_AT_SHAPES"]


def source_kind(model) -> str:
    """"onnx", "tflite", "keras", "saved_model", "function", "mlir" or "top" for a model argument."""
    from tftpu.ir.module import TopModel
    if isinstance(model, TopModel):
        return "top"
    if isinstance(model, (bytes, bytearray)):
        return "onnx"
    if isinstance(model, (str, Path)):
        p = Path(model)
        if p.is_dir():
            if (p / "saved_model.pb").is_file():
                return "saved_model"
            raise ModelFileError(p, "a directory that is not a SavedModel (no saved_model.pb)")
        if not p.exists():
            raise ModelFileError(p, "no such file")
        suffix = p.suffix.lower()
        kinds = {".onnx": "onnx", ".tflite": "tflite", ".mlir": "mlir", ".keras": "keras", ".h5": "keras"}
        if suffix not in kinds:
            raise ModelFileError(p, f"unknown model type {suffix or '(no suffix)'}; "
                                    "expected .onnx, .tflite, .keras, .h5, .mlir or a SavedModel directory")
        return kinds[suffix]
    mod = type(model).__module__
    if type(model).__name__ == "ModelProto" and mod.startswith("onnx"):
        return "onnx"
    if mod.startswith("keras") or hasattr(model, "layers") and hasattr(model, "inputs"):
        return "keras"
    if hasattr(model, "get_concrete_function") or type(model).__name__ == "ConcreteFunction":
        return "function"
    raise UsageError(f"cannot import a {type(model).__name__}; give an ONNX/TFLite/Keras/SavedModel model")


# the sources whose ONNX export takes `input_shapes` (the others' ONNX form is checked against them)
EXPORTED_AT_SHAPES = ("saved_model", "keras")


def to_onnx(model, input_shapes=None, opset: int | None = None, input_signature=None):
    """ONNX ModelProto of a TF/Keras/TFLite/ONNX model (static shapes for TF sources)."""
    from tftpu.frontend import tf_export
    from tftpu.frontend.onnx_load import read_model
    opset = opset or tf_export.DEFAULT_OPSET
    kind = source_kind(model)
    if kind == "onnx":
        return read_model(model)
    if kind == "tflite":
        return tf_export.tflite_to_onnx(model, opset)
    if kind == "saved_model":
        return tf_export.saved_model_to_onnx(model, input_shapes, opset)
    if kind == "keras":
        if isinstance(model, (str, Path)):
            model = _load_keras(model)
        return tf_export.keras_to_onnx(model, input_shapes, opset)
    if kind == "function":
        sig = input_signature or getattr(model, "input_signature", None)
        if sig is None:
            raise UsageError("a tf.function needs an input_signature to be imported")
        return tf_export.function_to_onnx(model, sig, opset)
    raise UsageError(f"cannot export a {kind} model to ONNX")


def _load_keras(path):
    import keras
    try:
        return keras.models.load_model(str(path), compile=False, safe_mode=True)
    except Exception as e:  # Keras raises many kinds of errors on a bad file
        raise ModelFileError(path, f"cannot load Keras model: {' '.join(str(e).split())[:200]}") from None


def load(model, input_shapes=None, name: str | None = None, canonicalize: bool = True,
         opset: int | None = None, input_signature=None):
    """A verified TOP model (`tftpu.ir.TopModel`) from any supported source, canonicalized by default."""
    from tftpu.frontend.onnx_load import check_shapes, parse_shapes
    from tftpu.frontend.onnx_to_top import onnx_to_top as _onnx_to_top
    from tftpu.ir.module import load as load_mlir
    if isinstance(input_shapes, str):
        input_shapes = parse_shapes(input_shapes)
    elif input_shapes is not None:
        input_shapes = check_shapes(input_shapes)
    kind = source_kind(model)
    if kind == "top":
        top_model = model
    elif kind == "mlir":
        top_model = load_mlir(model)
    else:
        if name is None:
            name = Path(model).stem if isinstance(model, (str, Path)) else getattr(model, "name", None) or "model"
        proto = to_onnx(model, input_shapes, opset, input_signature)
        # SavedModels and Keras models are exported at the shapes given; ONNX ones take them here, and
        # a .tflite's (or a tf.function's signature's) fixed shapes are checked against them
        top_model = _onnx_to_top(proto, name, None if kind in EXPORTED_AT_SHAPES else input_shapes,
                                 where=str(model) if kind == "onnx" and isinstance(model, (str, Path)) else None)
    if canonicalize:
        from tftpu.transforms.canonicalize import canonicalize as canon
        canon(top_model)
    return top_model


def onnx_to_top(model, name=None, input_shapes=None):
    """Import an ONNX model without canonicalizing it (see `tftpu.frontend.onnx_to_top`)."""
    from tftpu.frontend.onnx_to_top import onnx_to_top as _impl
    return _impl(model, name, input_shapes)


def parse_shapes(text):
    """`"[[1,3,224,224]]"` -> `[[1, 3, 224, 224]]`."""
    from tftpu.frontend.onnx_load import parse_shapes as _impl
    return _impl(text)
