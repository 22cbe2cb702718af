"""tftpu's additions to tf2onnx: exact GELU (Erfc) and XLA-compiled nested functions (grouped convs)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.frontend.onnx_graphs import run_ort
from tftpu import frontend
from tftpu.interp.top_interpreter import run


def _check(model_or_fn, x, want, **kwargs):
    proto = frontend.to_onnx(model_or_fn, **kwargs)
    assert not [n for n in proto.graph.node if n.op_type in ("Erfc", "StatefulPartitionedCall")]
    (ort,) = run_ort(proto, {proto.graph.input[0].name: x}).values()
    np.testing.assert_allclose(ort, want, rtol=2e-6, atol=2e-6)
    top = frontend.load(proto)
    got = run(top, {top.input_names[0]: x})[top.output_names[0]]
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    return proto, top


@pytest.mark.parametrize("approximate", [False, True])
def test_exact_and_tanh_gelu(approximate):
    inp = keras.Input((5, 7))
    model = keras.Model(inp, keras.layers.Activation(lambda t: keras.activations.gelu(t, approximate))(inp))
    x = np.linspace(-9, 9, 35, dtype=np.float32).reshape(1, 5, 7)
    _check(model, x, np.asarray(model(x)))


def test_erfc_function_over_its_range():
    fn = tf.function(lambda t: tf.math.erfc(t), input_signature=[tf.TensorSpec([1, 101], tf.float32)])
    x = np.linspace(-4, 4, 101, dtype=np.float32)[None]
    proto, top = _check(fn, x, tf.math.erfc(x).numpy(), input_signature=fn.input_signature)
    assert {op.op_name for op in top.ops} >= {"Erf"}


@pytest.mark.parametrize("groups", [2, 8])
def test_grouped_conv_runs_in_xla_and_still_converts(groups):
    """Keras 3 wraps grouped Conv2D in tf.function(jit_compile=True); it must be inlined."""
    inp = keras.Input((9, 9, 8))
    y = keras.layers.Conv2D(8, 3, padding="same", groups=groups, use_bias=True,
                            bias_initializer="random_normal")(inp)
    model = keras.Model(inp, keras.layers.Conv2D(4, 1)(y))
    x = np.random.default_rng(groups).normal(size=(1, 9, 9, 8)).astype(np.float32)
    proto, top = _check(model, x, np.asarray(model(x)))
    convs = [n for n in proto.graph.node if n.op_type == "Conv"]
    assert any(a.name == "group" and a.i == groups for n in convs for a in n.attribute)


@pytest.mark.parametrize("size", [(2, 2), (3, 1)])
def test_keras_upsampling_imports_and_runs_int8(size):
    """Keras 3's UpSampling2D exports as Unsqueeze -> Tile -> Reshape (`tf.repeat`): Tile imports as
    Concats of copies, equal to Keras, and lowers to INT8 (data movement on the input's grid)."""
    from tftpu.interp.tpu import TpuInterpreter
    from tftpu.quant import calibrate
    from tftpu.transforms.lowering import lower

    inp = keras.Input((5, 6, 3))
    y = keras.layers.Conv2D(4, 3, padding="same")(inp)
    model = keras.Model(inp, keras.layers.UpSampling2D(size)(y))
    x = np.random.default_rng(3).normal(size=(1, 5, 6, 3)).astype(np.float32)
    proto, top = _check(model, x, np.asarray(model(x)))
    assert "Tile" in {n.op_type for n in proto.graph.node}
    tm, _ = lower(top, "npu1", "INT8", calibrate(top, [{top.input_names[0]: x}]))
    got = TpuInterpreter(tm).run({top.input_names[0]: x}, dequantize=True)[top.output_names[0]]
    want = np.asarray(model(x))
    assert got.shape == want.shape
    assert 10 * np.log10(np.sum(want ** 2) / np.sum((got - want) ** 2)) > 25
