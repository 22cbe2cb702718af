"""tftpu.geometry against independent references: TensorFlow's and onnxruntime's output shapes,
and brute-force enumeration of the taps for the input rows an output range reads."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tftpu import geometry as G

ROOT = Path(__file__).resolve().parents[2]
window = st.tuples(st.integers(1, 40), st.integers(1, 7), st.integers(1, 4), st.integers(1, 3))


def _tf():
    import tensorflow as tf
    return tf


@settings(max_examples=60, deadline=None)
@given(window, st.sampled_from(["SAME", "VALID"]))
def test_conv_out_and_same_pads_match_tensorflow(w, padding):
    size, k, s, d = w
    if G.span(k, d) > size and padding == "VALID":
        return
    tf = _tf()
    x = np.zeros((1, size, 1, 1), np.float32)
    kernel = np.zeros((k, 1, 1, 1), np.float32)
    got = tf.nn.conv2d(x, kernel, [1, s if d == 1 else 1, 1, 1], padding, dilations=[1, d, 1, 1] if s == 1 else None
                       ) if d == 1 or s == 1 else None
    if got is None:
        return                                # TF takes dilation only at stride 1
    pb, pe = G.explicit_pads(padding, size, k, s if d == 1 else 1, d)
    assert got.shape[1] == G.conv_out(size, k, s if d == 1 else 1, d, pb, pe)
    if padding == "SAME":
        explicit = tf.nn.conv2d(x, kernel, [1, s if d == 1 else 1, 1, 1], [[0, 0], [pb, pe], [0, 0], [0, 0]],
                                dilations=[1, d, 1, 1] if s == 1 else None)
        np.testing.assert_array_equal(explicit.shape, got.shape)


def _ort_pool(size, k, s, pb, pe, d, ceil):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[k], strides=[s], pads=[pb, pe], dilations=[d],
                            ceil_mode=int(ceil))
    graph = helper.make_graph([node], "p", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": np.zeros((1, 1, size), np.float32)})[0].shape[2]


@settings(max_examples=40, deadline=None)
@given(window, st.integers(0, 3), st.integers(0, 3), st.booleans())
def test_pool_out_matches_onnxruntime(w, pb, pe, ceil):
    size, k, s, d = w
    if pb >= k or pe >= k or size + pb + pe < G.span(k, d):
        return                                  # onnxruntime refuses pads as large as the window
    assert G.pool_out(size, k, s, pb, pe, ceil, d) == _ort_pool(size, k, s, pb, pe, d, ceil)


@settings(max_examples=40, deadline=None)
@given(window, st.integers(0, 2), st.integers(0, 2), st.integers(0, 2))
def test_deconv_out_matches_tensorflow(w, pb, pe, op):
    size, k, s, d = w
    if op >= s or pb + pe >= G.deconv_out(size, k, s, d, 0, 0, op):
        return
    tf = _tf()
    full = G.deconv_out(size, k, s, d)
    y = tf.nn.conv2d_transpose(np.zeros((1, size, 1, 1), np.float32), np.zeros((G.span(k, d), 1, 1, 1), np.float32),
                               [1, full, 1, 1], [1, s, 1, 1], "VALID")
    assert y.shape[1] == full
    assert G.deconv_out(size, k, s, d, pb, pe, op) == full + op - pb - pe
    b, e = G.deconv_pads(size, full + op - pb - pe, k, s, d, op, upper=True)
    assert b + e == pb + pe


def _rows_read(out_start, out_stop, k, s, d, pb):
    return [o * s - pb + t * d for o in range(out_start, out_stop) for t in range(k)]


@settings(max_examples=300, deadline=None)
@given(window, st.integers(0, 3), st.data())
def test_input_range_is_the_rows_the_taps_read(w, pb, data):
    size, k, s, d = w
    out = G.conv_out(size, k, s, d, pb, pb)
    if out < 1:
        return
    a = data.draw(st.integers(0, out - 1))
    b = data.draw(st.integers(a + 1, out))
    r = G.input_range(a, b, k, s, d, pb, size)
    rows = _rows_read(a, b, k, s, d, pb)
    window = range(min(rows), max(rows) + 1)        # contiguous: a slice loads whole rows
    inside = [i for i in window if 0 <= i < size]
    assert set(rows) <= set(window)
    assert (r.start, r.stop) == ((inside[0], inside[-1] + 1) if inside else (r.start, r.start))
    assert r.pad_before == sum(i < 0 for i in window) and r.pad_after == sum(i >= size for i in window)
    assert r.pad_before + r.rows + r.pad_after == len(window)


# window arithmetic written again outside tftpu/geometry.py: each pattern is a formula it holds
COPIES = [re.compile(p) for p in (
    r"\bd\w*\s*\*\s*\(\s*k\w*(\[\w+\])?\s*-\s*1\s*\)",           # d * (k - 1)
    r"\(\s*k\w*(\[\w+\])?\s*-\s*1\s*\)\s*\*\s*d\w*",              # (k - 1) * d
    r"-\s*1\s*\)\s*//\s*s\w*(\[\w+\])?\s*\+\s*1",                   # (... - 1) // s + 1
    r"-\s*k\w*(\[\w+\])?\s*\)\s*//\s*s\w*(\[\w+\])?\s*\+\s*1",      # (size + pads - k) // s + 1
    r"total\s*//\s*2\s*,\s*total\s*-\s*total\s*//\s*2",             # SAME split
)]


def test_no_copy_of_window_geometry():
    found = []
    for path in sorted((ROOT / "tftpu").rglob("*.py")):
        if path.name == "geometry.py" and path.parent.name == "tftpu":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if any(p.search(line) for p in COPIES):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "window arithmetic outside tftpu/geometry.py:\n" + "\n".join(found)


def test_the_copy_check_would_see_a_copy():
    assert any(p.search("out = (size + pb + pe - d * (k - 1) - 1) // s + 1") for p in COPIES)
    assert any(p.search("    return total // 2, total - total // 2") for p in COPIES)


@pytest.mark.parametrize("padding", ["same", "SAME_LOWER", "VALID", (1, 2)])
def test_explicit_pads_modes(padding):
    pb, pe = G.explicit_pads(padding, 10, 3, 2)
    assert pb >= 0 and pe >= 0
