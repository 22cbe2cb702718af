"""ONNX LSTM and GRU, unrolled into TOP ops: every output against onnxruntime over the space the
converter claims (directions, one step or several, batch, biases, initial states constant or
computed, peepholes, GRU's linear_before_reset, any subset of the outputs), and one clear line
for what it refuses."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tftpu import frontend
from tftpu.errors import UnsupportedOpError
from tftpu.interp.top_interpreter import TopInterpreter

I, H = 5, 4


def recurrent(kind, t, b, direction="forward", bias=True, init=None, extra=0, outs=None, seed=0, **attrs):
    """A one-node model: `init` None / "const" / "input" for the initial states; `extra` is
    LSTM's peepholes (truthy) or GRU's linear_before_reset."""
    rng = np.random.default_rng(seed)
    d = 2 if direction == "bidirectional" else 1
    g = 4 if kind == "LSTM" else 3
    n_out = 3 if kind == "LSTM" else 2
    outs = range(n_out) if outs is None else outs
    arr = lambda *s: rng.normal(0, 0.5, s).astype(np.float32)     # noqa: E731
    inits = [numpy_helper.from_array(arr(d, g * H, I), "W"), numpy_helper.from_array(arr(d, g * H, H), "R")]
    ins = ["X", "W", "R", "B" if bias else "", "", "", ""]
    if bias:
        inits.append(numpy_helper.from_array(arr(d, 2 * g * H), "B"))
    graph_in = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [t, b, I])]
    states = ["h0"] + (["c0"] if kind == "LSTM" else [])
    for k, name in enumerate(states):
        if init == "const":
            inits.append(numpy_helper.from_array(arr(d, b, H), name))
        elif init == "input":
            graph_in.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [d, b, H]))
        if init:
            ins[5 + k] = name
    if kind == "LSTM" and extra:
        inits.append(numpy_helper.from_array(arr(d, 3 * H), "P"))
        ins.append("P")
    else:
        attrs = {**attrs, **({"linear_before_reset": int(extra)} if kind == "GRU" else {})}
    while ins[-1] == "":
        ins.pop()
    names = [f"y{k}" if k in outs else "" for k in range(n_out)]
    node = helper.make_node(kind, ins, names, name=f"my_{kind.lower()}", direction=direction, hidden_size=H, **attrs)
    shapes = {0: [t, d, b, H], 1: [d, b, H], 2: [d, b, H]}
    graph = helper.make_graph([node], "g", graph_in,
                              [helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, shapes[k]) for k in outs],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    feeds = {"X": rng.normal(0, 1, (t, b, I)).astype(np.float32)}
    if init == "input":
        feeds.update({name: arr(d, b, H) for name in states})
    return model, feeds


def check(model, feeds):
    import onnxruntime as ort
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    top = frontend.load(model)
    got = TopInterpreter(top).run(feeds)
    for w, out in zip(want, model.graph.output):
        assert got[out.name].shape == w.shape, out.name
        np.testing.assert_allclose(got[out.name], w, rtol=1e-5, atol=1e-5, err_msg=out.name)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_every_output_matches_onnxruntime(kind, direction):
    for (t, b), bias, init, extra in itertools.product([(1, 1), (3, 2)], [False, True], [None, "const", "input"],
                                                      [0, 1]):
        check(*recurrent(kind, t, b, direction, bias, init, extra, seed=t + 2 * bias + 4 * extra))


@pytest.mark.parametrize("kind,outs", [("LSTM", [0]), ("LSTM", [1, 2]), ("LSTM", [2]), ("GRU", [1])])
def test_any_subset_of_the_outputs(kind, outs):
    check(*recurrent(kind, 4, 1, "bidirectional", init="const", outs=outs))


def with_lens(model, lens: list[int]):
    """The model's node given a constant `sequence_lens`."""
    model.graph.initializer.append(numpy_helper.from_array(np.array(lens, np.int32), "lens"))
    node = model.graph.node[0]
    ins = list(node.input) + [""] * (5 - len(node.input))
    ins[4] = "lens"
    del node.input[:]
    node.input.extend(ins)
    return model


def test_sequence_lens_equal_to_the_sequence_is_the_plain_node():
    model, feeds = recurrent("LSTM", 3, 2)
    check(with_lens(model, [3, 3]), feeds)


@pytest.mark.parametrize("why,change", [
    ("clip", lambda n: n.attribute.append(helper.make_attribute("clip", 3.0))),
    ("activations", lambda n: n.attribute.append(helper.make_attribute("activations", ["Relu", "Tanh", "Tanh"]))),
    ("input_forget", lambda n: n.attribute.append(helper.make_attribute("input_forget", 1))),
    ("shorter than the sequence", "lens"),
])
def test_what_is_refused_is_one_line_naming_the_node(why, change):
    model, _ = recurrent("LSTM", 3, 2)
    node = model.graph.node[0]
    if change == "lens":
        with_lens(model, [3, 2])
    else:
        change(node)
    with pytest.raises(UnsupportedOpError) as e:
        frontend.load(model)
    assert "LSTM" in str(e.value) and "my_lstm" in str(e.value) and why in str(e.value)
    assert "\n" not in str(e.value)
