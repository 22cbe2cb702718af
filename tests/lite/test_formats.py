"""TAC's importer/exporter registry: built-in .tflite in and tflite/mlir/json out, plus a tiny
format registered here (a base64 text wrapping of a .tflite, and a one-line-per-op summary)."""

import base64
import json

import pytest

from tftpu import errors, tac
from tftpu.tac import formats, tflite_io


@pytest.fixture(scope="module")
def tflite_bytes():
    from tests.tac import models

    return models.mixed()


def test_builtin_formats(tmp_path, tflite_bytes):
    path = tmp_path / "m.tflite"
    path.write_bytes(tflite_bytes)
    result = tac.run(path, device_specs=("GPU", "CPU"))
    for name in ("out.tflite", "out.mlir", "out.json"):
        formats.export(result, tmp_path / name)
    assert tflite_io.read(tmp_path / "out.tflite")
    assert '"tfl.' in (tmp_path / "out.mlir").read_text()
    assert json.loads((tmp_path / "out.json").read_text())["device_specs"] == ["GPU", "CPU"]
    assert {"tflite", "mlir", "json"} <= set(formats.exporters()) and ".tflite" in formats.importers()


def test_user_format(tmp_path, tflite_bytes):
    @tac.register_importer(".tfl64", replace=True)
    def read_b64(path):
        return tflite_io.read(base64.b64decode(path.read_text()))

    @tac.register_exporter("opsummary", ".ops.txt", replace=True)
    def write_summary(result):
        return "".join(f"{op['type']} {op['device']}\n" for op in result.op_devices())

    src = tmp_path / "m.tfl64"
    src.write_text(base64.b64encode(tflite_bytes).decode())
    result = tac.run(src, device_specs=("GPU", "CPU"))
    direct = tac.run(tflite_bytes, device_specs=("GPU", "CPU"))
    assert result.tflite() == direct.tflite()
    formats.export(result, tmp_path / "m.ops.txt")
    lines = (tmp_path / "m.ops.txt").read_text().splitlines()
    assert len(lines) == len(direct.op_devices()) and all(line.split()[1] in ("GPU", "CPU") for line in lines)


def test_unknown_formats_are_one_line(tmp_path, tflite_bytes):
    (tmp_path / "m.onnx").write_bytes(b"x")
    with pytest.raises(errors.ModelFileError, match="no TAC importer"):
        tac.run(tmp_path / "m.onnx")
    result = tac.run(tflite_bytes)
    with pytest.raises(errors.UsageError, match="no TAC exporter"):
        formats.export(result, tmp_path / "m.xyz")
    with pytest.raises(errors.UsageError, match="already registered"):
        tac.register_importer(".tflite", tflite_io.read)
    assert not (tmp_path / "m.xyz").exists()
