"""tftpu-compare run as a subprocess: the table, and exit status 0 / 1 / 2."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

TOOL = Path(sys.executable).with_name("tftpu-compare")


def _run(*args):
    return subprocess.run([str(TOOL), *map(str, args)], capture_output=True, text=True,
                          timeout=120)


@pytest.fixture()
def files(tmp_path):
    rng = np.random.default_rng(0)
    ref = {"conv1": rng.standard_normal((1, 8, 4, 4)).astype(np.float32),
           "fc": rng.standard_normal((1, 10)).astype(np.float32),
           "idx": np.arange(6, dtype=np.int64), "only_ref": np.zeros(2, np.float32)}
    close = {k: (v + 1e-4 * rng.standard_normal(v.shape)).astype(v.dtype)
             if v.dtype.kind == "f" else v for k, v in ref.items() if k != "only_ref"}
    close["only_test"] = np.ones(3, np.float32)
    far = dict(close, fc=(ref["fc"] + rng.standard_normal((1, 10))).astype(np.float32))
    paths = {}
    for name, d in (("ref", ref), ("close", close), ("far", far)):
        paths[name] = tmp_path / f"{name}.npz"
        np.savez(paths[name], **d)
    return paths


def test_all_pass_prints_table_exit_0(files):
    r = _run(files["ref"], files["close"])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["tensor", "shape", "cosine", "euclid", "sqnr(dB)", "result"]
    rows = {ln.split()[0]: ln.split() for ln in lines[2:5]}
    assert set(rows) == {"conv1", "fc", "idx"}
    assert rows["conv1"][1] == "1x8x4x4" and rows["conv1"][-1] == "PASS"
    assert float(rows["conv1"][2]) > 0.9999 and float(rows["conv1"][4]) > 60
    assert "PASS (equal)" in lines[4] or "equal" in r.stdout
    assert f"only in {files['ref']}: only_ref" in r.stdout
    assert f"only in {files['close']}: only_test" in r.stdout
    assert "3 compared, 3 passed, 0 failed" in r.stdout


def test_under_tolerance_exit_1(files):
    r = _run(files["ref"], files["far"])
    assert r.returncode == 1
    assert "FAIL" in r.stdout and "fc" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    # a loose enough tolerance lets the same pair pass
    assert _run(files["ref"], files["far"], "--tolerance=0.3,-10").returncode == 0
    # a tolerance no float result reaches fails even the close pair
    assert _run(files["ref"], files["close"], "--tolerance=1,1").returncode == 1


@pytest.mark.parametrize("make", ["missing", "garbage", "npy", "pickled", "dir", "truncated"])
def test_bad_file_exit_2_one_line(files, tmp_path, make):
    bad = tmp_path / f"bad_{make}.npz"
    if make == "garbage":
        bad.write_bytes(b"this is not a zip file at all")
    elif make == "npy":
        bad = tmp_path / "x.npy"
        np.save(bad, np.ones(3))
    elif make == "pickled":
        np.savez(bad, o=np.array([{"a": 1}], dtype=object))
    elif make == "dir":
        bad = tmp_path
    elif make == "truncated":
        bad.write_bytes(files["ref"].read_bytes()[:200])
    for args in ((files["ref"], bad), (bad, files["ref"])):
        r = _run(*args)
        assert r.returncode == 2, (make, r.stdout, r.stderr)
        err = r.stderr.strip().splitlines()
        assert len(err) == 1 and str(bad) in err[0] and "Traceback" not in r.stderr
        assert r.stdout == ""


@pytest.mark.parametrize("args", [["--tolerance=0.99"], ["--tolerance=a,b"],
                                  ["--tolerance=2,0.9"], ["--bogus=1"], ["--noise_floor=inf"], ["--noise_floor=nan"]])
def test_bad_flags_exit_2(files, args):
    r = _run(files["ref"], files["close"], *args)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_wrong_arg_count_and_disjoint_files_exit_2(files, tmp_path):
    assert _run(files["ref"]).returncode == 2
    assert _run(files["ref"], files["close"], files["far"]).returncode == 2
    other = tmp_path / "other.npz"
    np.savez(other, nothing_shared=np.ones(2))
    r = _run(files["ref"], other)
    assert r.returncode == 2 and "share no tensor" in r.stderr


def test_help_exit_0():
    r = _run("--help")
    assert r.returncode == 0 and "tolerance" in r.stdout


def test_rounding_noise_passes_unless_the_floor_is_off(tmp_path):
    rng = np.random.default_rng(1)
    act = rng.standard_normal((2, 64)).astype(np.float32) * 4
    ref = {"act": act, "mean": np.float32(1e-7) * rng.standard_normal(2).astype(np.float32)}
    test = {"act": act, "mean": np.float32(1e-7) * rng.standard_normal(2).astype(np.float32)}
    np.savez(tmp_path / "ref.npz", **ref)
    np.savez(tmp_path / "test.npz", **test)
    r = _run(tmp_path / "ref.npz", tmp_path / "test.npz")
    assert r.returncode == 0, r.stderr
    assert "rounding noise" in r.stdout
    r = _run(tmp_path / "ref.npz", tmp_path / "test.npz", "--noise_floor=0")
    assert r.returncode == 1 and "mean" in r.stderr
    assert _run(tmp_path / "ref.npz", tmp_path / "test.npz", "--noise_floor=-1").returncode == 2
