"""Small TFLite models built with TensorFlow's own converter, for the TAC tests and benchmark."""

from __future__ import annotations

import functools

import numpy as np


def _tf():
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    return tf


def convert(fn, specs, *, quant: str | None = None, custom_ops: bool = False, rep_data=None) -> bytes:
    """tf.function + input specs -> .tflite bytes (quant: None, 'fp16', 'dynamic', 'int8', 'sparse')."""
    tf = _tf()
    conc = tf.function(fn).get_concrete_function(*[tf.TensorSpec(s, tf.float32) for s in specs])
    conv = tf.lite.TFLiteConverter.from_concrete_functions([conc])
    if custom_ops:
        conv.allow_custom_ops = True
    if quant == "fp16":
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.target_spec.supported_types = [tf.float16]
    elif quant == "dynamic":
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
    elif quant == "sparse":
        conv.optimizations = [tf.lite.Optimize.EXPERIMENTAL_SPARSITY]
    elif quant == "int8":
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        rng = np.random.default_rng(0)
        conv.representative_dataset = rep_data or (
            lambda: ([rng.standard_normal(s).astype(np.float32) for s in specs] for _ in range(20)))
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    return conv.convert()


def _w(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 0.3


@functools.lru_cache(maxsize=None)
def mixed(quant: str | None = None) -> bytes:
    """Conv stack with Pack, Split, SplitV, Sub, SquaredDifference, FC, Mean: ops GPU must lower."""
    tf = _tf()
    k1, k2, fw = _w(1, 3, 3, 4, 8), _w(2, 1, 1, 8, 8), _w(3, 8, 6)

    def fn(x):
        y = tf.nn.relu(tf.nn.conv2d(x, k1, 1, "SAME"))
        a, b = tf.split(y, 2, axis=3)
        c, d, e = tf.split(y, [2, 2, 4], axis=3)
        s = a - b
        sq = tf.math.squared_difference(c, d)
        z = tf.nn.conv2d(y, k2, 1, "SAME") - tf.concat([s, sq, e[..., :0]], axis=3)[..., :1]
        m = tf.reduce_mean(z, axis=[1, 2])
        f = tf.matmul(m, fw)
        p = tf.stack([f, f * 2.0], axis=1)
        return p, tf.nn.relu6(z)

    return convert(fn, [(1, 8, 8, 4)], quant=quant)


@functools.lru_cache(maxsize=None)
def chain(blocks: int, width: int = 8, size: int = 16, pack_every: int = 3) -> bytes:
    """A long conv chain with a Pack/Split/Sub every few blocks: `blocks` * ~7 ops."""
    tf = _tf()
    ks = [_w(10 + i, 3, 3, width, width) for i in range(blocks)]
    k0 = _w(9, 3, 3, 3, width)

    def fn(x):
        y = tf.nn.relu(tf.nn.conv2d(x, k0, 1, "SAME"))
        for i, k in enumerate(ks):
            z = tf.nn.conv2d(y, k, 1, "SAME")
            if i % pack_every == 0:
                a, b = tf.split(z, 2, axis=3)
                z = tf.concat([a - b, a + b], axis=3)
                z3 = tf.reshape(z, [size, size, width])
                z = tf.stack([z3, z3 * 0.5], axis=0)[:1]
            y = tf.nn.relu6(z + y)
        return y

    return convert(fn, [(1, size, size, 3)])


@functools.lru_cache(maxsize=None)
def hybrid() -> bytes:
    """Dynamic-range quantized: int8 FC weights, float activations (HYBRID ops)."""
    tf = _tf()
    w1, w2 = _w(6, 64, 64), _w(7, 64, 32)

    def fn(x):
        return tf.nn.relu(tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2)) - 0.5

    return convert(fn, [(2, 64)], quant="dynamic")


@functools.lru_cache(maxsize=None)
def while_loop() -> bytes:
    """A model with a WHILE op: three subgraphs."""
    tf = _tf()

    def fn(x):
        i = tf.constant(0)
        _, y = tf.while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, y * 1.5 - 0.25), [i, x])
        return y + 1.0

    return convert(fn, [(2, 3)])


@functools.lru_cache(maxsize=None)
def custom_op() -> bytes:
    """A model holding a TF op TFLite lacks, kept as a custom op (allow_custom_ops)."""
    tf = _tf()

    def fn(x):
        return tf.math.bessel_i1e(x) + 1.0

    return convert(fn, [(4,)], custom_ops=True)


@functools.lru_cache(maxsize=None)
def sparse() -> bytes:
    """A model whose FC weights are 90% zero, stored sparse (DENSIFY)."""
    tf = _tf()
    w = _w(5, 64, 64)
    w[np.abs(w) < 0.5] = 0.0
    w[:, : 60] = 0.0

    def fn(x):
        return tf.nn.relu(tf.matmul(x, w))

    return convert(fn, [(2, 64)], quant="sparse")


def run_tflite(data: bytes, inputs: list[np.ndarray] | None = None, seed: int = 0) -> list[np.ndarray]:
    """Run `data` in tf.lite.Interpreter on `inputs` (random if None); outputs in output order."""
    tf = _tf()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        it = tf.lite.Interpreter(model_content=bytes(data))
    it.allocate_tensors()
    details = it.get_input_details()
    rng = np.random.default_rng(seed)
    if inputs is None:
        inputs = []
        for d in details:
            if d["dtype"] == np.float32:
                inputs.append(rng.standard_normal(d["shape"]).astype(np.float32))
            else:
                info = np.iinfo(d["dtype"])
                inputs.append(rng.integers(info.min, info.max, d["shape"], endpoint=True).astype(d["dtype"]))
    for d, x in zip(details, inputs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]
