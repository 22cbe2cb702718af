"""Hardware models: op support modelled on the delegates, costs from shapes, YAML configs, plug-ins."""

import shutil

import numpy as np
import pytest

import tftpu.tac as tac
from tftpu import errors
from tftpu.tac import tflite_io
from tftpu.tac.graph import Graph
from tftpu.tac.hardware import config, opcost, registry
from tests.tac import models


@pytest.fixture(scope="module")
def mixed_graph(model_bytes):
    return Graph(tflite_io.read(model_bytes("mixed")))


def test_builtin_devices():
    assert {"CPU", "GPU", "NNAPI"} <= set(tac.hardware_names())
    for name in ("cpu", "GPU", "Nnapi"):
        assert tac.get_hardware(name).name == name.upper()


def test_gpu_support_modelled_on_delegate(mixed_graph, model_bytes):
    gpu, cpu = tac.get_hardware("GPU"), tac.get_hardware("CPU")
    support = {n.op_type: gpu.is_op_supported(n) for n in mixed_graph.nodes}
    assert support["CONV_2D"] and support["RELU6"] and support["MEAN"] and support["FULLY_CONNECTED"]
    for op in ("SPLIT", "SPLIT_V", "SUB", "SQUARED_DIFFERENCE", "PACK"):
        assert not support[op], op
    assert all(cpu.is_op_supported(n) for n in mixed_graph.nodes)
    int8 = Graph(tflite_io.read(model_bytes("mixed_int8")))
    assert not any(gpu.is_op_supported(n) for n in int8.nodes if n.op_type == "CONV_2D")
    assert any(tac.get_hardware("NNAPI").is_op_supported(n) for n in int8.nodes if n.op_type == "CONV_2D")
    selfie = Graph(tflite_io.read(model_bytes("selfie")))
    custom = [n for n in selfie.nodes if n.name == "CUSTOM"]
    assert custom and all(gpu.is_op_supported(n) for n in custom)
    assert not any(tac.get_hardware("NNAPI").is_op_supported(n) for n in custom)
    deq = [n for n in selfie.nodes if n.op_type == "DEQUANTIZE"]
    assert deq and all(gpu.is_op_supported(n) for n in deq)  # fp16 weights
    assert "custom op" in (tac.get_hardware("NNAPI").why_not_supported(custom[0]) or "")


def test_arithmetic_count_and_costs(mixed_graph):
    conv = next(n for n in mixed_graph.nodes if n.op_type == "CONV_2D")
    o, kh, kw, ci = mixed_graph.shape(conv.inputs[1])
    out = int(np.prod(mixed_graph.shape(conv.outputs[0])))
    assert opcost.arithmetic_count(conv) == 2 * out * kh * kw * ci
    fc = next(n for n in mixed_graph.nodes if n.op_type == "FULLY_CONNECTED")
    assert opcost.arithmetic_count(fc) == 2 * int(np.prod(mixed_graph.shape(fc.outputs[0]))) * mixed_graph.shape(fc.inputs[1])[1]
    assert opcost.bytes_moved(conv) == sum(mixed_graph.nbytes(t) for t in conv.inputs + conv.outputs if t >= 0)
    for hw in ("CPU", "GPU", "NNAPI"):
        assert tac.get_hardware(hw).get_op_cost(conv) > 0


@pytest.mark.parametrize("size", [2, 32, 128])
def test_cost_grows_with_work_and_gpu_wins_big_convs(size):
    tf = models._tf()
    k = np.random.default_rng(0).standard_normal((3, 3, 16, 16)).astype(np.float32)

    def fn(x):
        return tf.nn.conv2d(x, k, 1, "SAME")

    g = Graph(tflite_io.read(models.convert(fn, [(1, size, size, 16)])))
    conv = g.nodes[0]
    cpu, gpu = tac.get_hardware("CPU").get_op_cost(conv), tac.get_hardware("GPU").get_op_cost(conv)
    flops = opcost.arithmetic_count(conv)
    assert flops == 2 * size * size * 16 * 9 * 16
    if size >= 32:
        assert gpu < cpu
    if size == 2:
        assert gpu > cpu  # launch overhead dominates a tiny conv


def test_switching_costs():
    cpu, gpu, nnapi = (tac.get_hardware(n) for n in ("CPU", "GPU", "NNAPI"))
    assert gpu.get_hardware_switching_cost(gpu, 10 ** 6) == 0
    assert gpu.get_hardware_switching_cost(cpu, 10 ** 6) > gpu.get_hardware_switching_cost(cpu, 10 ** 3) > 0
    assert cpu.get_hardware_switching_cost(gpu, 1000) == gpu.get_hardware_switching_cost(cpu, 1000)
    assert nnapi.get_quant_dequant_cost("FLOAT", "QUANTIZED_INT8", 100) > 0
    assert nnapi.get_quant_dequant_cost("FLOAT", "HYBRID", 100) == 0
    assert nnapi.get_quant_dequant_cost("QUANTIZED_INT8", "QUANTIZED_INT8", 100) == 0


@pytest.mark.parametrize("text,word", [
    ("name: [unclosed", "not valid YAML"),
    ("- a list", "mapping"),
    ("name: X\ninference_types: [FLOAT]\nsupported_ops: all\ncost: {}\ntransfer: {}\nquant: {}\n", "cost.throughput_gflops"),
    ("name: X\ninference_types: [FLOAT]\nsupported_ops: all\ntransfer: {}\nquant: {}\n", "missing key 'cost'"),
])
def test_bad_config(tmp_path, text, word):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(errors.ConfigError, match=word.replace("[", r"\[").replace("'", "'")) as e:
        config.load(path)
    assert str(path) in str(e.value)


def test_bad_number_in_config(tmp_path):
    data = (config.config_dir() / "gpu.yaml").read_text().replace("bandwidth_gbps: 20.0", "bandwidth_gbps: -1")
    path = tmp_path / "neg.yaml"
    path.write_text(data)
    with pytest.raises(errors.ConfigError, match="bandwidth_gbps"):
        config.load(path)


def test_yaml_only_device(tmp_path, monkeypatch, model_bytes):
    for f in config.config_dir().glob("*.yaml"):
        shutil.copy(f, tmp_path / f.name)
    dsp = (tmp_path / "gpu.yaml").read_text().replace("name: GPU", "name: DSP")
    (tmp_path / "dsp.yaml").write_text(dsp)
    monkeypatch.setenv("TFTPU_HARDWARE_CONFIGS", str(tmp_path))
    try:
        assert "DSP" in registry.names()
        result = tac.run(model_bytes("chain"), device_specs=["DSP", "CPU"])
        assert {o["device"] for o in result.op_devices()} == {"DSP"}
    finally:
        registry._INSTANCES.pop("DSP", None)


def test_plugins_by_module_and_file(model_bytes):
    name = tac.load_plugin("tests.tac.plugin_hw:ConvOnly")
    assert name == "CONVONLY"
    result = tac.run(model_bytes("mixed"), device_specs=["tests.tac.plugin_hw:ConvOnly"])
    placed = result.op_devices()
    assert {o["device"] for o in placed if o["type"] == "CONV_2D"} == {"CONVONLY"}
    assert {o["device"] for o in placed if o["type"] != "CONV_2D"} == {"CPU"}
    for a, b in zip(models.run_tflite(model_bytes("mixed")), models.run_tflite(result.tflite())):
        assert np.array_equal(a, b)
    assert tac.load_plugin("tests/tac/plugin_hw.py:LowerAll") == "LOWERALL"


@pytest.mark.parametrize("spec,word", [
    ("no.such.module:X", "cannot be imported"),
    ("tests/tac/none.py:X", "not found"),
    ("tests.tac.plugin_hw:Nope", "no attribute"),
    ("tests.tac.plugin_hw:LOWERED", "not a TargetHardware"),
    ("justaname:", "bad hardware plug-in"),
])
def test_bad_plugins(spec, word):
    with pytest.raises(errors.UsageError, match=word):
        tac.resolve_devices([spec])


def test_unknown_device_and_bad_simple_hardware(model_bytes):
    with pytest.raises(errors.UsageError, match="unknown hardware 'FOO'"):
        tac.resolve_devices(["FOO"])

    class Broken(tac.SimpleHardware):
        name = "BROKEN"

        def advantage_over_cpu(self):
            return 0.0

    with pytest.raises(errors.ConfigError, match="advantage_over_cpu"):
        tac.run(model_bytes("mixed"), device_specs=[Broken()])
    with pytest.raises(errors.ConfigError, match="already registered"):
        tac.register("GPU", Broken)


def test_registering_plugin_file_twice(tmp_path, model_bytes):
    plugin = tmp_path / "foo_hw.py"
    plugin.write_text(
        "from tftpu.tac import SimpleHardware, register\n\n\n"
        "@register('FOO')\n"
        "class FooHardware(SimpleHardware):\n"
        "    def transformations(self):\n"
        "        return ['LowerPackIntoConcatReshape', 'UnrollSplit', 'UnrollSplitV', 'PadSlice']\n\n"
        "    def is_not_supported_op(self, op):\n"
        "        return op.name == 'CUSTOM' or op.inference_type != 'FLOAT'\n\n"
        "    def advantage_over_cpu(self):\n"
        "        return 5.0\n")
    spec = f"{plugin}:FooHardware"
    assert tac.load_plugin(spec) == tac.load_plugin(spec) == "FOO"
    result = tac.run(model_bytes("selfie"), device_specs=[spec, "GPU"])
    placed = result.op_devices()
    assert {o["device"] for o in placed if o["type"] == "CONV_2D"} == {"FOO"}
    assert {o["device"] for o in placed if o["type"] == "Convolution2DTransposeBias"} <= {"GPU", "CPU"}
    bad = tmp_path / "bad_hw.py"
    bad.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(errors.UsageError, match="failed to load: RuntimeError: boom"):
        tac.load_plugin(f"{bad}:X")


def test_plugin_missing_abstract_method_is_a_usage_error():
    """A SimpleHardware plug-in without advantage_over_cpu is refused with one clear error."""
    import pytest as _pytest

    from tftpu import errors as _errors
    from tftpu.tac import SimpleHardware, register
    from tftpu.tac.hardware import registry as _registry

    @register("HALFDONE")
    class HalfDone(SimpleHardware):
        def is_not_supported_op(self, op):
            return False

    with _pytest.raises(_errors.UsageError, match="advantage_over_cpu"):
        _registry.get("HALFDONE")


@pytest.mark.parametrize("key,value,needle", [
    ("max_rank", "four", "wrong type"), ("max_rank", -1, ">= 0"), ("custom_ops", "Foo", "wrong type"),
    ("op_constraints", {"rank4_only": "ADD"}, "list of op names"), ("colour", "red", "unknown key"),
    ("inference_types", [1, 2], "list of names"),
])
def test_hardware_config_field_types_are_checked(tmp_path, key, value, needle):
    import yaml

    from tftpu.errors import ConfigError
    from tftpu.tac.hardware import config as hw_config

    data = yaml.safe_load((hw_config.config_dir() / "gpu.yaml").read_text())
    data[key] = value
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=needle):
        hw_config.load(p)
