"""TOP interpreter: outputs and dumps keyed by location, input binding, errors."""

from __future__ import annotations

import numpy as np
import pytest

from tests.frontend.onnx_graphs import conv_bn_relu_net, rand, run_ort
from tftpu import errors, frontend
from tftpu.interp.top_interpreter import TopInterpreter, run
from tftpu.ir import TopBuilder


def diamond():
    b = TopBuilder("d")
    x = b.input("x", (2, 3))
    y = b.input("y", (2, 3))
    e = b.op("Exp", [x], {}, "e")
    n = b.op("Neg", [e], {}, "n")
    a = b.op("Add", [e, n], {}, "a")
    s = b.op("Split", [a], {"axis": 1, "split_size": [1, 2]}, ["s0", "s1"])
    m = b.op("Mul", [s[1], b.weight("w", np.full((2,), 3.0, np.float32))], {}, "m")
    return b.finish([m, b.op("Sub", [e, y], {}, "out2"), s[0]])


def test_outputs_by_name_and_multi_use_values_survive_freeing():
    model = diamond()
    x, y = rand(2, 3), rand(2, 3, seed=1)
    got = run(model, {"x": x, "y": y})
    assert list(got) == ["m", "out2", "s0"]
    e = np.exp(x)
    np.testing.assert_allclose(got["out2"], e - y, rtol=1e-6)
    np.testing.assert_allclose(got["m"], (e - e)[:, 1:] * 3, atol=1e-6)


def test_dump_all_tensors_keyed_by_location():
    got = run(diamond(), {"x": rand(2, 3), "y": rand(2, 3)}, dump_all=True)
    assert set(got) == {"x", "y", "e", "n", "a", "s0", "s1", "m", "out2"}


def test_inputs_bound_by_order_when_names_differ():
    interp = TopInterpreter(diamond())
    x, y = rand(2, 3), rand(2, 3, seed=1)
    a = interp.run({"input_0": x, "input_1": y})
    b = interp.run({"y": y, "x": x})
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_input_errors():
    interp = TopInterpreter(diamond())
    with pytest.raises(errors.ShapeError, match="shape"):
        interp.run({"x": rand(3, 3), "y": rand(2, 3)})
    with pytest.raises(errors.ShapeError, match="do not match"):
        interp.run({"x": rand(2, 3)})


def test_input_cast_to_model_type():
    got = run(diamond(), {"x": np.ones((2, 3), np.float64), "y": np.zeros((2, 3), np.int64)})
    assert got["out2"].dtype == np.float32


@pytest.mark.parametrize("batch", [1, 2])
def test_every_tensor_matches_onnxruntime(batch):
    m = conv_bn_relu_net()
    x = rand(batch, 3, 32, 32, seed=batch)
    raw = frontend.load(m, input_shapes=[[batch, 3, 32, 32]], canonicalize=False)
    ref = run_ort(m, {"x": x}, all_tensors=True)
    got = run(raw, {"x": x}, dump_all=True)
    shared = [k for k in got if k in ref]
    assert len(shared) == 10  # every ONNX node output
    for k in shared:
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-5, atol=1e-5 * float(np.abs(ref[k]).max()), err_msg=k)
