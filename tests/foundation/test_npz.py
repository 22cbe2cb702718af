"""tftpu.utils.npz: the one .npz reader behind ir.load_npz (accepts .npy) and similarity.load_npz (refuses it)."""

import numpy as np
import pytest

from tftpu import errors, ir
from tftpu.interp import similarity
from tftpu.utils.npz import load_npz


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.float16, np.bool_, np.int64])
@pytest.mark.parametrize("writer", ["savez", "savez_compressed", "save_npz"])
def test_round_trip_keeps_order_and_dtype(tmp_path, dtype, writer):
    arrays = {"b": np.arange(6).reshape(2, 3).astype(dtype), "a": np.ones((), dtype), "c": np.zeros((0, 4), dtype)}
    p = tmp_path / "x.npz"
    if writer == "save_npz":
        ir.save_npz(p, arrays)
    else:
        getattr(np, writer)(p, **arrays)
    for got in (load_npz(p), ir.load_npz(p), similarity.load_npz(p), load_npz(str(p), allow_npy=True)):
        assert set(got) == set(arrays)
        for k, v in arrays.items():
            assert got[k].dtype == v.dtype and np.array_equal(got[k], v)


def _bad(tmp_path, make):
    p = tmp_path / f"bad_{make}.npz"
    if make == "garbage":
        p.write_bytes(b"this is not a zip file at all")
    elif make == "empty":
        p.write_bytes(b"")
    elif make == "pickled":
        np.savez(p, o=np.array([{"a": 1}], dtype=object))
    elif make == "dir":
        p = tmp_path
    elif make == "truncated":
        np.savez(p, a=np.arange(1000))
        p.write_bytes(p.read_bytes()[:200])
    return p


@pytest.mark.parametrize("make,msg", [("missing", "no such file"), ("garbage", "not a zip archive"),
                                      ("empty", "not a zip archive"), ("pickled", "not a readable"),
                                      ("dir", "is a directory"), ("truncated", "not a readable")])
@pytest.mark.parametrize("allow_npy", [False, True])
def test_bad_files_one_line_naming_file(tmp_path, make, msg, allow_npy):
    p = _bad(tmp_path, make)
    with pytest.raises(errors.ModelFileError, match=msg) as e:
        load_npz(p, allow_npy=allow_npy)
    assert str(p) in str(e.value) and "\n" not in str(e.value)


def test_lone_npy_only_where_allowed(tmp_path):
    p = tmp_path / "x.npy"
    np.save(p, np.arange(3, dtype=np.int16))
    got = ir.load_npz(p)
    assert list(got) == ["x"] and got["x"].dtype == np.int16 and got["x"].tolist() == [0, 1, 2]
    for read in (load_npz, similarity.load_npz):
        with pytest.raises(errors.ModelFileError, match="single .npy array"):
            read(p)
    obj = tmp_path / "o.npy"
    np.save(obj, np.array([{"a": 1}], dtype=object))
    with pytest.raises(errors.ModelFileError, match="not a readable"):
        ir.load_npz(obj)


def _forged(shape, payload: int) -> bytes:
    import io
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return buf.getvalue() + b"\0" * payload


@pytest.mark.parametrize("shape,payload,needle", [((10 ** 12,), 40, "memory"), ((1000,), 40, "truncated")])
def test_header_claims_are_checked_before_allocating(tmp_path, shape, payload, needle):
    import zipfile
    npz, npy = tmp_path / "x.npz", tmp_path / "x.npy"
    with zipfile.ZipFile(npz, "w") as zf:
        zf.writestr("x.npy", _forged(shape, payload))
    npy.write_bytes(_forged(shape, payload))
    for path in (npz, npy):
        with pytest.raises(errors.ModelFileError, match=needle):
            load_npz(path, allow_npy=True)


def test_every_truncation_of_a_real_archive_is_refused(tmp_path):
    good = tmp_path / "good.npz"
    ir.save_npz(good, {"w": np.arange(64, dtype=np.float32).reshape(8, 8), "b": np.ones(3, np.int8)})
    data = good.read_bytes()
    cut = tmp_path / "cut.npz"
    for n in range(0, len(data), 7):
        cut.write_bytes(data[:n])
        with pytest.raises(errors.ModelFileError):
            load_npz(cut)
