"""The whole compile path as users call it: `tftpu.compile` on Keras / ONNX / TOP sources,
`tftpu-deploy --model --trace --report`, `tftpu-run` on a `.tpumodel`, the host-side S2D
(the model file takes the original image and equals the unrewritten model), the report's JSON
contract, the Chrome trace, and the model file refused when damaged or not one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tftpu
from tests.tools.test_deploy import cnn, samples_for
from tftpu import errors, quant
from tftpu.utils import config
from tftpu.backend import tpumodel
from tftpu.backend.simulator import Simulator
from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.interp.tpu import TpuInterpreter
from tftpu.pipelines.deploy import deploy


@pytest.fixture(scope="module")
def case():
    model = cnn()
    samples = samples_for(model)
    return model, quant.calibrate(model, samples, "mse"), samples


def _tool(name: str, *args):
    script = Path(sys.executable).parent / f"tftpu-{name}"
    return subprocess.run([str(script), *map(str, args)], capture_output=True, text=True, timeout=300)


def test_compile_a_top_model_every_stage_checked(case, tmp_path):
    model, _, samples = case
    compiled = tftpu.compile(model, chip="npu1", calibration_data=samples)
    names = [s.name for s in compiled.stages]
    # the weights refit to their INT8 inputs, or bias correction where that does better
    assert names in (["import", "calibrate", step, "space-to-depth", "input grid", "reader ranges", "lower",
                      "codegen", "simulate"] for step in ("weight refit", "bias correction")), names
    assert compiled.passed and "bit-exact" in compiled.stages[-1].check
    out = compiled.run(samples[0])
    want = TpuInterpreter(compiled.tpu_model).run(samples[0], dequantize=True)
    assert all(np.array_equal(out[k], want[k]) for k in want)
    path = compiled.save(tmp_path / "cnn.tpumodel")
    again = tpumodel.load(path)
    got = Simulator(again).run(samples[0], dequantize=True)
    assert all(np.array_equal(got[k], out[k]) for k in out)
    report = compiled.report
    for key in ("latency_us", "flops", "utilisation", "ops", "s2d", "memory", "layer_groups", "stages"):
        assert key in report, key
    assert report["s2d"]["applied"] and report["latency_us_without_s2d"] > report["latency_us"]
    assert all({"name", "type", "cycles"} <= set(o) for o in report["ops"])
    json.dumps(report)                                  # plain data
    # the same compile gives the same bytes
    second = tftpu.compile(model, chip="npu1", calibration_data=samples).save(tmp_path / "again.tpumodel")
    assert second.read_bytes() == path.read_bytes()


def test_compile_keras_on_the_edge_chip_in_f16():
    import keras

    inp = keras.Input((12, 12, 3))
    x = keras.layers.Conv2D(8, 3, strides=2, padding="same", activation="relu")(inp)
    x = keras.layers.DepthwiseConv2D(3, padding="same")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inp, keras.layers.Dense(4)(x))
    x0 = np.random.default_rng(0).uniform(-1, 1, (1, 12, 12, 3)).astype(np.float32)
    compiled = tftpu.compile(model, chip="edge16", quantize="F16", test_input=x0)
    assert compiled.passed, str(compiled)
    assert "onnxruntime" in compiled.stages[0].check
    out = compiled.run(x0)[compiled.output_names[0]]
    np.testing.assert_allclose(out, model(x0).numpy(), rtol=0.05, atol=0.05)


def test_tables_are_tried_in_order_until_one_meets_the_target():
    """try_tables builds the next table only where the one before misses the target, and keeps
    the best built (the first on a tie), judged pooled and on the test input alone."""
    from types import SimpleNamespace

    from tftpu.pipelines.calibration_choice import try_tables

    def builder(figures):
        built = []

        def build(method, table):
            built.append(method)
            return (method, SimpleNamespace(search=SimpleNamespace(lowered=figures[method])))
        return build, built

    build, built = builder({"a": (25.0, 21.0), "b": (30.0, 30.0)})
    tried = try_tables({"a": 1, "b": 2}, build, 20.0)
    assert built == ["a"] and tried.method == "a" and tried.built[0] == "a"
    build, built = builder({"a": (25.0, 17.0), "b": (19.0, 18.0), "c": (16.0, 16.0)})
    lines = []
    tried = try_tables({"a": 1, "b": 2, "c": 3}, build, 20.0, lines.append)
    assert built == ["a", "b", "c"] and tried.method == "b" and tried.built[0] == "b"
    assert "below the 20 dB target: built again with b" in lines[0] and len(lines) == 2
    assert tried.as_dict()["judged_db"] == {"a": [25.0, 17.0], "b": [19.0, 18.0], "c": [16.0, 16.0]}
    build, built = builder({"a": (18.0, 18.0), "b": (18.0, 18.0)})
    assert try_tables({"a": 1, "b": 2}, build, 20.0).method == "a"        # a tie keeps the first
    # a pure-INT8 build (no search) is judged by its verified output and part rows (`DeployResult.rows`), NaN left out
    row = lambda db: SimpleNamespace(sqnr=db)  # noqa: E731
    pure = {"a": SimpleNamespace(search=None, rows=[row(25.0), row(float("nan")), row(19.0)]),
            "b": SimpleNamespace(search=None, rows=[row(21.0)])}
    tried = try_tables({"a": 1, "b": 2}, lambda m, t: (m, pure[m]), 20.0)
    assert tried.method == "b" and tried.figures == {"a": (19.0, 19.0), "b": (21.0, 21.0)}


def test_a_later_table_takes_the_first_builds_choices_and_searches_again_only_near_the_best():
    """With `like`, a later table's program is built with the first build's choices; in full
    (searched again) only where that misses the target and comes within FULL_MARGIN dB under the
    best so far, the better of the two kept for that table."""
    from types import SimpleNamespace as ns

    from tftpu.pipelines.calibration_choice import FULL_MARGIN, try_tables

    def run(full, carried):
        built = []

        def build(m, t):
            built.append(m)
            return (m, ns(search=ns(lowered=full[m])))

        def like(m, t, first, was):
            assert first[0] == "a" and was == "a"
            built.append(m + "~")
            return (m + "~", ns(search=ns(lowered=carried[m])))
        return try_tables({"a": 1, "b": 2}, build, 20.0, like=like), built

    assert FULL_MARGIN > 1
    tried, built = run({"a": (19.0, 19.0), "b": (22.0, 21.0)}, {"b": (19.0, 18.5)})       # near: in full
    assert built == ["a", "b~", "b"] and tried.method == "b" and tried.built[0] == "b"
    assert tried.carried == {"b": (19.0, 18.5)} and "searched again" in tried.line
    tried, built = run({"a": (19.0, 19.0), "b": (22.0, 22.0)}, {"b": (19.0 - FULL_MARGIN - 0.1,) * 2})   # far under
    assert built == ["a", "b~"] and tried.method == "a"
    tried, built = run({"a": (17.0, 17.0), "b": (22.0, 22.0)}, {"b": (18.0, 19.0)})       # above the best
    assert built == ["a", "b~"] and tried.method == "b" and tried.built[0] == "b~"
    assert "with a's float ops, links and correction" in tried.line
    tried, built = run({"a": (19.0, 19.0), "b": (17.0, 17.0)}, {"b": (18.0, 18.0)})       # in full, worse
    assert built == ["a", "b~", "b"] and tried.method == "a" and tried.figures["b"] == (18.0, 18.0)
    tried, built = run({"a": (19.0, 19.0), "b": (17.0, 17.0)}, {"b": (20.0, 21.0)})       # meets the target
    assert built == ["a", "b~"] and tried.method == "b"


def test_a_first_build_whose_search_misses_gives_way_to_a_table_all_int8_meets():
    """With `probe`, the first build may give up (GaveUp) once its search misses: the later
    tables' all-INT8 programs are judged in order, the first that meets the target is built first
    and kept where it meets; where none meets, the first build goes on as it was."""
    from types import SimpleNamespace as ns

    from tftpu.pipelines.calibration_choice import GaveUp, Reach, try_tables

    def run(final, int8, search_misses=True, rounded=None):
        built, probed = [], []

        def build(m, t, give_up=None, rounded=None):
            built.append(m if rounded is None else f"{m} {rounded}")
            if give_up is not None and search_misses and give_up():
                raise GaveUp(18.5)
            return (m, ns(search=ns(lowered=final[m])))

        def probe(m, t):
            probed.append(m)
            return Reach(int8[m], *(rounded or {}).get(m, ()))
        lines = []
        return try_tables({"a": 1, "b": 2, "c": 3}, build, 20.0, lines.append, probe=probe), built, probed, lines

    final = {"a": (19.0, 19.0), "b": (19.5, 19.5), "c": (23.0, 22.0)}
    tried, built, probed, lines = run(final, {"b": (19.0, 21.0), "c": (21.0, 20.5)})
    assert probed == ["b", "c"] and built == ["a", "c"] and tried.method == "c" and tried.built[0] == "c"
    assert tried.gave_up[0] == "a" and tried.gave_up[1] == 18.5 and tried.gave_up[2] >= 0
    assert tried.all_int8 == {"b": (19.0, 21.0), "c": (21.0, 20.5)} and list(tried.figures) == ["c"]
    assert "a's build given up, c's built first" in tried.line and "built with c first" in lines[0]
    assert tried.as_dict()["gave_up"]["method"] == "a" and tried.others_seconds >= tried.gave_up[2]
    # none meets all in INT8: the first build goes on (each table probed once), then the next tables
    tried, built, probed, _ = run(final, {"b": (19.0, 21.0), "c": (18.0, 25.0)})
    assert probed == ["b", "c"] and built == ["a", "b", "c"] and tried.gave_up is None and tried.method == "c"
    # a search that meets asks nothing
    tried, built, probed, _ = run({**final, "a": (21.0, 21.0)}, {}, search_misses=False)
    assert probed == [] and built == ["a"] and tried.method == "a" and tried.all_int8 == {}
    # the table given way to misses in the end: the given-up one is built after it, the best kept
    tried, built, probed, _ = run({"a": (19.0, 19.0), "b": (18.0, 18.0), "c": (18.0, 18.0)}, {"b": (20.0, 20.0)})
    assert built == ["a", "b", "a", "c"] and tried.method == "a" and list(tried.figures) == ["b", "a", "c"]
    # a table whose all INT8 meets the target only with its rounding: built first with that rounding
    tried, built, probed, lines = run(final, {"b": (19.0, 21.0), "c": (19.5, 19.0)},
                                      rounded={"b": ((19.5, 19.9), "wb"), "c": ((20.5, 20.1), "wc")})
    assert probed == ["b", "c"] and built == ["a", "c wc"] and tried.method == "c"
    assert tried.rounded == {"b": (19.5, 19.9), "c": (20.5, 20.1)} and tried.all_int8["c"] == (19.5, 19.0)
    assert "c 19.0 dB (20.1 dB with 16-bit dense conv inputs and GPTQ-rounded weights)" in tried.line
    assert "20.1 dB with 16-bit dense conv inputs" in lines[0]
    assert tried.as_dict()["all_int8_rounded_db"]["c"] == [20.5, 20.1]
    # where the plain program meets, it is built as it is (no rounding given)
    tried, built, *_ = run(final, {"b": (19.0, 21.0), "c": (20.5, 20.5)}, rounded={"c": ((22.0, 22.0), "wc")})
    assert built == ["a", "c"] and tried.method == "c"


def test_a_deploy_judges_its_all_int8_start_and_gives_up_when_asked(case):
    """`all_int8_reach` judges the all-INT8 program a build starts its search from (the same
    figures as that program built with mixed_precision="none" and no correction); a build whose
    search misses the target raises GaveUp where its `_give_up` says so, and goes on where not."""
    from tftpu.pipelines.calibration_choice import GaveUp
    from tftpu.pipelines.deploy import all_int8_reach, deploy

    model, _, samples = case
    table = quant.calibrate(model, samples, "mse", asymmetric=True)
    kw = dict(quantize="INT8", chip="npu1", calibration_table=table, asymmetric="auto", test_input=samples[0],
              samples=samples[1:9], bias_correction=False, weight_rounding=False, weight_refit=False, wide_links=False)
    reach = all_int8_reach(model, mixed_precision="0.99,99", **kw)
    pure = deploy(model, mixed_precision="none", **kw)
    assert len(reach.plain) == 2 and reach.plain == tuple(pure.judged) and reach.rounded is None
    asked = []
    with pytest.raises(GaveUp) as stop:
        deploy(model, mixed_precision="0.99,99", _give_up=lambda: asked.append(1) or True, **kw)
    assert asked == [1] and stop.value.args[0] < 99
    done = deploy(model, mixed_precision="0.99,99", _give_up=lambda: asked.append(2) or False, **kw)
    assert asked == [1, 2] and done.search is not None and not done.search.met
    met = deploy(model, mixed_precision=f"0.5,{min(reach.plain) - 1:.2f}", _give_up=lambda: asked.append(3) or True,
                 **kw)
    assert asked == [1, 2] and met.search.met                 # (a search that meets asks nothing)
    assert all_int8_reach(model, quantize="F16", chip="npu1", test_input=samples[0]) is None


def test_a_rounded_probe_judges_gptq_weights_near_the_target_and_its_build_takes_them(case, monkeypatch):
    """`all_int8_reach(..., rounded=True)` judges the all-INT8 program once more with the dense
    convs' 16-bit inputs and GPTQ-rounded weights only where the plain one misses the target by at
    most ROUNDED_PROBE_MARGIN dB (and the build may change its weights); a build given that
    rounding (`rounded_args`) takes it as it is, its search starting from that very program."""
    from tftpu.pipelines import deploy as deploy_module
    from tftpu.pipelines.deploy import ROUNDED_PROBE_MARGIN, all_int8_reach, deploy, rounded_args
    from tftpu.quant import weight_rounding

    model, _, samples = case
    table = quant.calibrate(model, samples, "mse", asymmetric=True)
    kw = dict(quantize="INT8", chip="npu1", calibration_table=table, asymmetric="auto", test_input=samples[0],
              samples=samples[1:9], bias_correction=False, weight_rounding=True, weight_refit=False)
    plain = all_int8_reach(model, mixed_precision="0.99,99", rounded=True, **kw)
    assert plain.rounded is None and plain.weights is None                         # far under the target
    near = min(plain.plain) + ROUNDED_PROBE_MARGIN / 2
    reach = all_int8_reach(model, mixed_precision=f"0.5,{near:.3f}", rounded=True, **kw)
    assert reach.plain == plain.plain and reach.rounded is not None and len(reach.rounded) == 2
    rounded, report = reach.weights
    assert report.ops and rounded is not model
    # met by the plain program, asked without rounding, or the build keeps its weights: none
    assert all_int8_reach(model, mixed_precision=f"0.5,{min(plain.plain) - 1:.3f}", rounded=True, **kw).rounded is None
    assert all_int8_reach(model, mixed_precision=f"0.5,{near:.3f}", **kw).rounded is None
    assert all_int8_reach(model, mixed_precision=f"0.5,{near:.3f}", rounded=True,
                          **{**kw, "weight_rounding": False}).rounded is None
    # the build given that rounding computes none of its own and starts from the probe's program
    monkeypatch.setattr(weight_rounding, "reconstruct_rounding", lambda *a, **k: pytest.fail("rounded again"))
    target = min(reach.rounded) - 0.01
    done = deploy(model, mixed_precision=f"0.5,{target:.3f}", **{**kw, **rounded_args(reach.weights)})
    assert done.search.met and not done.search.kept and done.weight_rounding is not None
    assert min(done.judged) >= target and deploy_module.ROUNDED_PROBE_MARGIN == ROUNDED_PROBE_MARGIN


def test_deploy_with_alternates_builds_the_table_whose_rounded_all_int8_meets_with_that_rounding(case, monkeypatch):
    """tftpu-deploy's path (a table with alternates): where a later table's all-INT8 program
    meets the target only with GPTQ's rounding, the first build gives up and the later table is
    built first with that very rounding (no refit, no rounding of its own)."""
    from tftpu.pipelines import deploy as deploy_module
    from tftpu.pipelines.calibration_choice import Reach

    model, _, samples = case
    kw = dict(quantize="INT8", chip="npu1", asymmetric="auto", test_input=samples[0], samples=samples[1:9],
              weight_refit=True, bias_correction=True, mixed_precision="0.99,99")
    one = quant.calibrate(model, samples, "mse", asymmetric=True)
    plain = deploy_module.all_int8_reach(model, calibration_table=one, rounded=True,
                                         **{**kw, "mixed_precision": "0.5,99"}).plain
    near = deploy_module.all_int8_reach(model, calibration_table=one, rounded=True,
                                        **{**kw, "mixed_precision": f"0.5,{min(plain) + 1:.3f}"}).weights
    assert near is not None                      # (a real rounding, which the build is then given)
    probed, calls = [], []
    monkeypatch.setattr(deploy_module, "all_int8_reach",
                        lambda *a, **k: probed.append(k["rounded"]) or Reach((10.0, 10.0), (99.5, 99.5), near))
    real = deploy_module.deploy

    def recording(*a, **k):
        calls.append(k)
        return real(*a, **k)
    monkeypatch.setattr(deploy_module, "deploy", recording)
    table = quant.calibrate(model, samples, "mse,tail_mse", asymmetric=True)
    done = real(model, calibration_table=table, **kw)
    tried = done.calibration
    assert probed == [True] and tried.gave_up is not None and tried.gave_up[0] == "mse"
    assert list(tried.figures)[0] == "tail_mse" and tried.rounded == {"tail_mse": (99.5, 99.5)}
    given = [c for c in calls if c.get("_rounded") is not None]
    assert len(given) == 1 and given[0]["_rounded"] is near and given[0]["weight_refit"] is False
    assert given[0]["calibration_table"].method == "tail_mse" and given[0]["weight_rounding"] is True


def test_calibration_methods_are_judged_by_the_program_they_make(case):
    """Given mse,minmax with a target neither reaches, compile builds the program with each table
    and keeps the one whose worst output comes nearer float (what deploy itself reports for that
    table); a single method is taken as it is, and the default tries tail_mse after mse."""
    from tftpu.pipelines.calibration_choice import CALIBRATION_DEFAULT
    from tftpu.pipelines.deploy import choices_of, deploy

    model, _, samples = case
    flags = dict(space_to_depth=False, weight_refit=False, weight_rounding=False, bias_correction=False,
                 equalize=False, wide_links=False)
    compiled = tftpu.compile(model, chip="npu1", calibration_data=samples, calibration_method="mse, minmax",
                             mixed_precision="0.99,99", **flags)
    chose = compiled.report["calibration"]
    judged = {m: min(f) for m, f in chose["judged_db"].items()}
    assert set(judged) == {"mse", "minmax"} and chose["target_db"] == 99
    assert chose["method"] == ("minmax" if judged["minmax"] > judged["mse"] else "mse")
    assert compiled.stages[2].name == "calibration choice" and f"{chose['method']} kept" in compiled.stages[2].check
    tables = quant.calibrate_each(model, samples, ["mse", "minmax"], asymmetric=True)
    fixed = dict(quantize="INT8", chip="npu1", asymmetric="auto", test_input=samples[0], samples=samples[1:9])
    corrections = dict(bias_correction=False, weight_rounding=False, weight_refit=False)
    first = deploy(model, calibration_table=tables["mse"], mixed_precision="0.99,99", wide_links=False,
                   **corrections, **fixed)
    assert [round(v, 3) for v in first.search.lowered] == chose["judged_db"]["mse"]
    # minmax: built with mse's float ops first, searched again only near the best (the better kept)
    like = deploy(model, calibration_table=tables["minmax"], **{**corrections, **choices_of(first)}, **fixed)
    assert [round(v, 3) for v in like.judged] == chose["with_first_choices_db"]["minmax"]
    full = deploy(model, calibration_table=tables["minmax"], mixed_precision="0.99,99", wide_links=False,
                  **corrections, **fixed)
    assert chose["judged_db"]["minmax"] in ([round(v, 3) for v in like.judged], [round(v, 3) for v in full.search.lowered])
    single = tftpu.compile(model, chip="npu1", calibration_data=samples, calibration_method="mse",
                           mixed_precision="none", **flags)
    assert CALIBRATION_DEFAULT == "mse,tail_mse"
    assert "calibration" not in single.report and single.stages[1].check.startswith("mse over")
    for bad in ("entropy", "mse,", "", 3):
        with pytest.raises(errors.UsageError, match="calibration_method"):
            tftpu.compile(model, chip="npu1", calibration_data=samples, calibration_method=bad)


def test_compile_without_calibration_data_warns(case):
    model, _, _ = case
    compiled = tftpu.compile(model, chip="npu1", space_to_depth=False)
    assert "synthetic" in compiled.report["warning"]
    assert [s.name for s in compiled.stages][:2] == ["import", "calibrate"]


def test_bad_calibration_data_is_one_clear_error(case):
    model, _, _ = case
    with pytest.raises(errors.ShapeError, match="calibration_data"):
        tftpu.compile(model, chip="npu1", calibration_data=[np.zeros((1, 3, 8, 8), np.float32)])
    with pytest.raises(errors.UsageError, match="calibration_data"):
        tftpu.compile(model, chip="npu1", calibration_data=42)


def test_host_space_to_depth_takes_the_original_image(case):
    """With S2D the host makes the rearranged input: the model file's input is the image and its
    outputs equal TPU inference of the rewritten module bit for bit, and the unrewritten TOP
    model within INT8's error."""
    model, table, samples = case
    res = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0],
                 space_to_depth=True, mixed_precision="none")
    prog = res.program
    assert res.s2d["applied"] and res.simulator["passed"]
    (desc,) = prog.inputs
    assert desc["shape"] == [1, 3, 16, 16] and desc["preprocess"]["space_to_depth"] == 2
    assert prog.host and all(prog.commands[i]["engine"] == "host" for i, c in enumerate(prog.commands)
                             if c["kind"] == "host")
    sim = Simulator(prog).run(samples[1], dequantize=True)
    ref = TopInterpreter(model).run(samples[1])
    for k in ref:
        cos = float(np.dot(sim[k].ravel(), ref[k].ravel()) / np.linalg.norm(sim[k]) / np.linalg.norm(ref[k]))
        assert cos > 0.99


def test_deploy_tool_writes_model_trace_and_report(case, tmp_path):
    model, table, samples = case
    top_path, _ = model.save(tmp_path / "cnn.top.mlir")
    table.save(tmp_path / "cali")
    np.savez(tmp_path / "in.npz", **samples[0])
    done = _tool("deploy", f"--mlir={top_path}", "--quantize=INT8", "--chip=edge16",
                 f"--calibration_table={tmp_path / 'cali'}", f"--test_input={tmp_path / 'in.npz'}",
                 f"--model={tmp_path / 'cnn.tpumodel'}", f"--trace={tmp_path / 'trace.json'}",
                 f"--report={tmp_path / 'r.json'}", "--space_to_depth")
    assert done.returncode == 0, done.stderr
    assert "simulator against TPU inference: bit-exact" in done.stdout and "layer groups on edge16" in done.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert isinstance(report["latency_us"], float) and isinstance(report["flops"], int)
    assert 0 <= report["utilisation"] <= 1 and report["s2d"]["applied"] in (True, False)
    assert all(isinstance(o["cycles"], int) for o in report["ops"])
    trace = json.loads((tmp_path / "trace.json").read_text())
    tracks = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"dma", "tiu"} <= tracks
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) == len(tpumodel.load(tmp_path / "cnn.tpumodel").commands)
    run = _tool("run", f"--model={tmp_path / 'cnn.tpumodel'}", f"--input={tmp_path / 'in.npz'}",
                f"--output={tmp_path / 'out.npz'}")
    assert run.returncode == 0, run.stderr
    ref = _tool("run", f"--model={top_path}", f"--input={tmp_path / 'in.npz'}", f"--output={tmp_path / 'top.npz'}")
    assert ref.returncode == 0
    cmp = _tool("compare", tmp_path / "out.npz", tmp_path / "top.npz", "--tolerance=0.99,0.8")
    assert cmp.returncode == 0, cmp.stdout + cmp.stderr


def test_damaged_model_files_are_refused(case, tmp_path):
    model, table, samples = case
    path = tmp_path / "m.tpumodel"
    deploy(model, quantize="INT8", chip="npu1", calibration_table=table, model=path, mixed_precision="none")
    data = path.read_bytes()
    for cut in (10, 100, len(data) // 2, len(data) - 1):
        (tmp_path / "cut.tpumodel").write_bytes(data[:cut])
        with pytest.raises(errors.ModelFileError, match="cut.tpumodel"):
            tpumodel.load(tmp_path / "cut.tpumodel")
    run = _tool("run", f"--model={tmp_path / 'cut.tpumodel'}", "--input=x.npz", f"--output={tmp_path / 'o.npz'}")
    assert run.returncode == 2 and run.stderr.count("\n") == 1
    flipped = bytearray(data)
    flipped[len(data) // 3] ^= 0x40
    (tmp_path / "flip.tpumodel").write_bytes(bytes(flipped))
    with pytest.raises(errors.ModelFileError, match="checksum"):
        tpumodel.load(tmp_path / "flip.tpumodel")
    newer = bytearray(data)
    newer[8:10] = (2).to_bytes(2, "little")
    (tmp_path / "new.tpumodel").write_bytes(bytes(newer))
    with pytest.raises(errors.ModelFileError, match="newer"):
        tpumodel.load(tmp_path / "new.tpumodel")
    with pytest.raises(errors.ModelFileError, match="no such file"):
        tpumodel.load(tmp_path / "missing.tpumodel")


def test_host_subnets_by_tac_pick(case, tmp_path, monkeypatch):
    """Ops the chip cannot run go to the host, and so do ops a fast host runs cheaper (TAC's
    exact pick over both cost models); the simulator runs them and still equals TPU inference
    bit for bit, and the report says which ops run where and why."""
    import yaml

    from tftpu.backend import host as host_mod
    from tftpu.backend.codegen import generate
    model, table, samples = case
    monkeypatch.setitem(host_mod.UNSUPPORTED, "npu1", {"tpu.Softmax"})
    res = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0],
                 mixed_precision="none")
    plan = res.program.host_plan
    from tftpu.ir.base import value_name
    prob = next(value_name(op.results[0]) for op in res.model.ops if op.name == "tpu.Softmax")   # INT8: "prob" is its cast
    assert "does not run tpu.Softmax" in plan.reasons[prob] and plan.cost_us <= plan.all_chip_us
    assert res.simulator["passed"] and all(r["bit_exact"] for r in res.simulator["outputs"])
    assert any(c["kind"] == "host" for c in res.program.commands)
    from tftpu.pipelines.deploy_report import report_data
    assert prob in report_data(res)["host"]["host_ops"]
    # an op the host runs between chip ops holds the chip up for all of its time (FLOPs or bytes)
    import math

    from tftpu import chip as chips
    from tftpu.backend.cycles import tensor_bytes
    from tftpu.backend.layer_group import host_preprocessing
    from tftpu.ir import top
    npu1, ops = chips.load("npu1"), list(res.model.ops)
    for c in res.program.commands:
        if c["kind"] == "host" and c["op"] not in host_preprocessing(res.model):
            op = ops[c["op"]]
            moved = sum(tensor_bytes(v.type) for v in [*op.operands, *op.results] if not isinstance(v.owner, top.Weight))
            seconds = max(moved / npu1.host.bandwidth, op.flops() / npu1.host.flops)
            assert c["cycles"] == math.ceil(seconds * npu1.frequency_hz), (op.loc, c["cycles"])
    # a host far faster than the chip takes the heavy ops, the pick no worse than all on chip
    data = yaml.safe_load((config.DEFAULT_ROOT / "chips" / "npu1.yaml").read_text())
    data["name"], data["host"]["flops"], data["host"]["bandwidth"] = "slow_npu", 1.0e16, 1.0e13
    data["ddr_bandwidth"], data["frequency_hz"] = 1.0e13, 1.0e6          # a 1 MHz chip
    (tmp_path / "slow_npu.yaml").write_text(yaml.safe_dump(data))
    tpu = res.model
    prog = generate(tpu, tmp_path / "slow_npu.yaml")
    assert prog.host_plan.ops and prog.host_plan.cost_us <= prog.host_plan.all_chip_us
    got = Simulator(prog).run(samples[1])
    want = TpuInterpreter(tpu).run(samples[1])
    assert all(np.array_equal(got[k], want[k]) for k in want)


def test_layer_groups_are_tpu_group_regions_in_the_text(case, tmp_path):
    """The `.tpu.mlir` shows each layer group as a `tpu.Group` region (its ops with their
    `group_info`, a `tpu.Yield`), as TPU-MLIR's listings do; reading it back flattens it to the
    very module deployed, and the `.tpumodel`'s module section the same."""
    from tftpu.ir import load

    model, table, samples = case
    res = deploy(model, quantize="INT8", chip="edge16", calibration_table=table, mixed_precision="none",
                 tpu_mlir=tmp_path / "m.tpu.mlir", model=tmp_path / "m.tpumodel")
    text = (tmp_path / "m.tpu.mlir").read_text()
    groups = res.program.groups.local_groups
    assert text.count('"tpu.Group"') == len(groups) > 0 and text.count('"tpu.Yield"') == len(groups)
    assert "h_idx" in text and "group_info" in text
    again = load(tmp_path / "m.tpu.mlir")
    assert again.text() == res.model.text()
    assert again.file_text() == text
    prog = tpumodel.load(tmp_path / "m.tpumodel")
    assert prog.model.text() == res.model.text()
    got = Simulator(prog).run(samples[2])
    want = TpuInterpreter(again).run(samples[2])
    assert all(np.array_equal(got[k], want[k]) for k in want)


def test_a_compile_records_where_its_time_goes(case):
    """Under `tftpu.utils.spans.recording()`, a compile's import, calibration, each table's program
    and the judgements inside them are spans; the program is the same as without a recording."""
    from tftpu.utils import spans

    model, _, samples = case
    flags = dict(space_to_depth=False, calibration_method="mse, minmax", mixed_precision="0.99,99")
    with spans.recording() as rec:
        compiled = tftpu.compile(model, chip="npu1", calibration_data=samples, **flags)
    names = [e[0] for e in rec.events]
    assert {"import", "calibrate", "program", "judge", "lower", "verify", "simulate"} <= set(names)
    programs = [e for e in rec.events if e[0] == "program"]
    assert programs[0][4] == {"table": "mse", "choices": "own"}
    assert {e[4]["table"] for e in programs} == set(compiled.report["calibration"]["judged_db"])
    calibrate = next(e for e in rec.events if e[0] == "calibrate")
    assert calibrate[3] <= programs[0][2]                   # calibration ends before the first program starts
    plain = tftpu.compile(model, chip="npu1", calibration_data=samples, **flags)
    assert plain.tpu_model.text() == compiled.tpu_model.text()
