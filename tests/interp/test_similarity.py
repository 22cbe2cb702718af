"""Similarity metrics: TPU-MLIR's definitions, edge cases, the comparison rows and table."""

import math

import ml_dtypes
import numpy as np
import pytest

from tftpu import errors
from tftpu.interp import similarity as sim

RNG = np.random.default_rng(4)


def test_cosine_matches_definition():
    a, b = RNG.standard_normal(100), RNG.standard_normal(100)
    want = sum(x * y for x, y in zip(a, b)) / (math.sqrt(sum(a * a)) * math.sqrt(sum(b * b)))
    assert sim.cosine_similarity(a, b) == pytest.approx(want, abs=1e-12)
    assert sim.cosine_similarity(a, 3 * a) == pytest.approx(1.0)
    assert sim.cosine_similarity(a, -a) == pytest.approx(-1.0)


def test_euclidean_matches_paper_definition():
    a, b = RNG.standard_normal((4, 5)), RNG.standard_normal((4, 5))
    ed = math.sqrt(sum((x - y) ** 2 for x, y in zip(a.ravel(), b.ravel())))
    sr = math.sqrt(sum(v * v for v in ((a + b) / 2).ravel()))
    assert sim.euclidean_similarity(a, b) == pytest.approx(1 - ed / (sr + 1e-7), abs=1e-12)
    assert sim.euclidean_similarity(a, a) == pytest.approx(1.0)
    # a 1% relative error costs about 1% euclidean similarity
    assert sim.euclidean_similarity(a, a * 1.01) == pytest.approx(1 - 0.01 / 1.005, abs=1e-6)


def test_sqnr_db():
    x = RNG.standard_normal(10000)
    noise = 0.01 * RNG.standard_normal(10000)
    got = sim.sqnr(x, x + noise)
    want = 10 * math.log10(np.sum((x - x.mean()) ** 2) / np.sum((noise - noise.mean()) ** 2))
    assert got == pytest.approx(want) and 35 < got < 45
    assert sim.sqnr(x, x) == math.inf
    assert sim.sqnr(x, x + 5.0) > 300                # a constant offset is not noise
    assert sim.sqnr(np.arange(8.0), np.arange(8.0) + 4) == math.inf
    assert sim.sqnr(np.ones(5), np.arange(5.0)) == -math.inf
    assert sim.sqnr(x, x + noise) != sim.sqnr(x + noise, x)   # not symmetric


def test_zero_and_constant_tensors():
    z, c = np.zeros(6), np.full(6, 2.0)
    assert sim.cosine_similarity(z, z) == 1.0
    assert sim.cosine_similarity(z, c) == 0.0
    assert sim.euclidean_similarity(z, z) == 1.0
    assert sim.euclidean_similarity(z, c) == pytest.approx(-1.0)
    row = sim.compare_arrays("c", c, c)
    assert row.passed and row.cosine == 1.0 and row.note == "equal"


def test_nan_and_inf_handling():
    a = np.array([1.0, np.nan, 3.0, np.inf, 5.0])
    row = sim.compare_arrays("t", a, a.copy())
    assert row.passed and "non-finite" in row.note and row.cosine == pytest.approx(1.0)
    b = a.copy()
    b[1] = 2.0
    row = sim.compare_arrays("t", a, b)
    assert not row.passed and math.isnan(row.cosine) and "non-finite values differ" in row.note
    b = a.copy()
    b[3] = -np.inf
    assert not sim.compare_arrays("t", a, b).passed


def test_shapes_dtypes_and_empty():
    a = RNG.standard_normal((2, 3)).astype(np.float32)
    assert sim.compare_arrays("r", a, a.reshape(3, 2)).passed
    assert "reshaped" in sim.compare_arrays("r", a, a.reshape(3, 2)).note
    bad = sim.compare_arrays("r", a, np.ones(5, np.float32))
    assert not bad.passed and "shape 2x3 vs 5" in bad.note
    assert sim.compare_arrays("bf", a, a.astype(ml_dtypes.bfloat16)).cosine > 0.9999
    assert sim.compare_arrays("i", np.arange(5, dtype=np.int8), np.arange(5)).passed
    assert sim.compare_arrays("e", np.zeros((0, 3)), np.zeros((0, 3))).passed
    assert not sim.compare_arrays("s", np.array(["a"]), np.array(["a"])).passed


def test_tolerance_decides_pass():
    a = RNG.standard_normal(1000)
    b = a + 0.05 * RNG.standard_normal(1000)
    row = sim.compare_arrays("t", a, b, (0.99, 0.99))
    assert row.cosine > 0.99 and row.euclid < 0.99 and not row.passed
    assert sim.compare_arrays("t", a, b, "0.99,0.9").passed
    assert sim.compare_arrays("t", a, b, "0.9999,0.9").passed is False


@pytest.mark.parametrize("text", ["0.99", "a,b", "0.9,0.9,0.9", "", "1.5,0.9", "nan,0.9"])
def test_bad_tolerance(text):
    with pytest.raises(errors.UsageError):
        sim.parse_tolerance(text)


def test_compare_tensors_rows_and_table():
    a = {"x": np.ones((1, 3), np.float32), "y": np.arange(4.0), "only_a": np.zeros(1)}
    b = {"y": -np.arange(4.0), "x": np.ones((1, 3), np.float32), "only_b": np.zeros(1)}
    r = sim.compare_tensors(a, b, "0.99,0.99")
    assert [row.name for row in r.rows] == ["x", "y"]
    assert r.only_a == ["only_a"] and r.only_b == ["only_b"]
    assert not r.passed and [f.name for f in r.failed] == ["y"]
    table = sim.format_table(r, ("ref.npz", "test.npz"))
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["tensor", "shape", "cosine"]
    assert lines[2].startswith("x ") and "1x3" in lines[2] and lines[2].rstrip().endswith(
        "PASS (equal)")
    assert "FAIL" in lines[3] and "-1.000000" in lines[3]
    assert "only in ref.npz: only_a" in table and "only in test.npz: only_b" in table
    assert lines[-1].startswith("2 compared, 1 passed, 1 failed")
    assert "min cosine -1.000000 (y)" in lines[-1] and "min euclid" in lines[-1]
    assert sim.format_table(r, ("ref.npz", "test.npz")) == table   # deterministic


def test_load_npz(tmp_path):
    p = tmp_path / "t.npz"
    np.savez(p, a=np.arange(3), b=np.ones((2, 2), np.float32))
    d = sim.load_npz(p)
    assert list(d) == ["a", "b"] and d["b"].dtype == np.float32
    for bad in (tmp_path / "missing.npz", tmp_path):
        with pytest.raises(errors.ModelFileError):
            sim.load_npz(bad)


def test_rounding_noise_passes_only_under_the_floor():
    """The channel mean of a LayerNorm output is zero up to float32 rounding: noise on both sides."""
    x = RNG.standard_normal((4, 96)).astype(np.float32) * 5
    norm = (x - x.mean(1, keepdims=True)) / x.std(1, keepdims=True)
    ref = norm.mean(1)                                             # ~1e-8, rounding only
    other = np.float32(norm[:, ::-1]).mean(1)                      # another summation order
    assert sim.cosine_similarity(ref, other) < 0.99
    floor = sim.noise_floor([x, norm, ref])
    assert floor == pytest.approx(64 * np.finfo(np.float32).eps * np.abs(x).max())
    row = sim.compare_arrays("mean", ref, other, (0.99, 0.99), floor)
    assert row.passed and "rounding noise" in row.note
    r = sim.compare_tensors({"x": x, "mean": ref}, {"x": x, "mean": other})
    assert r.passed and "rounding noise" in r.rows[1].note
    # a real error of the same tensor is not noise, nor is a small tensor that differs
    assert not sim.compare_arrays("mean", ref, ref + 10 * floor, (0.99, 0.99), floor).passed
    assert not sim.compare_tensors({"x": x, "mean": ref}, {"x": x, "mean": other}, floor=0.0).passed
    assert sim.noise_floor([np.arange(5)]) == 0.0                 # integers carry no rounding noise


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("special", [None, np.inf, -np.inf, np.nan, "all"])
def test_noise_floor_reads_the_largest_finite_magnitude(dtype, special):
    """The floor is NOISE_ULPS epsilons of the largest finite |value|, infinities and NaNs skipped
    (a tensor of nothing finite adds no scale), whatever the sign of the largest value."""
    a = (RNG.standard_normal(50) * 3).astype(dtype)
    a[7] = -40.0                                 # the largest magnitude is a negative value
    if special == "all":
        a[:] = np.nan
    elif special is not None:
        a[3] = special
    finite = a[np.isfinite(a)].astype(np.float64)
    scale = float(np.max(np.abs(finite))) if finite.size else 0.0
    eps = float(np.finfo(np.float32 if np.dtype(dtype).itemsize <= 4 else dtype).eps)
    assert sim.noise_floor([a, np.zeros(0, np.float32)]) == sim.NOISE_ULPS * eps * scale
