"""The compiled TOP backend must not emit a graph that crashes TF's oneDNN graph pass.

TF's MklLayoutRewritePass merges a `Pad` op into a Conv2D/_FusedConv2D it feeds
(MergePadWithConv2D) without checking that the Pad feeds the conv's *input* (slot 0). In a
BlazeFace-style residual block -- relu(conv1x1(dw(x)) + bias + pad_channels(skip)) -- grappler's
remapper first fuses Conv2D + BiasAdd + Add (+ Relu) into a _FusedConv2D whose Add operand is the
Pad; the oneDNN pass then "merges" that Pad as the conv's padded input, leaves an edge from the
deleted Pad node, and the process dies with SIGSEGV on the first run (mediapipe's face/palm/iris
models all did: `tftpu-evaluate` exited 139). The lowerings now pad with PadV2 (`values.pad`),
which the pass never merges. Each case runs in a subprocess, so a crash fails the test rather than
killing pytest, and its outputs are compared with the per-op interpreter's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np

_CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    from tftpu.interp.compiled import CompiledTop
    from tftpu.interp.top_interpreter import TopInterpreter
    from tftpu.ir import TopBuilder, attrs as A, top

    rng = np.random.default_rng(3)

    def rand(*shape):
        return rng.uniform(-1, 1, shape).astype(np.float32)

    def blazeface_blocks():
        # stride 1: relu(conv1x1(dw3x3(x)) + b + pad_channels(x)), 24 -> 28 channels;
        # stride 2: conv1x1(dw3x3/2(y)) + b + pad_channels(maxpool(y)), 28 -> 32, Add(skip, conv)
        b = TopBuilder("blazeface_blocks")
        x = b.input("x", (1, 24, 16, 16))
        dw = b.op("Conv", [x, b.weight("w0", rand(24, 1, 3, 3)), b.weight("b0", rand(24))],
                  dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=24), "dw0")
        pw = b.op("Conv", [dw, b.weight("w1", rand(28, 24, 1, 1)), b.weight("b1", rand(28))],
                  dict(kernel_shape=[1, 1]), "pw0")
        skip = b.op("Pad", [x], dict(paddings=[0, 0, 0, 0, 0, 4, 0, 0], mode="constant"), "pad0")
        y = b.op("Add", [pw, skip], dict(do_relu=True, relu_limit=-1.0), "add0")
        dw2 = b.op("Conv", [y, b.weight("w2", rand(28, 1, 3, 3)), b.weight("b2", rand(28))],
                   dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1], group=28), "dw1")
        pw2 = b.op("Conv", [dw2, b.weight("w3", rand(32, 28, 1, 1)), b.weight("b3", rand(32))],
                   dict(kernel_shape=[1, 1]), "pw1")
        mp = b.op("MaxPool", [y], dict(kernel_shape=[2, 2], strides=[2, 2]), "mp1")
        skip2 = b.op("Pad", [mp], dict(paddings=[0, 0, 0, 0, 0, 4, 0, 0], mode="constant"), "pad1")
        z = b.op("Add", [skip2, pw2], {}, "add1")
        return b.finish([y, z])

    src, out = sys.argv[1], sys.argv[2]
    if src == "synthetic":
        model = blazeface_blocks()
    else:
        from tftpu import frontend
        model = frontend.load(src)
    inputs = {op.loc: rng.uniform(0, 1, A.shape_of(op.output.type)).astype(np.float32)
              for op in model.ops if isinstance(op, top.Input)}
    ex = CompiledTop(model)
    types = sorted({o.type for o in ex._call.graph.get_operations()})
    got = ex.run(inputs)                    # the crash was here (graph instantiation)
    want = TopInterpreter(model).run(inputs)
    np.savez(out, types=np.array(types), fallbacks=np.array(ex.fallbacks, dtype=str),
             **{"got_" + k: v for k, v in got.items()},
             **{"want_" + k: np.asarray(v) for k, v in want.items()})
""")


def _run_child(src: str, tmp_path) -> dict:
    out = tmp_path / "out.npz"
    env = dict(os.environ)
    env.pop("TF_ENABLE_ONEDNN_OPTS", None)   # TF's default: oneDNN on, where the crash was
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", _CHILD, src, str(out)],
                          capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, (
        f"compiled run of {src} exited {proc.returncode}"
        f"{' (SIGSEGV)' if proc.returncode in (-11, 139) else ''}:\n{proc.stderr[-3000:]}")
    with np.load(out) as z:
        return {k: z[k] for k in z.files}


def _check(res: dict):
    types = set(res["types"].tolist())
    assert "Pad" not in types, sorted(types)     # what the oneDNN pass would merge
    assert res["fallbacks"].size == 0, res["fallbacks"]
    names = [k[len("want_"):] for k in res if k.startswith("want_")]
    assert names
    for n in names:
        w, g = res["want_" + n], res["got_" + n]
        assert g.shape == w.shape, (n, g.shape, w.shape)
        scale = max(1.0, float(np.abs(w).max()))
        np.testing.assert_allclose(g, w, rtol=0, atol=2e-5 * scale, err_msg=n)


def test_pad_as_residual_operand_of_fused_conv_runs_and_matches(tmp_path):
    """The smallest graph that crashed: channel-padded skips added to conv1x1 + bias (+ Relu)."""
    res = _run_child("synthetic", tmp_path)
    assert "PadV2" in set(res["types"].tolist())
    _check(res)


def test_face_detection_short_range_runs_and_matches(tmp_path):
    """The audited model (`tftpu-evaluate` on it exited 139)."""
    from tests import material

    _check(_run_child(str(material.get("face_detection_short_range.tflite")), tmp_path))
