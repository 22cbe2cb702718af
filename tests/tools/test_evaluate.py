"""tftpu.evaluate and tftpu-evaluate: cosine / SQNR against float per output and per concat part
over a streamed dataset (mean, 1st percentile, worst, worst images named), as JSON and HTML; the
interpreter, the simulator and an onnxruntime reference; bad input one line, exit 2."""

from __future__ import annotations

import gc
import json
import re
import subprocess
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest

import tftpu
from tests import material
from tests.tools.test_deploy import detector, samples_for
from tftpu import errors
from tftpu.interp.compiled import CompiledTop
from tftpu.interp.similarity import cosine_similarity, sqnr
from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.interp.tpu import TpuInterpreter
from tftpu.pipelines.deploy import output_parts, part_slices

TOOL = Path(sys.executable).with_name("tftpu-evaluate")


@pytest.fixture(scope="module")
def compiled():
    model = detector()
    return tftpu.compile(model, chip="npu1", calibration_data=samples_for(model), mixed_precision="none",
                         bias_correction=False)


def test_figures_per_output_and_part_over_every_image(compiled, tmp_path):
    val = samples_for(compiled.top_model, n=10, seed=3)
    made = []

    def stream():
        for s in val:
            x = s["x"].copy()
            made.append(weakref.ref(x))
            yield {"x": x}

    r = tftpu.evaluate(compiled, stream(), worst=3, json=tmp_path / "e.json", html=tmp_path / "e.html")
    gc.collect()
    assert sum(w() is not None for w in made) == 0            # no image kept
    assert [f.name for f in r.rows] == ["detections", "detections[boxes]", "detections[scores]"]
    assert r.images == [f"dataset[{i}]" for i in range(10)] and r.reference == "TOP" and r.mode == "INT8"
    (spec,) = output_parts(compiled.top_model)["detections"]
    # the reference runs as one TensorFlow graph, returning the concat beside the outputs
    top = CompiledTop(compiled.top_model, extra_outputs={spec[0]})
    tpu = TpuInterpreter(compiled.tpu_model)
    eager = TopInterpreter(compiled.top_model)
    for i, s in enumerate(val):                               # each figure is the image's own
        ref, got = top.run(s), tpu.run(s, dump_all=True, dequantize=True)
        np.testing.assert_allclose(ref["detections"], eager.run(s)["detections"], rtol=1e-5, atol=1e-6)
        a, b = ref["detections"], got["detections"]
        assert r.rows[0].cosine[i] == cosine_similarity(a, b) and r.rows[0].sqnr[i] == sqnr(a, b)
        (_, a), = part_slices(ref, spec)[1:]
        (_, b), = part_slices(got, spec)[1:]
        assert r.rows[2].sqnr[i] == sqnr(a, b) and r.rows[2].cosine[i] == cosine_similarity(a, b)
    data = json.loads((tmp_path / "e.json").read_text())
    assert data == r.summary() and data["images"] == 10
    boxes = data["outputs"][1]
    snr = np.asarray(r.rows[1].sqnr)
    assert boxes["sqnr_db"]["worst"] == round(float(snr.min()), 9)
    assert boxes["sqnr_db"]["mean"] == round(float(snr.mean()), 9)
    assert [w["image"] for w in boxes["worst_images"]] == [f"dataset[{i}]" for i in np.argsort(snr)[:3]]
    page = (tmp_path / "e.html").read_text()
    assert page.count("<svg") == 1 and "detections[scores]" in page and not re.search(r'(src|href)="https?:', page)
    sim = tftpu.evaluate(compiled, val, engine="simulator")   # bit-exact with the interpreter in INT8
    assert [f.sqnr for f in sim.rows] == [f.sqnr for f in r.rows] and sim.engine == "simulator"
    assert r.below(0.9, 10) == [] and r.below(1.0, 200)[0].startswith("detections (p1 cosine")


def test_the_reference_runs_op_by_op_where_its_graph_fails(compiled, monkeypatch):
    from tftpu.interp import compiled as graph

    val = samples_for(compiled.top_model, n=3, seed=5)
    whole = tftpu.evaluate(compiled, val)

    def broken(*args, **kwargs):
        raise RuntimeError("no graph today")

    monkeypatch.setattr(graph, "CompiledTop", broken)
    stepwise = tftpu.evaluate(compiled, val)
    assert [r.name for r in stepwise.rows] == [r.name for r in whole.rows]
    for a, b in zip(whole.rows, stepwise.rows):
        np.testing.assert_allclose(a.sqnr, b.sqnr, atol=1e-3)


def test_an_onnx_reference_and_bad_input(tmp_path):
    from onnx import helper

    from tests.frontend.onnx_graphs import model, rand
    proto = model([helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
                   helper.make_node("Sigmoid", ["c"], ["s"]),
                   helper.make_node("Mul", ["x", "k"], ["b"]),
                   helper.make_node("Concat", ["b", "s"], ["y"], axis=1)],
                  [("x", [1, 3, 8, 8])], [("y", [1, 5, 8, 8])], {"w": rand(2, 3, 1, 1, seed=1), "k": np.float32(40)})
    compiled = tftpu.compile(proto, chip="npu1", calibration_data=[rand(1, 3, 8, 8, seed=i) for i in range(4)],
                             mixed_precision="none", bias_correction=False)
    val = [rand(1, 3, 8, 8, seed=10 + i) for i in range(5)]
    by_ort = tftpu.evaluate(compiled.tpu_model, val, reference=proto)
    by_top = tftpu.evaluate(compiled, val)
    assert by_ort.reference == "onnxruntime" and [f.name for f in by_ort.rows] == ["y", "y[b]", "y[s]"]
    for a, b in zip(by_ort.rows, by_top.rows):
        np.testing.assert_allclose(a.sqnr, b.sqnr, atol=0.01)
    with pytest.raises(errors.UsageError, match="reference"):
        tftpu.evaluate(compiled.tpu_model, val)
    with pytest.raises(errors.UsageError, match="engine"):
        tftpu.evaluate(compiled, val, engine="gpu")
    with pytest.raises(errors.ModelFileError, match="gone.png"):
        tftpu.evaluate(compiled, [val[0], str(tmp_path / "gone.png")], json=tmp_path / "never.json")
    assert not (tmp_path / "never.json").exists()
    with pytest.raises(errors.ShapeError, match=r"dataset\[0\]"):
        tftpu.evaluate(compiled, [np.zeros((1, 3, 4, 4), np.float32)])
    with pytest.raises(errors.InputError, match=r"dataset\[1\]: input 'x' has non-finite values"):
        tftpu.evaluate(compiled, [val[0], np.full((1, 3, 8, 8), np.nan, np.float32)], json=tmp_path / "never.json")
    assert not (tmp_path / "never.json").exists()


def test_tool_on_real_photos(compiled, tmp_path):
    import tensorflow as tf
    for i, name in enumerate(material.COLOUR_PHOTOS[:5]):
        (tmp_path / f"{i}.png").write_bytes(tf.io.encode_png(material.image(name, (32, 24))).numpy())
    (tmp_path / "9.png").write_bytes(b"not a png")
    tpu_mlir, _ = compiled.tpu_model.save(tmp_path / "d.tpu.mlir")
    top_mlir, _ = compiled.top_model.save(tmp_path / "d.top.mlir")
    program = compiled.save(tmp_path / "d.tpumodel")
    base = [f"--reference={top_mlir}", f"--dataset={tmp_path}/*.png", "--mean=127.5", "--scale=0.0078125",
            "--noprogress"]

    def run(*args):
        return subprocess.run([str(TOOL), *base, *args], capture_output=True, text=True, timeout=300)

    r = run(f"--model={tpu_mlir}", "--skip_unreadable", f"--json={tmp_path / 'a.json'}",
            f"--html={tmp_path / 'a.html'}", "--tolerance=0.9,5")
    assert r.returncode == 0, r.stderr
    assert "on 5 images" in r.stdout and "1 unreadable skipped" in r.stdout and "9.png" in r.stderr
    a = json.loads((tmp_path / "a.json").read_text())
    assert a["skipped"] == [str(tmp_path / "9.png")] and a["outputs"][0]["worst_images"][0]["image"].endswith(".png")
    r = run(f"--model={program}", "--skip_unreadable", f"--json={tmp_path / 'b.json'}", "--tolerance=1,200")
    assert r.returncode == 1 and "under the tolerance" in r.stdout
    b = json.loads((tmp_path / "b.json").read_text())
    assert b["engine"] == "simulator" and b["outputs"] == a["outputs"]
    r = run(f"--model={tpu_mlir}", "--tolerance=0.9")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "tolerance" in r.stderr
