"""A local worker's start (tftpu.utils.distributed): TensorFlow is imported without Keras, and the
cores are shared out."""

import os
import subprocess
import sys


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
