"""A local worker's start (tftpu.utils.distributed): the model handed over as a pickle loads back
the same module (a long one too, whose pickling recurses deeply), what cannot be pickled falls back
to the model file, TensorFlow is imported without Keras, and the cores are shared out."""

import os
import subprocess
import sys

import numpy as np

from tftpu.ir.module import TopBuilder
from tftpu.utils import distributed


def _chain(ops: int):
    b = TopBuilder("chain")
    x = b.input("x", [1, 4])
    for i in range(ops):
        x = b.op("top.Add", [x, b.weight(f"w{i % 3}", np.full((1, 4), i % 3, np.float32))], {}, f"add{i}")
    return b.finish([x])


def test_a_model_handed_over_loads_back_the_same(tmp_path):
    model = _chain(3000)          # pickling follows the op list: far past Python's default recursion limit
    path = distributed.hand_over(model, tmp_path / "model")
    assert path == str(tmp_path / "model") + distributed.HANDOFF_SUFFIX
    got = distributed.take_over(path)
    assert type(got) is type(model) and got.text() == model.text()
    assert got.weights.keys() == model.weights.keys()
    assert all(np.array_equal(got.weights[k], model.weights[k]) for k in model.weights)
    got.verify()
    assert sys.getrecursionlimit() < 10_000          # the limit was raised for the pickling thread only


def test_what_cannot_be_pickled_falls_back_and_paths_pass_through(tmp_path, monkeypatch):
    assert distributed.hand_over(lambda: 0, tmp_path / "f") is None
    monkeypatch.setattr(distributed, "_DEEP_RECURSION", 1500)      # a module deeper than the limit
    assert distributed.hand_over(_chain(3000), tmp_path / "m") is None
    assert not list(tmp_path.iterdir())
    assert distributed.take_over("/data/m.tpu.mlir") == "/data/m.tpu.mlir"
    assert distributed.take_over(None) is None


def test_a_worker_imports_tensorflow_without_keras():
    code = ("import sys\nfrom tftpu.utils import distributed\ndistributed._import_tensorflow()\n"
            "print('keras' in sys.modules, 'matplotlib' in sys.modules)\n"
            "import tensorflow as tf, keras\nprint(tf.keras.layers.Dense is not None, keras.optimizers.Adam is not None)")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False", "True", "True"]


def test_each_worker_gets_its_share_of_the_cores():
    cores = len(os.sched_getaffinity(0))
    assert distributed.default_threads(1) == cores
    assert distributed.default_threads(2) == max(1, cores // 2)
    assert distributed.default_threads(cores * 4) == 1


def test_a_program_handed_over_simulates_the_same(tmp_path):
    """engine="simulator" on two workers: the compiled program goes over as a pickle, and every
    image's figures are one process's."""
    import tftpu
    from tests.tools.test_deploy import detector, samples_for

    model = detector()
    compiled = tftpu.compile(model, chip="npu1", calibration_data=samples_for(model), mixed_precision="none",
                             bias_correction=False)
    assert distributed.take_over(distributed.hand_over(compiled.program, tmp_path / "p")).model.text() == \
        compiled.program.model.text()
    val = tmp_path / "val"
    val.mkdir()
    for i, s in enumerate(samples_for(model, n=3, seed=5)):
        np.savez(val / f"{i}.npz", **s)
    one = tftpu.evaluate(compiled, val, engine="simulator")
    two = tftpu.evaluate(compiled, val, engine="simulator", workers=2)
    assert two.images == one.images and [r.name for r in two.rows] == [r.name for r in one.rows]
    assert all(a.cosine == b.cosine and a.sqnr == b.sqnr for a, b in zip(one.rows, two.rows))
