"""The typed chip model: every bundled chip loads, every field is read and checked, and a bad
field is one ConfigError naming the file and the field."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from tests.chips import REMOVE, chip_data, chip_file
from tftpu import chip as chips
from tftpu.errors import ConfigError
from tftpu.passes.cost import Target
from tftpu.utils.config import DEFAULT_ROOT

TOP_FIELDS = list(chip_data())
SECTION_FIELDS = [("matrix_unit", k) for k in chip_data()["matrix_unit"]] + [("host", k) for k in chip_data()["host"]]


@pytest.mark.parametrize("name", chips.known())
def test_bundled_chips_load_and_say_they_are_models(name):
    c = chips.load(name)
    assert c.name == name and c.peak_flops() > 0 and c.local_mem_per_lane > 0
    assert set(c.modes) <= set(chips.MODES) and c.io_format and c.format_for("top.Conv")
    assert "not silicon" in (DEFAULT_ROOT / "chips" / f"{name}.yaml").read_text()


def test_chips_differ_in_capability():
    npu1, edge = chips.load("npu1"), chips.load("edge16")
    assert npu1.lanes == 64 and edge.lanes == 16 and edge.local_mem_bytes < npu1.local_mem_bytes
    assert "F32" in npu1.modes and set(edge.modes) == {"F16", "INT8"}


@pytest.mark.parametrize("field", TOP_FIELDS)
def test_every_field_is_required(tmp_path, field):
    p = chip_file(tmp_path / "c.yaml", **{field: REMOVE})
    with pytest.raises(ConfigError) as e:
        chips.load(p)
    assert str(e.value) == f"{p}: field '{field}': missing"


@pytest.mark.parametrize("section,field", SECTION_FIELDS)
def test_every_section_field_is_required(tmp_path, section, field):
    data = chip_data()
    del data[section][field]
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=rf"c.yaml: field '{section}.{field}': missing"):
        chips.load(p)


@pytest.mark.parametrize("field,value,reason", [
    ("npu_lanes", "many", "expected int"), ("npu_lanes", 0, "positive"), ("npu_lanes", True, "expected int"),
    ("eu_bytes", -64, "positive"), ("local_mem_bytes", 1000, "split evenly"),
    ("ddr_bandwidth", "fast", "expected a number"), ("ddr_bandwidth", float("inf"), "finite"),
    ("frequency_hz", 0, "positive"), ("name", 7, "expected str"), ("dtypes", ["f33"], "not one of"),
    ("dtypes", [], "empty"), ("modes", ["INT4"], "not one of"), ("modes", ["F32", "INT8", "BF16", "F16"] * 0, "empty"),
    ("macs_per_cycle", {"f32": 0}, "positive"), ("macs_per_cycle", {"f64": 4}, "not one of the chip's dtypes"),
    ("macs_per_cycle", {"i8": 64}, "computes in f32"), ("s2d_min_speedup", -1, "positive"),
    ("host", {"bandwidth": 1e9, "overlap": 1.5}, "at most 1.0"),
    ("matrix_unit", {"contraction": "diagonal", "rows": 1, "cols": 1, "dtype": "i8"}, "per_tap, im2col"),
    ("formats", {"io": "NCHW", "default": "NCHW", "Conv": "NHWC"}, "full op name"),
    ("formats", {"default": "NCHW"}, "formats.io': missing"),
    ("formats", {"io": "NCHW", "default": "blocked"}, "is not NCHW"),
    ("colour", "blue", "unknown field"),
])
def test_bad_fields_are_one_line_naming_file_and_field(tmp_path, field, value, reason):
    p = chip_file(tmp_path / "bad.yaml", **{field: value})
    with pytest.raises(ConfigError) as e:
        chips.load(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}: field '") and reason in msg and "\n" not in msg, msg


def test_every_field_lands_in_the_model():
    """No dead field: each YAML key of every chip is a field of the dataclasses read."""
    names = {f.name for f in dataclasses.fields(chips.Chip)}
    renamed = {"npu_lanes": "lanes", "matrix_unit": "matrix", "s2d_min_speedup": "s2d_min_speedup"}
    for name in chips.known():
        data = yaml.safe_load((DEFAULT_ROOT / "chips" / f"{name}.yaml").read_text())
        for key in data:
            assert renamed.get(key, key) in names, (name, key)


def test_s2d_targets_are_views_of_chips():
    tpu, cpu = Target.load("tpu"), Target.load("cpu")
    assert (tpu.peak_flops, tpu.matrix_rows, tpu.dtype_bytes, tpu.contraction) == (1.23e14, 128, 2, "per_tap")
    assert (cpu.peak_flops, cpu.matrix_cols, cpu.dtype_bytes, cpu.contraction) == (1.5e11, 16, 4, "im2col")
    assert Target.load("npu1").peak_flops == chips.load("npu1").peak_flops()
