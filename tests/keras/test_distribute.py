"""S2D model + S2D dataset under tf.distribute give the original model's per-step losses.

Each strategy runs in subprocesses (tests/keras/distribute_job.py): logical devices must be set
before TensorFlow touches them, which would leak into the other tests if done here.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 150


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", **extra)
    return env


def _result(stdout: str) -> dict:
    lines = [l for l in stdout.splitlines() if l.startswith("RESULT ")]
    assert lines, stdout[-2000:]
    return json.loads(lines[-1][len("RESULT "):])


def _check(result, replicas):
    assert result["replicas"] == replicas
    original, s2d = np.array(result["original"]), np.array(result["s2d"])
    assert len(original) == len(s2d) >= 20
    np.testing.assert_allclose(s2d, original, rtol=1e-4, atol=1e-5)
    assert not np.allclose(original[:5], original[-5:], atol=1e-3)  # it trained


def test_mirrored_strategy_two_logical_cpus():
    proc = subprocess.run([sys.executable, "-m", "tests.keras.distribute_job", "mirrored"], cwd=ROOT,
                          env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check(_result(proc.stdout), replicas=2)


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def test_multi_worker_mirrored_two_local_workers():
    workers = [f"127.0.0.1:{p}" for p in _free_ports(2)]
    procs = []
    try:
        for index in range(2):
            tf_config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})
            procs.append(subprocess.Popen([sys.executable, "-m", "tests.keras.distribute_job", "multiworker"],
                                          cwd=ROOT, env=_env(TF_CONFIG=tf_config), stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        outputs = [p.communicate(timeout=TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    results = []
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-3000:]
        results.append(_result(out))
    for r in results:
        _check(r, replicas=2)
    np.testing.assert_allclose(results[0]["s2d"], results[1]["s2d"], rtol=1e-6)
