"""tftpu.data: the host S2D transform against tf.nn.space_to_depth, fused layouts, dataset shapes."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

import tftpu.data
from tests.data.reference import two_step_s2d
from tftpu.errors import ShapeError, UsageError


_reference = two_step_s2d


TO_LAYOUT = {"NHWC": [0, 1, 2, 3], "NCHW": [0, 3, 1, 2], "HWCN": [1, 2, 3, 0]}

CASES = list(itertools.product([2, 3, 4], [(8, 8), (9, 7), (13, 16)], [1, 3, 4], ["uint8", "float32"]))


@pytest.mark.parametrize("block,size,channels,dtype", CASES)
def test_transform_matches_two_step_reference_in_every_layout(block, size, channels, dtype):
    rng = np.random.default_rng(block * 100 + size[0])
    images = rng.integers(0, 256, (2,) + size + (channels,)).astype(dtype)
    convert = dict(dtype="float32", scale=1 / 255, offset=-0.5) if dtype == "uint8" else {}
    ref = _reference(images, block, **convert)
    for layout, perm in TO_LAYOUT.items():
        got = tftpu.data.transform(images, block, layout=layout, **convert)
        np.testing.assert_array_equal(got, tf.transpose(ref, perm))  # fused == S2D then transpose
        jit = tf.function(lambda x: tftpu.data.transform(x, block, layout=layout, **convert), jit_compile=True)
        if "offset" in convert:  # XLA fuses x * scale + offset into one FMA: within an ulp of x * scale
            np.testing.assert_allclose(jit(images), got, rtol=0, atol=np.spacing(np.float32(1.0)))
        else:
            np.testing.assert_array_equal(jit(images), got)


def test_per_channel_scale_offset_and_unbatched():
    images = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    got = tftpu.data.transform(images, 2, dtype=tf.float32, scale=1 / (255 * std), offset=-mean / std)
    ref = _reference(images[None], 2, "float32", (1 / (255 * std)).astype(np.float32),
                     (-mean / std).astype(np.float32))[0]
    np.testing.assert_array_equal(got, ref)
    assert got.shape == (3, 4, 12)
    # host padding is zero after the conversion (a normalizing offset must not leak into it)
    assert np.all(got[2, :, 6:] == 0) and np.all(got[:, 3, 3:6] == 0)


def test_video_blocks():
    video = np.random.default_rng(0).normal(size=(2, 4, 6, 5, 3)).astype(np.float32)
    got = tftpu.data.transform(video, (2, 2, 2))
    x = np.pad(video, [(0, 0), (0, 0), (0, 0), (0, 1), (0, 0)]).reshape(2, 2, 2, 3, 2, 3, 2, 3)
    ref = x.transpose(0, 1, 3, 5, 2, 4, 6, 7).reshape(2, 2, 3, 3, 24)
    np.testing.assert_array_equal(got, ref)


def _images(n=6, size=(10, 9)):
    return np.random.default_rng(1).integers(0, 256, (n,) + size + (3,), dtype=np.uint8)


@pytest.mark.parametrize("structure", ["tensor", "tuple", "dict", "unbatched_tuple", "triple"])
@pytest.mark.parametrize("jit", [None, False])
def test_dataset_elements(structure, jit):
    images, labels = _images(), np.arange(6)
    base = {
        "tensor": lambda: tf.data.Dataset.from_tensor_slices(images).batch(4),
        "tuple": lambda: tf.data.Dataset.from_tensor_slices((images, labels)).batch(4),
        "dict": lambda: tf.data.Dataset.from_tensor_slices({"image": images, "label": labels}).batch(4),
        "unbatched_tuple": lambda: tf.data.Dataset.from_tensor_slices((images, labels)),
        "triple": lambda: tf.data.Dataset.from_tensor_slices((labels, images, labels * 2)).batch(4),
    }[structure]()
    kwargs = {"image_key": 1} if structure == "triple" else {}
    ds = tftpu.data.space_to_depth(base, 2, dtype="float32", scale=1 / 255, jit_compile=jit, **kwargs)
    got = list(ds.as_numpy_iterator())
    want = list(base.as_numpy_iterator())
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if structure == "tensor":
            g, w = (g,), (w,)
        elif structure == "dict":
            g, w = (g["image"], g["label"]), (w["image"], w["label"])
        idx = 1 if structure == "triple" else 0
        img = w[idx] if structure != "unbatched_tuple" else w[idx][None]
        ref = _reference(img, 2, "float32", np.float32(1 / 255)).numpy()
        np.testing.assert_array_equal(g[idx], ref if structure != "unbatched_tuple" else ref[0])
        for i in range(len(w)):
            if i != idx:
                np.testing.assert_array_equal(g[i], w[i])


def test_hwcn_fused_double_transpose_dataset():
    ds = tf.data.Dataset.from_tensor_slices(_images(8, (224, 224))).batch(4, drop_remainder=True)
    fused = tftpu.data.space_to_depth(ds, 2, layout="HWCN", dtype="float32", scale=1 / 255)
    two_step = ds.map(lambda x: tf.transpose(tf.nn.space_to_depth(tf.cast(x, tf.float32) * (1 / 255), 2),
                                             [1, 2, 3, 0]))
    for a, b in zip(fused, two_step):
        assert a.shape == (112, 112, 12, 4)
        np.testing.assert_array_equal(a, b)


def test_errors():
    ds = tf.data.Dataset.from_tensor_slices(_images()).batch(2)
    with pytest.raises(UsageError, match="layout"):
        tftpu.data.space_to_depth(ds, 2, layout="NWHC")
    with pytest.raises(UsageError, match="block_size"):
        tftpu.data.space_to_depth(ds, 1)
    with pytest.raises(UsageError, match="HWCN"):
        tftpu.data.space_to_depth(ds.unbatch(), 2, layout="HWCN")
    with pytest.raises(ShapeError, match="expected"):
        tftpu.data.space_to_depth(tf.data.Dataset.from_tensor_slices(np.zeros((4, 5), np.uint8)).batch(2), 2)
    with pytest.raises(UsageError, match="image_key"):
        tftpu.data.space_to_depth(tf.data.Dataset.from_tensor_slices({"x": _images(), "y": np.arange(6)}), 2)
    with pytest.raises(ShapeError, match="per-channel"):
        tftpu.data.space_to_depth(ds, 2, dtype="float32", scale=[1.0, 2.0])
    with pytest.raises(UsageError, match="floating"):
        tftpu.data.space_to_depth(ds, 2, dtype="int32", scale=2)


def test_dynamic_image_size_pads_at_run_time():
    gen = lambda: (np.ones((h, 5, 3), np.float32) for h in (4, 7))  # noqa: E731
    ds = tf.data.Dataset.from_generator(gen, output_signature=tf.TensorSpec((None, None, 3), tf.float32))
    shapes = [x.shape for x in tftpu.data.space_to_depth(ds, 2)]
    assert shapes == [(2, 3, 12), (4, 3, 12)]


def _entry_ops(hlo_text):
    """Op names of the ENTRY computation of an optimized HLO module."""
    entry = hlo_text[hlo_text.index("ENTRY"):]
    return [line.split("=", 1)[1].split("(")[0].split()[-1] for line in entry.splitlines()[1:] if " = " in line]


@pytest.mark.parametrize("shape,block,layout", [
    ((4, 224, 224, 3), 2, "NHWC"), ((4, 224, 224, 3), 2, "NCHW"), ((4, 224, 224, 3), 2, "HWCN"),
    ((3, 9, 7, 3), 2, "NHWC"), ((3, 9, 7, 3), 3, "HWCN"), ((2, 8, 12, 4), 4, "NCHW")])
def test_compiled_transform_is_one_pass_and_pads_only_odd_sizes(shape, block, layout):
    """The host cost rests on XLA compiling conversion + pad + S2D + layout into one loop fusion."""
    fn = tf.function(lambda x: tftpu.data.transform(x, block, layout=layout, dtype="float32",
                                                     scale=[0.1, 0.2, 0.3, 0.4][:shape[-1]], offset=-1.0),
                     jit_compile=True)
    x = tf.zeros(shape, tf.uint8)
    hlo = fn.experimental_get_compiler_ir(x)(stage="optimized_hlo")
    ops = [op for op in _entry_ops(hlo) if op not in ("parameter", "constant", "bitcast")]
    assert ops == ["fusion"], ops
    needs_pad = any(s % block for s in shape[1:3])
    assert (" pad(" in hlo) == needs_pad
