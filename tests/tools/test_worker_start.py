"""A local worker's start (tftpu.utils.distributed): TensorFlow is imported without Keras, the cores
are shared out, and a program simulated on two workers gives one process's figures."""

import os
import subprocess
import sys

import numpy as np

from tftpu.utils import distributed


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
    """engine="simulator" on two workers: the compiled program goes over as its .tpumodel, and
    every image's figures are one process's."""
    import tftpu
    from tests.tools.test_deploy import detector, samples_for

    model = detector()
    compiled = tftpu.compile(model, chip="npu1", calibration_data=samples_for(model), mixed_precision="none",
                             bias_correction=False)
    val = tmp_path / "val"
    val.mkdir()
    for i, s in enumerate(samples_for(model, n=3, seed=5)):
        np.savez(val / f"{i}.npz", **s)
    one = tftpu.evaluate(compiled, val, engine="simulator")
    two = tftpu.evaluate(compiled, val, engine="simulator", workers=2)
    assert two.images == one.images and [r.name for r in two.rows] == [r.name for r in one.rows]
    assert all(a.cosine == b.cosine and a.sqnr == b.sqnr for a, b in zip(one.rows, two.rows))
