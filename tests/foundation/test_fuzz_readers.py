"""Every reader either loads a damaged file or raises a `tftpu.errors` type, within a time bound:
each truncation point of small real files (sampled) and random byte flips (hypothesis).

The default run keeps the example counts small; `TFTPU_FUZZ_EXAMPLES=500` runs more.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tftpu import errors

EXAMPLES = int(os.environ.get("TFTPU_FUZZ_EXAMPLES", "25"))
SECONDS = 5.0
# derandomized: the default run tries the same examples every time (CI must not flip)
_SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
                     derandomize=not os.environ.get("TFTPU_FUZZ_EXAMPLES"), database=None)


def _small_onnx() -> bytes:
    from tests.frontend.onnx_graphs import conv_bn_relu_net
    return conv_bn_relu_net().SerializeToString()


def _small_tflite() -> bytes:
    from tests.tac.models import mixed
    return mixed()


def _cali_table() -> bytes:
    return (b"# genetated time: -\n# method: mse\n# samples: 2\n# bins: 2048\n"
            b"x 1.0 -1.0 1.0\nconv 2.5 0.0 2.5\nout 0.75 -0.5 0.75\n")


def _chip_yaml() -> bytes:
    from tftpu.utils.config import DEFAULT_ROOT
    return (DEFAULT_ROOT / "chips" / "npu1.yaml").read_bytes()


def _read_onnx(path):
    from tftpu.frontend.onnx_to_top import onnx_to_top
    onnx_to_top(path)


def _read_tflite(path):
    from tftpu.tac import tflite_io
    tflite_io.read(path)


def _read_table(path):
    from tftpu.quant import read_table
    read_table(path)


def _read_chip(path):
    from tftpu import chip
    chip._CACHE.clear()
    chip.load(path)


READERS = {"onnx": (_small_onnx, _read_onnx, ".onnx"), "tflite": (_small_tflite, _read_tflite, ".tflite"),
           "cali_table": (_cali_table, _read_table, ""), "chip": (_chip_yaml, _read_chip, ".yaml")}
_DATA: dict = {}


def _data(kind: str) -> bytes:
    if kind not in _DATA:
        _DATA[kind] = READERS[kind][0]()
    return _DATA[kind]


def _check(kind: str, data: bytes, tmp_path) -> None:
    _, read, suffix = READERS[kind]
    path = tmp_path / f"f{suffix}"
    path.write_bytes(data)
    t0 = time.perf_counter()
    try:
        read(path)
    except errors.TftpuError:
        pass
    assert time.perf_counter() - t0 < SECONDS, f"{kind}: {len(data)} bytes took too long"


@pytest.mark.parametrize("kind", sorted(READERS))
def test_truncations(kind, tmp_path):
    data = _data(kind)
    cuts = sorted(set(np.linspace(0, len(data) - 1, min(len(data), EXAMPLES), dtype=int).tolist()))
    for cut in cuts:
        _check(kind, data[:cut], tmp_path)


@pytest.mark.parametrize("kind", sorted(READERS))
def test_byte_flips(kind, tmp_path_factory):
    data = _data(kind)
    tmp = tmp_path_factory.mktemp(kind)

    @_SETTINGS
    @given(st.lists(st.tuples(st.integers(0, len(data) - 1), st.integers(0, 255)), min_size=1, max_size=4))
    def flip(changes):
        buf = bytearray(data)
        for pos, value in changes:
            buf[pos] = value
        _check(kind, bytes(buf), tmp)

    flip()
