"""Honest help texts (issue 15): usage lines as written, flags spelt as the examples spell them,
the targets listed, how inputs are matched, and calibrate saying when it has fewer inputs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BIN = Path(sys.executable).parent
TOOLS = ["optimize", "transform", "calibrate", "deploy", "run", "compare", "tac", "demo", "convert", "evaluate"]


def _help(tool: str) -> str:
    done = subprocess.run([str(BIN / f"tftpu-{tool}"), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("tool", TOOLS)
def test_no_runs_of_stray_spaces_inside_a_line(tool):
    """A line break meant in a docstring (`\\` at the end of an example line) stays a line break."""
    text = _help(tool)
    assert not [line for line in text.splitlines() if re.search(r"\S {3,}\S", line)], text


@pytest.mark.parametrize("tool", ["calibrate", "tac"])
def test_one_letter_flags_are_listed_as_the_examples_use_them(tool):
    text = _help(tool)
    assert re.search(r"^\s+-o: ", text, re.M) and not re.search(r"^\s+--o: ", text, re.M), text
    assert " -o " in text.split("flags:")[0]


def test_one_letter_flag_spelt_in_the_help_works():
    done = subprocess.run([str(BIN / "tftpu-tac"), "missing.tflite", "-o", "x.tflite"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "missing.tflite" in done.stderr and "-o" not in done.stderr


def test_optimize_lists_its_targets():
    from tftpu import chip

    text = _help("optimize")
    flag = text.split("--target:", 1)[1]
    assert all(name in flag for name in chip.known()) and {"tpu", "cpu"} <= set(chip.known())


def test_run_says_how_npz_keys_are_matched():
    text = " ".join(_help("run").split())
    assert "by name" in text and "by position" in text and "keyed by output tensor name" in text


def test_calibrate_says_when_the_dataset_has_fewer_inputs_than_asked(tmp_path):
    from onnx import helper

    from tests.frontend.onnx_graphs import model
    from tftpu.frontend.onnx_to_top import onnx_to_top

    top = onnx_to_top(model([helper.make_node("Relu", ["x"], ["y"])], [("x", [1, 4])], [("y", [1, 4])]), "m")
    top.save(tmp_path / "m.top.mlir")
    data = tmp_path / "data"
    data.mkdir()
    for i in range(3):
        np.savez(data / f"{i}.npz", x=np.full((1, 4), i - 1, np.float32))
    done = subprocess.run([str(BIN / "tftpu-calibrate"), f"--mlir={tmp_path / 'm.top.mlir'}", f"--dataset={data}",
                           "--input_num=20", "-o", str(tmp_path / "table"), "--nosimulate"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        f"tftpu-calibrate: warning: --input_num=20, but {data} holds 3 input(s): calibrating on those 3"]
    assert "from 3 inputs" in done.stdout and (tmp_path / "table").is_file()
