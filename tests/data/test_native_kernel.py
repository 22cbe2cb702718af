"""The native host S2D kernel: bit-equal to TensorFlow's two-step reference over a shape sweep."""

import importlib
import itertools

import numpy as np
import pytest
import tensorflow as tf

import tftpu.data
from tests.data.reference import two_step_s2d
from tftpu.errors import UsageError
from tftpu.utils import native

s2d_module = importlib.import_module("tftpu.data.space_to_depth")  # the module, not the function

SIZES = [(1, 1), (2, 2), (3, 5), (8, 8), (9, 13), (16, 15)]
# (input dtype, conversion): per-channel normalisation, scale only, offset only, plain copies
CONVERSIONS = [
    ("uint8", dict(dtype="float32", scale="per-channel", offset="per-channel")),
    ("uint8", dict(dtype="float32", scale=1 / 255)),
    ("uint8", dict(dtype="float32", offset=-128.0)),
    ("uint8", dict(dtype="float32")),
    ("uint8", {}),
    ("float32", dict(scale="per-channel", offset=0.5)),
    ("float32", {}),
]


_reference = two_step_s2d


def _convert(conversion, channels, rng):
    per_channel = lambda: rng.uniform(-3, 3, channels).astype(np.float32)  # noqa: E731
    return {k: per_channel() if v == "per-channel" else v for k, v in conversion.items()}


@pytest.mark.parametrize("block", [2, 3, 4])
def test_kernel_matches_reference_bit_for_bit(block):
    rng = np.random.default_rng(block)
    checked = 0
    for (h, w), channels, batch, (dtype, conversion) in itertools.product(
            SIZES, [1, 2, 3, 4, 5], [1, 3], CONVERSIONS):
        images = rng.integers(0, 256, (batch, h, w, channels)).astype(dtype)
        if dtype == "float32":
            images = images * np.float32(0.37) - np.float32(40)  # fractions and signs, -0.0 kept
            images[0, 0, 0, 0] = -0.0
        convert = _convert(conversion, channels, rng)
        want = _reference(images, block, **convert)
        for parallel in (True, False):
            got = tftpu.data.native_transform(images, block, parallel=parallel, **convert)
            assert got.dtype == want.dtype and got.shape == want.shape, (h, w, channels)
            np.testing.assert_array_equal(got.numpy().view(np.uint8), want.numpy().view(np.uint8),
                                          err_msg=f"{(batch, h, w, channels)} {dtype} {conversion}")
        checked += 1
    assert checked == len(SIZES) * 5 * 2 * len(CONVERSIONS)


def test_unbatched_and_static_shape_inference():
    images = np.random.default_rng(0).integers(0, 256, (7, 9, 3), dtype=np.uint8)
    got = tftpu.data.native_transform(images, 2, dtype="float32", scale=1 / 255)
    np.testing.assert_array_equal(got, _reference(images[None], 2, "float32", np.float32(1 / 255))[0])

    @tf.function(input_signature=[tf.TensorSpec([None, 224, 223, 3], tf.uint8)])
    def blocked(x):
        by4 = tftpu.data.native_transform(x, 4, dtype="float32")
        by2 = tftpu.data.native_transform(x, 2)
        assert by4.shape.as_list() == [None, 56, 56, 48] and by2.shape.as_list() == [None, 112, 112, 12]
        return by4

    blocked.get_concrete_function()


def test_dataset_takes_the_kernel_and_matches_xla():
    images = np.random.default_rng(1).integers(0, 256, (6, 30, 22, 3), dtype=np.uint8)
    labels = np.arange(6)
    ds = tf.data.Dataset.from_tensor_slices((images, labels)).batch(4)
    std = np.array([0.229, 0.224, 0.225])
    kwargs = dict(dtype="float32", scale=1 / (255 * std), offset=-1.5)
    assert s2d_module._choose("auto", ds.element_spec[0], (2, 2), "NHWC", "float32", 1.0, None) == "native"
    by_kernel = list(tftpu.data.space_to_depth(ds, 2, implementation="native", **kwargs))
    by_default = list(tftpu.data.space_to_depth(ds, 2, **kwargs))
    by_xla = list(tftpu.data.space_to_depth(ds, 2, implementation="xla", **kwargs))
    assert [k.shape for k, _ in by_kernel] == [(4, 15, 11, 12), (2, 15, 11, 12)]
    for (k, kl), (d, _), (x, xl), start in zip(by_kernel, by_default, by_xla, (0, 4)):
        np.testing.assert_array_equal(kl, xl)
        ref = _reference(images[start:start + 4], 2, "float32", np.float32(kwargs["scale"]), np.float32(-1.5))
        np.testing.assert_array_equal(k, ref)
        np.testing.assert_array_equal(d, ref)
        np.testing.assert_allclose(x, k, rtol=0, atol=4 * np.spacing(np.float32(8)))  # XLA's FMA


def test_auto_falls_back_to_xla_where_the_kernel_does_not_apply(monkeypatch):
    spec = tf.TensorSpec([None, 8, 8, 3], tf.uint8)
    assert s2d_module._choose("auto", spec, (2, 2), "HWCN", None, None, None) == "xla"
    assert s2d_module._choose("auto", spec, (2, 2), "NCHW", "float32", None, None) == "xla"
    assert s2d_module._choose("auto", tf.TensorSpec([None, 8, 8, 3], tf.int32), (2, 2), "NHWC",
                              None, None, None) == "xla"
    assert s2d_module._choose("auto", spec, (2, 1), "NHWC", None, None, None) == "xla"
    with pytest.raises(UsageError, match="HWCN"):
        s2d_module._choose("native", spec, (2, 2), "HWCN", None, None, None)
    with pytest.raises(UsageError, match="implementation"):
        s2d_module._choose("fast", spec, (2, 2), "NHWC", None, None, None)
    with pytest.raises(UsageError, match="float32 only"):
        tftpu.data.native_transform(np.zeros((1, 4, 4, 3), np.uint8), 2, dtype="float16")
    # a machine without the kernel: auto still works (on XLA), native says why
    monkeypatch.setattr(s2d_module, "_native_ops", lambda: (None, "no C++ compiler found"))
    assert s2d_module._choose("auto", spec, (2, 2), "NHWC", "float32", None, None) == "xla"
    with pytest.raises(native.NativeKernelError, match="compiler"):
        s2d_module._choose("native", spec, (2, 2), "NHWC", "float32", None, None)
    ds = tf.data.Dataset.from_tensor_slices(np.ones((2, 4, 4, 3), np.uint8)).batch(2)
    (out,) = list(tftpu.data.space_to_depth(ds, 2, dtype="float32"))
    assert out.shape == (2, 2, 2, 12)


def test_build_errors_are_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setenv("TFTPU_CACHE", str(tmp_path / "cache"))
    broken = tmp_path / "broken_op.cc"
    broken.write_text("#include <nonexistent_header.h>\n")
    with pytest.raises(native.NativeKernelError, match=r"building broken_op.cc failed: .*nonexistent_header"):
        native.load_op_library(broken)
    assert not list((tmp_path / "cache" / "native").glob("*.so"))  # nothing half-written is left
    monkeypatch.setenv("TFTPU_NATIVE", "0")
    with pytest.raises(native.NativeKernelError, match="TFTPU_NATIVE=0"):
        native.load_op_library(broken)
    monkeypatch.setenv("TFTPU_NATIVE", "1")
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(native.NativeKernelError, match="no C\\+\\+ compiler"):
        native.load_op_library(broken.with_name("other_op.cc"))


def test_batch_split_over_threads_is_exact():
    """A batch big enough that the kernel splits its rows over the intra-op threads."""
    images = np.random.default_rng(2).integers(0, 256, (16, 225, 224, 3), dtype=np.uint8)
    std = np.float32([0.229, 0.224, 0.225])
    want = _reference(images, 2, "float32", 1 / (255 * std), np.float32(-2.0)).numpy()
    for parallel in (True, False):
        got = tftpu.data.native_transform(images, 2, dtype="float32", scale=1 / (255 * std), offset=-2.0,
                                          parallel=parallel)
        np.testing.assert_array_equal(got, want)
