"""TFLite read/write on TensorFlow's schema: lossless round trips and one-line errors on bad files."""

import subprocess
import sys

import numpy as np
import pytest

from tftpu import errors
from tftpu.tac import tflite_io
from tftpu.tac.graph import Graph
from tests.tac.models import run_tflite

RUNNABLE = ["mixed", "mixed_fp16", "mixed_int8", "hybrid", "while", "sparse", "chain", "selfie", "face"]


@pytest.mark.parametrize("name", RUNNABLE)
def test_roundtrip_runs_identically(model_bytes, name):
    data = model_bytes(name)
    again = tflite_io.write(tflite_io.read(data))
    for seed in (0, 1):
        a, b = run_tflite(data, seed=seed), run_tflite(again, seed=seed)
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert x.dtype == y.dtype and np.array_equal(x, y)


def _summary(model):
    out = []
    for s in range(len(model.subgraphs)):
        g = Graph(model, s)
        out.append([(n.op_type, n.inputs, n.outputs, n.inference_type) for n in g.nodes])
        out.append([(g.tensor_name(t), g.shape(t), g.dtype(t), g.is_quantized(t)) for t in range(len(g.tensors))])
    out.append([bytes(np.asarray(b.data if b.data is not None else [], np.uint8)) for b in model.buffers])
    out.append([(m.name, m.buffer) for m in model.metadata or []])
    return out


@pytest.mark.parametrize("name", RUNNABLE + ["custom"])
def test_roundtrip_is_lossless(model_bytes, name):
    data = model_bytes(name)
    first = tflite_io.read(data)
    once = tflite_io.write(first)
    second = tflite_io.read(once)
    assert _summary(first) == _summary(second)
    assert tflite_io.write(second) == once  # stable and deterministic


def test_features_survive(model_bytes):
    custom = tflite_io.read(tflite_io.write(tflite_io.read(model_bytes("custom"))))
    ops = Graph(custom).nodes
    assert ops[0].name == "CUSTOM" and ops[0].custom_code == "BesselI1e"
    sparse = tflite_io.read(tflite_io.write(tflite_io.read(model_bytes("sparse"))))
    assert any(t.sparsity is not None for t in sparse.subgraphs[0].tensors)
    fp16 = Graph(tflite_io.read(model_bytes("mixed_fp16")))
    assert any(n.name == "DEQUANTIZE" and fp16.dtype(n.inputs[0]) == "float16" for n in fp16.nodes)
    int8 = Graph(tflite_io.read(model_bytes("mixed_int8")))
    kinds = [n.inference_type for n in int8.nodes]
    assert kinds.count("QUANTIZED_INT8") >= len(kinds) - 2
    assert any(n.name == "CONV_2D" and int8.dtype(n.inputs[1]) == "int8" for n in int8.nodes)
    hybrid = Graph(tflite_io.read(model_bytes("hybrid")))
    assert [n.inference_type for n in hybrid.nodes][:2] == ["HYBRID", "HYBRID"]
    loop = tflite_io.read(model_bytes("while"))
    assert len(loop.subgraphs) == 3
    face = Graph(tflite_io.read(model_bytes("face")))
    assert len(face.outputs) == 2
    selfie = Graph(tflite_io.read(model_bytes("selfie")))
    assert any(n.custom_code == "Convolution2DTransposeBias" for n in selfie.nodes)


def _one_line(e):
    text = str(e.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize("frac", [0.0, 0.0001, 0.001, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999])
@pytest.mark.parametrize("name", ["selfie", "mixed"])
def test_truncated_file(model_bytes, tmp_path, name, frac):
    data = model_bytes(name)
    path = tmp_path / "cut.tflite"
    path.write_bytes(data[: int(len(data) * frac)])
    with pytest.raises(errors.ModelFileError) as e:
        tflite_io.read(path)
    assert str(path) in _one_line(e)


@pytest.mark.parametrize("name", ["mixed", "chain", "mixed_int8"])
def test_truncated_by_a_few_bytes(model_bytes, name):
    data = model_bytes(name)
    for cut in (1, 2, 3, 4, 8, 16, 64, 1000):
        with pytest.raises(errors.ModelFileError):
            tflite_io.read(data[:-cut])


def test_associated_files_survive(model_bytes):
    import io
    import zipfile

    out = tflite_io.write(tflite_io.read(model_bytes("selfie")))
    with zipfile.ZipFile(io.BytesIO(out)) as z:
        assert z.read("labels.txt") == b"selfie\n"


def test_not_a_flatbuffer(tmp_path):
    for content, word in [(b"", "too short"), (b"hello world, not a model", "not a TFLite"),
                          (np.random.default_rng(0).bytes(5000), "not a TFLite"),
                          (b"\x08\x00\x00\x00TFL3" + b"\xff" * 40, "")]:
        with pytest.raises(errors.ModelFileError) as e:
            tflite_io.read(content)
        assert word in _one_line(e)
    with pytest.raises(errors.ModelFileError, match="no such file"):
        tflite_io.read(tmp_path / "missing.tflite")
    with pytest.raises(errors.ModelFileError, match="directory"):
        tflite_io.read(tmp_path)


def test_wrong_identifier_and_schema(model_bytes):
    data = bytearray(model_bytes("mixed"))
    data[4:8] = b"TFL2"
    with pytest.raises(errors.ModelFileError, match="file identifier"):
        tflite_io.read(bytes(data))
    model = tflite_io.read(model_bytes("mixed"))
    model.version = 2
    with pytest.raises(errors.ModelFileError, match="schema version 2"):
        tflite_io.read(tflite_io.write(model))


@pytest.mark.parametrize("damage", ["tensor_index", "opcode", "buffer", "buffer_size", "type"])
def test_corrupt_references(model_bytes, damage):
    model = tflite_io.read(model_bytes("mixed"))
    sg = model.subgraphs[0]
    if damage == "tensor_index":
        sg.operators[1].inputs = np.array([10_000] + list(sg.operators[1].inputs[1:]), np.int32)
    elif damage == "opcode":
        sg.operators[0].opcodeIndex = 500
    elif damage == "buffer":
        sg.tensors[1].buffer = 10_000
    elif damage == "buffer_size":
        t = next(t for t in sg.tensors if t.buffer > 0 and model.buffers[t.buffer].data is not None
                 and len(model.buffers[t.buffer].data) > 8)
        t.shape = np.asarray(list(t.shape) + [3], np.int32)
    elif damage == "type":
        sg.tensors[0].type = 99
    with pytest.raises(errors.ModelFileError) as e:
        tflite_io.read(tflite_io.write(model))
    assert "subgraph 0" in _one_line(e)


def test_tool_exit_status_on_bad_files(tmp_path, model_bytes):
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(model_bytes("mixed")[:300])
    junk = tmp_path / "junk.tflite"
    junk.write_bytes(b"PK\x03\x04 not a model at all")
    for path in (bad, junk, tmp_path / "missing.tflite"):
        r = subprocess.run([sys.executable, "tools/tftpu_tac.py", str(path), "-o", str(tmp_path / "o.tflite")],
                           capture_output=True, text=True)
        assert r.returncode == 2
        err = r.stderr.strip().splitlines()
        assert len(err) == 1 and str(path) in err[0] and "error" in err[0]
        assert not (tmp_path / "o.tflite").exists()
