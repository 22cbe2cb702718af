"""tftpu-calibrate as a user runs it: a TOP .mlir and a directory of inputs -> a calibration table."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tftpu import frontend, models, quant

TOOL = Path(sys.executable).with_name("tftpu-calibrate")


def _run(*args):
    return subprocess.run([str(TOOL), *map(str, args)], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("cal")
    model = frontend.load(models.resnet18_like((32, 32, 3)))
    model.save(d / "r.top.mlir")
    data = d / "data"
    data.mkdir()
    (d / "empty").mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        np.save(data / f"{i}.npy", rng.uniform(-1, 1, (1, 32, 32, 3)).astype(np.float32))
    return d


def test_writes_a_table(work):
    out = work / "table.txt"
    r = _run(f"--mlir={work / 'r.top.mlir'}", f"--dataset={work / 'data'}", "--input_num=2",
             "--calibration_method=mse", f"-o={out}")
    assert r.returncode == 0, r.stderr
    assert "2 inputs" in r.stdout and "SQNR" in r.stdout
    table = quant.read_table(out)
    assert table.method == "mse" and table.samples == 2 and len(table.entries) > 20
    assert table.asymmetric and "asymmetric ranges" in r.stdout     # by default, as tftpu.compile calibrates


def test_several_methods_write_the_first_table_with_the_others_as_alternates(work):
    out = work / "both.txt"
    r = _run(f"--mlir={work / 'r.top.mlir'}", f"--dataset={work / 'data'}", "--calibration_method=mse,minmax",
             "--nosimulate", f"-o={out}")
    assert r.returncode == 0, r.stderr
    assert "alternates: minmax" in r.stdout
    table = quant.read_table(out)
    assert table.method == "mse" and table.samples == 3 and table.asymmetric and list(table.alternates) == ["minmax"]
    model = frontend.load(work / "r.top.mlir")
    samples = [{model.input_names[0]: np.load(work / "data" / f"{i}.npy")} for i in range(3)]
    for method, got in table.tables().items():
        want = quant.calibrate(model, samples, method, asymmetric=True)
        assert got.entries == want.entries and got.asymmetric and got.samples == 3
    assert table.entries != table.alternates["minmax"].entries
    # the comment rows hide the alternates from a reader of TPU-MLIR's layout
    rows = [x for x in out.read_text().splitlines() if x and not x.startswith("#")]
    assert len(rows) == len(table.entries)
    # spread over worker processes, the same bytes
    r = _run(f"--mlir={work / 'r.top.mlir'}", f"--dataset={work / 'data'}", "--calibration_method=mse,minmax",
             "--workers=2", f"-o={work / 'workers.txt'}")
    assert r.returncode == 0, r.stderr
    assert (work / "workers.txt").read_bytes() == out.read_bytes()


def test_default_is_mse_with_tail_mse_alternates(work):
    out = work / "default.txt"
    r = _run(f"--mlir={work / 'r.top.mlir'}", f"--dataset={work / 'data'}", "--nosimulate", f"-o={out}")
    assert r.returncode == 0, r.stderr
    table = quant.read_table(out)
    assert table.method == "mse" and list(table.alternates) == ["tail_mse"]


@pytest.mark.parametrize("args,needle", [
    ([], "--mlir"),
    (["--dataset={work}/missing"], "directory"),
    (["--dataset={work}/empty"], "no images"),
    (["--mean=a"], "--mean"),
    (["--calibration_method=entropy"], "calibration_method"),
    (["--calibration_method=mse,entropy"], "calibration_method 'entropy'"),
])
def test_bad_input_is_one_line_exit_2(work, args, needle):
    base = {"--mlir": f"--mlir={work / 'r.top.mlir'}", "--dataset": f"--dataset={work / 'data'}",
            "-o": f"-o={work / 'never.txt'}"}
    given = [a.format(work=work) for a in args]
    for a in given:
        base[a.split("=")[0]] = a
    if not args:
        base.pop("--mlir")
    r = _run(*base.values())
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr
    assert not (work / "never.txt").exists()


def test_auto_and_asymmetric(work):
    out = work / "auto.txt"
    r = _run(f"--mlir={work / 'r.top.mlir'}", f"--dataset={work / 'data'}", "--calibration_method=auto",
             "--noasymmetric", "--tune_num=1", "--nosimulate", f"-o={out}")
    assert r.returncode == 0, r.stderr
    assert "auto chose:" in r.stdout and "asymmetric ranges" not in r.stdout
    table = quant.read_table(out)
    assert table.method == "auto" and not table.asymmetric and table.samples == 3


def test_bad_tune_num_is_one_line_exit_2(work):
    r = _run(f"--mlir={work / 'r.top.mlir'}", f"--dataset={work / 'data'}", "--calibration_method=auto",
             "--tune_num=0", f"-o={work / 'never.txt'}")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "tune_num" in r.stderr


def test_glob_names_an_unreadable_file_or_skips_it(work, tmp_path):
    for i in range(2):
        (tmp_path / f"{i}.npy").write_bytes((work / "data" / f"{i}.npy").read_bytes())
    (tmp_path / "1b.npy").write_bytes(b"\x93NUMPY truncated")
    args = [f"--mlir={work / 'r.top.mlir'}", f"--dataset={tmp_path}/*.npy", "--input_num=0", "--nosimulate",
            "--noprogress", f"-o={tmp_path / 't.txt'}"]
    r = _run(*args)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "1b.npy" in r.stderr
    assert not (tmp_path / "t.txt").exists()
    r = _run(*args, "--skip_unreadable")
    assert r.returncode == 0, r.stderr
    assert "from 2 inputs (1 unreadable skipped:" in r.stdout and "1b.npy" in r.stderr
    assert quant.read_table(tmp_path / "t.txt").samples == 2


def test_a_tpu_module_is_refused_naming_what_to_calibrate(work):
    """A lowered .tpu.mlir (no float inference kernels) is named as such, not as unsupported ops."""
    from tftpu.pipelines.deploy import deploy

    deploy(work / "r.top.mlir", quantize="F32", chip="npu1", tpu_mlir=work / "r.tpu.mlir")
    r = _run(f"--mlir={work / 'r.tpu.mlir'}", f"--dataset={work / 'data'}", f"-o={work / 'never.txt'}")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "is a TPU module (already lowered): calibrate the TOP .mlir" in r.stderr
    assert not (work / "never.txt").exists()
