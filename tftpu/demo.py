"""The end-to-end job `tftpu-demo` runs on the bundled default model and photo.

It grows with the product: today it builds the resnet18-like reference model, exports it
through tf2onnx, runs it with onnxruntime and checks the result against Keras.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from absl import logging


def run(output_dir: str | Path, image_size: int = 224, log=print) -> dict:
    """Run the demo pipeline, writing its artefacts to `output_dir`; return a summary dict."""
    import onnxruntime as ort
    import tensorflow as tf
    import tf2onnx

    from tftpu import compat, models
    from tftpu.utils import files

    compat.install()
    output_dir = Path(output_dir)
    summary = {}

    t = time.perf_counter()
    model = models.resnet18_like((image_size, image_size, 3))
    image = models.sample_image(image_size)
    x = (image[None].astype(np.float32) / 127.5) - 1.0
    expected = model(x, training=False).numpy()
    log(f"[1/2] built {model.name}: {model.count_params():,} parameters, input {x.shape} "
        f"({time.perf_counter() - t:.1f} s)")

    t = time.perf_counter()
    spec = (tf.TensorSpec((1, image_size, image_size, 3), tf.float32, name="image"),)
    proto, _ = tf2onnx.convert.from_function(
        tf.function(lambda image: model(image, training=False)), input_signature=spec, opset=13)
    onnx_path = output_dir / f"{model.name}.onnx"
    files.write_bytes(onnx_path, proto.SerializeToString())
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x})[0]
    err = float(np.abs(got - expected).max())
    cosine = float(np.dot(got.ravel(), expected.ravel())
                   / (np.linalg.norm(got) * np.linalg.norm(expected)))
    log(f"[2/2] exported {onnx_path} ({len(proto.graph.node)} ONNX nodes); onnxruntime vs Keras: "
        f"max |diff| {err:.2e}, cosine {cosine:.8f} ({time.perf_counter() - t:.1f} s)")
    summary.update(onnx=str(onnx_path), onnx_nodes=len(proto.graph.node), max_abs_diff=err,
                   cosine=cosine, top5=np.argsort(-expected[0])[:5].tolist())
    logging.info("demo summary: %s", summary)
    return summary
