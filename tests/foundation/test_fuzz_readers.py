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


def _many_ops_onnx() -> bytes:
    """A small graph of most converters (deconv, pools, transpose, concat, slice, pad, grouped
    conv, split, resize, reshape, softmax, (un)squeeze, gather, reduce, expand, depth-to-space,
    flatten, layer norm, clip), so flipped attributes and shape inputs reach each of them."""
    from onnx import helper

    from tests.frontend.onnx_graphs import model, rand

    def ints(*v):
        return np.array(v, np.int64)

    inits = {"wt": rand(3, 4, 3, 3), "s0": ints(0, 0), "s1": ints(4, 4), "sa": ints(1, 2),
             "pads": ints(0, 0, 1, 1, 0, 0, 1, 1), "shape": ints(1, 4, 8, 15), "sq": ints(0), "split": ints(3, 3),
             "idx": ints(0, 2), "lns": rand(480), "lnb": rand(480), "sc": np.array([1, 1, 2, 2], np.float32),
             "ax": ints(1), "ex": ints(2, 4, 8, 15), "wc": rand(4, 2, 1, 1)}
    n = helper.make_node
    nodes = [
        n("ConvTranspose", ["x", "wt"], ["d"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
          output_padding=[1, 1], name="deconv"),
        n("AveragePool", ["d"], ["ap"], kernel_shape=[2, 2], strides=[2, 2], name="avg"),
        n("Transpose", ["ap"], ["t"], perm=[0, 1, 3, 2], name="tr"),
        n("Concat", ["t", "ap"], ["c"], axis=1, name="cat"),
        n("Slice", ["c", "s0", "s1", "sa"], ["s"], name="slice"),
        n("Pad", ["s", "pads"], ["p"], mode="edge", name="pad"),
        n("Conv", ["p", "wc"], ["cv"], group=2, kernel_shape=[1, 1], name="gconv"),
        n("Split", ["cv", "split"], ["sp0", "sp1"], axis=2, name="split"),
        n("Add", ["sp0", "sp1"], ["ad"], name="add"),
        n("Resize", ["ad", "", "sc"], ["rs"], mode="nearest", name="resize"),
        n("Reshape", ["rs", "shape"], ["rh"], name="reshape"),
        n("Softmax", ["rh"], ["sm"], axis=2, name="softmax"),
        n("Unsqueeze", ["sm", "sq"], ["us"], name="unsq"),
        n("Squeeze", ["us", "sq"], ["sqz"], name="sq"),
        n("Gather", ["sqz", "idx"], ["g"], axis=1, name="gather"),
        n("ReduceMean", ["g", "ax"], ["rm"], keepdims=1, name="rmean"),
        n("Expand", ["rm", "ex"], ["e"], name="expand"),
        n("DepthToSpace", ["e"], ["ds"], blocksize=2, mode="CRD", name="d2s"),
        n("Flatten", ["ds"], ["f"], axis=2, name="flat"),
        n("LayerNormalization", ["f", "lns", "lnb"], ["ln"], axis=-1, name="ln"),
        n("Clip", ["ln"], ["y"], name="clip"),
    ]
    return model(nodes, [("x", [1, 3, 8, 8])], [("y", None)], inits, opset=18).SerializeToString()


def _small_tflite() -> bytes:
    from tests.tac.models import mixed
    return mixed()


def _cali_table() -> bytes:
    return (b"# genetated time: -\n# method: mse\n# samples: 2\n# bins: 2048\n# alternates: tail_mse\n"
            b"x 1.0 -1.0 1.0\nconv 2.5 0.0 2.5\nout 0.75 -0.5 0.75\n"
            b"#tail_mse x 1.0 -1.0 1.0\n#tail_mse conv 2.75 0.0 2.75\n#tail_mse out 0.75 -0.5 0.75\n")


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


def _qtable() -> bytes:
    return b"# keep the head in float\nconv F16\nout  BF16 # trailing note\nx INT8\n"


def _read_qtable(path):
    from tftpu.quant.qtable import read_qtable
    read_qtable(path)


def _hardware_yaml() -> bytes:
    from tftpu.utils.config import DEFAULT_ROOT
    return (DEFAULT_ROOT / "hardware" / "gpu.yaml").read_bytes()


def _read_hardware(path):
    from tftpu.tac.hardware import config
    config.load(path)


_TPU_WEIGHTS: dict = {}


def _tpu_mlir() -> bytes:
    """A small INT8 TPU module (quantized types, per-axis weights, casts, a table)."""
    from tftpu.ir import TopBuilder
    from tftpu.quant import CalibrationTable
    from tftpu.transforms.lowering import lower

    rng = np.random.default_rng(0)
    b = TopBuilder("fuzz")
    x = b.input("x", (1, 2, 4, 4))
    c = b.op("Conv", [x, b.weight("w", rng.normal(size=(3, 2, 3, 3)).astype(np.float32)),
                      b.weight("b", rng.normal(size=(3,)).astype(np.float32))],
             {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, "conv")
    out = b.op("Sigmoid", [c], {}, "out")
    top = b.finish([out])
    table = CalibrationTable({"x": (2.0, -2.0, 2.0), "conv": (5.0, -5.0, 5.0), "out": (1.0, 0.0, 1.0)})
    tpu, _ = lower(top, "npu1", "INT8", table)
    _TPU_WEIGHTS.update(tpu.used_weights())
    return tpu.text().encode()


def _read_tpu_mlir(path):
    from tftpu.ir import load
    from tftpu.ir.weights import save_npz

    weights = path.parent / "fuzz_tpu_int8_weights.npz"
    if not weights.exists():
        save_npz(weights, _TPU_WEIGHTS)
    load(path)


READERS = {"onnx": (_small_onnx, _read_onnx, ".onnx"), "onnx_ops": (_many_ops_onnx, _read_onnx, ".onnx"),
           "tflite": (_small_tflite, _read_tflite, ".tflite"),
           "cali_table": (_cali_table, _read_table, ""), "chip": (_chip_yaml, _read_chip, ".yaml"),
           "qtable": (_qtable, _read_qtable, ""), "hardware": (_hardware_yaml, _read_hardware, ".yaml"),
           "tpu_mlir": (_tpu_mlir, _read_tpu_mlir, ".tpu.mlir")}
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
