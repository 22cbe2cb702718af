"""tftpu.graph: GraphDef editing, pass manager, capture + re-import on the original variables,
nested-function inlining, and `tftpu.optimize` called in eager and graph mode."""

import numpy as np
import pytest
import tensorflow as tf

import tftpu
from tftpu.errors import UsageError
from tftpu.graph.capture import capture
from tftpu.graph.pass_manager import GraphContext, Pass, PassManager, PassResult
from tftpu.graph.surgery import GraphEditor, canonical, parse, ref


@pytest.mark.parametrize("text,expected", [("a", ("a", 0)), ("a:0", ("a", 0)), ("a/b:3", ("a/b", 3)),
                                           ("^a", ("a", -1)), ("a:b", ("a:b", 0))])
def test_tensor_names(text, expected):
    assert parse(text) == expected
    if expected[1] >= 0:
        assert canonical(text) == ref(*expected)


def _small_graph():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2, 3], name="x")
        y = tf.identity(x * 2.0, name="y")
        tf.identity(y + 1.0, name="z")
        tf.identity(y, name="w")
    return g.as_graph_def(add_shapes=True)


def test_editor_splice_rewire_and_remove_dead():
    ed = GraphEditor(_small_graph())
    assert ed.output_shape("y") == [2, 3] and ed.output_dtype("y") == tf.float32
    assert sorted(n.name for n, _ in ed.consumers("y:0")) == ["add", "w"]
    [neg] = ed.splice(lambda t: tf.negative(t) * 3.0, ["y"], prefix="y/neg", device="/device:CPU:0")
    assert ed.node(parse(neg)[0]).device == "/device:CPU:0"
    assert ed.replace_uses("y", neg, exclude={"y/neg/Neg"}) == 2
    assert ed.consumers("y") == [(ed.node("y/neg/Neg"), 0)]
    ed.set_input(ed.node("w"), 0, "x")
    assert sorted(n.name for n, _ in ed.consumers("x")) == ["mul", "w"]
    # nothing consumes "z" -> removable; "mul" still feeds y
    assert ed.remove_dead(["z", "mul"]) == ["z"]
    with tf.Graph().as_default():
        x = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
        add, w = tf.graph_util.import_graph_def(ed.graph_def, {"x:0": x}, ["add:0", "w:0"])
        with tf.compat.v1.Session() as sess:
            a, b = sess.run([add, w])
    np.testing.assert_allclose(a, -6 * np.arange(6).reshape(2, 3) + 1)
    np.testing.assert_allclose(b, np.arange(6).reshape(2, 3))


class _Recorder(Pass):
    def __init__(self, name, log):
        self.name = name
        self.log = log

    def apply(self, ctx):
        self.log.append(self.name)
        result = PassResult(self.name)
        result.decline("graph", f"{self.name} looked", nodes=len(ctx.editor.nodes))
        return result


def test_pass_manager_order_disable_and_report():
    log = []
    ctx = GraphContext(GraphEditor(_small_graph()), ["x:0"], None)
    report = PassManager([_Recorder("a", log), _Recorder("b", log), _Recorder("c", log)],
                         disable=["b"]).run(ctx)
    assert log == ["a", "c"]
    assert [p.name for p in report.passes] == ["a", "b", "c"] and report["b"].disabled
    text = str(report)
    assert "b: disabled" in text and "graph: declined: a looked [nodes=" in text
    assert report.to_dict()["passes"][0]["decisions"][0]["reason"] == "a looked"
    with pytest.raises(UsageError, match="unknown pass.*nope"):
        PassManager([_Recorder("a", log)], disable=["nope"])


def _train_setup(seed=0):
    rng = np.random.default_rng(seed)
    w = tf.Variable(rng.standard_normal((3, 3, 2, 4)).astype(np.float32) * 0.3)
    v = tf.Variable(rng.standard_normal((4, 1)).astype(np.float32))
    ds = tf.data.Dataset.from_tensor_slices(
        (rng.standard_normal((12, 10, 10, 2)).astype(np.float32),
         rng.standard_normal((12, 1)).astype(np.float32))).batch(3).repeat()
    return w, v, ds


def _step_fn(w, v, lr=0.05):
    @tf.function
    def step(it, scale=1.0):
        x, y = next(it)
        with tf.GradientTape() as tape:
            h = tf.nn.relu(tf.nn.conv2d(x, w, 2, "SAME"))
            pred = tf.matmul(tf.reduce_mean(h, [1, 2]), v)
            loss = tf.reduce_mean((pred - y) ** 2) * scale
        gw, gv = tape.gradient(loss, [w, v])
        w.assign_sub(lr * gw)
        v.assign_sub(lr * gv)
        return {"loss": loss, "extra": (pred, None)}

    return step


@pytest.mark.parametrize("disable", [(), ("space_to_depth",)])
def test_optimized_step_trains_original_variables(disable):
    w0, v0, ds = _train_setup()
    w1, v1, _ = _train_setup()
    ref_step, step = _step_fn(w0, v0), _step_fn(w1, v1)
    it0, it1 = iter(ds), iter(ds)
    fast = tftpu.optimize(step, it1, target="tpu", disable=disable)
    assert fast.report.applied("space_to_depth") == (not disable)
    for _ in range(6):
        a = ref_step(it0)
        b = fast(it1)
        assert b["extra"][1] is None
        np.testing.assert_allclose(b["loss"], a["loss"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w1.numpy(), w0.numpy(), rtol=1e-5, atol=1e-6)
    assert w1.shape == (3, 3, 2, 4)


def test_optimized_called_inside_tf_function():
    w0, v0, ds = _train_setup()
    it = iter(ds)
    fast = tftpu.optimize(_step_fn(w0, v0), it, scale=2.0)

    @tf.function
    def two_steps():
        return fast(it, scale=2.0)["loss"] + fast(it, scale=2.0)["loss"]

    before = w0.numpy().copy()
    total = two_steps()
    assert np.isfinite(total.numpy()) and not np.allclose(before, w0.numpy())


def test_nested_function_inlined():
    w = tf.Variable(np.random.default_rng(4).standard_normal((5, 5, 3, 6)).astype(np.float32))

    @tf.function
    def stem(x):
        return tf.nn.conv2d(x * 0.5, w, 2, "SAME")

    @tf.function
    def outer(x):
        with tf.GradientTape() as tape:
            y = stem(x)
            loss = tf.reduce_sum(y * y)
        return y, tape.gradient(loss, w)

    x = tf.constant(np.random.default_rng(5).standard_normal((2, 13, 13, 3)).astype(np.float32))
    cap = capture(outer, x)
    assert not any(n.op.endswith("PartitionedCall") for n in cap.graph_def.node)
    ref_y, ref_g = outer(x)
    fast = tftpu.optimize(outer, x)
    assert fast.report.applied("space_to_depth"), str(fast.report)
    y, g = fast(x)
    np.testing.assert_allclose(y, ref_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g, ref_g, rtol=1e-5, atol=1e-3)


def test_optimize_rejects_plain_callables():
    with pytest.raises(UsageError, match="tf.function or a ConcreteFunction"):
        tftpu.optimize(lambda x: x, 1.0)


def test_gradient_tape_through_optimized_call():
    w = tf.Variable(np.random.default_rng(6).standard_normal((4, 4, 3, 5)).astype(np.float32))

    @tf.function
    def f(x):
        return tf.nn.conv2d(x, w, 2, "SAME")

    x = tf.constant(np.random.default_rng(7).standard_normal((2, 12, 12, 3)).astype(np.float32))
    fast = tftpu.optimize(f, x)
    assert fast.report.applied("space_to_depth")
    grads = []
    for fn in (f, fast):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(fn(x) ** 2)
        grads.append(tape.gradient(loss, w))
    assert grads[1] is not None
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-5, atol=1e-4)


def test_rewrite_is_deterministic():
    w = tf.Variable(np.ones((7, 7, 3, 4), np.float32))

    @tf.function
    def f(x):
        return tf.nn.conv2d(x * 2.0 - 1.0, w, 2, "SAME")

    x = tf.zeros((1, 17, 17, 3))
    a = tftpu.optimize(f, x).graph_def.SerializeToString(deterministic=True)
    b = tftpu.optimize(f, x).graph_def.SerializeToString(deterministic=True)
    assert a == b
