"""Wrong values and types given to the Python API: one typed tftpu error naming the argument,
raised before any work (not a TypeError or AttributeError from deep inside)."""

from __future__ import annotations

import numpy as np
import pytest

import tftpu
from tests.frontend.onnx_graphs import conv_bn_relu_net, rand
from tftpu import errors


@pytest.fixture(scope="module")
def top():
    return tftpu.frontend.load(conv_bn_relu_net(), input_shapes=[[1, 3, 32, 32]])


@pytest.mark.parametrize("kw,error,needle", [
    ({"tolerance": 0.5}, errors.UsageError, "tolerance must be two numbers"),
    ({"tolerance": float("nan")}, errors.UsageError, "tolerance"),
    ({"quantize": None}, errors.UsageError, "quantize=None"),
    ({"quantize": 8}, errors.UsageError, "quantize=8"),
    ({"log": 5}, errors.UsageError, "log=5"),
    ({"chip": None}, errors.ConfigError, "chip config None: expected a name"),
    ({"chip": 123}, errors.ConfigError, "chip config 123"),
])
def test_compile_refuses_before_importing(kw, error, needle, monkeypatch):
    from tftpu import compiler

    monkeypatch.setattr(compiler, "_import", lambda *a: pytest.fail("imported before the arguments were checked"))
    with pytest.raises(error, match=needle):
        tftpu.compile(conv_bn_relu_net(), **{"chip": "npu1", **kw})


@pytest.mark.parametrize("kw,needle", [
    ({"calibration_table": 5}, "calibration_table=5: expected a file path or a CalibrationTable"),
    ({"calibration_table": {"x": 1}}, "calibration_table="),
    ({"quantize_table": 5}, "quantize_table=5: expected a file path or a dict"),
    ({"quantize_table": ["y"]}, "quantize_table="),
    ({"quantize": None}, "--quantize=None"),
])
def test_deploy_refuses_wrong_typed_tables(top, kw, needle):
    from tftpu.pipelines.deploy import deploy

    with pytest.raises(errors.UsageError, match=needle):
        deploy(top, **{"quantize": "INT8", "chip": "npu1", **kw})


def test_deploy_takes_a_plain_set_of_conv_names(top):
    """wide_links as a set (the documented form), not only a frozenset."""
    from tftpu.pipelines.deploy import deploy

    table = tftpu.quant.calibrate(top, [{"x": rand(1, 3, 32, 32, seed=s)} for s in range(2)])
    conv = next(op.loc for op in top.ops if op.name == "top.Conv")
    result = deploy(top, quantize="INT8", chip="npu1", calibration_table=table, wide_links={conv},
                    mixed_precision=None)
    assert result.wide_links == frozenset({conv})


def test_calibrate_refuses_a_histogram_too_large(top):
    with pytest.raises(errors.UsageError, match="at most 1,048,576"):
        tftpu.quant.calibrate(top, [{"x": rand(1, 3, 32, 32)}], bins=10 ** 12)


@pytest.mark.parametrize("kw,needle", [({"max_states": 0}, "max_states 0"), ({"max_states": -1}, "max_states -1"),
                                       ({"device_specs": []}, "device_specs"), ({"device_specs": None}, "device_specs"),
                                       ({"device_specs": "GPU"}, "device_specs")])
def test_tac_refuses_bad_arguments(kw, needle):
    from tests import material

    with pytest.raises(errors.UsageError, match=needle):
        tftpu.tac.run(material.get("face_detection_short_range.tflite"), **kw)
    with pytest.raises(errors.UsageError, match="path or its bytes"):
        tftpu.tac.run(5)


@pytest.mark.parametrize("block", [2.5, None, float("nan"), "2", [2, 2.0]])
def test_space_to_depth_refuses_a_block_that_is_not_an_int(block):
    import keras
    import tensorflow as tf

    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3, strides=2)])
    with pytest.raises(errors.UsageError, match="block_size"):
        tftpu.keras.space_to_depth(model, block)
    with pytest.raises(errors.UsageError, match="block_size"):
        tftpu.data.space_to_depth(tf.data.Dataset.from_tensors(np.zeros((8, 8, 3), np.float32)), block)


@pytest.mark.parametrize("samples,error,needle", [
    (None, errors.UsageError, "none given"),
    ([5], errors.ShapeError, "samples\\[0\\]: input 'x' has shape \\[\\]"),
    (np.zeros((1, 3, 32, 32), np.complex64), errors.InputError, "complex numbers"),
    ([np.array([None] * 3072, object).reshape(1, 3, 32, 32)], errors.InputError, "Python objects"),
])
def test_calibrate_reads_samples_as_iter_samples_does(top, samples, error, needle):
    """One dict or an array is a sample, as everywhere else; what is no sample is a typed error."""
    with pytest.raises(error, match=needle):
        tftpu.quant.calibrate(top, samples)
    x = rand(1, 3, 32, 32)
    assert tftpu.quant.calibrate(top, {"x": x}).entries == tftpu.quant.calibrate(top, [{"x": x}]).entries
    with pytest.raises(errors.UsageError, match="calibrate takes a TOP model"):
        tftpu.quant.calibrate("model.onnx", [{"x": x}])


def test_deploy_refuses_a_test_input_or_reference_of_the_wrong_kind(top):
    from tftpu.pipelines.deploy import deploy

    with pytest.raises(errors.UsageError, match="--test_input int"):
        deploy(top, quantize="F32", chip="npu1", test_input=5)
    x = {"x": rand(1, 3, 32, 32)}
    with pytest.raises(errors.UsageError, match="--test_reference int"):
        deploy(top, quantize="F32", chip="npu1", test_input=x, test_reference=5)
    with pytest.raises(errors.ShapeError, match="--test_reference 'y' has shape \\[2, 2\\]"):
        deploy(top, quantize="F32", chip="npu1", test_input=x, test_reference={"y": np.zeros((2, 2))})


@pytest.mark.parametrize("options,needle", [
    ([1], "expected a dict"), ({"nope": {}}, "names 'nope'"), ({"space_to_depth": 5}, "expected a dict of its options"),
    ({"space_to_depth": {"nope": 1}}, "expected a dict of its options"),
    ({"space_to_depth": {"block_size": 0}}, "block_size 0"), ({"space_to_depth": {"block_size": "x"}}, "block_size 'x'")])
def test_optimize_refuses_pass_options_it_would_ignore(options, needle):
    import tensorflow as tf

    f = tf.function(lambda x: x * 2)
    with pytest.raises(errors.UsageError, match=needle):
        tftpu.optimize(f, tf.ones([1, 4]), pass_options=options)


@pytest.mark.parametrize("path", [None, 5])
def test_a_path_that_is_no_path_is_a_usage_error(path):
    with pytest.raises(errors.UsageError, match="expected a file path"):
        tftpu.quant.read_table(path)


@pytest.mark.parametrize("kw", [{"space_to_depth": "no"}, {"bias_correction": "off"}, {"float_tail": None},
                                {"input_grid": "x"}, {"equalize": "on"}, {"asymmetric": "yes"}, {"weight_refit": 1}])
def test_a_switch_given_a_truthy_string_is_refused(kw, monkeypatch):
    """space_to_depth="no" is truthy and would switch the step on: every switch takes True or
    False ("auto" where it has one), named on a mistake."""
    from tftpu import compiler

    monkeypatch.setattr(compiler, "_import", lambda *a: pytest.fail("imported before the arguments were checked"))
    with pytest.raises(errors.UsageError, match=f"{next(iter(kw))}=.*expected one of"):
        tftpu.compile(conv_bn_relu_net(), chip="npu1", **kw)


def test_deploy_switches_are_checked_too(top):
    from tftpu.pipelines.deploy import deploy

    for kw in ({"checks": "x"}, {"conv_links": "no"}, {"asymmetric": "both"}):
        with pytest.raises(errors.UsageError, match="expected one of"):
            deploy(top, quantize="F32", chip="npu1", **kw)


def test_optimize_names_arguments_the_function_cannot_be_traced_with():
    import tensorflow as tf

    f = tf.function(lambda x: tf.reshape(x, [2, 3]))
    with pytest.raises(errors.UsageError, match="cannot trace .* with the arguments given \\(TypeError"):
        tftpu.optimize(f)
    with pytest.raises(errors.UsageError, match="cannot trace .* with the arguments given \\(ValueError"):
        tftpu.optimize(f, tf.ones([5]))


def test_data_space_to_depth_and_evaluate_name_arguments_of_the_wrong_kind():
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensors(np.zeros((8, 8, 3), np.float32))
    with pytest.raises(errors.UsageError, match="takes a tf.data.Dataset, not NoneType"):
        tftpu.data.space_to_depth(None, 2)
    for bad in (-5, "x"):
        with pytest.raises(errors.UsageError, match="num_parallel_calls"):
            tftpu.data.space_to_depth(ds, 2, num_parallel_calls=bad)
    top = tftpu.frontend.load(conv_bn_relu_net(), input_shapes=[[1, 3, 32, 32]])
    with pytest.raises(errors.UsageError, match="input_num 'x'"):
        tftpu.quant.load_samples(top, [{"x": rand(1, 3, 32, 32)}], input_num="x")
    with pytest.raises(errors.UsageError, match="cluster 'x'"):
        tftpu.quant.calibrate(top, [{"x": rand(1, 3, 32, 32)}], cluster="x")
