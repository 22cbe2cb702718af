"""Every console script exists, answers --help, and rejects bad flags with one line and exit 2."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = ["optimize", "transform", "calibrate", "deploy", "run", "compare", "tac", "demo", "convert", "evaluate"]
REPO = Path(__file__).resolve().parents[2]


def _script(tool):
    path = Path(sys.executable).parent / f"tftpu-{tool}"
    return str(path) if path.exists() else shutil.which(f"tftpu-{tool}")


@pytest.mark.parametrize("tool", TOOLS)
def test_help_lists_flags(tool):
    script = _script(tool)
    assert script, f"console script tftpu-{tool} is not installed"
    done = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"tftpu-{tool}" in done.stdout and "flags:" in done.stdout
    assert "--" in done.stdout.split("flags:", 1)[1]


@pytest.mark.parametrize("tool", TOOLS)
def test_bad_flag_is_one_line_exit_2(tool):
    done = subprocess.run([_script(tool), "--no_such_flag=1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no_such_flag" in lines[0], done.stderr


@pytest.mark.parametrize("tool", ["compare", "tac"])
def test_runnable_as_file(tool):
    done = subprocess.run([sys.executable, str(REPO / "tools" / f"tftpu_{tool}.py"), "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "flags:" in done.stdout, done.stderr


def test_malformed_flag_value_exit_2():
    done = subprocess.run([_script("demo"), "--image_size=big"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "image_size" in done.stderr
