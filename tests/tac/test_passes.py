"""Annotate, raise, views, costs and pick on models built with TF's converter."""

import json
import re

import numpy as np
import pytest

import tftpu.tac as tac
from tftpu.tac import tflite_io
from tftpu.tac.graph import Graph
from tftpu.tac.passes.annotate import annotate
from tftpu.tac.passes.pick import brute_force
from tftpu.tac.passes.raise_subgraphs import raise_subgraphs
from tests.tac import models


@pytest.fixture(scope="module")
def seed_example():
    """The seed's example: add(relu6), mul(relu6), add(relu6) on GPU; pack on CPU."""
    tf = models._tf()

    def fn(a0, a1, a2, a3):
        x = tf.nn.relu6(tf.nn.relu6(a0 + a1) * a2)
        y = tf.nn.relu6(a0 + a3)
        return tf.stack([x, y], axis=0)

    return models.convert(fn, [(1,)] * 4)


def test_device_order_cpu_last():
    assert [h.name for h in tac.resolve_devices(["CPU", "GPU"])] == ["GPU", "CPU"]
    assert [h.name for h in tac.resolve_devices("nnapi,gpu")] == ["NNAPI", "GPU", "CPU"]
    assert [h.name for h in tac.resolve_devices(["GPU", "GPU"])] == ["GPU", "CPU"]


def test_annotate_and_raise_seed_example(seed_example):
    graph = Graph(tflite_io.read(seed_example))
    devices = tac.resolve_devices(["GPU", "CPU"])
    ann = annotate(graph, devices)
    by_op = {n.op_type: a.device for n, a in zip(graph.nodes, ann)}
    assert by_op == {"ADD": "GPU", "MUL": "GPU", "PACK": "CPU"}
    subs = raise_subgraphs(graph, ann)
    assert [s.name for s in subs] == ["func_0_GPU_FLOAT", "func_1_CPU_FLOAT"]
    assert sorted(graph.nodes[i].op_type for i in subs[0].nodes) == ["ADD", "ADD", "MUL"]
    # every op once, and an execution order
    order = [i for s in subs for i in s.nodes]
    assert sorted(order) == list(range(len(graph.nodes)))
    produced = set(graph.inputs)
    for i in order:
        n = graph.nodes[i]
        assert all(t in produced or graph.is_const(t) for t in n.inputs if t >= 0)
        produced.update(n.outputs)


def test_views_of_seed_example(seed_example):
    result = tac.run(seed_example, device_specs=["GPU", "CPU"])
    part = result.partitions[0]
    pack_views = {v.device: v for v in part.views[1]}
    assert set(pack_views) == {"CPU", "GPU"}
    assert pack_views["GPU"].lowerings["LowerPackIntoConcatReshape"] == 1
    assert {n.op_type for n in pack_views["GPU"].nodes} == {"RESHAPE", "CONCATENATION"}
    assert all(n.op_type == "PACK" for n in pack_views["CPU"].nodes)
    assert part.picked.cost == pytest.approx(brute_force(part.problem).cost)
    out = result.tflite()
    for seed in range(3):
        assert all(np.array_equal(a, b) for a, b in zip(models.run_tflite(seed_example, seed=seed),
                                                          models.run_tflite(out, seed=seed)))


def test_mlir_output(seed_example):
    from xdsl.context import Context
    from xdsl.dialects.builtin import Builtin
    from xdsl.dialects.func import Func
    from xdsl.parser import Parser

    result = tac.run(seed_example, device_specs=["GPU", "CPU"])
    inline, raised = result.mlir(True), result.mlir(False)
    picked = [v.device for v in result.partitions[0].chosen()]
    devices = re.findall(r'"tfl\.\w+"\(.*tac\.device = "(\w+)"', inline)
    assert len(devices) == len(result.op_devices()) and set(devices) == set(picked)
    assert 'tac.inference_type = "FLOAT"' in inline and 'tac.device = "GPU"' in raised
    assert '"tfl.pack"' in inline or '"tfl.concatenation"' in inline
    assert "func.call" not in inline
    names = re.findall(r"func\.func private @(\w+)", raised)
    assert {"func_0_GPU_FLOAT", "func_0_CPU_FLOAT", "func_1_CPU_FLOAT", "func_1_GPU_FLOAT"} <= set(names)
    assert raised.count('"func.call"') == 2 and 'tac.interface_name = "func_1"' in raised
    for text in (inline, raised):
        ctx = Context(allow_unregistered=True)
        ctx.load_dialect(Builtin)
        ctx.load_dialect(Func)
        Parser(ctx, text).parse_module().verify()


@pytest.mark.parametrize("name", ["mixed", "mixed_fp16", "chain", "hybrid"])
def test_pick_is_optimal_and_beats_baselines(model_bytes, name):
    result = tac.run(model_bytes(name), device_specs=("GPU", "CPU"))
    for part in result.partitions.values():
        assert part.picked.exact
        if len(part.subgraphs) <= 12:
            assert part.picked.cost == pytest.approx(brute_force(part.problem).cost)
        assert part.picked.cost <= part.greedy.cost + 1e-9
        assert part.picked.cost <= part.annotated_cost + 1e-9
        assert part.picked.cost <= part.plan_cost("CPU") + 1e-9
    rep = result.report
    assert rep["cost_us"]["picked"] <= rep["cost_us"]["all_CPU"]
    json.dumps(rep)


def test_int8_model_on_nnapi(model_bytes):
    data = model_bytes("mixed_int8")
    gpu = tac.run(data, device_specs=("GPU", "CPU"))
    funcs = gpu.report["subgraphs"][0]["functions"]
    int8 = [f for f in funcs if f["name"].endswith("_CPU_QUANTIZED_INT8")]
    assert sum(f["ops"] for f in int8) >= 10
    for f in int8:  # GPU is float only
        assert [v["device"] for v in f["views"]] == ["CPU"] and f["dropped"][0]["device"] == "GPU"
    nnapi = tac.run(data, device_specs=("NNAPI", "CPU"))
    ann = nnapi.partitions[0].annotation
    assert sum(a.device == "NNAPI" for a in ann) >= len(ann) // 2
    for seed in range(2):
        for a, b in zip(models.run_tflite(data, seed=seed), models.run_tflite(nnapi.tflite(), seed=seed)):
            assert np.array_equal(a, b)


def test_custom_and_control_flow_stay_on_cpu(model_bytes):
    custom = tac.run(model_bytes("custom"), device_specs=("GPU", "NNAPI", "CPU"))
    ops = custom.op_devices()
    assert ops[0]["type"] == "BesselI1e" and ops[0]["device"] == "CPU"
    loop = tac.run(model_bytes("while"), device_specs=("GPU", "CPU"))
    from tftpu.tac import export

    meta = export.get_metadata(loop.model)
    assert [s["index"] for s in meta["subgraphs"]] == [0, 1, 2]
    assert all(op[1] == "CPU" for s in meta["subgraphs"][1:] for op in s["ops"])
    assert loop.op_devices()[0]["type"] == "WHILE" and loop.op_devices()[0]["device"] == "CPU"
    for a, b in zip(models.run_tflite(model_bytes("while")), models.run_tflite(loop.tflite())):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("name", ["mixed", "chain"])
def test_deterministic(model_bytes, name):
    data = model_bytes(name)
    a, b = tac.run(data), tac.run(data)
    assert a.tflite() == b.tflite()
    assert a.mlir(False) == b.mlir(False)
    assert json.dumps(a.report) == json.dumps(b.report)


def test_metadata_records_every_op(model_bytes):
    result = tac.run(model_bytes("chain"))
    ops = result.op_devices()
    model = tflite_io.read(result.tflite())
    graph = Graph(model)
    assert [n.op_type for n in graph.nodes] == [o["type"] for o in ops]
    assert all(o["device"] in ("GPU", "CPU") and re.fullmatch(r"func_\d+_(GPU|CPU)_FLOAT", o["function"])
               for o in ops)
    # re-running on the output replaces the metadata instead of stacking it
    again = tac.run(result.tflite())
    names = [m.name for m in again.model.metadata]
    assert names.count(b"tftpu.tac") == 1


def test_path_and_bytes_agree(model_bytes, tmp_path):
    data = model_bytes("chain")
    path = tmp_path / "m.tflite"
    path.write_bytes(data)
    a, b = tac.run(path), tac.run(data)
    assert a.tflite() == b.tflite()
    a.save(tmp_path / "o.tflite")
    assert (tmp_path / "o.tflite").read_bytes() == a.tflite()
    assert a.report["model"] == str(path) and b.report["model"] == "<tflite bytes>"


def test_control_flow_never_leaves_cpu_even_for_permissive_plugins(model_bytes):
    class Anything(tac.SimpleHardware):
        name = "ANYTHING"

        def advantage_over_cpu(self):
            return 100.0

    result = tac.run(model_bytes("while"), device_specs=[Anything()])
    ops = result.op_devices()
    assert ops[0]["type"] == "WHILE" and ops[0]["device"] == "CPU"
    part = result.partitions[0]
    assert any("control flow" in d.reason for ds in part.dropped for d in ds)


@pytest.mark.parametrize("specs", [("GPU", "CPU"), ("NNAPI", "GPU", "CPU"), ("NNAPI", "CPU")])
@pytest.mark.parametrize("name", ["mixed", "mixed_fp16", "mixed_int8", "hybrid", "while", "sparse", "chain"])
def test_converted_models_run_identically(model_bytes, name, specs):
    data = model_bytes(name)
    result = tac.run(data, device_specs=specs)
    for part in result.partitions.values():
        assert part.picked.cost <= part.greedy.cost + 1e-9
    for seed in range(2):
        ref, got = models.run_tflite(data, seed=seed), models.run_tflite(result.tflite(), seed=seed)
        assert len(ref) == len(got)
        for a, b in zip(ref, got):
            assert a.dtype == b.dtype and np.array_equal(a, b)


def test_tac_stages_are_passes_with_decisions():
    """TAC runs as the pipeline annotate, raise-subgraphs, alternative-views, compute-costs,
    pick-subgraphs; each stage says what it did and why."""
    from tftpu.tac.passes.pipeline import TAC_PASSES, pipeline

    assert set(TAC_PASSES.passes()) == {"annotate", "raise-subgraphs", "alternative-views", "compute-costs",
                                        "pick-subgraphs"}
    assert [p.spec() for p in TAC_PASSES.parse(pipeline(1000))][-1] == "pick-subgraphs{max_states=1000}"
    from tests.tac.models import mixed
    from tftpu import tac

    result = tac.run(mixed(), device_specs=("GPU", "CPU"))
    part = result.partitions[0]
    assert [r.name for r in part.passes] == ["annotate", "raise-subgraphs", "alternative-views", "compute-costs",
                                              "pick-subgraphs"]
    pick = part.passes[-1]
    assert any("vs greedy" in d.reason for d in pick.decisions)
    assert {d.where for d in part.passes[0].decisions} <= {"GPU", "CPU"}
