"""Compatibility shims for the pinned stack, kept in one place.

tf2onnx 1.17 predates numpy 2 and Keras 3 in a few spots:

* it still calls ``np.product`` (removed in numpy 2.0) when it writes large tensors
  externally and when it reads TF.js weights; `install()` restores the alias;
* ``tf2onnx.convert.from_keras`` reads ``model.output_names``, which Keras 3 functional
  models fill with internal tensor names it cannot resolve; `keras_output_names` gives
  names that work.

`install()` is idempotent and is called by every tftpu module that imports tf2onnx.
"""

from __future__ import annotations

import numpy as np

_ALIASES = {"product": "prod", "cumproduct": "cumprod", "sometrue": "any", "alltrue": "all"}


def install() -> None:
    """Restore the numpy 1 aliases that tf2onnx still calls."""
    for old, new in _ALIASES.items():
        if not hasattr(np, old):
            setattr(np, old, getattr(np, new))


def keras_output_names(model) -> list[str]:
    """Output names tf2onnx can use for a Keras 3 model: the output layers' names, unique."""
    names, seen = [], set()
    for i, tensor in enumerate(model.outputs):
        history = getattr(tensor, "_keras_history", None)
        base = history[0].name if history else f"output_{i}"
        name = base
        while name in seen:
            name = f"{base}_{i}"
        seen.add(name)
        names.append(name)
    return names


def import_tensorflow_quietly():
    """Import TensorFlow with its C++ start-up lines (oneDNN, CPU features) kept off stderr,
    unless `TFTPU_VERBOSE=1` (see `tftpu.utils.quiet.import_tensorflow`)."""
    from tftpu.utils import quiet

    return quiet.import_tensorflow()
