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


def _run(code: str, **env) -> str:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **env})
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_a_worker_sizes_the_int8_pools_to_its_share():
    code = "from tftpu.interp.tpu import requant\nprint(requant.pool()._max_workers)"
    assert _run(code, TFTPU_WORKER_THREADS="1") == "1"
    assert _run(code, TFTPU_WORKER_THREADS="3") == "3"
    assert int(_run(code, TFTPU_WORKER_THREADS="")) == min(len(os.sched_getaffinity(0)), 4)


def test_launch_sizes_every_pool_of_a_worker(monkeypatch):
    seen = {}

    class Stop(Exception):
        pass

    def popen(args, env, **kwargs):
        seen.update(env)
        raise Stop

    monkeypatch.setattr(distributed.subprocess, "Popen", popen)
    try:
        distributed.launch("tftpu.pipelines.evaluate:evaluate_job", {}, workers=2, threads=1)
    except Stop:
        pass
    for name in ("TFTPU_WORKER_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        assert seen[name] == "1", name


def test_figures_are_the_same_bits_on_any_number_of_blas_threads():
    """Workers run BLAS on one thread, one process on all cores: the figures must not move."""
    code = ("import numpy as np\nfrom tftpu.interp import similarity as s\n"
            "r = np.random.default_rng(0)\na = r.standard_normal(3_000_001).astype(np.float32)\n"
            "b = a + 0.01 * r.standard_normal(a.size).astype(np.float32)\n"
            "print(repr(s.cosine_similarity(a, b)), repr(s.euclidean_similarity(a, b)), repr(s.sqnr(a, b)))")
    assert _run(code, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1") == \
        _run(code, OPENBLAS_NUM_THREADS="4", OMP_NUM_THREADS="4")
