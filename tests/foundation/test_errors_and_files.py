"""Typed errors carry the documented exit codes; atomic writes leave nothing half-written."""

import pytest

from tftpu import cli, errors
from tftpu.utils import files


def test_exit_codes():
    assert errors.ModelFileError("m.onnx", "truncated").exit_code == 2
    assert errors.UnsupportedOpError([("Foo", "n1")]).exit_code == 2
    assert errors.ToleranceError("cos 0.5 < 0.99").exit_code == 1
    assert issubclass(errors.ShapeError, errors.InputError)


def test_unsupported_op_lists_all_once_sorted():
    e = errors.UnsupportedOpError([("Foo", "b"), ("Bar", "a"), ("Foo", "b")], where="m.onnx")
    assert str(e) == "m.onnx: unsupported ops: Bar (a), Foo (b)"
    assert e.ops == [("Bar", "a"), ("Foo", "b")]


def test_unsupported_op_names_the_first_three_of_a_type_with_many():
    """A pre-quantized model's 21 ConvInteger nodes make one readable clause, not 21."""
    e = errors.UnsupportedOpError([("ConvInteger", f"c{i:02d}") for i in range(21)] + [("Floor", "f")])
    assert str(e) == "unsupported ops: ConvInteger (21: c00, c01, c02, ...), Floor (f)"
    assert len(e.ops) == 22


def test_model_file_error_names_path():
    assert str(errors.ModelFileError("x/y.tflite", "not a flatbuffer")) == "x/y.tflite: not a flatbuffer"


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    target = tmp_path / "out.bin"
    files.write_bytes(target, b"old")
    with pytest.raises(RuntimeError):
        with files.atomic_write(target) as f:
            f.write(b"half")
            raise RuntimeError("boom")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_cli_run_maps_errors_to_exit_codes(capsys):
    def bad_input(args):
        raise errors.ModelFileError("m.onnx", "truncated\nprotobuf")

    def failed_check(args):
        raise errors.ToleranceError("cosine 0.5 under 0.99")

    for main, code in [(bad_input, 2), (failed_check, 1), (lambda a: 0, 0)]:
        with pytest.raises(SystemExit) as e:
            cli.run(main, "doc", argv=["tool"])
        assert e.value.code == code
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["tool: error: m.onnx: truncated protobuf", "tool: error: cosine 0.5 under 0.99"]
