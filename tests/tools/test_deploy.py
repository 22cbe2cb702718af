"""tftpu-deploy and tftpu.pipelines.deploy: lowering checked against TOP, reports, the
YOLO-style concat of boxes and scores, mixed precision, and bad input (one line, exit 2)."""

from __future__ import annotations

import html
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tftpu import errors, quant
from tftpu.ir import TopBuilder, load
from tftpu.pipelines.deploy import choices_of, deploy

def cnn():
    """Conv/ReLU -> depthwise -> SiLU -> Add -> MaxPool -> GlobalAvgPool -> MatMul -> Softmax."""
    rng = np.random.default_rng(1)
    b = TopBuilder("cnn")
    x = b.input("x", (1, 3, 16, 16))
    c1 = b.op("Conv", [x, b.weight("w1", rng.normal(size=(8, 3, 3, 3)).astype(np.float32) * 0.3),
                       b.weight("b1", rng.normal(size=(8,)).astype(np.float32) * 0.1)],
              {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "do_relu": True}, "c1")
    c2 = b.op("Conv", [c1, b.weight("w2", rng.normal(size=(8, 1, 3, 3)).astype(np.float32) * 0.3), b.none()],
              {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "group": 8}, "c2")
    s = b.op("SiLU", [c2], {}, "s")
    a = b.op("Add", [c1, s], {}, "a")
    m = b.op("MaxPool", [a], {"kernel_shape": [2, 2], "strides": [2, 2]}, "m")
    g = b.op("GlobalAvgPool", [m], {}, "g")
    f = b.op("Flatten", [g], {}, "f")
    o = b.op("MatMul", [f, b.weight("wf", rng.normal(size=(8, 5)).astype(np.float32)), b.none()], {}, "o")
    return b.finish([b.op("Softmax", [o], {}, "prob")])


def detector():
    """A YOLO-style head: boxes up to ~300 and sigmoid scores in 0..1, concatenated as the output."""
    rng = np.random.default_rng(2)
    b = TopBuilder("yolo")
    x = b.input("x", (1, 3, 8, 8))
    feat = b.op("Conv", [x, b.weight("wf", rng.normal(size=(8, 3, 3, 3)).astype(np.float32) * 0.4), b.none()],
                {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "do_relu": True}, "feat")
    raw = b.op("Conv", [feat, b.weight("wb", rng.normal(size=(4, 8, 1, 1)).astype(np.float32) * 0.4), b.none()],
               {"kernel_shape": [1, 1]}, "raw_box")
    boxes = b.op("Mul", [b.op("Sigmoid", [raw], {}, "box_sig"), b.weight("img", np.array(320.0, np.float32))],
                 {}, "boxes")
    logits = b.op("Conv", [feat, b.weight("ws", rng.normal(size=(2, 8, 1, 1)).astype(np.float32) * 0.4), b.none()],
                  {"kernel_shape": [1, 1]}, "logits")
    scores = b.op("Sigmoid", [logits], {}, "scores")
    cat = b.op("Concat", [boxes, scores], {"axis": 1}, "cat")
    return b.finish([b.op("Reshape", [cat], {"shape": [1, 6, 64]}, "detections")])


def samples_for(model, n=6, scale=1.0, seed=7):
    """`n` inputs drawn from a generator of their own (test order must not change them)."""
    rng = np.random.default_rng(seed)
    shape = model.func.function_type.inputs.data[0].get_shape()
    return [{model.input_names[0]: (rng.normal(size=shape) * scale).astype(np.float32)} for _ in range(n)]


@pytest.fixture(scope="module")
def cnn_case():
    model = cnn()
    samples = samples_for(model)
    return model, quant.calibrate(model, samples, "mse"), samples


def test_f32_is_bit_equal_and_int8_passes(cnn_case):
    model, table, samples = cnn_case
    f32 = deploy(model, quantize="F32", chip="npu1", test_input=samples[0])
    assert f32.passed and all(r.note.startswith("equal") for r in f32.tensors.rows)
    int8 = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0],
                  samples=samples[1:])
    assert int8.passed and int8.outputs[0].cosine > 0.999
    assert int8.lowering.counts() == {"INT8": 9}          # the classifier's Softmax too (an output: 16 bits)
    # edge16 (no F32) the same; its float fallbacks run in F16 (test_tpu_int8_exact's casts)
    edge = deploy(model, quantize="INT8", chip="edge16", calibration_table=table, test_input=samples[0])
    assert edge.lowering.counts() == {"INT8": 9} and edge.passed


def test_files_reports_and_reload(cnn_case, tmp_path):
    model, table, samples = cnn_case
    mlir = tmp_path / "cnn.tpu.mlir"
    res = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0],
                 tpu_mlir=mlir, report=tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["passed"] and data["mode"] == "INT8" and data["chip"] == "npu1"
    # DESIGN.md's report contract (the model file's figures come with the backend's codegen)
    assert data["latency_us"] > 0 and data["flops"] > 0 and 0 < data["utilisation"] <= 1
    assert all({"name", "type", "cycles"} <= set(o) for o in data["ops"])
    assert data["s2d"]["applied"] is False and "first_conv_cycles" in data["s2d"]
    assert data["memory"]["peak"] >= data["memory"]["lower_bound"] > 0
    assert {o["name"] for o in data["ops"]} >= {"c1", "prob"} and data["tensors"]
    deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0],
           report=tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and "http://" not in page.split("<svg", 1)[0]
    again = load(mlir)
    from tftpu.interp.tpu import TpuInterpreter
    a = TpuInterpreter(res.model).run(samples[1])
    b = TpuInterpreter(again).run(samples[1])
    assert all(np.array_equal(a[k], b[k]) for k in a)
    first = mlir.read_bytes(), res.weights.read_bytes()
    deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0], tpu_mlir=mlir,
           report=tmp_path / "r.json")
    assert (mlir.read_bytes(), res.weights.read_bytes()) == first          # deterministic


def test_concat_of_boxes_and_scores_keeps_both_parts(monkeypatch):
    from tftpu.transforms.lowering import decode_tail

    monkeypatch.setattr(decode_tail, "SHARE", 0.1)       # this toy's head is a few % of its FLOPs
    model = detector()
    samples = samples_for(model, 8)
    table = quant.calibrate(model, samples, "mse")
    res = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0],
                 samples=samples[1:])
    modes = {d.name: (d.mode, d.reason) for d in res.lowering.decisions}
    tail = ("box_sig", "boxes", "scores", "cat", "detections")      # the decode tail: float by design
    assert all(modes[n][0] == "F16" and "decode tail" in modes[n][1] for n in tail), modes
    assert all(modes[n][0] == "INT8" for n in ("feat", "raw_box", "logits")), modes
    (out, parts), = res.parts
    assert out == "detections" and [p.name for p in parts] == ["detections[boxes]", "detections[scores]"]
    assert all(p.sqnr > 20 and p.cosine > 0.99 for p in parts), parts
    assert res.passed
    # pinned to INT8 (or with the tail off), the scores keep their 16-bit grid and the Concat keeps float
    for extra in ({"quantize_table": dict.fromkeys(tail, "INT8")}, {"float_tail": False}):
        res = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0],
                     samples=samples[1:], mixed_precision="none", **extra)
        modes = {d.name: (d.mode, d.reason) for d in res.lowering.decisions}
        assert modes["cat"][0] == "F32" and "16-bit" in modes["cat"][1], modes
        assert all(modes[n][0] == "INT8" for n in ("box_sig", "boxes", "scores")), modes
        assert all(p.sqnr > 20 and p.cosine > 0.99 for _, parts in res.parts for p in parts), res.parts


def test_one_grid_for_boxes_and_scores_is_caught(monkeypatch):
    """Forced onto one INT8 grid the scores are erased: the whole output still looks fine, the
    scores part does not, and the check fails."""
    from tftpu.transforms.lowering import int8_elementwise, int8_movement

    monkeypatch.setattr(int8_movement, "RANGE_RATIO", 1e9)
    monkeypatch.setattr(int8_elementwise, "SCORES", ())
    model = detector()
    samples = samples_for(model, 8)
    table = quant.calibrate(model, samples, "mse")
    tail = ("box_sig", "boxes", "scores", "cat", "detections")
    res = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0],
                 mixed_precision="none", quantize_table=dict.fromkeys(tail, "INT8"))
    assert res.outputs[0].cosine > 0.99
    scores = [p for _, parts in res.parts for p in parts if p.name.endswith("[scores]")][0]
    assert scores.sqnr < 10 and not res.passed


def test_quantize_table_pins_modes(cnn_case, tmp_path):
    model, table, samples = cnn_case
    qt = tmp_path / "qtable"
    qt.write_text("# keep the first conv in F16\nc1 F16\ns BF16\n")
    res = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, quantize_table=qt,
                 test_input=samples[0])
    modes = {d.name: d.mode for d in res.lowering.decisions}
    assert modes["c1"] == "F16" and modes["s"] == "BF16" and modes["c2"] == "INT8" and res.passed
    qt.write_text("c1 F16\nnot_an_op F16\n")
    with pytest.raises(errors.UsageError, match="not_an_op"):
        deploy(model, quantize="INT8", chip="npu1", calibration_table=table, quantize_table=qt)
    qt.write_text("c1 INT4\n")
    with pytest.raises(errors.ModelFileError, match="qtable:1"):
        deploy(model, quantize="INT8", chip="npu1", calibration_table=table, quantize_table=qt)
    qt.write_text("c1 F32\n")
    with pytest.raises(errors.UsageError, match="edge16 does not run F32"):
        deploy(model, quantize="INT8", chip="edge16", calibration_table=table, quantize_table=qt)


@pytest.mark.parametrize("ranking", ["effect", "isolated", "alone", "gain"])
def test_mixed_precision_keeps_the_fewest_ops(cnn_case, ranking):
    from tftpu.interp.similarity import cosine_similarity, sqnr
    from tftpu.interp.top_interpreter import TopInterpreter
    from tftpu.interp.tpu import TpuInterpreter
    from tftpu.transforms.lowering import lower
    from tftpu.transforms.lowering import search
    from tftpu.transforms.lowering.search import search_mixed_precision

    model, table, samples = cnn_case
    base = {"prob": "F32"}     # the Softmax in F32 as before its INT8 lowering (in F16 it caps the target)

    def worst(qtable):
        """The output's cosine and SQNR, pooled over the samples (as the search judges)."""
        tpu, _ = lower(model, "npu1", "INT8", table, qtable={**base, **qtable})
        a = np.concatenate([TopInterpreter(model).run(s)["prob"].ravel() for s in samples])
        b = np.concatenate([TpuInterpreter(tpu).run(s)["prob"].ravel() for s in samples])
        return cosine_similarity(a, b), sqnr(a, b)

    pure = worst({})
    target = f"0.99,{pure[1] + 3:.2f}"                   # out of pure INT8's reach, within float's
    res = search_mixed_precision(model, "npu1", table, samples, target, ranking=ranking, qtable=base)
    assert abs(res.int8_reached[1] - pure[1]) < 1e-6
    assert res.met and 0 < len(res.kept) < res.candidates, str(res)
    assert "keeping" in res.summary and all(m == "F16" for _, m, _ in res.kept)
    assert worst(res.qtable)[1] >= pure[1] + 3 - 1e-6
    # one op fewer does not reach the target: the list is minimal along the ranking
    assert worst({n: m for n, m, _ in res.kept[:-1]})[1] < pure[1] + 3
    # pruned: each float op holding a real share of the FLOPs is needed there
    flops = {op.loc: op.flops() for op in model.ops}
    big = [n for n, _, _ in res.kept if flops[n] >= search.PRUNE_SHARE * sum(flops.values())]
    for name in big[:search.PRUNE_TRIALS]:
        assert worst({n: m for n, m, _ in res.kept if n != name})[1] < pure[1] + 3, name
    assert str(res).count("\n") == len(res.kept) and res.as_dict()["ranking"] == ranking
    # on TOP's outputs run once for it, and all INT8 judged beforehand (as deploy shares them), the same search
    from tftpu.pipelines.judge import Judge
    shared = search.References(model, samples)
    int8 = Judge(model, samples, shared).worst(lower(model, "npu1", "INT8", table, qtable=base)[0], False)
    assert int8 == res.int8_reached
    again = search_mixed_precision(model, "npu1", table, samples, target, ranking=ranking, qtable=base,
                                   references=shared, int8_known=(int8, None))
    assert (again.qtable, again.kept, again.reached, again.int8_reached) == \
        (res.qtable, res.kept, res.reached, res.int8_reached)
    with pytest.raises(errors.InternalError, match="other samples"):
        search_mixed_precision(model, "npu1", table, samples[::-1], target, ranking=ranking, references=shared)
    from tftpu.transforms.lowering.search import KEPT_FIGURES     # the HTML report's column holds each op's figure
    assert all(KEPT_FIGURES[ranking][0] in row for row in res.as_dict()["kept"])
    with pytest.raises(errors.UsageError, match="cosine,sqnr_db"):
        search_mixed_precision(model, "npu1", table, samples, "0.99")
    with pytest.raises(errors.UsageError, match="ranking"):
        search_mixed_precision(model, "npu1", table, samples, target, ranking="random")


def test_the_test_input_meets_the_target_on_its_own(cnn_case):
    """`judge_first`: a test input (the first sample) whose outputs miss the target alone while
    the pool meets it makes the search keep ops in float until it meets it on its own too."""
    from tftpu.interp.similarity import sqnr
    from tftpu.interp.top_interpreter import TopInterpreter
    from tftpu.interp.tpu import TpuInterpreter
    from tftpu.transforms.lowering import lower
    from tftpu.transforms.lowering.search import search_mixed_precision

    model, table, samples = cnn_case
    base = {"prob": "F32"}

    def alone(qtable, sample, tpu=None):
        tpu = tpu or lower(model, "npu1", "INT8", table, qtable={**base, **qtable})[0]
        return sqnr(TopInterpreter(model).run(sample)["prob"], TpuInterpreter(tpu).run(sample)["prob"])

    pure_int8 = lower(model, "npu1", "INT8", table, qtable=base)[0]
    order = sorted(samples, key=lambda s: alone({}, s, pure_int8))          # the worst sample first
    pooled = search_mixed_precision(model, "npu1", table, order, "0.9,0", qtable=base).int8_reached[1]
    first = alone({}, order[0])
    assert first < pooled - 0.5, (first, pooled)
    target = f"0.9,{(first + pooled) / 2:.3f}"                   # the pool meets it, the first sample not
    assert not search_mixed_precision(model, "npu1", table, order, target, qtable=base).kept
    res = search_mixed_precision(model, "npu1", table, order, target, qtable=base, judge_first=True)
    assert res.met and res.kept and res.reached[1] >= (first + pooled) / 2 - 1e-3
    assert alone({n: m for n, m, _ in res.kept}, order[0]) >= (first + pooled) / 2 - 1e-3


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 4), st.lists(st.floats(0.0, 2.0), min_size=8, max_size=8), st.integers(0, 2**31 - 1))
def test_the_first_sample_alone_bounds_the_judged_figures(n, noise, seed):
    """What the search's early stop relies on: with `judge_first`, every judged figure (pooled
    over the samples, the first alone too) is no better than the first sample's alone, so a first
    sample that misses a target alone settles that the whole pool misses it."""
    from tftpu.transforms.lowering.search import judge_runs, worst_figures

    rng = np.random.default_rng(seed)
    runs = []
    for i in range(n):
        pairs = []
        for k, name in enumerate(("boxes", "scores")):
            ref = rng.standard_normal(12) * (1 + k)
            pairs.append((name, ref, ref + rng.standard_normal(12) * noise[2 * i + k]))
        runs.append(pairs)
    alone = worst_figures(judge_runs(runs[:1], 0.0))
    whole = worst_figures(judge_runs(runs, 0.0, judge_first=True))
    assert whole[0] <= alone[0] and whole[1] <= alone[1]


def test_auto_ranking_keeps_the_float_set_that_does_better_lowered(cnn_case):
    """Under `auto`, the gain ranking's float set and the isolated ranking's are both built on
    the weights finally lowered (bias-corrected here; the isolated one with the correction the
    gain one's build took, not judged again), and deploy keeps the one its judge rates better (the
    gain ranking's on a tie), saying so."""
    from tftpu.pipelines.deploy import _Judge

    model, table, samples = cnn_case
    kw = dict(quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0], samples=samples[1:],
              quantize_table={"prob": "F32"}, mixed_precision_budget=None, mixed_precision_latency=None,
              bias_correction=True)
    pure = deploy(model, mixed_precision="none", **kw)
    judge = _Judge(model, [samples[0]] + samples[1:])
    target = f"0.99,{min(judge(pure.model)) + 3:.2f}"           # out of pure INT8's reach
    each = {r: deploy(model, mixed_precision=target, mixed_precision_ranking=r, **kw) for r in ("gain", "isolated")}
    assert all(d.search.kept and d.search.rival is None for d in each.values())
    figures = {r: min(judge(d.model)) for r, d in each.items()}
    auto = deploy(model, mixed_precision=target, **kw)
    best = auto.search.ranking
    assert auto.search.qtable == each[best].search.qtable
    assert min(judge(auto.model)) >= figures["gain"] - 1e-9     # (the gain ranking's program is auto's first)
    assert (best == "isolated") == (min(judge(auto.model)) > figures["gain"])
    assert f"{best}'s kept" in auto.search.rival and "isolated" in auto.search.rival
    assert auto.search.as_dict()["rival"] == auto.search.rival and auto.search.rival in str(auto.search)


@pytest.mark.parametrize("order, taken", [(("s", "a", "m", "c1"), True), (("c2", "g", "o", "c1"), False)])
def test_the_last_float_ops_go_back_to_int8_where_the_lowered_weights_allow(cnn_case, monkeypatch, tmp_path, order,
                                                                           taken):
    """After the bias correction (or refit), the last quarter of the search's float ops in its
    ranking is tried back in INT8 and left there where deploy's judge holds (on this model,
    floating c1 as well costs 9 dB beside s, a and m, and gains 4 dB beside c2, g and o)."""
    import tftpu.transforms.lowering.search as S
    from tftpu.pipelines.deploy import _Judge

    model, table, samples = cnn_case
    kept = [(n, "F16", 0.0) for n in order]

    def search(*args, **kwargs):
        return S.MixedPrecisionResult({n: "F16" for n in order}, list(kept), (0.99, 20.0), (1.0, 100.0),
                                      (0.9, 10.0), 1, 0.0, 9)

    monkeypatch.setattr(S, "search_mixed_precision", search)
    kw = dict(quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0], samples=samples[1:],
              wide_links=True)                         # no interpolated tables' trial after the trim
    judge = _Judge(model, [samples[0]] + samples[1:])
    whole, less = (judge(deploy(model, mixed_precision="none", quantize_table={n: "F16" for n in names},
                                bias_correction=True, **kw).model) for names in (order, order[:3]))
    assert (min(less) >= min(whole)) == taken                 # each case is the one its name says
    res = deploy(model, mixed_precision="auto", bias_correction=True, report=tmp_path / "r.html", **kw)
    assert [n for n, _, _ in res.search.kept] == list(order[:3] if taken else order)
    assert res.search.qtable == {n: "F16" for n, _, _ in res.search.kept}
    assert {d.name for d in res.lowering.decisions if d.mode != "INT8"} >= set(res.search.qtable)
    assert min(judge(res.model)) == pytest.approx(min(less if taken else whole), abs=1e-9)
    assert res.search.trimmed.endswith("not taken") != taken and "last 1 of 4 float ops" in res.search.trimmed
    assert res.search.as_dict()["trimmed"] == res.search.trimmed and res.search.trimmed in str(res.search)
    page = (tmp_path / "r.html").read_text()
    assert html.escape(res.search.trimmed) in page
    # what the program lowered reaches, which the search's own figures (before the correction) are not
    assert res.search.lowered == judge(res.model) and html.escape(res.search.lowered_note) in page
    assert res.search.as_dict()["lowered_sqnr_db"] == [round(v, 3) for v in judge(res.model)]
    verdict = "target is met" if min(judge(res.model)) >= 20.0 else "below the 20 dB target"
    assert res.search.lowered_note.endswith(verdict) and "on the weights it searched with" in res.search.summary
    # nothing changes the weights after the search: its float set stands as it is
    plain = deploy(model, mixed_precision="auto", bias_correction=False, **kw)
    assert plain.search.trimmed is None and len(plain.search.kept) == 4


def _overflowing_f16_case():
    """(model, samples, table, search): a conv whose outputs pass F16's 65504, which INT8 holds,
    and a search stub that keeps exactly that conv in F16."""
    import tftpu.transforms.lowering.search as S

    b = TopBuilder("big")
    x = b.input("x", (1, 4, 6, 6))
    y = b.op("Conv", [x, b.weight("w", 1e5 * np.eye(4, dtype=np.float32).reshape(4, 4, 1, 1)), b.none()],
             {"kernel_shape": [1, 1]}, "y")
    model = b.finish([b.op("Relu", [y], {}, "r")])
    rng = np.random.default_rng(0)
    samples = [{"x": rng.uniform(0, 1, (1, 4, 6, 6)).astype(np.float32)} for _ in range(3)]
    table = quant.calibrate(model, samples, "minmax")

    def search(*args, **kwargs):
        return S.MixedPrecisionResult({"y": "F16"}, [("y", "F16", 0.0)], (0.99, 20.0), (1.0, 100.0), (0.9, 10.0), 1, 0.0, 2)

    return model, samples, table, search


def test_float_ops_that_do_not_help_the_lowered_weights_are_undone(monkeypatch):
    """Where the search's float ops do worse than all INT8 on the weights finally lowered (here
    F16 overflows a conv whose outputs pass 65504, which INT8 holds), deploy lowers all INT8 and
    says why."""
    import tftpu.transforms.lowering.search as S

    model, samples, table, search = _overflowing_f16_case()
    monkeypatch.setattr(S, "search_mixed_precision", search)
    res = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0],
                 samples=samples[1:], mixed_precision="auto", weight_rounding=False, bias_correction=False)
    assert res.search.undone is not None and res.search.undone[0] < res.search.undone[1]
    assert not res.search.kept and not res.search.qtable
    assert {d.mode for d in res.lowering.decisions} == {"INT8"}
    assert "do not help with the weights lowered" in str(res.search)
    assert res.search.as_dict()["undone"] == [round(v, 3) for v in res.search.undone]


def test_the_float_check_chooses_its_own_correction_where_the_float_set_kept_none(monkeypatch):
    """The float check's all-INT8 program takes the first build's correction as given, except
    where that build did not keep it: then all INT8 gets a refit and check of its own (a
    correction the float set does not need may still mend all INT8's noise)."""
    import tftpu.pipelines.deploy as deploying
    import tftpu.transforms.lowering.search as S

    model, samples, table, search = _overflowing_f16_case()
    real_keep, checks = deploying._keep_correction, []

    def keep(judge, corrected, plain, reports, target=float("inf")):     # the float set's build keeps none
        real_keep(judge, corrected, plain, reports, target)
        checks.append(corrected)
        if len(checks) == 1:
            for r in reports:
                r.kept = False
            return False
        return True

    monkeypatch.setattr(S, "search_mixed_precision", search)
    monkeypatch.setattr(deploying, "_keep_correction", keep)
    res = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0],
                 samples=samples[1:], mixed_precision="auto", weight_rounding=False, bias_correction=False,
                 weight_refit=True, refit_rounding="nearest")
    assert res.search.undone is not None and not res.search.kept
    assert len(checks) == 2                          # the float set's build, all INT8's own
    assert res.bias_correction is not None and res.bias_correction.refit and res.bias_correction.kept


def test_bad_input_is_one_clear_error(cnn_case, tmp_path):
    model, table, samples = cnn_case
    with pytest.raises(errors.UsageError, match="calibration table"):
        deploy(model, quantize="INT8", chip="npu1")
    with pytest.raises(errors.UsageError, match="edge16 does not run F32"):
        deploy(model, quantize="F32", chip="edge16")
    with pytest.raises(errors.UsageError, match="asymmetric"):
        deploy(model, quantize="F16", chip="npu1", asymmetric=True)
    with pytest.raises(errors.ShapeError, match="shape"):
        deploy(model, quantize="F32", chip="npu1", test_input={"x": np.zeros((1, 3, 8, 8), np.float32)})
    with pytest.raises(errors.ConfigError):
        deploy(model, quantize="F32", chip="no_such_chip")
    tpu = tmp_path / "m.tpu.mlir"
    deploy(model, quantize="F16", chip="npu1", tpu_mlir=tpu)
    with pytest.raises(errors.ModelFileError, match="already a TPU module"):
        deploy(tpu, quantize="F16", chip="npu1")
    with pytest.raises(errors.OutputError):
        deploy(model, quantize="F16", chip="npu1", tpu_mlir=tmp_path)          # a directory
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cnn_tpu_f16_weights.npz", "m.tpu.mlir"]


def _tool(name: str, *args, cwd=None):
    script = Path(sys.executable).parent / f"tftpu-{name}"
    return subprocess.run([str(script), *map(str, args)], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_tools_end_to_end(cnn_case, tmp_path):
    model, table, samples = cnn_case
    top_path, _ = model.save(tmp_path / "cnn.top.mlir")
    table.save(tmp_path / "cali")
    np.savez(tmp_path / "in.npz", **samples[0])
    done = _tool("deploy", f"--mlir={top_path}", "--quantize=INT8", "--chip=npu1", f"--calibration_table={tmp_path / 'cali'}",
                 f"--test_input={tmp_path / 'in.npz'}", f"--tpu_mlir={tmp_path / 'cnn.tpu.mlir'}",
                 f"--report={tmp_path / 'deploy.html'}")
    assert done.returncode == 0, done.stderr
    assert "lowered for npu1 in INT8: 9 INT8" in done.stdout and "prob: cosine" in done.stdout
    run = _tool("run", f"--model={tmp_path / 'cnn.tpu.mlir'}", f"--input={tmp_path / 'in.npz'}",
                f"--output={tmp_path / 'out.npz'}", "--dump_all_tensors")
    assert run.returncode == 0, run.stderr
    dumped = np.load(tmp_path / "out.npz")
    from tftpu.interp.tpu import TpuInterpreter
    expected = TpuInterpreter(load(tmp_path / "cnn.tpu.mlir")).run(samples[0], dump_all=True, dequantize=True)
    assert set(dumped.files) == set(expected) and all(np.array_equal(dumped[k], expected[k]) for k in expected)
    # a tolerance the model cannot meet: exit 1 with one line
    strict = _tool("deploy", f"--mlir={top_path}", "--quantize=INT8", "--chip=npu1",
                   f"--calibration_table={tmp_path / 'cali'}", f"--test_input={tmp_path / 'in.npz'}",
                   "--tolerance=0.99999999,0.99999")
    assert strict.returncode == 1 and strict.stderr.count("\n") == 1 and "under tolerance" in strict.stderr
    bad = _tool("deploy", f"--mlir={top_path}", "--quantize=INT8", "--chip=npu1", f"--tpu_mlir={tmp_path / 'x.tpu.mlir'}")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "calibration table" in bad.stderr
    assert not (tmp_path / "x.tpu.mlir").exists()


def test_zero_points_follow_the_table(cnn_case):
    """By default an asymmetric table's one-sided ranges get zero points (as tftpu.compile lowers),
    a symmetric table's none; an explicit choice stands."""
    model, table, samples = cnn_case
    asym = quant.calibrate(model, samples, "mse", asymmetric=True)

    def text(t, **k):
        return deploy(model, quantize="INT8", chip="npu1", calibration_table=t, mixed_precision="none",
                      wide_links=True, **k).model.text()

    assert text(asym) == text(asym, asymmetric="auto") != text(asym, asymmetric=False)
    assert text(table) == text(table, asymmetric=False)


def test_a_table_with_alternates_builds_each_until_one_meets_the_target(cnn_case, tmp_path):
    """tftpu-calibrate's default table (mse, tail_mse as an alternate): deploy with a test input
    builds the program with each table while the one before misses the target, keeps the better
    (what deploy reports for that table alone) and writes only it; a target met by the first
    builds once; without a test input the first table is lowered."""
    model, _, samples = cnn_case
    table = quant.calibrate(model, samples, "mse,minmax", asymmetric=True)
    fixed = dict(quantize="INT8", chip="npu1", test_input=samples[0], samples=samples[1:], wide_links=False)
    out = tmp_path / "kept.tpu.mlir"
    res = deploy(model, calibration_table=table, mixed_precision="0.99,99", tpu_mlir=out,
                 report=tmp_path / "r.json", **fixed)
    judged = res.calibration.figures
    assert list(judged) == ["mse", "minmax"] and res.calibration.target == 99
    kept = res.calibration.method
    assert kept == max(judged, key=lambda m: (min(judged[m]), m == "mse"))
    assert res.seconds["calibration choice"] > 0 and json.loads((tmp_path / "r.json").read_text())[
        "calibration"]["method"] == kept
    tables = table.tables()
    first = deploy(model, calibration_table=tables["mse"], mixed_precision="0.99,99", **fixed)
    assert first.search.lowered == judged["mse"] and first.calibration is None
    # minmax with mse's choices first, searched again only near the best (the better kept)
    like = deploy(model, calibration_table=tables["minmax"], **{**fixed, **choices_of(first)})
    full = deploy(model, calibration_table=tables["minmax"], mixed_precision="0.99,99", **fixed)
    assert res.calibration.carried["minmax"] == like.judged
    assert judged["minmax"] in (like.judged, full.search.lowered)
    built = {"mse": first, "minmax": like if judged["minmax"] == like.judged else full}
    assert built[kept].model.text() == load(out).text()
    met = deploy(model, calibration_table=table, **fixed)              # 20 dB: mse meets it
    assert list(met.calibration.figures) == ["mse"] and met.passed
    untested = deploy(model, quantize="INT8", chip="npu1", calibration_table=table)
    assert untested.calibration is None and untested.model.text() == deploy(
        model, quantize="INT8", chip="npu1", calibration_table=table.tables()["mse"]).model.text()
    # the tool reads the alternates from the file and says which table it kept
    model.save(tmp_path / "cnn.top.mlir")
    table.save(tmp_path / "cali")
    np.savez(tmp_path / "in.npz", **samples[0])
    done = _tool("deploy", f"--mlir={tmp_path / 'cnn.top.mlir'}", "--quantize=INT8", "--chip=npu1",
                 f"--calibration_table={tmp_path / 'cali'}", f"--test_input={tmp_path / 'in.npz'}",
                 "--mixed_precision=0.99,99", "--nowide_links", "--tolerance=0,0")
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("calibration: programs built with mse"))
    assert "minmax" in line and line.endswith(" kept")


def test_checks_left_for_later_are_the_same_checks(cnn_case, monkeypatch):
    """deploy(..., checks=False) builds the same program and leaves verify and the simulator to
    `run_checks`, which gives what deploy's own checks give, once; a calibration choice checks
    only the program it keeps."""
    import tftpu.pipelines.deploy as D

    model, table, samples = cnn_case
    fixed = dict(quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0], samples=samples[1:])
    now = deploy(model, **fixed)
    later = deploy(model, checks=False, **fixed)
    assert later.outputs == [] and later.simulator is None and not later.passed
    assert later.model.text() == now.model.text()
    assert later.run_checks() is later and later.outputs == now.outputs and later.parts == now.parts
    assert later.simulator["passed"] and later.passed and "verify" in later.seconds
    assert later.pending_checks is None
    calls = []
    real = D.verify
    monkeypatch.setattr(D, "verify", lambda *a, **k: calls.append(1) or real(*a, **k))
    both = quant.calibrate(model, samples, "mse,minmax", asymmetric=True)
    chose = deploy(model, **{**fixed, "calibration_table": both}, mixed_precision="0.99,99", wide_links=False)
    assert len(chose.calibration.figures) == 2 and calls == [1] and chose.outputs


def test_the_tool_fits_the_weights_on_samples(cnn_case, tmp_path):
    """tftpu-deploy --samples refits the weights on them by default (as tftpu.compile does on its
    calibration data); without it nothing is fitted to the test input it is judged on."""
    model, table, samples = cnn_case
    top_path, _ = model.save(tmp_path / "cnn.top.mlir")
    table.save(tmp_path / "cali")
    np.savez(tmp_path / "in.npz", **samples[0])
    (tmp_path / "more").mkdir()
    for i, s in enumerate(samples[1:]):
        np.savez(tmp_path / "more" / f"{i}.npz", **s)
    base = [f"--mlir={top_path}", "--quantize=INT8", "--chip=npu1", f"--calibration_table={tmp_path / 'cali'}",
            f"--test_input={tmp_path / 'in.npz'}", "--mixed_precision=none"]
    fitted = _tool("deploy", *base, f"--samples={tmp_path / 'more'}")
    assert fitted.returncode == 0, fitted.stderr
    # the refit's line, or plain bias correction's where that did better, naming the refit's figures
    assert "weight refit" in fitted.stdout and "over 5 samples" in fitted.stdout
    plain = _tool("deploy", *base)
    assert plain.returncode == 0 and "weight refit" not in plain.stdout and "bias correction" not in plain.stdout
    bad = _tool("deploy", *base, f"--samples={tmp_path / 'missing'}")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "missing" in bad.stderr


def test_space_to_depth_at_deployment(cnn_case):
    """The stem (3x3, stride 2, 3 channels) becomes its S2D form on npu1: fewer cycles, the same
    outputs within INT8's tolerance, and the caller's TOP model untouched."""
    model, table, samples = cnn_case
    text = model.text()
    res = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0],
                 space_to_depth=True, mixed_precision="none")
    assert model.text() == text
    assert res.s2d["applied"] and res.s2d["before"] >= 2 * res.s2d["after"], res.s2d
    assert res.passed and res.outputs[0].cosine > 0.999
    plain = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, mixed_precision="none")
    assert res.cycles.cycles < plain.cycles.cycles
    # where the chip gains nothing it declines and says why (the cpu chip's unit is im2col)
    cpu = deploy(model, quantize="F32", chip="cpu", space_to_depth=True)
    assert not cpu.s2d["applied"] and "threshold" in cpu.s2d["reason"]


def test_rerun_recomputes_what_a_change_reaches(cnn_case):
    """TopInterpreter.rerun: the tensors downstream of a changed one, as a full run with that
    tensor replaced makes them; nothing else."""
    from tftpu.interp.top_interpreter import TopInterpreter

    model, _, samples = cnn_case
    run = TopInterpreter(model)
    dump = run.run(samples[0], dump_all=True)
    bumped = dump["s"] + np.float32(0.25)
    again = run.rerun(dump, {"s": bumped})
    full = run.run(samples[0], dump_all=True, observe=lambda name, a: bumped if name == "s" else a)
    assert set(again) == {"s", "a", "m", "g", "f", "o", "prob"}
    for name, arr in again.items():
        np.testing.assert_array_equal(arr, full[name], err_msg=name)
    assert run.rerun(dump, {}) == {}


def test_removal_gains_carry_an_ops_own_rounding_to_the_outputs(cnn_case):
    """The gain ranking's measure for the classifier MatMul: the outputs with only its input
    rounded onto the grid its INT8 form reads and its weights on their INT8 grid, everything
    else float; and a figure for every INT8 op."""
    from tftpu.interp.similarity import sqnr
    from tftpu.interp.top_interpreter import TopInterpreter
    from tftpu.interp.tpu.info import info_of
    from tftpu.ir import TopModel
    from tftpu.quant.bias_correction import _quantized_weight
    from tftpu.rounding import quantize
    from tftpu.transforms.lowering import lower
    from tftpu.transforms.lowering.search import removal_gains

    model, table, samples = cnn_case
    tpu, report = lower(model, "npu1", "INT8", table)
    int8 = {d.name for d in report.decisions if d.mode == "INT8"}
    gains = removal_gains(model, tpu, samples[:2], int8)
    assert set(gains) == int8 and all(np.isfinite(v) for v in gains.values())
    mm = next(op for op in tpu.ops if op.loc == "o")
    grid = info_of(mm.operands[0].type)
    top_mm = next(op for op in model.ops if op.loc == "o")
    key = top_mm.operands[1].owner.key
    rounded = TopModel(model.module, {**model.weights, key: _quantized_weight(top_mm, model.weights[key])})
    on_grid = lambda name, a: grid.dequantize(quantize(a, grid.scale, grid.zp)) if name == "f" else a  # noqa: E731
    want = np.concatenate([TopInterpreter(model).run(s)["prob"].ravel() for s in samples[:2]])
    got = np.concatenate([TopInterpreter(rounded).run(s, observe=on_grid)["prob"].ravel() for s in samples[:2]])
    assert gains["o"] == pytest.approx(sqnr(want, got), abs=1e-3)

def test_weight_rounding_effects_are_each_convs_weights_alone(cnn_case):
    """What deploy names the convs by: per conv / matmul, the outputs of the float model with only
    that op's weights on their INT8 grid, run whole, against the float outputs; none for others."""
    from tftpu.interp.similarity import sqnr
    from tftpu.interp.top_interpreter import TopInterpreter
    from tftpu.ir import TopModel, top
    from tftpu.quant.bias_correction import _quantized_weight
    from tftpu.transforms.lowering.search import weight_rounding_effects

    model, _, samples = cnn_case
    names = {op.loc for op in model.ops}
    dump = TopInterpreter(model).run(samples[0], dump_all=True)
    effects = weight_rounding_effects(model, names, dump)
    weighted = [op for op in model.ops
                if isinstance(op, (top.Conv, top.MatMul)) and isinstance(op.operands[1].owner, top.Weight)]
    assert set(effects) == {op.loc for op in weighted} and len(effects) >= 2
    want = TopInterpreter(model).run(samples[0])["prob"]
    for op in weighted:
        key = op.operands[1].owner.key
        rounded = TopModel(model.module, {**model.weights, key: _quantized_weight(op, model.weights[key])})
        assert effects[op.loc] == pytest.approx(sqnr(want, TopInterpreter(rounded).run(samples[0])["prob"]), abs=1e-3)
    assert weight_rounding_effects(model, names - {weighted[0].loc}, dump).keys() == set(effects) - {weighted[0].loc}


def test_removal_gains_remembered_by_the_grids_an_op_reads(cnn_case):
    """Gains kept in a memo (a deploy's searches share one) come back the same as measured
    afresh; a program whose grids moved for some ops measures those ops again, and only those."""
    import dataclasses

    from tftpu.transforms.lowering import lower
    from tftpu.transforms.lowering.search import removal_gains

    model, table, samples = cnn_case
    tpu, report = lower(model, "npu1", "INT8", table)
    int8 = {d.name for d in report.decisions if d.mode == "INT8"}
    memo: dict = {}
    first = removal_gains(model, tpu, samples[:2], int8, memo=memo)
    assert first == removal_gains(model, tpu, samples[:2], int8) and len(memo) == len(first)
    assert removal_gains(model, tpu, samples[:2], int8, memo=memo) == first and len(memo) == len(first)
    name = next(iter(table.entries))
    th, lo, hi = table.entries[name]
    wider = dataclasses.replace(table, entries={**table.entries, name: (th * 2, lo * 2, hi * 2)})
    tpu2, _ = lower(model, "npu1", "INT8", wider)
    second = removal_gains(model, tpu2, samples[:2], int8, memo=memo)
    assert second == removal_gains(model, tpu2, samples[:2], int8)
    assert 0 < len(memo) - len(first) < len(first)


def test_isolated_errors_remembered_by_tpu_op(cnn_case):
    """Isolated errors kept in a memo come back the same as measured afresh; a program whose
    grids moved for some ops runs those ops again, and only those."""
    import dataclasses

    from tftpu.transforms.lowering import lower
    from tftpu.transforms.lowering.search import isolated_errors

    model, table, samples = cnn_case
    tpu, report = lower(model, "npu1", "INT8", table)
    int8 = {d.name for d in report.decisions if d.mode == "INT8"}
    memo: dict = {}
    first = isolated_errors(model, tpu, samples[:2], int8, memo=memo)
    assert first == isolated_errors(model, tpu, samples[:2], int8) and len(memo) >= len(first)
    size = len(memo)
    assert isolated_errors(model, tpu, samples[:2], int8, memo=memo) == first and len(memo) == size
    name = next(iter(table.entries))
    th, lo, hi = table.entries[name]
    wider = dataclasses.replace(table, entries={**table.entries, name: (th * 2, lo * 2, hi * 2)})
    tpu2, _ = lower(model, "npu1", "INT8", wider)
    second = isolated_errors(model, tpu2, samples[:2], int8, memo=memo)
    assert second == isolated_errors(model, tpu2, samples[:2], int8) and second != first
    assert 0 < len(memo) - size < size


def test_input_rounding_effects_carry_a_convs_8_bit_input_to_the_outputs():
    """The conv links' measure: per conv, the outputs' noise (over their power) with only that
    conv's input on its calibrated 8-bit grid, the float model after it; a full run with that
    tensor so rounded (read by that conv alone) gives the same."""
    from tftpu.interp.similarity import sqnr
    from tftpu.interp.top_interpreter import TopInterpreter
    from tftpu.quant import params as P
    from tftpu.quant.bias_correction import _fake_quant
    from tftpu.transforms.lowering.search import input_rounding_effects

    model = conv_net([(16, 3), (16, 3), (4, 1)], 3, 16)
    samples = samples_for(model, n=3)
    table = quant.calibrate(model, samples, "mse")
    names = {"c0", "c1", "c2"}
    effects = input_rounding_effects(model, table, False, samples[0], names)
    assert set(effects) == names and all(0 < v < 1 for v in effects.values())
    reads = {"c0": "x", "c1": "c0", "c2": "c1"}
    want = TopInterpreter(model).run(samples[0])[model.output_names[0]]
    for conv, tensor in reads.items():
        grid = P.activation(*table.entries[tensor][:3], asymmetric=False)
        got = TopInterpreter(model).run(samples[0], observe=lambda n, a: _fake_quant(a, grid) if n == tensor else a)
        assert effects[conv] == pytest.approx(10 ** (-sqnr(want, got[model.output_names[0]]) / 10), rel=1e-3)


def test_error_drops_find_where_the_noise_appears(cnn_case):
    """The effect ranking's measure: an op's loss against its inputs, 0 for an exact op, the
    noise it adds roughly additive (linear, not dB), and nothing charged for a folded tensor."""
    from tftpu.interp.top_interpreter import TopInterpreter
    from tftpu.interp.tpu import TpuInterpreter
    from tftpu.transforms.lowering import lower
    from tftpu.transforms.lowering.search import ancestors, error_drops, noise_added

    model, table, samples = cnn_case
    names = {op.loc for op in model.ops}
    ref = [TopInterpreter(model).run(s, dump_all=True) for s in samples[:2]]
    exact = error_drops(model, ref, ref, names)
    assert exact and all(d == (0.0, 0.0) for d in exact.values())
    tpu, report = lower(model, "npu1", "INT8", table, wide_links=False)     # every INT8 output on 8 bits
    got = [TpuInterpreter(tpu).run(s, dump_all=True, dequantize=True) for s in samples[:2]]
    drops = error_drops(model, ref, got, names)
    int8 = [d.name for d in report.decisions if d.mode == "INT8"]
    assert any(drops[n][0] > 1.0 for n in int8)          # INT8 ops lose dB against exact inputs
    assert all(db >= 0 and nsr >= 0 for db, nsr in drops.values())
    # in F16 an op adds far less noise
    first = max(int8, key=lambda n: drops[n][1])
    tpu, _ = lower(model, "npu1", "INT8", table, qtable={first: "F16"}, wide_links=False)
    got = [TpuInterpreter(tpu).run(s, dump_all=True, dequantize=True) for s in samples[:2]]
    assert error_drops(model, ref, got, {first})[first][1] < drops[first][1] / 10
    assert noise_added(30.0, 30.0) == 0.0 and noise_added(60.0, 30.0) == pytest.approx(0.000999, rel=1e-3)
    assert noise_added(25.0, 20.0) > noise_added(60.0, 30.0)
    assert ancestors(model, set(model.output_names)) >= set(int8)
    assert ancestors(model, set()) == set()


def test_flop_shares_and_latency_against_all_int8(cnn_case, tmp_path):
    """The report says how much of the work each mode runs, and what the float ops cost."""
    model, table, samples = cnn_case
    pure = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0],
                  mixed_precision="none")
    assert pure.lowering.flop_shares() == {"INT8": 1.0}
    res = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0],
                 samples=samples[1:], quantize_table={"c1": "F16"}, mixed_precision="0.99,200",
                 mixed_precision_budget=None, mixed_precision_latency=None, report=tmp_path / "r.json",
                 mixed_precision_ranking="isolated")
    shares = res.lowering.flop_shares()
    flops = {op.loc: op.flops() for op in model.ops}
    total = sum(d.flops for d in res.lowering.decisions)
    assert total == sum(flops[d.name] for d in res.lowering.decisions) > 0
    assert shares["F16"] >= flops["c1"] / total and abs(sum(shares.values()) - 1) < 1e-9
    assert "FLOPs:" in str(res.lowering) and "% INT8" in str(res.lowering)
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["flop_shares"] == {m: round(v, 6) for m, v in shares.items()}
    search = res.search
    assert search is not None and search.kept and search.latency_ratio is not None
    # against the all-INT8 program (c1 still pinned to F16 by the table), as its profile estimates it
    pinned = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, quantize_table={"c1": "F16"},
                    mixed_precision="none")
    assert search.latency_ratio == pytest.approx(res.profile.latency_us / pinned.profile.latency_us, rel=1e-12)
    assert "the all-INT8 program" in str(search)
    assert data["mixed_precision"]["latency_vs_all_int8"] == round(search.latency_ratio, 4)


def test_space_to_depth_tensors_get_their_sources_grid(cnn_case):
    """The S2D rewrite comes after calibration: its rearranged input takes the image's range
    (the padding's 0 included), so the stem conv stays INT8 even when what feeds it runs in
    float (the mixed-precision search once crashed there)."""
    model, table, samples = cnn_case
    res = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0],
                 space_to_depth=True, mixed_precision="none")
    assert res.s2d["applied"]
    moved = [d for d in res.lowering.decisions if d.name.startswith("c1_s2d")]
    assert moved and all(d.mode == "INT8" for d in moved)
    assert "c1_s2d" not in table.entries                   # the table given is left as it was
    pinned = {d.name: "F16" for d in moved}                # the rearrangement in float: c1 reads a float
    res = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0],
                 space_to_depth=True, mixed_precision="none", quantize_table=pinned)
    modes = {d.name: d.mode for d in res.lowering.decisions}
    assert modes["c1"] == "INT8" and res.passed


def test_conv_without_a_calibration_entry_declines():
    from tftpu.quant.table import CalibrationTable
    from tftpu.transforms.lowering import lower

    model = cnn()
    table = quant.calibrate(model, samples_for(model), "mse")
    entries = {k: v for k, v in table.entries.items() if k != "c2"}
    _, report = lower(model, "npu1", "INT8", CalibrationTable(entries, "mse"))
    c2 = next(d for d in report.decisions if d.name == "c2")
    assert c2.mode != "INT8" and "no calibration entry for 'c2'" in c2.reason


def test_a_float_budget_caps_the_float_flops(cnn_case):
    """`float_budget`: the ops kept in float never hold more of the model's FLOPs; where the
    target needs more, the search keeps what fits and says the target was missed."""
    from tftpu.transforms.lowering.search import search_mixed_precision

    model, table, samples = cnn_case
    base = {"prob": "F32"}
    flops = {op.loc: op.flops() for op in model.ops}
    total = sum(flops.values())
    pure = search_mixed_precision(model, "npu1", table, samples, "0.99,20", qtable=base).int8_reached[1]
    target = f"0.99,{pure + 3:.2f}"                   # out of pure INT8's reach, within float's
    free = search_mixed_precision(model, "npu1", table, samples, target, qtable=base)
    assert free.kept and free.met
    # room for the table's own float op and the zero-FLOP ones only: the target is then missed
    budget = (flops["prob"] + 0.5 * min(flops[n] for n, _, _ in free.kept if flops[n])) / total
    capped = search_mixed_precision(model, "npu1", table, samples, target, qtable=base, float_budget=budget)
    assert sum(flops[n] for n, _, _ in capped.kept) + flops["prob"] <= budget * total + 1e-9
    assert capped.budget_limited and not capped.met and capped.target == free.target
    assert f"within the budget ({budget:.1%} of the FLOPs in float; " in capped.summary
    assert capped.as_dict()["budget_limited"] is True and capped.as_dict()["float_budget"] == budget
    roomy = search_mixed_precision(model, "npu1", table, samples, target, qtable=base, float_budget=1.0)
    assert not roomy.budget_limited and roomy.qtable == free.qtable
    # the effect ranking grows its float set within the budget too
    grown = search_mixed_precision(model, "npu1", table, samples, target, qtable=base, ranking="effect")
    assert grown.met and grown.kept
    share = sum(flops[n] for n, _, _ in grown.kept) / total
    capped = search_mixed_precision(model, "npu1", table, samples, target, qtable=base, ranking="effect",
                                    float_budget=share / 2)
    assert sum(flops[n] for n, _, _ in capped.kept) + flops["prob"] <= share / 2 * total + 1e-9
    assert capped.budget_limited and not capped.met and "within the budget" in capped.summary
    with pytest.raises(errors.UsageError, match=r"\[0, 1\]"):
        search_mixed_precision(model, "npu1", table, samples, "0.99,60", float_budget=1.5)


def test_a_latency_budget_caps_what_the_float_ops_cost(cnn_case, monkeypatch):
    """`latency_budget`: the program with the ops kept in float is estimated no slower than that
    multiple of the all-INT8 program; where the target needs more, the search keeps what fits
    and says so; deploy reports the ratio it reached."""
    import importlib

    from tftpu.backend import estimate
    from tftpu.quant.links import wide_grids
    from tftpu.transforms.lowering import lower
    from tftpu.transforms.lowering.search import search_mixed_precision

    # no split links here: the all-INT8 program's cast for one is what keeping its Add in F16
    # saves, and on this small model the float ops the search keeps would then cost nothing
    monkeypatch.setattr(importlib.import_module("tftpu.transforms.lowering.lower"), "wide_grids",
                        lambda *a, **k: wide_grids(*a[:4], split=False))

    model, table, samples = cnn_case
    base = {"prob": "F32"}      # the isolated ranking's float set is the one that costs latency on this model

    def latency(m):
        return estimate(m, "npu1").latency_us

    pure = search_mixed_precision(model, "npu1", table, samples, "0.99,20", qtable=base).int8_reached[1]
    target = f"0.99,{pure + 3:.2f}"
    free = search_mixed_precision(model, "npu1", table, samples, target, qtable=base, ranking="isolated")
    all_int8 = latency(lower(model, "npu1", "INT8", table, qtable=base)[0])
    free_ratio = latency(lower(model, "npu1", "INT8", table, qtable=free.qtable)[0]) / all_int8
    assert free.met and free_ratio > 1.01
    cap = 1.0 + (free_ratio - 1.0) / 2
    half = search_mixed_precision(model, "npu1", table, samples, target, qtable=base, ranking="isolated",
                                  latency_budget=cap, latency=latency)
    assert latency(lower(model, "npu1", "INT8", table, qtable=half.qtable)[0]) <= cap * all_int8 * (1 + 1e-9)
    assert half.met != half.budget_limited        # cheaper ops may still reach it; else it says so
    cap = 1.0 + 1e-9                              # no float op is free: none fits, the target is missed
    capped = search_mixed_precision(model, "npu1", table, samples, target, qtable=base, ranking="isolated",
                                    latency_budget=cap, latency=latency)
    assert not capped.kept and capped.budget_limited and not capped.met
    assert f"latency {cap:.2f}x the all-INT8 program's" in capped.summary
    assert capped.as_dict()["latency_budget"] == cap
    roomy = search_mixed_precision(model, "npu1", table, samples, target, qtable=base, ranking="isolated",
                                   latency_budget=100.0, latency=latency)
    assert not roomy.budget_limited and roomy.qtable == free.qtable
    with pytest.raises(errors.UsageError, match="ratio >= 1"):
        search_mixed_precision(model, "npu1", table, samples, target, latency_budget=0.5, latency=latency)
    with pytest.raises(errors.UsageError, match="ratio >= 1"):
        search_mixed_precision(model, "npu1", table, samples, target, latency_budget=1.2)
    # deploy judges latency by the program's profile (layer groups, DMA overlapped), as it reports it
    kw = dict(quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0], samples=samples[1:],
              quantize_table=base, mixed_precision=target, mixed_precision_budget=None)
    free = deploy(model, mixed_precision_latency=None, **kw).search
    assert free.met and free.latency_ratio > 1.0
    cap = 1.0 + (free.latency_ratio - 1.0) / 2
    res = deploy(model, mixed_precision_latency=cap, **kw)
    # (a larger float set can cost less: its casts spared; the one kept fits the cap, or the search says so)
    assert res.search.met != res.search.budget_limited and (res.search.latency_ratio or 1.0) <= cap + 1e-9


def test_the_latency_fit_steps_over_an_op_it_cannot_afford():
    """Under the latency cap the search takes the ranked ops in order, steps over one whose
    float form costs too much, and goes on with the cheaper ones after it (a few times at most)."""
    from tftpu.transforms.lowering.search import LATENCY_SKIPS, _fit_latency

    price = {"a": 1, "b": 1, "big": 50, "c": 2, "huge": 90, "d": 1, "e": 30}
    ranked = [(n, 0.0) for n in price]
    calls = []

    def cost(ops):
        calls.append(len(ops))
        return 100 + sum(price[n] for n, _ in ops)

    fit = _fit_latency(cost, ranked, 110)
    assert [n for n, _ in fit] == ["a", "b", "c", "d"]        # big, huge and e stepped over
    assert cost(fit) <= 110
    assert [n for n, _ in _fit_latency(cost, ranked, 1000)] == list(price)
    # only LATENCY_SKIPS ops are stepped over: after that the fit stops at the next breaker
    many = [(f"x{i}", 0.0) for i in range(LATENCY_SKIPS + 2)] + [("cheap", 0.0)]
    price.update({f"x{i}": 50 for i in range(LATENCY_SKIPS + 2)}, cheap=1)
    assert _fit_latency(cost, many, 110) == []


def test_outputs_are_judged_over_the_samples_pooled():
    """As the mixed-precision search judges them: a sample whose output is near zero (a text map
    of a photo with no text) weighs by its energy; its own figures go in the note."""
    from tftpu.interp.similarity import compare_arrays
    from tftpu.pipelines.verify import _pooled_row

    rng = np.random.default_rng(0)
    big, small = rng.standard_normal((4, 8)), 0.01 * rng.standard_normal((4, 8))
    noise = [0.02 * rng.standard_normal((4, 8)) for _ in range(2)]
    tol = (0.99, 0.9)
    row = _pooled_row("y", (4, 8), [big, small], [big + noise[0], small + noise[1]], tol, 0.0)
    alone = compare_arrays("y", small, small + noise[1], tol)
    assert not alone.passed and row.passed
    assert row.shape == (4, 8)
    pooled = compare_arrays("y", np.concatenate([big.ravel(), small.ravel()]),
                            np.concatenate([(big + noise[0]).ravel(), (small + noise[1]).ravel()]), tol)
    assert (row.cosine, row.sqnr) == (pooled.cosine, pooled.sqnr)
    assert f"worst sample #1 (#0 the test input): cosine {alone.cosine:.6f}" in row.note
    # one sample: the row is that sample's own
    assert _pooled_row("y", (4, 8), [big], [big + noise[0]], tol, 0.0) == compare_arrays("y", big, big + noise[0], tol)
    # a sample the TPU gets structurally wrong fails the row, whatever the others
    bad = _pooled_row("y", (4, 8), [big, small], [big, np.full((4, 8), np.nan)], tol, 0.0)
    assert not bad.passed and "non-finite" in bad.note
    # one value per sample (a face-presence logit): the note names the sample with the largest error
    refs, gots = [np.array([[2.0]]), np.array([[-1.0]]), np.array([[0.5]])], [np.array([[2.1]]), np.array([[-1.5]]), np.array([[0.5]])]
    scalar = _pooled_row("flag", (1, 1), refs, gots, tol, 0.0)
    assert "largest error sample #1 (#0 the test input): -1.5 for -1" in scalar.note


def test_the_float_check_judges_as_the_correction_guard():
    """The search's float ops stay only if they do better on the worse of (pooled, test input
    alone) and not worse on the test input alone unless it stays at the target."""
    from tftpu.pipelines.deploy import _float_ops_fail

    assert _float_ops_fail((14.0, 18.0), (13.0, 17.0), 20.0) is None          # better on both
    assert _float_ops_fail((13.0, 18.0), (13.5, 17.0), 20.0) == (13.0, 13.5)  # worse pooled
    # better pooled, worse on the test input (below the target): all INT8, on the figures that decided
    assert _float_ops_fail((14.0, 15.1), (13.0, 16.7), 20.0) == (15.1, 16.7)
    assert _float_ops_fail((14.0, 21.0), (13.0, 22.0), 20.0) is None          # still at the target


def silu_net(seed: int):
    """conv -> SiLU -> conv -> SiLU -> conv -> HardSwish -> conv: activations that read convs."""
    rng = np.random.default_rng(seed)
    b = TopBuilder("silu")
    x = b.input("x", (1, 4, 8, 8))
    for i, act in enumerate(("SiLU", "SiLU", "HardSwish")):
        x = b.op("Conv", [x, b.weight(f"w{i}", rng.normal(size=(8 if i < 2 else 6, 4 if i == 0 else 8, 3, 3))
                                      .astype(np.float32) * 0.3),
                          b.weight(f"b{i}", rng.normal(size=(8 if i < 2 else 6,)).astype(np.float32) * 0.2)],
                 {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, f"c{i}")
        x = b.op(act, [x], {}, f"a{i}")
    return b.finish([b.op("Conv", [x, b.weight("wo", rng.normal(size=(3, 6, 1, 1)).astype(np.float32) * 0.4),
                                   b.none()], {"kernel_shape": [1, 1]}, "out")])


def test_auto_links_keep_the_interpolated_tables_where_they_do_better(tmp_path):
    """Under wide_links="auto" (the default; conv_links=False: dense convs read 8 bits), given a test input, the program is built once more
    with its activation tables interpolated from 16-bit conv outputs (wide_links="tables"), and
    the one deploy's judge rates better is kept, saying so; without a test input nothing is
    judged, and the links are as wide_links=True makes them."""
    from tftpu.pipelines.deploy import _Judge

    verdicts = []
    for seed in (0, 1, 2):
        model = silu_net(seed)
        samples = samples_for(model, seed=seed)
        table = quant.calibrate(model, samples, "mse")
        kw = dict(quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0], samples=samples[1:],
                  mixed_precision="none", conv_links=False)
        judge = _Judge(model, samples)
        each = {w: deploy(model, wide_links=w, **kw) for w in (True, "tables")}
        assert each[True].tables is None and each["tables"].tables is None      # only auto tries both
        assert each[True].wide_links is True and each["tables"].wide_links == "tables"
        figures = {w: min(judge(d.model)) for w, d in each.items()}
        best = "tables" if figures["tables"] > figures[True] else True
        auto = deploy(model, report=tmp_path / f"r{seed}.json", **kw)
        assert auto.wide_links == best and min(judge(auto.model)) == pytest.approx(figures[best], abs=1e-9)
        assert auto.tables.endswith("not taken") == (best is True) and auto.passed
        data = json.loads((tmp_path / f"r{seed}.json").read_text())
        assert data["interpolated_tables"] == auto.tables and data["wide_links"] == best
        verdicts.append(best)
        blind = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, conv_links=False)
        assert blind.tables is None and blind.wide_links is True
    assert "tables" in verdicts                   # the 8-bit conv outputs cost these nets accuracy
    with pytest.raises(errors.UsageError, match="wide_links"):
        deploy(model, quantize="INT8", chip="npu1", calibration_table=table, wide_links="wide")


def test_all_int8_with_interpolated_tables_may_replace_the_float_ops(monkeypatch):
    """Under wide_links="auto", where the search kept float ops, the program all in INT8 with
    interpolated tables is built as well, and replaces the float ops where it does as the
    float-op check asks (better on the worse of pooled and the test input alone)."""
    import tftpu.transforms.lowering.search as S
    from tftpu.pipelines.deploy import AUTO_TARGET, _float_ops_fail, _Judge
    from tftpu.transforms.lowering.search import parse_target

    chosen = {"a1": "F16"}

    def search(*args, **kwargs):
        return S.MixedPrecisionResult(dict(chosen), [(n, m, 0.0) for n, m in chosen.items()], (0.99, 20.0),
                                      (1.0, 100.0), (0.9, 10.0), 1, 0.0, 2)

    monkeypatch.setattr(S, "search_mixed_precision", search)
    undone = []
    for seed in (0, 1, 2):
        model = silu_net(seed)
        samples = samples_for(model, seed=seed)
        table = quant.calibrate(model, samples, "mse")
        kw = dict(quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0], samples=samples[1:],
                  conv_links=False)
        judge = _Judge(model, samples)
        floated = {w: judge(deploy(model, quantize_table=chosen, mixed_precision="none", wide_links=w, **kw).model)
                   for w in (True, "tables")}
        best = floated["tables"] if min(floated["tables"]) > min(floated[True]) else floated[True]
        int8 = judge(deploy(model, mixed_precision="none", wide_links="tables", **kw).model)
        replaced = _float_ops_fail(best, int8, parse_target(AUTO_TARGET)[1]) is not None
        auto = deploy(model, mixed_precision="auto", **kw)
        assert judge(auto.model) == pytest.approx(int8 if replaced else best, abs=1e-9)
        assert (not auto.search.kept) == replaced and (auto.search.undone is not None) == replaced
        assert auto.tables.endswith("all INT8 with them: " + f"{min(int8):.2f} dB, taken") == replaced
        assert (auto.wide_links == "tables") == (replaced or best is floated["tables"])
        undone.append(replaced)
    assert any(undone)


def gate_net(seed: int, also_out: bool = False):
    """Two convs added, then a Sigmoid (an LSTM-style gate: the table reads an Add, not a conv)
    times a third conv; `also_out`: a conv -> Sigmoid whose conv is itself a model output."""
    rng = np.random.default_rng(seed)
    b = TopBuilder("gate")
    x = b.input("x", (1, 4, 8, 8))

    def conv(name, src, cin=4):
        return b.op("Conv", [src, b.weight(f"w{name}", rng.normal(size=(6, cin, 3, 3)).astype(np.float32) * 0.3),
                             b.weight(f"b{name}", rng.normal(size=(6,)).astype(np.float32) * 0.2)],
                    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, name)

    if also_out:
        c = conv("c", x)
        return b.finish([c, b.op("Sigmoid", [c], {}, "s")])
    gate = b.op("Sigmoid", [b.op("Add", [conv("a", x), conv("b", x)], {}, "add")], {}, "s")
    return b.finish([conv("out", b.op("Mul", [gate, conv("c", x)], {}, "mul"), cin=6)])


def test_tables_are_tried_exactly_where_they_change_a_grid():
    """Under wide_links="auto", the interpolated tables' trial runs where they change a grid of the
    program: a table reading a conv or an Add (an LSTM-style gate), not one whose conv is itself
    a model output (an output keeps its 8-bit grid)."""
    from tftpu.pipelines.deploy import _interpolated
    from tftpu.quant.links import wide_grids

    for make, changes in ((silu_net, True), (gate_net, True), (lambda s: gate_net(s, also_out=True), False)):
        model = make(0)
        samples = samples_for(model, seed=0)
        table = quant.calibrate(model, samples, "mse")
        assert _interpolated(model, table, {}, False) is changes
        if make is gate_net:                    # the Add writes 16 bits only for the interpolated table
            grids = [wide_grids(model, table, False, lambda name: True, tables=t) for t in (False, True)]
            assert "add" not in grids[0] and grids[1]["add"].storage == "i16"
            assert not _interpolated(model, table, {"s": "F16"}, False)   # the Sigmoid in float reads 16 bits anyway
        auto = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0],
                      samples=samples[1:], mixed_precision="none", conv_links=False)
        assert (auto.tables is not None) == changes and auto.passed
        if changes:
            assert "judged" in auto.tables and auto.wide_links in (True, "tables")


def conv_net(layers, cin: int = 8, side: int = 16, seed: int = 0):
    """ReLU convs, `layers` (out channels, kernel) each, over a `side` x `side` image."""
    rng = np.random.default_rng(seed)
    b = TopBuilder("convs")
    y = b.input("x", (1, cin, side, side))
    for i, (cout, k) in enumerate(layers):
        w = rng.normal(size=(cout, cin, k, k)).astype(np.float32) / np.sqrt(k * k * cin)
        y = b.op("Conv", [y, b.weight(f"w{i}", w), b.weight(f"b{i}", rng.normal(size=(cout,)).astype(np.float32))],
                 {"kernel_shape": [k, k], "pads": [k // 2] * 4, "do_relu": i < len(layers) - 1}, f"c{i}")
        cin = cout
    return b.finish([y])


def test_auto_links_read_the_convs_on_16_bits_that_the_chip_affords(tmp_path):
    """Under wide_links="auto", the dense convs read their data on 16 bits (two INT8 passes), the
    cheapest first, as many as keep the all-INT8 program's estimated latency within
    CONV_LINKS_LATENCY of the default links': here the small 1x1 conv after a large 3x3 one (which
    would cost half the program again); where every conv costs too much, none; the program is
    closer to float and the simulator bit-exact; the report and the tool say what and at what
    price; where all INT8 meets the target, or with conv_links=False / --noconv_links, none."""
    from tftpu.pipelines.conv_links import CONV_LINKS_LATENCY
    from tftpu.pipelines.deploy import _Judge

    for layers, cin, side, chosen in (([(128, 3), (128, 3), (8, 1)], 16, 32, ["c2"]), ([(8, 3)] * 3, 8, 16, [])):
        model = conv_net(layers, cin, side)
        samples = samples_for(model, n=3)
        table = quant.calibrate(model, samples, "mse")
        kw = dict(quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0],
                  mixed_precision="0.99,90", mixed_precision_budget=0.0)      # a target all INT8 misses
        reached = deploy(model, **{**kw, "mixed_precision": "none"})   # ... and the default one, which it meets
        assert reached.conv_links.startswith("dense convs read 8 bits: all INT8 reaches") and reached.wide_links is True
        auto = deploy(model, report=tmp_path / "r.json", **kw)
        ratio = float(auto.conv_links.split(" us (")[1].split("x")[0])
        said = f"16-bit inputs to {len(chosen)} of 3 dense convs" if chosen else "no dense conv reads 16 bits"
        assert auto.conv_links.startswith(said) and (ratio <= CONV_LINKS_LATENCY) == bool(chosen) and auto.passed
        assert auto.wide_links == (frozenset(chosen) if chosen else True)
        data = json.loads((tmp_path / "r.json").read_text())
        assert data["conv_links"] == auto.conv_links and data["wide_links"] == (chosen or True)
        assert [d.name for d in auto.lowering.decisions if d.reason.startswith("16-bit input")] == chosen
        if chosen:      # nothing fits in float (budget 0), so the 16-bit inputs reach more than the 8-bit ones
            assert auto.conv_links.endswith("16-bit inputs kept")
            assert all(r["bit_exact"] for r in auto.simulator["outputs"])
            judge = _Judge(model, samples[:1])
            narrow = deploy(model, conv_links=False, **kw)
            assert narrow.conv_links is None and narrow.wide_links is True
            assert min(judge(auto.model)) > min(judge(narrow.model))
            every = deploy(model, wide_links="convs", **kw)       # what the limit kept out
            assert every.profile.latency_us > CONV_LINKS_LATENCY * narrow.profile.latency_us
            top_path, _ = model.save(tmp_path / "convs.top.mlir")
            table.save(tmp_path / "cali")
            np.savez(tmp_path / "x.npz", **samples[0])
    args = ("deploy", f"--mlir={top_path}", "--quantize=INT8", "--chip=npu1", f"--calibration_table={tmp_path / 'cali'}",
            f"--test_input={tmp_path / 'x.npz'}", "--mixed_precision=0.99,90", "--mixed_precision_budget=0")
    done, off = _tool(*args), _tool(*args, "--noconv_links")
    assert done.returncode == 0 and off.returncode == 0, done.stderr + off.stderr
    assert "wide links: 16-bit inputs to 1 of 3 dense convs (two INT8 passes" in done.stdout
    assert "1 conv(s) read a 16-bit link in two INT8 passes: c2" in done.stdout
    assert "dense convs" not in off.stdout and "two INT8 passes" not in off.stdout


def test_auto_links_give_way_to_float_ops_that_need_their_latency(monkeypatch):
    """Where the dense convs' 16-bit inputs leave the float ops too little of the latency budget to
    reach the target (priced here at the whole budget, 1.15x the 8-bit-input program), the search runs once more
    with 8-bit conv inputs and the whole budget, and the float set that reaches more is lowered."""
    import tftpu.pipelines.deploy as deploying
    import tftpu.pipelines.conv_links as pricing

    model = conv_net([(128, 3), (128, 3), (8, 1)], 16, 32)
    samples = samples_for(model, n=3)
    table = quant.calibrate(model, samples, "mse")
    kw = dict(quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0],
              mixed_precision="0.99,40", mixed_precision_budget=None)
    cheap = deploy(model, **kw)                 # c2 reads 16 bits, then runs in float: the target met
    assert cheap.wide_links == frozenset({"c2"}) and cheap.search.met and "8-bit conv inputs" not in cheap.conv_links
    priced = pricing.ConvLinks.within

    def dear(self, limit):
        links, note, int8_us, _ = priced(self, limit)
        return links, note, int8_us, int8_us * deploying.LATENCY_BUDGET
    monkeypatch.setattr(pricing.ConvLinks, "within", dear)
    made, real = [], deploying.References
    monkeypatch.setattr(deploying, "References", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    given = deploy(model, **kw)
    assert len(made) == 1       # TOP on the test input and samples, once for the conv links, both searches, the judge
    assert given.wide_links is True and given.conv_links.endswith("8-bit conv inputs kept")
    assert given.search.met and [k[0] for k in given.search.kept] == ["c2"] and given.passed
    assert given.search.latency_ratio <= deploying.LATENCY_BUDGET
    assert not [d for d in given.lowering.decisions if d.reason.startswith("16-bit input")]


def test_all_int8_tries_the_whole_latency_budget_on_conv_links(monkeypatch):
    """Where no float op runs in the end (mixed_precision="none", or the search's float ops undone
    by the float check) and all INT8 misses the target, the program is built once more with the
    dense convs' 16-bit inputs priced at the whole latency budget (`mixed_precision_latency`,
    1.15x) rather than CONV_LINKS_LATENCY (1.10x, which leaves a share to the float ops), with the
    correction the first took, and the better kept: here each conv's 16-bit input costs 4.5%
    (priced so), so the links take two of the three convs and the whole budget all three."""
    import tftpu.pipelines.deploy as deploying
    import tftpu.pipelines.conv_links as pricing

    model = conv_net([(128, 3), (128, 3), (8, 1)], 16, 32)
    samples = samples_for(model, n=4)
    table = quant.calibrate(model, samples, "mse")
    monkeypatch.setattr(pricing.ConvLinks, "latency", lambda self, k: self.us[0] * (1 + 0.045 * k))
    monkeypatch.setattr(deploying, "AUTO_TARGET", "0.99,90")      # (the target pure INT8's links are priced for)
    kw = dict(quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0], samples=samples[1:],
              mixed_precision="0.99,90", mixed_precision_budget=None, weight_refit=True, bias_correction=True)

    def check(result):
        assert result.conv_links.startswith("16-bit inputs to 2 of 3 dense convs") and "limit 1.10x" in result.conv_links
        said = result.conv_links.split("; all INT8 with the whole latency budget, ")[1]
        assert said.startswith("16-bit inputs to 3 of 3 dense convs") and "limit 1.15x): judged " in said
        theirs, mine = said.split("judged ")[1].split(" dB on the weights lowered against ")
        theirs, mine = float(theirs), float(mine.split(" dB")[0])
        taken = said.endswith("taken") and not said.endswith("not taken")
        assert taken == (result.wide_links == "convs") and (not taken or theirs > mine)
        assert not [d for d in result.lowering.decisions if d.mode != "INT8"] and result.passed
        assert all(r["bit_exact"] for r in result.simulator["outputs"])

    check(deploy(model, **{**kw, "mixed_precision": "none"}))
    monkeypatch.setattr(deploying, "_float_ops_fail", lambda mixed, all_int8, target: (min(mixed), min(all_int8)))
    undone = deploy(model, **kw)                   # the search's float ops undone
    assert undone.search is not None and not undone.search.kept
    check(undone)


def test_the_whole_latency_budget_is_weighed_against_float_ops_that_miss_the_target(monkeypatch):
    """Where the search's float ops are kept (the float check holds them) and the program still
    misses the target, all INT8 with the dense convs' 16-bit inputs priced at the whole latency
    budget is built too and weighed against the float ops as the float check weighs all INT8:
    where it does better, it is taken and the float ops undone (the full palm detector: 19.6 ->
    21.9 dB on its held-out photo)."""
    import tftpu.pipelines.deploy as deploying
    import tftpu.pipelines.conv_links as pricing

    model = conv_net([(128, 3), (128, 3), (8, 1)], 16, 32)
    samples = samples_for(model, n=4)
    table = quant.calibrate(model, samples, "mse")
    monkeypatch.setattr(pricing.ConvLinks, "latency", lambda self, k: self.us[0] * (1 + 0.045 * k))
    monkeypatch.setattr(deploying, "AUTO_TARGET", "0.99,90")
    weighed = []

    def fail(mixed, all_int8, target):             # the float check keeps the float ops; the whole budget wins
        weighed.append((mixed, all_int8))
        return None if len(weighed) == 1 else (min(mixed), min(all_int8))

    monkeypatch.setattr(deploying, "_float_ops_fail", fail)
    result = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0],
                    samples=samples[1:], mixed_precision="0.99,90", mixed_precision_budget=None,
                    weight_refit=True, bias_correction=True)
    assert len(weighed) == 2
    said = result.conv_links.split("; all INT8 with the whole latency budget, ")[1]
    assert said.startswith("16-bit inputs to 3 of 3 dense convs") and said.endswith("with the float ops, taken")
    assert result.search is not None and not result.search.kept
    assert result.search.undone == (min(weighed[1][0]), min(weighed[1][1]))
    assert result.wide_links == "convs" and result.passed
    assert not [d for d in result.lowering.decisions if d.mode != "INT8"]
    assert all(r["bit_exact"] for r in result.simulator["outputs"])


def test_corrections_computed_ahead_give_the_same_program(monkeypatch):
    """The duel's rival corrections and the trials' refits whose inputs are known once the first
    program is built (the float check's, the whole latency budget's) run on workers ahead of the
    build that takes them (`deploy._Ahead`): the program, its weights and every verdict are the
    ones made with each correction computed in its turn, and those built ahead are taken."""
    import tftpu.pipelines.deploy as deploying
    import tftpu.pipelines.conv_links as pricing

    model = conv_net([(128, 3), (128, 3), (8, 1)], 16, 32)
    samples = samples_for(model, n=4)
    table = quant.calibrate(model, samples, "mse")
    monkeypatch.setattr(pricing.ConvLinks, "latency", lambda self, k: self.us[0] * (1 + 0.045 * k))
    monkeypatch.setattr(deploying, "AUTO_TARGET", "0.99,90")
    monkeypatch.setattr(deploying, "_float_ops_fail", lambda mixed, all_int8, target: None)   # float ops kept
    taken = []
    take = deploying._Ahead.take

    def counted(self, key, compute):
        taken.append(key in self.futures)
        return take(self, key, compute)

    monkeypatch.setattr(deploying._Ahead, "take", counted)

    def run(workers):
        taken.clear()
        monkeypatch.setattr(deploying, "AHEAD_WORKERS", workers)
        monkeypatch.setattr(deploying, "pool_size", lambda: 2)      # (on a one-core machine too)
        result = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0],
                        samples=samples[1:], mixed_precision="0.99,90", mixed_precision_budget=None,
                        weight_refit=True, bias_correction=True)
        weights = {k: np.asarray(v).tobytes() for k, v in result.model.weights.items()}
        return result, weights, list(taken)

    alone, alone_weights, alone_taken = run(0)
    ahead, ahead_weights, ahead_taken = run(2)
    assert not any(alone_taken) and sum(ahead_taken) >= 3          # the duel's two rivals, a trial's refit
    assert len(ahead_taken) == len(alone_taken)
    assert ahead_weights == alone_weights
    assert str(ahead.bias_correction) == str(alone.bias_correction) and ahead.conv_links == alone.conv_links
    assert [k[0] for k in ahead.search.kept] == [k[0] for k in alone.search.kept]
    assert [(d.name, d.mode) for d in ahead.lowering.decisions] == [(d.name, d.mode) for d in alone.lowering.decisions]


def test_ahead_computes_in_turn_what_no_worker_started():
    """`_Ahead.take` returns the result computed ahead under its key, or computes it there (no
    worker, nothing submitted, or not started yet); the BLAS thread limit it held is given back."""
    import threading
    from threadpoolctl import threadpool_info
    from tftpu.pipelines.deploy import _Ahead

    before = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    with _Ahead(0) as off:
        off.submit("a", lambda: 1)
        assert off.take("a", lambda: 2) == 2
    gate, ran = threading.Event(), []
    with _Ahead(1) as on:
        assert all(i["num_threads"] == 1 for i in threadpool_info() if i["user_api"] == "blas")
        on.submit("slow", lambda: gate.wait(10) and ran.append("slow") or "ahead")
        on.submit("queued", lambda: ran.append("queued") or "ahead")   # behind "slow" on the one worker
        assert on.take("queued", lambda: "in turn") == "in turn"       # not started: computed here
        assert on.take("other", lambda: "in turn") == "in turn"
        gate.set()
        assert on.take("slow", lambda: "in turn") == "ahead"
    assert ran == ["slow"]
    assert [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"] == before


def test_auto_links_read_the_model_input_on_16_bits_where_the_stem_costs_little(tmp_path):
    """Under wide_links="auto", the convs reading the model input read it on 16 bits (two INT8
    passes) where that keeps the all-INT8 program's estimated latency within INPUT_LINKS_LATENCY:
    a 3-channel stem before wide convs does, even without a test input (pure INT8 too); its price
    counts against the 8-bit program (int8_latency_us); the simulator stays bit-exact; the report
    says so. A stem that is most of the program keeps the 8-bit input; wide_links=True never reads 16 bits."""
    from tftpu.pipelines.conv_links import INPUT_LINKS_LATENCY
    from tftpu.quant.links import InputConvs

    model = conv_net([(8, 3), (64, 3), (64, 3), (8, 1)], 3, 64)
    samples = samples_for(model, n=3)
    table = quant.calibrate(model, samples, "mse")
    kw = dict(quantize="INT8", chip="npu1", calibration_table=table, mixed_precision="none")
    auto = deploy(model, test_input=samples[0], report=tmp_path / "r.json", **kw)
    assert isinstance(auto.wide_links, InputConvs) and auto.wide_links == {"c0"}
    assert auto.conv_links.startswith("the model input read on 16 bits by 1 conv (two INT8 passes)")
    ratio = float(auto.conv_links.split("latency ")[1].split("x")[0])
    assert ratio <= INPUT_LINKS_LATENCY and auto.profile.latency_us <= INPUT_LINKS_LATENCY * auto.int8_latency_us
    assert [d.name for d in auto.lowering.decisions if d.reason.startswith("16-bit input")] == ["c0"]
    assert all(r["bit_exact"] for r in auto.simulator["outputs"]) and auto.passed
    assert json.loads((tmp_path / "r.json").read_text())["wide_links"] == {"input_convs": ["c0"]}
    blind = deploy(model, **kw)                          # no test input: the same price, the same links
    assert blind.wide_links == auto.wide_links
    assert deploy(model, wide_links=True, **kw).wide_links is True
    stem = conv_net([(64, 3), (8, 1)], 3, 32)            # the stem is the program: 8 bits
    stem_table = quant.calibrate(stem, samples_for(stem, n=2), "mse")
    assert deploy(stem, **{**kw, "calibration_table": stem_table}).wide_links is True


def test_a_dear_input_link_is_taken_where_it_lifts_all_int8(monkeypatch):
    """Priced over INPUT_LINKS_LATENCY, the model input's 16-bit reads are taken only where all
    INT8 misses the target and they lift it by INPUT_LINKS_GAIN dB (here any lift, then none
    enough) within the latency budget: the note says why, the float ops' latency is held to what
    is left of the budget against the 8-bit input's program, the simulator stays bit-exact;
    without a test input or samples to judge with, 8 bits."""
    import tftpu.pipelines.deploy as deploying
    import tftpu.pipelines.conv_links as pricing
    from tftpu.quant.links import InputConvs

    model = conv_net([(8, 3), (64, 3), (64, 3), (8, 1)], 3, 64)
    samples = samples_for(model, n=3)
    table = quant.calibrate(model, samples, "mse")
    kw = dict(quantize="INT8", chip="npu1", calibration_table=table, mixed_precision="0.99,90",
              mixed_precision_budget=0.0)
    monkeypatch.setattr(pricing, "INPUT_LINKS_LATENCY", 1.0)
    monkeypatch.setattr(pricing, "INPUT_LINKS_GAIN", -100.0)
    dear = deploy(model, test_input=samples[0], samples=samples[1:], **kw)
    assert "c0" in dear.wide_links and [d.name for d in dear.lowering.decisions
                                         if d.reason.startswith("16-bit input")][:1] == ["c0"]
    note = dear.conv_links.split(";")[0]
    assert note.startswith("the model input read on 16 bits by 1 conv") and "below the 90 dB target" in note
    ratio = float(note.split("latency ")[1].split("x")[0])
    assert 1.0 < ratio <= deploying.LATENCY_BUDGET
    assert dear.profile.latency_us <= deploying.LATENCY_BUDGET * dear.int8_latency_us * (1 + 1e-9)
    assert all(r["bit_exact"] for r in dear.simulator["outputs"])
    assert deploy(model, **{**kw, "mixed_precision": "none"}).wide_links is True      # nothing to judge with
    monkeypatch.setattr(pricing, "INPUT_LINKS_GAIN", 1000.0)
    kept = deploy(model, test_input=samples[0], samples=samples[1:], **kw)
    assert not isinstance(kept.wide_links, InputConvs) and "model input" not in (kept.conv_links or "")


def test_beyond_range_names_the_tensors_an_unlike_test_input_takes_past_their_grids():
    """Where the program misses: the test input's tensors 2x or more past their calibrated 8-bit
    grid (either end), furthest first; a range clipped to its saturating readers is left out."""
    from tftpu.pipelines.deploy import DeployResult, _beyond
    from tftpu.quant.table import CalibrationTable

    calibrated = CalibrationTable({"a": (1.0, -1.0, 1.0), "b": (2.0, 0.0, 2.0), "c": (1.0, -1.0, 1.0),
                                   "d": (1.0, -1.0, 1.0), "e": (1.0, -1.0, 1.0)})
    clipped = CalibrationTable({**calibrated.entries, "d": (0.5, -0.5, 0.5)})
    dump = {"a": np.array([0.5, 3.0], np.float32), "b": np.array([0.0, 3.0], np.float32),
            "c": np.array([-5.0, 0.2], np.float32), "d": np.array([10.0], np.float32),
            "e": np.array([-1.9, 1.9], np.float32)}
    rows = _beyond(dump, calibrated, clipped, asymmetric="auto")
    # c: -5 against the grid's -128/127; a: 3 against 1; b (one-sided, 0..2) 1.5x and e 1.9x are
    # within 2x; d's readers saturate past its clipped range
    assert [(n, v) for n, v, _ in rows] == [("c", -5.0), ("a", 3.0)]
    assert rows[0][2] == pytest.approx(-128 / 127) and rows[1][2] == pytest.approx(1.0)
    line = DeployResult(model=None, lowering=None, tolerance=(0.8, 0.5), beyond_of=lambda: rows).range_line
    assert line.startswith("the test input goes 2x or more beyond the calibrated range of 2 tensor(s), up to 5.0x: "
                           "c -5 against -1.008, a 3 against 1")
    assert DeployResult(model=None, lowering=None, tolerance=(0.8, 0.5)).range_line is None


def test_a_missed_target_names_what_an_unlike_test_input_takes_past_its_grids(tmp_path):
    """deploy on a test input 8x louder than its calibration samples: where the program misses,
    the result and the report name the tensors it takes past their grids (the tool prints it); on
    a test input like the samples, nothing."""
    import json

    from tftpu.pipelines.deploy import deploy

    model = conv_net([(8, 3), (4, 1)], 3, 12)
    samples = samples_for(model, n=4)
    table = quant.calibrate(model, samples, "mse")
    loud = {k: v * 8 for k, v in samples[0].items()}
    kw = dict(quantize="INT8", chip="npu1", calibration_table=table, samples=samples[1:],
              mixed_precision="0.99,90", mixed_precision_budget=0.0)
    missed = deploy(model, test_input=loud, report=tmp_path / "r.json", **kw)
    assert min(missed.judged) < 90
    assert [n for n, _, _ in missed.beyond_range][:1] in (["x"], ["c0"], ["c1"])
    assert all(abs(v) >= 2 * abs(b) for _, v, b in missed.beyond_range)
    assert "beyond the calibrated range" in missed.range_line
    assert json.loads((tmp_path / "r.json").read_text())["beyond_range"]["line"] == missed.range_line
    alike = deploy(model, test_input=samples[0], **kw)
    assert min(alike.judged) < 90 and alike.beyond_range == [] and alike.range_line is None


def test_beyond_range_leaves_out_the_tensors_the_program_holds_in_float():
    """Only tensors an INT8 op writes or reads are on a grid the test input can pass: a float
    decode tail's are named by no range line, however far past their calibration they go."""
    from tftpu.ir import top
    from tftpu.ir.base import value_name
    from tftpu.pipelines.deploy import _beyond, _int8_tensors
    from tftpu.quant.table import CalibrationTable

    model = conv_net([(8, 3), (4, 1)], 3, 12)
    names = [value_name(op.results[0]) for op in model.ops if isinstance(op, top.Conv)]
    calibrated = CalibrationTable({n: (1.0, -1.0, 1.0) for n in names})
    dump = {n: np.array([-9.0, 9.0], np.float32) for n in names}
    first = next(op.loc for op in model.ops if isinstance(op, top.Conv))
    held = _int8_tensors(model, {first})
    assert names[0] in held and names[1] not in held
    assert [n for n, _, _ in _beyond(dump, calibrated, calibrated, "auto", held)] == [names[0]]
    assert sorted(n for n, _, _ in _beyond(dump, calibrated, calibrated, "auto")) == sorted(names)


@pytest.mark.parametrize("latency", [float("nan"), 0.5, -1.0, "1.2"])
def test_a_latency_budget_that_is_not_a_ratio_of_at_least_one_is_refused(latency):
    """mixed_precision_latency NaN (which every comparison let through as 1.00x), under 1, or not a
    number: a UsageError naming it, before any work."""
    model = conv_net([(8, 3), (4, 1)], 3, 12)
    with pytest.raises(errors.UsageError, match="mixed_precision_latency=.*expected a ratio >= 1"):
        deploy(model, quantize="INT8", chip="npu1", calibration_table=None, mixed_precision_latency=latency)


@pytest.mark.parametrize("mode", ["BF16", "F16", "INT8"])
def test_the_report_prices_a_conv_that_makes_a_model_output(tmp_path, mode):
    """A conv whose result is a model output (its f32 cast takes its name): the report's op row is
    the conv with its own cycles, and the rewritten stem is priced, in every mode."""
    import json

    rng = np.random.default_rng(0)
    b = TopBuilder("stem")
    x = b.input("x", (1, 3, 32, 32))
    y = b.op("Conv", [x, b.weight("w", rng.normal(size=(8, 3, 3, 3)).astype(np.float32)),
                      b.weight("b", rng.normal(size=(8,)).astype(np.float32))],
             {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, "y")
    model = b.finish([y])
    table = quant.calibrate(model, samples_for(model, n=2), "mse") if mode == "INT8" else None
    deploy(model, quantize=mode, chip="npu1", calibration_table=table, space_to_depth=True,
           report=tmp_path / "r.json")
    report = json.loads((tmp_path / "r.json").read_text())
    row = next(o for o in report["ops"] if o["name"] == "y")
    assert row["type"] == "tpu.Conv" and row["cycles"] > 0
    assert report["s2d"]["applied"] and all(c > 0 for c in report["s2d"]["first_conv_cycles"])
