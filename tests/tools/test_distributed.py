"""Calibration and evaluation on two worker processes over tf.distribute (issue 23): the table is
byte-identical to one process's, every image's figures are the same, a worker's error comes back
as its own one line; the statistics merge exactly however the samples are split. The tests start
the workers themselves on loopback (`--workers=2`, or two tool runs with TF_CONFIG) and stop them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tftpu
from tests import material
from tests.tools.test_deploy import cnn, detector, samples_for
from tftpu import errors, quant
from tftpu.quant.calibrate import TensorStatistics

BIN = Path(sys.executable).parent
PRE = dict(mean=[127.5], scale=[1 / 127.5])


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """Seven real photos as PNG files of varied sizes (more than two workers' worth, an odd count)."""
    import tensorflow as tf
    d = tmp_path_factory.mktemp("photos")
    for i, name in enumerate((material.COLOUR_PHOTOS * 2)[:7]):
        img = material.image(name, (24 + 4 * i, 20 + 2 * i))
        (d / f"{i:02d}.png").write_bytes(tf.io.encode_png(img).numpy())
    return d


def test_statistics_merge_exactly_whatever_the_split():
    """Shards of a stream merge into the statistics of the whole, values at exactly a power of two
    (a range's end, later doubled) included; the order of the values does not matter either."""
    rng = np.random.default_rng(0)
    arrays = [np.float32([0.0, 1.0, 0.0]), np.zeros(4, np.float32)]
    for k in range(14):
        a = (rng.standard_normal(500) * 2.0 ** rng.integers(-3, 6)).astype(np.float32)
        a[:40] = 0
        a[5] = 2.0 ** int(rng.integers(0, 5)) * (1 if k % 2 else -1)
        arrays.append(a)

    def stats(xs):
        st = TensorStatistics(512)
        for a in xs:
            st.add(a)
        return st

    whole = stats(arrays)
    for n in (2, 3, 5):
        merged = TensorStatistics(512)
        for part in [stats(arrays[i::n]) for i in range(n)][::-1]:
            merged.merge(part)
        reverse = stats(arrays[::-1])
        for st in (merged, reverse):
            np.testing.assert_array_equal(st.hist, whole.hist)
            assert (st.range, st.top, st.vmin, st.vmax) == (whole.range, whole.top, whole.vmin, whole.vmax)


def test_shards_split_the_stream_by_sample_index(photos, tmp_path):
    model = cnn()
    stream = quant.iter_samples(model, photos, input_num=6, **PRE)
    whole = [(i, w) for i, w, _ in stream.indexed()]
    parts = [[(i, w) for i, w, _ in stream.shard(k, 3).indexed()] for k in range(3)]
    assert sorted(sum(parts, [])) == whole and [p[0][0] for p in parts] == [0, 1, 2]
    batch = tmp_path / "batch.npz"                  # one file of three samples: indices inside it
    np.savez(batch, x=np.stack([s["x"] for s in samples_for(model, 3)]))
    got = [[i for i, _, _ in quant.iter_samples(model, [batch, photos / "00.png"]).shard(k, 2).indexed()]
           for k in range(2)]
    assert got == [[0, 2], [1, 3]]


def test_calibrate_tool_on_two_workers_writes_the_same_table(photos, tmp_path):
    """tftpu-calibrate --workers=2 (auto: its candidates judged on the chief) against the library
    in this process: byte-identical tables."""
    model = cnn()
    model.save(tmp_path / "m.top.mlir")
    one = quant.calibrate(model, quant.iter_samples(model, photos, **PRE), "auto", asymmetric=True, tune_num=3)
    one.save(tmp_path / "one.txt")
    r = subprocess.run([str(BIN / "tftpu-calibrate"), f"--mlir={tmp_path / 'm.top.mlir'}", f"--dataset={photos}",
                        "--input_num=0", "--mean=127.5", f"--scale={1 / 127.5!r}", "--calibration_method=auto",
                        "--asymmetric", "--tune_num=3", "--workers=2", f"-o={tmp_path / 'two.txt'}"],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    assert "from 7 inputs" in r.stdout and "not run with --workers" in r.stdout
    assert (tmp_path / "two.txt").read_bytes() == (tmp_path / "one.txt").read_bytes()


@pytest.mark.parametrize("engine", ["interpreter", "simulator"])
def test_evaluate_on_two_workers_gives_every_image_the_same_figures(tmp_path, engine):
    """tftpu.evaluate(workers=2) on a compiled detector (a concatenated output: parts too), by
    TPU inference or by the simulator (the program goes to the workers as its .tpumodel)."""
    model = detector()
    compiled = tftpu.compile(model, chip="npu1", calibration_data=samples_for(model), mixed_precision="none",
                             bias_correction=False)
    val = tmp_path / "val"
    val.mkdir()
    for i, s in enumerate(samples_for(model, n=5, seed=3)):
        np.savez(val / f"{i}.npz", **s)
    one = tftpu.evaluate(compiled, val, engine=engine)
    two = tftpu.evaluate(compiled, val, engine=engine, workers=2, json=tmp_path / "e.json")
    assert two.images == one.images and [r.name for r in two.rows] == [r.name for r in one.rows]
    for a, b in zip(one.rows, two.rows):
        assert a.cosine == b.cosine and a.sqnr == b.sqnr
    assert json.loads((tmp_path / "e.json").read_text())["outputs"] == one.summary()["outputs"]


def test_a_workers_error_is_one_typed_line(photos, tmp_path):
    """A file only the second worker reads is unreadable: the run stops naming it, as one process
    would (ModelFileError), and no worker is left running."""
    bad = tmp_path / "data"
    bad.mkdir()
    for p in sorted(photos.iterdir())[:3]:
        (bad / p.name).write_bytes(p.read_bytes())
    (bad / "01.png").write_bytes(b"not a png")
    model = cnn()
    with pytest.raises(errors.ModelFileError, match="01.png"):
        quant.calibrate(model, quant.iter_samples(model, bad, **PRE), workers=2)
    assert not [c for c in _children() if b"tftpu.utils.distributed" in c]


def _children() -> list[bytes]:
    """The command lines of this process's children still running."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == os.getpid():
                out.append((d / "cmdline").read_bytes())
        except (OSError, IndexError, ValueError):
            continue
    return out


@pytest.mark.parametrize("workers", [0, -3, 2.5, True, "max+1"])
def test_an_absurd_worker_count_is_refused_before_any_process_starts(photos, workers):
    """No count below 1, no fraction, and none above max_workers() (four processes a core: each
    holds its own TensorFlow and model; 100000 ran out of file handles): a UsageError naming it."""
    from tftpu.utils import distributed

    n = distributed.max_workers() + 1 if workers == "max+1" else workers
    model = cnn()
    with pytest.raises(errors.UsageError, match=f"workers {n!r}" if workers != "max+1" else f"workers {n}: at most"):
        quant.calibrate(model, quant.iter_samples(model, photos, **PRE), workers=n)
    assert not [c for c in _children() if b"tftpu.utils.distributed" in c]
